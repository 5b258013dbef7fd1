"""doit status: every node's guard, rank unit, container and memory, the API's health, and the cluster's
Health (core.health, as the watchdog, top and launch judge it) as one word and an exit code a monitor can
use (core.health.WORDS; docs/operating.md lists them). A recovery under way is RECOVERING, with the step it is on.
The release in service, and one that failed after it, come from core.release_status."""
import json as _json
import sys
import time

from dsv41 import names
from dsv41.head.core import observe, release_status, silences, startup
from dsv41.head.core.cluster import Cluster
from dsv41.head.core.health import MEANING, STARTING, Memory, assess, stale_workers
from dsv41.head.core.record import last_startup, watchdog_entry, watchdog_line

SCHEMA = "dsv41.status/6"


def _when(stamp):
    """systemd's "@<unix seconds>" as local time, "" when never."""
    if not stamp or not stamp.startswith("@") or stamp == "@0":
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(stamp[1:])))


def node_entry(recipe, spec, f):
    """One node's row from its state (its engine unit: the recipe's, the first not active)."""
    parts = dict(recipe.parts(spec))
    unit = f.shown_unit(list(parts))
    g, u = f.unit(names.MEMGUARD_UNIT), f.unit(unit)
    c = f.container(parts[unit])
    return {
        "memguard": (g.active or "not installed") if g.installed else "not installed",
        "rank_unit": unit,
        "rank_state": u.state,
        "since": _when(u.active_enter if u.active == "active" else u.inactive_enter),
        "container": c.status if c else "none",
        "mem_available_gib": round(f.mem_available_kib / 2**20, 3),
        "gpu_memory": f.gpu_memory, "tripped": f.tripped,
        "caches": cache_entry(f.caches)}


def cache_entry(report):
    """A node's engine caches (node.facts.cache_report) as status shows them: {"image": the image's key,
    "bytes": {library: bytes}} (names.ENGINE_CACHES), or None when the node did not report them."""
    if not report:
        return None
    library = {folder: name for name, _, folder in names.ENGINE_CACHES}
    return {"image": report["key"], "bytes": {library[f]: v["bytes"] for f, v in report["libraries"].items()}}


def _size(n):
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}" if n < 10 * scale else f"{n / scale:.0f} {unit}"
    return f"{n} B"


def cache_line(e):
    """One node's caches in a line: the libraries that hold something, and the total."""
    if not e:
        return "caches: not reported"
    held = [f"{k} {_size(v)}" for k, v in e["bytes"].items() if v]
    if not held:
        return f"caches of image {e['image']}: empty (its first start compiles every kernel)"
    empty = len(e["bytes"]) - len(held)
    return (f"caches of image {e['image']}: {', '.join(held)}; {_size(sum(e['bytes'].values()))} in all"
            + (f" ({empty} empty)" if empty else ""))


def api_status(cl, problems=None):
    client = cl.engine_client(read_timeout=5, problems=problems)
    out = {"url": client.base, "health": client.health(), "models": None, "error": None}
    try:
        out["models"] = client.models()
    except Exception as err:  # noqa: BLE001 - any failure means "no models listed"
        out["error"] = f"/v1/models: {str(err).splitlines()[0][:200] if str(err) else type(err).__name__}"
    return out


def door_status(cl, head_state, problems):
    """What clients get at PORT: the gateway's unit, its door (open, or closed and why), the requests in
    flight, and /v1/models asked there with the client key `default`; None with GATEWAY=0."""
    if not cl.layout.door:
        return None
    u = head_state.unit(names.GATEWAY_UNIT) if head_state and not head_state.error else None
    out = {"url": cl.cfg.api_url, "unit": (u.active or "not installed") if u and u.installed else "not installed",
           "door": None, "reason": None, "in_flight": None, "health": None, "answer": None, "groups": None}
    state = cl.gateway.state(problems)
    if state:
        out.update(door=state["door"], reason=state["reason"] if state["door"] == "closed" else None,
                   in_flight=state["in_flight"], groups=state.get("groups"))
    client = cl.door_client(read_timeout=5, problems=problems)
    out["health"] = client.health()
    try:
        out["answer"] = "models " + ", ".join(client.models())
    except Exception as err:  # noqa: BLE001 - the answer clients get, whatever it is
        out["answer"] = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
    return out


