"""The fault catalogue of the chaos soak: one function per fault kind, registered with @fault. Each takes
a Ctx, injects its fault on a node it picks with ctx.rng, and returns (node, proof): proof is one line
saying how the fault was seen to take effect (a process in state T, the link down, ssh timing out, the
rank's log). A fault that cannot be seen to take effect raises NoEffect, which fails the soak.

Adding a fault kind is adding a function here; plan() draws the kinds from CATALOGUE."""
import dataclasses
import json
import random
import subprocess
import time
from pathlib import Path

CATALOGUE = {}          # kind -> function, in definition order


class NoEffect(Exception):
    """The fault was injected but nothing shows it took effect."""


def fault(fn):
    CATALOGUE[fn.__name__.replace("_", "-")] = fn
    return fn


@dataclasses.dataclass
class Ctx:
    lab: object                     # labctl.Lab
    engine: str                     # "standin" or "vllm"
    rng: random.Random
    hold_s: float = 20.0            # how long the "for a while" faults last
    state: Path = Path("/var/lib/dsv41-lab")
    reboot_script: Path = Path(__file__).resolve().parents[2] / "tests" / "lab" / "reboot.sh"

    @property
    def nodes(self):
        return list(self.lab.ip)

    @property
    def workers(self):
        return [n for n in self.lab.ip if n != "head"]

    def rank(self, node):
        return self.nodes.index(node)


def plan(seed, kinds, every, minutes=None, once=False):
    """[(seconds after the start, kind)]: a seeded permutation of every kind, then kinds at random, one
    every uniform(every) seconds while within `minutes` (only the permutation when `once`). Pure."""
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    out, t = [], 0.0
    while True:
        t += rng.uniform(*every)
        if once and len(out) == len(order):
            return out
        if not once and t > minutes * 60:
            return out
        out.append((round(t, 1), order[len(out)] if len(out) < len(order) else rng.choice(order)))


# ---- helpers run on a node -----------------------------------------------------------------------

