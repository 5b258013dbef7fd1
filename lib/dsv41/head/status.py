"""doit status: every node's guard, rank unit, container and memory, the API's health, one verdict."""
import json as _json
import time

from dsv41 import names
from dsv41.client.api import Client
from dsv41.errors import one_line
from dsv41.head.cluster import Cluster
from dsv41.head.decide import stale_workers
from dsv41.head.desired import read_key
from dsv41.head.nodes import NodeError


def _when(stamp):
    """systemd's "@<unix seconds>" as local time, "" when never."""
    if not stamp or not stamp.startswith("@") or stamp == "@0":
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(stamp[1:])))


def node_entry(spec, f):
    """One node's row from its probe facts."""
    unit = names.rank_unit(spec.rank)
    g, u = f["units"][names.MEMGUARD_UNIT], f["units"][unit]
    c = f["containers"].get(names.rank_name(spec.rank)) if isinstance(f["containers"], dict) else None
    return {
        "memguard": g.get("ActiveState", "not installed") if g["installed"] else "not installed",
        "rank_unit": unit,
        "rank_state": (u.get("ActiveState", "?") + "/" + u.get("SubState", "?")) if u["installed"] else "not installed",
        "since": _when(u.get("ActiveEnterTimestamp") if u.get("ActiveState") == "active"
                       else u.get("InactiveEnterTimestamp")),
        "container": c["state"]["Status"] if c else "none",
        "mem_available_gib": round(f["mem_available_kib"] / 2**20, 1),
        "gpu_memory": f["gpu_memory"], "tripped": f["tripped"]}


def api_status(cfg):
    client = Client(cfg.api_url, read_key(cfg), read_timeout=5)
    out = {"url": client.base, "health": client.health(), "models": None}
    try:
        out["models"] = client.models()
    except Exception:  # noqa: BLE001 - any failure means "no models listed"
        pass
    return out


def status(cfg, json=False):
    cl = Cluster(cfg)
    report = {"nodes": {}, "api": None}
    ranks_ok = True
    for node in cl.nodes:
        try:
            f = cl.probe(node)
        except NodeError as err:
            report["nodes"][node.name] = {"error": str(err)}
            ranks_ok = False
            continue
        entry = node_entry(cl.spec(node), f)
        report["nodes"][node.name] = entry
        if not entry["rank_state"].startswith("active/") or entry["container"] != "running":
            ranks_ok = False
    api = api_status(cfg)
    stale = stale_workers(cfg.nodes, cl.facts)
    if stale:
        ranks_ok = False
        report["stale"] = stale
    any_up = any(e.get("rank_state", "").split("/")[0] in ("active", "activating")
                 for e in report["nodes"].values())
    if api["models"]:
        api["state"] = "READY" if ranks_ok else "DEGRADED"
    else:
        api["state"] = "DOWN" if any_up else "NOT RUNNING"
    report["api"] = api
    if json:
        print(_json.dumps(report, indent=2))
        return
    print(f"{'node':<10} {'memguard':<14} {'rank':<26} {'since':<30} {'container':<10} {'MemAvail':>9}  GPU mem")
    for name, e in report["nodes"].items():
        if "error" in e:
            print(f"{name:<10} UNREACHABLE: {e['error']}")
            continue
        guard = "TRIPPED" if e["tripped"] else e["memguard"]
        print(f"{name:<10} {guard:<14} {e['rank_unit'] + ' ' + e['rank_state']:<26} {e['since'][:30]:<30} "
              f"{e['container']:<10} {e['mem_available_gib']:>6.1f} GiB  {e['gpu_memory'] or '-'}")
        if e["tripped"]:
            print(f"{'':<10} memory guard tripped: {one_line(_json.dumps(e['tripped']), 160)}; "
                  "lower KV_BYTES or GPU_UTIL, then `doit clear-trip`")
    for line in stale:
        print(line)
    print(f"API {api['url']}: {api['state']} (health {api['health']}, models {api['models'] or '-'})")
    if api["state"] == "NOT RUNNING":
        print("nothing is running; start it with `doit launch`")
