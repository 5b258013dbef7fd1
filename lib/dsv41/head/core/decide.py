"""The decision: from every node's state (core.state, from dsv41.node.probe) and the desired state
(core.desired) to the steps that bring one to the other. Pure: no I/O, so `doit plan` and `doit launch` take the
same decision, and tests can state it as tables."""
import enum
import hashlib
from typing import NamedTuple

from dsv41 import names


class Desired(NamedTuple):
    """What every node should have (core.desired computes it; a rollback takes it from a release)."""
    units: dict     # {node name: {unit file name: text}}
    files: dict     # {node name: {path under the state dir: (text or None, mode)}}; None: not known yet

STALE_MARGIN_S = 5   # a worker up this much less time than the head restarted on its own (RestartSec=30)


class Kind(enum.Enum):
    WRITE = "write"                  # a state file (guard settings, plan copy, key env file)
    INSTALL = "install"              # a unit file into /etc/systemd/system
    START_GUARD = "start-guard"
    RESTART_GUARD = "restart-guard"
    RELOAD_GUARD = "reload-guard"
    RESTART_RANKS = "restart-ranks"  # every engine unit, in the recipe's stop and start order
    START_WATCHDOG = "start-watchdog"
    RESTART_WATCHDOG = "restart-watchdog"
    STOP_WATCHDOG = "stop-watchdog"  # WATCHDOG=0: stopped and disabled
    START_EXPORTER = "start-exporter"  # METRICS_DIR set: the node's prometheus-node-exporter (re)started
    START_GATEWAY = "start-gateway"
    RESTART_GATEWAY = "restart-gateway"  # its unit or rank 0's key changed (read at start)
    RELOAD_GATEWAY = "reload-gateway"  # its config changed: reloaded, the ranks untouched
    STOP_GATEWAY = "stop-gateway"    # GATEWAY=0 (or a release recorded without it): rank 0 takes PORT again


class Step(NamedTuple):
    kind: Kind
    node: str        # a node name, or "all"
    target: str      # the file or unit it acts on ("" for the ranks)
    reason: str

    def line(self):
        return f"{self.kind.value} on {self.node}: {self.reason}"


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def stale_workers(specs, states, recipe):
    """A worker's engine unit that (re)started after the head's cannot rejoin its rendezvous: the ranks
    must restart together (when the recipe says so). One line per such unit. Ages are measured on each
    node's own clock, so clock skew between nodes cannot fake a restart. specs: the NodeSpecs, head first."""
    if not recipe.restart_together:
        return []
    head = specs[0]
    ages = [states[head.name].age(u) if head.name in states else None for u in recipe.units(head)]
    head_age = None if None in ages or not ages else min(ages)        # the head's latest start
    out = []
    for s in specs[1:]:
        f = states.get(s.name)
        for unit in recipe.units(s) if f else ():
            age = f.age(unit)
            if head_age is not None and age is not None and age < head_age - STALE_MARGIN_S:
                out.append(f"{unit} on {s.label} restarted after the head's rank "
                           f"(NRestarts={f.unit(unit).restarts or '?'}): the ranks must restart together")
    return out


def changed_units(specs, desired, states):
    """[(node name, unit, installed text or None, desired text)] for units whose content differs."""
    out = []
    for s in specs:
        for name, text in desired.units[s.name].items():
            have = states[s.name].unit(name).text
            if have != text:
                out.append((s.name, name, have, text))
    return out


