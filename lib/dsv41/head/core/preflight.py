"""Preflight: gather facts from every node (one `python3 -m dsv41.node.facts` per node), decide the
fabric once, then judge with pure checks. Changes nothing. Each check is one function below,
registered by @check in the order it prints; it yields PASS, WARN or FAIL lines, each with the fix."""
import ipaddress
import json
import sys
import time
from typing import NamedTuple

from dsv41.errors import UserError, one_line
from dsv41.head.core import engine, fabric
from dsv41.head.core.cluster import Cluster
from dsv41.names import RANK_PREFIX, rank_name
from dsv41.node.fabric import ROCE_V2, explain, summary

FACTS_TIMEOUT_S = 180          # bound on one node's facts call

GIB = 1024 ** 3
MIN_SPEED_MBPS = 200_000
MAX_SKEW_S = 2.0
# (kernel release prefix, boot option that avoids the problem, the problem)
KNOWN_BAD_KERNELS = (("7.0.0-1019", "kho=off", "NCCL memory registration (ibv_reg_mr) fails with ENOMEM"),)
PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
# --json: {"schema": SCHEMA, "ok": bool, "checks": [{"name", "status", "detail", "fix", "node"}]}
SCHEMA = "dsv41.preflight/1"


class Check(NamedTuple):
    name: str
    status: str
    detail: str
    fix: str = ""
    node: str = ""

    def line(self):
        where = f"{self.node}: " if self.node else ""
        fix = f" -- fix: {self.fix}" if self.fix and self.status != PASS else ""
        return f"{self.status}  {self.name:<16} {where}{self.detail}{fix}"


class Gathered(NamedTuple):
    """What one preflight run learned: {rank: facts} and the fabric decision made from them."""
    facts: dict
    decided: dict

    def fabric(self, cfg):
        """{rank: Fabric} resolved from the decision and the overrides (core.fabric.resolve)."""
        return fabric.resolve(cfg, self.decided)


CHECKS = {}   # name -> (function, per_node), in the order they print


def check(name, per_node=False):
    """Register a check. A cluster check is called as fn(ctx); a per-node check as fn(ctx, spec,
    facts) for every node that answered. Either yields (status, detail[, fix[, node]]) tuples."""
    def register(fn):
        CHECKS[name] = (fn, per_node)
        return fn
    return register


class Context:
    """The facts every check reads: the configured nodes, the nodes that answered, the fabric decision,
    what is wrong with each answering node's fabric (None when settled) and the nodes whose fabric is settled."""

    def __init__(self, cfg, facts, decided):
        self.cfg, self.all_facts, self.decided = cfg, facts, decided
        self.specs = {s.rank: s for s in cfg.nodes}
        self.ok = _answered(facts)
        self.problems = {r: fabric_problem(self, r) for r in self.ok}
        self.fab = {r: decided[r] for r, problem in self.problems.items() if not problem}

    def name(self, rank):
        return self.specs[rank].name

    @property
    def workers(self):
        return [r for r in sorted(self.fab) if r != 0]


def skip_set(cfg):
    """Checks SKIP_CHECKS relaxes (FAIL/WARN -> WARN "skipped on request")."""
    names = set(cfg.skip_checks)
    bad = sorted(names - set(CHECKS))
    if bad:
        raise UserError(f"SKIP_CHECKS: unknown check {bad[0]!r}: expected names from {', '.join(CHECKS)}")
    return names


def checks(cfg, facts, skip=(), decided=None):
    """Every registered check over {rank: facts}; `decided` is the fabric decision (made here when the
    caller has none)."""
    ctx = Context(cfg, facts, decided if decided is not None else fabric.decide_all(cfg, _answered(facts)))
    out = []
    for name, (fn, per_node) in CHECKS.items():
        if per_node:
            for r, f in ctx.ok.items():
                out += [_result(name, res, ctx.name(r)) for res in fn(ctx, ctx.specs[r], f)]
        else:
            out += [_result(name, res) for res in fn(ctx)]
    return [c._replace(status=WARN, detail=f"skipped on request ({c.status}: {c.detail})")
            if c.name in skip and c.status != PASS else c for c in out]


def _result(name, res, node=""):
    status, detail, fix, where = (*res, "", "")[:4]
    return Check(name, status, detail, fix, where or node)


def _answered(facts):
    return {r: f for r, f in facts.items() if f is not None and "error" not in f}


def _gib(n):
    return f"{n / GIB:.0f} GiB" if n >= 10 * GIB else f"{n / GIB:.1f} GiB"


def _running_ranks(f):
    active = (f.get("units") or {}).get("active") or {}
    return sorted(u[:-8] for u, st in active.items()
                  if u.startswith(RANK_PREFIX) and st in ("active", "activating", "reloading"))


