"""Fabric detection: which RoCE port, interface, IPv4 address, HCAs and GID index a node uses.

Runs on a node with the standard library only (`python3 -m dsv41.fabric detect`). `scan()` reads the
raw facts (sysfs RDMA devices, `ip -j -4 addr`); `choose()` is the pure decision over them, so the head
can re-decide from a node's facts once the peer's address is known. Overrides (R<N>_IP, _IFNAME, _HCAS,
_GID_INDEX, NCCL_IB_GID_INDEX) win over detection in `resolve_fabric()`.
"""
import argparse
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
from typing import NamedTuple

from dsv41.errors import UserError, cli, one_line

ROCE_V2 = "RoCE v2"
EXPECTED_WRITE_GBPS = 112.0        # ib_write_bw on one HCA (field notes)
NCCL_FLOOR_GBPS = 175.0            # NCCL bus bandwidth between two Sparks, all HCAs
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


class Fabric(NamedTuple):
    ip: str
    ifname: str
    hcas: tuple
    gid_index: int


class NotDetected(UserError):
    pass


# ---- raw facts (node side) -----------------------------------------------------------------------

def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _ls(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _port_state(text):
    # sysfs: "4: ACTIVE"
    return (text or "").split(":")[-1].strip() or None


def scan_rdma(sysfs="/sys"):
    """RDMA devices under <sysfs>/class/infiniband: port 1 state, netdevs, non-empty GIDs."""
    ib = os.path.join(sysfs, "class", "infiniband")
    if not os.path.isdir(ib):
        return {"present": False, "devices": []}
    devices = []
    for dev in _ls(ib):
        port = os.path.join(ib, dev, "ports", "1")
        gids = []
        for name in _ls(os.path.join(port, "gids")):
            if not name.isdigit():
                continue
            gid = _read(os.path.join(port, "gids", name))
            if not gid or gid == ZERO_GID:
                continue
            gids.append({"index": int(name), "gid": gid,
                         "type": _read(os.path.join(port, "gid_attrs", "types", name)),
                         "ndev": _read(os.path.join(port, "gid_attrs", "ndevs", name))})
        gids.sort(key=lambda g: g["index"])
        devices.append({"name": dev, "state": _port_state(_read(os.path.join(port, "state"))),
                        "rate": _read(os.path.join(port, "rate")),
                        "netdevs": _ls(os.path.join(ib, dev, "device", "net")), "gids": gids})
    return {"present": True, "devices": devices}


def ip_addrs():
    """[{ifname, ip, prefixlen, mtu, operstate}] from the real `ip -j -4 addr`."""
    if not shutil.which("ip"):
        raise UserError("`ip` is not installed on this node: apt-get install iproute2")
    r = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, timeout=20)
    if r.returncode:
        raise UserError(f"`ip -j -4 addr` failed: {one_line(r.stderr) or 'no output'}")
    return parse_ip_json(r.stdout)


def parse_ip_json(text):
    try:
        links = json.loads(text or "[]")
    except ValueError:
        raise UserError("`ip -j -4 addr` printed no JSON: iproute2 too old? (needs -j support)") from None
    out = []
    for link in links:
        for a in link.get("addr_info") or []:
            if a.get("family", "inet") == "inet" and a.get("local"):
                out.append({"ifname": link.get("ifname"), "ip": a["local"],
                            "prefixlen": int(a.get("prefixlen", 32)), "mtu": link.get("mtu"),
                            "operstate": link.get("operstate")})
    return out


def scan(sysfs="/sys"):
    return {**scan_rdma(sysfs), "addrs": ip_addrs()}


# ---- the decision (pure) ---------------------------------------------------------------------------

def _net(a):
    return ipaddress.IPv4Interface(f"{a['ip']}/{a['prefixlen']}").network


def _on_subnet(addr, ip):
    return ipaddress.IPv4Address(ip) in _net(addr)


def mapped_gid_matches(gid, ip):
    try:
        return ipaddress.IPv6Address(gid).ipv4_mapped == ipaddress.IPv4Address(ip)
    except ValueError:
        return False