def decide(specs, desired, states, recipe):
    """The steps, in the order launch applies them; the recipe names each node's engine units."""
    steps = []
    rank_reasons = list(stale_workers(specs, states, recipe))
    changed = {(node, unit) for node, unit, _, _ in changed_units(specs, desired, states)}
    written = set()                                     # (node, state file)
    for s in specs:
        f = states[s.name]
        for rel, (text, _) in desired.files[s.name].items():
            if text is None or f.files.get(rel) != sha(text):
                steps.append(Step(Kind.WRITE, s.name, rel, f"{rel} differs"))
                written.add((s.name, rel))
                if rel not in (names.GUARD_SETTINGS, names.WATCHDOG_SETTINGS, names.GATEWAY_CONFIG):   # ranks read it
                    rank_reasons.append(f"{rel} changed on {s.name}")
    for node, unit in sorted(changed):
        steps.append(Step(Kind.INSTALL, node, unit, f"{unit} differs from the rendered unit"))
    for s in specs:
        f = states[s.name]
        guard = f.unit(names.MEMGUARD_UNIT)
        guard_changed = (s.name, names.MEMGUARD_UNIT) in changed
        if guard_changed and guard.active == "active":
            steps.append(Step(Kind.RESTART_GUARD, s.name, names.MEMGUARD_UNIT, "memory guard unit changed"))
        elif guard.active != "active" or guard_changed:
            steps.append(Step(Kind.START_GUARD, s.name, names.MEMGUARD_UNIT, "memory guard not running"))
        elif (s.name, names.GUARD_SETTINGS) in written:
            steps.append(Step(Kind.RELOAD_GUARD, s.name, names.MEMGUARD_UNIT,
                              "MEMGUARD_GIB, MEMGUARD_MODE or METRICS_DIR changed"))
        for unit, name in recipe.parts(s):
            rank_reasons += unit_reasons(s, f, unit, f.container(name), (s.name, unit) in changed)
    if rank_reasons:
        steps.append(Step(Kind.RESTART_RANKS, "all", "", "; ".join(rank_reasons)))
    head = specs[0].name
    return (steps + exporter_steps(specs, desired, states, changed)
            + watchdog_steps(head, desired, states[head], changed, written)
            + gateway_steps(head, desired, states[head], changed, written))


def exporter_steps(specs, desired, states, changed):
    """With METRICS_DIR set (its drop-in desired): (re)start a node's exporter when the drop-in changed
    or it is not running; a node without the package is told once, when the drop-in goes in."""
    steps = []
    for s in specs:
        if names.EXPORTER_DROPIN not in desired.units[s.name]:
            continue
        u = states[s.name].unit(names.EXPORTER_UNIT)
        if (s.name, names.EXPORTER_DROPIN) in changed:
            steps.append(Step(Kind.START_EXPORTER, s.name, names.EXPORTER_UNIT, "its dsv41 drop-in changed"))
        elif u.active != "active" and u.load != "not-found":
            steps.append(Step(Kind.START_EXPORTER, s.name, names.EXPORTER_UNIT, "node exporter not running"))
    return steps


def unit_reasons(s, f, unit, container, changed):
    """Why one engine unit must restart ([] when it need not)."""
    u = f.unit(unit)
    if changed:
        return [f"{unit} changed"]
    if u.active != "active":
        return [f"{unit} on {s.name} is {u.active or 'not installed'}"]
    if container and f.image_id and container.image != f.image_id:
        return [f"{unit} runs an older image"]
    if (f.model_changed_at or 0) > u.since:
        return [f"model files in {f.model_dir} on {s.name} changed after {unit} started"]
    return []


def watchdog_steps(head, desired, f, changed, written):
    """Start, restart (its unit or settings changed) or, with WATCHDOG=0, stop the head's watchdog."""
    w = names.WATCHDOG_UNIT
    u = f.unit(w)
    active = u.active == "active"
    if w not in desired.units[head]:
        on = active or u.enabled == "enabled"
        return [Step(Kind.STOP_WATCHDOG, head, w, "WATCHDOG=0")] if on else []
    if not active:
        return [Step(Kind.START_WATCHDOG, head, w, "the watchdog is not running")]
    if (head, w) in changed or (head, names.WATCHDOG_SETTINGS) in written:
        return [Step(Kind.RESTART_WATCHDOG, head, w, "its unit or settings changed")]
    return []


def gateway_steps(head, desired, f, changed, written):
    """Start, restart (its unit or rank 0's key changed), reload (its config changed) or, when it is not
    desired, stop the head's gateway (core.rollout.apply stops it before the ranks start, and starts it
    after them when it was not running: rank 0 may hold PORT until it stops)."""
    g = names.GATEWAY_UNIT
    u = f.unit(g)
    active = u.active == "active"
    if g not in desired.units[head]:
        on = active or u.enabled == "enabled"
        return [Step(Kind.STOP_GATEWAY, head, g, "GATEWAY=0: rank 0 serves PORT itself")] if on else []
    if not active:
        return [Step(Kind.START_GATEWAY, head, g, "the gateway is not running")]
    if (head, g) in changed or (head, names.SECRET_KEY) in written:
        return [Step(Kind.RESTART_GATEWAY, head, g, "its unit or rank 0's key changed")]
    if (head, names.GATEWAY_CONFIG) in written:
        return [Step(Kind.RELOAD_GATEWAY, head, g, "its config changed (the ranks are left alone)")]
    return []
