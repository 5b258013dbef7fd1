"""head/core/recovery.py and what launch and `doit incidents` make of it: NEEDS_REBOOT refused until the
memory is back or --force, which units make a broken cluster (evidence first), and `doit incidents` for
real on saved folders. The nodes' answers are probe states here; tests/lab/test_self_healing.py does it on
real nodes."""
import os
from pathlib import Path

import pytest

from dsv41.errors import UserError
from dsv41.head import launch
from dsv41.settings.layers import load_config
from dsv41.head.core import incidents, record, recovery
from dsv41.head.core.cluster import Cluster
from dsv41.head.core.health import DEGRADED, REPAIR, STARTING, memory_check
from dsv41.head.core.state import parse
from test_status import doit

GIB = 1 << 30


def unit(active, result="success", left="@0"):
    return {"installed": True, "ActiveState": active, "SubState": "running" if active == "active" else "dead",
            "Result": result, "ActiveEnterTimestamp": "@1000", "InactiveEnterTimestamp": left, "NRestarts": "0"}


def states(worker_gib=100, head="inactive", worker="inactive", worker_result="success", base=True):
    out = {}
    for name, rank, state, result, gib in (("head", 0, head, "success", 99), ("worker1", 1, worker, worker_result,
                                                                            worker_gib)):
        out[name] = parse({"units": {f"dsv41-r{rank}.service": unit(state, result, "@1500")}, "time": 2000.0,
                           "mem_available_kib": int(gib * 2**20), "mem_baseline_bytes": 100 * GIB if base else None})
    return out


@pytest.fixture
def cl(tmp_path):
    return Cluster(load_config({"WORKER": "u@w", "STATE_DIR": str(tmp_path)}))


def test_launch_refuses_while_a_nodes_memory_is_short_until_it_is_back_or_forced(cl, capsys):
    launch.refuse_if_needs_reboot(cl, states(80), force=False)            # no record: nothing to refuse
    record.set_needs_reboot(cl.cfg.state_dir, "worker1: MemAvailable ... (recorded)")
    with pytest.raises(UserError, match=r"^NEEDS_REBOOT: worker1: MemAvailable 80.0 GiB is 20.0 GiB below its "
                                        r"baseline 100.0 GiB .*reboot worker1, or `doit launch --force`"):
        launch.refuse_if_needs_reboot(cl, states(80), force=False)
    assert record.needs_reboot(cl.cfg.state_dir)
    launch.refuse_if_needs_reboot(cl, states(93), force=False)           # 7 GiB short: within MEM_RETURN_GIB
    assert record.needs_reboot(cl.cfg.state_dir) is None and "came back" in capsys.readouterr().out
    record.set_needs_reboot(cl.cfg.state_dir, "worker1: short")
    launch.refuse_if_needs_reboot(cl, states(80), force=True)
    assert record.needs_reboot(cl.cfg.state_dir) is None and "--force" in capsys.readouterr().out


def test_a_node_without_a_baseline_is_not_checked_with_one_warning(cl):
    check = memory_check(cl.cfg, states(10, base=False))
    assert check.verdict == "BACK" and len(check.warnings) == 2 and "no MemAvailable baseline" in check.warnings[0]


def test_what_launch_takes_for_a_broken_cluster(cl):
    """core.health's judgement, as launch asks it (nothing listens on the API's port here)."""
    assert launch.health_now(cl, states(), probe=True).verdict not in REPAIR      # all stopped cleanly: a plain start
    h = launch.health_now(cl, states(head="active", worker="failed", worker_result="exit-code"), probe=True)
    assert h.verdict == DEGRADED and h.evidence == "dsv41-r1.service on worker1 is failed" and h.node == "worker1"
    assert h.fault_at == 1500.0                                        # when the unit went down


