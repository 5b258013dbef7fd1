"""The `lab` fixture: the two-node lab (tests/lab/up.sh), brought up once per session if it is not up.

    lab.on(node, cmd, check=True, timeout=120, input=None) -> CompletedProcess (text; cmd is a shell
        string run by the node's shell, or an argv list that is shlex-joined)
    lab.popen(node, cmd, **kw) -> Popen (for foreground processes such as `docker run`)
    lab.ssh_argv(node) -> list[str]  (host -> node ssh prefix, via `ip netns exec head`)
    lab.repo         the repo path inside head (same as on the host)
    lab.engine_ref   "198.51.100.11:5000/lab/engine@sha256:..." (the stand-in serving image)
    lab.ip           {"head": "198.51.100.11", "worker": "198.51.100.13"}
    lab.venv         "/opt/dsv41-venv" on head (doit, sh, requests, huggingface_hub, psutil, jinja2)
A lab this fixture brought up is taken down at the end of the session unless LAB_KEEP=1.
"""
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

LAB_DIR = Path(__file__).resolve().parent
REPO = LAB_DIR.parent.parent
STATE = Path(os.environ.get("LAB_STATE", "/var/lib/dsv41-lab"))


class Lab:
    ip = {"head": "198.51.100.11", "worker": "198.51.100.13"}
    venv = "/opt/dsv41-venv"

    def __init__(self):
        self.repo = str(REPO)
        self.ssh_config = str(STATE / "ssh_config")
        self.engine_ref = (STATE / "engine.ref").read_text().strip()

    def ssh_argv(self, node):
        if node not in self.ip:
            raise ValueError(f"no lab node {node!r}: use head or worker")
        return ["ip", "netns", "exec", "head", "ssh", "-F", self.ssh_config, node, "--"]

    def _argv(self, node, cmd):
        return self.ssh_argv(node) + [cmd if isinstance(cmd, str) else shlex.join(cmd)]

    def on(self, node, cmd, check=True, timeout=120, input=None):
        r = subprocess.run(self._argv(node, cmd), capture_output=True, text=True, timeout=timeout, input=input)
        if check and r.returncode != 0:
            raise AssertionError(f"{node}: {cmd!r} exited {r.returncode}: {r.stderr.strip()[-2000:]}")
        return r

    def popen(self, node, cmd, **kw):
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.STDOUT)
        return subprocess.Popen(self._argv(node, cmd), text=True, **kw)

    def is_up(self):
        return all(self.on(n, "true", check=False, timeout=10).returncode == 0 for n in self.ip)


def _missing():
    if os.geteuid() != 0:
        return "the lab needs root (network namespaces, systemd-nspawn)"
    tools = ["systemd-nspawn", "debootstrap", "docker-registry", "ssh", "rsync", "ip", "curl"]
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        return f"the lab needs {' '.join(missing)}: run 'bash tests/setup/lab.sh' as root"
    return None


@pytest.fixture(scope="session")
def lab():
    reason = _missing()
    if reason:
        pytest.skip(reason)
    started = False
    if not ((STATE / "engine.ref").exists() and Lab().is_up()):
        r = subprocess.run(["bash", str(LAB_DIR / "up.sh")], capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            pytest.fail(f"lab-up failed:\n{r.stderr[-3000:]}", pytrace=False)
        started = True
    yield Lab()
    if started and os.environ.get("LAB_KEEP") != "1":
        subprocess.run(["bash", str(LAB_DIR / "down.sh")], capture_output=True, text=True, timeout=300)
