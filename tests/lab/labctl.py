"""The lab (tests/lab/up.sh) driven from the host, for the lab tests (conftest.py) and the benchmarks
(bench/lab.py):

    lab = Lab()      # the lab must be up
    lab.on(node, cmd, check=True, timeout=120, input=None) -> CompletedProcess (text; cmd is a shell
        string run by the node's shell, or an argv list that is shlex-joined)
    lab.popen(node, cmd, **kw) -> Popen (for foreground processes such as `docker run`)
    lab.ssh_argv(node) -> list[str]  (host -> node ssh prefix, via `ip netns exec head`)
    lab.repo         the repo path inside head (same as on the host)
    lab.engine_ref   "198.51.100.11:5000/lab/engine@sha256:..." (the stand-in serving image)
    lab.ip           {"head": "198.51.100.11", "worker1": "198.51.100.13", ...} (the nodes that are up)
    lab.venv         "/opt/dsv41-venv" on head (doit, sh, requests, huggingface_hub, psutil, jinja2)
    lab.doit(args, env=None, check=True) -> CompletedProcess of `doit ARGS` on the head (lab.doit_env:
        the lab profile, WATCHDOG=0 unless env turns it on)
    lab.doit_killed(args, env, line) -> `doit ARGS` started on the head, killed with SIGKILL once its
        output shows `line`; its output
    lab.units(node, units, props) -> {unit: {prop: value}} from `systemctl show` on the node
    DoorClient(lab, key) -> the official openai SDK asking the head's port 8000 (tests/lab/door_client.py):
        .stream(n) starts a streamed answer, .end() -> {"answers": {kind: count}, "streams": [...]}
    lab.link(node, up) / lab.freeze(node, frozen)  faults from the host: the node's fabric link down,
        or every process of the node frozen (its cgroup), as a hung or cut-off Spark would be
    missing() -> why the lab cannot run here, or None
    owner() -> (checkout, what for) of the lab that is up, or None (no lab, or one that recorded none)
    up(what_for, **env) -> True when this call brought the lab up, False when it was up already;
        LabRefused (one line saying how to take it down) when the lab that is up is another checkout's
        or was made for another use (a demo, a benchmark) than what_for and not by `make lab-up`
"""
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

LAB_DIR = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("LAB_CACHE", "/var/cache/dsv41-lab"))
REPO = LAB_DIR.parent.parent
STATE = Path(os.environ.get("LAB_STATE", "/var/lib/dsv41-lab"))
MODEL = "/root/lab-model/DeepSeek-V4.1-Flash-Spark"


