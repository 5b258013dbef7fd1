"""doit top: the figures it derives from a node's probe, and the real command: `doit top --once --json`
and the live screen (through a pseudo-terminal, rendered by pyte) against a worker behind a real
loopback sshd and the stand-in engine run as local processes (rank 0's own API server, behind a gateway that
is not running here). A frozen node is a SIGSTOPped sshd."""
import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pyte
import pytest
from rich.console import Console

from dsv41 import names
from dsv41.errors import UserError
from dsv41.head import top
from dsv41.head.core import top_watch
from dsv41.settings.layers import load_config
from dsv41.head.core.desired import guard_settings
from dsv41.head.core.state import parse
from dsv41.head.core.health import Health, Verdict
from dsv41.head.watchdog import Watchdog
from sshd import need_sshd, start_sshd, stop_sshd
from dsv41.node import gateway as node_gateway
from test_standin_engine import Ranks, events, free_port, token_text

ROOT = Path(__file__).resolve().parents[1]
DOIT = [sys.executable, "-m", "doit", "-f", str(ROOT / "dodo.py")]
GIB = 1 << 30
COLS, ROWS = 120, 40
# what a frozen worker is reported as: top's own deadline, or ssh's (its master's keep-alive, the
# banner exchange), whichever ran out first
FROZEN = re.compile(r"worker1 \(root@127\.0\.0\.1\)(:| did not answer).*(within \d+ s|timed out|not responding)",
                    re.S)


# ---- figures from a probe ---------------------------------------------------------------------------

def real_probe(state_dir, **extra):
    """This machine's probe output (dsv41.node.probe run for real), with unit states laid over it
    (no dsv41 unit is installed here)."""
    req = {"state_dir": str(state_dir), "units": [], "containers": []}
    out = subprocess.run([sys.executable, "-m", "dsv41.node.probe", json.dumps(req)], check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "lib")}, capture_output=True, text=True).stdout
    facts = json.loads(out)
    facts.update(extra)
    return facts


def units(guard="active", rank="active", since=None):
    return {names.MEMGUARD_UNIT: {"installed": True, "ActiveState": guard, "SubState": "running"},
            "dsv41-r1.service": {"installed": True, "ActiveState": rank,
                                 "SubState": "running" if rank == "active" else "dead",
                                 "ActiveEnterTimestamp": f"@{since}" if since else ""}}


def test_probe_gives_memory_swap_and_the_guards_floor_and_mode(tmp_path):
    cfg = load_config({"STATE_DIR": str(tmp_path), "MEMGUARD_GIB": "2.5", "MEMGUARD_MODE": "observe"})
    (tmp_path / names.GUARD_SETTINGS).write_text(guard_settings(cfg))
    facts = real_probe(tmp_path, units=units(since=1000.0), time=1000.0 + 2 * 3600 + 3 * 60 + 4)
    f = top_watch.node_figures(parse(facts), ["dsv41-r1.service"])
    meminfo = dict(line.split(":") for line in Path("/proc/meminfo").read_text().splitlines())
    assert f["mem_total_bytes"] == int(meminfo["MemTotal"].split()[0]) * 1024
    assert f["swap_total_bytes"] == int(meminfo["SwapTotal"].split()[0]) * 1024 and f["swap_used_bytes"] >= 0
    assert 0 < f["mem_available_bytes"] <= f["mem_total_bytes"]
    assert f["floor_bytes"] == int(2.5 * GIB)
    assert f["above_floor_bytes"] == f["mem_available_bytes"] - f["floor_bytes"]
    assert (f["guard"], f["guard_mode"]) == ("observe", "observe")
    assert (f["rank_state"], f["rank_uptime_s"]) == ("active/running", 7384)
    assert top.duration(f["rank_uptime_s"]) == "2h03m"


@pytest.mark.parametrize("avail_gib,floor_gib,state", [
    (100, 1, "ok"), (5.5, 1, "ok"), (4.5, 1, "near floor"),    # within 4 GiB of the floor
    (30, 20, "near floor"), (41, 20, "ok"),                    # within 2x the floor
    (0.9, 1, "below floor")])
def test_memory_is_near_the_floor_within_2x_or_4_gib(avail_gib, floor_gib, state):
    assert top_watch.memory_state(avail_gib * GIB, floor_gib * GIB) == state


def test_guard_shows_tripped_observe_or_its_unit_state():
    assert top_watch.guard_state(parse({"units": units(), "tripped": {"time": "t"}}), "enforce") == "TRIPPED"
    assert top_watch.guard_state(parse({"units": units(), "tripped": None}), "enforce") == "active"
    assert top_watch.guard_state(parse({"units": units(), "tripped": None}), "observe") == "observe"
    assert top_watch.guard_state(parse({"units": units(guard="failed"), "tripped": None}), "enforce") == "failed"
    assert top_watch.guard_state(parse({"units": {}, "tripped": None}), None) == "not installed"


