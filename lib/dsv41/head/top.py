"""doit top: the cluster on one live screen, refreshed every --interval seconds (2): each node's
MemAvailable against its memory guard's floor, swap, the guard, the rank unit and its uptime, GPU
memory; the engine from vLLM's /metrics (requests, KV cache, token rates and latency percentiles over
the last interval); the cluster's Health (core.health, as status and the watchdog judge it: a recovery
under way shows as RECOVERING with its step); the watchdog's verdict and last incident. `q` or Ctrl-C quits and gives the
terminal back as it was. `--once` prints one snapshot as text, `--once --json` as JSON (SCHEMA) for
scripts; it scrapes /metrics twice, --interval apart, for the rates (`--interval 0`: once, rates null).

Nothing here waits on a node. Every refresh gives each node one probe (dsv41.node.probe: one ssh
round trip over the node's kept connection) as a child process that is polled, never waited for;
a node's first contact (its home, the node code shipped to it) also runs in a child, because the Node
layer is synchronous. A node that has not answered within SSH_TIMEOUT_S shows as STALE with the age of
its last answer, and is asked again at the next refresh, so it reappears when it answers again.

JSON (schema dsv41.top/3): {"schema", "time", "interval_s", "health": core.health.Health.as_json(), "nodes": {name: {"state": "ok" | "stale"
| "connecting", "seen_s_ago" (null: never answered), "error", "mem_total_bytes", "mem_available_bytes",
"floor_bytes", "above_floor_bytes", "memory": "ok" | "near floor" | "below floor" | null, "swap_total_bytes",
"swap_used_bytes", "guard": "active" | "observe" | "TRIPPED" | its unit state, "guard_mode", "tripped" (the
marker or null), "rank_unit", "rank_state", "rank_uptime_s", "gpu_memory" (nvidia-smi's text),
"gpu_used_bytes", "gpu_total_bytes"}}, "engine": {"url", "state": "ok" | "no answer" | "waiting",
"error", "seen_s_ago", "running", "waiting", "kv_cache_usage_pct", "prompt_tokens_per_s",
"generation_tokens_per_s", "ttft_p50_s", "ttft_p95_s", "itl_p50_s", "itl_p95_s", "preemptions_total",
"preemptions_in_interval", "interval_s"}, "watchdog": what `doit status --json` shows, "release":
core.release_status.service_entry()}. Sizes are
bytes, times seconds; a figure that is not known is null.
"""
import copy
import json as _json
import os
import pickle
import select
import signal
import sys
import termios
import threading
import time
import tty

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from dsv41 import names
from dsv41.client import metrics
from dsv41.errors import UserError, one_line
from dsv41.head.core.cluster import Cluster, ship_code
from dsv41.head.config import LIB_DIR
from dsv41.head.core import record, release_status
from dsv41.head.core.record import watchdog_entry, watchdog_line
from dsv41.head.core.health import Memory, Observation, assess
from dsv41.head.core.jobs import Job
from dsv41.head.core.state import NodeState, parse, unreachable

SCHEMA = "dsv41.top/3"
GIB, MIB = 1 << 30, 1 << 20
NEAR_FACTOR, NEAR_GIB = 2.0, 4.0    # MemAvailable under 2x the floor, or under 4 GiB above it: "near floor"
MIN_INTERVAL_S = 0.5
SCRAPE_TIMEOUT_S = 5.0
QUIT_KEYS = ("q", "Q")
PREPARE = "from dsv41.head.top import prepare_child; prepare_child()"


# ---- one node's figures (pure) ------------------------------------------------------------------

def memory_state(avail, floor):
    """"below floor", "near floor" (under NEAR_FACTOR x the floor or NEAR_GIB above it), "ok"; None
    when the floor is not known."""
    if avail is None or not floor:
        return None
    if avail < floor:
        return "below floor"
    return "near floor" if avail < NEAR_FACTOR * floor or avail - floor < NEAR_GIB * GIB else "ok"


