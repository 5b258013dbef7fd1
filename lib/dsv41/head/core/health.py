"""The cluster's health, judged once, here, for `doit status`, `doit top`, `doit launch` and the watchdog:
one typed Observation (every node's probe, the API's /health, the engine's /metrics, the token probe,
and what the record holds: a recovery under way, NEEDS_REBOOT, a gave-up marker, the recoveries so
far) and what the caller remembers between looks (Memory) in, one Health out: a verdict, the conditions
that led to it, the node it names, when the fault began, and what may be done about it (the action the
recovery gate allows). Pure: no I/O; the recipe names the engine's units and the metrics that show work
and progress. The words `doit status` prints and its exit codes are one table from the verdict (WORDS).

A stall is confirmed before it is called a hang: when work runs or waits and none of the recipe's
progress signals has moved for WATCHDOG_STALL_S, wants_probe() asks for a one-token probe; a token back
is BUSY (a long prefill, however long it runs), none within WATCHDOG_PROBE_S is WEDGED. A rank's process
that its node reports stopped (SIGSTOP, a tracer) at two looks in a row while work stands still needs no
probe: WEDGED at once, naming that node (a worker is headless: only its node can say). Each verdict
that may call for a recovery carries fault_at: when the fault began, the last progress seen or the
first failed look."""
import dataclasses
import enum

from dsv41.head.core.decide import stale_workers  # noqa: F401 (also for status)
from dsv41.head.core.hang import BACK, Progress, memory_returned, recovery_gate  # noqa: F401 (BACK: for launch)


class Verdict(str, enum.Enum):
    HEALTHY = "HEALTHY"
    BUSY = "BUSY"
    STARTING = "STARTING"
    STOPPED = "STOPPED"
    SUSPECT = "SUSPECT"
    DEGRADED = "DEGRADED"
    DEAD = "DEAD"
    WEDGED = "WEDGED"
    TRIPPED = "TRIPPED"
    UNKNOWN = "UNKNOWN"
    NEEDS_REBOOT = "NEEDS_REBOOT"   # a restart found a node's memory not back, so it started nothing
    RECOVERING = "RECOVERING"       # a recovery is under way (the record has it open, its process holds the lock)

    def __str__(self):
        return self.value


HEALTHY, BUSY, STARTING, STOPPED, SUSPECT = Verdict.HEALTHY, Verdict.BUSY, Verdict.STARTING, Verdict.STOPPED, Verdict.SUSPECT
DEGRADED, DEAD, WEDGED, TRIPPED, UNKNOWN = Verdict.DEGRADED, Verdict.DEAD, Verdict.WEDGED, Verdict.TRIPPED, Verdict.UNKNOWN
NEEDS_REBOOT, RECOVERING = Verdict.NEEDS_REBOOT, Verdict.RECOVERING
VERDICTS = tuple(v.value for v in Verdict)
ACT_ON = (DEGRADED, DEAD, WEDGED)
REPAIR = ACT_ON + (SUSPECT,)        # what `doit launch` repairs: its one look is all the confirmation it gets
TOKEN, NO_TOKEN = "token", "no token"

# `doit status`'s word and exit code for each verdict (2 is left to bad input, as for every dsv41 command)
WORDS = {HEALTHY: ("READY", 0), BUSY: ("READY", 0), DEGRADED: ("DEGRADED", 1), STOPPED: ("NOT RUNNING", 3),
         UNKNOWN: ("UNREACHABLE", 4), TRIPPED: ("TRIPPED", 5), STARTING: ("DOWN", 6), SUSPECT: ("DOWN", 6),
         DEAD: ("DOWN", 6), WEDGED: ("DOWN", 6), NEEDS_REBOOT: ("NEEDS_REBOOT", 7), RECOVERING: ("RECOVERING", 8)}
EXIT_CODES = {word: code for word, code in WORDS.values()}
# what each word tells a person to do; {memory} is the recipe's memory_settings
MEANING = {
    "READY": "every rank is up and the API answers",
    "DEGRADED": "a rank is down or restarted on its own: `doit launch` restarts the ranks together",
    "NOT RUNNING": "nothing is running: start it with `doit launch`",
    "UNREACHABLE": "a node does not answer over ssh (or is shutting down); its line above says what to check",
    "TRIPPED": "the memory guard stopped the ranks: lower {memory}, then `doit clear-trip` and `doit launch`",
    "DOWN": "ranks are up but the API does not serve: starting (see `doit logs r0`) or hung",
    "NEEDS_REBOOT": "a restart stopped the ranks and a node's memory did not come back, so nothing was started: "
                    "reboot that node (the watchdog and `doit launch` start the ranks once it is back; "
                    "`doit launch --force` starts them anyway)",
    "RECOVERING": "a recovery is under way (its step is above): leave it be; `doit incidents` has it when it ends",
}


