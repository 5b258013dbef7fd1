"""The watchdog's judgement as a pure function: a sequence of observations (what the nodes' probes, the
API's /health, /metrics and the token probe showed, interval after interval) in, verdicts out. The
lab tests (tests/lab/test_self_healing.py) show the same verdicts acted on against real systemd, Docker and
the stand-in engine."""
import dataclasses

import pytest

from dsv41.client import metrics
from dsv41.errors import UserError
from dsv41.settings.layers import load_config
from dsv41.head.core import record
from dsv41.head.core.engine import for_config
from dsv41.head.core.state import parse, unreachable
from dsv41.head.core.health import (BUSY, DEAD, DEGRADED, HEALTHY, NO_TOKEN, STARTING, STOPPED, SUSPECT, TOKEN,
                                   TRIPPED, UNKNOWN, WEDGED, Memory, Observation, judge, wants_probe)

CFG = load_config({"WORKER": "u@w", "WATCHDOG_STALL_S": "600", "WATCHDOG_PROBE_S": "60", "START_TIMEOUT_MIN": "45"})
RECIPE = for_config(CFG)
START = 10_000.0          # when the ranks started (each node's clock)


def node(rank, state="active", since=START, result="success", clock=0.0, tripped=None):
    unit = {"installed": True, "ActiveState": state, "SubState": "running" if state == "active" else "dead",
            "Result": result, "ActiveEnterTimestamp": f"@{since + clock}", "NRestarts": "0"}
    return {"units": {f"dsv41-r{rank}.service": unit}, "tripped": tripped, "time": None, "_clock": clock}


def snapshot(running=0, waiting=0, prompt=100, generation=50, kv=0.0):
    text = (f'vllm:num_requests_running{{engine="0"}} {running}\nvllm:num_requests_waiting{{engine="0"}} {waiting}\n'
            f'vllm:prompt_tokens_total{{engine="0"}} {prompt}\nvllm:generation_tokens_total{{engine="0"}} {generation}\n'
            f'vllm:kv_cache_usage_perc{{engine="0"}} {kv}\n')
    return metrics.parse(text)


def look(t, head=None, worker=None, health=200, snap=None, probe=TOKEN):
    """An observation at t seconds after the ranks started."""
    nodes = {"head": head or node(0), "worker1": worker or node(1)}
    for f in nodes.values():
        if "error" not in f:
            f["time"] = START + t + f.pop("_clock", 0.0)
    nodes = {n: unreachable(f["error"]) if "error" in f else parse(f) for n, f in nodes.items()}
    snap = snap if snap is not None else snapshot()
    return Observation(START + t, nodes, health, metrics.Snapshot(START + t, snap.samples), probe)


def run(*observations, mem=None):
    mem = mem or Memory()
    return [judge(CFG, o, mem, RECIPE)[0] for o in observations]


def test_ready_and_idle_is_healthy():
    assert run(look(600)) == [HEALTHY]


def test_work_with_counters_moving_is_busy_for_as_long_as_it_flows():
    # a 175k-token prefill followed by decoding: prompt tokens, then generation tokens keep moving
    obs = [look(600 + 15 * i, snap=snapshot(running=1, prompt=100 + 1000 * i, generation=50 + i), probe=None)
           for i in range(100)]
    assert set(run(look(590), *obs)) == {HEALTHY, BUSY}


def test_work_with_no_signal_moving_for_the_stall_time_is_wedged_once_the_probe_gets_no_token():
    stuck = snapshot(running=1, prompt=500, generation=80)
    mem = Memory()
    verdicts, probes_wanted = [], []
    for i in range(0, 45):
        o = look(600 + 15 * i, snap=stuck, probe=None)
        o.probe = NO_TOKEN if wants_probe(CFG, mem, o.metrics, RECIPE) else None
        probes_wanted.append(o.probe is not None)
        verdicts.append(judge(CFG, o, mem, RECIPE)[0])
    first_wedge = verdicts.index(WEDGED)
    assert set(verdicts[:first_wedge]) == {BUSY} and 15 * first_wedge >= 600
    assert first_wedge <= 600 // 15 + 1
    assert not any(probes_wanted[:first_wedge]) and probes_wanted[first_wedge]     # asked only once stalled
    assert mem.fault_at == START + 600            # the fault began at the last progress seen, not when seen


