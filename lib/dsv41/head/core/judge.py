"""The watchdog's judgement: from one observation (every node's probe, the API's /health, the engine's
/metrics, the token probe) and what it remembers, a verdict with its evidence. Pure: no I/O; the
recipe names the engine's units and the metrics that show work and progress.

A stall is confirmed before it is called a hang: when work runs or waits and none of the recipe's
progress signals has moved for WATCHDOG_STALL_S, wants_probe() asks the watchdog for its own one-token
probe; a token back is BUSY (a long prefill, however long it runs), none within WATCHDOG_PROBE_S is
WEDGED. Each verdict that may call for a recovery carries fault_at (Memory): when the fault began, the
last progress seen or the first failed look."""
import dataclasses

from dsv41.head.core.decide import stale_workers
from dsv41.head.core.hang import Progress

HEALTHY, BUSY, STARTING, STOPPED, SUSPECT = "HEALTHY", "BUSY", "STARTING", "STOPPED", "SUSPECT"
DEGRADED, DEAD, WEDGED, TRIPPED, UNKNOWN = "DEGRADED", "DEAD", "WEDGED", "TRIPPED", "UNKNOWN"
NEEDS_REBOOT = "NEEDS_REBOOT"       # the watchdog's own: a restart found a node's memory not back (core.recovery)
VERDICTS = (HEALTHY, BUSY, STARTING, STOPPED, SUSPECT, DEGRADED, DEAD, WEDGED, TRIPPED, UNKNOWN, NEEDS_REBOOT)
ACT_ON = (DEGRADED, DEAD, WEDGED)
TOKEN, NO_TOKEN = "token", "no token"


@dataclasses.dataclass
class Observation:
    time: float
    nodes: dict                      # node name -> state.NodeState (its error set when it did not answer)
    health: int | None               # /health status, None: no answer
    metrics: object | None           # the engine's /metrics snapshot (dsv41.client.metrics.Snapshot)
    probe: str | None                # None (not sent), TOKEN, NO_TOKEN, or "error ..." (5xx, no answer)
    ready_at: float | None = None    # when a readiness wait (launch's, a recovery's) last saw a token (head's clock)


@dataclasses.dataclass
class Memory:
    """What judge() remembers between intervals."""
    dead_streak: int = 0             # intervals in a row the API did not answer or answered 5xx
    progress: Progress | None = None  # the recipe's progress signals last seen, and since when flat
    ready_start: float | None = None  # rank 0's start (its node's clock) for which a token came back
    fault_at: float | None = None    # when the current fault began (None: no fault)
    ran: bool = False                # every engine unit was seen active since the watchdog started


FAULTS = (SUSPECT, DEGRADED, DEAD, WEDGED)


def tracker(mem, recipe):
    if mem.progress is None:
        mem.progress = Progress.for_recipe(recipe)
    return mem.progress


def stalled_for(mem, snap, recipe):
    """Seconds every progress signal has been flat with work running or waiting, as of snap, without
    changing the memory."""
    return dataclasses.replace(tracker(mem, recipe)).update(snap)


def wants_probe(cfg, mem, snap, recipe):
    """Should the watchdog send its one-token probe this interval? When idle (or /metrics unread), and
    when work has made no progress for WATCHDOG_STALL_S (to tell a long prefill from a hang)."""
    if snap is None or not any(recipe.work(snap)):
        return True
    return stalled_for(mem, snap, recipe) >= cfg.watchdog_stall_s


def judge(cfg, obs, mem, recipe):
    """(verdict, evidence) from one observation and the memory, which it updates (mem.fault_at: when
    the fault the verdict names began). Pure: no I/O."""
    verdict, evidence = _judge(cfg, obs, mem, recipe)
    if verdict in FAULTS:
        if verdict == WEDGED and mem.progress is not None and mem.progress.last_progress is not None:
            mem.fault_at = min(mem.fault_at or obs.time, mem.progress.last_progress)
        elif mem.fault_at is None:
            mem.fault_at = obs.time
    elif verdict not in (UNKNOWN, TRIPPED):
        mem.fault_at = None
    return verdict, evidence


