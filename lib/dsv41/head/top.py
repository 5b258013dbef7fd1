"""doit top: the cluster on one live screen, refreshed every --interval seconds (2): each node's
MemAvailable against its memory guard's floor, swap, the guard, the rank unit and its uptime, GPU
memory; the engine from its /metrics, by the recipe's series (requests, KV cache, token rates and latency
percentiles over the last interval); with the gateway, its door (open, or closed and why) and the
requests in flight at the engine; the cluster's Health (core.health, as status and the watchdog judge it: a recovery
under way shows as RECOVERING with its step); the watchdog's verdict and last incident. `q` or Ctrl-C quits and gives the
terminal back as it was. `--once` prints one snapshot as text, `--once --json` as JSON (SCHEMA) for
scripts; it scrapes /metrics twice, --interval apart, for the rates (`--interval 0`: once, rates null).

What is shown comes from core.top_watch, which never waits on a node (a frozen one shows as STALE with
the age of its last answer, and reappears when it answers again); this module draws it.

JSON (schema dsv41.top/4): {"schema", "time", "interval_s", "health": core.health.Health.as_json(), "nodes": {name: {"state": "ok" | "stale"
| "connecting", "seen_s_ago" (null: never answered), "error", "mem_total_bytes", "mem_available_bytes",
"floor_bytes", "above_floor_bytes", "memory": "ok" | "near floor" | "below floor" | null, "swap_total_bytes",
"swap_used_bytes", "guard": "active" | "observe" | "TRIPPED" | its unit state, "guard_mode", "tripped" (the
marker or null), "rank_unit", "rank_state", "rank_uptime_s", "gpu_memory" (nvidia-smi's text),
"gpu_used_bytes", "gpu_total_bytes"}}, "engine": {"url", "series" (the engine's running-requests series),
"state": "ok" | "no answer" | "waiting",
"error", "seen_s_ago", "running", "waiting", "kv_cache_usage_pct", "prompt_tokens_per_s",
"generation_tokens_per_s", "ttft_p50_s", "ttft_p95_s", "itl_p50_s", "itl_p95_s", "preemptions_total",
"preemptions_in_interval", "interval_s"}, "gateway": null (GATEWAY=0) | {"door": "open" | "closed" | null
(not answered yet), "reason", "ready_at" (when the engine is expected, 0: no estimate), "in_flight" (null: no
gateway runs), "groups" ({server: {"status", "in_flight"}} of each serving group, null: no gateway runs),
"seen_s_ago", "error"}, "watchdog": what `doit status --json` shows, "release":
core.release_status.service_entry()}. Sizes are
bytes, times seconds; a figure that is not known is null.
"""
import json as _json
import os
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
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from dsv41.client import metrics
from dsv41.errors import BadInput, UserError
from dsv41.head.core import release_status
from dsv41.head.core.top_watch import Observer
from dsv41.head.core.record import watchdog_entry, watchdog_line

SCHEMA = "dsv41.top/4"
GIB = 1 << 30
MIN_INTERVAL_S = 0.5
QUIT_KEYS = ("q", "Q")


def snapshot(o):
    """What top draws and --json prints (SCHEMA), from what the Observer o has seen."""
    now = time.time()
    wd = watchdog_entry(o.cfg, o.head(), o.problems)
    return {"schema": SCHEMA, "time": now, "interval_s": o.interval, "health": o.judge(now).as_json(),
            "nodes": o.nodes(now), "engine": engine_view(o, now), "gateway": o.gateway(now), "watchdog": wd,
            "release": release_status.service_entry(o.cfg.state_dir, wd)}


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


COLUMNS = (("node", "left"), ("seen", "left"), ("MemAvail GiB", "right"), ("floor", "right"), ("above", "right"),
           ("swap GiB", "right"), ("guard", "left"), ("rank", "left"), ("up", "right"), ("GPU mem GiB", "right"))