def starting(cl, problems, now=None):
    """While the ranks start: the phase under way, read from rank 0's journal, for how long, and what it
    took the last time (the last start-up's record): {"line", "phase", "for_s", "last_s"}; None when the
    recipe reads no phases or the journal cannot be read."""
    units = cl.engine_units(cl.head)
    try:
        r = cl.journal(cl.head, units[0], check=False, since_s=cl.cfg.start_timeout_s + 300) if units else None
    except Exception:  # noqa: BLE001 - a journal it cannot read only leaves the line out
        r = None
    s = cl.recipe.startup(r.stdout) if r is not None and r.code == 0 else None
    if s is None:
        return None
    now = time.time() if now is None else now
    last = startup.from_record((last_startup(cl.cfg.state_dir, problems) or {}).get("phases"))
    return {"line": startup.under_way(s.current, s.since, now, last), "phase": s.current,
            "for_s": None if s.since is None else round(now - s.since, 1),
            "last_s": startup.seconds_of(last, s.current)}


def group_entries(cl, states, door, head_state, problems):
    """With GROUPS > 1, each serving group as its watchdog judges it: [({"group", "nodes", "url", "state",
    "verdict", "evidence", "exit_code", "at_door", "in_flight", "watchdog"}, its Health)] (at_door: its server's
    state at the door, UP, DOWN, MAINT or DRAIN); [] with one group."""
    if cl.cfg.groups == 1:
        return []
    at = (door or {}).get("groups") or {}
    out = []
    for g in cl.groups():
        api = api_status(g, problems)
        obs = observe.observation(g.cfg, {n.name: states[n.name] for n in g.nodes}, api["health"], problems=problems,
                                  api_error=None if api["models"] else (api["error"] or "/v1/models lists no model"))
        h = assess(g.cfg, obs, Memory(), g.recipe)
        server = at.get(names.door_server(g.cfg.scope, cl.cfg.groups)) or {}
        out.append(({"group": g.cfg.scope, "nodes": [s.name for s in g.cfg.nodes], "url": api["url"],
                     "state": h.word, "verdict": h.verdict.value, "evidence": h.evidence, "exit_code": h.exit_code,
                     "at_door": server.get("status"), "in_flight": server.get("in_flight"),
                     "watchdog": watchdog_entry(g.cfg, head_state, problems)}, h))
    return out


def group_line(e):
    door = f"at the door {e['at_door'] or '?'}" + ("" if e["in_flight"] is None else f", {e['in_flight']} in flight")
    return (f"group {e['group']} ({', '.join(e['nodes'])}): {e['state']}, {e['verdict']}: {e['evidence']}; {door}\n"
            f"  {watchdog_line(e['watchdog'])}")


def door_line(door):
    if door["unit"] != "active":
        return f"gateway {door['url']}: {door['unit']} (`doit launch` starts it)"
    state = "open" if door["door"] == "open" else f"closed: {door['reason']}"
    flight = "" if door["in_flight"] is None else f", {door['in_flight']} in flight"
    return f"gateway {door['url']}: door {state}{flight}; clients get {door['answer']}"


