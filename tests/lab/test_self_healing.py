"""The watchdog in the two-node lab with the stand-in engine (it behaves as measured real vLLM does: a
lost rank kills rank 0 at the next request, SIGUSR1 wedges it). Its intervals are settings, shortened
here through `doit launch`'s environment; everything else is what runs on a Spark."""
import json
import time

import pytest

from labctl import wait_for

pytestmark = pytest.mark.lab

STATE = "/root/.dsv41-two-sparks"
FAST = {"WATCHDOG": "1", "WATCHDOG_INTERVAL_S": "2", "WATCHDOG_PROBE_S": "4", "WATCHDOG_STALL_S": "12",
        "WATCHDOG_MAX_RECOVERIES": "2", "WATCHDOG_WINDOW_MIN": "60", "SSH_TIMEOUT_S": "5"}


def incidents(lab):
    r = lab.on("head", f"cat {STATE}/incidents.jsonl", check=False)
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def ready(lab):
    r = lab.doit("status --json", check=False)
    return r.returncode == 0 and json.loads(r.stdout)["state"] == "READY"


def journal(lab, since):
    """The watchdog's journal lines since a time (the lab's nodes share this machine's clock)."""
    return lab.on("head", f"journalctl -u dsv41-watchdog --no-pager -o cat --since=@{since:.0f}").stdout


def rank_start(lab, node, rank):
    return lab.units(node, [f"dsv41-r{rank}.service"])[f"dsv41-r{rank}.service"]["ActiveEnterTimestamp"]


@pytest.fixture
def watched(lab, launched):
    """The stand-in cluster launched with a fast watchdog and no incidents yet; put back afterwards."""
    lab.on("head", f"rm -f {STATE}/incidents.jsonl {STATE}/watchdog.gaveup")
    lab.doit("clear-trip", check=False)
    lab.doit("launch", FAST)
    assert lab.units("head", ["dsv41-watchdog.service"])["dsv41-watchdog.service"]["ActiveState"] == "active"
    yield
    lab.doit("clear-trip", check=False)
    lab.on("head", f"rm -f {STATE}/watchdog.gaveup")
    lab.doit("launch", FAST)


def test_a_killed_worker_rank_is_repaired_with_no_command_typed(lab, watched):
    t0 = time.time()
    lab.on("worker1", "docker kill dsv41-r1")
    [inc] = wait_for("a recovery", lambda: [i for i in incidents(lab) if i["result"] == "READY"])
    assert inc["verdict"] in ("DEGRADED", "DEAD") and inc["action"] == "restart"
    assert ready(lab)
    r = lab.doit("smoke", check=False)
    assert r.returncode == 0, r.stdout
    lines = journal(lab, t0)
    assert "INCIDENT " in lines and "RECOVERED from " in lines
    status = lab.doit("status").stdout
    assert "last incident" in status and "restart, READY" in status


def test_a_wedged_engine_is_detected_and_repaired(lab, watched):
    before = rank_start(lab, "head", 0)
    lab.on("head", "docker kill --signal USR1 dsv41-r0")            # the stand-in stops making tokens
    [inc] = wait_for("a recovery from the wedge", lambda: [i for i in incidents(lab) if i["result"] == "READY"])
    assert inc["verdict"] == "WEDGED" and "no token" in inc["evidence"]
    assert rank_start(lab, "head", 0) != before and ready(lab)


def test_a_long_request_with_tokens_flowing_is_never_a_wedge(lab, watched):
    before, t0 = rank_start(lab, "head", 0), time.time()
    key = lab.on("head", f"cat {STATE}/api_key").stdout.strip()
    # about 40 s of steady tokens (the stand-in makes one every 10 ms), over three stall times
    r = lab.on("head", ["curl", "-sS", "-N", "-m", "120", "http://127.0.0.1:8000/v1/chat/completions",
                        "-H", f"Authorization: Bearer {key}", "-H", "Content-Type: application/json",
                        "-d", json.dumps({"model": "deepseek-v4.1-flash", "stream": True,
                                          "messages": [{"role": "user", "content": "count to 4000"}]})],
               timeout=180)
    assert r.stdout.rstrip().endswith("data: [DONE]") and '"4000' in r.stdout.replace(" ", "")
    assert incidents(lab) == [] and rank_start(lab, "head", 0) == before
    lines = journal(lab, t0)
    assert "BUSY: 1 running" in lines and "WEDGED" not in lines


def test_three_faults_two_recoveries_then_it_gives_up_until_launch(lab, watched):
    for n in (1, 2):
        lab.on("worker1", "docker kill dsv41-r1")
        wait_for(f"recovery {n}", lambda: len([i for i in incidents(lab) if i["result"] == "READY"]) == n)
        wait_for("READY", lambda: ready(lab))
    lab.on("worker1", "docker kill dsv41-r1")
    gave_up = wait_for("giving up", lambda: [i for i in incidents(lab) if i["action"] == "gave up"])
    assert "after 2 recoveries within 60 min" in gave_up[0]["result"]
    r = lab.doit("status", check=False)
    assert r.returncode != 0 and "GAVE UP" in r.stdout and "`doit launch`" in r.stdout
    time.sleep(6)
    assert len([i for i in incidents(lab) if i["action"] == "restart"]) == 2       # hands off
    r = lab.doit("launch", FAST)
    assert "cleared" in r.stdout and "the watchdog acts again" in r.stdout and ready(lab)
    assert lab.on("head", f"test -e {STATE}/watchdog.gaveup", check=False).returncode != 0


def test_no_recovery_while_a_guard_is_tripped(lab, watched):
    t0 = time.time()
    lab.doit("launch", {**FAST, "MEMGUARD_GIB": "1000"}, check=False)    # every guard trips at once
    wait_for("the trip", lambda: lab.on("worker1", f"test -e {STATE}/memguard.tripped", check=False).returncode == 0)
    time.sleep(10)                                                          # five intervals
    assert [i for i in incidents(lab) if i["action"] == "restart"] == []
    assert "TRIPPED: the memory guard is tripped on" in journal(lab, t0)


def test_after_doit_stop_nothing_restarts(lab, watched):
    lab.doit("stop")
    time.sleep(8)                                                           # four intervals
    for node, rank in (("head", 0), ("worker1", 1)):
        assert lab.units(node, [f"dsv41-r{rank}.service"])[f"dsv41-r{rank}.service"]["ActiveState"] != "active"
    assert lab.units("head", ["dsv41-watchdog.service"])["dsv41-watchdog.service"]["ActiveState"] != "active"
    assert incidents(lab) == []
