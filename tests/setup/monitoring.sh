#!/usr/bin/env bash
# promtool, amtool and the prometheus and alertmanager binaries for tests/test_monitoring.py and
# tests/test_alerts.py, and haproxy for tests/test_gateway.py: Debian's `prometheus`,
# `prometheus-alertmanager` and `haproxy` packages, the ones a head runs.
# Idempotent. Where PID 1 is not systemd (a CI container) the packages' own services must not start: a
# policy-rc.d refusing every start is in place while they install (kept if one exists), and no prometheus
# or alertmanager process may run afterwards.
set -euo pipefail
have() { command -v promtool >/dev/null && command -v prometheus >/dev/null && command -v amtool >/dev/null \
    && [ -x /usr/bin/prometheus-alertmanager ] && command -v haproxy >/dev/null; }
if have; then promtool --version 2>&1 | sed -n 1p; amtool --version 2>&1 | sed -n 1p; haproxy -v | sed -n 1p; exit 0; fi
if [ "$(id -u)" != 0 ]; then echo "tests/setup/monitoring.sh: needs root; the promtool and amtool tests will skip" >&2; exit 0; fi
running() { pgrep -x prometheus || true; pgrep -f '^/usr/bin/prometheus-alertmanager' || true; pgrep -x haproxy || true; }
before=$(running)
policy=/usr/sbin/policy-rc.d
added=
if [ "$(cat /proc/1/comm 2>/dev/null)" != systemd ] && [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# tests/setup/monitoring.sh: no service starts while it installs\nexit 101\n' > "$policy"
    chmod 0755 "$policy"
    added=1
fi
trap '[ -n "$added" ] && rm -f "$policy"' EXIT
echo "installing Debian's prometheus, prometheus-alertmanager (promtool, amtool) and haproxy (apt-get update first; about 30 s)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=600 prometheus prometheus-alertmanager \
    haproxy >/dev/null
after=$(running)
if [ "$(cat /proc/1/comm 2>/dev/null)" != systemd ] && [ "$after" != "$before" ]; then
    echo "tests/setup/monitoring.sh: installing the packages started a prometheus, alertmanager or haproxy process ($after): stop it" >&2
    exit 1
fi
promtool --version 2>&1 | sed -n 1p
amtool --version 2>&1 | sed -n 1p
haproxy -v | sed -n 1p