def summary(facts):
    """What was found, for one-line messages."""
    if not facts.get("present"):
        return "no RDMA devices (/sys/class/infiniband is missing)"
    addrs = {}
    for a in facts.get("addrs", []):
        addrs.setdefault(a["ifname"], []).append(f"{a['ip']}/{a['prefixlen']}")
    parts = []
    for d in facts["devices"]:
        nets = ",".join(f"{n}={'+'.join(addrs.get(n, [])) or 'no IPv4'}" for n in d["netdevs"]) or "no netdev"
        parts.append(f"{d['name']} {d['state'] or '?'} ({nets})")
    return "RDMA ports: " + ("; ".join(parts) if parts else "none")


def choose(facts, peer=None, ip=None, ifname=None, hcas=None, gid_index=None):
    """Decide the fabric from raw facts. Given values (overrides) win; returns a dict with
    ifname, ip, prefixlen, mtu, hcas, gid_index, gid_type and `missing` (names not determined)."""
    devices = facts.get("devices", [])
    addrs = facts.get("addrs", [])
    active = [d for d in devices if d["state"] == "ACTIVE"]
    by_if = {}
    for a in addrs:
        by_if.setdefault(a["ifname"], []).append(a)

    chosen = None
    if ip:
        chosen = next((a for a in addrs if a["ip"] == ip and (not ifname or a["ifname"] == ifname)), None)
        if chosen is None:
            chosen = {"ifname": ifname, "ip": ip, "prefixlen": None, "mtu": None}
    elif ifname:
        cands = by_if.get(ifname, [])
        chosen = next((a for a in cands if peer and _on_subnet(a, peer)), cands[0] if cands else None)
        if chosen is None:
            chosen = {"ifname": ifname, "ip": None, "prefixlen": None, "mtu": None}
    else:
        cands = [a for d in active for n in d["netdevs"] for a in by_if.get(n, [])]
        if peer:
            cands = [a for a in cands if _on_subnet(a, peer)]
        chosen = cands[0] if cands else None
    if chosen and not chosen.get("ifname"):
        chosen = {**chosen, "ifname": next((a["ifname"] for a in addrs if a["ip"] == chosen["ip"]), None)}

    # HCAs: ACTIVE devices with a netdev on the peer's subnet (own subnet when the peer is unknown).
    if hcas:
        hca_list = tuple(hcas)
    elif chosen and chosen.get("prefixlen") is not None:
        target = peer if peer and not (ip or ifname) else chosen["ip"]
        hca_list = tuple(d["name"] for d in active
                         if any(_on_subnet(a, target) for n in d["netdevs"] for a in by_if.get(n, [])))
    else:
        hca_list = ()

    gid_type = None
    fab_ip = chosen and chosen.get("ip")
    named = [d for d in devices if d["name"] in {h.split(":")[0] for h in hca_list}]
    if gid_index is None and fab_ip:
        for d in named:
            g = next((g for g in d["gids"] if g["type"] == ROCE_V2 and mapped_gid_matches(g["gid"], fab_ip)),
                     None)
            if g:
                gid_index, gid_type = g["index"], g["type"]
                break
    elif gid_index is not None:
        gid_type = next((g["type"] for d in named for g in d["gids"] if g["index"] == gid_index), None)

    out = {"ifname": chosen and chosen.get("ifname"), "ip": fab_ip or None,
           "prefixlen": chosen and chosen.get("prefixlen"), "mtu": chosen and chosen.get("mtu"),
           "hcas": list(hca_list), "gid_index": gid_index, "gid_type": gid_type}
    out["missing"] = [k for k in ("ifname", "ip", "hcas", "gid_index") if out[k] in (None, [])]
    return out


def variables(rank):
    prefix = {0: "HEAD_", 1: "WORKER_"}.get(rank)
    names = lambda p: "/".join(p + k for k in ("IP", "IFNAME", "HCAS", "GID_INDEX"))
    return f"{names(prefix)} (or {names(f'R{rank}_')})" if prefix else names(f"R{rank}_")


WORDS = {"ifname": "interface", "ip": "address", "hcas": "HCAs", "gid_index": "RoCE v2 GID index"}


