"""Checked rollouts in the two-node lab with the stand-in engine: every launch that changes what runs is a
release; one whose rank fails at once, or that never becomes ready within its deadline, goes back to the
last good release by itself and serves again; `doit rollback` goes back on purpose; the release that
just failed is refused without --retry-failed; a launch killed half-way is finished by the next. The lab
profile sets ROLLOUT_HOLD_S to 5 s and the deadline's floor to 1 min (the stand-in starts in seconds)."""
import json
import re
import time

import pytest

from labctl import wait_for

pytestmark = pytest.mark.lab

STATE = "/root/.dsv41-two-sparks"
FAILS_AT_ONCE = {"EXTRA": "--compilation-config not-json"}      # the stand-in exits 1, as vLLM does on bad JSON
NEVER_READY = {"EXTRA": "--port 8009"}                           # serves, but not where the API is


FAST_WATCHDOG = {"WATCHDOG": "1", "WATCHDOG_INTERVAL_S": "5"}      # it carries a dead command's release on


def history(lab):
    """[(number, state, in service)] from `doit releases`."""
    out = lab.doit("releases").stdout
    rows = re.findall(r"^([* ]) +(\d+)  .*?  (good|failed, rolled back to \d+|failed, rolling back to \d+|"
                      r"failed, down|failed|rolling out|interrupted) ", out, re.M)
    return [(int(n), state, mark == "*") for mark, n, state in rows]


def finished_by_the_watchdog(lab, number, state, t0, timeout=180):
    """Release `number` reaches `state` with nobody touching anything, and the cluster is left served,
    supervised and not silenced: the watchdog active, status READY, no silence of ours."""
    wait_for(f"release {number} to be {state}", lambda: (number, state) in [(n, s) for n, s, _ in history(lab)],
             timeout=timeout)
    took = time.monotonic() - t0
    assert answers(lab)
    status = json.loads(lab.doit("status --json", check=False).stdout)
    assert status["state"] == "READY" and status["watchdog"]["unit"] == "active", status
    assert status["release"]["rolling_out"] is None and status["silenced"] is None, status["release"]
    carried = [line for line in lab.on("head", "journalctl -u dsv41-watchdog --no-pager -o cat").stdout.splitlines()
               if f"release {number} " in line and "carr" in line]
    assert carried, "the watchdog's journal says nothing of carrying it on"
    return took


def serving(lab):
    return next(n for n, _, here in history(lab) if here)


def key(lab):
    return lab.on("head", f"cat {STATE}/api_key").stdout.strip()


def answers(lab):
    r = lab.on("head", f"curl -s -o /dev/null -w '%{{http_code}}' -H 'Authorization: Bearer {key(lab)}' "
                       "http://127.0.0.1:8000/v1/models")
    return r.stdout.strip() == "200"


def units_text(lab):
    return {n: lab.on(n, "cat /etc/systemd/system/dsv41-r*.service").stdout for n in ("head", "worker1")}


@pytest.fixture(scope="module")
def good(lab, launched):
    """The stand-in on the defaults, in service as a good release."""
    lab.doit("launch")
    yield serving(lab)
    lab.doit("launch", check=False)


def test_a_good_change_is_a_new_release_and_the_same_launch_records_none(lab, good):
    r = lab.doit("launch", {"KV_BYTES": "2600000000"})
    assert "release " in r.stdout and "is good and in service" in r.stdout
    new = serving(lab)
    assert new > good and (new, "good", True) in history(lab)
    show = lab.doit(f"releases show {new}").stdout
    assert "KV_BYTES 2700000000 -> 2600000000" in show and "dsv41-r0.service changed on head" in show
    assert re.search(r"^\+.*--kv-cache-memory-bytes 2600000000", show, re.M)
    assert "kernel " in show and "docker " in show                     # what else could have changed
    again = lab.doit("launch", {"KV_BYTES": "2600000000"})
    assert "nothing changed" in again.stdout and serving(lab) == new
    status = json.loads(lab.doit("status --json").stdout)
    assert status["schema"] == "dsv41.status/6" and status["release"]["serving"]["number"] == new


def test_doit_rollback_goes_back_to_the_last_good_release_before_the_one_in_service(lab, good):
    before = serving(lab)
    r = lab.doit("rollback")
    assert "serves again as release" in r.stdout
    back = serving(lab)
    assert back > before
    assert "--kv-cache-memory-bytes 2700000000" in lab.on("head", "cat /etc/systemd/system/dsv41-r0.service").stdout
    assert answers(lab)
    assert "nothing changed" in lab.doit("launch").stdout               # conf says the defaults: that is what runs


