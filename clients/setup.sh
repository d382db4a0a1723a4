#!/bin/sh
# Install and build what the Node.js and C clients need (`make clients` runs this).
# Idempotent, and quick when everything is there already:
#   - Debian packages, only those missing: nodejs + npm (when there is no node), a C
#     compiler, pkg-config, libzmq3-dev, msgpack-c (libmsgpack-c-dev on Debian 13,
#     libmsgpack-dev on Debian 12) and libjansson-dev (the C vector tests read JSON);
#   - `npm ci` in clients/node, again only when package.json or package-lock.json changed
#     (zeromq ships its prebuilt binary inside the npm package: nothing is downloaded
#     from anywhere but the npm registry);
#   - `make -C clients/c`.
set -eu
cd "$(dirname "$0")"

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

missing=""
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || missing="$missing nodejs npm"
command -v cc >/dev/null 2>&1 || missing="$missing gcc libc6-dev"
command -v pkg-config >/dev/null 2>&1 || missing="$missing pkg-config"
pkg-config --exists libzmq 2>/dev/null || missing="$missing libzmq3-dev"
pkg-config --exists jansson 2>/dev/null || missing="$missing libjansson-dev"
msgpack_missing=0
pkg-config --exists msgpack-c 2>/dev/null || pkg-config --exists msgpack 2>/dev/null || msgpack_missing=1

if [ -n "$missing" ] || [ "$msgpack_missing" = 1 ]; then
    command -v apt-get >/dev/null 2>&1 || {
        echo "clients/setup.sh: missing:$missing (and msgpack-c: $msgpack_missing); no apt-get to install them" >&2
        exit 1
    }
    echo "clients/setup.sh: installing Debian packages:$missing$( [ "$msgpack_missing" = 1 ] && echo ' msgpack-c')"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    if [ "$msgpack_missing" = 1 ]; then
        # The C library's package was renamed when msgpack-c split from msgpack-cxx.
        if apt-cache show libmsgpack-c-dev >/dev/null 2>&1; then
            missing="$missing libmsgpack-c-dev"
        else
            missing="$missing libmsgpack-dev"
        fi
    fi
    # shellcheck disable=SC2086
    $SUDO apt-get install -y -q --no-install-recommends $missing
fi

stamp=node/node_modules/.relay-installed
if [ ! -f "$stamp" ] || [ node/package.json -nt "$stamp" ] || [ node/package-lock.json -nt "$stamp" ]; then
    (cd node && npm ci --ignore-scripts --no-audit --no-fund)
    touch "$stamp"
fi
node -e 'require("./node/node_modules/zeromq")' 2>/dev/null || {
    echo "clients/setup.sh: the zeromq npm package has no prebuilt binary that loads here" >&2
    echo "  build it from source: apt-get install cmake ninja-build libzmq3-dev &&" >&2
    echo "  (cd clients/node && npm_config_build_from_source=true npm rebuild zeromq)" >&2
    exit 1
}

make -s -C c
