#!/bin/sh
# Installs what the tests need from Debian's packages when missing:
# redis-server and redis-cli (the tests start their own servers on free
# loopback ports; nothing here starts one) and the prometheus package:
# promtool checks envoy-examples/prometheus-rules.yaml, and the adaptive
# limits' tests start their own prometheus servers. curl and openssl: the
# docs' commands use them, and integration/doccommands_test.go runs those.
set -eu
missing=""
command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 || missing="$missing redis-server"
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || missing="$missing prometheus"
command -v curl >/dev/null 2>&1 || missing="$missing curl"
command -v openssl >/dev/null 2>&1 || missing="$missing openssl"
[ -z "$missing" ] && exit 0
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "installing with apt-get:$missing" >&2
$SUDO apt-get update
# Debian's packages try to start their services; the tests never use them.
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y $missing
