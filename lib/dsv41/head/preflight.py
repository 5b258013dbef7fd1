"""Preflight: gather facts from every node (one `python3 -m dsv41.facts` per node), then judge them
with pure checks. Changes nothing. Each check: PASS, WARN or FAIL, with the fix."""
import ipaddress
import json
import os
import sys
import time
from typing import NamedTuple

from dsv41 import fabric, nodes
from dsv41.errors import UserError, one_line

GIB = 1024 ** 3
MIN_SPEED_MBPS = 200_000
MAX_SKEW_S = 2.0
# (kernel release prefix, boot option that avoids the problem, the problem)
KNOWN_BAD_KERNELS = (("7.0.0-1019", "kho=off", "NCCL memory registration (ibv_reg_mr) fails with ENOMEM"),)
CHECK_NAMES = ("reachable", "fabric", "rdma", "subnet", "gid-type", "mtu", "ping", "link-speed", "docker",
               "nvidia-runtime", "disk", "memory", "ports", "stale-containers", "kernel", "clock", "tools")
PASS, WARN, FAIL = "PASS", "WARN", "FAIL"


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


# ---- settings ------------------------------------------------------------------------------------

def skip_set(cfg, env=None):
    """Checks to relax (FAIL/WARN -> WARN "skipped on request"): the skip_checks setting
    (SKIP_CHECKS), or DSV41_SKIP_CHECKS where the Config has no such setting."""
    raw, var = getattr(cfg, "skip_checks", None), "SKIP_CHECKS"
    if raw is None:
        raw, var = (os.environ if env is None else env).get("DSV41_SKIP_CHECKS", ""), "DSV41_SKIP_CHECKS"
    names = {str(x).strip() for x in (raw.split(",") if isinstance(raw, str) else raw) if str(x).strip()}
    bad = sorted(names - set(CHECK_NAMES))
    if bad:
        raise UserError(f"{var}: unknown check {bad[0]!r}: expected names from {', '.join(CHECK_NAMES)}")
    return names


# ---- the checks (pure) ---------------------------------------------------------------------------

def _gib(n):
    return f"{n / GIB:.0f} GiB" if n >= 10 * GIB else f"{n / GIB:.1f} GiB"


def _running_ranks(f):
    active = (f.get("units") or {}).get("active") or {}
    return sorted(u[:-8] for u, st in active.items()
                  if u.startswith("dsv41-r") and st in ("active", "activating", "reloading"))


def _net(ip, prefixlen):
    return ipaddress.IPv4Interface(f"{ip}/{prefixlen}").network


