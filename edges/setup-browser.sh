#!/bin/sh
# The browser the console's test drives (`make browser`; `make test` runs it): Debian's
# chromium, through apt-get, only when missing. Playwright's own browser download is not
# used (it cannot be fetched here): tests/test_edges_console.py points Playwright at this
# binary (`executable_path`; RELAY_CHROMIUM overrides it). Idempotent and quick when
# chromium is there.
set -eu

command -v chromium >/dev/null 2>&1 && exit 0
[ -n "${RELAY_CHROMIUM:-}" ] && [ -x "$RELAY_CHROMIUM" ] && exit 0

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
command -v apt-get >/dev/null 2>&1 || {
    echo "edges/setup-browser.sh: no chromium and no apt-get to install it" >&2
    exit 1
}
echo "edges/setup-browser.sh: installing Debian's chromium"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium
