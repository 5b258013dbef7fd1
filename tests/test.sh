#!/usr/bin/env bash
# make test: what CI runs, every shipped behaviour proven once. The lab's tests (one lab, brought up and
# taken down by them) and, beside them, the unit tests in a pytest of their own: the lab's first modules
# (alerts, monitoring, the rollout: tests/lab/conftest.py) mostly wait, so the unit tests take the idle
# core. The unit tests' output is printed after the lab's; each part's seconds are printed, and appended
# to $TEST_TIMES when it is set. SIGINT (CI's time bound, sent to the process group) reaches both: each prints its summary.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=.venv/bin/pytest
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
start=$(date +%s)
# a background job of a script starts with SIGINT ignored: env gives it back, so the bound's SIGINT (sent
# to the whole process group) still gets the unit tests' summary
( env --default-signal=INT $PYTEST -q -p no:cacheprovider -m 'not lab and not soak' > "$out/unit.log" 2>&1
  echo $? > "$out/unit.rc"; date +%s > "$out/unit.end" ) &
unit=$!
$PYTEST -q -m 'lab and not soak' --durations=60        # every lab test of note: where the time goes
lab_rc=$? lab_end=$(date +%s)
wait "$unit"
echo
echo "== unit tests (run beside the lab's)"
cat "$out/unit.log"
unit_rc=$(cat "$out/unit.rc" 2>/dev/null || echo 1)
unit_s=$(( $(cat "$out/unit.end" 2>/dev/null || date +%s) - start ))
echo "make test: lab tests $((lab_end - start)) s, unit tests $unit_s s (beside them)"
[ -z "${TEST_TIMES:-}" ] || printf 'lab tests\t%s\t%s\nunit tests (beside)\t%s\t%s\n' \
    $((lab_end - start)) "$lab_rc" "$unit_s" "$unit_rc" >> "$TEST_TIMES"
# pytest's 5 (nothing collected) is a failure here too: a part that ran no test proved nothing
[ "$lab_rc" = 0 ] && [ "$unit_rc" = 0 ]