@dataclasses.dataclass(frozen=True)
class Record:
    """What the record (core.record) holds that bears on the health."""
    recovering: dict | None = None   # the open incident of a recovery whose process still holds the run lock
    needs_reboot: dict | None = None  # the NEEDS_REBOOT marker
    gave_up: dict | None = None      # the watchdog's gave-up marker
    lock: str | None = None          # who holds the run lock (a doit run, a recovery), None: nobody
    recoveries: tuple = ()           # (started, ended) of the watchdog's restarts so far


@dataclasses.dataclass
class Observation:
    time: float
    nodes: dict                      # node name -> state.NodeState (its error set when it did not answer)
    health: int | None               # /health status, None: no answer
    metrics: object | None           # the engine's /metrics snapshot (dsv41.client.metrics.Snapshot)
    probe: str | None                # None (not sent), TOKEN, NO_TOKEN, or "error ..." (5xx, no answer)
    ready_at: float | None = None    # when a readiness wait (launch's, a recovery's) last saw a token (head's clock)
    api_error: str | None = None     # a request that should have worked failed (status: /v1/models)
    record: Record = Record()


@dataclasses.dataclass
class Memory:
    """What assess() remembers between looks."""
    dead_streak: int = 0             # intervals in a row the API did not answer or answered 5xx
    progress: Progress | None = None  # the recipe's progress signals last seen, and since when flat
    ready_start: float | None = None  # rank 0's start (its node's clock) for which a token came back
    fault_at: float | None = None    # when the current fault began (None: no fault)
    ran: bool = False                # every engine unit was seen active since the watchdog started
    stopped: frozenset = frozenset()  # (node, pid, name) of the ranks' processes stopped at the last look


FAULTS = (SUSPECT, DEGRADED, DEAD, WEDGED)


@dataclasses.dataclass(frozen=True)
class Health:
    verdict: Verdict
    conditions: tuple                # what led to the verdict, one line each
    node: str | None = None          # the node it names, when one
    fault_at: float | None = None    # when the fault began (faults only)
    action: str | None = None        # what the recovery gate allows: "restart", "start", "wait", "give up" or None
    why: str = ""                    # the gate's reason, or why nothing may be done now
    recovering: dict | None = None   # the recovery under way (RECOVERING): its incident, with its phase
    judging: bool = False            # a sign of a fault the watchdog has not ruled on yet, or one it will act on

    @property
    def evidence(self):
        return "; ".join(self.conditions)

    @property
    def word(self):
        return WORDS[self.verdict][0]

    @property
    def exit_code(self):
        return WORDS[self.verdict][1]

    def as_json(self):
        return {"verdict": self.verdict.value, "word": self.word, "exit_code": self.exit_code,
                "conditions": list(self.conditions), "node": self.node, "fault_at": self.fault_at,
                "action": self.action, "why": self.why, "recovering": self.recovering, "judging": self.judging}


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


def assess(cfg, obs, mem, recipe):
    """The Health of one observation, given the memory (which it updates: mem.fault_at is when the fault
    the verdict names began). Pure: no I/O."""
    rec = obs.record
    if rec.recovering:
        inc = rec.recovering
        on = f" on {inc['node']}" if inc.get("node") else ""
        return Health(RECOVERING, (f"{inc.get('by', 'a recovery')} is recovering from {inc.get('verdict')}{on} "
                                   f"(incident {inc.get('id')}): {inc.get('phase')}",),
                      node=inc.get("node"), fault_at=inc.get("fault_at"), recovering=inc)
    verdict, conditions, node = _judge(cfg, obs, mem, recipe)
    if verdict in FAULTS:
        if verdict == WEDGED and mem.progress is not None and mem.progress.last_progress is not None:
            mem.fault_at = min(mem.fault_at or obs.time, mem.progress.last_progress)
        elif mem.fault_at is None:
            mem.fault_at = obs.time
    elif verdict not in (UNKNOWN, TRIPPED):
        mem.fault_at = None
    if verdict == DEGRADED:         # a unit that went down says when
        broke = [obs.nodes[s.name].unit(u).inactive_since for s in cfg.nodes for u in recipe.units(s)
                 if obs.nodes[s.name].unit(u).active != "active"]
        mem.fault_at = min([mem.fault_at] + [t for t in broke if t])
    fault_at = mem.fault_at if verdict in FAULTS else None
    if rec.needs_reboot and verdict not in (UNKNOWN, TRIPPED):
        check = memory_check(cfg, obs.nodes)
        if check.verdict != BACK:
            short = next(iter(check.missing_gib), None)
            return Health(NEEDS_REBOOT, check.lines or (rec.needs_reboot.get("line", ""),), node=short)
        if verdict in (STOPPED, DEAD, DEGRADED):
            return Health(verdict, tuple(conditions), node, fault_at, "start", "the memory came back on every node")
    if verdict not in ACT_ON:
        return Health(verdict, tuple(conditions), node, fault_at, judging=unruled(verdict, obs, mem))
    if rec.gave_up:
        return Health(verdict, tuple(conditions), node, fault_at, None,
                      f"it gave up ({rec.gave_up.get('reason', '?')}); `doit launch` resumes it")
    if rec.lock:
        return Health(verdict, tuple(conditions), node, fault_at, None, f"a doit run holds the run lock ({rec.lock})")
    gate = recovery_gate(obs.time, rec.recoveries, window_s=cfg.watchdog_window_s,
                         max_recoveries=cfg.watchdog_max_recoveries, backoff_s=cfg.watchdog_backoff_s)
    return Health(verdict, tuple(conditions), node, fault_at, gate.action, gate.reason,
                  judging=unruled(verdict, obs, mem) or gate.action in ("restart", "wait"))


