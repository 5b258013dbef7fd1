"""Several serving groups behind the one door, proven: the lab with LAB_NODES=4 (head, worker1 to worker3) and
GROUPS=2, two groups of two nodes each running the stand-in engine (it keeps the rank contract for any --nnodes):
group 0 on the head and worker1, group 1 on worker2 (its rank 0, behind its side door on the fabric) and worker3.
Under a steady load of short requests from clients that never retry (tests/lab/door_load.py), a rank of one group
killed costs no request begun after it and refuses no connection, and the group heals by its own watchdog while
the other serves; `doit stop --group 1` takes it out the same way and `doit launch` brings it back alone. From the
other nodes the hostile corpus finds no engine open on the fabric. The module runs after the three-node one (it
grows the lab to four nodes) and leaves the lab as it is: the session's end takes it down."""
import json
import time

import pytest
from conftest import launch_from_nothing
from door_hostile import SOURCE
from labctl import DoorLoad, wait_for
from test_three_nodes import lab_with

pytestmark = pytest.mark.lab

GROUPS = {"WORKERS": "root@198.51.100.13,root@198.51.100.14,root@198.51.100.15", "GROUPS": "2",
          "WATCHDOG": "1", "WATCHDOG_INTERVAL_S": "2", "WATCHDOG_PROBE_S": "4", "SSH_TIMEOUT_S": "5"}
STATE = "/root/.dsv41-two-sparks"
SIDE = ("198.51.100.14", "18000")        # group 1's side door: worker2's fabric address, ENGINE_PORT
MODEL = "deepseek-v4.1-flash"
ROLLED_KV = "2600000000"                 # what the rolling release changes KV_BYTES to; in service after it


@pytest.fixture(scope="module")
def four(lab):
    lab4 = lab_with(4)
    assert list(lab4.ip) == ["head", "worker1", "worker2", "worker3"]
    t0 = time.monotonic()
    launched = launch_from_nothing(lab4, GROUPS)
    print(f"four nodes, two groups: launch from nothing took {time.monotonic() - t0:.1f} s")
    return lab4, launched


def status(lab):
    return json.loads(lab.doit("status --json", GROUPS, check=False).stdout)


def both_ready(lab):
    doc = status(lab)
    return doc if [(g["state"], g["at_door"]) for g in doc["groups"]] == [("READY", "UP")] * 2 else None


def since(lab, node, unit):
    return lab.on(node, f"systemctl show -p ActiveEnterTimestampMonotonic --value {unit}").stdout.strip()


def test_two_groups_serve_behind_the_door_each_with_its_own_rendezvous(four):
    lab, launched = four
    out = launched.stdout
    assert out.index("[worker3] started dsv41-r3.service") < out.index("[worker2] started dsv41-r2.service")
    doc = wait_for("both groups ready at the door", lambda: both_ready(lab), timeout=60)
    assert doc["state"] == "READY"
    assert [g["nodes"] for g in doc["groups"]] == [["head", "worker1"], ["worker2", "worker3"]]
    r3 = lab.on("worker3", "cat /etc/systemd/system/dsv41-r3.service").stdout
    assert "--master-addr 198.51.100.14" in r3 and "--nnodes 2" in r3 and "--node-rank 1" in r3
    r1 = lab.on("worker1", "cat /etc/systemd/system/dsv41-r1.service").stdout
    assert "--master-addr 198.51.100.11" in r1 and "--node-rank 1" in r1
    assert lab.on("worker2", "systemctl is-active dsv41-sidedoor").stdout.strip() == "active"
    assert lab.on("worker1", "systemctl is-active dsv41-sidedoor", check=False).stdout.strip() != "active"
    assert "server g1 198.51.100.14:18000" in lab.on("head", f"cat {STATE}/gateway/haproxy.cfg").stdout


def corpus(lab, node, key, count=100):
    """tests/door_corpus.py on `node` against group 1's side door with key (None: none) -> its summary."""
    prelude = f"import os\nos.environ['DOOR_KEY'] = {key!r}\n" if key else ""
    r = lab.on(node, ["python3", "-", *SIDE, "--seed", "5252", "--count", str(count)], check=False, timeout=180,
               input=prelude + SOURCE.read_text())
    lines = r.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("{"), f"door_corpus on {node} exited {r.returncode}: {r.stderr[-2000:]}"
    return json.loads(lines[-1])


