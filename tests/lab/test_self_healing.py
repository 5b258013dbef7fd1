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
        "WATCHDOG_MAX_RECOVERIES": "2", "WATCHDOG_WINDOW_MIN": "60", "WATCHDOG_BACKOFF_S": "2", "SSH_TIMEOUT_S": "5",
        "MEM_RETURN_S": "6"}


def incidents(lab):
    return lab.incidents(STATE)


def ready(lab):
    r = lab.doit("status --json", check=False)
    return r.returncode == 0 and json.loads(r.stdout)["state"] == "READY"


def journal(lab, since):
    """The watchdog's journal lines since a time (the lab's nodes share this machine's clock)."""
    return lab.on("head", f"journalctl -u dsv41-watchdog --no-pager -o cat --since=@{since:.0f}").stdout


def rank_start(lab, node, rank):
    return lab.units(node, [f"dsv41-r{rank}.service"])[f"dsv41-r{rank}.service"]["ActiveEnterTimestamp"]


@pytest.fixture(scope="module")
def put_back(lab, launched):
    """After the module: the stand-in on the defaults, the watchdog off, as the other modules expect."""
    yield
    lab.doit("clear-trip", check=False)
    lab.on("head", f"rm -f {STATE}/watchdog.gaveup")
    lab.doit("launch")


@pytest.fixture
def watched(lab, put_back):
    """The stand-in cluster launched with a fast watchdog and no incidents yet (whatever the test before left:
    a tripped guard, a watchdog that gave up, stopped ranks)."""
    lab.doit("clear-trip", check=False)
    lab.on("head", f"rm -f {STATE}/watchdog.gaveup {STATE}/needs-reboot.json")
    lab.doit("launch", FAST)
    lab.on("head", f"rm -rf {STATE}/incidents.jsonl {STATE}/incidents")      # once converged: nothing of before
    assert lab.units("head", ["dsv41-watchdog.service"])["dsv41-watchdog.service"]["ActiveState"] == "active"


@pytest.mark.soak           # per landing: the real engine's killed worker (test_vllm.py)
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


@pytest.mark.soak           # per landing: the real engine's stopped EngineCore (test_vllm.py)
def test_a_wedged_engine_is_detected_and_repaired(lab, watched):
    before = rank_start(lab, "head", 0)
    lab.on("head", "docker kill --signal USR1 dsv41-r0")            # the stand-in stops making tokens
    [inc] = wait_for("a recovery from the wedge", lambda: [i for i in incidents(lab) if i["result"] == "READY"])
    assert inc["verdict"] == "WEDGED" and "no token" in inc["evidence"]
    assert rank_start(lab, "head", 0) != before and ready(lab)


def test_a_long_request_with_tokens_flowing_is_never_a_wedge(lab, watched):
    before, t0 = rank_start(lab, "head", 0), time.time()
    key = lab.on("head", f"cat {STATE}/api_key").stdout.strip()
    # about 20 s of steady tokens (the stand-in makes one every 10 ms), over one and a half stall times
    r = lab.on("head", ["curl", "-sS", "-N", "-m", "120", "http://127.0.0.1:8000/v1/chat/completions",
                        "-H", f"Authorization: Bearer {key}", "-H", "Content-Type: application/json",
                        "-d", json.dumps({"model": "deepseek-v4.1-flash", "stream": True,
                                          "messages": [{"role": "user", "content": "count to 2000"}]})],
               timeout=180)
    assert r.stdout.rstrip().endswith("data: [DONE]") and '"2000' in r.stdout.replace(" ", "")
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


@pytest.mark.soak           # per landing: the real engine's stop with the watchdog on (test_vllm.py)
def test_after_doit_stop_nothing_restarts(lab, watched):
    lab.doit("stop")
    time.sleep(8)                                                           # four intervals
    for node, rank in (("head", 0), ("worker1", 1)):
        assert lab.units(node, [f"dsv41-r{rank}.service"])[f"dsv41-r{rank}.service"]["ActiveState"] != "active"
    assert lab.units("head", ["dsv41-watchdog.service"])["dsv41-watchdog.service"]["ActiveState"] != "active"
    assert incidents(lab) == []


def key_of(lab):
    return lab.on("head", f"cat {STATE}/api_key").stdout.strip()