def guard_state(node, mode):
    """TRIPPED while the trip marker exists; else "active" (enforcing) or "observe" for a running
    guard, or its unit's state (node: a NodeState)."""
    if node.tripped:
        return "TRIPPED"
    unit = node.unit(names.MEMGUARD_UNIT)
    if not unit.installed:
        return "not installed"
    state = unit.active or "?"
    return ("observe" if mode == "observe" else "active") if state == "active" else state


def gpu_figures(text):
    """(used bytes, total bytes) summed over nvidia-smi's "used, total" MiB lines; (None, None) when it
    reported nothing numeric (absent, or [N/A] where CPU and GPU share memory)."""
    used = total = 0.0
    found = False
    for line in (text or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            u, t = float(parts[0]), float(parts[1])
        except (ValueError, IndexError):
            continue
        used, total, found = used + u * MIB, total + t * MIB, True
    return (int(used), int(total)) if found else (None, None)


def node_figures(node, engine_units):
    """A node's row from its state (a NodeState from dsv41.node.probe, shipped by this run; figures it
    could not read, and the guard's without a memguard.json, are None); engine_units: the recipe's."""
    rank_unit = node.shown_unit(engine_units)
    mem = node.memory
    avail = mem.get("available_bytes")
    settings = node.guard_settings or {}
    floor_gib = settings.get("floor_gib")
    floor = int(floor_gib * GIB) if isinstance(floor_gib, (int, float)) and not isinstance(floor_gib, bool) else None
    mode = settings.get("mode", "enforce") if settings else None
    swap_total, swap_free = mem.get("swap_total_bytes"), mem.get("swap_free_bytes")
    age = node.age(rank_unit)                                               # the node's own clock
    gpu_used, gpu_total = gpu_figures(node.gpu_memory)
    return {
        "mem_total_bytes": mem.get("total_bytes"), "mem_available_bytes": avail, "floor_bytes": floor,
        "above_floor_bytes": avail - floor if avail is not None and floor else None,
        "memory": memory_state(avail, floor),
        "swap_total_bytes": swap_total,
        "swap_used_bytes": swap_total - swap_free if swap_total is not None and swap_free is not None else None,
        "guard": guard_state(node, mode), "guard_mode": mode, "tripped": node.tripped,
        "rank_unit": rank_unit,
        "rank_state": node.unit(rank_unit).state,
        "rank_uptime_s": None if age is None else max(0.0, round(age, 1)),
        "gpu_memory": node.gpu_memory, "gpu_used_bytes": gpu_used, "gpu_total_bytes": gpu_total,
    }


# ---- children, polled -----------------------------------------------------------------------------

def prepare_child():
    """(In a child process.) First contact with one node: its home, and the node code shipped to its
    state dir. Reads (cfg, node name) pickled on stdin; prints {"home": ...} or {"error": ...}."""
    cfg, name = pickle.load(sys.stdin.buffer)
    cl = Cluster(cfg)
    node = next(n for n in cl.nodes if n.name == name)
    try:
        cl.module(node, "probe")
        out = {"home": node.home()}
    except UserError as err:
        out = {"error": one_line(err, 600)}
    print(_json.dumps(out), flush=True)


class Watch:
    """What top knows about one node: its last state (seen) and when it came, why the last try failed,
    the child in flight."""

    def __init__(self, node, engine_units):
        self.node, self.engine_units = node, engine_units
        self.seen = self.at = self.error = self.job = self.kind = None
        self.ready = False               # home known and node code shipped in this run

    @property
    def state(self):
        if self.error:
            return "stale"
        return "ok" if self.seen is not None else "connecting"

    def view(self, now):
        v = {"state": self.state, "seen_s_ago": round(now - self.at, 1) if self.at else None, "error": self.error}
        v.update(node_figures(self.seen, self.engine_units) if self.seen is not None
                 else dict.fromkeys(node_figures(NodeState(), self.engine_units)))               # every figure None
        return v


class Scrape(threading.Thread):
    """The API's /health, then one GET of /metrics, on a daemon thread (requests is not the Node layer; an
    exit never waits for a scrape in flight)."""

    def __init__(self, url, client):
        super().__init__(daemon=True, name="scrape")
        self.url, self.client, self.snap, self.error, self.health = url, client, None, None, None
        self.start()

    def run(self):
        try:
            self.health = self.client.health()
            self.snap = metrics.scrape(self.url, SCRAPE_TIMEOUT_S)
        except UserError as err:
            self.error = one_line(err, 300)
        except Exception as err:  # noqa: BLE001 - shown on the screen, never a traceback over it
            self.error = one_line(f"{type(err).__name__}: {err}", 300)


class Top:
    def __init__(self, cfg, interval):
        self.cfg, self.interval = cfg, interval
        self.cl = Cluster(cfg)
        self.watches = {n.name: Watch(n, self.cl.engine_units(n)) for n in self.cl.nodes}
        self.url = self.cl.recipe.metrics_url()
        self.scrape = None
        self.prev = self.snap = None     # the last two snapshots that came back
        self.engine_error = None
        self.health = None               # the API's /health at the last scrape
        self.mem = Memory()              # what core.health remembers between scrapes
        self.scrapes = self.judged = 0   # scrapes that came back; the last one the memory has taken in

    # -- starting ------------------------------------------------------------------------------

    def start(self):
        """One refresh: each node without a child in flight gets one, the engine one scrape."""
        for w in self.watches.values():
            if w.job is None:
                self.start_node(w)
        self.start_scrape()

    def start_scrape(self):
        if self.scrape is None:
            self.scrape = Scrape(self.url, self.cl.api(read_timeout=SCRAPE_TIMEOUT_S))

    def start_node(self, w):
        node = w.node
        if not w.ready and node.is_local:
            try:
                ship_code(node, self.cl.paths(node).state_dir)   # (again after a failed probe): a local rsync
                w.ready = True
            except UserError as err:
                w.error = one_line(err, 600)
                return
        if not w.ready:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (LIB_DIR, os.environ.get("PYTHONPATH")) if p)}
            w.job, w.kind = Job([sys.executable, "-c", PREPARE], 3 * node.timeout_s + 10,
                                pickle.dumps((self.cfg, node.name)), env), "prepare"
            return
        state_dir = self.cl.paths(node).state_dir
        argv = self.cl.probe_argv(node, state_dir)
        w.job, w.kind = Job(node.argv_for(argv), node.timeout_s + 1), "probe"

    # -- collecting ----------------------------------------------------------------------------

    def poll(self):
        """Collect what finished; True when something changed."""
        changed = False
        for w in self.watches.values():
            res = w.job.poll() if w.job else None
            if res is None:
                continue
            changed, kind, w.job = True, w.kind, None
            (self.prepared if kind == "prepare" else self.probed)(w, *res)
        if self.scrape is not None and not self.scrape.is_alive():
            s, self.scrape, changed = self.scrape, None, True
            self.health, self.scrapes = s.health, self.scrapes + 1
            if s.snap is not None:
                self.prev, self.snap, self.engine_error = self.snap, s.snap, None
            else:
                self.engine_error = s.error
        return changed

    def prepared(self, w, code, out, err):
        node = w.node
        try:
            answer = _json.loads(out.strip().splitlines()[-1]) if code == 0 and out.strip() else {}
        except ValueError:
            answer = {}
        if code is None:
            w.error = node.silent(f"within {3 * node.timeout_s + 10} s")
        elif "home" in answer:
            node.assume_home(answer["home"])
            w.ready = True
            self.start_node(w)                          # its first probe, at once
        else:
            w.error = answer.get("error") or f"first contact with {node.label} failed: {_tail(err) or f'exit {code}'}"

    def probed(self, w, code, out, err):
        node = w.node
        if code is None:
            w.error = node.silent(f"within {node.timeout_s} s (SSH_TIMEOUT_S)")
        elif code == 0:
            try:
                w.seen, w.at, w.error = parse(out, node.label), time.time(), None
            except UserError as err:                    # no JSON, or not the probe's shape
                w.error = one_line(err, 300)
        elif code == 255 and not node.is_local:
            w.error = f"cannot reach {node.label}: {_tail(err) or 'ssh failed'}; check that {node.host} is up"
        else:
            w.ready = False                             # e.g. the node code was removed: ship it again
            w.error = f"the probe failed on {node.label} (exit {code}): {_tail(err) or 'no output'}"

    def busy(self):
        return self.scrape is not None or any(w.job for w in self.watches.values())

    def close(self):
        for w in self.watches.values():
            if w.job:
                w.job.kill()
                w.job = None

    # -- the snapshot --------------------------------------------------------------------------

    def judge(self, now):
        """The cluster's Health from what came back (a node not answered yet, or stale, is unknown)."""
        states = {name: w.seen if w.seen is not None and not w.error else unreachable(w.error or "no answer yet")
                  for name, w in self.watches.items()}
        obs = Observation(now, states, self.health, None if self.engine_error else self.snap, None,
                          ready_at=record.ready_at(self.cfg.state_dir), record=record.view(self.cfg.state_dir))
        mem = copy.deepcopy(self.mem)    # the screen is redrawn more often than it learns anything new:
        h = assess(self.cfg, obs, mem, self.cl.recipe)      # one look per scrape moves the memory on
        if self.scrapes != self.judged:
            self.mem, self.judged = mem, self.scrapes
        return h

    def view(self):
        now = time.time()
        state = "no answer" if self.engine_error else "ok" if self.snap is not None else "waiting"
        engine = {"url": self.url, "state": state, "error": self.engine_error,
                  "seen_s_ago": round(now - self.snap.time, 1) if self.snap else None}
        figures = metrics.engine(self.prev, self.snap) if self.snap is not None and not self.engine_error else None
        engine.update(figures or dict.fromkeys(metrics.engine(None, metrics.Snapshot(now))))
        head = self.watches[self.cl.head.name].seen
        return {"schema": SCHEMA, "time": now, "interval_s": self.interval, "health": self.judge(now).as_json(),
                "nodes": {name: w.view(now) for name, w in self.watches.items()},
                "engine": engine, "watchdog": watchdog_entry(self.cfg, head),
                "release": release_status.service_entry(self.cfg.state_dir)}