# a screen too narrow for COLUMNS (80 columns) gets two tables: the states, then the figures
NARROW = (("node", "seen", "guard", "rank", "up"), ("node", "MemAvail GiB", "floor", "above", "swap GiB", "GPU mem GiB"))


class NodesTable:
    """The nodes' table: one when it fits the screen, else NARROW's two, so that no name or state is cut."""

    def __init__(self, view):
        self.view = view

    def __rich_console__(self, console, options):
        whole = nodes_table(self.view)
        if Measurement.get(console, options.update_width(1000), whole).maximum <= options.max_width:
            yield whole
            return
        yield nodes_table(self.view, NARROW[0])
        yield Text("")
        yield nodes_table(self.view, NARROW[1])


def nodes_table(view, columns=tuple(name for name, _ in COLUMNS)):
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, header_style="bold", padding=(0, 1),
              collapse_padding=True)
    for name, justify in COLUMNS:
        if name in columns:
            t.add_column(name, justify=justify, no_wrap=True)
    for name, n in view["nodes"].items():
        cells, style = node_cells(name, n)
        t.add_row(*(cells.get(c, "-") for c in columns), style=style)
    return t


def node_cells(name, n):
    """{column: cell} of one node's row (a missing column shows "-"), and the row's style."""
    if n["state"] == "connecting":
        seen = Text("connecting", style="yellow")
    elif n["state"] == "stale":
        seen = Text("STALE " + (f"{n['seen_s_ago']:.0f}s" if n["seen_s_ago"] is not None else "never seen"),
                    style="bold red")
    else:
        seen = Text(f"{n['seen_s_ago']:.0f}s ago")
    if n["mem_available_bytes"] is None:
        return {"node": name, "seen": seen}, ""
    above = n["above_floor_bytes"]
    swap = ("none" if not n["swap_total_bytes"] else
            f"{_gib(n['swap_used_bytes'])} / {_gib(n['swap_total_bytes'])}")
    gpu = (f"{_gib(n['gpu_used_bytes'])} / {_gib(n['gpu_total_bytes'])}" if n["gpu_total_bytes"] else
           "n/a" if n["gpu_memory"] else "-")
    rank_state = n["rank_state"]
    rank_style = ("green" if rank_state.startswith("active/")
                  else "yellow" if rank_state.startswith(("activating", "reloading"))
                  else "red" if rank_state.startswith("failed") else "")
    return {"node": name, "seen": seen,
            "MemAvail GiB": f"{_gib(n['mem_available_bytes'])} / {_gib(n['mem_total_bytes'])}",
            "floor": _gib(n["floor_bytes"]),
            "above": Text("-" if above is None else f"{above / GIB:+.1f}", style=MEMORY_STYLE.get(n["memory"], "")),
            "swap GiB": swap, "guard": Text(n["guard"], style=GUARD_STYLE.get(n["guard"], "red")),
            "rank": Text(f"{n['rank_unit'].removesuffix('.service')} {rank_state}", style=rank_style),
            "up": duration(n["rank_uptime_s"]), "GPU mem GiB": gpu}, "dim" if n["state"] == "stale" else ""


def node_notes(view):
    lines = []
    for name, n in view["nodes"].items():
        if n["error"]:
            lines.append(Text(f"{name}: {n['error']}", style="red"))
        if n["tripped"]:
            lines.append(Text(f"{name}: memory guard {n['tripped']['line']}", style="bold red"))
    return lines


# ---- the engine: its /metrics, read by the series its recipe names ----------------------------------

def engine_view(o, now):
    """The "engine" entry: the last scrape's state and the engine's figures from the last two snapshots."""
    state = "no answer" if o.engine_error else "ok" if o.snap is not None else "waiting"
    series = o.cl.recipe.series
    engine = {"url": o.url, "series": series.running, "state": state, "error": o.engine_error,
              "seen_s_ago": round(now - o.snap.time, 1) if o.snap else None}
    figures = metrics.engine(o.prev, o.snap, series) if o.snap is not None and not o.engine_error else None
    engine.update(figures or dict.fromkeys(metrics.engine(None, metrics.Snapshot(now), series)))
    return engine


