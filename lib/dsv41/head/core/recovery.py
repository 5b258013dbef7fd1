"""The one ordered restart of the engine's ranks, as `doit launch` and the watchdog both perform it:

    1. for a fault: the incident opened in the record, then its evidence saved (core.incidents), then the
       ranks' containers killed (a stopped or wedged process never takes a graceful stop's SIGTERM)
    2. every engine unit stopped in the recipe's stop order, then the engine's caches compared between the
       ranks (core.caches: a library's that some ranks hold and others not cleared on every node) and old
       images' removed
    3. each node's memory baseline recorded where the rule allows (record_baselines), then every node's
       memory checked against it (core.hang.memory_returned): when a node's did not come back nothing
       starts, $STATE_DIR/needs-reboot.json names it (NeedsReboot; --force starts anyway)
    4. every engine unit started in the recipe's start order
    5. the readiness wait: a generated token (core.ranks.wait_ready); then, for a fault, the start-up's
       phases, read from rank 0's journal, kept in the incident (`startup`) and as the last start-up
       (core.startup; a planned restart's are its release's, read by core.rollout)

Each step is written to the incident before it is taken, so `doit status` shows what a recovery waits
for, and an incident whose process died mid-way is found open and closed as interrupted."""
import json
import os
import signal
import time

from dsv41 import names
from dsv41.errors import UserError, one_line
from dsv41.head.core import apikey, caches, hang, incidents, ranks, record, runlock
from dsv41.head.core.health import DEGRADED, Health, node_memory

EVIDENCE_DEADLINE_S = 30          # per node


class NeedsReboot(UserError):
    pass


def save_evidence(cl, health, log=print, name=None):
    """The incident folder (before anything is stopped), or None when it could not be written (a
    recovery never waits on its evidence failing)."""
    cfg = cl.cfg
    try:
        engine_key = apikey.engine_key(cfg)
        keys = (apikey.read_key(cfg), engine_key, cfg.hf_token, apikey.group_key(cfg, cfg.scope or 0))
        folder = incidents.capture(cl, cfg.records, health.verdict.value, health.evidence, fault_at=health.fault_at,
                                   metrics_url=cl.recipe.metrics_url(), secrets=keys, keep=cfg.incidents_keep,
                                   node_deadline_s=EVIDENCE_DEADLINE_S, name=name,
                                   metrics_key=engine_key if cfg.scope else None)     # a side door wants the key
    except Exception as err:  # noqa: BLE001 - evidence is best effort
        log(f"could not save the incident's evidence: {type(err).__name__}: {one_line(err, 200)}")
        return None
    log(f"saved the evidence in {folder}")
    return folder


def fault(line, at):
    """The Health of a fault found outside core.health's look (a release that failed): DEGRADED, restart."""
    return Health(DEGRADED, (line,), fault_at=at, action="restart")


def evidence_only(cl, fault, result, by="doit launch", log=print):
    """A fault nothing restarts (a failed first release): its incident, with the evidence, closed at once
    with `result`. -> the incident."""
    sd = cl.cfg.records
    inc = record.open_incident(sd, verdict=fault.verdict.value, evidence=fault.evidence, fault_at=fault.fault_at,
                               node=fault.node, action="none", by=by)
    folder = save_evidence(cl, fault, log, name=inc["id"])
    if folder:
        inc = record.set_phase(sd, inc, "evidence saved", folder=os.path.basename(folder))
    inc = record.close_incident(sd, inc, result)
    if folder:
        incidents.record_result(folder, result, ended=inc["ended"])
    return inc


# ---- memory ---------------------------------------------------------------------------------------------

def first_since_boot(f, units):
    """Is this the node's first rank start since it booted: no baseline yet, or one recorded in an earlier
    boot (a baseline of an earlier version, without its boot, is kept and compared), with its engine units
    stopped? (systemd forgets a stopped unit's timestamps, so the boot id is what tells.)"""
    fresh = not f.mem_baseline_bytes or (f.mem_baseline_boot is not None and f.mem_baseline_boot != f.boot_id)
    return fresh and all(f.unit(u).active not in ("active", "activating") for u in units)


