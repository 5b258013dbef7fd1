#!/usr/bin/env bash
# The docker CLI alone (no engine) for tests/test_units.py, which hands a unit's container command to
# it against a stand-in daemon. Taken from Debian's docker.io package without installing it.
# Idempotent; cached under /var/cache/dsv41-tests/docker-cli.
set -euo pipefail
dest=/var/cache/dsv41-tests/docker-cli
if [ -z "${FORCE:-}" ] && { command -v docker >/dev/null || [ -x "$dest/usr/bin/docker" ]; }; then exit 0; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download -q docker.io >/dev/null 2>&1)
dpkg-deb -x "$tmp"/docker.io_*.deb "$tmp/x"
mkdir -p "$dest/usr/bin"
install -m 0755 "$tmp/x/usr/bin/docker" "$dest/usr/bin/docker"
"$dest/usr/bin/docker" --version
