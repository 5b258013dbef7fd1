"""The chaos soak's pure parts (bench/chaos): the seeded schedule, availability and percentiles, the
checks on recorded data, and the report's shape. The soak itself runs in the lab (tests/lab/test_lab_chaos.py)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

from chaos import checks, faults, report  # noqa: E402
from chaos.load import DEADLINE, ERROR, FAILED_FAST, OK  # noqa: E402

KINDS = list(faults.CATALOGUE)


def req(started, ended, outcome=OK, tokens=20):
    return {"started": started, "ended": ended, "outcome": outcome, "tokens": tokens, "error": None}


def fault(kind, at, healed_after=None, node="worker1"):
    return {"kind": kind, "node": node, "at": at, "injected_at": 1000.0 + at, "proved_at": 1000.0 + at + 1,
            "healed_at": None if healed_after is None else 1000.0 + at + healed_after}


def test_the_catalogue_has_every_fault_the_soak_promises():
    assert KINDS == ["kill-rank", "stop-engine", "stop-worker", "stop-api", "kill-guard", "stop-sshd",
                     "link-down", "restart-docker", "reboot"]


def test_schedule_starts_with_the_whole_catalogue_in_a_seeded_order():
    a = faults.plan(7, KINDS, (60, 180), minutes=30)
    assert a == faults.plan(7, KINDS, (60, 180), minutes=30)              # same seed, same soak
    assert a != faults.plan(8, KINDS, (60, 180), minutes=30)
    assert sorted(k for _, k in a[:len(KINDS)]) == sorted(KINDS)          # every kind before any repeat
    times = [t for t, _ in a]
    gaps = [b - a_ for a_, b in zip([0.0] + times, times)]
    assert all(60 - 0.1 <= g <= 180 + 0.1 for g in gaps) and times[-1] <= 30 * 60
    assert len(a) >= 10 and set(k for _, k in a[len(KINDS):]) <= set(KINDS)


def test_once_is_the_catalogue_exactly_once_whatever_the_minutes():
    a = faults.plan(1, KINDS, (15, 30), once=True)
    assert sorted(k for _, k in a) == sorted(KINDS) and 8 * 15 <= a[-1][0] <= 8 * 30


def test_percentile_interpolates_between_ranks():
    assert report.percentile([], 50) is None and report.percentile([None, 4], 50) == 4
    assert report.percentile([1, 2, 3, 4], 50) == 2.5
    assert report.percentile([10, 20, 30, 40, 50], 95) == pytest.approx(48)
    assert report.percentile([3, 1, 2], 100) == 3


def test_availability_is_the_share_of_seconds_a_request_answered():
    t0 = 0.0
    records = [req(0.0, 0.5), req(1.0, 1.5), req(2.0, 4.5, DEADLINE), req(5.0, 5.2, FAILED_FAST),
               req(6.0, 6.5), req(6.1, 6.2, ERROR)]                      # second 6: one ok, one failed
    # bins 0,1,6 answered; 2,3,4,5 not; 7-9 no request at all (left out)
    assert report.availability(records, t0, 10.0) == pytest.approx(3 / 7)
    assert report.availability([], 0, 10) is None


def test_requests_per_fault_count_failed_and_timed_out_separately():
    records = [req(0, 1), req(0, 2, FAILED_FAST), req(0, 3, ERROR), req(0, 4, DEADLINE), req(0, 9, DEADLINE)]
    assert report.requests_in(records, 1.5, 5) == (2, 1)


def test_heal_deadlines_extend_over_a_burst_of_faults():
    fs = [fault("kill-rank", 0, healed_after=50), fault("reboot", 20, healed_after=40), fault("kill-guard", 100, 2)]
    # the first healed after the second came: the burst shares the second's deadline
    assert checks.heal_deadlines(fs, 45) == [1000 + 21 + 45, 1000 + 21 + 45, 1000 + 101 + 45]
    assert checks.check_healed(fs, 45) == []
    assert checks.check_healed(fs, 30) == [
        "reboot on worker1 at +20 s: healed 39 s after the fault was done, past its SLO (30 s)"]


def test_a_fault_left_unhealed_is_named_with_what_was_left():
    fs = [fault("kill-guard", 0, 1), fault("kill-rank", 30)]
    fs[1]["left"] = "doit status: DEGRADED; watchdog active: DEGRADED (...); GAVE UP: ..."
    [p] = checks.check_healed(fs, 60)
    assert p.startswith("kill-rank on worker1 at +30 s: never healed (SLO 60 s); left: doit status: DEGRADED")


def test_at_most_one_recovery_per_fault():
    fs = [fault("kill-rank", 0, 20), fault("stop-engine", 100, 30)]
    incs = [{"started": 1005, "ended": 1015, "verdict": "DEGRADED", "action": "restart", "result": "READY"},
            {"started": 1110, "ended": 1120, "verdict": "WEDGED", "action": "restart", "result": "failed: x"},
            {"started": 1122, "ended": 1130, "verdict": "DEAD", "action": "restart", "result": "READY"}]
    assert [len(v) for v in checks.attribute(fs, incs).values()] == [1, 2]
    [p] = checks.check_recoveries(fs, incs)
    assert p.startswith("fault 2 (stop-engine on worker1 at +100 s): 2 recoveries")
    assert checks.check_recoveries(fs, incs[:2]) == []
    # a stopped engine, then a killed guard that healed at once: the engine's recovery is the engine's
    fs = [fault("stop-engine", 0, 260), fault("kill-guard", 150, 6)]
    incs = [{"started": 1200, "ended": 1255, "verdict": "WEDGED", "action": "restart", "result": "READY"}]
    assert [len(v) for v in checks.attribute(fs, incs).values()] == [1, 0]
    # a stopped engine, then a worker's sshd stopped while the stall was being confirmed: the incident's
    # fault_at (the last progress seen) names the engine
    fs = [fault("stop-engine", 0, 275), fault("stop-sshd", 185, 90)]
    incs = [{"started": 1200, "ended": 1275, "verdict": "WEDGED", "action": "restart", "result": "READY",
             "fault_at": 1005}]
    assert [len(v) for v in checks.attribute(fs, incs).values()] == [1, 0]


def proc(pid, ppid, argv, state="S", comm=None):
    return {"pid": pid, "ppid": ppid, "state": state, "argv": argv, "comm": comm or argv[0].rsplit("/", 1)[-1]}


def healthy_node(rank=1):
    return {"containers": [{"id": "c1", "name": f"dsv41-r{rank}", "state": "running", "pid": 50}],
            "procs": [proc(1, 0, ["/sbin/init"]), proc(40, 1, ["docker", "run", "--rm", "--name", f"dsv41-r{rank}"]),
                      proc(50, 45, ["/sbin/docker-init", "--", "python3"]),
                      proc(51, 50, ["python3", "/usr/local/bin/lab-engine", "--headless"])],
            "mem_available": 20 * 2**30}


def test_orphan_check_passes_one_rank_container_and_its_processes():
    assert checks.check_orphans({"head": healthy_node(0), "worker1": healthy_node(1)}, {"head": 0, "worker1": 1}) == []
    head = healthy_node(0)      # the lab's Hub stand-in serves the real engine's model: not an engine process
    head["procs"].append(proc(70, 1, ["/opt/dsv41-venv/bin/python", "/repo/tests/lab/hub.py", "/srv/cache/vllm/hub"]))
    assert checks.check_orphans({"head": head}, {"head": 0}) == []


def test_orphan_check_names_every_leftover():
    n = healthy_node(1)
    n["containers"].append({"id": "c0", "name": "dsv41-r1-old", "state": "exited", "pid": 0})
    n["procs"] += [proc(60, 1, ["python3", "/usr/local/bin/lab-engine", "--headless"]),   # outside the container
                   proc(61, 1, ["docker", "run", "--name", "dsv41-r1"]),                  # a second client
                   proc(62, 1, ["rsync", "--server"]),
                   proc(63, 1, ["/usr/sbin/sshd", "-D"], state="T", comm="sshd")]
    problems = checks.check_orphans({"worker1": n, "head": {"error": "timed out"}}, {"worker1": 1, "head": 0})
    text = "\n".join(problems)
    assert "orphaned container dsv41-r1-old (exited)" in text
    assert "pid 60 python3 /usr/local/bin/lab-engine --headless: an engine process outside the rank container" in text
    assert "2 `docker run` clients, expected 1" in text and "pid 62 rsync --server: an rsync left running" in text
    assert "pid 63 /usr/sbin/sshd -D: left stopped (state T)" in text and "head: no answer (timed out)" in text
    gone = healthy_node(1)
    gone["containers"], gone["procs"] = [], gone["procs"][:1]
    assert checks.check_orphans({"worker1": gone}, {"worker1": 1}) == [
        "worker1: 0 running dsv41-r1 containers, expected 1", "worker1: 0 `docker run` clients, expected 1"]


def test_memory_check_against_the_baseline():
    base = {"head": 20 * 2**30, "worker1": 20 * 2**30}
    snaps = {"head": {"mem_available": 13 * 2**30}, "worker1": {"mem_available": 11 * 2**30}}
    assert checks.check_memory(base, snaps, 8) == [
        "worker1: MemAvailable 11.0 GiB, 9.0 GiB below its baseline 20.0 GiB (MEM_RETURN_GIB 8)"]


def test_requests_must_end_by_their_deadline():
    records = [req(0, 30), req(0, 34.9, DEADLINE), req(0, 40, DEADLINE), {**req(5, None), "outcome": "hung"}]
    assert checks.check_requests(records, 30) == ["a request started at 0 ran 40 s, past its 30 s deadline",
                                                  "a request started at 5 never ended"]


def test_report_shape(tmp_path):
    fs = [fault("kill-rank", 10, 25), fault("kill-guard", 40, 1)]
    for f in fs:
        f.update(proof="p", detection_s=None, recovery_s=f["healed_at"] - f["injected_at"], incidents=[])
    fs[0]["detection_s"] = 8.0
    records = [req(1000 + t, 1000 + t + 0.5, OK if not 12 <= t < 35 else ERROR) for t in range(0, 60)]
    incs = [{"started": 1018, "ended": 1030, "verdict": "DEGRADED", "action": "restart", "result": "READY", "took_s": 12}]
    run = {"started": 1000.0, "ended": 1060.0, "minutes_run": 1.0, "seed": 3, "engine": "standin", "deadline_s": 30,
           "watchdog": {"WATCHDOG": "1"}, "startup_s": 9.0, "detection_bound_s": 18, "slo_s": 27}
    rep = report.build(run, records, fs, incs, [])
    assert rep["schema"] == "dsv41.chaos/1" and rep["ok"] and rep["restarts"] == 1
    assert rep["availability"] == pytest.approx(37 / 60) and rep["requests"]["error status"] == 23
    assert rep["faults"][0]["requests_failed"] == 23 and rep["faults"][1]["requests_failed"] == 0
    assert rep["per_kind"]["kill-rank"] == {"n": 1, "detection_p50_s": 8.0, "detection_p95_s": 8.0,
                                            "recovery_p50_s": 25.0, "recovery_p95_s": 25.0, "unhealed": 0}
    for f in rep["faults"]:
        assert {"kind", "at", "node", "proof", "detection_s", "recovery_s", "healed_at"} <= set(f)
    out = report.write(rep, records, tmp_path / "r")
    assert json.loads((out / "chaos.json").read_text())["faults"][0]["kind"] == "kill-rank"
    md = (out / "chaos.md").read_text()
    assert "availability: 61.7 %" in md and "| kill-rank | 1 | 8 s | 8 s | 25 s | 25 s | 0 |" in md
    assert (out / "chaos.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rep = report.build(run, records, fs, incs, ["kill-rank on worker1 at +10 s: never healed"])
    assert not rep["ok"] and "## Failed checks" in report.markdown(rep)
    run["budget_test"] = [{"gave_up_at": 1030, "reason": "DEGRADED again after 1 recoveries", "launch_rc": 0,
                           "launch_s": 8.2, "launch_said": ["watchdog: cleared its give-up; the watchdog acts again"]}]
    assert ("- the watchdog gave up (DEGRADED again after 1 recoveries); `doit launch` exited 0 after 8 s: "
            "watchdog: cleared its give-up; the watchdog acts again") in report.markdown(report.build(run, records, fs, incs, []))


def test_the_fault_table_prints_each_fault_against_the_bound_and_the_slo():
    sys.path.insert(0, str(BENCH))
    import bench_faults
    fs = [fault("stop-engine", 10, 150), fault("kill-guard", 330)]
    fs[0].update(detection_s=90.0, recovery_s=150.0, requests_failed=0, requests_timed_out=4,
                 incidents=["WEDGED restart: READY"])
    fs[1].update(detection_s=None, recovery_s=1.0, requests_failed=0, requests_timed_out=0, incidents=[])
    rep = {"engine": "vllm", "detection_bound_s": 195, "slo_s": 260, "startup_s": 65, "faults": fs}
    lines = bench_faults.table(rep).splitlines()
    assert "detection bound 195 s, SLO 260 s" in lines[0]
    assert lines[2].split()[:7] == ["stop-engine", "worker1", "90", "s", "0.46", "150", "s"]
    assert "0.58  0 failed, 4 cut; WEDGED restart: READY" in lines[2]
    assert lines[3].split()[2:4] == ["-", "-"] and lines[3].endswith("none")
    assert set(bench_faults.FAULTS.split(",")) <= set(KINDS)


@pytest.mark.parametrize("args, said", [
    (["--every", "30"], "--every: '30': expected MIN-MAX seconds, e.g. 60-180"),
    (["--every", "90-60"], "--every: '90-60': expected 0 < MIN <= MAX"),
    (["--faults", "kill-rank,melt"], "--faults 'kill-rank,melt': unknown kind(s) melt"),
    (["--max-recoveries", "-1"], "--max-recoveries -1: expected 0 or more"),
    (["--minutes", "0"], "--minutes: '0': expected a positive number"),
])
def test_bad_arguments_are_one_line_and_change_nothing(args, said):
    r = subprocess.run([sys.executable, str(BENCH / "bench_chaos.py"), *args], capture_output=True, text=True)
    assert r.returncode == 2 and said in r.stderr.strip().splitlines()[-1], r.stderr


def test_watchdog_settings_for_the_soak():
    sys.path.insert(0, str(BENCH))
    import bench_chaos
    a = bench_chaos.parse(["--every", "15-30", "--watchdog", "fast", "--seed", "1"])
    env = bench_chaos.watchdog_env(a)
    assert env["WATCHDOG"] == "1" and env["WATCHDOG_WINDOW_MIN"] == "1" and int(env["WATCHDOG_MAX_RECOVERIES"]) >= 5
    assert bench_chaos.detection_bound(env) == 12 + 4 + 2 * 2 + 5          # stall + probe + two intervals + a look
    assert bench_chaos.watchdog_env(bench_chaos.parse(["--max-recoveries", "0"]))["WATCHDOG_MAX_RECOVERIES"] == "0"
    budget = bench_chaos.parse(["--budget-test"])
    assert bench_chaos.watchdog_env(budget)["WATCHDOG_MAX_RECOVERIES"] == "1" and budget.kinds == ["kill-rank"]
    assert bench_chaos.parse([]).kinds == KINDS
    assert bench_chaos.detection_bound({}) == 30 + 30 + 2 * 10 + 5          # the schema's defaults


@pytest.mark.parametrize("args", [["--every", "1-3", "--watchdog", "fast"], ["--every", "30-45"],
                                  ["--every", "0.1-0.2"]], ids=["short soak", "fault table", "tightest"])
def test_the_soaks_watchdog_settings_are_ones_launch_accepts(args):
    """Faults seconds apart make a budget of hundreds: it stays within WATCHDOG_MAX_RECOVERIES's range, or
    the soak's first launch is refused as bad input and no fault is ever injected."""
    import bench_chaos
    from dsv41.settings.layers import load_config
    env = bench_chaos.watchdog_env(bench_chaos.parse(args))
    cfg = load_config({"WORKER": "u@w", **env})
    assert 1 <= cfg.watchdog_max_recoveries <= bench_chaos.MAX_RECOVERIES
