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


def history(lab):
    """[(number, state, in service)] from `doit releases`."""
    out = lab.doit("releases").stdout
    rows = re.findall(r"^([* ]) +(\d+)  .*?  (good|failed, rolled back to \d+|failed|rolling out|interrupted) ",
                      out, re.M)
    return [(int(n), state, mark == "*") for mark, n, state in rows]


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
    assert status["schema"] == "dsv41.status/3" and status["release"]["serving"]["number"] == new


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


@pytest.mark.soak           # per landing: the real engine's image that never serves (test_vllm.py)
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


def test_a_launch_killed_half_way_is_finished_by_the_next(lab, good):
    change = {"KV_BYTES": "2650000000"}
    env = " ".join(f"{k}={v}" for k, v in {**lab.doit_env, **change}.items())
    lab.on("head", f"cd {lab.repo} && (env {env} PYTHONUNBUFFERED=1 PYTHONPATH={lab.repo}/lib setsid {lab.venv}/bin/doit launch "
                   "> /tmp/killed-launch.log 2>&1 &)")
    wait_for("the rollout to start", lambda: "(re)starting the ranks" in lab.on("head", "cat /tmp/killed-launch.log").stdout,
             timeout=120)
    lab.on("head", "pkill -9 -f 'bin/doi[t] launch'")          # [t]: not this shell's own command line
    wait_for("the launch to be gone", lambda: lab.on("head", "pgrep -f 'bin/doi[t] launch'", check=False).returncode == 1)
    rolling = max(n for n, _, _ in history(lab))
    assert (rolling, "rolling out", False) in history(lab)
    assert f"release {rolling} is rolling out or was interrupted" in lab.doit("status", check=False).stdout
    r = lab.doit("launch", change)
    assert f"release {rolling} was interrupted half-way" in r.stdout and "finishes its rollout" in r.stdout
    assert (rolling, "good", True) in history(lab)
    lab.doit("launch")                                                    # back to the defaults
    assert answers(lab)
