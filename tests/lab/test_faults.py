"""Partial failures in the two-node lab: a worker that is cut off or frozen, a memory guard killed under
running ranks, a worker's model replaced under its running rank, a target that would reach ssh as an
option. Every test puts the cluster back before it ends."""
import json
import time

import pytest
from labctl import MODEL

pytestmark = pytest.mark.lab

FAST = {"SSH_TIMEOUT_S": "4"}       # the setting, shortened so the faults cost the tests little


def timed(lab, args, env=None):
    t0 = time.monotonic()
    r = lab.doit(args, {**FAST, **(env or {})}, check=False)
    return r, time.monotonic() - t0


@pytest.fixture
def restore(lab, launched):
    """Whatever the test breaks: link up, nothing frozen, the cluster launched again."""
    yield
    lab.freeze("worker1", False)
    lab.link("worker1", True)
    lab.doit("launch")


@pytest.mark.parametrize("fault", ["link down", "frozen"])
def test_status_reports_a_dead_worker_in_seconds_and_the_head_at_once(lab, restore, fault):
    if fault == "link down":
        lab.link("worker1", False)
    else:
        lab.freeze("worker1", True)
    r, took = timed(lab, "status")
    lines = r.stdout.splitlines()
    assert r.returncode == 4, r.stdout + r.stderr                        # UNREACHABLE
    assert lines[1].startswith("head ") and "dsv41-r0.service active/running" in lines[1]
    assert lines[2].startswith("worker1    UNREACHABLE: ") and "root@198.51.100.13" in lines[2]
    assert "check" in lines[2]                                             # ... and says what to check
    assert took < 4 + 15, f"status took {took:.1f} s with SSH_TIMEOUT_S=4"  # was 75-95 s: seconds, not minutes
    r, took = timed(lab, "status --json")
    report = json.loads(r.stdout)
    assert report["state"] == "UNREACHABLE" and "error" in report["nodes"]["worker1"]
    assert report["nodes"]["head"]["rank_state"] == "active/running"


def test_launch_with_a_frozen_worker_fails_fast_in_one_line(lab, restore):
    lab.freeze("worker1", True)
    r, took = timed(lab, "launch")
    assert r.returncode != 0 and took < 4 + 20, took
    [line] = [ln for ln in r.stderr.splitlines() if ln.startswith("dsv41: ")]
    assert "worker1 (root@198.51.100.13)" in line


def test_stop_stops_what_it_can_reach_and_names_the_rest(lab, restore):
    lab.link("worker1", False)
    r, took = timed(lab, "stop")
    assert r.returncode != 0 and took < 4 + 30
    assert "[head] stopped dsv41-r0.service" in r.stdout and "[head] stopped the memory guard" in r.stdout
    head = lab.units("head", ["dsv41-r0.service", "dsv41-memguard.service"])
    assert all(p["ActiveState"] != "active" for p in head.values()), head
    [line] = [ln for ln in r.stderr.splitlines() if ln.startswith("dsv41: ")]
    assert ("worker1 (root@198.51.100.13) did not answer" in line
            and "dsv41-r1.service and dsv41-memguard.service may still run there" in line)
    lab.link("worker1", True)         # stop never reached it: its guard still runs
    assert lab.units("worker1", ["dsv41-memguard.service"])["dsv41-memguard.service"]["ActiveState"] == "active"


@pytest.mark.parametrize("node", ["worker1", "head"])
def test_a_killed_guard_comes_back_without_touching_the_ranks(lab, launched, node):
    rank = "dsv41-r1.service" if node == "worker1" else "dsv41-r0.service"
    before = lab.units(node, ["dsv41-memguard.service", rank], ("MainPID", "ActiveEnterTimestamp"))
    lab.on(node, "systemctl kill -s KILL dsv41-memguard")
    deadline = time.monotonic() + 60
    while True:
        now = lab.units(node, ["dsv41-memguard.service", rank], ("MainPID", "ActiveState", "ActiveEnterTimestamp"))
        guard = now["dsv41-memguard.service"]
        if guard["ActiveState"] == "active" and guard["MainPID"] not in ("0", before["dsv41-memguard.service"]["MainPID"]):
            break
        assert time.monotonic() < deadline, now
        time.sleep(0.5)
    assert now[rank]["ActiveEnterTimestamp"] == before[rank]["ActiveEnterTimestamp"]   # never stopped
    assert json.loads(lab.doit("status --json").stdout)["state"] == "READY"


def test_model_replaced_under_a_running_worker_rank_restarts_the_ranks(lab, launched):
    lab.on("worker1", f"rm -rf {MODEL}")
    assert lab.on("worker1", "docker exec dsv41-r1 ls /model").stdout.strip() == ""   # what the rank sees now
    lab.doit("copy")
    plan = lab.doit("plan").stdout
    assert f"restart-ranks on all: model files in {MODEL} on worker1 changed after dsv41-r1.service started" in plan
    r = lab.doit("launch")
    assert "(re)starting the ranks: model files in" in r.stdout and "ranks (re)started" in r.stdout
    assert "model-00001-of-00006.safetensors" in lab.on("worker1", "docker exec dsv41-r1 ls /model").stdout
    assert "nothing changed" in lab.doit("launch").stdout


def test_a_target_that_would_be_an_ssh_option_is_refused_before_anything_runs(lab, launched):
    for args in ("clear-trip", "stop", "status"):
        r = lab.doit(args, {"WORKER": "-V"}, check=False)
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [
            "dsv41: WORKER='-V' is not valid: expected an ssh target whose user and host do not start with '-' "
            "(it would reach ssh as an option), like user@10.10.10.11"], r.stderr
    assert lab.units("head", ["dsv41-r0.service"])["dsv41-r0.service"]["ActiveState"] == "active"


def test_launch_repairs_a_wedged_engine_with_its_evidence_when_nothing_changed(lab, restore):
    """The watchdog is off (lab.doit's default) and the engine wedged (SIGUSR1: /health answers, no token):
    a second `doit launch` has nothing to apply, yet finds no token within WATCHDOG_PROBE_S from an engine
    that generated since it started, saves the evidence and restarts the ranks."""
    STATE = "/root/.dsv41-two-sparks"
    lab.on("head", f"rm -rf {STATE}/incidents")
    lab.on("head", "docker kill --signal USR1 dsv41-r0")
    r, took = timed(lab, "launch", {"WATCHDOG_PROBE_S": "4"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(re)starting the ranks: WEDGED: the idle probe got no token within 4 s" in r.stdout
    assert "saved the evidence in" in r.stdout and "ready:" in r.stdout
    assert lab.on("head", f"ls {STATE}/incidents").stdout.strip().endswith("-WEDGED")
    r = lab.doit("smoke", check=False)
    assert r.returncode == 0, r.stdout