def engine_lines(view):
    e = view["engine"]
    head = Text.assemble(("engine ", "bold"), e["url"])
    if e["state"] != "ok":
        why = e["error"] or "waiting for the first answer"
        seen = f"; last answer {e['seen_s_ago']:.0f}s ago" if e["seen_s_ago"] is not None else ""
        return [head, Text(f"  {why}{seen}", style="red" if e["error"] else "yellow")]
    if e["running"] is None:
        return [head, Text(f"  /metrics answers but carries no engine series ({e['series']})", style="yellow")]
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


def gateway_text(view):
    """One line: the gateway's door (open, or closed, why and when the engine is expected) and the requests
    in flight at the engine (with several serving groups, each group's state and its own); None without a
    gateway."""
    g = view.get("gateway")
    if g is None:
        return None
    if g["error"]:
        return Text(f"gateway: cannot be asked: {g['error']}", style="red")
    if g["door"] is None:
        return Text("gateway: waiting for the first answer", style="yellow")
    door = "open"
    if g["door"] != "open":
        left = (g["ready_at"] or 0) - view["time"]
        door = f"closed ({g['reason']}" + (f"; ready in about {left:.0f} s" if left > 0 else "") + ")"
    if g["in_flight"] is None:
        return Text(f"gateway: not running: clients get no answer; door {door}", style="bold red")
    n = g["in_flight"]
    groups = g.get("groups") or {}
    each = "" if len(groups) < 2 else "; " + ", ".join(
        f"{name} {(v.get('status') or '?').split()[0]} {v.get('in_flight') or 0}" for name, v in sorted(groups.items()))
    up = all((v.get("status") or "").startswith("UP") for v in groups.values())
    return Text(f"gateway: door {door}, {n} request{'' if n == 1 else 's'} in flight{each}",
                style="green" if g["door"] == "open" and up else "yellow")


# ---- the rest of the screen ---------------------------------------------------------------------------

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
    gw = gateway_text(view)
    return Group(title, Text(""), NodesTable(view), *node_notes(view), Text(""), *engine_lines(view),
                 *([gw] if gw is not None else []), Text(""), health_text(view), watchdog_text(view),
                 release_text(view))


# ---- running -----------------------------------------------------------------------------------------

def read_key(fd, timeout):
    if fd is None:
        time.sleep(timeout)
        return ""
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        return os.read(fd, 64).decode("utf-8", "ignore") if ready else ""
    except InterruptedError:
        return ""


def run_live(o, console):
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
                    o.start()
                    next_round = now + o.interval
                if o.poll() or resized.is_set() or now - drawn >= 1.0:
                    resized.clear()
                    live.update(render(snapshot(o), live=True), refresh=True)
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
        raise BadInput(f"--interval {interval!r} is not valid: expected seconds between refreshes, at least {least}")
    if json and not once:
        raise BadInput("--json prints one snapshot: use it with --once (doit top --once --json)")
    o = Observer(release_status.as_served(cfg)[0], interval)    # the door the release in service runs
    try:
        if once:
            o.once()
            shot = snapshot(o)
            if json:
                print(_json.dumps(shot, indent=2), flush=True)
            else:
                console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
                console.print(render(shot))
            return
        console = Console(highlight=False)
        if not console.is_terminal:
            raise UserError("doit top draws a live screen and needs a terminal: in scripts use "
                            "`doit top --once` (text) or `doit top --once --json`")
        run_live(o, console)
    finally:
        o.close()
        for line in o.problems:          # a state file that cannot be read: read as absent, said here
            print(f"dsv41: {line}", file=sys.stderr, flush=True)