def unruled(verdict, obs, mem):
    """A sign of a fault the watchdog has not ruled on yet: the API missed one look (SUSPECT), or work made
    no progress since the last look and no probe got a token (a long step, once one did). The symptom
    alerts (an engine's decode and TTFT, the API and rank alerts) wait while it lasts: the verdict pages."""
    if verdict == SUSPECT:
        return True
    p = mem.progress
    return (verdict == BUSY and obs.probe != TOKEN and obs.metrics is not None and p is not None
            and p.last_progress is not None and obs.metrics.time > p.last_progress)


def judge(cfg, obs, mem, recipe):
    """(verdict, evidence) of assess(): for callers that want only those."""
    h = assess(cfg, obs, mem, recipe)
    return h.verdict, h.evidence


# ---- memory ---------------------------------------------------------------------------------------------

def node_memory(nodes):
    """({node: baseline bytes}, {node: MemAvailable bytes or None}) from NodeStates."""
    base = {n: f.mem_baseline_bytes for n, f in nodes.items() if f.mem_baseline_bytes}
    avail = {n: (None if f.error or not f.mem_available_kib else f.mem_available_kib * 1024)
             for n, f in nodes.items()}
    return base, avail


def memory_check(cfg, nodes):
    """hang.MemoryCheck of the nodes' memory as they report it."""
    base, avail = node_memory(nodes)
    return memory_returned(base, avail, cfg.mem_return_gib)


def stopped_cleanly(u):
    """A unit that is not installed, or inactive after a clean exit (or never run)."""
    return not u.installed or (u.active == "inactive" and u.result in ("success", ""))


def _judge(cfg, obs, mem, recipe):
    """(verdict, conditions, the node it names) by the rules of the module's docstring."""
    said = _by_the_nodes(obs)
    if said is not None:
        return said
    units = {(s.name, u): obs.nodes[s.name].unit(u) for s in cfg.nodes for u in recipe.units(s)}
    states = {k: u.active or "not installed" for k, u in units.items()}
    if all(stopped_cleanly(u) for u in units.values()):
        if mem.ran:         # `doit stop` and `doit clear-trip` stop the watchdog before the ranks
            return DEAD, [("every rank exited by itself while the watchdog ran (a node rebooted, or its Docker "
                           "restarted?)")], None
        return STOPPED, ["every rank is stopped; `doit launch` starts them"], None
    mem.ran = mem.ran or all(st == "active" for st in states.values())
    head = cfg.nodes[0]
    r0_start = max(units[head.name, u].since for u in recipe.units(head))   # the head's latest start
    if obs.ready_at is not None and obs.ready_at >= r0_start:
        mem.ready_start = r0_start      # a readiness wait saw this start of rank 0 generate
    r0_age = obs.nodes[head.name].time - r0_start
    starting = (all(states[head.name, u] == "active" for u in recipe.units(head))
                and mem.ready_start != r0_start and r0_age < cfg.start_timeout_s)
    down = [(node, f"{unit} on {node} is {st}") for (node, unit), st in states.items() if st != "active"]
    stale = stale_workers(cfg.nodes, obs.nodes, recipe, cfg.groups_here)
    if down or stale:
        return DEGRADED, [line for _, line in down] + stale, (down[0][0] if down else _named(stale, obs.nodes))
    broken = (f"/health {obs.health or 'does not answer'}" if obs.health is None or obs.health >= 500
              else f"the probe got {obs.probe}" if (obs.probe or "").startswith("error")
              else obs.api_error)
    if broken:
        if starting:
            return STARTING, [f"ranks started {r0_age:.0f} s ago; {broken}"], head.name
        mem.dead_streak += 1
        return (DEAD if mem.dead_streak >= 2 else SUSPECT), [f"{broken} ({mem.dead_streak} interval(s) in a row)"], head.name
    mem.dead_streak = 0
    stopped = stopped_processes(cfg, obs, recipe)
    held, mem.stopped = [p for p in stopped if p in mem.stopped], frozenset(stopped)
    if obs.metrics is not None:
        busy = _by_the_work(cfg, obs, mem, recipe, r0_start, stopped, held)
        if busy is not None:
            return busy
    if obs.probe == NO_TOKEN:
        if starting:
            return STARTING, [f"ranks started {r0_age:.0f} s ago; no token yet"], head.name
        return WEDGED, [f"the idle probe got no token within {cfg.watchdog_probe_s} s (WATCHDOG_PROBE_S)"
                        + _stopped_words(stopped)], (stopped[0][0] if stopped else head.name)
    if obs.probe == TOKEN:
        mem.ready_start = r0_start
    elif starting:
        return STARTING, [f"ranks started {r0_age:.0f} s ago; not ready yet"], head.name
    return HEALTHY, ["every rank is up and a token came back" if obs.probe == TOKEN else "every rank is up"], None


