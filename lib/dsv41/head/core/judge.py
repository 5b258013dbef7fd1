"""The watchdog's judgement: from one observation (every node's probe, the API's /health, the engine's
/metrics, the token probe) and what it remembers, a verdict with its evidence. Pure: no I/O; the
recipe names the engine's units and the metrics that show work and progress."""
import dataclasses

from dsv41.head.core.decide import stale_workers

HEALTHY, BUSY, STARTING, STOPPED, SUSPECT = "HEALTHY", "BUSY", "STARTING", "STOPPED", "SUSPECT"
DEGRADED, DEAD, WEDGED, TRIPPED, UNKNOWN = "DEGRADED", "DEAD", "WEDGED", "TRIPPED", "UNKNOWN"
VERDICTS = (HEALTHY, BUSY, STARTING, STOPPED, SUSPECT, DEGRADED, DEAD, WEDGED, TRIPPED, UNKNOWN)
ACT_ON = (DEGRADED, DEAD, WEDGED)
TOKEN, NO_TOKEN = "token", "no token"


@dataclasses.dataclass
class Observation:
    time: float
    nodes: dict                      # node name -> state.NodeState (its error set when it did not answer)
    health: int | None               # /health status, None: no answer
    metrics: object | None           # the engine's /metrics snapshot (dsv41.client.metrics.Snapshot)
    probe: str | None                # None (not sent), TOKEN, NO_TOKEN, or "error ..." (5xx, no answer)


@dataclasses.dataclass
class Memory:
    """What judge() remembers between intervals."""
    dead_streak: int = 0             # intervals in a row the API did not answer or answered 5xx
    counters: tuple | None = None    # the recipe's progress signals last seen
    moved_at: float | None = None    # when the counters last moved while work was running
    ready_start: float | None = None  # rank 0's start (its node's clock) for which a token came back


def judge(cfg, obs, mem, recipe):
    """(verdict, evidence) from one observation and the memory, which it updates. Pure: no I/O."""
    lost = [f"{n}: {f.error}" for n, f in obs.nodes.items() if f.error]
    if lost:
        return UNKNOWN, "no fresh facts from " + "; ".join(lost)
    tripped = [n for n, f in obs.nodes.items() if f.tripped]
    if tripped:
        return TRIPPED, f"the memory guard is tripped on {', '.join(tripped)}"
    units = {(s.name, u): obs.nodes[s.name].unit(u) for s in cfg.nodes for u in recipe.units(s)}
    states = {k: u.active or "not installed" for k, u in units.items()}
    if all(st == "inactive" and units[k].result == "success" for k, st in states.items()):
        return STOPPED, "every rank is stopped; `doit launch` starts them"
    head = cfg.nodes[0]
    r0_start = max(units[head.name, u].since for u in recipe.units(head))   # the head's latest start
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
        work, counters = recipe.work(obs.metrics), recipe.progress(obs.metrics)
        if counters != mem.counters or not any(work):
            mem.counters, mem.moved_at = counters, obs.time
        if any(work):
            stalled = obs.time - mem.moved_at
            doing = ", ".join(f"{v:.0f} {word}" for v, word in zip(work, recipe.work_words))
            if stalled >= cfg.watchdog_stall_s:
                return WEDGED, (f"{doing}, and no token counted for "
                                f"{stalled:.0f} s (WATCHDOG_STALL_S {cfg.watchdog_stall_s})")
            if any(counters):
                mem.ready_start = r0_start
            return BUSY, f"{doing}, tokens counted {stalled:.0f} s ago"
    if obs.probe == NO_TOKEN:
        if starting:
            return STARTING, f"ranks started {r0_age:.0f} s ago; no token yet"
        return WEDGED, f"the idle probe got no token within {cfg.watchdog_probe_s} s (WATCHDOG_PROBE_S)"
    if obs.probe == TOKEN:
        mem.ready_start = r0_start
    elif starting:
        return STARTING, f"ranks started {r0_age:.0f} s ago; not ready yet"
    return HEALTHY, "every rank is up and a token came back" if obs.probe == TOKEN else "every rank is up"
