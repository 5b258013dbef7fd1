#!/usr/bin/env bash
# make demo: the lab up, then the real doit tasks with the lab profile on the head node:
# a fixture checkpoint in the published layout, verify, copy to the worker over the veth fabric,
# image pull by digest, units installed and started under systemd, readiness, smoke and status.
source "$(dirname "$0")/lib.sh"
need_root
start=$SECONDS
bash "$LAB_DIR/up.sh"
model=/root/lab-model/DeepSeek-V4.1-Flash-Spark
on() { "$LAB_DIR/on" head "$@"; }
doit() { on "cd $(printf %q "$REPO") && DSV41_PROFILE=lab PYTHONPATH=$(printf %q "$REPO/lib") /opt/dsv41-venv/bin/doit $*"; }
if ! on test -e "$model/sha256-manifest.txt"; then
    say "making a small fixture checkpoint in $model (the real one is 462 GB)"
    on /opt/dsv41-venv/bin/python "$REPO/tests/fixture_checkpoint.py" "$model" --mb 8 >/dev/null
fi
doit launch
doit smoke
doit status
say "demo done in $((SECONDS - start)) s"
cat <<MSG

The API answers on the head at http://${IP[head]}:8000/v1 (model deepseek-v4.1-flash). Try it:
  tests/lab/on head 'curl -s http://127.0.0.1:8000/v1/chat/completions -H "Authorization: Bearer \$(cat ~/.dsv41-two-sparks/api_key)" -H "Content-Type: application/json" -d "{\"model\": \"deepseek-v4.1-flash\", \"messages\": [{\"role\": \"user\", \"content\": \"What is 17 * 23?\"}]}"'
  tests/lab/on head 'systemctl status dsv41-r0'       tests/lab/on worker 'journalctl -u dsv41-memguard'
  tests/lab/on head 'cd $REPO && DSV41_PROFILE=lab PYTHONPATH=lib /opt/dsv41-venv/bin/doit status'
Clean up with: make lab-down
MSG
