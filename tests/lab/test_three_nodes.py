"""More than two nodes, proven: the lab with LAB_NODES=3 (head, worker1, worker2 on one bridged fabric)
and the stand-in engine (it keeps the rank contract for any --nnodes). The module brings the lab up with
three nodes and runs after every other lab module (tests/lab/conftest.py orders it last), so it leaves
the lab as it is: the session's end takes it down."""
import json
import time

import pytest
from conftest import lab_up, launch_from_nothing
from labctl import MODEL, Lab

pytestmark = pytest.mark.lab

WORKERS = {"WORKERS": "root@198.51.100.13,root@198.51.100.14"}
FAST = {**WORKERS, "WATCHDOG": "1", "WATCHDOG_INTERVAL_S": "2", "WATCHDOG_PROBE_S": "4", "SSH_TIMEOUT_S": "5"}


def lab_with(nodes):
    lab_up(LAB_NODES=str(nodes))
    return Lab()


@pytest.fixture(scope="module")
def three(lab):
    lab3 = lab_with(3)
    assert list(lab3.ip) == ["head", "worker1", "worker2"]
    t0 = time.monotonic()
    launched = launch_from_nothing(lab3, WORKERS)
    print(f"three nodes: launch from nothing took {time.monotonic() - t0:.1f} s")
    return lab3, launched


def copy_to(lab, workers):
    """`doit copy` to `workers` (a WORKERS value) after wiping the checkpoint on both workers: its seconds."""
    for n in ("worker1", "worker2"):
        lab.on(n, "rm -rf /root/lab-model /root/.dsv41-two-sparks/checkpoint-receipt.json")
    t0 = time.monotonic()
    lab.doit("copy", {"WORKERS": workers})
    return time.monotonic() - t0


def verified_on_both(lab):
    for n in ("worker1", "worker2"):
        receipt = json.loads(lab.on(n, "cat /root/.dsv41-two-sparks/checkpoint-receipt.json").stdout)
        assert len(receipt["files"]) == 6, (n, receipt)


def test_workers_get_the_checkpoint_at_once_verified_on_each(three):
    lab, _ = three
    copy_to(lab, WORKERS["WORKERS"])
    verified_on_both(lab)


def test_preflight_checks_every_pair_that_must_talk(three):
    lab, _ = three
    report = json.loads(lab.doit("preflight --json", WORKERS).stdout)
    pings = {c["detail"].split(":")[0]: c["status"] for c in report["checks"] if c["name"] == "ping"}
    assert set(pings) == {"head -> worker1 198.51.100.13", "worker1 -> head 198.51.100.11",
                          "head -> worker2 198.51.100.14", "worker2 -> head 198.51.100.11",
                          "worker1 -> worker2 198.51.100.14", "worker2 -> worker1 198.51.100.13"}
    assert set(pings.values()) == {"PASS"} and report["ok"]


def test_launch_started_the_workers_before_the_head_and_every_node_shows(three):
    lab, launched = three
    out = launched.stdout
    assert out.index("[worker1] started dsv41-r1.service") < out.index("[head] started dsv41-r0.service")
    assert out.index("[worker2] started dsv41-r2.service") < out.index("[head] started dsv41-r0.service")
    report = json.loads(lab.doit("status --json", WORKERS).stdout)
    assert report["state"] == "READY" and list(report["nodes"]) == ["head", "worker1", "worker2"]
    assert all(e["rank_state"] == "active/running" for e in report["nodes"].values())
    assert "--nnodes 3" in lab.on("worker2", "cat /etc/systemd/system/dsv41-r2.service").stdout


def test_the_middle_worker_lost_is_degraded_by_name_and_launch_restores_it(three):
    lab, _ = three
    lab.on("worker1", "docker kill dsv41-r1")
    time.sleep(1)
    r = lab.doit("status --json", WORKERS, check=False)
    report = json.loads(r.stdout)
    assert r.returncode == 1 and report["state"] == "DEGRADED"
    assert report["nodes"]["worker1"]["rank_state"] != "active/running"
    assert report["nodes"]["worker2"]["rank_state"] == "active/running"
    assert "dsv41-r1.service on worker1 is " in lab.doit("plan", WORKERS).stdout
    lab.doit("launch", WORKERS)
    assert json.loads(lab.doit("status --json", WORKERS).stdout)["state"] == "READY"


def test_the_watchdog_heals_three_nodes(three):
    lab, _ = three
    lab.on("head", "rm -f /root/.dsv41-two-sparks/incidents.jsonl")
    lab.doit("launch", FAST)
    lab.on("worker2", "docker kill dsv41-r2")
    deadline = time.monotonic() + 120
    while True:
        done = lab.incidents()
        if done and done[-1]["result"] == "READY":
            break
        assert time.monotonic() < deadline, done
        time.sleep(1)
    assert "worker2" in done[-1]["evidence"]
    assert json.loads(lab.doit("status --json", WORKERS).stdout)["state"] == "READY"


def test_stop_stops_every_node(three):
    lab, _ = three
    lab.doit("stop", WORKERS)
    for rank, node in enumerate(lab.ip):
        units = lab.units(node, [f"dsv41-r{rank}.service", "dsv41-memguard.service"])
        assert all(p["ActiveState"] != "active" for p in units.values()), (node, units)
        assert lab.on(node, "docker ps -q --filter name=dsv41-").stdout.strip() == ""


COPY_SPEEDUP_MIN = 1.1      # docs/lab.md: about 1.3x here, where the two cores are the limit


@pytest.mark.soak
def test_copy_to_two_workers_at_once_is_faster_than_one_at_a_time(three):
    """A checkpoint of about 290 MB (six 48 MB shards; the per-landing one is 24 MB, too small for a ratio),
    copied to one worker after the other and then to both at once, in the same run; last in the module, as
    it replaces the head's checkpoint."""
    lab, _ = three
    lab.on("head", f"{lab.venv}/bin/python {lab.repo}/tests/fixture_checkpoint.py {MODEL} --mb 48")
    try:
        one_at_a_time = copy_to(lab, "root@198.51.100.13") + copy_to(lab, "root@198.51.100.14")
        both = copy_to(lab, WORKERS["WORKERS"])
        verified_on_both(lab)
    finally:
        lab.on("head", f"{lab.venv}/bin/python {lab.repo}/tests/fixture_checkpoint.py {MODEL} --mb 4")
        copy_to(lab, WORKERS["WORKERS"])
    print(f"copy to two workers: at once {both:.1f} s, one at a time {one_at_a_time:.1f} s "
          f"({one_at_a_time / both:.2f}x)")
    assert one_at_a_time / both >= COPY_SPEEDUP_MIN
