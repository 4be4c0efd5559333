#!/bin/sh
# Before removal (deb: remove; rpm: 0 packages left), not before an
# upgrade: the service stops, and is disabled, as its binary goes away.
set -e
case "$1" in
remove | 0)
	if [ -d /run/systemd/system ]; then
		systemctl stop csisupd.service >/dev/null 2>&1 || true
	fi
	systemctl disable csisupd.service >/dev/null 2>&1 || true
	;;
esac