def test_gpu_memory_where_nvidia_smi_reports_it():
    assert top_watch.gpu_figures("1024, 2048\n512, 2048\n") == (1536 << 20, 4096 << 20)
    assert top_watch.gpu_figures("[N/A], [N/A]") == (None, None)       # one pool shared with the CPU
    assert top_watch.gpu_figures(None) == (None, None)


def sample_view(tmp_path):
    """head up, worker1 stale, engine not answering: the view run_once() gives."""
    cfg = load_config({"STATE_DIR": str(tmp_path), "MEMGUARD_GIB": "1"})
    (tmp_path / names.GUARD_SETTINGS).write_text(guard_settings(cfg))
    facts = real_probe(tmp_path, units=units(since=1.0), time=61.0)
    facts["memory"]["available_bytes"] = int(3.5 * GIB)      # 2.5 GiB above a 1 GiB floor
    view = {"time": time.time(), "interval_s": 2.0,
            "nodes": {"head": {**top_watch.node_figures(parse(facts), ["dsv41-r1.service"]), "state": "ok", "seen_s_ago": 1.0,
                               "error": None},
                      "worker1": {**top_watch.node_figures(parse(facts), ["dsv41-r1.service"]), "state": "stale", "seen_s_ago": 14.2,
                                  "error": "worker1 (u@w) did not answer within 10 s (SSH_TIMEOUT_S)"}},
            "engine": {"url": "http://h:8000/metrics", "state": "no answer", "seen_s_ago": None,
                       "error": "no answer from http://h:8000/metrics (connection refused)"},
            "health": Health(Verdict.UNKNOWN, ("no fresh facts from worker1",), "worker1").as_json(),
            "watchdog": {"enabled": True, "unit": "active", "verdict": "HEALTHY", "time": time.time(),
                         "evidence": "every rank is up"}}
    return view


def test_near_floor_is_coloured_and_a_stale_node_says_since_when(tmp_path):
    view = sample_view(tmp_path)
    console = Console(force_terminal=True, color_system="standard", width=COLS, record=True)
    console.print(top.render(view))
    text = console.export_text(clear=False)
    assert re.search(r"\x1b\[1;33m *\+2\.5\x1b\[0m", console.export_text(styles=True))     # bold yellow
    head = next(ln for ln in text.splitlines() if ln.startswith("head"))
    assert head.split()[:7] == ["head", "1s", "ago", "3.5", "/", head.split()[5], "1.0"]
    assert "r1 active/running" in head and "1m00s" in head
    assert next(ln for ln in text.splitlines() if ln.startswith("worker1 ")).split()[1:3] == ["STALE", "14s"]
    assert "worker1: worker1 (u@w) did not answer within 10 s (SSH_TIMEOUT_S)" in text
    assert "no answer from http://h:8000/metrics (connection refused)" in text
    assert "watchdog: active, saw HEALTHY 0 s ago: every rank is up" in text


def test_at_80_columns_every_name_state_and_figure_is_whole(tmp_path):
    view = sample_view(tmp_path)
    view["nodes"]["worker2"] = {"state": "connecting", "seen_s_ago": None, "mem_available_bytes": None,
                                "error": None, "tripped": None}
    console = Console(width=80, record=True)
    console.print(top.render(view))
    text = console.export_text()
    assert "…" not in text and max(len(ln) for ln in text.splitlines()) <= 80, text
    rows = [ln.split() for ln in text.splitlines() if ln.startswith(("head ", "worker1 ", "worker2 "))]
    assert [r[:3] for r in rows[:3]] == [["head", "1s", "ago"], ["worker1", "STALE", "14s"], ["worker2", "connecting", "-"]]
    assert all("dsv41-r1 active/running" in " ".join(r) for r in rows[:2]), text
    assert [r[:3] for r in rows[3:]] == [["head", "3.5", "/"], ["worker1", "3.5", "/"], ["worker2", "-", "-"]], text


def gateway_line(view):
    console = Console(width=COLS, record=True)
    console.print(top.render(view))
    return [ln.rstrip() for ln in console.export_text().splitlines() if ln.startswith("gateway")]


