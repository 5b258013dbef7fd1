"""Memory guard benchmarks, against a 1-second polling loop like the original guard's, around the kill path
of the guard's first commit (BASELINE, checked out into a temporary worktree by bench/baseline.py).

Reaction: a stand-in rank process (DSV41_RANK=0) allocates and touches pages until MemAvailable
falls under a floor set 0.75 GiB below the measured MemAvailable (at most 2 GiB, freed when it dies);
the time from the crossing (the stand-in's own MemAvailable samples, one per 4 MiB) to the
watcher's SIGKILL (its own timestamp) and to the stand-in's end (pidfd) is measured, p50/p95 over
several trials. Each watcher runs as PID 1 of its own PID namespace, so it can only kill the stand-in.
Scan: one trip's pass over this host's /proc, the current guard's against the first guard's.
CPU: user+system time of a watcher over 20 s at steady state, far from the floor and near it.
Needs root, unshare and nsenter; prints a reason and exits 2 otherwise.

The current guard is run only as `python -m GUARD` and its scan() (both in a separate process) and read
through its trip marker file, so GUARD (and its scan module) is the one module path this benchmark names.
"""
import datetime
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import json
import tempfile
import time
from pathlib import Path

import baseline

GUARD = "dsv41.node.memguard"            # the current guard's package: its command line (python -m GUARD)
GUARD_SCAN = GUARD + ".scan"             # ... and its scan()
# 38a75b5 (Memory guard: kills rank processes directly...): the commit that added the guard (then
# dsv41/memguard.py) and this benchmark; its MemInfo, scan and kill_all are the kill path the 1 s loop
# was written around, and its scan is the first guard's.
BASELINE = "38a75b519355fc33ba20be5d20a7bc19e156619c"
TRIP_MARKER = "memguard.tripped"         # $STATE_DIR/memguard.tripped (JSON), killed_at: when it killed
GIB = 1 << 30
TRIALS = int(os.environ.get("BENCH_TRIALS", "10"))
HEADROOM = 0.75 * GIB
TICK = os.sysconf("SC_CLK_TCK")

# Stand-in for a rank container: on "go", allocate and touch pages, printing (time, MemAvailable).
HOG = r"""
import mmap, os, sys, time
floor, limit = int(sys.argv[1]), int(sys.argv[2])
fd = os.open("/proc/meminfo", os.O_RDONLY)
def avail():
    d = os.pread(fd, 16384, 0); i = d.index(b"MemAvailable:") + 13
    return int(d[i:d.index(b"\n", i)].split()[0]) * 1024
print("ready", flush=True)
sys.stdin.readline()
mm = mmap.mmap(-1, limit, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
chunk, off = b"\1" * (4 << 20), 0
while off < limit:
    mm[off:off + len(chunk)] = chunk
    off += len(chunk)
    a = avail()
    print(time.monotonic(), a, flush=True)
    if a < floor - (256 << 20):
        break
time.sleep(60)
"""

# The baseline: what the original guard did, once a second (run in BASELINE's tree).
LOOP = r"""
import sys, time
from dsv41.memguard import MemInfo, scan, kill_all
floor, mem = int(sys.argv[1]), MemInfo()
print("ready", flush=True)
while True:
    if mem.available() < floor:
        kill_all(scan({})[0], print)
        print(f"killed {time.time()!r}", flush=True)
    time.sleep(1)
"""

# One trip's scan of the host's /proc: the best of 5, in ms (argv[1]: the module holding scan()).
SCAN = r"""
import importlib, sys, time
scan = importlib.import_module(sys.argv[1]).scan
best = float("inf")
for _ in range(5):
    t0 = time.perf_counter()
    _, sizes = scan({"ab" * 32: 0})
    best = min(best, time.perf_counter() - t0)
print(best * 1000, len(sizes))
"""


def available():
    """MemAvailable in bytes."""
    with open("/proc/meminfo", "rb") as f:
        data = f.read()
    i = data.index(b"MemAvailable:") + 13
    return int(data[i:data.index(b"\n", i)].split()[0]) * 1024