def test_no_engine_of_a_group_answers_from_another_node_without_the_door_key(four):
    """Group 1's rank 0 listens on worker2's loopback only; its side door on the fabric lets in the head door's
    key alone: no key, a wrong key and the client key itself get no model answer from worker1 or worker3."""
    lab, _ = four
    client_key = lab.on("head", f"cat {STATE}/api_key").stdout.strip()
    for node, label, key in (("worker1", "no key", None), ("worker1", "a wrong key", "sk-" + "x" * 40),
                             ("worker3", "the client key", client_key)):
        out = corpus(lab, node, key)
        print(f"side door from {node}, {label}: {out['sent']} requests: {out['statuses']}")
        assert out["model_answers"] == [] and out["unexpected"] == [], (node, label, out["model_answers"][:5],
                                                                         out["unexpected"][:5])
        assert client_key not in json.dumps(out)
    r = lab.on("worker1", "curl -s -m 5 -o /dev/null -w '%{http_code}' http://198.51.100.14:18000/v1/models",
               check=False)
    assert r.stdout.strip() == "401", r.stdout


def under_load(lab):
    """Both groups ready at the door, then DoorLoad's clients running a few seconds, then its mark -> (when group
    0's rank last started, the load)."""
    wait_for("both groups ready at the door", lambda: both_ready(lab), timeout=120)
    head_rank = since(lab, "head", "dsv41-r0")
    load = DoorLoad(lab, MODEL)
    time.sleep(4)
    load.mark()
    return head_rank, load


def group_incidents(lab, index):
    return lab.incidents(f"{STATE}/groups/g{index}")


def test_a_rank_of_one_group_killed_under_load_costs_no_request_and_its_group_heals_alone(four):
    lab, _ = four
    head_rank, load = under_load(lab)
    t0 = time.monotonic()
    lab.on("worker3", "docker kill dsv41-r3")
    wait_for("group 1 to recover", lambda: any(i.get("verdict") for i in group_incidents(lab, 1)), timeout=90)
    doc = wait_for("group 1 healed at the door", lambda: both_ready(lab), timeout=180, every=2)
    healed = time.monotonic() - t0
    time.sleep(3)
    out = load.end()
    print(f"group 1's worker rank killed under load: {out['requests']} requests, {out['after']} begun after the "
          f"kill, {out['failed_after']} of them failed, {out['refused']} refused; healed in {healed:.0f} s: "
          f"{out['codes']}")
    assert out["failed_after"] == 0 and out["refused"] == 0 and out["after"] > 20, out
    assert since(lab, "head", "dsv41-r0") == head_rank              # group 0 was never restarted
    inc = group_incidents(lab, 1)[-1]
    assert inc["result"] == "READY" and inc["node"] in ("worker2", "worker3"), inc
    assert group_incidents(lab, 0) == []
    assert doc["groups"][1]["watchdog"]["last_incident"]["id"] == inc["id"]
    log = lab.on("head", "journalctl -u dsv41-watchdog --no-pager -o cat", check=False).stdout
    assert "[group 1] INCIDENT" in log and "[group 0] INCIDENT" not in log


def test_stop_group_drains_it_while_the_other_serves_and_launch_brings_it_back_alone(four):
    lab, _ = four
    head_rank, load = under_load(lab)
    r = lab.doit("stop --group 1", GROUPS)
    assert "group 1 (worker2, worker3) is stopped and out of the door" in r.stdout, r.stdout
    doc = status(lab)
    assert doc["groups"][1]["at_door"].startswith("MAINT") and doc["groups"][0]["state"] == "READY", doc["groups"]
    assert lab.on("worker2", "systemctl is-active dsv41-r2", check=False).stdout.strip() != "active"
    time.sleep(12)                       # its watchdog keeps its hands off: nothing starts it again
    assert lab.on("worker2", "systemctl is-active dsv41-r2", check=False).stdout.strip() != "active"
    out = load.end()
    print(f"`doit stop --group 1` under load: {out['after']} requests begun after it, {out['failed_after']} failed, "
          f"{out['refused']} refused")
    assert out["failed_after"] == 0 and out["refused"] == 0 and out["after"] > 20, out
    r = lab.doit("launch", GROUPS)
    assert "restart-ranks on group 1" in r.stdout or "(re)starting the ranks" in r.stdout, r.stdout
    wait_for("both groups ready at the door", lambda: both_ready(lab), timeout=120)
    assert since(lab, "head", "dsv41-r0") == head_rank              # group 0 served throughout