class Lab:
    venv = "/opt/dsv41-venv"

    def __init__(self):
        self.repo = str(REPO)
        self.ssh_config = str(STATE / "ssh_config")
        self.engine_ref = (STATE / "engine.ref").read_text().strip()
        self.ip = {}                  # from up.sh's ssh_config: "Host <node>" then "HostName <address>"
        host = None
        for line in Path(self.ssh_config).read_text().splitlines():
            words = line.split()
            if words[:1] == ["Host"] and len(words) == 2:
                host = words[1]
            elif words[:1] == ["HostName"] and host:
                self.ip[host] = words[1]

    def ssh_argv(self, node):
        if node not in self.ip:
            raise ValueError(f"no lab node {node!r}: use one of {', '.join(self.ip)}")
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

    def incidents(self, state="/root/.dsv41-two-sparks"):
        """The head's incidents as the record folds them (dsv41.head.core.record: open ones have result "")."""
        from dsv41.head.core.record import fold
        return fold(self.on("head", f"cat {state}/incidents.jsonl", check=False).stdout.splitlines())

    def is_up(self):
        return all(self.on(n, "true", check=False, timeout=10).returncode == 0 for n in self.ip)

    # the watchdog is off unless a test turns it on: it would repair the faults tests make on purpose
    doit_env = {"DSV41_PROFILE": "lab", "WATCHDOG": "0"}

    def doit_killed(self, args, env, line, timeout=300):
        env = {**self.doit_env, **(env or {})}
        log, word = "/tmp/killed-doit.log", args.split()[0]
        self.on("head", f"cd {shlex.quote(self.repo)} && (env {' '.join(f'{k}={shlex.quote(v)}' for k, v in env.items())} "
                        f"PYTHONUNBUFFERED=1 PYTHONPATH={shlex.quote(self.repo + '/lib')} setsid {self.venv}/bin/doit "
                        f"{args} > {log} 2>&1 &)")
        wait_for(f"`doit {args}` to print {line!r}", lambda: line in self.on("head", f"cat {log}").stdout, timeout,
                 every=0.2)
        self.on("head", f"pkill -9 -f 'bin/doi[t] {word}'")          # [t]: not this shell's own command line
        wait_for(f"`doit {args}` to be gone",
                 lambda: self.on("head", f"pgrep -f 'bin/doi[t] {word}'", check=False).returncode == 1)
        return self.on("head", f"cat {log}").stdout

    def doit(self, args, env=None, check=True, timeout=900):
        env = {**self.doit_env, **(env or {})}
        cmd = (f"cd {shlex.quote(self.repo)} && env {' '.join(f'{k}={shlex.quote(v)}' for k, v in env.items())} "
               f"PYTHONPATH={shlex.quote(self.repo + '/lib')} {self.venv}/bin/doit {args}")
        r = self.on("head", cmd, check=False, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"doit {args} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return r

    def link(self, node, up):
        subprocess.run(["ip", "-n", node, "link", "set", "fab0", "up" if up else "down"], check=True)
        deadline = time.monotonic() + 20
        while up and self.on(node, "true", check=False, timeout=10).returncode != 0:
            assert time.monotonic() < deadline, f"{node} did not answer after its link came up"
            time.sleep(0.5)

    def freeze(self, node, frozen):
        Path(f"/sys/fs/cgroup/unified/lab-{node}/cgroup.freeze").write_text("1" if frozen else "0")

    def units(self, node, units, props=("ActiveState", "ActiveEnterTimestamp", "NRestarts")):
        r = self.on(node, ["systemctl", "show", "--timestamp=unix", "-p", ",".join(props), "--", *units])
        return {unit: dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
                for unit, block in zip(units, r.stdout.split("\n\n"))}


class LabRefused(Exception):
    """The lab that is up is not this checkout's to use: str() is up.sh's one line."""


def owner():
    try:
        checkout, what_for = (STATE / "owner").read_text().splitlines()[:2]
        return checkout, what_for
    except (OSError, ValueError):
        return None


def up(what_for, **env):
    """tests/lab/up.sh for `what_for` (tests, bench): the lab up, reusing one of this checkout's."""
    was = STATE.exists()
    r = subprocess.run(["bash", str(LAB_DIR / "up.sh")], env={**os.environ, **env, "LAB_FOR": what_for},
                       capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        if "not this one's" in last:
            raise LabRefused(last)
        raise RuntimeError(f"lab-up failed:\n{r.stderr[-3000:]}")
    return not was


def missing():
    """Why the lab cannot run here (one line), or None."""
    if os.geteuid() != 0:
        return "the lab needs root (network namespaces, systemd-nspawn)"
    tools = ["systemd-nspawn", "debootstrap", "docker-registry", "ssh", "rsync", "ip", "curl"]
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        return f"the lab needs {' '.join(missing)}: run 'bash tests/setup/lab.sh' as root"
    return None


class DoorClient:
    """What a user's tool sees at the head's port 8000: tests/lab/door_client.py (the openai SDK, from this
    checkout's venv, in the head's network namespace), the key in its environment."""

    def __init__(self, lab, key):
        self.proc = subprocess.Popen(["ip", "netns", "exec", "head", f"{lab.repo}/.venv/bin/python",
                                      f"{lab.repo}/tests/lab/door_client.py"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, "DSV41_KEY": key})

    def stream(self, n, exact=False):
        """A streamed "count to n" begun (exact: n tokens, the end token ignored), its first tokens out."""
        self.proc.stdin.write(f"stream {n}{' exact' if exact else ''}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "started"
        time.sleep(1)

    def end(self):
        import json
        out, _ = self.proc.communicate("end\n", timeout=300)
        return json.loads(out.strip().splitlines()[-1])


class DoorLoad:
    """tests/lab/door_load.py in the head's network namespace against the door (port 8000), the client key in its
    environment: `clients` clients that never retry, each one short request after another (`pause_s` apart)."""

    def __init__(self, lab, model, clients=6, pause_s=0.0):
        key = lab.on("head", "cat /root/.dsv41-two-sparks/api_key").stdout.strip()
        self.proc = subprocess.Popen(["ip", "netns", "exec", "head", f"{lab.repo}/.venv/bin/python",
                                      f"{lab.repo}/tests/lab/door_load.py", "127.0.0.1", "8000", model, str(clients),
                                      str(pause_s)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "DSV41_KEY": key})

    def mark(self):
        """The moment a fault is made: the summary counts the requests begun after it."""
        self.proc.stdin.write("mark\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "marked"

    def end(self):
        import json
        out, _ = self.proc.communicate("end\n", timeout=300)
        return json.loads(out.strip().splitlines()[-1])


def only_503s(answers):
    """Every answer that is not a 200 is a 503 with Retry-After from 5 to 60 s: nothing refused."""
    return all(k == "200" or (k.startswith("503 retry-after ") and 5 <= int(k.split()[-1]) <= 60) for k in answers)


def wait_for(what, check, timeout=120, every=1.0):
    """check()'s first truthy value, polled every `every` s; an assertion naming `what` after timeout s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(every)