def children(pid):
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def start_watcher(kind, floor, state, tree):
    """(unshare Popen, host pid of the watcher = PID 1 of its namespace), importing dsv41 from tree/lib."""
    cmd = ([sys.executable, "-m", GUARD, "--floor-gib", repr(floor / GIB), "--state-dir", state]
           if kind == "memguard" else [sys.executable, "-c", LOOP, str(floor)])
    env = baseline.env(tree, {k: v for k, v in os.environ.items() if not k.startswith("DSV41_")})
    proc = subprocess.Popen([shutil.which("unshare"), "--pid", "--fork", "--mount-proc", "--kill-child",
                             *cmd], env=env, stdout=subprocess.PIPE, text=True)
    while "ready" not in (line := proc.stdout.readline()) and "memguard started" not in line:
        if not line:
            raise RuntimeError(f"{kind} did not start")
    return proc, children(proc.pid)[0]


def stop(proc):
    proc.kill()  # --kill-child takes the watcher and its namespace along
    proc.wait()


def one_reaction(kind, tree):
    avail0 = available()
    floor = int(avail0 - HEADROOM)
    with tempfile.TemporaryDirectory() as state:
        proc, wpid = start_watcher(kind, floor, state, tree)
        try:
            time.sleep(random.uniform(0.2, 1.2))  # any phase of the watcher's polling
            hog = subprocess.Popen([shutil.which("nsenter"), "--target", str(wpid), "--pid", "--",
                                    sys.executable, "-c", HOG, str(floor), str(2 * GIB)],
                                   env={**os.environ, "DSV41_RANK": "0"},
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert hog.stdout.readline() == "ready\n"
            pidfd = os.pidfd_open(children(hog.pid)[0])
            hog.stdin.write("go\n")
            hog.stdin.flush()
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            died = poller.poll(30_000) and time.monotonic()
            if died:
                killed = kill_time(kind, proc, state)
            else:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.close(pidfd)
            lines = [ln.split() for ln in hog.stdout.read().splitlines()]
            samples = [(float(t), float(a)) for t, a in (f for f in lines if len(f) == 2)]  # last may be cut
            hog.wait()
        finally:
            stop(proc)
    below = [t for t, a in samples if a < floor]
    if not died:
        return "crossed the floor but not killed within 30 s" if below else "floor not reached"
    # The crossing: the first sample of the last run under the floor (other work on this machine
    # can push MemAvailable back above it), else the last sample, still above it (conservative).
    crossed = samples[-1][0]
    for t, a in reversed(samples):
        if a >= floor:
            break
        crossed = t
    return killed - crossed, died - crossed


def kill_time(kind, proc, state):
    """When the watcher sent SIGKILL (its own wall-clock record), on the monotonic clock."""
    needle = "trip marker" if kind == "memguard" else "killed "
    while needle not in (line := proc.stdout.readline()):
        if not line:
            raise RuntimeError(f"{kind} exited without a kill record")
    if kind == "memguard":
        marker = json.loads(Path(state, TRIP_MARKER).read_text())
        wall = datetime.datetime.fromisoformat(marker["killed_at"]).timestamp()
    else:
        wall = float(line.split()[1])
    return wall - (time.time() - time.monotonic())


def settle(target):
    end = time.monotonic() + 10
    while available() < target and time.monotonic() < end:
        time.sleep(0.1)


def pct(values, q):
    values = sorted(values)
    return values[max(0, -(-len(values) * q // 100) - 1)]


def cpu_ticks(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def scan_ms(tree, module):
    """(best ms of one trip's scan of this host's /proc, processes seen) by tree's module."""
    r = subprocess.run([sys.executable, "-c", SCAN, module], env=baseline.env(tree), capture_output=True,
                       text=True)
    if r.returncode:
        raise SystemExit(f"bench_memguard: the scan of {module} failed: {' '.join(r.stderr.split())[-300:]}")
    ms, n = r.stdout.split()
    return float(ms), int(n)


def main():
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter")):
        print("skipped: needs root, unshare and nsenter; no figures")
        return 2
    avail = available()
    if avail < 6 * GIB:
        print(f"skipped: needs 6 GiB available, have {avail / GIB:.1f}; no figures")
        return 2
    with baseline.checkout(BASELINE) as old:
        return bench(avail, {"memguard": baseline.ROOT, "baseline": old})


def bench(avail, trees):
    """Every figure, the current guard from trees["memguard"], the 1 s loop from trees["baseline"]."""
    results = {}
    for kind in ("memguard", "baseline"):
        kills, gones = [], []
        for i in range(TRIALS):
            for _ in range(3):  # other work on this machine may free memory faster than the hog eats it
                settle(avail - 0.25 * GIB)
                r = one_reaction(kind, trees[kind])
                if r != "floor not reached":
                    break
                print(f"  {kind} trial {i + 1}: floor not reached (other work freed memory), again")
            print(f"  {kind} trial {i + 1}: " + (r if isinstance(r, str) else
                  f"SIGKILL after {r[0] * 1000:.0f} ms, gone after {r[1] * 1000:.0f} ms"), flush=True)
            if not isinstance(r, str):
                kills.append(r[0])
                gones.append(r[1])
        results[kind] = kills, gones
    print(f"reaction from MemAvailable under the floor ({TRIALS} trials each):")
    for i, what in enumerate(("to SIGKILL sent", "to stand-in gone (exited, memory freed)")):
        print(f"  {what}:")
        g, b = results["memguard"][i], results["baseline"][i]
        for name, t in (("memguard", g), ("1 s polling loop (original's cadence)", b)):
            print(f"    {name:38s} p50 {pct(t, 50) * 1000:6.0f} ms   p95 {pct(t, 95) * 1000:6.0f} ms"
                  f"   ({len(t)}/{TRIALS} killed)" if t else f"    {name}: never killed")
        if g and b:
            print(f"    ratio baseline/memguard: p50 {pct(b, 50) / pct(g, 50):.1f}x   "
                  f"p95 {pct(b, 95) / pct(g, 95):.1f}x;   target p95 < 200 ms: "
                  f"{'met' if pct(g, 95) < 0.2 and len(g) == TRIALS else 'MISSED'}")

    # A trip's /proc scan on this whole host (the namespaces above hold only a few processes).
    ms, n = scan_ms(trees["memguard"], GUARD_SCAN)
    first, _ = scan_ms(trees["baseline"], "dsv41.memguard")
    print(f"trip scan of this host's /proc ({n} processes), best of 5: {ms:.1f} ms; the first guard's "
          f"({BASELINE[:12]}): {first:.1f} ms; ratio {ms / first:.2f}x")

    span = 20
    with tempfile.TemporaryDirectory() as s1, tempfile.TemporaryDirectory() as s2:
        avail = available()
        runs = {"memguard, far from floor (floor 1 GiB)": start_watcher("memguard", GIB, s1, trees["memguard"]),
                "memguard, 1.5 GiB above floor": start_watcher("memguard", int(avail - 1.5 * GIB), s2,
                                                               trees["memguard"]),
                "1 s polling loop (baseline)": start_watcher("baseline", GIB, None, trees["baseline"])}
        try:
            time.sleep(2)
            before = {k: cpu_ticks(pid) for k, (_, pid) in runs.items()}
            time.sleep(span)
            used = {k: (cpu_ticks(pid) - before[k]) / TICK / span * 100 for k, (_, pid) in runs.items()}
        finally:
            for proc, _ in runs.values():
                stop(proc)
    print(f"CPU at steady state over {span} s (% of one core, {TICK} Hz ticks):")
    for k, v in used.items():
        print(f"  {k:42s} {v:.2f}%")
    far = used["memguard, far from floor (floor 1 GiB)"]
    print(f"  target far from floor < 0.5%: {'met' if far < 0.5 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