def stream(lab, words, **extra):
    """A streamed completion started in the background on the head (its process)."""
    body = {"model": "deepseek-v4.1-flash", "stream": True, "prompt": words, **extra}
    return lab.popen("head", ["curl", "-sS", "-N", "-m", "300", "http://127.0.0.1:8000/v1/completions",
                              "-H", f"Authorization: Bearer {key_of(lab)}", "-H", "Content-Type: application/json",
                              "-d", json.dumps(body)])


def incident_folder(lab):
    names = lab.on("head", f"ls {STATE}/incidents").stdout.split()
    assert len(names) == 1, names
    return f"{STATE}/incidents/{names[0]}"


@pytest.mark.soak           # per landing: the real engine's stopped Worker_TP1 and EngineCore's evidence
def test_a_stopped_worker_is_wedged_repaired_and_leaves_its_evidence(lab, watched):
    """Every step waits for each rank: a stopped headless stand-in stalls rank 0 while /health and /metrics
    answer. Caught within WATCHDOG_STALL_S + WATCHDOG_PROBE_S + one interval, evidence first."""
    req = stream(lab, "count to 4000")
    wait_for("tokens flowing", lambda: "BUSY" in lab.on("head", f"cat {STATE}/watchdog.status.json").stdout)
    pids = lab.on("worker1", "docker top dsv41-r1 -o pid | tail -n +2").stdout.split()
    # the stop lands half an interval after a look, so the next look (which sees the last tokens) is within
    # one interval of it whatever the phase the test started in
    looked = json.loads(lab.on("head", f"cat {STATE}/watchdog.status.json").stdout)["time"]
    wait_for("a fresh look", lambda: json.loads(lab.on("head", f"cat {STATE}/watchdog.status.json").stdout)["time"]
             > looked, timeout=10, every=0.1)
    time.sleep(float(FAST["WATCHDOG_INTERVAL_S"]) / 2)
    t_stop = time.time()
    lab.on("worker1", f"kill -STOP {' '.join(pids)}")
    try:
        [inc] = wait_for("a recovery", lambda: [i for i in incidents(lab) if i["result"] == "READY"], timeout=180)
    finally:
        lab.on("worker1", f"kill -CONT {' '.join(pids)}", check=False)
        req.kill()
    seen, served = inc["started"] - t_stop, inc["ended"] - t_stop
    print(f"stand-in, worker stopped: WEDGED seen after {seen:.0f} s, serving again after {served:.0f} s, "
          f"outage from fault_at {inc['ended'] - inc['fault_at']:.0f} s")
    assert inc["verdict"] == "WEDGED" and "the probe got no token" in inc["evidence"]
    assert seen <= 12 + 4 + 2 + 5                                   # stall + probe + one interval (+ a look)
    assert inc["fault_at"] <= t_stop + 2 and ready(lab)
    folder = incident_folder(lab)
    summary = json.loads(lab.on("head", f"cat {folder}/summary.json").stdout)
    assert summary["verdict"] == "WEDGED" and summary["result"] == "READY" and summary["outage_s"] > 0
    files = lab.on("head", f"cd {folder} && find . -type f | sort").stdout
    for f in ("./head/meminfo.txt", "./worker1/journal-dsv41-r1.txt", "./worker1/containers.txt", "./metrics.txt"):
        assert f in files, files
    key = key_of(lab)
    assert lab.on("head", f"grep -rlF -e {key} {STATE}/incidents", check=False).stdout == ""
    shown = lab.doit("incidents").stdout
    assert "WEDGED" in shown and "READY" in shown


def test_a_long_chunked_prefill_stays_busy(lab, watched):
    """BATCH 16: a prompt of thousands of words is prefilled 16 tokens a step, no token total moving for
    longer than WATCHDOG_STALL_S (2 s here); KV-cache use moves every step, so it is progress."""
    lab.doit("launch", {**FAST, "BATCH": "16", "WATCHDOG_STALL_S": "2", "WATCHDOG_INTERVAL_S": "1"})
    before, t0 = rank_start(lab, "head", 0), time.time()
    req = stream(lab, " ".join(["word"] * 6000), max_tokens=1)
    out = req.communicate(timeout=300)[0]
    took = time.time() - t0
    print(f"stand-in: a 6000-word prompt prefilled in 16-token chunks answered after {took:.1f} s")
    assert "[DONE]" in out and took > 4
    assert incidents(lab) == [] and rank_start(lab, "head", 0) == before
    lines = journal(lab, t0)
    assert "BUSY: 1 running" in lines and "WEDGED" not in lines