def test_a_stall_whose_probe_gets_a_token_is_busy_however_long_it_lasts():
    stuck = snapshot(running=1, prompt=500, generation=80)
    mem = Memory()
    got = [judge(CFG, look(600 + 15 * i, snap=stuck, probe=TOKEN), mem, RECIPE) for i in range(200)]
    assert {v for v, _ in got} == {BUSY} and "the probe got a token" in got[-1][1] and mem.fault_at is None


def test_kv_cache_use_growing_is_progress_during_a_long_prefill():
    mem = Memory()
    looks = [look(600 + 15 * i, snap=snapshot(running=1, kv=0.01 * i), probe=NO_TOKEN) for i in range(100)]
    assert {judge(CFG, o, mem, RECIPE)[0] for o in looks} == {BUSY}


def test_a_stall_without_a_probe_answer_waits_for_one():
    stuck = snapshot(running=1)
    verdicts = run(*[look(600 + 15 * i, snap=stuck, probe=None) for i in range(60)])
    assert set(verdicts) == {BUSY}


def test_an_idle_probe_without_a_token_is_wedged_but_not_during_start_up():
    assert run(look(600), look(615, probe=NO_TOKEN)) == [HEALTHY, WEDGED]
    assert run(look(30, probe=NO_TOKEN)) == [STARTING]            # first boot: no token yet is normal
    assert run(look(30), look(45, probe=NO_TOKEN)) == [HEALTHY, WEDGED]   # once ready, it counts


def test_an_api_that_does_not_answer_or_answers_5xx_two_intervals_in_a_row_is_dead():
    assert run(look(600), look(615, health=None, snap=None, probe=None),
               look(630, health=None, snap=None, probe=None)) == [HEALTHY, SUSPECT, DEAD]
    assert run(look(600), look(615, probe="error 500"), look(630, probe="error 500")) == [HEALTHY, SUSPECT, DEAD]
    assert run(look(600), look(615, probe="error 500"), look(630), look(645, probe="error 500")) == [
        HEALTHY, SUSPECT, HEALTHY, SUSPECT]
    # never ready since the ranks started (the watchdog itself just started): a start-up, not a death
    assert run(look(600, probe="error 500"), look(615, probe="error 500")) == [STARTING, STARTING]


def test_a_slow_first_start_is_starting_until_its_timeout():
    quiet = dict(health=None, snap=None, probe=None)
    assert run(look(60, **quiet), look(1800, **quiet), look(2699, **quiet)) == [STARTING] * 3
    assert run(look(2701, **quiet), look(2716, **quiet)) == [SUSPECT, DEAD]


def test_a_rank_down_or_a_worker_that_restarted_alone_is_degraded():
    assert run(look(600, worker=node(1, state="failed", result="exit-code"))) == [DEGRADED]
    assert run(look(600, head=node(0, state="inactive"), worker=node(1, state="activating"))) == [DEGRADED]
    assert run(look(600, worker=node(1, since=START + 300))) == [DEGRADED]          # restarted after the head
    assert run(look(600, worker=node(1, clock=30))) == [HEALTHY]      # the same start, a clock 30 s ahead


def test_every_rank_stopped_cleanly_is_left_alone():
    assert run(look(600, head=node(0, state="inactive"), worker=node(1, state="inactive"))) == [STOPPED]


def test_every_rank_exiting_by_itself_while_the_watchdog_ran_is_dead():
    """A worker rebooted or its Docker restarted: every rank ends inactive with success, as after a stop;
    but `doit stop` stops the watchdog first, so a running watchdog that saw them up takes it for dead."""
    stopped = dict(head=node(0, state="inactive"), worker=node(1, state="inactive"))
    verdicts = run(look(600), look(615, **stopped))
    assert verdicts == [HEALTHY, DEAD]


