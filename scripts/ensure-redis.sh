#!/bin/sh
# Installs redis-server (and redis-cli) from Debian's packages when missing.
# The tests start their own redis-server processes on free loopback ports;
# nothing here starts a server.
set -eu
if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
	exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "redis-server not found: installing it with apt-get" >&2
$SUDO apt-get update
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y redis-server
# Debian's package starts a system redis on :6379; the tests never use it.
