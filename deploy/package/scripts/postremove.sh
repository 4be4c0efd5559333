#!/bin/sh
# After removal. Configuration and data stay (deb: remove; rpm: 0); a
# Debian purge removes them too, as Debian policy says: /etc/csisupd.d and
# /var/lib/csisupd (the registry, volume records and the node's secret).
set -e
case "$1" in
purge)
	rm -rf /etc/csisupd.d /var/lib/csisupd
	;;
esac
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