def test_a_node_that_shuts_down_is_waited_for_not_repaired():
    """A worker rebooting in order stops its rank while its sshd still answers: not DEGRADED (a recovery
    would fail on the node going away) but UNKNOWN until it is back."""
    going = {**node(1, state="inactive"), "system": "stopping"}
    verdict, why = judge(CFG, look(600, worker=going), Memory(), RECIPE)
    assert verdict == UNKNOWN and why == "worker1 is shutting down"
    assert run(look(600, worker={**node(1, state="inactive"), "system": "running"})) == [DEGRADED]


def test_a_readiness_wait_that_saw_a_token_ends_the_start_up():
    """launch's wait saw this start of rank 0 generate (ready.json): a silence right after it is a fault,
    not a start-up that may last START_TIMEOUT_MIN."""
    quiet = look(30, probe=NO_TOKEN)
    assert run(quiet) == [STARTING]
    quiet.ready_at = START + 20
    assert run(quiet) == [WEDGED]
    quiet.ready_at = START - 20                 # a token seen before this start: still starting
    assert run(quiet) == [STARTING]


def test_a_tripped_guard_or_a_node_without_fresh_facts_is_never_acted_on():
    assert run(look(600, worker=node(1, state="inactive", tripped={"time": "t"}))) == [TRIPPED]
    verdict, why = judge(CFG, look(600, worker={"error": "worker1 did not answer within 10 s"}), Memory(), RECIPE)
    assert verdict == UNKNOWN and "worker1 did not answer" in why


@pytest.mark.parametrize("verdict", [HEALTHY, BUSY, STARTING, STOPPED, SUSPECT, TRIPPED, UNKNOWN])
def test_only_degraded_dead_and_wedged_call_for_a_recovery(verdict):
    from dsv41.head.core.health import ACT_ON
    assert verdict not in ACT_ON and set(ACT_ON) == {DEGRADED, DEAD, WEDGED}


def test_the_watchdog_runs_on_what_launch_resolved(tmp_path, monkeypatch):
    """watchdog.json holds the resolved settings (no secret); the watchdog reads only that file, so
    neither its environment nor a changed conf/ changes what it does until `doit launch` rewrites it."""
    from dsv41.head import watchdog
    from dsv41.settings.layers import load_config
    from dsv41.head.core.desired import watchdog_settings
    cfg = load_config({"WORKER": "u@10.0.0.2", "PORT": "8123", "WATCHDOG_PROBE_S": "7", "HF_TOKEN": "hf_secret",
                       "STATE_DIR": str(tmp_path)})
    text = watchdog_settings(cfg)
    assert "hf_secret" not in text
    (tmp_path / "watchdog.json").write_text(text)
    monkeypatch.setenv("PORT", "9")
    monkeypatch.setenv("DSV41_PROFILE", "no-such-profile")
    got = watchdog.load_settings(str(tmp_path))
    assert (got.port, got.watchdog_probe_s, got.workers[0].target, got.hf_token) == (8123, 7, "u@10.0.0.2", "")
    (tmp_path / "watchdog.json").write_text('{"env": {"PORT": "8123"}}\n')       # an older launch's file
    with pytest.raises(UserError, match="run `doit launch`"):
        watchdog.load_settings(str(tmp_path))


