#!/usr/bin/env bash
# promtool (and the prometheus binary) for tests/test_monitoring.py: Debian's `prometheus` package, the
# one a head runs. Idempotent. Where PID 1 is not systemd (a CI container) the package's own service
# must not start: a policy-rc.d refusing every start is in place while it installs (kept if one exists),
# and no prometheus process may run afterwards.
set -euo pipefail
if command -v promtool >/dev/null && command -v prometheus >/dev/null; then promtool --version 2>&1 | head -1; exit 0; fi
if [ "$(id -u)" != 0 ]; then echo "tests/setup/monitoring.sh: needs root; the promtool tests will skip" >&2; exit 0; fi
before=$(pgrep -x prometheus || true)
policy=/usr/sbin/policy-rc.d
added=
if [ "$(cat /proc/1/comm 2>/dev/null)" != systemd ] && [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# tests/setup/monitoring.sh: no service starts while it installs\nexit 101\n' > "$policy"
    chmod 0755 "$policy"
    added=1
fi
trap '[ -n "$added" ] && rm -f "$policy"' EXIT
echo "installing Debian's prometheus (promtool) (apt-get update first; about 20 s)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=600 prometheus >/dev/null
after=$(pgrep -x prometheus || true)
if [ "$(cat /proc/1/comm 2>/dev/null)" != systemd ] && [ "$after" != "$before" ]; then
    echo "tests/setup/monitoring.sh: installing prometheus started a prometheus process ($after): stop it" >&2
    exit 1
fi
promtool --version 2>&1 | head -1