def _by_the_nodes(obs):
    """(verdict, conditions, node) the nodes give before any unit is read: one without fresh facts or
    shutting down (UNKNOWN), a tripped memory guard (TRIPPED); None when none does."""
    lost = [n for n, f in obs.nodes.items() if f.error]
    if lost:
        return UNKNOWN, [f"no fresh facts from {n}: {obs.nodes[n].error}" for n in lost], lost[0]
    going = [n for n, f in obs.nodes.items() if f.system == "stopping"]
    if going:               # its units stop because it shuts down: wait until it is back (or gone)
        return UNKNOWN, [f"{', '.join(going)} is shutting down"], going[0]
    tripped = [n for n, f in obs.nodes.items() if f.tripped]
    if tripped:
        return TRIPPED, [f"the memory guard is tripped on {', '.join(tripped)}"], tripped[0]
    return None


def stopped_processes(cfg, obs, recipe):
    """[(node, pid, name)] of the ranks' processes stopped (SIGSTOP, a tracer) as the nodes report them."""
    return [(s.name, pid, name) for s in cfg.nodes for c in recipe.containers(s)
            for pid, name in getattr(obs.nodes[s.name].container(c), "stopped", ())]


def _stopped_words(stopped):
    return "".join(f"; {name} (pid {pid}) on {node} is stopped" for node, pid, name in stopped[:2])


def _by_the_work(cfg, obs, mem, recipe, r0_start, stopped=(), held=()):
    """(verdict, conditions, node) while the engine has work (its metrics, read into mem's progress
    tracker each look): BUSY while a progress signal moves, or the probe got a token (r0_start then
    counts as ready); WEDGED when neither (naming a node with a stopped process), or at once when nothing
    moved since the last look and a rank's process was stopped at both (held); None when there is no work."""
    work = recipe.work(obs.metrics)
    flat = tracker(mem, recipe).update(obs.metrics)
    if not any(work):
        return None
    doing = ", ".join(f"{v:.0f} {word}" for v, word in zip(work, recipe.work_words))
    if held and flat > 0:
        return (WEDGED, [f"{doing}, no progress signal moved for {flat:.0f} s" + _stopped_words(held)
                         + " (two looks in a row)"], held[0][0])
    if flat < cfg.watchdog_stall_s:
        moved = ", ".join(m.split(":")[-1] for m in mem.progress.moved)
        return BUSY, [f"{doing}, " + (f"progress: {moved}" if moved else f"progress seen {flat:.0f} s ago")], None
    still = f"{doing}, and no progress signal moved for {flat:.0f} s (WATCHDOG_STALL_S {cfg.watchdog_stall_s})"
    if obs.probe == TOKEN:
        mem.ready_start = r0_start
        return BUSY, [f"{still}, but the probe got a token: a long step, not a hang"], None
    if obs.probe == NO_TOKEN:
        return (WEDGED, [f"{still}, and the probe got no token within {cfg.watchdog_probe_s} s (WATCHDOG_PROBE_S)"
                         + _stopped_words(stopped)], (stopped[0][0] if stopped else cfg.nodes[0].name))
    return BUSY, [f"{still}; a one-token probe confirms before anything is done"], None


def _named(lines, nodes):
    """The first node a line names."""
    return next((n for line in lines for n in nodes if n in line), None)
