"""What doit top shows, gathered without waiting on a node: each node's figures from its probe, the
engine's /metrics snapshots, and the cluster's Health judged from the observation built of both
(core.observe.observation, as status, launch, the watchdog and the hold build theirs). doit top
(head/top.py) draws it; this module never draws.

Every refresh gives each node one probe (dsv41.node.probe: one ssh round trip over the node's kept
connection) as a child process that is polled, never waited for (core.jobs); a node's first contact
(its home, the node code shipped to it) also runs in a child, because the Node layer is synchronous.
A node that has not answered within SSH_TIMEOUT_S shows as STALE with the age of its last answer, and
is asked again at the next refresh, so it reappears when it answers again. The engine is scraped on a
daemon thread through the recipe (Recipe.scrape), and with the gateway its door is asked on another, once
a refresh (core.gateway.Gateway.state: a helper run on the head)."""
import copy
import json as _json
import os
import pickle
import sys
import threading
import time

from dsv41 import names
from dsv41.errors import UserError, one_line
from dsv41.head.core.cluster import Cluster, ship_code
from dsv41.settings.paths import LIB_DIR
from dsv41.head.core.health import Memory, assess
from dsv41.head.core.jobs import Job
from dsv41.head.core import observe
from dsv41.head.core.state import NodeState, parse, unreachable

GIB, MIB = 1 << 30, 1 << 20
NEAR_FACTOR, NEAR_GIB = 2.0, 4.0    # MemAvailable under 2x the floor, or under 4 GiB above it: "near floor"
SCRAPE_TIMEOUT_S = 5.0
PREPARE = "from dsv41.head.core.top_watch import prepare_child; prepare_child()"


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
    """The API's /health, then one GET of /metrics (Recipe.scrape), on a daemon thread (requests is not the
    Node layer; an exit never waits for a scrape in flight)."""

    def __init__(self, recipe, client):
        super().__init__(daemon=True, name="scrape")
        self.recipe, self.client, self.snap, self.error, self.health = recipe, client, None, None, None
        self.start()

    def run(self):
        try:
            self.health = self.client.health()
            self.snap = self.recipe.scrape(SCRAPE_TIMEOUT_S)
        except UserError as err:
            self.error = one_line(err, 300)
        except Exception as err:  # noqa: BLE001 - shown on the screen, never a traceback over it
            self.error = one_line(f"{type(err).__name__}: {err}", 300)


class Door(threading.Thread):
    """The gateway's door and its requests in flight (core.gateway.Gateway.state), on a daemon thread."""

    def __init__(self, cl):
        super().__init__(daemon=True, name="door")
        self.cl, self.state, self.error = cl, None, None
        self.start()

    def run(self):
        try:
            self.state = self.cl.gateway.state()
        except Exception as err:  # noqa: BLE001 - shown on the screen, never a traceback over it
            self.error = one_line(err if isinstance(err, UserError) else f"{type(err).__name__}: {err}", 300)


class Observer:
    """What top has seen of the cluster: each node's Watch, the engine's last two snapshots (prev, snap)
    or why the last scrape failed (engine_error), the API's /health, the gateway's door (door: its last
    answer, with when it came and why the last ask failed); started and polled by the screen."""

    def __init__(self, cfg, interval, recipe=None):
        self.cfg, self.interval = cfg, interval
        self.cl = Cluster(cfg, recipe=recipe)
        self.watches = {n.name: Watch(n, self.cl.engine_units(n)) for n in self.cl.nodes}
        self.url = self.cl.recipe.metrics_url()
        self.scrape = None
        self.prev = self.snap = None     # the last two snapshots that came back
        self.engine_error = None
        self.health = None               # the API's /health at the last scrape
        self.mem = Memory()              # what core.health remembers between scrapes
        self.scrapes = self.judged = 0   # scrapes that came back; the last one the memory has taken in
        self.problems = []               # state files that cannot be read (record.view), each said once
        self.asking = self.door = self.door_at = self.door_error = None     # the gateway's door (GATEWAY=1)

    # -- starting ------------------------------------------------------------------------------

    def start(self):
        """One refresh: each node without a child in flight gets one, the engine one scrape."""
        for w in self.watches.values():
            if w.job is None:
                self.start_node(w)
        self.start_scrape()
        if self.cfg.layout.door and self.asking is None and self.watches[self.cl.head.name].ready:
            self.asking = Door(self.cl)          # once the node code is on the head (never two copies at once)

    def start_scrape(self):
        if self.scrape is None:
            self.scrape = Scrape(self.cl.recipe, self.cl.engine_client(read_timeout=SCRAPE_TIMEOUT_S, problems=self.problems))

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
        if self.asking is not None and not self.asking.is_alive():
            d, self.asking, changed = self.asking, None, True
            self.door_error = d.error
            if d.state is not None:
                self.door, self.door_at = d.state, time.time()
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
        return self.scrape is not None or self.asking is not None or any(w.job for w in self.watches.values())

    def close(self):
        for w in self.watches.values():
            if w.job:
                w.job.kill()
                w.job = None

    def once(self):
        """Every node probed once (or given up on at its deadline), /metrics scraped twice, the second
        --interval after the first answer (once when it is 0)."""
        t0 = time.time()
        self.start()
        second = self.interval <= 0
        while True:
            self.poll()
            last = self.snap.time if self.snap else t0
            if not second and self.scrape is None and time.time() - last >= self.interval:
                self.start_scrape()
                second = True
            if second and not self.busy():
                return
            time.sleep(0.02)

    # -- what was seen -------------------------------------------------------------------------

    def nodes(self, now):
        """{node name: its figures, state, age and error} (top's "nodes")."""
        return {name: w.view(now) for name, w in self.watches.items()}

    def gateway(self, now):
        """top's "gateway": the door's last answer (door, reason, ready_at, in_flight, groups: None when no
        gateway runs), its age and why the last ask failed; None with GATEWAY=0."""
        if not self.cfg.layout.door:
            return None
        return {**dict.fromkeys(("door", "reason", "ready_at", "in_flight", "groups")), **(self.door or {}),
                "seen_s_ago": round(now - self.door_at, 1) if self.door_at else None, "error": self.door_error}

    def head(self):
        """The head's last NodeState, or None (record.watchdog_entry reads the watchdog's unit from it)."""
        return self.watches[self.cl.head.name].seen

    def judge(self, now):
        """The cluster's Health from what came back (a node not answered yet, or stale, is unknown)."""
        states = {name: w.seen if w.seen is not None and not w.error else unreachable(w.error or "no answer yet")
                  for name, w in self.watches.items()}
        obs = observe.observation(self.cfg, states, self.health, None if self.engine_error else self.snap,
                                  problems=self.problems, now=now)
        mem = copy.deepcopy(self.mem)    # the screen is redrawn more often than it learns anything new:
        h = assess(self.cfg, obs, mem, self.cl.recipe)      # one look per scrape moves the memory on
        if self.scrapes != self.judged:
            self.mem, self.judged = mem, self.scrapes
        return h


def _tail(text):
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return one_line(lines[-1], 300) if lines else ""