def _net(ip, prefixlen):
    return ipaddress.IPv4Interface(f"{ip}/{prefixlen}").network


# ---- the checks ------------------------------------------------------------------------------------

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


DOCKER_FIXES = {
    "missing": "install Docker (DGX OS ships it): sudo apt-get install docker.io",
    "permission": "add the user to the docker group: sudo usermod -aG docker $USER, then log in again",
    "daemon": "start Docker: sudo systemctl enable --now docker",
    "timeout": "dockerd does not answer: sudo systemctl restart docker",
}


@check("docker", per_node=True)
def docker(ctx, s, f):
    dk = f.get("docker") or {}
    if dk.get("ok"):
        yield PASS, "answering"
    else:
        yield (FAIL, dk.get("error") or "docker facts missing",
               DOCKER_FIXES.get(dk.get("kind"), "check `docker info` on this node"))


@check("nvidia-runtime", per_node=True)
def nvidia_runtime(ctx, s, f):
    dk = f.get("docker") or {}
    if not dk.get("ok"):
        return
    runtimes = dk.get("runtimes", [])
    gpu = (f.get("tools") or {}).get("nvidia-smi")
    if "nvidia" in runtimes and gpu:
        yield PASS, f"runtimes {','.join(runtimes)}; nvidia-smi present"
        return
    missing = [] if "nvidia" in runtimes else [f"no nvidia runtime (runtimes: {','.join(runtimes) or 'none'})"]
    missing += [] if gpu else ["nvidia-smi not found"]
    yield (FAIL, "; ".join(missing), "install nvidia-container-toolkit, then sudo nvidia-ctk runtime "
           "configure --runtime=docker && sudo systemctl restart docker")


@check("disk", per_node=True)
def disk(ctx, s, f):
    dsk = f.get("disk")
    if not dsk:
        return
    if "error" in dsk:
        yield FAIL, dsk["error"], "check the model dir path"
        return
    want = (ctx.cfg.free_gib_head if s.rank == 0 else ctx.cfg.free_gib_worker) * GIB
    need = max(0, want - dsk["model_bytes"])
    desc = (f"{_gib(dsk['free_bytes'])} free at {dsk['checked']} for {dsk['model_dir']} "
            f"(needs {_gib(need)}; {_gib(dsk['model_bytes'])} of the model present)")
    if dsk["free_bytes"] < need:
        var = "MODEL_DIR" if s.rank == 0 else f"R{s.rank}_MODEL_DIR"
        yield FAIL, desc, f"free space there or point {var} at a bigger disk"
    else:
        yield PASS, desc


@check("memory", per_node=True)
def memory(ctx, s, f):
    mem = f.get("memory") or {}
    running = _running_ranks(f)
    if running:
        yield PASS, f"{','.join(running)} running here; available memory not checked"
    elif mem.get("available_bytes") is None or not mem.get("total_bytes"):
        yield WARN, f"MemAvailable unknown ({mem.get('error', 'no /proc/meminfo')})", ""
    else:
        need, setting = engine.for_config(ctx.cfg).gpu_memory_wanted(mem["total_bytes"])
        desc = (f"{_gib(mem['available_bytes'])} available of {_gib(mem['total_bytes'])}, "
                f"needs {_gib(need)} ({setting} {ctx.cfg.engine_value(setting):g})")
        if mem["available_bytes"] < need:
            yield (FAIL, desc, "stop other GPU processes and containers (docker ps), drop the page cache "
                   f"(sync; echo 3 | sudo tee /proc/sys/vm/drop_caches) or lower {setting}")
        else:
            yield PASS, desc


@check("ports", per_node=True)
def ports(ctx, s, f):
    """The head's API and rendezvous ports are free, or held by our own running rank 0."""
    if s.rank != 0:
        return
    used = f.get("ports") or {}
    for port, var in ((ctx.cfg.port, "PORT"), (ctx.cfg.mport, "MPORT")):
        if used.get(str(port)) is None:
            yield WARN, f"{var} {port}: not checked", ""
        elif not used[str(port)]:
            yield PASS, f"{var} {port} free"
        elif rank_name(0) in _running_ranks(f):
            yield PASS, f"{var} {port} in use by the running {rank_name(0)}"
        else:
            yield (FAIL, f"{var} {port} is in use", f"stop what listens there (sudo ss -ltnp 'sport = "
                   f":{port}') or set {var} to a free port")