def test_the_gateway_is_one_line_its_door_and_the_requests_in_flight(tmp_path):
    view = sample_view(tmp_path)
    assert gateway_line(view) == []                                   # GATEWAY=0: no line
    door = {"door": "open", "reason": "-", "ready_at": 0, "in_flight": 2, "seen_s_ago": 1.0, "error": None}
    view["gateway"] = door
    assert gateway_line(view) == ["gateway: door open, 2 requests in flight"]
    view["gateway"] = {**door, "door": "closed", "reason": "recovering from DEAD", "ready_at": view["time"] + 40.2,
                       "in_flight": 1}
    assert gateway_line(view) == [
        "gateway: door closed (recovering from DEAD; ready in about 40 s), 1 request in flight"]
    view["gateway"] = {**door, "door": "closed", "reason": "stopped by `doit stop`", "in_flight": None}
    assert gateway_line(view) == ["gateway: not running: clients get no answer; door closed (stopped by `doit stop`)"]
    view["gateway"] = {**door, "door": None, "in_flight": None, "error": "gateway: the helper failed"}
    assert gateway_line(view) == ["gateway: cannot be asked: gateway: the helper failed"]


@pytest.mark.parametrize("args,needle", [
    (["--interval", "0.1"], "--interval 0.1 is not valid: expected seconds between refreshes, at least 0.5"),
    (["--json"], "--json prints one snapshot: use it with --once"),
    (["--once", "--interval", "-1"], "--interval -1.0 is not valid: expected seconds between refreshes, at least 0 "),
    ([], "doit top draws a live screen and needs a terminal: in scripts use `doit top --once`"),
])
def test_bad_input_is_one_line(tmp_path, args, needle):
    env = {k: v for k, v in os.environ.items() if k not in ("WORKER", "WORKERS", "DSV41_PROFILE")}
    r = subprocess.run(DOIT + ["top", *args], env={**env, "STATE_DIR": str(tmp_path)}, capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == (2 if args else 1) and r.stdout == ""      # bad input 2; no terminal: it failed
    [line] = [ln for ln in r.stderr.splitlines() if ln.startswith("dsv41: ")]
    assert line.startswith(f"dsv41: top: {needle}") and "Traceback" not in r.stderr


# ---- the real command: a worker behind a loopback sshd, the stand-in engine ---------------------------

class Cluster:
    """The head here, worker1 behind its own loopback sshd (frozen with SIGSTOP), the stand-in engine as
    rank 0 on ENGINE_PORT (no gateway runs on PORT), the guard's settings and the watchdog's status file in
    place."""

    def __init__(self, tmp):
        self.tmp = tmp
        (tmp / "sshd").mkdir()
        self.sshd, ssh = start_sshd(tmp / "sshd")
        (tmp / "engine").mkdir()
        self.engine = Ranks(tmp / "engine", args=["--max-num-seqs", "1"]).up()
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("WORKER", "WORKERS", "DSV41_PROFILE", "COLUMNS", "LINES", "METRICS_DIR")}
        self.env.update(WORKER=ssh.target, SSH_OPTS=ssh.ssh_opts, STATE_DIR=str(tmp / "state"),
                        MODEL_DIR=str(tmp / "model"), HEAD_IP="127.0.0.1", PORT=str(free_port()),
                        ENGINE_PORT=str(self.engine.port),
                        SSH_TIMEOUT_S="2", MEMGUARD_GIB="1.5")
        cfg = load_config(self.env)
        (tmp / "state").mkdir()
        (tmp / "state" / names.GUARD_SETTINGS).write_text(guard_settings(cfg))
        Watchdog(cfg, log=lambda msg: None).publish(Health(Verdict.HEALTHY, ("every rank is up and a token came back",)))
        self.frozen = []

    def procs(self):
        """The sshd listener and every session it forked (a frozen node answers nothing)."""
        kids, todo = [], [self.sshd.pid]
        while todo:
            pid = todo.pop()
            kids.append(pid)
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        return kids

    def freeze(self):
        self.frozen = self.procs()
        for pid in self.frozen:
            os.kill(pid, signal.SIGSTOP)

    def thaw(self):
        for pid in self.frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.frozen = []

    def streams(self):
        """Two long requests with room for one: one running, one waiting, tokens flowing."""
        s1, s2 = self.engine.stream("count to 3000"), self.engine.stream("count to 3000")
        next(e for e in events(s1) if token_text(e))
        return s1, s2

    def close(self):
        self.thaw()
        self.engine.stop()
        stop_sshd(self.sshd)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    need_sshd()
    c = Cluster(tmp_path_factory.mktemp("top"))
    yield c
    c.close()


