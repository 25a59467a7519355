#!/usr/bin/env bash
# The tests start their own redis-server on a loopback port; this makes sure one is installed.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing redis-server (apt-get)" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  exit 0
fi
echo "redis-server is not installed; install it (e.g. sudo apt-get install -y redis-server) and rerun" >&2
exit 1