def record_baselines(cl, states, log=print):
    """The one baseline rule: a node's MemAvailable becomes its baseline only before its first rank start
    since it booted (its memory is as the boot left it). Every other restart only compares, so memory a
    restart did not get back never becomes the new baseline, with or without --force."""
    for node in cl.nodes:
        f = states[node.name]
        if f.error or not f.mem_available_kib or not f.boot_id or not first_since_boot(f, cl.engine_units(node)):
            continue
        data = {"mem_available_bytes": f.mem_available_kib * 1024, "time": time.time(), "boot_id": f.boot_id}
        node.write_file(f"{cl.paths(node).state_dir}/{names.MEM_BASELINE}", json.dumps(data) + "\n")
        log(f"{node.label}: recorded MemAvailable {f.mem_available_kib / 2**20:.1f} GiB, before its first rank since it "
                  "booted, as the baseline its memory must come back to after a restart")


def wait_memory(cl, log=print):
    """After the ranks stopped: wait up to MEM_RETURN_S for every node's memory -> hang.MemoryCheck."""
    def read():
        return node_memory(cl.observe())[1]
    check = hang.wait_memory_back(read, node_memory(cl.observe())[0], return_gib=cl.cfg.mem_return_gib,
                                  return_s=cl.cfg.mem_return_s, clock=time.monotonic, sleep=time.sleep)
    for w in check.warnings:
        log(f"warning: {w}")
    return check


# ---- the restart ----------------------------------------------------------------------------------------

def door(cl, log, closed_why=None, starting=False, drain=False):
    """The gateway's door, opened and closed here only (the restart's steps, `doit stop`, the watchdog):
    closed (503 naming closed_why; starting: with the expected start-up as Retry-After; drain: then the
    requests in flight finish, DRAIN_S at most) or, without a reason, open. With GATEWAY=0 nothing is done.
    A gateway that cannot be told is said and never stops a restart (its own health check answers 503)."""
    try:
        if closed_why and drain:
            line = cl.gateway.drain(closed_why, starting)
            if line:
                log(line)
        elif closed_why:
            cl.gateway.close(closed_why, starting)
        else:
            cl.gateway.open()
    except UserError as err:
        log(f"warning: the gateway's door could not be {'closed' if closed_why else 'opened'}: {one_line(err, 200)}")


def open_left_closed(cl, log):
    """The door left closed while the engine is ready (a command that died after its drain, a door that
    could not be opened) opens, unless `doit stop` closed it. -> a line, or None when it was open."""
    if not cl.gateway.on:
        return None
    st = cl.gateway.state()
    if st["door"] == "closed" and st["reason"] != cl.gateway.STOPPED:
        door(cl, log)
        return f"the gateway's door was left closed ({st['reason']}) with the engine ready: opened"
    return None


def restart(cl, *, fault=None, by="doit launch", force=False, log=print, on_phase=None, clock=time.time,
            within=None, why=None):
    """The ordered restart above. fault: the Health that calls for it (None: a planned restart, no
    incident). by: who restarts ("dsv41-watchdog" for the watchdog, whose restarts its budget counts).
    on_phase(incident) is called each time the incident moves on, and once it closed (the watchdog
    publishes it); clock
    times the incident (the caller's); within: the readiness wait's (seconds, what sets them), default
    START_TIMEOUT_MIN's (a rollout passes its deadline); why: what the gateway's 503s say meanwhile (default
    "recovering from <verdict>" for a fault: its door closes at once; core.rollout drains it before a planned
    restart, outside the start-up it measures).
    -> the closed incident (None without a fault). Raises NeedsReboot (nothing started), or UserError
    when a step failed; the incident is closed with that result either way."""
    state_dir = cl.cfg.records            # the state dir, or one group's records (GROUPS > 1)
    inc = opened(state_dir, fault, by, clock)

    def phase(what, **fields):
        nonlocal inc
        if inc is not None:
            inc = record.set_phase(state_dir, inc, what, **fields)
            if on_phase:
                on_phase(inc)

    if inc is not None and on_phase:
        on_phase(inc)
    result = "interrupted: the recovery was stopped"
    door(cl, log, why or (f"recovering from {fault.verdict.value}" if fault is not None else f"restarting ({by})"),
         starting=True)
    try:
        stop_and_start(cl, fault, inc, phase, force=force, within=within, log=log)
        result = "READY"
        door(cl, log)
    except NeedsReboot as err:
        result = str(err)
        door(cl, log, result)
        raise
    except UserError as err:
        result = f"failed: {one_line(err, 300)}"
        door(cl, log, f"not ready: {one_line(err, 150)}")
        raise
    finally:
        if inc is not None:
            inc = closed(state_dir, inc, result, clock(), on_phase)
    return inc