def explain(facts, decided, peer=None, who="this node", vars_hint=None, hint=True):
    """One line: what is missing, what was found, what to set."""
    miss = ", ".join(WORDS[k] for k in decided["missing"])
    where = f" on the peer's subnet ({peer})" if peer and not decided["ip"] else ""
    if decided["ip"] and decided["missing"] == ["gid_index"]:
        where = f" (no RoCE v2 GID maps {decided['ip']} on {','.join(decided['hcas'])})"
    hint = hint and (vars_hint or ("HEAD_IP/HEAD_IFNAME/HEAD_HCAS/HEAD_GID_INDEX on the head, "
                         "R<N>_IP/R<N>_IFNAME/R<N>_HCAS/R<N>_GID_INDEX on rank N"))
    return (f"{who}: no fabric {miss} detected{where}; found {summary(facts)}"
            + (f"; set {hint} (see `ip -br a`, `rdma link`)" if hint else ""))


def detect(sysfs="/sys", peer=None):
    """Detect on this node; raises NotDetected (one line) when something does not qualify."""
    facts = scan(sysfs)
    decided = choose(facts, peer=peer)
    if decided["missing"]:
        raise NotDetected(explain(facts, decided, peer))
    return decided


# ---- head side: overrides over detected facts ------------------------------------------------------

def _gid_override(cfg, spec):
    return spec.gid_index if spec.gid_index is not None else cfg.nccl_ib_gid_index


def fabric_from_overrides(cfg):
    """{rank: Fabric} when every per-node value is given by override (no node needs contacting)."""
    out = {}
    for s in cfg.nodes:
        gid = _gid_override(cfg, s)
        if not (s.ip and s.ifname and s.hcas and gid is not None):
            return None
        out[s.rank] = Fabric(s.ip, s.ifname, tuple(s.hcas), gid)
    return out


def target_ip(spec):
    """The IPv4 literal in an ssh target (WORKER=user@<fabric address>), else None."""
    host = (spec.target or "").split("@")[-1]
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        return None


def peer_of(cfg, rank, known_ips):
    """The peer whose subnet a node's fabric must be on: the head for workers, rank 1 for the head."""
    other = 1 if rank == 0 else 0
    if other >= len(cfg.nodes):
        return None
    return known_ips.get(other) or cfg.nodes[other].ip or target_ip(cfg.nodes[other])


def decide_all(cfg, facts_by_rank):
    """{rank: decided dict} for every node with facts, overrides applied. Head first, so the workers'
    peer is the head's resolved address."""
    out, ips = {}, {}
    for s in cfg.nodes:
        node_facts = facts_by_rank.get(s.rank)
        f = (node_facts or {}).get("fabric")
        if f is None or "error" in f:
            why = (f or {}).get("error") or (node_facts or {}).get("error") or "no facts gathered"
            f = {"present": False, "devices": [], "addrs": [], **(f or {}), "error": why}
        d = choose(f, peer=peer_of(cfg, s.rank, ips), ip=s.ip, ifname=s.ifname, hcas=s.hcas,
                   gid_index=_gid_override(cfg, s))
        out[s.rank] = {**d, "facts": f}
        if d["ip"]:
            ips[s.rank] = d["ip"]
    return out


def resolve_fabric(cfg, facts_by_rank):
    """{rank: Fabric}; overrides win; UserError naming the node and the variable when a value is
    neither given nor detectable."""
    quick = fabric_from_overrides(cfg)
    if quick:
        return quick
    out = {}
    decided = decide_all(cfg, facts_by_rank)
    for s in cfg.nodes:
        d = decided[s.rank]
        f = d["facts"]
        if d["missing"]:
            if "error" in f:
                raise UserError(f"{s.name}: no fabric facts ({f['error']}); set {variables(s.rank)}")
            raise UserError(explain(f, d, peer_of(cfg, s.rank, {r: x["ip"] for r, x in decided.items()}),
                                    who=s.name, vars_hint=variables(s.rank)))
        out[s.rank] = Fabric(d["ip"], d["ifname"], tuple(d["hcas"]), int(d["gid_index"]))
    return out


