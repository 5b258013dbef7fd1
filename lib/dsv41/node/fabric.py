"""Fabric detection: which RoCE port, interface, IPv4 address, HCAs and GID index a node uses.

Runs on a node with the standard library only (`python3 -m dsv41.node.fabric detect`). `scan()` reads the
raw facts (sysfs RDMA devices, `ip -j -4 addr`); `choose()` is the pure decision over them, so the head
can re-decide from a node's facts once the peer's address is known. Overrides win over detection on
the head (dsv41.head.core.fabric).
"""
import argparse
import ipaddress
import json
import os
import shutil
import subprocess
import sys

from dsv41.errors import UserError, cli, one_line

ROCE_V2 = "RoCE v2"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


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


# ---- command line ----------------------------------------------------------------------------------

@cli
def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m dsv41.node.fabric")
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
