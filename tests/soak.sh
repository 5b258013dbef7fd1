#!/usr/bin/env bash
# make soak: the tests marked soak, the fault table, then the chaos soak for what is left of the time bound
# (MINUTES, 60 by default); every part runs and a failed one fails the whole at the end. Each part is
# stopped with SIGINT at the bound (pytest still prints its summary), and a lab one of them left up is
# taken down by its own code.
set -uo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-60}
PY=.venv/bin/python
start=$SECONDS end=$((SECONDS + minutes * 60))
left() { echo $((end - SECONDS)); }
echo "make soak: at most $minutes min (until $(date -d "@$(( $(date +%s) + minutes * 60 ))" +%H:%M:%S))"
failed=() times=()
part() {  # part NAME CMD...: run within what is left of the bound
    local name=$1 t0=$SECONDS rc=0; shift
    if [ "$(left)" -le 60 ]; then echo "== $name: not run, the time bound is spent"; failed+=("$name (not run)"); return; fi
    echo "== $name"
    timeout -s INT -k 60 "$(left)" "$@" || rc=$?
    times+=("$(printf '%-28s %5d s  %s' "$name" $((SECONDS - t0)) "$([ $rc = 0 ] && echo ok || echo "FAILED (exit $rc)")")")
    [ $rc = 0 ] || failed+=("$name")
}
part "soak-marked tests" .venv/bin/pytest -q -m soak
# the fault table's faults each 30-45 s after the one before healed: each on its own, at the defaults, in
# about 15 minutes instead of the 28 that a clock spaced for the slowest (a hang, about 210 s to confirm) takes
part "fault table (make faults)" "$PY" bench/bench_faults.py --after-heal --every 30-45 --out bench/out/soak-faults
chaos_min=$(( ($(left) - 240) / 60 ))
[ "$chaos_min" -ge 5 ] || chaos_min=5
part "chaos soak ($chaos_min min)" "$PY" bench/bench_chaos.py --minutes "$chaos_min" --every 230-250 --out bench/out/soak-chaos
echo "make soak: $((SECONDS - start)) s of $((minutes * 60)) s"
printf '  %s\n' "${times[@]}"
if [ ${#failed[@]} -gt 0 ]; then echo "make soak: FAILED: ${failed[*]}"; exit 1; fi
echo "make soak: passed"