class Table:
    """The status table, printed a row at a time (a dead node must not hold back the others), one row a
    node; each node's caches after the rows (end())."""
    COLS = (("node", 10), ("memguard", 14), ("rank", 34), ("since", 19), ("container", 10))

    def __init__(self, enabled):
        self.enabled, self.caches = enabled, []
        if enabled:
            print(" ".join(f"{h:<{w}}" for h, w in self.COLS) + f" {'MemAvail':>10}  GPU mem", flush=True)

    def row(self, name, e):
        if not self.enabled:
            return
        if "error" in e:
            print(f"{name:<10} UNREACHABLE: {e['error']}", flush=True)
            return
        guard = "TRIPPED" if e["tripped"] else e["memguard"]
        cells = (name, guard, f"{e['rank_unit']} {e['rank_state']}", e["since"], e["container"])
        print(" ".join(f"{c:<{w}}" for c, (_, w) in zip(cells, self.COLS))
              + f" {e['mem_available_gib']:>6.1f} GiB  {e['gpu_memory'] or '-'}", flush=True)
        if e["tripped"]:
            print(f"{'':<10} memory guard {e['tripped']['line']}", flush=True)
        self.caches.append(f"{name}: {cache_line(e['caches'])}")

    def end(self):
        for line in self.caches if self.enabled else ():
            print(line, flush=True)


def status(cfg, json=False):
    history = release_status.history_of(cfg.state_dir)      # read once: the layout and the release line
    cfg, served = release_status.as_served(cfg, history)
    cl = Cluster(cfg)
    table = Table(not json)
    entries, states = {}, {}
    for i, node in enumerate(cl.nodes):
        if i == 1:
            cl.connect()                 # the workers at once, after the head's row is out
        states[node.name] = f = cl.look(node, caches=True)
        entries[node.name] = {"error": f.error} if f.error else node_entry(cl.recipe, cl.spec(node), f)
        table.row(node.name, entries[node.name])
    table.end()
    problems = []                        # state files that cannot be read: said, and read as absent
    api = api_status(cl, problems)
    door = door_status(cl, states.get(cl.head.name), problems)
    stale = stale_workers(cfg.nodes, cl.states, cl.recipe, cfg.groups_here)
    obs = observe.observation(cfg, states, api["health"], problems=problems,
                              api_error=None if api["models"] else (api["error"] or "/v1/models lists no model"))
    h = assess(cfg, obs, Memory(), cl.recipe)
    judged = group_entries(cl, states, door, cl.states.get(cl.head.name), problems)
    groups = [e for e, _ in judged]
    if judged:                  # the worst group's Health is the cluster's: a group down is a fault, others serving
        h = max(judged, key=lambda j: j[1].exit_code)[1]
    started = starting(cl, problems) if h.verdict == STARTING else None
    wd = watchdog_entry(cfg, cl.states.get(cl.head.name), problems)
    release = release_status.service_entry(cfg.state_dir, wd, history)
    if served:
        release["layout"] = served
    for line in problems:
        print(f"dsv41: {line}", file=sys.stderr, flush=True)
    quiet = silences.silence_line(cfg)
    if json:
        print(_json.dumps({"schema": SCHEMA, "state": h.word, "exit_code": h.exit_code, "health": h.as_json(),
                           "nodes": entries, "api": api, "gateway": door, "stale": stale, "watchdog": wd, "release": release,
                           "silenced": quiet, "startup": started, "groups": groups}, indent=2))
    else:
        for line in stale + ([served] if served else []):
            print(line)
        print(f"{'engine' if door else 'API'} {api['url']}: health {api['health'] or 'no answer'}, "
              f"models {', '.join(api['models'] or []) or '-'}")
        if door:
            print(door_line(door))
        for e in groups:
            print(group_line(e))
        if not groups:
            print(watchdog_line(wd))
        print(release_status.service_line(release))
        if quiet:
            print(quiet)
        foreign = door["health"] is not None and door["unit"] != "active" if door else api["models"] or api["health"]
        if h.word == "NOT RUNNING" and foreign:
            print(f"(something that is not dsv41 answers on port {cfg.port}: stop it, or set PORT, before `doit launch`)")
        print(f"{h.verdict}: {h.evidence}" + (f" ({h.why})" if h.why and h.verdict.value in ("DEGRADED", "DEAD", "WEDGED") else ""))
        if started:
            print(f"start-up: {started['line']}")
        print(f"{h.word}: {MEANING[h.word].format(memory=cl.recipe.memory_settings)}")
    if h.exit_code:
        raise SystemExit(h.exit_code)
