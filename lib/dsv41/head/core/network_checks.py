"""Preflight's checks of the network, in the order they print: every node answers, its fabric is
settled (address, interface, HCAs, GID), the HCAs are ACTIVE, the fabric addresses share a subnet, the
GID types and MTUs agree, full-MTU pings pass both ways and the links run at full speed. Pure: they read
the facts in preflight's Context (ctx.fab: the settled fabric of each node whose fabric is settled)."""
import ipaddress

from dsv41.errors import one_line
from dsv41.head.core import fabric
from dsv41.head.core.checks import FAIL, PASS, WARN, registry
from dsv41.node.fabric import ROCE_V2, explain, summary

MIN_SPEED_MBPS = 200_000

CHECKS, check = registry()


def _net(ip, prefixlen):
    return ipaddress.IPv4Interface(f"{ip}/{prefixlen}").network


@check("reachable")
def reachable(ctx):
    for s in ctx.cfg.nodes:
        f = ctx.all_facts.get(s.rank)
        if f is None:
            yield FAIL, "no facts gathered", "run `doit preflight` again", s.name
        elif "error" in f:
            yield FAIL, one_line(f["error"]), f.get("fix", ""), s.name
        else:
            yield PASS, f"answered ({f.get('hostname', '?')})", "", s.name


def fabric_problem(ctx, r):
    """(detail, fix) when node r's fabric is not settled: an override not on the node, or nothing
    detected; None when it is."""
    s, d = ctx.specs[r], ctx.decided[r]
    addrs = ctx.ok[r].get("fabric", {}).get("addrs", [])
    have = ", ".join(f"{a['ifname']}={a['ip']}" for a in addrs) or "none"
    if s.ip and not any(a["ip"] == s.ip for a in addrs):
        return (f"the override address {s.ip} is not on this node (it has {have})",
                f"set R{r}_IP to this node's fabric address")
    if s.ifname and not any(a["ifname"] == s.ifname for a in addrs):
        return (f"the override interface {s.ifname} has no IPv4 address here (addresses: {have})",
                f"set R{r}_IFNAME to this node's fabric interface")
    if d["missing"]:
        peer = fabric.peer_of(ctx.cfg, r, {k: v["ip"] for k, v in ctx.decided.items() if v["ip"]})
        return explain(d["facts"], d, peer, who="detection", hint=False), f"set {fabric.variables(r)}"
    return None


@check("fabric", per_node=True)
def fabric_settled(ctx, s, f):
    problem = ctx.problems[s.rank]
    if problem:
        yield FAIL, *problem
    else:
        d = ctx.fab[s.rank]
        yield PASS, (f"{d['ifname']} {d['ip']}/{d['prefixlen'] or '?'}, HCAs {','.join(d['hcas'])}, "
                     f"GID index {d['gid_index']} ({d['gid_type'] or 'type unknown'})")


@check("rdma", per_node=True)
def rdma(ctx, s, f):
    """Every HCA in use exists here with port 1 ACTIVE."""
    if s.rank not in ctx.fab:
        return
    d = ctx.fab[s.rank]
    raw = d["facts"]
    states = {x["name"]: x.get("state") for x in raw.get("devices", [])}
    bad = [f"{h} {states.get(h.split(':')[0]) or 'not found'}" for h in d["hcas"]
           if states.get(h.split(":")[0]) != "ACTIVE"]
    if not raw.get("present"):
        yield (FAIL, "no RDMA devices (/sys/class/infiniband is missing)",
               "check the QSFP cable and the ConnectX driver: `rdma link` must show an ACTIVE port")
    elif bad:
        yield (FAIL, f"HCAs not ACTIVE: {', '.join(bad)} ({summary(raw)})",
               f"set R{s.rank}_HCAS to ACTIVE devices on the fabric (see `rdma link`)")
    else:
        yield PASS, f"{','.join(d['hcas'])} ACTIVE"


@check("subnet")
def subnet(ctx):
    if 0 not in ctx.fab or not ctx.workers:
        return
    fab, head, bad = ctx.fab, ctx.fab[0], []
    for r in ctx.workers:
        w = fab[r]
        nets = [_net(x["ip"], x["prefixlen"]) for x in (head, w) if x["prefixlen"] is not None]
        if not nets:
            bad.append(f"{ctx.name(r)}: prefix unknown")
        elif not all(ipaddress.IPv4Address(y["ip"]) in n for n in nets for y in (head, w)):
            bad.append(f"{ctx.name(r)} {w['ip']}/{w['prefixlen']}")
    desc = ", ".join(f"{ctx.name(r)} {fab[r]['ip']}/{fab[r]['prefixlen']}" for r in sorted(fab))
    if bad:
        yield (FAIL, f"fabric addresses not on one subnet: {desc}",
               "give every node's QSFP port an address on one subnet, or set R<N>_IP to the address on "
               "the shared subnet")
    else:
        yield PASS, f"one subnet: {desc}"