# ---- fabric-bench (head side) --------------------------------------------------------------------

def parse_ib_write_bw(text):
    """BW average in Gb/s from `ib_write_bw --report_gbits` output, or None."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "BW average" in line:
            for data in lines[i + 1:]:
                cols = data.split()
                if len(cols) >= 4 and cols[0].isdigit():
                    try:
                        return float(cols[3])
                    except ValueError:
                        return None
    return None


def fabric_bench(cfg, seconds=10, progress=None):
    """ib_write_bw from the head to the first worker over one HCA; returns a dict with gbps,
    expected_gbps and status (PASS/WARN)."""
    from dsv41 import nodes, preflight
    say = progress or print
    if not shutil.which("ib_write_bw"):
        raise UserError("ib_write_bw is not installed on the head: sudo apt-get install perftest "
                        "(on every node)")
    w = cfg.require_workers()[0]
    facts = preflight.gather_facts(cfg, progress)
    for r in (0, w.rank):
        if "error" in facts[r]:
            raise UserError(facts[r]["error"])
    if not facts[w.rank].get("tools", {}).get("ib_write_bw"):
        raise UserError(f"ib_write_bw is not installed on {w.name}: sudo apt-get install perftest there")
    fab = resolve_fabric(cfg, facts)
    h, wk = fab[0], fab[w.rank]
    hca_h, hca_w = h.hcas[0].split(":")[0], wk.hcas[0].split(":")[0]
    base = ["ib_write_bw", "-F", "--report_gbits", "-D", str(seconds)]
    server = nodes.Node.from_spec(w, cfg).argv_for(
        ["timeout", str(seconds + 60), *base, "-d", hca_w, "-x", str(wk.gid_index)])
    say(f"fabric-bench: {seconds} s ib_write_bw {cfg.head.name} {hca_h} -> {w.name} {hca_w} ({wk.ip})")
    srv = subprocess.Popen(server, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        time.sleep(2)
        r = nodes.Node("head").run([*base, "-d", hca_h, "-x", str(h.gid_index), wk.ip],
                                   check=False, timeout=seconds + 60)
    finally:
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()
    gbps = parse_ib_write_bw(r.stdout)
    if gbps is None:
        raise UserError(f"ib_write_bw gave no result (exit {r.code}): {one_line(r.stderr[-300:] or r.stdout[-300:])}")
    status = "PASS" if gbps >= 0.8 * EXPECTED_WRITE_GBPS else "WARN"
    say(f"{status}  fabric-bench     {gbps:.1f} Gb/s on one HCA (expected about {EXPECTED_WRITE_GBPS:g} Gb/s; "
        f"NCCL bus bandwidth floor {NCCL_FLOOR_GBPS:g} Gb/s uses every HCA)"
        + ("" if status == "PASS" else " -- fix: check `ethtool` speed, reseat the QSFP cable"))
    return {"gbps": gbps, "expected_gbps": EXPECTED_WRITE_GBPS, "status": status}


def bench_task(cfg):
    """`doit fabric-bench`."""
    fabric_bench(cfg)


# ---- command line ----------------------------------------------------------------------------------

@cli
def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m dsv41.fabric")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("detect", help="detect this node's fabric interface, address, HCAs, GID index")
    d.add_argument("--sysfs", default="/sys", help="sysfs root (default /sys)")
    d.add_argument("--peer", help="the peer's fabric IPv4 address: pick the port on its subnet")
    d.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.peer:
        try:
            ipaddress.IPv4Address(a.peer)
        except ValueError:
            raise UserError(f"--peer {a.peer!r} is not an IPv4 address") from None
    r = detect(a.sysfs, a.peer)
    if a.json:
        print(json.dumps({k: r[k] for k in ("ifname", "ip", "hcas", "gid_index")}))
    else:
        print(f"interface {r['ifname']}\naddress   {r['ip']}/{r['prefixlen']}\n"
              f"hcas      {','.join(r['hcas'])}\ngid_index {r['gid_index']} ({r['gid_type']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