def test_after_a_rollback_to_a_release_recorded_before_the_gateway_the_watchdog_judges_it_without_one(tmp_path):
    """A release recorded before the gateway existed has no "gateway" in its settings, and `doit rollback`
    installs its watchdog.json as recorded: that release ran rank 0 on PORT, so the watchdog must judge the
    engine there (GATEWAY off), not at ENGINE_PORT behind a gateway that does not run."""
    import json
    from dsv41.head import watchdog
    from dsv41.head.core.desired import watchdog_settings
    from dsv41.settings.layers import load_config
    cfg = load_config({"WORKER": "u@10.0.0.2", "GATEWAY": "0", "STATE_DIR": str(tmp_path)})
    doc = json.loads(watchdog_settings(cfg))
    for key in ("gateway", "engine_port", "gateway_timeout_s", "key_rate_per_min", "drain_s"):
        doc["config"].pop(key, None)                # as a version before the gateway wrote it
    (tmp_path / "watchdog.json").write_text(json.dumps(doc))
    got = watchdog.load_settings(str(tmp_path))
    assert got.gateway is False and got.engine_url == f"http://127.0.0.1:{got.port}/v1"


# ---- the Watchdog itself, on a fake clock: backoff, memory that did not come back, its metrics file ----
# (what cannot run here is faked: the nodes' looks and the restart itself; the lab tests do them for real)

class Clock:
    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t


def watchdog_on(tmp_path, monkeypatch, looks, restart, **settings):
    """A Watchdog whose looks come from looks(t) and whose recovery is the real core.recovery.restart with
    the real record, but no node: the ranks' start is restart(clock), the memory is what looks() show."""
    from dsv41.head import watchdog
    from dsv41.head.core import ranks, recovery
    from dsv41.head.core.health import memory_check
    cfg = load_config({"WORKER": "u@w", "STATE_DIR": str(tmp_path), "METRICS_DIR": str(tmp_path / "prom"),
                       "WATCHDOG_BACKOFF_S": "30", "WATCHDOG_MAX_RECOVERIES": "3", "WATCHDOG_WINDOW_MIN": "60",
                       **settings})
    clock = Clock(START)

    def look(cl, probe=None, mem=None, **how):
        o = looks(clock.t - START)
        return dataclasses.replace(o, record=record.view(str(tmp_path), clock.t))
    monkeypatch.setattr(watchdog.observe, "look", look)
    monkeypatch.setattr(ranks, "kill_ranks", lambda cl: None)
    monkeypatch.setattr(ranks, "stop_ranks", lambda cl: None)
    monkeypatch.setattr(ranks, "start_ranks", lambda cl: restart(clock))
    monkeypatch.setattr(recovery, "record_baselines", lambda cl, states, log=print: None)
    monkeypatch.setattr(recovery, "wait_memory", lambda cl, log: memory_check(cfg, looks(clock.t - START).nodes))
    monkeypatch.setattr(recovery, "save_evidence", lambda *a, **k: None)
    monkeypatch.setattr(ranks, "wait_ready", lambda cl, within=None: None)
    lines = []
    w = watchdog.Watchdog(cfg, log=lines.append, clock=clock)
    w.lines = lines
    return w, clock


def status_of(tmp_path):
    import json
    return json.loads((tmp_path / "watchdog.status.json").read_text())


def test_a_start_no_readiness_wait_saw_is_marked_by_the_watchdogs_token_so_status_agrees(tmp_path, monkeypatch):
    """A watchdog killed mid-recovery leaves no readiness mark for the start it made: the next watchdog's idle
    probe gets a token (HEALTHY), and from then on `doit status`, which sends no probe, says so too instead of
    STARTING until START_TIMEOUT_MIN."""
    w, clock = watchdog_on(tmp_path, monkeypatch, lambda t: look(t), lambda clock: None)
    clock.t = START + 90
    as_status = dataclasses.replace(look(90, probe=None), ready_at=record.ready_at(str(tmp_path)))
    assert run(as_status) == [STARTING]                       # before: nothing saw this start generate
    assert w.look()[1].verdict == HEALTHY
    as_status = dataclasses.replace(look(90, probe=None), ready_at=record.ready_at(str(tmp_path)))
    assert START < as_status.ready_at <= START + 90 and run(as_status) == [HEALTHY]