@check("gid-type")
def gid_type(ctx):
    if 0 not in ctx.fab or not ctx.workers:
        return
    types = {r: ctx.fab[r]["gid_type"] for r in sorted(ctx.fab)}
    desc = ", ".join(f"{ctx.name(r)} index {ctx.fab[r]['gid_index']} {types[r] or 'type unknown'}"
                     for r in types)
    known = {t for t in types.values() if t}
    if len(known) > 1:
        yield (FAIL, f"GID types differ: {desc}",
               "set R<N>_GID_INDEX (or NCCL_IB_GID_INDEX) to a RoCE v2 entry of the fabric address on "
               "every node (see /sys/class/infiniband/<hca>/ports/1/gid_attrs/types)")
    elif known != {ROCE_V2} or None in types.values():
        yield (WARN, f"not all RoCE v2 or unknown: {desc}",
               "point R<N>_GID_INDEX at the RoCE v2 GID of the fabric address")
    else:
        yield PASS, f"same on all nodes: {desc}"


def _mtu(ctx, r):
    return (ctx.ok[r].get("mtus") or {}).get(ctx.fab[r]["ifname"]) or ctx.fab[r]["mtu"]


@check("mtu")
def mtu(ctx):
    if 0 not in ctx.fab:
        return
    fab = ctx.fab
    for r in ctx.workers:
        m0, mr = _mtu(ctx, 0), _mtu(ctx, r)
        pair = f"{ctx.name(0)} {fab[0]['ifname']} {m0}, {ctx.name(r)} {fab[r]['ifname']} {mr}"
        if not m0 or not mr:
            yield WARN, f"MTU unknown: {pair}", "check `ip link` on both nodes"
        elif m0 != mr:
            low = 0 if m0 < mr else r
            yield (FAIL, f"MTU differs: {pair}",
                   f"set the same MTU on both ends (on {ctx.name(low)}: sudo ip link set dev "
                   f"{fab[low]['ifname']} mtu {max(m0, mr)}, and persist it)")
        else:
            yield PASS, f"equal: {pair}"


@check("ping")
def ping(ctx):
    """Don't-fragment pings of the full MTU, both ways between every two nodes (tensor-parallel ranks
    all talk to each other)."""
    if 0 not in ctx.fab:
        return
    ranks = [0] + ctx.workers
    for i, r in enumerate(ranks):
        for q in ranks[i + 1:]:
            for a, b in ((r, q), (q, r)):
                p = next((p for p in ctx.ok[a].get("pings", []) if p.get("peer") == ctx.fab[b]["ip"]), None)
                label = f"{ctx.name(a)} -> {ctx.name(b)} {ctx.fab[b]['ip']}"
                if p is None:
                    yield WARN, f"{label}: not run", "run `doit preflight` again"
                elif p.get("ok"):
                    yield PASS, f"{label}: {p['size']} bytes, don't fragment"
                else:
                    yield (FAIL, f"{label}: {p.get('size')} bytes don't fragment failed: {p.get('error')}",
                           f"check MTU on both ends, cable and addresses: {p.get('command') or 'ping -M do'}")


@check("link-speed", per_node=True)
def link_speed(ctx, s, f):
    """WARN only: a degraded link still works, slowly."""
    if s.rank not in ctx.fab:
        return
    ifname = ctx.fab[s.rank]["ifname"]
    sp = (f.get("speeds") or {}).get(ifname) or {}
    mbps = sp.get("mbps")
    if mbps is None:
        yield WARN, f"{ifname}: speed unknown ({sp.get('raw') or sp.get('error')})", f"check the link: ethtool {ifname}"
    elif mbps < MIN_SPEED_MBPS:
        yield (WARN, f"{ifname}: {mbps} Mb/s, under {MIN_SPEED_MBPS} Mb/s",
               "reseat the QSFP cable or reboot to renegotiate; expect 200000Mb/s in `ethtool`")
    else:
        yield PASS, f"{ifname}: {mbps} Mb/s"
