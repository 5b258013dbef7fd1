"""head/core/incidents.py against real nodes: this machine as the head and worker1 behind a loopback sshd, the
stand-in engine as rank 0 (its environment holds the API key), a stopped Python process holding
HF_TOKEN. Every saved folder is grepped for both secrets; a frozen worker costs its deadline only; the
newest INCIDENTS_KEEP folders are kept; the listing and show print what was saved."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from dsv41.errors import UserError
from dsv41.head.core import incidents, statefiles
from dsv41.head.core.cluster import Cluster
from dsv41.settings.layers import load_config
from sshd import need_sshd, start_sshd, stop_sshd
from test_standin_engine import KEY, Ranks

HF_TOKEN = "hf_plantedTokenValue0042"
VENV_BIN = Path(sys.executable).parent


def grep_tree(folder, *needles):
    hits = []
    for dirpath, _, files in os.walk(folder):
        for f in files:
            data = Path(dirpath, f).read_bytes()
            hits += [f"{f}: {n}" for n in needles if n.encode() in data]
    return hits


@pytest.fixture
def nodes(tmp_path):
    need_sshd()
    (tmp_path / "sshd").mkdir()
    sshd, ssh = start_sshd(tmp_path / "sshd")
    (tmp_path / "engine").mkdir()
    engine = Ranks(tmp_path / "engine", nnodes=1, env={"HF_TOKEN": HF_TOKEN}).up()
    code = "import time\ndef stuck_here():\n    time.sleep(600)\nstuck_here()"
    sleeper = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, HF_TOKEN=HF_TOKEN, VLLM_API_KEY=KEY))
    time.sleep(0.5)
    os.kill(sleeper.pid, signal.SIGSTOP)
    env = {k: v for k, v in os.environ.items() if k not in ("WORKER", "WORKERS", "DSV41_PROFILE", "METRICS_DIR")}
    env.update(WORKER=ssh.target, SSH_OPTS=ssh.ssh_opts, STATE_DIR=str(tmp_path / "state"), HF_TOKEN=HF_TOKEN,
               MODEL_DIR=str(tmp_path / "model"), HEAD_IP="127.0.0.1", ENGINE_PORT=str(engine.port), SSH_TIMEOUT_S="2",
               PATH=f"{VENV_BIN}:{os.environ['PATH']}")
    old_path = os.environ["PATH"]
    os.environ["PATH"] = env["PATH"]   # py-spy on the head's PATH (the head runs node code locally)
    cfg = load_config(env)
    (tmp_path / "state").mkdir()
    yield SimpleNamespace(cfg=cfg, cl=Cluster(cfg), engine=engine, sleeper=sleeper, sshd=sshd,
                          state=str(tmp_path / "state"), url=f"http://127.0.0.1:{engine.port}/metrics")
    os.environ["PATH"] = old_path
    for pid in [sshd.pid]:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    sleeper.kill()
    sleeper.wait()
    engine.stop()
    stop_sshd(sshd)


def test_an_incident_holds_every_nodes_evidence_and_no_secret(nodes):
    head_pids = {"head": [nodes.engine.procs[0].pid, nodes.sleeper.pid], "worker1": [nodes.sleeper.pid]}
    t0 = time.time()
    folder = incidents.capture(nodes.cl, nodes.state, "WEDGED", "1 running, 0 waiting, no progress for 130 s",
                               fault_at=t0 - 130, metrics_url=nodes.url, secrets=(KEY, HF_TOKEN), keep=20,
                               node_deadline_s=30, pids=head_pids)
    assert os.path.basename(folder).endswith("-WEDGED") and oct(os.stat(folder).st_mode)[-3:] == "700"
    summary = json.loads(Path(folder, "summary.json").read_text())
    assert summary["verdict"] == "WEDGED" and summary["fault_at"] == pytest.approx(t0 - 130)
    assert summary["result"] == "pending" and set(summary["nodes"]) == {"head", "worker1"}
    for node in ("head", "worker1"):
        files = set(os.listdir(Path(folder, node)))
        assert {"meminfo.txt", "processes.txt", "containers.txt", "journal-dsv41-r0.txt" if node == "head"
                else "journal-dsv41-r1.txt", "evidence.json"} <= files, files
    if (VENV_BIN / "py-spy").exists():
        assert "stuck_here" in Path(folder, "head", f"pyspy-{nodes.sleeper.pid}.txt").read_text()
        assert "engine.py" in Path(folder, "head", f"pyspy-{nodes.engine.procs[0].pid}.txt").read_text()
    assert "vllm:num_requests_running" in Path(folder, "metrics.txt").read_text()
    assert grep_tree(incidents.root(nodes.state), KEY, HF_TOKEN) == []

    done = incidents.record_result(folder, "READY", ended=t0 + 60)
    assert done["outage_s"] == pytest.approx(190, abs=0.5)
    lines = incidents.list_lines(nodes.state)
    assert "WEDGED" in lines[1] and "3.2 min" in lines[1] and "READY" in lines[1] and lines[1].lstrip().startswith("1 ")
    shown = incidents.show(nodes.state, 1)
    assert "outage 3.2 min" in shown and "head/meminfo.txt" in shown and "worker1/processes.txt" in shown
    with pytest.raises(UserError, match="no incident 2: 1 saved"):
        incidents.show(nodes.state, 2)
    assert incidents.show(nodes.state, os.path.basename(folder)) == shown       # the name an alert gives
    with pytest.raises(UserError, match="no incident 20200101T000000Z-DEAD: 1 saved in "):
        incidents.show(nodes.state, "20200101T000000Z-DEAD")


def sshd_tree(pid):
    """The sshd listener and every session it forked (a frozen node answers nothing)."""
    kids, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids.append(p)
        for task in Path(f"/proc/{p}/task").iterdir():
            todo += [int(c) for c in (task / "children").read_text().split()]
    return kids


def test_a_frozen_worker_costs_its_deadline_and_is_named(nodes):
    nodes.cl.connect()
    frozen = sshd_tree(nodes.sshd.pid)
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        folder = incidents.capture(nodes.cl, nodes.state, "DEAD", "/health does not answer", fault_at=None,
                                   metrics_url=nodes.url, secrets=(KEY,), keep=20, node_deadline_s=6)
        took = time.monotonic() - t0
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    summary = json.loads(Path(folder, "summary.json").read_text())
    assert took < 15 and "error" in summary["nodes"]["worker1"] and "files" in summary["nodes"]["head"]
    assert "worker1: no evidence" in incidents.show(nodes.state)


def test_the_newest_are_kept_and_the_listing_is_newest_first(tmp_path):
    state = str(tmp_path)
    ev = {"head": {"files": {"meminfo.txt": f"MemAvailable: 1 kB\nkey {KEY}\n"}, "notes": []}}
    for i in range(25):
        t = 1_800_000_000 + 60 * i
        incidents.save(state, "DEGRADED" if i % 2 else "WEDGED", f"fault {i}", nodes=ev, metrics_text=f"# {HF_TOKEN}\n",
                       fault_at=t - 5, secrets=(KEY, HF_TOKEN), keep=20, now=t)
    kept = incidents.folders(state)
    assert len(kept) == 20 and os.path.basename(kept[0]).startswith("20270115T0824")
    lines = incidents.list_lines(state)
    assert "fault 24" in lines[1] and "fault 5" in lines[-1] and len(lines) == 21
    assert grep_tree(incidents.root(state), KEY, HF_TOKEN) == []
    assert "<redacted>" in Path(kept[0], "head", "meminfo.txt").read_text()
    same = incidents.save(state, "WEDGED", "again", nodes={}, metrics_text="", fault_at=None, secrets=(), keep=20,
                          now=1_800_000_000 + 60 * 24)
    assert same.endswith("-WEDGED-2") and incidents.list_lines(state)[1].split()[3] == "WEDGED"


def test_show_says_what_is_missing_never_none(tmp_path):
    """A folder an earlier version (or a crash) left with a summary of few fields."""
    folder = tmp_path / incidents.DIR / "20270101T000000Z-DEAD"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"verdict": "DEAD", "nodes": {"head": {"files": None}}}))
    shown = incidents.show(str(tmp_path), 1)
    assert "None" not in shown and "incident 20270101T000000Z-DEAD:" in shown and "head: 0 files in -" in shown
    (folder / "summary.json").write_text("{not json")
    with pytest.raises(statefiles.BadStateFile, match=r"summary.json is not JSON .*: move it aside"):
        incidents.show(str(tmp_path), 1)