def checks(cfg, facts_by_rank, skip=()):
    out = []
    add = lambda *a, **k: out.append(Check(*a, **k))
    specs = {s.rank: s for s in cfg.nodes}
    ok = {}
    for s in cfg.nodes:
        f = facts_by_rank.get(s.rank)
        if f is None:
            add("reachable", FAIL, "no facts gathered", "run `doit preflight` again", s.name)
        elif "error" in f:
            add("reachable", FAIL, one_line(f["error"]), f.get("fix", ""), s.name)
        else:
            add("reachable", PASS, f"answered ({f.get('hostname', '?')})", node=s.name)
            ok[s.rank] = f

    # fabric: overrides over detected facts, the head first (the workers' peer)
    decided = fabric.decide_all(cfg, ok)
    fab = {}
    for r, f in ok.items():
        s, d = specs[r], decided[r]
        addrs = f.get("fabric", {}).get("addrs", [])
        have = ", ".join(f"{a['ifname']}={a['ip']}" for a in addrs) or "none"
        if s.ip and not any(a["ip"] == s.ip for a in addrs):
            add("fabric", FAIL, f"the override address {s.ip} is not on this node (it has {have})",
                f"set R{r}_IP to this node's fabric address", s.name)
        elif s.ifname and not any(a["ifname"] == s.ifname for a in addrs):
            add("fabric", FAIL, f"the override interface {s.ifname} has no IPv4 address here (addresses: {have})",
                f"set R{r}_IFNAME to this node's fabric interface", s.name)
        elif d["missing"]:
            peer = fabric.peer_of(cfg, r, {k: v["ip"] for k, v in decided.items() if v["ip"]})
            add("fabric", FAIL, fabric.explain(d["facts"], d, peer, who="detection", hint=False),
                f"set {fabric.variables(r)}", s.name)
        else:
            fab[r] = d
            add("fabric", PASS, f"{d['ifname']} {d['ip']}/{d['prefixlen'] or '?'}, HCAs "
                f"{','.join(d['hcas'])}, GID index {d['gid_index']} ({d['gid_type'] or 'type unknown'})",
                node=s.name)

    # rdma: every HCA in use exists here with port 1 ACTIVE
    for r, d in fab.items():
        f = d["facts"]
        states = {x["name"]: x.get("state") for x in f.get("devices", [])}
        bad = [f"{h} {states.get(h.split(':')[0]) or 'not found'}" for h in d["hcas"]
               if states.get(h.split(":")[0]) != "ACTIVE"]
        if not f.get("present"):
            add("rdma", FAIL, "no RDMA devices (/sys/class/infiniband is missing)",
                "check the QSFP cable and the ConnectX driver: `rdma link` must show an ACTIVE port",
                specs[r].name)
        elif bad:
            add("rdma", FAIL, f"HCAs not ACTIVE: {', '.join(bad)} ({fabric.summary(f)})",
                f"set R{r}_HCAS to ACTIVE devices on the fabric (see `rdma link`)", specs[r].name)
        else:
            add("rdma", PASS, f"{','.join(d['hcas'])} ACTIVE", node=specs[r].name)

    head = fab.get(0)
    workers = [r for r in sorted(fab) if r != 0]
    if head and workers:
        # subnet
        bad = []
        for r in workers:
            w = fab[r]
            nets = [_net(x["ip"], x["prefixlen"]) for x in (head, w) if x["prefixlen"] is not None]
            if not nets:
                bad.append(f"{specs[r].name}: prefix unknown")
            elif not all(ipaddress.IPv4Address(y["ip"]) in n for n in nets for y in (head, w)):
                bad.append(f"{specs[r].name} {w['ip']}/{w['prefixlen']}")
        desc = ", ".join(f"{specs[r].name} {fab[r]['ip']}/{fab[r]['prefixlen']}" for r in sorted(fab))
        if bad:
            add("subnet", FAIL, f"fabric addresses not on one subnet: {desc}",
                "give every node's QSFP port an address on one subnet, or set R<N>_IP to the "
                "address on the shared subnet")
        else:
            add("subnet", PASS, f"one subnet: {desc}")

        # GID type
        types = {r: fab[r]["gid_type"] for r in sorted(fab)}
        desc = ", ".join(f"{specs[r].name} index {fab[r]['gid_index']} {types[r] or 'type unknown'}"
                         for r in types)
        known = {t for t in types.values() if t}
        if len(known) > 1:
            add("gid-type", FAIL, f"GID types differ: {desc}",
                "set R<N>_GID_INDEX (or NCCL_IB_GID_INDEX) to a RoCE v2 entry of the fabric address on "
                "every node (see /sys/class/infiniband/<hca>/ports/1/gid_attrs/types)")
        elif known != {fabric.ROCE_V2} or None in types.values():
            add("gid-type", WARN, f"not all RoCE v2 or unknown: {desc}",
                "point R<N>_GID_INDEX at the RoCE v2 GID of the fabric address")
        else:
            add("gid-type", PASS, f"same on all nodes: {desc}")

        # MTU and don't-fragment pings
        mtu = {r: (ok[r].get("mtus") or {}).get(fab[r]["ifname"]) or fab[r]["mtu"] for r in fab}
        for r in workers:
            pair = f"{specs[0].name} {fab[0]['ifname']} {mtu[0]}, {specs[r].name} {fab[r]['ifname']} {mtu[r]}"
            if not mtu[0] or not mtu[r]:
                add("mtu", WARN, f"MTU unknown: {pair}", "check `ip link` on both nodes")
            elif mtu[0] != mtu[r]:
                low = specs[0] if mtu[0] < mtu[r] else specs[r]
                add("mtu", FAIL, f"MTU differs: {pair}",
                    f"set the same MTU on both ends (on {low.name}: sudo ip link set dev "
                    f"{fab[low.rank]['ifname']} mtu {max(mtu[0], mtu[r])}, and persist it)")
            else:
                add("mtu", PASS, f"equal: {pair}")
            for a, b in ((0, r), (r, 0)):
                p = next((p for p in ok[a].get("pings", []) if p.get("peer") == fab[b]["ip"]), None)
                label = f"{specs[a].name} -> {specs[b].name} {fab[b]['ip']}"
                if p is None:
                    add("ping", WARN, f"{label}: not run", "run `doit preflight` again")
                elif p.get("ok"):
                    add("ping", PASS, f"{label}: {p['size']} bytes, don't fragment")
                else:
                    add("ping", FAIL, f"{label}: {p.get('size')} bytes don't fragment failed: {p.get('error')}",
                        f"check MTU on both ends, cable and addresses: {p.get('command') or 'ping -M do'}")

    for r, f in ok.items():
        s = specs[r]
        n = s.name
        # link speed (WARN only)
        if r in fab:
            sp = (f.get("speeds") or {}).get(fab[r]["ifname"]) or {}
            mbps = sp.get("mbps")
            if mbps is None:
                add("link-speed", WARN, f"{fab[r]['ifname']}: speed unknown ({sp.get('raw') or sp.get('error')})",
                    f"check the link: ethtool {fab[r]['ifname']}", n)
            elif mbps < MIN_SPEED_MBPS:
                add("link-speed", WARN, f"{fab[r]['ifname']}: {mbps} Mb/s, under {MIN_SPEED_MBPS} Mb/s",
                    "reseat the QSFP cable or reboot to renegotiate; expect 200000Mb/s in `ethtool`", n)
            else:
                add("link-speed", PASS, f"{fab[r]['ifname']}: {mbps} Mb/s", node=n)

        # docker and the NVIDIA runtime
        dk = f.get("docker") or {}
        if dk.get("ok"):
            add("docker", PASS, "answering", node=n)
            gpu = (f.get("tools") or {}).get("nvidia-smi")
            if "nvidia" in dk.get("runtimes", []) and gpu:
                add("nvidia-runtime", PASS, f"runtimes {','.join(dk['runtimes'])}; nvidia-smi present", node=n)
            else:
                missing = [] if "nvidia" in dk.get("runtimes", []) else [
                    f"no nvidia runtime (runtimes: {','.join(dk.get('runtimes', [])) or 'none'})"]
                missing += [] if gpu else ["nvidia-smi not found"]
                add("nvidia-runtime", FAIL, "; ".join(missing),
                    "install nvidia-container-toolkit, then sudo nvidia-ctk runtime configure "
                    "--runtime=docker && sudo systemctl restart docker", n)
        else:
            kind = dk.get("kind")
            fix = {"missing": "install Docker (DGX OS ships it): sudo apt-get install docker.io",
                   "permission": "add the user to the docker group: sudo usermod -aG docker $USER, "
                                 "then log in again",
                   "daemon": "start Docker: sudo systemctl enable --now docker",
                   "timeout": "dockerd does not answer: sudo systemctl restart docker"}.get(
                kind, "check `docker info` on this node")
            add("docker", FAIL, dk.get("error") or "docker facts missing", fix, n)

        # disk
        dsk = f.get("disk")
        if dsk and "error" not in dsk:
            want = (cfg.free_gib_head if r == 0 else cfg.free_gib_worker) * GIB
            need = max(0, want - dsk["model_bytes"])
            desc = (f"{_gib(dsk['free_bytes'])} free at {dsk['checked']} for {dsk['model_dir']} "
                    f"(needs {_gib(need)}; {_gib(dsk['model_bytes'])} of the model present)")
            if dsk["free_bytes"] < need:
                add("disk", FAIL, desc, f"free space there or point {'MODEL_DIR' if r == 0 else f'R{r}_MODEL_DIR'}"
                    " at a bigger disk", n)
            else:
                add("disk", PASS, desc, node=n)
        elif dsk:
            add("disk", FAIL, dsk["error"], "check the model dir path", n)

        # memory
        mem = f.get("memory") or {}
        running = _running_ranks(f)
        if running:
            add("memory", PASS, f"{','.join(running)} running here; available memory not checked", node=n)
        elif mem.get("available_bytes") is None or not mem.get("total_bytes"):
            add("memory", WARN, f"MemAvailable unknown ({mem.get('error', 'no /proc/meminfo')})", "", n)
        else:
            need = cfg.gpu_util * mem["total_bytes"]
            desc = (f"{_gib(mem['available_bytes'])} available of {_gib(mem['total_bytes'])}, "
                    f"needs {_gib(need)} (GPU_UTIL {cfg.gpu_util:g})")
            if mem["available_bytes"] < need:
                add("memory", FAIL, desc, "stop other GPU processes and containers (docker ps), drop the "
                    "page cache (sync; echo 3 | sudo tee /proc/sys/vm/drop_caches) or lower GPU_UTIL", n)
            else:
                add("memory", PASS, desc, node=n)

        # ports (head)
        if r == 0:
            used = f.get("ports") or {}
            for port, var in ((cfg.port, "PORT"), (cfg.mport, "MPORT")):
                if used.get(str(port)) is None:
                    add("ports", WARN, f"{var} {port}: not checked", "", n)
                elif not used[str(port)]:
                    add("ports", PASS, f"{var} {port} free", node=n)
                elif "dsv41-r0" in running:
                    add("ports", PASS, f"{var} {port} in use by the running dsv41-r0", node=n)
                else:
                    add("ports", FAIL, f"{var} {port} is in use", f"stop what listens there "
                        f"(sudo ss -ltnp 'sport = :{port}') or set {var} to a free port", n)

        # stale containers
        active = (f.get("units") or {}).get("active") or {}
        stale = [c for c in dk.get("containers", [])
                 if not (c.get("state") == "running" and active.get(c["name"] + ".service") == "active")]
        if not dk.get("ok"):
            pass
        elif not stale:
            add("stale-containers", PASS, "no dsv41-r* container outside its unit", node=n)
        else:
            desc = ", ".join(f"{c['name']} ({c['state']}, unit {active.get(c['name'] + '.service', 'unknown')})"
                             for c in stale)
            fix = "docker rm -f " + " ".join(c["name"] for c in stale)
            if any(c.get("state") == "running" for c in stale):
                add("stale-containers", FAIL, f"running outside their units: {desc}", fix, n)
            else:
                add("stale-containers", WARN, f"left over (removed at start): {desc}", fix, n)

        # kernel
        k = f.get("kernel") or {}
        rel, cmdline = k.get("release", ""), (k.get("cmdline") or "").split()
        hit = next((b for b in KNOWN_BAD_KERNELS if rel.startswith(b[0]) and b[1] not in cmdline), None)
        if hit:
            add("kernel", FAIL, f"{rel} without {hit[1]}: {hit[2]}",
                f"add {hit[1]} to GRUB_CMDLINE_LINUX in /etc/default/grub, sudo update-grub, reboot "
                "(or boot another kernel)", n)
        else:
            add("kernel", PASS, f"{rel or 'unknown'} not on the known-bad list", node=n)

        # clock (workers; head timestamps around the call)
        if r != 0 and all(isinstance(f.get(x), (int, float)) for x in ("time", "_t0", "_t1")):
            t, t0, t1 = f["time"], f["_t0"], f["_t1"]
            skew = 0.0 if t0 <= t <= t1 else min(abs(t - t0), abs(t - t1))
            if skew > MAX_SKEW_S:
                add("clock", WARN, f"{skew:.1f} s off the head's clock",
                    "enable time sync on every node: sudo timedatectl set-ntp true", n)
            else:
                add("clock", PASS, f"within {MAX_SKEW_S:g} s of the head ({skew:.1f} s)", node=n)

        # tools
        tools = f.get("tools") or {}
        miss = [t for t in ("rsync", "curl") if tools.get(t) is False]
        if miss:
            add("tools", FAIL, f"missing: {', '.join(miss)}", f"sudo apt-get install {' '.join(miss)}", n)
        else:
            add("tools", PASS, "python3, rsync, curl present", node=n)

    return [c._replace(status=WARN, detail=f"skipped on request ({c.status}: {c.detail})")
            if c.name in skip and c.status != PASS else c for c in out]


