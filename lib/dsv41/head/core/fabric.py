"""The fabric decision for the whole cluster, made once per run on the head: each node's detected facts
(dsv41.node.fabric.choose) with the overrides (R<N>_IP, _IFNAME, _HCAS, _GID_INDEX, NCCL_IB_GID_INDEX)
winning, the head first so that every worker is matched to the head's subnet."""
import ipaddress
from typing import NamedTuple

from dsv41.errors import UserError
from dsv41.node.fabric import choose, explain


class Fabric(NamedTuple):
    ip: str
    ifname: str
    hcas: tuple
    gid_index: int


def variables(rank):
    """The override variables of one rank, for messages."""
    prefix = {0: "HEAD_", 1: "WORKER_"}.get(rank)
    names = lambda p: "/".join(p + k for k in ("IP", "IFNAME", "HCAS", "GID_INDEX"))
    return f"{names(prefix)} (or {names(f'R{rank}_')})" if prefix else names(f"R{rank}_")


def gid_override(cfg, spec):
    return spec.gid_index if spec.gid_index is not None else cfg.nccl_ib_gid_index


def from_overrides(cfg):
    """{rank: Fabric} when every per-node value is given by override (no node needs contacting), else None."""
    out = {}
    for s in cfg.nodes:
        gid = gid_override(cfg, s)
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
    """{rank: decided dict (with its "facts")} for every node, overrides applied. Head first, so the
    workers' peer is the head's resolved address. Pure."""
    out, ips = {}, {}
    for s in cfg.nodes:
        node_facts = facts_by_rank.get(s.rank)
        f = (node_facts or {}).get("fabric")
        if f is None or "error" in f:
            why = (f or {}).get("error") or (node_facts or {}).get("error") or "no facts gathered"
            f = {"present": False, "devices": [], "addrs": [], **(f or {}), "error": why}
        d = choose(f, peer=peer_of(cfg, s.rank, ips), ip=s.ip, ifname=s.ifname, hcas=s.hcas,
                   gid_index=gid_override(cfg, s))
        out[s.rank] = {**d, "facts": f}
        if d["ip"]:
            ips[s.rank] = d["ip"]
    return out


def resolve(cfg, decided):
    """{rank: Fabric} from decide_all's result; UserError naming the node and the variable when a value
    is neither given nor detected."""
    out = {}
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
