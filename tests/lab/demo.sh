#!/usr/bin/env bash
# make demo: the lab up, then the real doit tasks on the head node, as on a Spark: the checkpoint (the
# real engine's tiny model from the Hub stand-in, or the stand-in engine's fixture checkpoint),
# verify, copy to the workers over the veth fabric, image pull by digest, units installed and started
# under systemd, readiness, smoke and status. LAB_ENGINE=vllm (the default with two nodes) serves
# through two real vLLM ranks; LAB_ENGINE=standin (the default with LAB_NODES=3 or more: the tiny
# model's 4 key-value heads split only 2 ways, and the 2 cores hold two CPU ranks) through the stand-in.
export LAB_NODES=${LAB_NODES:-2}
[ "$LAB_NODES" = 2 ] && export LAB_ENGINE=${LAB_ENGINE:-vllm} || export LAB_ENGINE=${LAB_ENGINE:-standin}
export LAB_FOR=demo                   # a lab of this checkout's `make lab-up`, or one made for the demo
source "$(dirname "$0")/lib.sh"
need_root
(claim_lab)                           # before installing or building anything
start=$SECONDS
if ! (need_tools) 2>/dev/null; then
    say "installing what the lab needs first (tests/setup/lab.sh: Debian packages, then the cached node"
    say "template; about 3 min, and about 6 min more for the real engine, once)"
    bash "$REPO/tests/setup/lab.sh"
fi
bash "$LAB_DIR/cache.sh"
bash "$LAB_DIR/up.sh"
on() { "$LAB_DIR/on" head "$@"; }
doit() {  # doit "VAR=value ..." TASK [ARGS]: doit on the head with those settings
    local settings=$1; shift
    on "cd $(printf %q "$REPO") && env $settings PYTHONPATH=$(printf %q "$REPO/lib") /opt/dsv41-venv/bin/doit $*"
}
[ "$LAB_ENGINE" = standin ] || [ "$LAB_NODES" = 2 ] || die "the real engine runs on 2 lab nodes: use LAB_ENGINE=standin with LAB_NODES=$LAB_NODES"
workers=$(for n in "${NODES[@]:1}"; do printf 'root@%s,' "${IP[$n]}"; done)
workers="WORKERS=${workers%,}"
# LAB_MONITORING=1: every node's node_exporter (METRICS_DIR) and dsv41-prometheus on the head (doit monitoring)
[ "${LAB_MONITORING:-}" = 1 ] && workers="$workers METRICS_DIR=/var/lib/dsv41/metrics"
if [ "$LAB_ENGINE" = vllm ]; then
    profile="DSV41_PROFILE=lab-vllm $workers"
    say "engine: vLLM 0.32 (CPU build), two tensor-parallel ranks on head and worker1, serving SmolLM2-135M;"
    say "a 135M model answers hard questions wrongly, so smoke's arithmetic check may honestly FAIL"
    endpoint=$(bash "$LAB_DIR/hub-up.sh")
    doit "$profile HF_ENDPOINT=$endpoint" download
else
    profile="DSV41_PROFILE=lab $workers"
    say "engine: the STAND-IN (tests/lab/engine/engine.py: no model, answers by rule)"
    model=/root/lab-model/DeepSeek-V4.1-Flash-Spark
    if ! on test -e "$model/sha256-manifest.txt"; then
        say "making a small fixture checkpoint in $model (the real one is 462 GB)"
        on /opt/dsv41-venv/bin/python "$REPO/tests/fixture_checkpoint.py" "$model" --mb 8 >/dev/null
    fi
fi
doit "$profile" launch
doit "$profile" smoke || say "smoke reported a FAIL above (with the real engine's tiny model, expected for arithmetic)"
doit "$profile" status
if [ "${LAB_MONITORING:-}" = 1 ]; then
    doit "$profile" monitoring --install
    say "Prometheus: tests/lab/on head 'curl -s http://127.0.0.1:9090/api/v1/alerts'; the dashboard to import:"
    say "/root/.dsv41-two-sparks/monitoring/dashboard.json on the head"
fi
say "demo done in $((SECONDS - start)) s ($LAB_ENGINE engine)"
cat <<MSG

The API answers on the head at http://${IP[head]}:8000/v1 (model deepseek-v4.1-flash). Try it:
  tests/lab/on head 'curl -s http://127.0.0.1:8000/v1/chat/completions -H "Authorization: Bearer \$(cat ~/.dsv41-two-sparks/api_key)" -H "Content-Type: application/json" -d "{\"model\": \"deepseek-v4.1-flash\", \"messages\": [{\"role\": \"user\", \"content\": \"Name three colours.\"}]}"'
  tests/lab/on head 'systemctl status dsv41-r0'       tests/lab/on worker1 'journalctl -u dsv41-memguard'
  tests/lab/on head 'cd $REPO && $profile PYTHONPATH=lib /opt/dsv41-venv/bin/doit status'
Clean up with: make lab-down
MSG