def _tail(text):
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return one_line(lines[-1], 300) if lines else ""


# ---- drawing ----------------------------------------------------------------------------------------

def _gib(n, digits=1):
    return "-" if n is None else f"{n / GIB:.{digits}f}"


def duration(s):
    if s is None:
        return "-"
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _ms(s):
    if s is None:
        return "-"
    return f"{s * 1000:.0f} ms" if s < 10 else f"{s:.1f} s"


def _num(v, fmt="{:.0f}"):
    return "-" if v is None else fmt.format(v)


MEMORY_STYLE = {"below floor": "bold red", "near floor": "bold yellow", "ok": "green"}
GUARD_STYLE = {"active": "green", "observe": "yellow", "TRIPPED": "bold red"}
VERDICT_STYLE = {"HEALTHY": "green", "BUSY": "green", "STARTING": "yellow", "STOPPED": "yellow",
                 "SUSPECT": "yellow", "UNKNOWN": "yellow"}


def nodes_table(view):
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, header_style="bold")
    for name, justify in (("node", "left"), ("seen", "left"), ("MemAvail GiB", "right"), ("floor", "right"),
                          ("above", "right"), ("swap GiB", "right"), ("guard", "left"), ("rank", "left"),
                          ("up", "right"), ("GPU mem GiB", "right")):
        t.add_column(name, justify=justify, no_wrap=True)
    for name, n in view["nodes"].items():
        if n["state"] == "connecting":
            seen = Text("connecting", style="yellow")
        elif n["state"] == "stale":
            seen = Text("STALE " + (f"{n['seen_s_ago']:.0f}s" if n["seen_s_ago"] is not None else "never seen"),
                        style="bold red")
        else:
            seen = Text(f"{n['seen_s_ago']:.0f}s ago")
        if n["mem_available_bytes"] is None:
            t.add_row(name, seen, *["-"] * 8)
            continue
        dim = "dim" if n["state"] == "stale" else ""
        above = n["above_floor_bytes"]
        swap = ("none" if not n["swap_total_bytes"] else
                f"{_gib(n['swap_used_bytes'])} / {_gib(n['swap_total_bytes'])}")
        gpu = (f"{_gib(n['gpu_used_bytes'])} / {_gib(n['gpu_total_bytes'])}" if n["gpu_total_bytes"] else
               "n/a" if n["gpu_memory"] else "-")
        rank_state = n["rank_state"]
        rank_style = ("green" if rank_state.startswith("active/")
                      else "yellow" if rank_state.startswith(("activating", "reloading"))
                      else "red" if rank_state.startswith("failed") else "")
        t.add_row(name, seen,
                  f"{_gib(n['mem_available_bytes'])} / {_gib(n['mem_total_bytes'])}",
                  _gib(n["floor_bytes"]),
                  Text("-" if above is None else f"{above / GIB:+.1f}", style=MEMORY_STYLE.get(n["memory"], "")),
                  swap,
                  Text(n["guard"], style=GUARD_STYLE.get(n["guard"], "red")),
                  Text(f"{n['rank_unit'].removesuffix('.service')} {rank_state}", style=rank_style),
                  duration(n["rank_uptime_s"]), gpu, style=dim)
    return t