def test_launch_takes_a_silent_engine_for_wedged_only_once_it_generated_since_it_started(tmp_path):
    """Every rank up and no token (nothing listens on the API's port here): wedged when a readiness wait saw
    this start of rank 0 generate (ready.json newer than its start), a start-up still going on otherwise."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cl = Cluster(load_config({"WORKER": "u@w", "STATE_DIR": str(tmp_path), "HEAD_IP": "127.0.0.1",
                              "ENGINE_PORT": str(port), "WATCHDOG_PROBE_S": "5"}))
    (tmp_path / "engine_key").write_text("sk-test-0123456789abcdef\n")
    up = states(head="active", worker="active")                         # rank 0 started at 1000
    assert launch.health_now(cl, up, probe=True).verdict == STARTING    # never ready: the wait covers it
    (tmp_path / "ready.json").write_text('{"time": 900}')
    assert launch.health_now(cl, up, probe=True).verdict == STARTING    # ready before this start: a start-up
    (tmp_path / "ready.json").write_text('{"time": 1100}')
    h = launch.health_now(cl, up, probe=True)
    assert h.verdict in REPAIR and "/health does not answer" in h.evidence


def test_doit_incidents_lists_and_shows_them(tmp_path):
    state = tmp_path / "state"
    for t, verdict in ((1_800_000_000, "DEGRADED"), (1_800_000_600, "WEDGED")):
        folder = incidents.save(str(state), verdict, f"{verdict} evidence", nodes={"head": {"files": {
            "meminfo.txt": "MemAvailable: 1 kB\n", "pyspy-42.txt": "Thread 42\n  step (vllm/v1/engine/core.py:1)\n"},
            "notes": []}}, metrics_text="", fault_at=t - 130, secrets=(), keep=20, now=t)
        incidents.record_result(folder, "READY", ended=t + 60)
    r = doit(["incidents"], tmp_path)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and "WEDGED" in lines[1] and "3.2 min" in lines[1] and "DEGRADED" in lines[2]
    r = doit(["incidents", "show", "2"], tmp_path)
    assert r.returncode == 0 and "DEGRADED evidence" in r.stdout and "vllm/v1/engine/core.py" in r.stdout
    r = doit(["incidents", "show", "3"], tmp_path)
    assert r.returncode != 0 and "no incident 3: 2 saved" in r.stdout + r.stderr
    r = doit(["incidents", "shwo"], tmp_path)
    assert r.returncode != 0 and "doit incidents show [N|NAME]" in r.stdout + r.stderr


# ---- the one restart: the baseline rule and the record of an incident -------------------------------------

class Node:
    def __init__(self, name):
        self.name = self.label = name
        self.written = {}

    def write_file(self, path, text, mode=0o644):
        self.written[path] = text


def test_a_baseline_is_taken_only_before_the_first_rank_since_the_node_booted(cl, monkeypatch):
    """Memory a restart did not get back never becomes the baseline: a node whose baseline is of this boot
    (or of an earlier version, which recorded no boot) is only compared; one without a baseline, or whose
    baseline is of an earlier boot (it rebooted), records its memory now, with the boot it is of."""
    nodes = [Node("head"), Node("worker1")]
    monkeypatch.setattr(type(cl), "nodes", property(lambda self: nodes), raising=False)
    monkeypatch.setattr(cl, "paths", lambda n: type("P", (), {"state_dir": "/s"})())
    monkeypatch.setattr(cl, "engine_units", lambda n: ["dsv41-r0.service" if n.name == "head" else "dsv41-r1.service"])

    def node_state(rank, boot, base_boot, base=100 * GIB, active="inactive"):
        return parse({"units": {f"dsv41-r{rank}.service": unit(active)}, "time": 2000.0, "boot_id": boot,
                      "mem_available_kib": 80 * 2**20, "mem_baseline_bytes": base, "mem_baseline_boot": base_boot})
    lines = []
    this_boot = {"head": node_state(0, "b2", "b2"), "worker1": node_state(1, "b2", None)}   # None: an earlier version's
    recovery.record_baselines(cl, this_boot, log=lines.append)
    assert nodes[0].written == nodes[1].written == {} and lines == []      # 20 GiB short stays the baseline's problem
    rebooted = {"head": node_state(0, "b2", "b2"), "worker1": node_state(1, "b3", "b2")}
    recovery.record_baselines(cl, {**rebooted, "head": node_state(0, "b2", None, base=None)}, log=lines.append)
    assert sorted(n.name for n in nodes if n.written) == ["head", "worker1"]
    assert '"mem_available_bytes": 85899345920' in nodes[1].written["/s/mem-baseline.json"]
    assert '"boot_id": "b3"' in nodes[1].written["/s/mem-baseline.json"]
    assert "worker1" in lines[1] and "since it booted" in lines[1]
    nodes[1].written.clear()
    recovery.record_baselines(cl, {"head": this_boot["head"], "worker1": node_state(1, "b3", "b2", active="active")},
                              log=lines.append)
    assert nodes[1].written == {}                              # a rank runs: its memory is not the boot's


def test_an_incident_is_open_before_its_evidence_and_a_killed_recovery_is_closed_as_interrupted(cl, monkeypatch):
    """The record has the incident before anything is done; a recovery's process that died mid-way (here:
    a step that never returns, like a kill -9) leaves it open; the next watchdog closes it as interrupted,
    and its budget counts it."""
    from dsv41.head.core import ranks
    from dsv41.head.core.health import Health
    seen = []

    def evidence(c, h, log, name=None):
        seen.append([i["id"] for i in record.open_incidents(cl.cfg.state_dir)])
        raise KeyboardInterrupt("killed")                    # stands for the process dying here
    monkeypatch.setattr(recovery, "save_evidence", evidence)
    monkeypatch.setattr(ranks, "kill_ranks", lambda c: pytest.fail("nothing is killed after the process died"))
    fault = Health(DEGRADED, ("dsv41-r1.service on worker1 is failed",), "worker1", 1500.0, "restart")
    with pytest.raises(KeyboardInterrupt):
        recovery.restart(cl, fault=fault, by="dsv41-watchdog", log=lambda m: None)
    [inc] = record.incidents(cl.cfg.state_dir)
    assert seen == [[inc["id"]]] and inc["verdict"] == "DEGRADED" and inc["node"] == "worker1"
    assert inc["fault_at"] == 1500.0 and inc["action"] == "restart"
    # the finally of a Python-level interruption closed it; a kill -9 would not: reopen it as the kill leaves it
    lines = (cl.cfg.state_dir + "/incidents.jsonl")
    with open(lines) as f:
        kept = [ln for ln in f if '"close"' not in ln]
    with open(lines, "w") as f:
        f.writelines(kept)
    assert [i["id"] for i in record.open_incidents(cl.cfg.state_dir)] == [inc["id"]]
    assert len(record.recoveries(cl.cfg.state_dir)) == 1     # counted while open
    [closed] = record.close_interrupted(cl.cfg.state_dir, "DEGRADED: dsv41-r1.service on worker1 is failed")
    assert closed["result"].startswith("interrupted: the recovery's process ended mid-way (saving the evidence)")
    assert "seen now: DEGRADED" in closed["result"] and not record.open_incidents(cl.cfg.state_dir)
    assert len(record.recoveries(cl.cfg.state_dir)) == 1
    r = doit(["incidents"], Path(cl.cfg.state_dir).parent, STATE_DIR=cl.cfg.state_dir)
    assert "interrupted" in r.stdout and "DEGRADED" in r.stdout, r.stdout


# ---- the engine's caches before the ranks start ------------------------------------------------------------

class LocalNode(Node):
    """A node whose commands run here, in its own state dir (the rm the head sends is real)."""
    def run(self, argv, check=True, **kw):
        import subprocess
        from types import SimpleNamespace
        r = subprocess.run(argv, capture_output=True, text=True)
        return SimpleNamespace(code=r.returncode, stdout=r.stdout, stderr=r.stderr)


def test_a_librarys_cache_that_differs_between_the_ranks_is_cleared_everywhere_and_old_images_go(cl, monkeypatch,
                                                                                                  tmp_path):
    """Before the ranks start: Triton's cache on the head only is cleared on both nodes, said in one line;
    what both hold alike stays; another image's folder goes unless a kept release runs that image."""
    from types import SimpleNamespace
    from dsv41 import names
    from dsv41.head.core import caches, release_history
    from dsv41.node.facts import cache_report
    from test_facts import cache_tree
    nodes = [LocalNode("head"), LocalNode("worker1")]
    monkeypatch.setattr(type(cl), "nodes", property(lambda self: nodes), raising=False)
    monkeypatch.setattr(cl, "paths", lambda n: SimpleNamespace(state_dir=str(tmp_path / n.name)))
    kept = "aaaaaaaaaaaa"                          # the image of a release the history keeps
    monkeypatch.setattr(release_history, "load_all", lambda sd: [SimpleNamespace(image=f"r@sha256:{kept}{'0' * 52}")])
    key = names.cache_key(cl.cfg.image)
    for n in ("head", "worker1"):
        cache_tree(tmp_path / n / "cache", {f"{key}/vllm/torch_compile_cache/f/rank_{n == 'worker1':d}_0/a.py": 9,
                                            f"{key}/flashinfer/.cache/flashinfer/op.so": 5, f"{kept}/triton/x": 1,
                                            "bbbbbbbbbbbb/triton/y": 1, "b12x/from-an-earlier-version.o": 1})
    cache_tree(tmp_path / "head/cache", {f"{key}/triton/k.cubin": 2000})

    def look():
        return {n: parse({"caches": cache_report(str(tmp_path / n / "cache"), key)}) for n in ("head", "worker1")}
    lines = caches.tidy(cl, look(), log=lambda m: None)
    assert lines[0] == ("caches differ between the ranks: Triton (head 1 files, 0.0 MB, worker1 0 files, 0.0 MB): "
                        "cleared on every node before the ranks start, so every rank compiles them again, in step "
                        "(a cold start for those)")
    assert lines[1:] == [f"caches on {n}: removed b12x, bbbbbbbbbbbb: no kept release runs that image"
                         for n in ("head", "worker1")]
    for n in ("head", "worker1"):
        assert sorted(os.listdir(tmp_path / n / "cache")) == sorted([key, kept])
        assert not (tmp_path / n / "cache" / key / "triton").exists()
        assert (tmp_path / n / "cache" / key / "flashinfer/.cache/flashinfer/op.so").exists()
        assert os.listdir(tmp_path / n / "cache" / key / "vllm/torch_compile_cache/f")
    assert caches.tidy(cl, look(), log=lambda m: None) == []           # the same now: nothing to say
    cache_tree(tmp_path / "head/cache", {f"{key}/torchinductor/rank0-name.py": 7})     # both hold it, keyed per rank
    cache_tree(tmp_path / "worker1/cache", {f"{key}/torchinductor/rank1-name.py": 7})
    assert caches.tidy(cl, look(), log=lambda m: None) == []
    assert (tmp_path / "head/cache" / key / "torchinductor/rank0-name.py").exists()
    worker_silent = {**look(), "worker1": parse({})}
    assert caches.tidy(cl, worker_silent, log=lambda m: None) == [
        "caches: not compared before the start: worker1 did not report them"]
