#!/usr/bin/env bash
# Prerequisites of the two-node lab tests (tests/lab): host packages, then the cached template rootfs,
# engine rootfs and wheelhouse under /var/cache/dsv41-lab. Idempotent; a second run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "$(id -u)" != 0 ]; then echo "tests/setup/lab.sh: needs root; the lab tests will skip" >&2; exit 0; fi
pkgs=(systemd-container debootstrap openssh-client rsync iproute2 docker-registry curl ca-certificates python3-venv)
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep 'ok installed' >/dev/null || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]} (apt-get update first; about 30 s)"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian's docker-registry package enables its own service where systemd runs; the lab starts its own.
LAB_ENGINE=vllm bash tests/lab/cache.sh     # the real engine too: the vllm-marked lab tests use it
