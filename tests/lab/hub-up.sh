#!/usr/bin/env bash
# Start the Hub stand-in on the head (a transient systemd unit, lab-hub) serving the real engine's tiny
# model; print its endpoint for HF_ENDPOINT. Idempotent.
source "$(dirname "$0")/lib.sh"
[ -f "$VLLM/.done" ] || die "the real engine's model is not built yet: run 'LAB_ENGINE=vllm bash tests/lab/cache.sh'"
lab_ssh head "systemctl is-active --quiet lab-hub || systemd-run --quiet --unit lab-hub --collect \
    /opt/dsv41-venv/bin/python $(printf %q "$REPO/tests/lab/hub.py") $NODE_CACHE/vllm/hub --endpoint-file /run/lab-hub.endpoint" >&2
for _ in $(seq 100); do
    lab_ssh head cat /run/lab-hub.endpoint 2>/dev/null && exit 0
    sleep 0.2
done
die "the Hub stand-in did not start: $(lab_ssh head journalctl -u lab-hub --no-pager -n 5 | tr '\n' ' ')"
