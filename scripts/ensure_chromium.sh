#!/usr/bin/env bash
# The playground's browser tests (tests/playground) drive Debian's Chromium through Playwright, with no
# browser download; this makes sure it is installed.
set -euo pipefail
if [ -n "${MUESTRA_CHROMIUM:-}" ] || command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing chromium (apt-get)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
  exit 0
fi
echo "chromium not installed; install it (e.g. sudo apt-get install -y chromium) and rerun" >&2
exit 1