def test_a_rank_that_fails_at_once_rolls_back_and_the_same_launch_is_refused(lab, good):
    last_good = serving(lab)
    t0 = time.monotonic()
    r = lab.doit("launch", FAILS_AT_ONCE, check=False)
    took = time.monotonic() - t0
    assert r.returncode == 10, r.stdout[-2000:] + r.stderr[-2000:]
    line = r.stderr.strip().splitlines()[-1]
    assert f"rolled back to release {last_good}, serving again" in line, line
    assert "not-json" not in lab.on("head", "cat /etc/systemd/system/dsv41-r0.service").stdout
    assert answers(lab)
    failed = max(n for n, _, _ in history(lab))
    assert (failed, f"failed, rolled back to {last_good}", False) in history(lab) and serving(lab) == last_good
    assert [i for i in lab.incidents(STATE) if f"release {failed} failed" in i["evidence"] and i["result"] == "READY"]
    status = lab.doit("status").stdout
    assert f"release {last_good} in service" in status and f"release {failed} failed at" in status
    print(f"a rank that failed at once: rolled back and serving {took:.0f} s after the launch began")

    before = units_text(lab)
    refused = lab.doit("launch", FAILS_AT_ONCE, check=False)
    assert refused.returncode != 0 and "--retry-failed" in refused.stderr
    assert f"release {failed} failed at" in refused.stderr
    assert units_text(lab) == before                                       # nothing touched
    assert "launch would refuse" in lab.doit("plan", FAILS_AT_ONCE).stdout

    retry = lab.doit("launch --retry-failed", FAILS_AT_ONCE, check=False)
    assert retry.returncode == 10 and f"rolled back to release {last_good}" in retry.stderr
    assert answers(lab)


def test_a_release_that_never_becomes_ready_rolls_back_at_its_deadline(lab, good):
    last_good = serving(lab)
    t0 = time.monotonic()
    r = lab.doit("launch", NEVER_READY, check=False)
    took = time.monotonic() - t0
    assert r.returncode == 10, r.stdout[-2000:] + r.stderr[-2000:]
    assert "did not become ready within 1 min (the rollout deadline" in r.stdout + r.stderr
    assert f"rolled back to release {last_good}, serving again" in r.stderr
    assert answers(lab) and serving(lab) == last_good
    print(f"a release that never served: rolled back and serving {took:.0f} s after the launch began")


@pytest.mark.soak           # per landing: the watchdog finishes it; the next launch's part is in test_rollout.py
def test_with_the_watchdog_off_a_killed_launch_is_finished_by_the_next(lab, good):
    change = {"KV_BYTES": "2650000000"}
    lab.doit_killed("launch", change, "(re)starting the ranks")
    rolling = max(n for n, _, _ in history(lab))
    assert (rolling, "rolling out", False) in history(lab)
    status = lab.doit("status", check=False).stdout
    assert f"release {rolling} rolling out" in status and "the next `doit launch` or `doit rollback` carries it on" \
        in status, status
    r = lab.doit("launch", change)
    assert f"release {rolling} was interrupted half-way" in r.stdout and "finishes its rollout" in r.stdout
    assert (rolling, "good", True) in history(lab)
    lab.doit("launch")                                                    # back to the defaults
    assert answers(lab)


def killed_launch_is_finished_by_the_watchdog(lab, line, what):
    lab.doit("launch", FAST_WATCHDOG)
    t0 = time.monotonic()
    lab.doit_killed("launch", {**FAST_WATCHDOG, "KV_BYTES": "2650000000"}, line)
    rolling = max(n for n, _, _ in history(lab))
    took = finished_by_the_watchdog(lab, rolling, "good", t0)
    assert serving(lab) == rolling and "--kv-cache-memory-bytes 2650000000" in units_text(lab)["head"]
    print(f"a launch killed {what}: release {rolling} good and serving {took:.0f} s after it began")
    lab.doit("launch")                                                    # back to the defaults, watchdog off


def test_a_launch_killed_while_the_ranks_start_is_finished_by_the_watchdog(lab, good):
    killed_launch_is_finished_by_the_watchdog(lab, "started dsv41-r1", "while the ranks started")


@pytest.mark.soak           # per landing: killed while the ranks start (above), while going back, a rollback
@pytest.mark.parametrize("line, what", [("installed /etc/systemd/system/dsv41-r", "once its units were written"),
                                        ("(re)starting the ranks", "as the ranks were stopped"),
                                        ("holding: ", "during the hold")])
def test_a_launch_killed_at_any_step_is_finished_by_the_watchdog(lab, good, line, what):
    killed_launch_is_finished_by_the_watchdog(lab, line, what)


def test_a_rollback_killed_half_way_is_finished_by_the_watchdog(lab, good):
    lab.doit("launch", FAST_WATCHDOG)               # the release it goes back to runs the watchdog (WATCHDOG=0
    lab.doit("launch", {**FAST_WATCHDOG, "KV_BYTES": "2650000000"})     # there would stop it: nobody carries on)
    before = serving(lab)
    t0 = time.monotonic()
    lab.doit_killed("rollback", FAST_WATCHDOG, "started dsv41-r1")
    rolling = max(n for n, _, _ in history(lab))
    assert rolling > before
    took = finished_by_the_watchdog(lab, rolling, "good", t0)
    assert serving(lab) == rolling and "--kv-cache-memory-bytes 2650000000" not in units_text(lab)["head"]
    print(f"a rollback killed half-way: release {rolling} good and serving {took:.0f} s after it began")
    lab.doit("launch")