def test_memory_that_does_not_come_back_gets_no_ranks_started(lab, watched):
    """A process holds 3 GiB on the worker after its rank was killed (the lab's nodes share this machine's
    /proc/meminfo, so every node is short): nothing starts, status and launch say NEEDS_REBOOT; once the
    memory is back the watchdog starts the ranks by itself."""
    lab.doit("launch", {**FAST, "MEM_RETURN_GIB": "1"})
    for node in ("head", "worker1"):      # the baseline as of now (others' use of this machine drifts)
        lab.on(node, "python3 -c \"import json, time; kib = int([l.split()[1] for l in open('/proc/meminfo') "
                     "if l.startswith('MemAvailable:')][0]); json.dump({'mem_available_bytes': kib * 1024, "
                     f"'time': time.time()}}, open('{STATE}/mem-baseline.json', 'w'))\"")
    hog = lab.popen("worker1", ["python3", "-c", "import os, time; b = b'x' * (3 << 30); print(os.getpid(), "
                                                 "flush=True); time.sleep(600)"])
    pid = hog.stdout.readline().strip()
    try:
        assert pid.isdigit(), pid
        lab.on("worker1", "docker kill dsv41-r1")
        [inc] = wait_for("NEEDS_REBOOT", lambda: [i for i in incidents(lab) if "NEEDS_REBOOT" in i["result"]],
                         timeout=120)
        assert "worker1" in inc["result"] and "GiB below its baseline" in inc["result"]
        r = lab.doit("status", {"MEM_RETURN_GIB": "1"}, check=False)      # the settings launch was given
        assert r.returncode == 7 and "NEEDS_REBOOT: " in r.stdout and "worker1" in r.stdout, r.stdout
        for node, rank in (("head", 0), ("worker1", 1)):
            assert lab.units(node, [f"dsv41-r{rank}.service"])[f"dsv41-r{rank}.service"]["ActiveState"] != "active"
        r = lab.doit("launch", {**FAST, "MEM_RETURN_GIB": "1"}, check=False)
        assert r.returncode != 0 and "NEEDS_REBOOT: " in r.stdout + r.stderr and "worker1" in r.stdout + r.stderr
    finally:
        lab.on("worker1", f"kill {pid}", check=False)
        hog.kill()
    wait_for("READY by itself once the memory is back", lambda: ready(lab), timeout=120)
    assert "the memory came back" in journal(lab, inc["started"])


def test_a_watchdog_killed_during_its_recovery_loses_no_incident(lab, watched):
    """The incident is in the record before anything is done: status shows the recovery as RECOVERING (exit
    8) with its step; a watchdog killed (kill -9) in the middle leaves it open, and the one systemd starts
    next closes it as interrupted, counts it in the budget, and repairs the cluster."""
    lab.on("worker1", "docker kill dsv41-r1")
    [inc] = wait_for("a recovery under way", lambda: [i for i in incidents(lab) if i["open"]], timeout=60,
                     every=0.2)
    lab.on("head", "systemctl kill --kill-whom=main --signal=STOP dsv41-watchdog")    # held mid-recovery
    try:
        r = lab.doit("status --json", check=False)
        h = json.loads(r.stdout)["health"]
        assert r.returncode == 8 and h["verdict"] == "RECOVERING" and inc["id"] in h["conditions"][0], r.stdout
    finally:
        lab.on("head", "systemctl kill --kill-whom=all --signal=KILL dsv41-watchdog")
    [closed] = wait_for("closed as interrupted by the next watchdog",
                        lambda: [i for i in incidents(lab) if i["id"] == inc["id"] and not i["open"]], timeout=60)
    assert closed["result"].startswith("interrupted: the recovery's process ended mid-way"), closed
    wait_for("a recovery after it", lambda: [i for i in incidents(lab) if i["result"] == "READY"], timeout=120)
    wait_for("READY", lambda: ready(lab), timeout=60)
    doc = json.loads(lab.doit("status --json").stdout)
    assert doc["watchdog"]["recoveries_in_window"] == 2                          # the interrupted one counts
    listed = lab.doit("incidents").stdout
    assert "interrupted" in listed and inc["verdict"] in listed