def node_notes(view):
    lines = []
    for name, n in view["nodes"].items():
        if n["error"]:
            lines.append(Text(f"{name}: {n['error']}", style="red"))
        if n["tripped"]:
            lines.append(Text(f"{name}: memory guard {n['tripped']['line']}", style="bold red"))
    return lines


def engine_lines(view):
    e = view["engine"]
    head = Text.assemble(("engine ", "bold"), e["url"])
    if e["state"] != "ok":
        why = e["error"] or "waiting for the first answer"
        seen = f"; last answer {e['seen_s_ago']:.0f}s ago" if e["seen_s_ago"] is not None else ""
        return [head, Text(f"  {why}{seen}", style="red" if e["error"] else "yellow")]
    if e["running"] is None:
        return [head, Text("  /metrics answers but carries no vLLM series (vllm:num_requests_running)", style="yellow")]
    span = (f"over the last {e['interval_s']:.1f}s" if e["interval_s"] else "rates need a second scrape")
    head.append(f"   (rates and percentiles {span})", style="dim")
    g = Table.grid(padding=(0, 2))
    for _ in range(4):
        g.add_column()
    kv = e["kv_cache_usage_pct"]
    g.add_row("  requests", f"{_num(e['running'])} running, {_num(e['waiting'])} waiting",
              "KV cache", Text(_num(kv, "{:.1f} %"), style="bold yellow" if kv is not None and kv >= 90 else ""))
    g.add_row("  tokens/s", f"prompt {_num(e['prompt_tokens_per_s'], '{:.1f}')}, "
                            f"generation {_num(e['generation_tokens_per_s'], '{:.1f}')}",
              "preemptions", f"{_num(e['preemptions_total'])}"
                             + (f" (+{e['preemptions_in_interval']:.0f})" if e["preemptions_in_interval"] else ""))
    g.add_row("  TTFT", f"p50 {_ms(e['ttft_p50_s'])}, p95 {_ms(e['ttft_p95_s'])}",
              "inter-token", f"p50 {_ms(e['itl_p50_s'])}, p95 {_ms(e['itl_p95_s'])}")
    return [head, g]


