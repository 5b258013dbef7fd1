"""Preflight: gather facts from every node (one `python3 -m dsv41.node.facts` per node), decide the
fabric once, then judge with pure checks, and report. Changes nothing. The checks are functions in
core.network_checks and core.host_checks, each registered by @check in the order it prints; each yields
PASS, WARN or FAIL lines, each with the fix (core.checks)."""
import json
import sys
import time
from typing import NamedTuple

from dsv41.errors import UserError, one_line
from dsv41.head.core import fabric, host_checks, network_checks
from dsv41.head.core.checks import FAIL, PASS, WARN, Check
from dsv41.head.core.cluster import Cluster

FACTS_TIMEOUT_S = 180          # bound on one node's facts call

# --json: {"schema": SCHEMA, "ok": bool, "checks": [{"name", "status", "detail", "fix", "node"}]}
SCHEMA = "dsv41.preflight/1"


class Gathered(NamedTuple):
    """What one preflight run learned: {rank: facts} and the fabric decision made from them."""
    facts: dict
    decided: dict

    def fabric(self, cfg):
        """{rank: Fabric} resolved from the decision and the overrides (core.fabric.resolve)."""
        return fabric.resolve(cfg, self.decided)


CHECKS = {**network_checks.CHECKS, **host_checks.CHECKS}   # name -> (function, per_node), in the order they print


class Context:
    """The facts every check reads: the configured nodes, the nodes that answered, the fabric decision,
    what is wrong with each answering node's fabric (None when settled) and the nodes whose fabric is settled."""

    def __init__(self, cfg, facts, decided):
        self.cfg, self.all_facts, self.decided = cfg, facts, decided
        self.specs = {s.rank: s for s in cfg.nodes}
        self.ok = _answered(facts)
        self.problems = {r: network_checks.fabric_problem(self, r) for r in self.ok}
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
    public, *behind = cfg.layout.ports
    ports = [p for p, _ in (public, (cfg.mport, "MPORT"), *behind)]
    args = ["--model-dir", cfg.model_dir, "--ports", ",".join(map(str, ports)), *_override_args(head)]
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
    decided = fabric.decide_all(cfg, out)    # a node that did not answer: its error, as why it has no facts
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
