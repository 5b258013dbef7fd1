"""The two-node lab for benchmarks (tests/lab): bring it up and launched with the stand-in engine, run
doit on its head, inject faults from the host. unavailable() says why a benchmark must skip."""
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "tests" / "lab"
MODEL = "/root/lab-model/DeepSeek-V4.1-Flash-Spark"
VENV = "/opt/dsv41-venv"


def unavailable():
    if os.geteuid() != 0:
        return "needs root (the lab's network namespaces and systemd-nspawn)"
    missing = [t for t in ("systemd-nspawn", "debootstrap", "docker-registry", "rsync") if not shutil.which(t)]
    return f"the lab needs {' '.join(missing)}: run 'bash tests/setup/lab.sh'" if missing else None


def on(node, cmd, check=True, timeout=600):
    r = subprocess.run([str(LAB / "on"), node, cmd], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode:
        raise SystemExit(f"lab: {node}: {cmd} failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    return r


def doit(args, env=None, check=True):
    env = {"DSV41_PROFILE": "lab", **(env or {})}
    assign = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return on("head", f"cd {shlex.quote(str(REPO))} && env {assign} PYTHONPATH={shlex.quote(str(REPO / 'lib'))} "
                      f"{VENV}/bin/doit {args}", check=check)


def timed(args, env=None):
    t0 = time.monotonic()
    r = doit(args, env, check=False)
    return time.monotonic() - t0, r


def skipped():
    """True (after saying why) when the lab cannot run here; else the lab is up and launched."""
    why = unavailable()
    if why:
        print(f"skipped: {why}")
        return True
    launched()
    return False


def launched():
    """The lab up (cached: seconds) and the cluster launched with the stand-in engine."""
    subprocess.run(["bash", str(LAB / "up.sh")], check=True, capture_output=True)
    if on("head", f"test -e {MODEL}/sha256-manifest.txt", check=False).returncode:
        on("head", f"{VENV}/bin/python {REPO}/tests/fixture_checkpoint.py {MODEL} --mb 4")
    doit("launch")


def freeze(node, frozen):
    Path(f"/sys/fs/cgroup/unified/lab-{node}/cgroup.freeze").write_text("1" if frozen else "0")