# ---- gathering (one facts call per node) ----------------------------------------------------------

def _facts_call(cfg, spec, node, args):
    try:
        home = node.home()
        prefix = nodes.ship_code(node, cfg.state_dir_on(spec, home))
        argv = prefix + ["dsv41.facts", *args]
        t0 = time.time()
        r = node.run(argv, timeout=180)
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


def gather_facts(cfg, progress=None):
    """{rank: facts dict} (or {"error": ...} for a node that cannot be reached). One facts call per
    node; pings are folded in when the peer's address is known beforehand, else the head pings in a
    second call."""
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    ns = {s.rank: nodes.Node.from_spec(s, cfg) for s in cfg.nodes}
    known = {s.rank: s.ip or fabric.target_ip(s) for s in cfg.workers}
    out = {}
    head = cfg.head
    peer = fabric.peer_of(cfg, 0, {})
    args = ["--model-dir", cfg.model_dir, "--ports", f"{cfg.port},{cfg.mport}", *_override_args(head)]
    args += ["--peer", peer] if peer else []
    pinged = [ip for ip in known.values() if ip]
    args += ["--ping", ",".join(pinged)] if pinged else []
    say(f"facts: {ns[0].label}")
    out[0] = _facts_call(cfg, head, ns[0], args)
    head_ip = None
    if "error" not in out[0]:
        head_ip = fabric.decide_all(cfg, {0: out[0]})[0]["ip"]
    for s in cfg.workers:
        n = ns[s.rank]
        say(f"facts: {n.label}")
        try:
            model_dir = cfg.model_dir_on(s, n.home())
        except UserError as err:
            out[s.rank] = {"error": str(err)}
            continue
        args = ["--model-dir", model_dir, *_override_args(s)]
        args += ["--peer", head_ip, "--ping", head_ip] if head_ip else []
        out[s.rank] = _facts_call(cfg, s, n, args)
    # second head call: ping workers whose fabric address became known only now
    decided = fabric.decide_all(cfg, {r: f for r, f in out.items() if "error" not in f})
    late = [decided[r]["ip"] for r in known if r in decided and decided[r]["ip"]
            and decided[r]["ip"] not in pinged]
    if late and "error" not in out[0] and decided.get(0, {}).get("ifname"):
        say(f"ping: {ns[0].label} -> {', '.join(late)}")
        extra = _facts_call(cfg, head, ns[0], ["--ping-only", "--ping", ",".join(late),
                                               "--ifname", decided[0]["ifname"]])
        out[0]["pings"] = out[0].get("pings", []) + extra.get("pings", [])
    return out