def wait(what, check, timeout, every=0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise NoEffect(f"{what}: not seen within {timeout} s")
        time.sleep(every)


def sh(lab, node, cmd, timeout=60):
    return lab.on(node, cmd, check=False, timeout=timeout)


def running_container(lab, node, name, timeout=90):
    """The ID of the running container `name` on the node, waiting for it (the cluster may be mid-recovery)."""
    def cid():
        r = sh(lab, node, f"docker inspect -f '{{{{.State.Running}}}} {{{{.Id}}}}' {name}", timeout=30)
        words = r.stdout.split()
        return words[1] if r.returncode == 0 and words[:1] == ["true"] else None
    return wait(f"a running {name} on {node}", cid, timeout, every=2)


STOP_SCRIPT = r"""
import os, signal, sys, time
pattern, only_children_of = sys.argv[1], sys.argv[2]
def procs():
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
        yield int(pid), int(ppid), state, cmd
hits = [p for p in procs() if (p[3].startswith(pattern) if pattern else True)
        and (only_children_of == "-" or p[1] == int(only_children_of))]
for pid, *_ in hits:
    os.kill(pid, signal.SIGSTOP)
time.sleep(0.5)
for pid, _, _, cmd in hits:
    state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    print(pid, state, cmd[:80])
"""


def sigstop(lab, node, pattern, children_of="-", timeout=240):
    """SIGSTOP the node's processes whose command line starts with `pattern` (and whose parent is
    `children_of`), waiting up to `timeout` for one to exist (a rank mid-start-up has no engine process
    yet); the proof is each one in state T."""
    said = []

    def stopped():
        r = lab.on(node, ["python3", "-c", STOP_SCRIPT, pattern, str(children_of)], check=False, timeout=30)
        said[:] = [r.stderr.strip()[-200:]]
        return [ln.split(None, 2) for ln in r.stdout.splitlines() if ln.strip()]
    try:
        lines = wait(f"a process {pattern or '(child of ' + str(children_of) + ')'!r} on {node} to stop", stopped,
                     timeout, every=2)
    except NoEffect as err:
        raise NoEffect(f"{err}{': ' + said[0] if said and said[0] else ''}") from None
    if any(state != "T" for _, state, _ in lines):
        raise NoEffect(f"stopped processes on {node} not in state T: {lines}")
    return "state T: " + ", ".join(f"pid {pid} {cmd.split()[0]}" for pid, _, cmd in lines)


def sshd_pids(node):
    """Host PIDs of every sshd of a node (listener and sessions): the processes in its network namespace."""
    pids = subprocess.run(["ip", "netns", "pids", node], capture_output=True, text=True).stdout.split()
    out = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd":
                out.append(pid)
        except OSError:
            pass
    return out


# ---- the catalogue --------------------------------------------------------------------------------

@fault
def kill_rank(ctx):
    """docker kill of the rank container on any node."""
    node = ctx.rng.choice(ctx.nodes)
    name = f"dsv41-r{ctx.rank(node)}"
    cid = running_container(ctx.lab, node, name)
    sh(ctx.lab, node, f"docker kill {name}")
    wait(f"{name} on {node} gone", lambda: sh(ctx.lab, node, f"docker inspect -f '{{{{.State.Running}}}}' {cid}")
         .stdout.strip() != "true", 20)
    return node, f"container {cid[:12]} ({name}) no longer runs"


def container_init(ctx, node, name):
    """The host PID of the running container's init (the rank containers run with --init)."""
    cid = running_container(ctx.lab, node, name)
    return sh(ctx.lab, node, f"docker inspect -f '{{{{.State.Pid}}}}' {cid}").stdout.strip()


@fault
def stop_engine(ctx):
    """The head's engine process stopped and left stopped: SIGSTOP of rank 0's VLLM::EngineCore (the API
    answers, nothing progresses); the stand-in, whose engine and API are one process, gets its SIGUSR1
    wedge instead (no step, no token; /health still answers)."""
    running_container(ctx.lab, "head", "dsv41-r0")
    if ctx.engine == "vllm":
        return "head", sigstop(ctx.lab, "head", "VLLM::EngineCore")
    t0 = time.time()
    sh(ctx.lab, "head", "docker kill --signal USR1 dsv41-r0")
    wait("'wedge ON' in dsv41-r0's journal on head", lambda: "wedge ON" in sh(
        ctx.lab, "head", f"journalctl -u dsv41-r0 --no-pager -o cat --since=@{t0 - 1:.0f}").stdout, 20)
    return "head", "dsv41-r0 on head logged 'wedge ON'"


@fault
def stop_worker(ctx):
    """A worker's engine process stopped and left stopped: SIGSTOP of its VLLM::Worker_TP<N>, or of the
    headless stand-in (rank 0's steps then never end, while /health and /metrics still answer)."""
    node = ctx.rng.choice(ctx.workers)
    name = f"dsv41-r{ctx.rank(node)}"
    if ctx.engine == "vllm":
        running_container(ctx.lab, node, name)
        return node, sigstop(ctx.lab, node, "VLLM::Worker_TP")
    return node, sigstop(ctx.lab, node, "", children_of=container_init(ctx, node, name))


@fault
def stop_api(ctx):
    """SIGSTOP of the API server: the rank 0 container's main process (the child of its init)."""
    return "head", sigstop(ctx.lab, "head", "", children_of=container_init(ctx, "head", "dsv41-r0"))


@fault
def kill_guard(ctx):
    """kill -9 of a node's memory guard (systemd restarts it; the ranks must not notice)."""
    node = ctx.rng.choice(ctx.nodes)
    pid = ctx.lab.units(node, ["dsv41-memguard.service"], ("MainPID",))["dsv41-memguard.service"]["MainPID"]
    if pid in ("", "0"):
        raise NoEffect(f"no memory guard runs on {node}")
    sh(ctx.lab, node, f"kill -9 {pid}")
    wait(f"guard pid {pid} gone on {node}", lambda: sh(ctx.lab, node, f"kill -0 {pid}").returncode != 0, 10)
    return node, f"memory guard pid {pid} killed"


@fault
def stop_sshd(ctx):
    """Every sshd of a worker (listener and sessions) stopped for ctx.hold_s, then continued."""
    node = ctx.rng.choice(ctx.workers)
    pids = sshd_pids(node)
    if not pids:
        raise NoEffect(f"no sshd on {node}")
    subprocess.run(["kill", "-STOP", *pids], check=True)
    try:
        t0 = time.monotonic()
        try:
            r = ctx.lab.on(node, "true", check=False, timeout=15)
            answered = r.returncode == 0
        except subprocess.TimeoutExpired:
            answered = False
        if answered:
            raise NoEffect(f"{node} still answered ssh with its sshd stopped")
        proof = f"ssh to {node} got no answer ({time.monotonic() - t0:.0f} s) with sshd {' '.join(pids)} stopped"
        time.sleep(max(0.0, ctx.hold_s - (time.monotonic() - t0)))
    finally:
        subprocess.run(["kill", "-CONT", *pids], check=False)
    return node, proof


@fault
def link_down(ctx):
    """A worker's fabric link down for ctx.hold_s, then up again."""
    node = ctx.rng.choice(ctx.workers)
    ctx.lab.link(node, False)
    try:
        r = subprocess.run(["ip", "-j", "-n", node, "link", "show", "fab0"], capture_output=True, text=True)
        flags = json.loads(r.stdout or "[{}]")[0].get("flags", [])
        if "UP" in flags:
            raise NoEffect(f"{node}'s fab0 still UP: {flags}")
        time.sleep(ctx.hold_s)
    finally:
        ctx.lab.link(node, True)
    return node, f"{node} fab0 down ({','.join(flags)}) for {ctx.hold_s:.0f} s"


@fault
def restart_docker(ctx):
    """systemctl restart docker on a worker (its containers stop with the daemon)."""
    node = ctx.rng.choice(ctx.workers)
    before = ctx.lab.units(node, ["docker.service"], ("MainPID",))["docker.service"]["MainPID"]
    sh(ctx.lab, node, "systemctl restart docker", timeout=120)
    after = ctx.lab.units(node, ["docker.service"], ("MainPID",))["docker.service"]["MainPID"]
    if after in ("", "0", before):
        raise NoEffect(f"dockerd on {node}: MainPID {before} -> {after}")
    return node, f"dockerd on {node}: pid {before} -> {after}"


@fault
def reboot(ctx):
    """A worker node rebooted: an orderly poweroff, then booted again as lab-up boots it
    (tests/lab/reboot.sh)."""
    node = ctx.rng.choice(ctx.workers)
    before = (ctx.state / f"{node}.pid").read_text().strip()
    r = subprocess.run(["bash", str(ctx.reboot_script), node], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise NoEffect(f"reboot of {node} failed: {r.stderr.strip()[-300:]}")
    after = (ctx.state / f"{node}.pid").read_text().strip()
    if after == before:
        raise NoEffect(f"{node}'s systemd-nspawn is still pid {before}")
    return node, f"{node} powered off and booted again (systemd-nspawn pid {before} -> {after})"