@check("stale-containers", per_node=True)
def stale_containers(ctx, s, f):
    """A dsv41-r* container outside its running unit races the next rendezvous."""
    dk = f.get("docker") or {}
    if not dk.get("ok"):
        return
    active = (f.get("units") or {}).get("active") or {}
    stale = [c for c in dk.get("containers", [])
             if not (c.get("state") == "running" and active.get(c["name"] + ".service") == "active")]
    if not stale:
        yield PASS, f"no {RANK_PREFIX}* container outside its unit"
        return
    desc = ", ".join(f"{c['name']} ({c['state']}, unit {active.get(c['name'] + '.service', 'unknown')})"
                     for c in stale)
    fix = "docker rm -f " + " ".join(c["name"] for c in stale)
    if any(c.get("state") == "running" for c in stale):
        yield FAIL, f"running outside their units: {desc}", fix
    else:
        yield WARN, f"left over (removed at start): {desc}", fix


@check("kernel", per_node=True)
def kernel(ctx, s, f):
    k = f.get("kernel") or {}
    rel, cmdline = k.get("release", ""), (k.get("cmdline") or "").split()
    hit = next((b for b in KNOWN_BAD_KERNELS if rel.startswith(b[0]) and b[1] not in cmdline), None)
    if hit:
        yield (FAIL, f"{rel} without {hit[1]}: {hit[2]}", f"add {hit[1]} to GRUB_CMDLINE_LINUX in "
               "/etc/default/grub, sudo update-grub, reboot (or boot another kernel)")
    else:
        yield PASS, f"{rel or 'unknown'} not on the known-bad list"


@check("clock", per_node=True)
def clock(ctx, s, f):
    """Workers against the head's clock, read just before and after their facts call."""
    if s.rank == 0 or not all(isinstance(f.get(x), (int, float)) for x in ("time", "_t0", "_t1")):
        return
    t, t0, t1 = f["time"], f["_t0"], f["_t1"]
    skew = 0.0 if t0 <= t <= t1 else min(abs(t - t0), abs(t - t1))
    if skew > MAX_SKEW_S:
        yield WARN, f"{skew:.1f} s off the head's clock", "enable time sync on every node: sudo timedatectl set-ntp true"
    else:
        yield PASS, f"within {MAX_SKEW_S:g} s of the head ({skew:.1f} s)"


@check("tools", per_node=True)
def tools(ctx, s, f):
    have = f.get("tools") or {}
    miss = [t for t in ("rsync", "curl") if have.get(t) is False]
    if miss:
        yield FAIL, f"missing: {', '.join(miss)}", f"sudo apt-get install {' '.join(miss)}"
    else:
        yield PASS, "python3, rsync, curl present"


@check("remove-ipc", per_node=True)
def remove_ipc(ctx, s, f):
    """systemd-logind's RemoveIPC=yes deletes a user's shared memory when their last session ends; ranks
    of that user then block forever in a collective. Root and system users are spared."""
    ipc = f.get("ipc") or {"error": "no facts"}
    if "error" in ipc:
        yield WARN, f"RemoveIPC unknown ({ipc['error']})", "check RemoveIPC in /etc/systemd/logind.conf"
        return
    if not ipc["remove_ipc"]:
        yield PASS, f"RemoveIPC=no ({ipc['source']})"
        return
    users = {name: uid for name, uid in ipc["rank_uids"].items() if uid is not None}
    exposed = {name: uid for name, uid in users.items() if uid > ipc["system_uid_max"]}
    if exposed:
        who = ", ".join(f"{name} as uid {uid}" for name, uid in sorted(exposed.items()))
        yield (WARN, f"RemoveIPC=yes ({ipc['source']}) and {who}: logind deletes that user's shared memory "
               "when their last session ends, and the head then blocks forever in a collective",
               "sudo mkdir -p /etc/systemd/logind.conf.d && printf '[Login]\\nRemoveIPC=no\\n' | sudo tee "
               "/etc/systemd/logind.conf.d/dsv41.conf && sudo systemctl restart systemd-logind (or run the ranks "
               "as root or a system user)")
    else:
        as_ = (", ".join(f"{name} as uid {uid}" for name, uid in sorted(users.items())) if users
               else "the rank units run as root")
        yield PASS, f"RemoveIPC=yes ({ipc['source']}), but {as_}: logind spares root and system users"


# ---- gathering (one facts call per node) ----------------------------------------------------------

def _facts_call(cl, node, args):
    try:
        argv = cl.module(node, "facts", *args)
        t0 = time.time()
        r = node.run(argv, timeout=FACTS_TIMEOUT_S)
        t1 = time.time()
    except UserError as err:
        return {"error": str(err)}
    try:
        f = json.loads(r.stdout)
    except ValueError:
        return {"error": f"{node.label}: facts printed no JSON: {one_line(r.stdout[-200:] or r.stderr[-200:])}",
                "fix": "check that python3 (3.10 or newer) works on the node"}
    f["_t0"], f["_t1"] = t0, t1
    return f


