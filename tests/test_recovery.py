"""head/core/recovery.py and what launch and `doit incidents` make of it: NEEDS_REBOOT refused until the
memory is back or --force, which units make a broken cluster (evidence first), and `doit incidents` for
real on saved folders. The nodes' answers are probe states here; tests/lab/test_self_healing.py does it on
real nodes."""
import pytest

from dsv41.errors import UserError
from dsv41.head import launch
from dsv41.head.config import load_config
from dsv41.head.core import incidents, recovery
from dsv41.head.core.cluster import Cluster
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
    recovery.set_needs_reboot(cl.cfg.state_dir, "worker1: MemAvailable ... (recorded)")
    with pytest.raises(UserError, match=r"^NEEDS_REBOOT: worker1: MemAvailable 80.0 GiB is 20.0 GiB below its "
                                        r"baseline 100.0 GiB .*reboot worker1, or `doit launch --force`"):
        launch.refuse_if_needs_reboot(cl, states(80), force=False)
    assert recovery.needs_reboot(cl.cfg.state_dir)
    launch.refuse_if_needs_reboot(cl, states(93), force=False)           # 7 GiB short: within MEM_RETURN_GIB
    assert recovery.needs_reboot(cl.cfg.state_dir) is None and "came back" in capsys.readouterr().out
    recovery.set_needs_reboot(cl.cfg.state_dir, "worker1: short")
    launch.refuse_if_needs_reboot(cl, states(80), force=True)
    assert recovery.needs_reboot(cl.cfg.state_dir) is None and "--force" in capsys.readouterr().out


def test_a_node_without_a_baseline_is_not_checked_with_one_warning(cl):
    check = recovery.check_now(cl.cfg, states(10, base=False))
    assert check.verdict == "OK" and len(check.warnings) == 2 and "no MemAvailable baseline" in check.warnings[0]


def test_what_launch_takes_for_a_broken_cluster(cl):
    assert launch.broken(cl, states(head="active", worker="active")) is None
    assert launch.broken(cl, states()) is None                          # all stopped cleanly: a plain start
    verdict, what, fault_at = launch.broken(cl, states(head="active", worker="failed", worker_result="exit-code"))
    assert verdict == "DEGRADED" and what == "dsv41-r1.service on worker1 is failed (exit-code)" and fault_at == 1500.0


def test_launch_takes_a_silent_engine_for_wedged_only_once_it_generated_since_it_started(tmp_path):
    """Every rank up and no token (nothing listens on the API's port here): wedged when a readiness wait saw
    this start of rank 0 generate (ready.json newer than its start), a start-up still going on otherwise."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cl = Cluster(load_config({"WORKER": "u@w", "STATE_DIR": str(tmp_path), "HEAD_IP": "127.0.0.1",
                              "PORT": str(port), "WATCHDOG_PROBE_S": "5"}))
    (tmp_path / "api_key").write_text("sk-test-0123456789abcdef\n")
    up = states(head="active", worker="active")                         # rank 0 started at 1000
    assert launch.wedged(cl, up) is None                            # never ready: the wait covers it
    (tmp_path / "ready.json").write_text('{"time": 900}')
    assert launch.wedged(cl, up) is None                            # ready before this start: a start-up
    (tmp_path / "ready.json").write_text('{"time": 1100}')
    verdict, what, _ = launch.wedged(cl, up)
    assert verdict == "WEDGED" and "no token came back within 5 s (WATCHDOG_PROBE_S)" in what
    assert launch.wedged(cl, states(head="active", worker="failed")) is None   # not all up: broken() has it


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
    assert r.returncode != 0 and "doit incidents show [N]" in r.stdout + r.stderr
