"""Memory guard: real memory pressure, real processes, real signals.

The guard runs as PID 1 of a fresh PID namespace (`unshare --pid --mount-proc`), so its /proc holds
only the processes a test puts there (through `nsenter`) and nothing else on the machine can be
killed. MemAvailable is the machine's real one: the floor is set just under it and a hog process
allocates and touches pages until it crosses it (at most 2.5 GiB, released when the hog dies).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from dsv41.files import write_atomic
from dsv41.node.memguard import guard, marker, scan, textfile

LIB = str(Path(guard.__file__).resolve().parents[3])
REPO = Path(LIB).parent
GIB = 1 << 30
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d ")

# A process standing in for a rank container (the real one is a docker container running vLLM).
# HOG_FLOOR set: allocate and touch pages until MemAvailable is 256 MiB under the floor or
# HOG_LIMIT bytes are used, report the moment the floor was crossed, then hold the memory.
STANDIN = r"""
import mmap, os, sys, time
cg = os.environ.get("STANDIN_CGROUP")
if cg:
    with open(os.path.join(cg, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
print("ready", flush=True)
if os.environ.get("HOG_FLOOR"):
    floor, limit = int(os.environ["HOG_FLOOR"]), int(os.environ["HOG_LIMIT"])
    fd = os.open("/proc/meminfo", os.O_RDONLY)
    def avail():
        d = os.pread(fd, 16384, 0); i = d.index(b"MemAvailable:") + 13
        return int(d[i:d.index(b"\n", i)].split()[0]) * 1024
    mm = mmap.mmap(-1, limit, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    chunk, off, crossed = b"\1" * (4 << 20), 0, None
    while off < limit:
        mm[off:off + len(chunk)] = chunk
        off += len(chunk)
        a = avail()
        if crossed is None and a < floor:
            crossed = time.monotonic()
            print(f"crossed {crossed!r}", flush=True)
        if a < floor - (256 << 20):
            break
    print(f"holding {off}", flush=True)
time.sleep(600)
"""


def mem_available():
    return scan.MemInfo().available()


def need_pressure_rig():
    if os.geteuid() != 0:
        pytest.skip("needs root (PID namespaces, cgroups, killing stand-ins)")
    for tool in ("unshare", "nsenter"):
        if not shutil.which(tool):
            pytest.skip(f"needs {tool} (util-linux)")
    if mem_available() < 6 * GIB:
        pytest.skip("needs 6 GiB available to put a bounded 2.5 GiB of pressure on it")


def make_cgroup(cid):
    """A cgroup named like a docker container's scope (cgroup v1 pids hierarchy or v2)."""
    for root in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        if not os.path.isfile(os.path.join(root, "cgroup.procs")):
            continue
        path = os.path.join(root, f"dsv41-test-{cid[:8]}", f"docker-{cid}.scope")
        try:
            os.makedirs(path)
            return path
        except OSError:
            continue
    return None


def remove_cgroup(path):
    for _ in range(50):
        try:
            os.rmdir(path)
            os.rmdir(os.path.dirname(path))
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


def fake_systemctl(bindir, calls, listed="", fail=False):
    """Stand-in for systemctl (no systemd as PID 1 here): records its argv; list-units prints
    `listed`; with fail, exits 1 like systemctl without a bus."""
    bindir.mkdir(exist_ok=True)
    script, units = bindir / "systemctl", bindir / "list-units.txt"
    units.write_text(listed)
    body = (f'echo "$*" >> {calls}\n'
            + ('echo "Failed to connect to bus: No such file or directory" >&2; exit 1\n' if fail else
               f'case "$1" in list-units) cat {units};; esac\n'))
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)


class Node:
    """A stand-in node: the guard as PID 1 of its own PID namespace; stand-ins run inside it."""

    def __init__(self, tmp_path, floor_gib, mode="enforce", path=None, extra=()):
        self.state = tmp_path / "state"
        (self.state / "run").mkdir(parents=True, exist_ok=True)
        self.log = self.state / "memguard.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("DSV41_", "MEMGUARD"))}
        self.env["PYTHONPATH"] = LIB
        if path is not None:
            self.env["PATH"] = path
        self.proc = subprocess.Popen(
            [shutil.which("unshare"), "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, "-m",
             "dsv41.node.memguard", "--floor-gib", str(floor_gib), "--mode", mode,
             "--state-dir", str(self.state), *extra],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.standins = []
        self.wait_log("memguard started")
        kids = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        self.guard_pid = int(kids.split()[0])  # PID 1 of the namespace, seen from here

    def text(self):
        return self.log.read_text() if self.log.exists() else ""

    def wait_log(self, needle, timeout=20):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if needle in self.text():
                return self.text()
            if self.proc.poll() is not None:
                raise AssertionError(f"guard exited {self.proc.returncode}: {self.proc.stderr.read()!r}")
            time.sleep(0.05)
        raise AssertionError(f"{needle!r} not logged within {timeout}s:\n{self.text()}")

    def spawn(self, **env):
        """Start a stand-in inside the node's PID namespace; returns once it is ready."""
        p = subprocess.Popen([shutil.which("nsenter"), "--target", str(self.guard_pid), "--pid", "--",
                              sys.executable, "-c", STANDIN],
                             env={**self.env, **env}, stdout=subprocess.PIPE, text=True)
        self.standins.append(p)
        assert p.stdout.readline() == "ready\n"
        return p

    def close(self):
        for p in self.standins:
            if p.poll() is None:
                p.kill()
            p.wait()
        if self.proc.poll() is None:
            os.kill(self.guard_pid, signal.SIGTERM)  # unshare itself ignores SIGTERM
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # --kill-child takes the guard and its namespace along
                self.proc.wait()


@pytest.fixture
def nodes():
    made = []
    yield lambda *a, **kw: made.append(Node(*a, **kw)) or made[-1]
    for node in made:
        node.close()


def hog_env(floor_gib):
    return {"DSV41_RANK": "0", "HOG_FLOOR": str(int(floor_gib * GIB)), "HOG_LIMIT": str(5 * GIB // 2)}


def crossed_or_skip(hog):
    """The hog's first report: 'crossed' (or nothing, killed first); skip when other work on this
    machine freed so much memory that 2.5 GiB no longer reached the floor."""
    first = hog.stdout.readline()
    if first.startswith("holding"):
        pytest.skip("MemAvailable rose by over 1 GiB from other work during the test")
    return first


def test_trip_kills_rank_processes_writes_marker_and_stops_units(tmp_path, nodes):
    need_pressure_rig()
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    cgroup = make_cgroup(cid)  # None where cgroups are read-only: then only the env path is shown
    try:
        bindir, calls = tmp_path / "bin", tmp_path / "systemctl.calls"
        fake_systemctl(bindir, calls, listed="dsv41-r0.service loaded active running dsv41 rank 0\n"
                       "dsv41-r5.service loaded activating auto-restart dsv41 rank 5\n")
        floor = round((mem_available() - GIB) / GIB, 2)
        node = nodes(tmp_path, floor, path=f"{bindir}:{os.environ['PATH']}")
        (node.state / "run" / "dsv41-r1.cid").write_text(cid)
        in_cgroup = cgroup and node.spawn(STANDIN_CGROUP=cgroup)  # rank 1, found through its cgroup
        bystander = node.spawn()
        hog = node.spawn(**hog_env(floor))  # rank 0, found through DSV41_RANK=0
        crossed_or_skip(hog)
        assert hog.wait(30) == -signal.SIGKILL
        if cgroup:
            assert in_cgroup.wait(10) == -signal.SIGKILL
        assert bystander.poll() is None
        text = node.wait_log("trip marker")

        trip = marker.read_trip(node.state)
        assert trip["floor_gib"] == floor
        assert trip["mem_available_bytes"] < trip["floor_bytes"] == int(floor * GIB)
        assert {(k["rank"], k["how"], k["result"]) for k in trip["killed"]} == (
            {(0, "env", "killed")} | ({(1, "cgroup", "killed")} if cgroup else set()))
        assert trip["units"] == ["dsv41-r0.service", "dsv41-r1.service", "dsv41-r5.service"]
        assert trip["top"] and trip["trips"] == 1
        stops = [c for c in calls.read_text().splitlines() if c.startswith("stop")]
        assert sorted(stops) == [f"stop --no-block dsv41-r{n}.service" for n in (0, 1, 5)]

        line = next(ln for ln in text.splitlines() if "TRIP" in ln)
        m = re.search(r"MemAvailable (\d+\.\d+) GiB < floor (\d+\.\d+) GiB", line)
        assert m and float(m.group(2)) == floor and float(m.group(1)) < floor
        assert all(STAMP.match(ln) for ln in text.splitlines())

        # the hog's memory came back: the guard re-arms and keeps watching. Other work on this shared
        # machine may hold that memory for a while; the guard must then simply keep watching, and re-arm
        # within a few of its polls of the memory being back above the floor and its margin.
        rearm, end, back_since = floor * GIB + guard.REARM_GIB * GIB, time.monotonic() + 20, None
        while "re-armed" not in node.text():
            now = time.monotonic()
            back_since = (back_since or now) if mem_available() > rearm else None
            if back_since is None and now > end:
                break                                   # still held by other work: nothing to re-arm for
            assert back_since is None or now - back_since < 5 * guard.SLOW_S, \
                f"MemAvailable back above {rearm / GIB:.2f} GiB for {now - back_since:.1f} s, not re-armed"
            time.sleep(0.1)
        assert node.proc.poll() is None
    finally:
        if cgroup:
            remove_cgroup(cgroup)


def test_observe_mode_logs_once_and_kills_nothing(tmp_path, nodes):
    need_pressure_rig()
    bindir, calls = tmp_path / "bin", tmp_path / "systemctl.calls"
    fake_systemctl(bindir, calls, listed="dsv41-r0.service loaded active running x\n")
    floor = round((mem_available() - GIB) / GIB, 2)
    node = nodes(tmp_path, floor, mode="observe", path=f"{bindir}:{os.environ['PATH']}")
    hog = node.spawn(**hog_env(floor))
    assert crossed_or_skip(hog).startswith("crossed")
    assert hog.stdout.readline().startswith("holding")
    node.wait_log("TRIP (observe)")
    time.sleep(1.5)  # many polls below the floor: still one trip line
    text = node.text()
    assert hog.poll() is None
    assert text.count("TRIP") == 1
    assert re.search(r"would kill python3?\[\d+\] rank 0 .*and stop dsv41-r0\.service", text)
    assert marker.read_trip(node.state) is None
    assert "stop" not in calls.read_text()


def test_reload_takes_new_settings_without_a_restart(tmp_path, nodes):
    settings = tmp_path / "memguard.json"
    settings.write_text(json.dumps({"floor_gib": 0.25, "mode": "observe"}))
    node = nodes(tmp_path, 0.25, mode="observe", extra=["--settings", str(settings)])
    assert "TRIP" not in node.text()
    above = round(mem_available() / GIB + 4, 2)  # a floor above what is available: trips at once
    settings.write_text(json.dumps({"floor_gib": above, "mode": "observe"}))
    os.kill(node.guard_pid, signal.SIGHUP)
    node.wait_log(f"floor {above:.2f} GiB, mode observe")
    node.wait_log("TRIP (observe)")
    settings.write_text("{not json")
    os.kill(node.guard_pid, signal.SIGHUP)
    node.wait_log("ignored (Unreadable: ")
    assert node.proc.poll() is None  # same process throughout: no restart


@pytest.mark.parametrize("systemctl", ["missing", "failing"])
def test_guard_survives_its_own_errors(tmp_path, nodes, systemctl):
    need_pressure_rig()
    bindir, calls = tmp_path / "bin", tmp_path / "systemctl.calls"
    if systemctl == "failing":
        fake_systemctl(bindir, calls, fail=True)
    else:
        bindir.mkdir()
    # A floor above MemAvailable trips at once; the cidfile names a container that no longer exists.
    state = tmp_path / "state"
    (state / "run").mkdir(parents=True)
    (state / "run" / "dsv41-r3.cid").write_text("ab" * 32)
    (state / "run" / "dsv41-r4.cid").write_text("")  # not yet written by docker: matches nothing
    node = nodes(tmp_path, mem_available() / GIB + 4, path=str(bindir))
    bystander = node.spawn()
    text = node.wait_log("trip marker")
    assert "killed no rank processes" in text
    failure = "No such file" if systemctl == "missing" else "exit 1: Failed to connect to bus"
    assert failure in text
    assert bystander.poll() is None
    assert marker.read_trip(state)["units"] == ["dsv41-r3.service"]
    time.sleep(0.5)
    assert node.proc.poll() is None
    os.kill(node.guard_pid, signal.SIGTERM)
    assert node.proc.wait(10) == 0
    assert node.text().rstrip().endswith("memguard stopping (signal)")


def test_read_and_clear_trip(tmp_path):
    assert marker.read_trip(tmp_path) is None
    assert marker.clear_trip(tmp_path) is None
    write_atomic(marker.trip_path(tmp_path), json.dumps({"time": "t", "floor_gib": 1.0}).encode())
    assert marker.read_trip(tmp_path) == {"time": "t", "floor_gib": 1.0}
    assert marker.clear_trip(tmp_path)["time"] == "t"
    assert marker.read_trip(tmp_path) is None
    Path(marker.trip_path(tmp_path)).write_text("{half")
    assert "unreadable trip marker" in marker.read_trip(tmp_path)["error"]  # still a trip


def test_polls_fast_only_near_the_floor():
    assert guard.poll_interval(20 * GIB, 0) == 1.0
    assert guard.poll_interval(3 * GIB, 0) <= 0.1
    assert guard.poll_interval(0.2 * GIB, 0) < 0.05
    assert guard.poll_interval(3 * GIB, 100 * GIB) < guard.poll_interval(3 * GIB, 0)
    assert guard.poll_interval(-1, 0) == guard.MIN_S


@pytest.mark.parametrize("args,env,needle", [
    (["--floor-gib", "abc"], {}, "--floor-gib (MEMGUARD_GIB)='abc' is not valid: expected the memory guard's "
                                 "floor in GiB, a number from 0.1 to 1024"),
    ([], {"MEMGUARD_GIB": "-1"}, "(MEMGUARD_GIB)='-1' is not valid"),
    ([], {"MEMGUARD_GIB": "0"}, "(MEMGUARD_GIB)='0' is not valid"),
    (["--mode", "kill"], {}, "--mode (MEMGUARD_MODE)='kill' is not valid: expected enforce or observe"),
    (["--state-dir", "/proc/version/x"], {}, "cannot write"),
    (["--state-dir", "relative/dir"], {}, "--state-dir (STATE_DIR)='relative/dir' is not valid: expected an absolute"),
    (["--metrics-dir", "prom"], {}, "--metrics-dir (METRICS_DIR)='prom' is not valid: expected an absolute directory"),
    (["--state-dir", "/tmp", "--settings", "/nonexistent/memguard.json"], {},
     "--settings /nonexistent/memguard.json does not exist: run `doit launch`"),
])
def test_bad_input_is_one_line(args, env, needle):
    res = subprocess.run([sys.executable, "-m", "dsv41.node.memguard", *args],
                         env={**os.environ, "PYTHONPATH": LIB, **env},
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2
    assert res.stderr.startswith("dsv41: ") and needle in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_unit_template_verifies(tmp_path):
    from dsv41.head.core import commands, units
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze not installed (apt-get install systemd)")
    env = units.environment()
    text = env.get_template("dsv41-memguard.service.j2").render(memguard=commands.memguard_argv('/home/u/.dsv41 "x"%h'))
    unit = tmp_path / "dsv41-memguard.service"
    unit.write_text(text)
    res = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    for line in ("Type=exec", "Restart=always", "RestartSec=1", "OOMScoreAdjust=-1000",
                 """ExecStart=/usr/bin/env 'PYTHONPATH=/home/u/.dsv41 "x"%%h/lib' python3 -m dsv41.node.memguard """
                 """--settings '/home/u/.dsv41 "x"%%h/memguard.json' --state-dir '/home/u/.dsv41 "x"%%h'""",
                 "ExecReload=/bin/kill -HUP $MAINPID"):
        assert line in text.splitlines()
    with pytest.raises(Exception, match="memguard"):
        env.get_template("dsv41-memguard.service.j2").render()


def test_logs_top_memory_holders_when_low(tmp_path):
    # Here MemAvailable is far above 10 GiB: raise the threshold so the low-memory report runs now.
    code = "from dsv41.node.memguard import guard as m; m.TOP_BELOW_GIB = 1 << 20; m.main()"
    guard = subprocess.Popen([sys.executable, "-c", code, "--floor-gib", "0.5", "--state-dir", str(tmp_path)],
                             env={**os.environ, "PYTHONPATH": LIB}, stdout=subprocess.PIPE, text=True)
    try:
        lines = [guard.stdout.readline(), guard.stdout.readline()]
    finally:
        guard.send_signal(signal.SIGTERM)
        assert guard.wait(10) == 0
    assert all(STAMP.match(ln) for ln in lines)
    m = re.search(r"low memory: MemAvailable [\d.]+ GiB \(floor 0\.50 GiB\); top: (.*)", lines[1])
    assert m and len(re.findall(r"\S+\[\d+\] [\d.]+ GiB", m.group(1))) == 3
    assert (tmp_path / "memguard.log").read_text().splitlines()[:2] == [ln.rstrip("\n") for ln in lines]


# ---- textfile metrics (METRICS_DIR) -----------------------------------------------------------------

def prom(path, timeout=20, until=lambda m: True):
    """{sample name or name{label=value}: value} of the guard's .prom file once `until` holds, parsed
    with prometheus_client's parser (what node_exporter's textfile collector accepts)."""
    from prometheus_client.parser import text_string_to_metric_families
    end, m = time.monotonic() + timeout, None
    while time.monotonic() < end:
        if path.exists():
            fams = list(text_string_to_metric_families(path.read_text()))
            m = {s.name + "".join(f"{{{k}={v}}}" for k, v in s.labels.items()): s.value
                 for f in fams for s in f.samples}
            m["types"] = {f.name: f.type for f in fams}
            if until(m):
                return m
        time.sleep(0.05)
    raise AssertionError(f"{path} never showed what was expected: {m}")


def test_metrics_lines_are_prometheus_text_with_conventional_names():
    from prometheus_client.parser import text_string_to_metric_families
    text = "\n".join(textfile.metrics_lines(5 * GIB, GIB, "observe", 2, 1700000000.25, True)) + "\n"
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert {n: f.type for n, f in fams.items()} == {
        "dsv41_memguard_mem_available_bytes": "gauge", "dsv41_memguard_floor_bytes": "gauge",
        "dsv41_memguard_mode": "gauge", "dsv41_memguard_trips": "counter",
        "dsv41_memguard_last_trip_timestamp_seconds": "gauge", "dsv41_memguard_tripped": "gauge"}
    assert fams["dsv41_memguard_trips"].samples[0].name == "dsv41_memguard_trips_total"
    assert {s.labels["mode"]: s.value for s in fams["dsv41_memguard_mode"].samples} == {"enforce": 0, "observe": 1}
    assert fams["dsv41_memguard_last_trip_timestamp_seconds"].samples[0].value == 1700000000.25
    assert all(f.documentation for f in fams.values())


def test_observe_mode_trip_is_counted_in_the_metrics_file(tmp_path):
    # observe mode kills nothing, so the guard can run as a plain process; its floor is above
    # MemAvailable, so it trips at once
    floor = round(mem_available() / GIB + 4, 2)
    guard = subprocess.Popen([sys.executable, "-m", "dsv41.node.memguard", "--floor-gib", str(floor),
                              "--mode", "observe", "--state-dir", str(tmp_path / "state"),
                              "--metrics-dir", str(tmp_path / "textfile")],
                             env={**os.environ, "PYTHONPATH": LIB}, stdout=subprocess.DEVNULL)
    try:
        m = prom(tmp_path / "textfile" / "dsv41_memguard.prom", until=lambda m: m["dsv41_memguard_trips_total"] == 1)
    finally:
        guard.send_signal(signal.SIGTERM)
        assert guard.wait(10) == 0
    assert m["dsv41_memguard_floor_bytes"] == int(floor * GIB)
    assert 0 < m["dsv41_memguard_mem_available_bytes"] < m["dsv41_memguard_floor_bytes"]
    assert (m["dsv41_memguard_mode{mode=observe}"], m["dsv41_memguard_mode{mode=enforce}"]) == (1, 0)
    assert abs(m["dsv41_memguard_last_trip_timestamp_seconds"] - time.time()) < 600
    assert m["dsv41_memguard_tripped"] == 0                 # observe mode leaves no marker
    log = (tmp_path / "state" / "memguard.log").read_text()
    assert f"metrics in {tmp_path}/textfile/dsv41_memguard.prom every 5 s" in log
    assert not [p for p in (tmp_path / "textfile").iterdir() if p.name != "dsv41_memguard.prom"]  # no temp files


def test_enforced_trip_shows_tripped_and_metrics_follow_the_settings_file(tmp_path, nodes):
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        pytest.skip("needs root and util-linux (the guard in its own PID namespace)")
    bindir, calls = tmp_path / "bin", tmp_path / "systemctl.calls"
    fake_systemctl(bindir, calls)
    textfile = tmp_path / "textfile"
    settings = tmp_path / "memguard.json"
    settings.write_text(json.dumps({"floor_gib": 0.25, "mode": "enforce", "metrics_dir": str(textfile)}))
    node = nodes(tmp_path, 0.25, extra=["--settings", str(settings)], path=f"{bindir}:{os.environ['PATH']}")
    path = textfile / "dsv41_memguard.prom"
    m = prom(path)
    assert (m["dsv41_memguard_trips_total"], m["dsv41_memguard_tripped"]) == (0, 0)
    assert m["dsv41_memguard_last_trip_timestamp_seconds"] == 0 and m["dsv41_memguard_mode{mode=enforce}"] == 1

    above = round(mem_available() / GIB + 4, 2)          # a floor above MemAvailable: trips at once
    settings.write_text(json.dumps({"floor_gib": above, "mode": "enforce", "metrics_dir": str(textfile)}))
    os.kill(node.guard_pid, signal.SIGHUP)
    m = prom(path, until=lambda m: m["dsv41_memguard_trips_total"] == 1)
    assert m["dsv41_memguard_tripped"] == 1 and m["dsv41_memguard_floor_bytes"] == int(above * GIB)
    assert marker.read_trip(node.state)["trips"] == 1

    settings.write_text(json.dumps({"floor_gib": above, "mode": "enforce", "metrics_dir": "textfile"}))
    os.kill(node.guard_pid, signal.SIGHUP)
    node.wait_log("ignored (UserError: metrics_dir='textfile' is not valid: expected an absolute directory")

    settings.write_text(json.dumps({"floor_gib": above, "mode": "enforce"}))   # METRICS_DIR unset
    os.kill(node.guard_pid, signal.SIGHUP)
    node.wait_log("no metrics file (METRICS_DIR unset)")
    end = time.monotonic() + 10
    while path.exists() and time.monotonic() < end:
        time.sleep(0.05)
    assert not path.exists()                                 # nothing stale left for node_exporter
    assert node.proc.poll() is None

