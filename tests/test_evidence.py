"""node/evidence.py run as it runs on a node (the system python3, the shipped package only) against real
processes: a stopped Python process's stack through the real py-spy, never its environment; the size
cap; a command that does not answer; rank processes found below a main process; no docker daemon."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dsv41.node import evidence

LIB = Path(__file__).resolve().parents[1] / "lib"
VENV_BIN = Path(sys.executable).parent
SYSTEM_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
API_KEY, HF_TOKEN = "sk-planted-key-4b1d9e", "hf_plantedTokenValue0042"
SLEEPER = textwrap.dedent("""
    import subprocess, sys, time
    def waiting_in_a_collective():
        time.sleep(600)
    if len(sys.argv) > 1:
        child = subprocess.Popen([sys.executable, __file__])
    waiting_in_a_collective()
""")


def run_evidence(req, path=None, timeout=60):
    env = {"PATH": path or f"{VENV_BIN}:{os.environ['PATH']}", "PYTHONPATH": str(LIB), "HOME": os.environ["HOME"]}
    p = subprocess.run([SYSTEM_PYTHON, "-m", "dsv41.node.evidence", json.dumps(req)], env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr
    return p.stdout, json.loads(p.stdout)


@pytest.fixture
def sleeper(tmp_path):
    """A Python process in a sleep inside a named function, started with secrets in its environment."""
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    procs = []

    def start(*args):
        env = dict(os.environ, VLLM_API_KEY=API_KEY, HF_TOKEN=HF_TOKEN)
        p = subprocess.Popen([sys.executable, str(script), *args], env=env)
        procs.append(p)
        time.sleep(0.5)
        return p
    yield start
    for p in procs:
        for child in evidence.descendants(p.pid, evidence.processes())[1:]:
            os.kill(child, signal.SIGKILL)
        p.kill()
        p.wait()


@pytest.mark.skipif(not (VENV_BIN / "py-spy").exists(), reason="py-spy is not installed (make install)")
def test_stopped_process_stack_is_dumped_and_no_secret_leaves_the_node(sleeper):
    p = sleeper()
    os.kill(p.pid, signal.SIGSTOP)
    raw, out = run_evidence({"pids": [p.pid]})
    assert out["schema"] == "dsv41.evidence/1" and out["dumped_pids"] == [p.pid]
    stack = out["files"][f"pyspy-{p.pid}.txt"]
    assert "waiting_in_a_collective" in stack and "sleeper.py" in stack and "--locals" not in stack
    assert "MemAvailable:" in out["files"]["meminfo.txt"]
    assert "RSS MiB" in out["files"]["processes.txt"] and "kernel.txt" in out["files"]
    assert API_KEY not in raw and HF_TOKEN not in raw
    assert evidence.processes()[p.pid][1].startswith("python")   # still there, still stopped
    with open(f"/proc/{p.pid}/stat") as f:
        assert f.read().split(")")[1].split()[0] == "T"


def test_without_py_spy_it_says_so_and_gathers_the_rest(sleeper):
    p = sleeper()
    _, out = run_evidence({"pids": [p.pid]}, path="/usr/bin:/bin")
    assert not any(name.startswith("pyspy-") for name in out["files"])
    assert any("py-spy is not on PATH" in n for n in out["notes"]) and "meminfo.txt" in out["files"]


def test_rank_processes_are_the_main_process_and_its_descendants(sleeper):
    p = sleeper("with-child")
    time.sleep(0.5)
    procs = evidence.processes()
    found = evidence.descendants(p.pid, procs)
    assert found[0] == p.pid and len(found) == 2 and procs[found[1]][0] == p.pid


def test_a_stopped_process_below_a_ranks_main_process_is_reported_with_its_name(sleeper):
    """What the node probe reports of each rank container (dsv41.node.facts.stopped_below): its processes
    stopped (SIGSTOP), by pid and name; none while they run, and none again once continued."""
    from dsv41.node.facts import processes, stopped_below
    p = sleeper("with-child")
    time.sleep(0.5)
    child = evidence.descendants(p.pid, evidence.processes())[1]
    assert stopped_below(p.pid, processes()) == []
    os.kill(child, signal.SIGSTOP)
    time.sleep(0.2)
    assert stopped_below(p.pid, processes()) == [[child, os.path.basename(sys.executable)]]
    os.kill(child, signal.SIGCONT)
    time.sleep(0.2)
    assert stopped_below(p.pid, processes()) == []


def test_size_cap_keeps_the_newest_lines_and_says_so(tmp_path):
    b = evidence.Budget(300)
    b.add("meminfo.txt", "MemTotal: 1 kB\n" * 5, keep="head")
    b.add("journal-dsv41-r0.txt", "".join(f"line {i}\n" for i in range(1000)))
    b.add("kernel.txt", "more\n" * 100)
    assert b.capped and b.used <= 300 + 2 * 80
    log = b.files["journal-dsv41-r0.txt"]
    assert log.startswith("[") and "size cap" in log and log.endswith("line 999\n") and "line 10\n" not in log
    assert "MemTotal" in b.files["meminfo.txt"] and "size cap" in b.files["kernel.txt"]
    _, out = run_evidence({"cap_bytes": 2000, "units": ["dsv41-r0.service"]})
    assert out["capped"] and out["bytes"] <= 2000 + 5 * 80


def test_a_command_that_does_not_answer_is_cut_at_its_timeout(tmp_path, sleeper):
    """A py-spy that never answers (a stand-in: a script that sleeps) costs timeout_s, not the run."""
    (tmp_path / "py-spy").write_text("#!/bin/sh\nsleep 30\n")
    (tmp_path / "py-spy").chmod(0o755)
    p = sleeper()
    t0 = time.monotonic()
    _, out = run_evidence({"pids": [p.pid], "timeout_s": 1}, path=f"{tmp_path}:/usr/bin:/bin")
    assert time.monotonic() - t0 < 10
    assert "no answer within 1 s" in out["files"][f"pyspy-{p.pid}.txt"]


def test_a_rank_container_that_cannot_be_inspected_is_reported():
    path = f"{VENV_BIN}:{os.environ['PATH']}"
    _, out = run_evidence({"containers": ["dsv41-r0"], "timeout_s": 5}, path=path)
    text = out["files"]["containers.txt"]
    assert text.startswith("docker not found") or ("== dsv41-r0" in text and "docker inspect:" in text)
    assert out["rank_pids"] == []