def run_preflight(cfg, as_json=False, facts=None, progress=None, brief=False):
    """Print one line per check (or JSON); returns the exit code: 1 on any FAIL, else 0.
    brief (launch): only FAIL lines and warnings not skipped on request, then the summary."""
    skip = skip_set(cfg)
    facts = gather_facts(cfg, progress) if facts is None else facts
    results = checks(cfg, facts, skip)
    failed = any(c.status == FAIL for c in results)
    if as_json:
        print(json.dumps({"ok": not failed, "checks": [c._asdict() for c in results]}, indent=2))
    else:
        for c in results:
            if not brief or c.status == FAIL or (c.status == WARN and "skipped on request" not in c.detail):
                print(c.line())
        n = {s: sum(c.status == s for c in results) for s in (PASS, WARN, FAIL)}
        print(f"preflight: {n[PASS]} passed, {n[WARN]} warnings, {n[FAIL]} failed")
    return 1 if failed else 0


def task(cfg, json=False):
    """`doit preflight [--json]`: False (the task fails) on any FAIL."""
    return run_preflight(cfg, as_json=json) == 0


def preflight_for_launch(cfg):
    """The first step of `doit launch`: print the checks, stop on any FAIL, return the facts."""
    facts = gather_facts(cfg)
    if run_preflight(cfg, facts=facts, brief=True):
        raise UserError("preflight failed: fix the FAIL lines above, then launch again "
                        "(SKIP_CHECKS=name,... turns a check that cannot pass into a warning)")
    return facts