def opened(state_dir, fault, by, clock):
    """The incident a fault opens before anything is done (None for a planned restart): its action is the
    Health's start, the watchdog's restart, or who else restarts."""
    if fault is None:
        return None
    action = "start" if fault.action == "start" else record.RESTART if by == "dsv41-watchdog" else by
    return record.open_incident(state_dir, verdict=fault.verdict.value, evidence=fault.evidence,
                                fault_at=fault.fault_at, node=fault.node, action=action, by=by, now=clock())


def stop_and_start(cl, fault, inc, phase, *, force, within, log):
    """Steps 1-5 above, each told to phase(what, **fields) before it is taken. Raises NeedsReboot (recorded
    in $STATE_DIR, nothing started) when a node's memory did not come back, unless force."""
    state_dir = cl.cfg.records
    if fault is not None and fault.action != "start":
        folder = save_evidence(cl, fault, log, name=inc["id"])
        phase("killing the broken containers", folder=folder and os.path.basename(folder))
        ranks.kill_ranks(cl)
    phase("stopping the ranks in order")
    ranks.stop_ranks(cl)
    states = cl.observe(caches=True)
    record_baselines(cl, states, log)
    caches.tidy(cl, states, log)             # the ranks' caches the same on every node before they start
    phase("waiting for every node's memory to come back (MEM_RETURN_S)")
    check = wait_memory(cl, log)
    if check.verdict == hang.SHORT and not force:
        record.set_needs_reboot(state_dir, check.line())
        raise NeedsReboot(f"NEEDS_REBOOT: {check.line()}")
    if check.verdict != hang.BACK:
        log(f"warning: {check.line()}; starting anyway")
    record.clear_needs_reboot(state_dir)
    phase("starting the ranks in order")
    began = time.time()
    ranks.start_ranks(cl)
    phase(f"waiting for a token ({within[1] if within else 'START_TIMEOUT_MIN'})")
    ranks.wait_ready(cl, within)
    if inc is not None:                 # a planned restart's start-up is its release's: the rollout reads it
        measured = ranks.measured(cl, "recovery", inc["id"], began)
        if measured:
            phase("served", startup=measured)


def closed(state_dir, inc, result, ended, on_phase):
    """The incident closed with `result` at `ended`, its evidence folder told the same; on_phase sees it.
    -> the closed incident."""
    inc = record.close_incident(state_dir, inc, result, ended=ended)
    if inc.get("folder"):
        incidents.record_result(incidents.folder_of(state_dir, inc["folder"]), result, ended=inc["ended"])
    if on_phase:
        on_phase(inc)
    return inc


# ---- one group taken out ------------------------------------------------------------------------------

def take_out(cl, why, log=print):
    """One serving group's Cluster (GROUPS > 1) taken out while the others serve (`doit stop --group`): its
    watchdog told to keep its hands off until `doit launch` (why, in its records) before anything, a recovery
    it has in progress ended, then under its run lock its server drained at the door, its ranks stopped in
    order, its memory guards and side door. UserError naming a node that did not answer."""
    already = record.gave_up(cl.cfg.records)
    record.set_gave_up(cl.cfg.records, why, time.time())
    end_recovery(cl.cfg.records)
    try:
        runlock.take(cl.cfg.records, "doit stop --group")
    except UserError:               # a doit run holds the whole: nothing was done, the watchdog acts again
        if not already:
            record.clear_gave_up(cl.cfg.records)
        raise
    cl.connect()
    door(cl, log, "stopped", drain=True)
    for spec, unit in cl.recipe.stop_order(cl.cfg.nodes):
        if not cl.node(spec).unreachable:
            cl.systemctl(cl.node(spec), "stop", unit, check=False)
    missed = [n for n in cl.nodes if n.unreachable]
    for node in cl.nodes:
        if not node.unreachable:
            cl.systemctl(node, "stop", names.MEMGUARD_UNIT, names.SIDE_DOOR_UNIT, check=False)
    if missed:
        raise UserError("not stopped: " + "; ".join(f"{n.label} did not answer ({one_line(n.unreachable, 160)})"
                                                    for n in missed) + "; run it again once it answers")


def end_recovery(records, wait_s=60):
    """A recovery a group's watchdog has in progress (it holds the group's run lock) ended: SIGTERM to it (its
    records say hands off, so it stays off), then its lock waited for, wait_s at most."""
    who = runlock.holder(records) or ""
    if who.startswith("pid ") and "dsv41-watchdog" in who:
        try:
            os.kill(int(who.split()[1].rstrip(":")), signal.SIGTERM)
        except (ValueError, ProcessLookupError, PermissionError):
            pass
    end = time.monotonic() + wait_s
    while runlock.holder(records) and time.monotonic() < end:
        time.sleep(0.5)
