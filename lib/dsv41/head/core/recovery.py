"""A restart of the engine's ranks after a fault, as the watchdog and `doit launch` perform it: the
evidence saved first (an incident folder, core.incidents), then the ranks' containers killed and their
units stopped in the recipe's order (no stop grace for processes that cannot take it),
then every node's memory checked against the baseline recorded before its first rank started
(core.hang.memory_returned); only when it came back are the ranks started again. When it did not,
nothing starts: $STATE_DIR/needs-reboot.json on the head names the node and the missing GiB, the
watchdog stops acting and `doit launch` refuses (until the memory is back, or `--force`)."""
import json
import os
import time

from dsv41 import names
from dsv41.errors import UserError, one_line
from dsv41.files import write_atomic
from dsv41.head.core import apikey, hang, incidents, ranks
from dsv41.head.core.cluster import say

EVIDENCE_DEADLINE_S = 30          # per node


class NeedsReboot(UserError):
    pass


def save_evidence(cl, verdict, evidence, fault_at, log=print):
    """The incident folder (before anything is stopped), or None when it could not be written (a
    recovery never waits on its evidence failing)."""
    cfg = cl.cfg
    try:
        folder = incidents.capture(cl, cfg.state_dir, verdict, evidence, fault_at=fault_at,
                                   metrics_url=cl.recipe.metrics_url(), secrets=(apikey.read_key(cfg), cfg.hf_token),
                                   keep=cfg.incidents_keep, node_deadline_s=EVIDENCE_DEADLINE_S)
    except Exception as err:  # noqa: BLE001 - evidence is best effort
        log(f"could not save the incident's evidence: {type(err).__name__}: {one_line(err, 200)}")
        return None
    log(f"saved the evidence in {folder}")
    return folder


# ---- memory ---------------------------------------------------------------------------------------------

def memory_now(states):
    """({node: baseline bytes}, {node: MemAvailable bytes or None}) from NodeStates."""
    base = {n: f.mem_baseline_bytes for n, f in states.items() if f.mem_baseline_bytes}
    avail = {n: (None if f.error or not f.mem_available_kib else f.mem_available_kib * 1024)
             for n, f in states.items()}
    return base, avail


def check_now(cfg, states):
    """hang.MemoryCheck of the nodes' states as they are."""
    base, avail = memory_now(states)
    return hang.memory_returned(base, avail, cfg.mem_return_gib)


def wait_memory(cl, log=print):
    """After the ranks stopped: wait up to MEM_RETURN_S for every node's memory -> hang.MemoryCheck."""
    def read():
        return memory_now(cl.observe())[1]
    check = hang.wait_memory_back(read, memory_now(cl.observe())[0], return_gib=cl.cfg.mem_return_gib,
                                  return_s=cl.cfg.mem_return_s, clock=time.monotonic, sleep=time.sleep)
    for w in check.warnings:
        log(f"warning: {w}")
    return check


def record_baselines(cl, states, force=False):
    """Before the ranks start: each node without a baseline (every node with force) whose engine units
    are all stopped gets its MemAvailable now as its baseline."""
    for node in cl.nodes:
        f = states[node.name]
        if f.error or not f.mem_available_kib or (f.mem_baseline_bytes and not force):
            continue
        if any(f.unit(u).active in ("active", "activating") for u in cl.engine_units(node)):
            continue
        data = {"mem_available_bytes": f.mem_available_kib * 1024, "time": time.time()}
        node.write_file(f"{cl.paths(node).state_dir}/{names.MEM_BASELINE}", json.dumps(data) + "\n")
        say(node, f"recorded MemAvailable {f.mem_available_kib / 2**20:.1f} GiB as the baseline its memory "
                  "must come back to after a restart")


def needs_reboot(state_dir):
    """The head's NEEDS_REBOOT record ({"time", "line"}) or None."""
    try:
        with open(names.state_path(state_dir, names.NEEDS_REBOOT)) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


def set_needs_reboot(state_dir, line):
    write_atomic(names.state_path(state_dir, names.NEEDS_REBOOT), json.dumps({"time": time.time(), "line": line}) + "\n")


def clear_needs_reboot(state_dir):
    try:
        os.unlink(names.state_path(state_dir, names.NEEDS_REBOOT))
    except FileNotFoundError:
        pass


# ---- the restart ----------------------------------------------------------------------------------------

def restart(cl, *, force=False, log=print):
    """Kill the ranks' containers and stop their units in order, wait for every node's memory, then start
    them in order. NeedsReboot (nothing started) when a node's memory did not come back, unless force."""
    ranks.kill_ranks(cl)
    ranks.stop_ranks(cl)
    start_when_memory_back(cl, force=force, log=log)


def start_when_memory_back(cl, *, force=False, log=print):
    check = wait_memory(cl, log)
    if check.verdict == hang.NEEDS_REBOOT and not force:
        set_needs_reboot(cl.cfg.state_dir, check.line())
        raise NeedsReboot(f"NEEDS_REBOOT: {check.line()}")
    if check.verdict != hang.OK:
        log(f"warning: {check.line()}; starting anyway" if force or check.verdict == hang.UNKNOWN else check.line())
    clear_needs_reboot(cl.cfg.state_dir)
    ranks.start_ranks(cl)