def health_text(view):
    h = view["health"]
    style = VERDICT_STYLE.get(h["verdict"], "red")
    return Text(f"cluster: {h['word']} ({h['verdict']}): " + "; ".join(h["conditions"]), style=style)


def watchdog_text(view):
    w = view["watchdog"]
    line = watchdog_line(w)
    style = ("bold red" if w.get("gave_up") else "dim" if w["unit"] != "active"
             else VERDICT_STYLE.get(w.get("verdict"), "red" if "verdict" in w else ""))
    return Text(line, style=style)


def release_text(view):
    e = view.get("release")
    if e is None:                       # a view of an earlier version (kept frames)
        return Text("")
    return Text(release_status.service_line(e), style="bold red" if e.get("failed") or "error" in e else "")


def render(view, live=False):
    n = len(view["nodes"])
    clock = time.strftime("%H:%M:%S", time.localtime(view["time"]))
    every = f"every {view['interval_s']:g}s" if live else "one snapshot"
    title = Text.assemble(("dsv41 top", "bold"), f"   {n} node{'s' if n != 1 else ''}   {every}   {clock}")
    if live:
        title.append("   q quits", style="dim")
    return Group(title, Text(""), nodes_table(view), *node_notes(view), Text(""), *engine_lines(view), Text(""),
                 health_text(view), watchdog_text(view), release_text(view))