def newest_release(lab):
    """The newest release's record on the head."""
    number = lab.on("head", f"ls -1 {STATE}/releases | sort | tail -1").stdout.strip()
    return json.loads(lab.on("head", f"cat {STATE}/releases/{number}/release.json").stdout)


def started(lab):
    """{node: when its rank last started} (systemd's monotonic stamp on each node)."""
    return {n: since(lab, n, f"dsv41-r{i}") for i, n in enumerate(lab.ip)}


def test_a_change_rolls_out_group_by_group_under_load_with_no_failed_request(four):
    """A change every rank reads (KV_BYTES: every rank unit) while both groups serve: group 0 drained,
    restarted, checked and held while group 1 serves, then group 1: the change on every node, none failed."""
    lab, _ = four
    _, load = under_load(lab)
    before = started(lab)
    r = lab.doit("launch", {**GROUPS, "KV_BYTES": ROLLED_KV})
    out = load.end()
    print(f"a rolling release under load: {out['after']} requests begun after the launch, {out['failed_after']} "
          f"failed, {out['refused']} refused")
    assert out["failed_after"] == 0 and out["refused"] == 0 and out["after"] > 20, out
    text = r.stdout
    assert text.index("(re)starting the ranks of group 0") < text.index("holding") < \
        text.index("(re)starting the ranks of group 1"), text
    assert "is good and in service" in text
    assert newest_release(lab)["groups"] == {"g0": "good", "g1": "good"}
    after = started(lab)
    assert all(after[n] != before[n] for n in lab.ip), (before, after)          # every rank restarted
    for i, n in enumerate(lab.ip):
        assert f"--kv-cache-memory-bytes {ROLLED_KV}" in lab.on(n, f"cat /etc/systemd/system/dsv41-r{i}.service").stdout


FAILS_AT_ONCE = "--compilation-config not-json"      # the stand-in exits 1, as vLLM does on bad JSON


def test_a_change_the_engine_rejects_stops_at_its_first_group_which_goes_back_alone(four):
    """The first group restarted on a change whose rank 0 exits at once goes back to the last good release
    alone; the second never leaves it (its ranks and unit files untouched); no request fails meanwhile."""
    lab, _ = four
    _, load = under_load(lab)
    before = started(lab)
    units = {n: lab.on(n, f"cat /etc/systemd/system/dsv41-r{i}.service").stdout for i, n in enumerate(lab.ip)}
    r = lab.doit("launch", {**GROUPS, "KV_BYTES": ROLLED_KV, "EXTRA": FAILS_AT_ONCE}, check=False)
    out = load.end()
    print(f"a change the engine rejects, under load: {out['after']} requests begun after the launch, "
          f"{out['failed_after']} failed, {out['refused']} refused")
    assert r.returncode == 10 and "rolled back to release" in r.stdout + r.stderr, r.stdout[-3000:] + r.stderr
    assert out["failed_after"] == 0 and out["refused"] == 0 and out["after"] > 20, out
    assert "(re)starting the ranks of group 1" not in r.stdout.split("going back")[0]      # it stopped at group 0
    failed = newest_release(lab)
    assert failed["state"] == "rolled back" and failed["groups"] == {"g0": "back"}, failed["groups"]
    after = started(lab)
    assert after["worker2"] == before["worker2"] and after["worker3"] == before["worker3"]  # never left
    for i, n in enumerate(lab.ip):
        assert lab.on(n, f"cat /etc/systemd/system/dsv41-r{i}.service").stdout == units[n], n
    wait_for("both groups ready at the door", lambda: both_ready(lab), timeout=120)