def test_the_nth_recovery_waits_its_backoff_while_the_watchdog_keeps_looking(tmp_path, monkeypatch):
    starts = []

    def restart(clock):
        starts.append(clock.t - START)
        clock.t += 10                                      # a restart takes 10 s

    broken = lambda t: look(t, worker=node(1, state="failed", result="exit-code"))   # noqa: E731
    w, clock = watchdog_on(tmp_path, monkeypatch, broken, restart)
    published = []
    for t in range(0, 150, 15):
        clock.t = START + t
        w.step()
        published.append((status_of(tmp_path)["time"] - START, status_of(tmp_path)["verdict"]))
    # 1st at once; 2nd 30 s after the 1st ended (10 -> 40, seen at 45); 3rd 60 s after the 2nd (55 -> 115)
    assert starts == [0, 45, 120]
    assert record.gave_up(str(tmp_path)) and "3 recoveries" in record.gave_up(str(tmp_path))["reason"]   # the budget stays
    assert [v for _, v in published] == [DEGRADED] * len(published)
    waits = [t for t, _ in published if t not in (10, 55, 130)]
    assert {15, 30, 60, 75, 90, 105} <= set(waits)                           # published while it waited
    backoff_lines = [m for m in w.lines if "backing off" in m]
    assert len(backoff_lines) == 2 and "waits 30 s" in backoff_lines[0] and "waits 60 s" in backoff_lines[1]


def test_after_a_recovery_that_failed_every_rank_stopped_is_still_dead(tmp_path, monkeypatch):
    """A restart that failed half-way (the worker went away while it started the ranks) leaves every rank
    stopped; the watchdog ran them, so that is a fault to repair, not a deliberate stop."""
    starts = []

    def restart(clock):
        starts.append(clock.t - START)
        clock.t += 5
        if len(starts) == 1:
            raise UserError("cannot reach worker1")

    def looks(t):
        if not starts:
            return look(t, worker=node(1, state="failed", result="exit-code"))
        return look(t, head=node(0, state="inactive"), worker=node(1, state="inactive"))

    w, clock = watchdog_on(tmp_path, monkeypatch, looks, restart, WATCHDOG_BACKOFF_S="1")
    for t in (0, 15):
        clock.t = START + t
        w.step()
    assert starts == [0, 15] and any("RECOVERY FAILED" in m and "failed: cannot reach worker1" in m for m in w.lines)
    assert any(m.startswith("INCIDENT DEAD: every rank exited by itself") for m in w.lines)


def memory(avail_gib, base_gib=100):
    return {"mem_available_kib": int(avail_gib * 2**20), "mem_baseline_bytes": int(base_gib * 2**30)}


def test_a_node_whose_memory_did_not_come_back_gets_no_ranks_until_it_does(tmp_path, monkeypatch):
    from dsv41.head.core import recovery
    avail = {"worker1": 80}
    started = []

    def looks(t):
        o = look(t) if started else look(t, head=node(0, state="inactive"), worker=node(1, state="inactive"))
        for name, f in list(o.nodes.items()):
            m = memory(avail.get(name, 100))
            o.nodes[name] = type(f)(**{**f.__dict__, "mem_available_kib": m["mem_available_kib"],
                                       "mem_baseline_bytes": m["mem_baseline_bytes"]})
        return o

    w, clock = watchdog_on(tmp_path, monkeypatch, looks, lambda clock: started.append(clock.t))
    record.set_needs_reboot(str(tmp_path), "worker1: 20.0 GiB below its baseline")
    for t in (0, 15, 30):
        clock.t = START + t
        assert w.step() == "NEEDS_REBOOT"
    assert started == [] and "worker1" in status_of(tmp_path)["evidence"]
    assert "20.0 GiB below" in status_of(tmp_path)["evidence"]
    avail["worker1"] = 95                                     # within MEM_RETURN_GIB (8) of its baseline
    clock.t = START + 45
    w.step()
    assert started == [START + 45] and record.needs_reboot(str(tmp_path)) is None   # cleared as it starts
    [inc] = record.incidents(str(tmp_path))
    assert inc["action"] == "start" and record.recoveries(str(tmp_path)) == []        # not a restart of the budget
    clock.t = START + 60
    assert w.step() == HEALTHY