def _judge(cfg, obs, mem, recipe):
    lost = [f"{n}: {f.error}" for n, f in obs.nodes.items() if f.error]
    if lost:
        return UNKNOWN, "no fresh facts from " + "; ".join(lost)
    going = [n for n, f in obs.nodes.items() if f.system == "stopping"]
    if going:               # its units stop because it shuts down: wait until it is back (or gone)
        return UNKNOWN, f"{', '.join(going)} is shutting down"
    tripped = [n for n, f in obs.nodes.items() if f.tripped]
    if tripped:
        return TRIPPED, f"the memory guard is tripped on {', '.join(tripped)}"
    units = {(s.name, u): obs.nodes[s.name].unit(u) for s in cfg.nodes for u in recipe.units(s)}
    states = {k: u.active or "not installed" for k, u in units.items()}
    if all(st == "inactive" and units[k].result == "success" for k, st in states.items()):
        if mem.ran:         # `doit stop` and `doit clear-trip` stop the watchdog before the ranks
            return DEAD, ("every rank exited by itself while the watchdog ran (a node rebooted, or its Docker "
                          "restarted?)")
        return STOPPED, "every rank is stopped; `doit launch` starts them"
    mem.ran = mem.ran or all(st == "active" for st in states.values())
    head = cfg.nodes[0]
    r0_start = max(units[head.name, u].since for u in recipe.units(head))   # the head's latest start
    if obs.ready_at is not None and obs.ready_at >= r0_start:
        mem.ready_start = r0_start      # a readiness wait saw this start of rank 0 generate
    r0_age = obs.nodes[head.name].time - r0_start
    starting = (all(states[head.name, u] == "active" for u in recipe.units(head))
                and mem.ready_start != r0_start and r0_age < cfg.start_timeout_s)
    down = [f"{unit} on {node} is {st}" for (node, unit), st in states.items() if st != "active"]
    stale = stale_workers(cfg.nodes, obs.nodes, recipe)
    if down or stale:
        return DEGRADED, "; ".join(down + stale)
    broken = (f"/health {obs.health or 'does not answer'}" if obs.health is None or obs.health >= 500
              else f"the probe got {obs.probe}" if (obs.probe or "").startswith("error") else None)
    if broken:
        if starting:
            return STARTING, f"ranks started {r0_age:.0f} s ago; {broken}"
        mem.dead_streak += 1
        return (DEAD if mem.dead_streak >= 2 else SUSPECT), f"{broken} ({mem.dead_streak} interval(s) in a row)"
    mem.dead_streak = 0
    if obs.metrics is not None:
        work = recipe.work(obs.metrics)
        flat = tracker(mem, recipe).update(obs.metrics)
        if any(work):
            doing = ", ".join(f"{v:.0f} {word}" for v, word in zip(work, recipe.work_words))
            if flat < cfg.watchdog_stall_s:
                moved = ", ".join(m.split(":")[-1] for m in mem.progress.moved)
                return BUSY, f"{doing}, " + (f"progress: {moved}" if moved else f"progress seen {flat:.0f} s ago")
            still = f"{doing}, and no progress signal moved for {flat:.0f} s (WATCHDOG_STALL_S {cfg.watchdog_stall_s})"
            if obs.probe == TOKEN:
                mem.ready_start = r0_start
                return BUSY, f"{still}, but the probe got a token: a long step, not a hang"
            if obs.probe == NO_TOKEN:
                return WEDGED, f"{still}, and the probe got no token within {cfg.watchdog_probe_s} s (WATCHDOG_PROBE_S)"
            return BUSY, f"{still}; a one-token probe confirms before anything is done"
    if obs.probe == NO_TOKEN:
        if starting:
            return STARTING, f"ranks started {r0_age:.0f} s ago; no token yet"
        return WEDGED, f"the idle probe got no token within {cfg.watchdog_probe_s} s (WATCHDOG_PROBE_S)"
    if obs.probe == TOKEN:
        mem.ready_start = r0_start
    elif starting:
        return STARTING, f"ranks started {r0_age:.0f} s ago; not ready yet"
    return HEALTHY, "every rank is up and a token came back" if obs.probe == TOKEN else "every rank is up"
