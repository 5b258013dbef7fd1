"""The decision: from every node's facts (dsv41.node.probe) and the desired state (dsv41.head.core.desired)
to the steps that bring one to the other. Pure: no I/O, so `doit plan` and `doit launch` take the
same decision, and tests can state it as tables."""
import enum
import hashlib
from typing import NamedTuple

from dsv41 import names

STALE_MARGIN_S = 5   # a worker up this much less time than the head restarted on its own (RestartSec=30)


class Kind(enum.Enum):
    WRITE = "write"                  # a state file (guard settings, plan copy, key env file)
    INSTALL = "install"              # a unit file into /etc/systemd/system
    START_GUARD = "start-guard"
    RESTART_GUARD = "restart-guard"
    RELOAD_GUARD = "reload-guard"
    RESTART_RANKS = "restart-ranks"  # head rank stopped first, workers started before the head
    START_WATCHDOG = "start-watchdog"
    RESTART_WATCHDOG = "restart-watchdog"
    STOP_WATCHDOG = "stop-watchdog"  # WATCHDOG=0: stopped and disabled


class Step(NamedTuple):
    kind: Kind
    node: str        # a node name, or "all"
    target: str      # the file or unit it acts on ("" for the ranks)
    reason: str

    def line(self):
        return f"{self.kind.value} on {self.node}: {self.reason}"


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def since(unit_facts):
    """When the unit became active (unix seconds on its node's clock), 0 when unknown."""
    stamp = unit_facts.get("ActiveEnterTimestamp", "")
    return float(stamp[1:]) if stamp.startswith("@") else 0.0


def unit_age(facts, unit):
    """Seconds the unit has been active by its node's own clock, or None when it is not active."""
    u = facts.get("units", {}).get(unit, {})
    if u.get("ActiveState") != "active" or not since(u) or "time" not in facts:
        return None
    return facts["time"] - since(u)


def unit_state(u):
    """A unit's "ActiveState/SubState", or "not installed"."""
    return f"{u.get('ActiveState', '?')}/{u.get('SubState', '?')}" if u.get("installed") else "not installed"


def shown_unit(facts, units):
    """Which of a node's engine units stands for the node in one line: the first that is not
    active, else the first."""
    got = facts.get("units") or {}
    return next((u for u in units if (got.get(u) or {}).get("ActiveState") != "active"), units[0])


def stale_workers(specs, facts, recipe):
    """A worker's engine unit that (re)started after the head's cannot rejoin its rendezvous: the ranks
    must restart together (when the recipe says so). One line per such unit. Ages are measured on each
    node's own clock, so clock skew between nodes cannot fake a restart. specs: the NodeSpecs, head first."""
    if not recipe.restart_together:
        return []
    head = specs[0]
    ages = [unit_age(facts.get(head.name, {}), u) for u in recipe.units(head)]
    head_age = None if None in ages or not ages else min(ages)        # the head's latest start
    out = []
    for s in specs[1:]:
        f = facts.get(s.name, {})
        for unit in recipe.units(s):
            age = unit_age(f, unit)
            if head_age is not None and age is not None and age < head_age - STALE_MARGIN_S:
                u = f["units"][unit]
                out.append(f"{unit} on {s.label} restarted after the head's rank "
                           f"(NRestarts={u.get('NRestarts', '?')}): the ranks must restart together")
    return out


def changed_units(specs, desired, facts):
    """[(node name, unit, installed text or None, desired text)] for units whose content differs."""
    out = []
    for s in specs:
        for name, text in desired.units[s.name].items():
            have = facts[s.name]["units"].get(name, {})
            if have.get("text") != text:
                out.append((s.name, name, have.get("text"), text))
    return out


def decide(specs, desired, facts, recipe):
    """The steps, in the order launch applies them; the recipe names each node's engine units."""
    steps = []
    rank_reasons = list(stale_workers(specs, facts, recipe))
    changed = {(node, unit) for node, unit, _, _ in changed_units(specs, desired, facts)}
    written = set()                                     # (node, state file)
    for s in specs:
        f = facts[s.name]
        for rel, (text, _) in desired.files[s.name].items():
            if text is None or f["files"].get(rel) != sha(text):
                steps.append(Step(Kind.WRITE, s.name, rel, f"{rel} differs"))
                written.add((s.name, rel))
                if rel not in (names.GUARD_SETTINGS, names.WATCHDOG_SETTINGS):   # read by the ranks at start
                    rank_reasons.append(f"{rel} changed on {s.name}")
    for node, unit in sorted(changed):
        steps.append(Step(Kind.INSTALL, node, unit, f"{unit} differs from the rendered unit"))
    for s in specs:
        f = facts[s.name]
        guard = f["units"].get(names.MEMGUARD_UNIT, {})
        guard_changed = (s.name, names.MEMGUARD_UNIT) in changed
        if guard_changed and guard.get("ActiveState") == "active":
            steps.append(Step(Kind.RESTART_GUARD, s.name, names.MEMGUARD_UNIT, "memory guard unit changed"))
        elif guard.get("ActiveState") != "active" or guard_changed:
            steps.append(Step(Kind.START_GUARD, s.name, names.MEMGUARD_UNIT, "memory guard not running"))
        elif (s.name, names.GUARD_SETTINGS) in written:
            steps.append(Step(Kind.RELOAD_GUARD, s.name, names.MEMGUARD_UNIT,
                              "MEMGUARD_GIB, MEMGUARD_MODE or METRICS_DIR changed"))
        for unit, name in recipe.parts(s):
            rank_reasons += unit_reasons(s, f, unit, f["containers"].get(name), (s.name, unit) in changed)
    if rank_reasons:
        steps.append(Step(Kind.RESTART_RANKS, "all", "", "; ".join(rank_reasons)))
    return steps + watchdog_steps(specs[0].name, desired, facts[specs[0].name], changed, written)


def unit_reasons(s, f, unit, container, changed):
    """Why one engine unit must restart ([] when it need not)."""
    u = f["units"].get(unit, {})
    if changed:
        return [f"{unit} changed"]
    if u.get("ActiveState") != "active":
        return [f"{unit} on {s.name} is {u.get('ActiveState', 'not installed')}"]
    if container and f["image_id"] and container["image"] != f["image_id"]:
        return [f"{unit} runs an older image"]
    if (f.get("model_changed_at") or 0) > since(u):
        return [f"model files in {f['model_dir']} on {s.name} changed after {unit} started"]
    return []


def watchdog_steps(head, desired, f, changed, written):
    """Start, restart (its unit or settings changed) or, with WATCHDOG=0, stop the head's watchdog."""
    w = names.WATCHDOG_UNIT
    u = f["units"].get(w, {})
    active = u.get("ActiveState") == "active"
    if w not in desired.units[head]:
        on = active or u.get("UnitFileState") == "enabled"
        return [Step(Kind.STOP_WATCHDOG, head, w, "WATCHDOG=0")] if on else []
    if not active:
        return [Step(Kind.START_WATCHDOG, head, w, "the watchdog is not running")]
    if (head, w) in changed or (head, names.WATCHDOG_SETTINGS) in written:
        return [Step(Kind.RESTART_WATCHDOG, head, w, "its unit or settings changed")]
    return []
