#!/usr/bin/env bash
# The tests start their own redis-server on a loopback port (one of them TLS-only, with a certificate
# made by openssl); this makes sure both are installed.
set -euo pipefail
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing ${missing[*]} (apt-get)" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  exit 0
fi
echo "${missing[*]} not installed; install (e.g. sudo apt-get install -y ${missing[*]}) and rerun" >&2
exit 1
