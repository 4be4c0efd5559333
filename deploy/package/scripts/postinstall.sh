#!/bin/sh
# After install and upgrade (deb: configure; rpm: 1 or 2): systemd learns
# the new unit. Nothing is enabled or started: the operator does that.
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