def test_prometheus_scrapes_each_groups_engine_through_its_door_and_labels_every_series_with_its_group(four):
    """`doit monitoring --install` with GROUPS=2: group 1's engine is scraped through its side door with the door's
    key, every node's exporter and each group's watchdog series carry their group, so the dashboard's selector
    and the alert rules can tell the groups apart."""
    from test_lab_monitoring import MON, api
    lab, _ = four
    env = {**GROUPS, **MON, "KV_BYTES": ROLLED_KV}
    lab.doit("launch", env)           # every node's exporter (METRICS_DIR): after the rolling release, no rank restarts
    try:
        lab.doit("monitoring --install", env)
        targets = wait_for("every target scraped", lambda: (lambda t: t if t and all(
            x["health"] == "up" for x in t) else None)(api(lab, "/api/v1/targets")["activeTargets"]), timeout=120)
        engines = sorted((t["labels"]["group"], t["scrapeUrl"]) for t in targets
                         if t["labels"]["job"] == "dsv41-engine")
        assert engines == [("g0", "http://127.0.0.1:18000/metrics"), ("g1", f"http://{':'.join(SIDE)}/metrics")]
        assert sorted((t["labels"]["node"], t["labels"]["group"]) for t in targets
                      if t["labels"]["job"] == "dsv41-node") == [
            ("head", "g0"), ("worker1", "g0"), ("worker2", "g1"), ("worker3", "g1")]
        running = wait_for("the engines' series of both groups", lambda: (lambda r: r if len(r) == 2 else None)(
            api(lab, "/api/v1/query", query='vllm:num_requests_running{job="dsv41-engine"}')["result"]), timeout=60)
        assert sorted(r["metric"]["group"] for r in running) == ["g0", "g1"]
        verdicts = wait_for("each group's watchdog series", lambda: (lambda r: r if len(r) == 2 else None)(
            api(lab, "/api/v1/query", query="max by (group) (dsv41_watchdog_judging)")["result"]), timeout=60)
        assert sorted(r["metric"]["group"] for r in verdicts) == ["g0", "g1"]
    finally:
        lab.on("head", "systemctl disable --now dsv41-prometheus dsv41-alertmanager", check=False)


def test_a_rolling_launch_killed_half_way_is_carried_on_and_a_rollback_rolls_back_group_by_group(four):
    """A rolling launch killed -9 as it restarts its second group (the first already on the change, the second
    drained at the door) is carried on by the watchdog: the second group is restarted and let in again. Then
    `doit rollback` goes back group by group. Both under load, with no failed request and no refused one."""
    lab, _ = four
    _, load = under_load(lab)
    before = started(lab)
    t0 = time.monotonic()
    lab.doit_killed("launch", {**GROUPS, "KV_BYTES": "2650000000"}, "(re)starting the ranks of group 1")
    killed = newest_release(lab)
    assert killed["state"] == "rolling out" and killed["groups"].get("g0") == "good", killed
    done = wait_for("the watchdog to finish the killed rollout", lambda: (
        lambda r: r if r["state"] == "good" else None)(newest_release(lab)), timeout=240, every=2)
    took = time.monotonic() - t0
    assert done["number"] == killed["number"] and done["groups"] == {"g0": "good", "g1": "good"}, done
    wait_for("both groups ready at the door", lambda: both_ready(lab), timeout=120)
    after = started(lab)
    assert all(after[n] != before[n] for n in lab.ip), (before, after)
    for i, n in enumerate(lab.ip):
        assert "--kv-cache-memory-bytes 2650000000" in lab.on(n, f"cat /etc/systemd/system/dsv41-r{i}.service").stdout
    log = lab.on("head", "journalctl -u dsv41-watchdog --no-pager -o cat", check=False).stdout
    assert f"[group 0] release {killed['number']} was left rolling out" in log, log[-2000:]
    r = lab.doit("rollback", GROUPS)
    out = load.end()
    print(f"a rolling launch killed -9 at its second group: finished by the watchdog {took:.0f} s after it began; "
          f"then a rollback group by group; under load {out['after']} requests begun after the kill, "
          f"{out['failed_after']} failed, {out['refused']} refused")
    assert out["failed_after"] == 0 and out["refused"] == 0 and out["after"] > 20, out
    text = r.stdout
    assert text.index("(re)starting the ranks of group 0") < text.index("holding") < \
        text.index("(re)starting the ranks of group 1"), text
    back = newest_release(lab)
    assert back["state"] == "good" and back["groups"] == {"g0": "good", "g1": "good"}, back
    for i, n in enumerate(lab.ip):
        assert "--kv-cache-memory-bytes 2650000000" not in lab.on(n, f"cat /etc/systemd/system/dsv41-r{i}.service").stdout