def top_once(cluster, *args):
    r = subprocess.run(DOIT + ["top", "--once", "--json", *args], env=cluster.env, capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_once_json_shows_nodes_engine_watchdog_and_a_frozen_worker_as_stale(cluster):
    s1, s2 = cluster.streams()
    try:
        v = top_once(cluster, "--interval", "1")
    finally:
        s1.close()
        s2.close()
    assert v["schema"] == "dsv41.top/4" and v["interval_s"] == 1.0
    assert list(v["nodes"]) == ["head", "worker1"]
    for name, n in v["nodes"].items():
        assert (n["state"], n["error"]) == ("ok", None), (name, n)
        assert n["floor_bytes"] == int(1.5 * GIB) and n["guard_mode"] == "enforce"
        assert 0 < n["mem_available_bytes"] <= n["mem_total_bytes"]
        assert n["above_floor_bytes"] == n["mem_available_bytes"] - n["floor_bytes"]
        assert n["guard"] == "not installed" and n["rank_state"] == "not installed"   # no units here
    assert v["nodes"]["worker1"]["rank_unit"] == "dsv41-r1.service"
    e = v["engine"]
    assert e["url"] == f"http://127.0.0.1:{cluster.engine.port}/metrics" and e["state"] == "ok"
    assert (e["running"], e["waiting"]) == (1, 1)
    assert 0 < e["kv_cache_usage_pct"] < 100
    assert e["interval_s"] >= 1 and e["generation_tokens_per_s"] > 0 and e["itl_p50_s"] > 0
    assert e["preemptions_in_interval"] == 0
    assert v["watchdog"]["verdict"] == "HEALTHY" and v["watchdog"]["evidence"].startswith("every rank is up")
    assert v["health"]["verdict"] == "STOPPED" and v["health"]["word"] == "NOT RUNNING"      # no units here
    g = v["gateway"]
    assert (g["door"], g["in_flight"], g["error"]) == ("open", None, None) and g["seen_s_ago"] < 60   # none runs

    cluster.freeze()
    try:
        v = top_once(cluster, "--interval", "0")
    finally:
        cluster.thaw()
    w = v["nodes"]["worker1"]
    assert w["state"] == "stale" and w["seen_s_ago"] is None and w["mem_available_bytes"] is None
    assert FROZEN.search(w["error"]), w["error"]
    assert v["nodes"]["head"]["state"] == "ok"                      # the rest of the screen is fresh
    assert v["health"]["verdict"] == "UNKNOWN" and v["health"]["node"] == "worker1"    # judged as status judges it
    assert v["engine"]["state"] == "ok" and v["engine"]["generation_tokens_per_s"] is None   # one scrape: no rates


def test_once_shows_the_door_as_the_gateways_state_file_says(cluster):
    state = str(cluster.tmp / "state")
    node_gateway.set_door(state, "closed", "release 7 rolling out", time.time() + 30, str(cluster.tmp / "none.sock"))
    try:
        r = subprocess.run(DOIT + ["top", "--once", "--interval", "0"], env=cluster.env, capture_output=True,
                           text=True, timeout=120, stdin=subprocess.DEVNULL)
    finally:
        node_gateway.set_door(state, "open", "", 0, str(cluster.tmp / "none.sock"))
    assert r.returncode == 0, r.stderr
    [line] = [ln.strip() for ln in r.stdout.splitlines() if ln.startswith("gateway")]
    m = re.fullmatch(r"gateway: not running: clients get no answer; door closed \(release 7 rolling out; "
                     r"ready in about (\d+) s\)", line)
    assert m and 10 <= int(m.group(1)) <= 30, line


class Terminal:
    """doit top in a pseudo-terminal of COLS x ROWS, its output rendered by pyte."""

    def __init__(self, argv, env):
        self.screen = pyte.Screen(COLS, ROWS)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = b""
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
            os.execvpe(argv[0], argv, {**env, "TERM": "xterm-256color"})
        self.before = termios.tcgetattr(self.fd)
        self.code = None

    def pump(self, timeout=0.1):
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            try:
                data = os.read(self.fd, 65536)
            except OSError:          # EIO: the child is gone
                data = b""
            self.raw += data
            self.stream.feed(data)

    def text(self):
        return "\n".join(self.screen.display)

    def row(self, start):
        return next((ln for ln in self.screen.display if ln.startswith(start)), "")

    def wait_for(self, what, timeout=60):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.pump()
            if what(self):
                return self.text()
        raise AssertionError(f"screen never showed it:\n{self.text()}")

    def wait_exit(self, timeout=20):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.pump()
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.pump(0)
                self.code = os.waitstatus_to_exitcode(status)
                return self.code
        raise AssertionError(f"doit top did not exit:\n{self.text()}")

    def close(self):
        if self.code is None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.fd)