def test_a_stopped_watchdog_leaves_no_metrics_file(tmp_path):
    """The real service process: it publishes its textfile, and SIGTERM (systemctl stop) removes it."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from dsv41.head.core import watchdog_metrics
    from dsv41.head.core.desired import watchdog_settings
    cfg = load_config({"WORKER": "u@127.0.0.1", "SSH_OPTS": "-p 1", "SSH_TIMEOUT_S": "2", "PORT": "18997",
                       "STATE_DIR": str(tmp_path), "METRICS_DIR": str(tmp_path / "prom"), "WATCHDOG_PROBE_S": "2"})
    (tmp_path / "watchdog.json").write_text(watchdog_settings(cfg))
    prom = tmp_path / "prom" / watchdog_metrics.METRICS_FILE
    p = subprocess.Popen([sys.executable, "-m", "dsv41.head.watchdog", "--state-dir", str(tmp_path)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        end = time.monotonic() + 60
        while not prom.exists() and time.monotonic() < end and p.poll() is None:
            time.sleep(0.2)
        assert 'dsv41_watchdog_verdict{verdict="UNKNOWN"} 1.0' in prom.read_text()   # the worker is not there
    finally:
        p.send_signal(signal.SIGTERM)
        out = p.communicate(timeout=30)[0]
    assert p.returncode == 0 and not prom.exists() and "watchdog stopping" in out


def test_a_release_a_dead_launch_left_rolling_out_is_carried_on_by_the_watchdog_under_the_lock(tmp_path, monkeypatch):
    """A launch killed mid-rollout leaves its release "rolling out". While another process holds the run lock
    the watchdog waits; once the lock is free (its holder died) it takes the lock and carries the release
    on (core.rollout.carry_on, here recorded), and never heals it as a fault meanwhile."""
    import subprocess
    import sys
    from dsv41.head import watchdog
    from dsv41.head.core import releases as rel, runlock
    starts, carried = [], []
    broken = lambda t: look(t, worker=node(1, state="failed", result="exit-code"))   # noqa: E731
    w, clock = watchdog_on(tmp_path, monkeypatch, broken, lambda c: starts.append(c.t))
    monkeypatch.setattr(watchdog.rollout, "carry_on", lambda cfg, r, by: carried.append(
        (r.number, r.state, by, runlock.holder(str(tmp_path)))))
    unit = {"head": {"dsv41-r0.service": "x\n"}}
    from dsv41.settings.resolved import resolved
    fields = {"image": "i", "image_ids": {}, "checkpoint": {}, "settings": resolved(w.cfg), "node_versions": {},
              "units": unit, "files": {}, "secret_files": {}}
    rel.begin(str(tmp_path), fields, 10, carrier={"by": "doit launch", "pid": 1, "since": START})
    lock = str(tmp_path / runlock.LOCK)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], "
                               "os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'pid 7: launch');"
                               "print('held', flush=True); time.sleep(60)", lock], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        w.step()                                    # the launch lives: nothing carried on, nothing healed
        assert carried == [] and starts == [] and record.incidents(str(tmp_path)) == []
        assert any("not acting" in m and "holds the run lock (pid 7: launch)" in m for m in w.lines), w.lines
    finally:
        holder.kill()
        holder.wait()
    w.step()                                        # it died: the flock went with it
    assert carried == [(1, rel.ROLLING_OUT, "dsv41-watchdog", "pid %d: dsv41-watchdog: carrying release 1 on"
                        % __import__("os").getpid())]
    assert starts == [] and runlock.holder(str(tmp_path)) is None          # the lock is given back
    assert any("release 1 was left rolling out by doit launch, which ended: carrying it on" in m for m in w.lines)
    rel.finish(str(tmp_path), 1, rel.GOOD, "ready")
    w.step()                                        # final: the broken worker is a fault like any other
    assert len(starts) == 1 and len(carried) == 1