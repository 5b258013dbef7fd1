"""doit status: every node's guard, rank unit, container and memory, the API's health, one verdict and
an exit code a monitor can use (EXIT_CODES; README lists them)."""
import json as _json
import time

from dsv41 import names
from dsv41.errors import UserError
from dsv41.head.core import recovery
from dsv41.head.core.cluster import Cluster
from dsv41.head.core.decide import stale_workers
from dsv41.head.core.watchdog_status import watchdog_entry, watchdog_line

SCHEMA = "dsv41.status/1"
# 2 is left to bad input (a config error), as for every dsv41 command
EXIT_CODES = {"READY": 0, "DEGRADED": 1, "NOT RUNNING": 3, "UNREACHABLE": 4, "TRIPPED": 5, "DOWN": 6,
              "NEEDS_REBOOT": 7}
MEANING = {
    "READY": "every rank is up and the API lists the model",
    "DEGRADED": "a rank is down or restarted on its own: `doit launch` restarts the ranks together",
    "NOT RUNNING": "nothing is running: start it with `doit launch`",
    "UNREACHABLE": "a node does not answer over ssh; its line above says what to check",
    "TRIPPED": "the memory guard stopped the ranks: lower KV_BYTES or GPU_UTIL, then `doit clear-trip` and `doit launch`",
    "DOWN": "ranks are up but the API does not answer: starting (see `doit logs r0`) or hung",
    "NEEDS_REBOOT": "a restart stopped the ranks and a node's memory did not come back, so nothing was started: "
                    "reboot that node (the watchdog and `doit launch` start the ranks once it is back; "
                    "`doit launch --force` starts them anyway)",
}


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
        "gpu_memory": f.gpu_memory, "tripped": f.tripped}


def api_status(cl):
    client = cl.api(read_timeout=5)
    out = {"url": client.base, "health": client.health(), "models": None}
    try:
        out["models"] = client.models()
    except Exception:  # noqa: BLE001 - any failure means "no models listed"
        pass
    return out


def verdict(nodes, api, stale):
    """The cluster's state from the node entries, the API's answer and the stale-worker lines (pure)."""
    if any("error" in e for e in nodes.values()):
        return "UNREACHABLE"
    if any(e["tripped"] for e in nodes.values()):
        return "TRIPPED"
    live = [e["rank_state"].split("/")[0] in ("active", "activating") for e in nodes.values()]
    if not any(live):                   # whatever answers on PORT, it is not a rank of ours
        return "NOT RUNNING"
    if not all(live) or stale:          # some ranks up, some not: whether or not the API answers
        return "DEGRADED"
    up = all(e["rank_state"].startswith("active/") and e["container"] == "running" for e in nodes.values())
    if api["models"]:
        return "READY" if up else "DEGRADED"
    return "DOWN"


def memory_short(cfg, states):
    """The NEEDS_REBOOT line while a restart waits for a node's memory (and it is still not back), else None."""
    marker = recovery.needs_reboot(cfg.state_dir)
    if not marker or len(states) < len(cfg.nodes):
        return None if not marker else marker["line"]
    check = recovery.check_now(cfg, states)
    return None if check.verdict == "OK" else (check.line() or marker["line"])


class Table:
    """The status table, printed a row at a time (a dead node must not hold back the others)."""
    COLS = (("node", 10), ("memguard", 14), ("rank", 34), ("since", 19), ("container", 10))

    def __init__(self, enabled):
        self.enabled = enabled
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


def status(cfg, json=False):
    cl = Cluster(cfg)
    table = Table(not json)
    entries = {}
    for i, node in enumerate(cl.nodes):
        if i == 1:
            cl.connect()                 # the workers at once, after the head's row is out
        try:
            entries[node.name] = node_entry(cl.recipe, cl.spec(node), cl.probe(node))
        except UserError as err:             # the node did not answer
            entries[node.name] = {"error": str(err)}
        table.row(node.name, entries[node.name])
    api = api_status(cl)
    stale = stale_workers(cfg.nodes, cl.states, cl.recipe)
    state = verdict(entries, api, stale)
    short = memory_short(cfg, cl.states) if state in ("NOT RUNNING", "DEGRADED") else None
    if short:
        state = "NEEDS_REBOOT"
    wd = watchdog_entry(cfg, cl.states.get(cl.head.name))
    if json:
        print(_json.dumps({"schema": SCHEMA, "state": state, "exit_code": EXIT_CODES[state], "nodes": entries,
                           "api": api, "stale": stale, "watchdog": wd, "needs_reboot": short}, indent=2))
    else:
        for line in stale:
            print(line)
        print(f"API {api['url']}: health {api['health'] or 'no answer'}, models {', '.join(api['models'] or []) or '-'}")
        print(watchdog_line(wd))
        if state == "NOT RUNNING" and (api["models"] or api["health"]):
            print(f"(something that is not dsv41 answers on port {cfg.port}: stop it, or set PORT, before `doit launch`)")
        if short:
            print(f"NEEDS_REBOOT: {short}")
        print(f"{state}: {MEANING[state]}")
    if EXIT_CODES[state]:
        raise SystemExit(EXIT_CODES[state])