# ---- running -----------------------------------------------------------------------------------------

def run_once(t):
    """Every node probed once (or given up on at its deadline), /metrics scraped twice, the second
    --interval after the first answer (once when it is 0)."""
    t0 = time.time()
    t.start()
    second = t.interval <= 0
    while True:
        t.poll()
        if not second and t.scrape is None and time.time() - (t.snap.time if t.snap else t0) >= t.interval:
            t.start_scrape()
            second = True
        if second and not t.busy():
            return t.view()
        time.sleep(0.02)


def read_key(fd, timeout):
    if fd is None:
        time.sleep(timeout)
        return ""
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        return os.read(fd, 64).decode("utf-8", "ignore") if ready else ""
    except InterruptedError:
        return ""


def run_live(t, console):
    """Redraw when something came back (at least every second, for the ages and the clock); a new
    refresh every interval; `q`, Ctrl-C or SIGTERM ends it, the terminal restored."""
    stop, resized = threading.Event(), threading.Event()
    handlers = {signal.SIGINT: lambda *_: stop.set(), signal.SIGTERM: lambda *_: stop.set(),
                signal.SIGWINCH: lambda *_: resized.set()}
    saved_handlers = {sig: signal.signal(sig, h) for sig, h in handlers.items()}
    fd = sys.stdin.fileno() if sys.stdin.isatty() else None
    saved_tty = termios.tcgetattr(fd) if fd is not None else None
    try:
        if fd is not None:
            tty.setcbreak(fd)            # keys arrive at once and are not echoed; Ctrl-C still signals
        with Live(console=console, screen=True, auto_refresh=False, redirect_stdout=False,
                  redirect_stderr=False) as live:
            next_round = drawn = 0.0
            while not stop.is_set():
                now = time.monotonic()
                if now >= next_round:
                    t.start()
                    next_round = now + t.interval
                if t.poll() or resized.is_set() or now - drawn >= 1.0:
                    resized.clear()
                    live.update(render(t.view(), live=True), refresh=True)
                    drawn = now
                if any(k in QUIT_KEYS for k in read_key(fd, 0.1)):
                    break
    finally:
        if saved_tty is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved_tty)
        for sig, h in saved_handlers.items():
            signal.signal(sig, h)


def top(cfg, json=False, once=False, interval=2.0):
    """doit top [--interval S] [--once [--json]]"""
    if interval is None or interval != interval or interval < 0 or (not once and interval < MIN_INTERVAL_S):
        least = "0 (one scrape, no rates) with --once" if once else f"{MIN_INTERVAL_S:g}"
        raise UserError(f"--interval {interval!r} is not valid: expected seconds between refreshes, at least {least}")
    if json and not once:
        raise UserError("--json prints one snapshot: use it with --once (doit top --once --json)")
    t = Top(cfg, interval)
    try:
        if once:
            view = run_once(t)
            if json:
                print(_json.dumps(view, indent=2), flush=True)
            else:
                console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
                console.print(render(view))
            return
        console = Console(highlight=False)
        if not console.is_terminal:
            raise UserError("doit top draws a live screen and needs a terminal: in scripts use "
                            "`doit top --once` (text) or `doit top --once --json`")
        run_live(t, console)
    finally:
        t.close()