@pytest.fixture
def terminal(cluster):
    made = []

    def start(*args):
        made.append(Terminal(DOIT + ["top", *args], cluster.env))
        return made[-1]
    yield start
    for t in made:
        t.close()


def clock(t):
    return t.screen.display[0].split()[-3] if "dsv41 top" in t.screen.display[0] else None


def test_live_screen_shows_every_field_keeps_going_while_a_node_is_frozen_and_q_restores_the_terminal(
        cluster, terminal):
    t = terminal("--interval", "0.5")
    s1, s2 = cluster.streams()
    try:
        text = t.wait_for(lambda t: "ago" in t.row("worker1 ") and "1 running, 1 waiting" in t.text()
                          and "generation 0.0" not in t.text() and re.search(r"inter-token +p50 \d", t.text()))
    finally:
        s1.close()
        s2.close()
    assert "dsv41 top   2 nodes   every 0.5s" in text and "q quits" in text
    header = t.row("node ").split()
    assert header == ["node", "seen", "MemAvail", "GiB", "floor", "above", "swap", "GiB", "guard", "rank", "up",
                      "GPU", "mem", "GiB"]
    for name, rank in (("head ", "dsv41-r0"), ("worker1 ", "dsv41-r1")):
        cells = t.row(name).split()
        assert cells[1:3][1] == "ago" and cells[4] == "/" and cells[6] == "1.5", cells   # MemAvail / total, floor
        assert float(cells[3]) - 1.5 == pytest.approx(float(cells[7]), abs=0.11)        # above the floor
        assert f"{rank} not installed" in t.row(name)
    assert f"engine http://127.0.0.1:{cluster.engine.port}/metrics" in text
    assert re.search(r"requests +1 running, 1 waiting +KV cache +\d+\.\d %", text)
    assert re.search(r"tokens/s +prompt \d+\.\d, generation \d+\.\d +preemptions +0", text)
    assert re.search(r"TTFT +p50 (-|\d+ ms), p95 (-|\d+ ms) +inter-token +p50 \d+ ms, p95 \d+ ms", text)
    assert "watchdog: not installed" in text and "saw HEALTHY" not in text    # no stale verdict from a stopped one
    assert "gateway: not running: clients get no answer; door open" in text

    cluster.freeze()
    try:
        t.wait_for(lambda t: "STALE" in t.row("worker1 "), timeout=30)
        assert FROZEN.search(t.text()), t.text()
        first = clock(t)
        t.wait_for(lambda t: clock(t) != first and "STALE" in t.row("worker1 "))   # still drawing
        assert "ago" in t.row("head ")
    finally:
        cluster.thaw()
    t.wait_for(lambda t: "ago" in t.row("worker1 "), timeout=60)                 # back by itself

    assert termios.tcgetattr(t.fd)[3] & (termios.ECHO | termios.ICANON) == 0     # keys unechoed meanwhile
    os.write(t.fd, b"q")
    assert t.wait_exit() == 0
    assert t.raw.rindex(b"\x1b[?1049l") > t.raw.rindex(b"\x1b[?1049h")         # the screen given back
    assert t.raw.rindex(b"\x1b[?25h") > t.raw.rindex(b"\x1b[?25l")              # the cursor shown again
    assert termios.tcgetattr(t.fd) == t.before                                   # echo, line mode as before


def test_ctrl_c_quits_cleanly_too(cluster, terminal):
    t = terminal()
    t.wait_for(lambda t: "ago" in t.row("head "))
    os.write(t.fd, b"\x03")
    assert t.wait_exit() == 0
    assert b"Traceback" not in t.raw and b"interrupted" not in t.raw
    assert t.raw.rindex(b"\x1b[?1049l") > t.raw.rindex(b"\x1b[?1049h")
    assert termios.tcgetattr(t.fd) == t.before


def test_the_probes_answer_is_parsed_once_and_a_foreign_one_is_one_line(tmp_path):
    state = parse(json.dumps(real_probe(tmp_path, units=units(since=1000.0), time=1060.0)), "worker1")
    assert state.unit("dsv41-r1.service").state == "active/running" and state.age("dsv41-r1.service") == 60.0
    assert state.unit("dsv41-r9.service").state == "not installed" and state.memory["total_bytes"] > 0
    for answer, why in [("Traceback (most recent call last):", "printed no JSON"),
                        ('{"units": [1, 2]}', "not what this version expects")]:
        with pytest.raises(UserError, match=why) as e:
            parse(answer, "worker1 (u@w)")
        assert str(e.value).startswith("worker1 (u@w): ") and "\n" not in str(e.value)