def _override_args(spec):
    return (["--ip", spec.ip] if spec.ip else []) + (["--ifname", spec.ifname] if spec.ifname else [])


def gather(cl, progress=None):
    """Gathered({rank: facts or {"error": ...}}, the fabric decision) for the Cluster's nodes. One facts
    call per node; pings are folded in when the peer's address is known beforehand, else the head pings
    in a second call. The code shipped and the homes learned here are the Cluster's for the rest of the run."""
    cfg = cl.cfg
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    ns = {cl.spec(n).rank: n for n in cl.nodes}
    known = {s.rank: s.ip or fabric.target_ip(s) for s in cfg.workers}
    out = {}
    head = cfg.head
    peer = fabric.peer_of(cfg, 0, {})
    args = ["--model-dir", cfg.model_dir, "--ports", f"{cfg.port},{cfg.mport}", *_override_args(head)]
    args += ["--peer", peer] if peer else []
    pinged = [ip for ip in known.values() if ip]
    args += ["--ping", ",".join(pinged)] if pinged else []
    say(f"facts: {ns[0].label}")
    out[0] = _facts_call(cl, ns[0], args)
    head_ip = fabric.decide_all(cfg, {0: out[0]})[0]["ip"] if "error" not in out[0] else None
    cl.connect()                            # a dead worker costs SSH_TIMEOUT_S once, not once each
    for s in cfg.workers:
        n = ns[s.rank]
        say(f"facts: {n.label}")
        try:
            model_dir = cl.paths(n).model_dir
        except UserError as err:
            out[s.rank] = {"error": str(err)}
            continue
        args = ["--model-dir", model_dir, *_override_args(s)]
        peers = [head_ip] * bool(head_ip) + [ip for r, ip in known.items() if ip and r != s.rank]
        args += (["--peer", head_ip] if head_ip else []) + (["--ping", ",".join(peers)] if peers else [])
        out[s.rank] = _facts_call(cl, n, args)
    decided = fabric.decide_all(cfg, _answered(out))
    # a second head call pings the workers whose fabric address became known only now
    late = [decided[r]["ip"] for r in known if decided[r]["ip"] and decided[r]["ip"] not in pinged]
    if late and "error" not in out[0] and decided[0]["ifname"]:
        say(f"ping: {ns[0].label} -> {', '.join(late)}")
        extra = _facts_call(cl, ns[0], ["--ping-only", "--ping", ",".join(late), "--ifname", decided[0]["ifname"]])
        out[0]["pings"] = out[0].get("pings", []) + extra.get("pings", [])
    return Gathered(out, decided)


def report(cfg, gathered, as_json=False, brief=False):
    """Print one line per check (or JSON); returns the exit code: 1 on any FAIL, else 0.
    brief (launch): only FAIL lines and warnings not skipped on request, then the summary."""
    results = checks(cfg, gathered.facts, skip_set(cfg), gathered.decided)
    failed = any(c.status == FAIL for c in results)
    if as_json:
        print(json.dumps({"schema": SCHEMA, "ok": not failed, "checks": [c._asdict() for c in results]}, indent=2))
    else:
        for c in results:
            if not brief or c.status == FAIL or (c.status == WARN and "skipped on request" not in c.detail):
                print(c.line())
        n = {s: sum(c.status == s for c in results) for s in (PASS, WARN, FAIL)}
        print(f"preflight: {n[PASS]} passed, {n[WARN]} warnings, {n[FAIL]} failed")
    return 1 if failed else 0


def task(cfg, json=False):
    """`doit preflight [--json]`: False (the task fails) on any FAIL."""
    skip_set(cfg)
    return report(cfg, gather(Cluster(cfg)), as_json=json) == 0


def for_launch(cl):
    """The first step of `doit launch`: print the problems, stop on any FAIL, return the fabric
    resolved from what was gathered (core.fabric.resolve)."""
    skip_set(cl.cfg)
    gathered = gather(cl)
    if report(cl.cfg, gathered, brief=True):
        raise UserError("preflight failed: fix the FAIL lines above, then launch again "
                        "(SKIP_CHECKS=name,... turns a check that cannot pass into a warning)")
    return gathered.fabric(cl.cfg)


def resolved_fabric(cl, offline=False):
    """Every node's fabric, from its facts and the overrides (plan, render), without the report.
    offline: from the overrides alone when they give every value (None when they do not)."""
    if offline:
        return fabric.from_overrides(cl.cfg)
    return gather(cl).fabric(cl.cfg)
