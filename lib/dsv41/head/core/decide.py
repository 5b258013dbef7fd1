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
    RESTART_RANKS = "restart-ranks"  # every engine unit (one group's: target g<N>), in the recipe's stop and start order
    START_WATCHDOG = "start-watchdog"
    RESTART_WATCHDOG = "restart-watchdog"
    STOP_WATCHDOG = "stop-watchdog"  # WATCHDOG=0: stopped and disabled
    START_EXPORTER = "start-exporter"  # METRICS_DIR set: the node's prometheus-node-exporter (re)started
    START_GATEWAY = "start-gateway"
    RESTART_GATEWAY = "restart-gateway"  # its unit or rank 0's key changed (read at start)
    RELOAD_GATEWAY = "reload-gateway"  # its config changed: reloaded, the ranks untouched
    STOP_GATEWAY = "stop-gateway"    # GATEWAY=0 (or a release recorded without it): rank 0 takes PORT again
    START_SIDE_DOOR = "start-side-door"      # a group's first node off the head (GROUPS > 1): its side door
    RESTART_SIDE_DOOR = "restart-side-door"  # its unit or its group's key changed (read at start)
    RELOAD_SIDE_DOOR = "reload-side-door"    # its config or key map changed
    STOP_SIDE_DOOR = "stop-side-door"        # the node no longer holds a group's rank 0 off the head
    # (a step of the gateway acts on its target: dsv41-gateway.service, or dsv41-gateway.socket, which holds PORT)


class Step(NamedTuple):
    kind: Kind
    node: str        # a node name, or "all"
    target: str      # the file or unit it acts on ("" for the ranks)
    reason: str

    def line(self):
        return f"{self.kind.value} on {self.node}: {self.reason}"


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def split(specs, groups):
    """specs (the head, then the workers in order) as `groups` serving groups of equal size: [specs of each]."""
    size = len(specs) // groups
    return [tuple(specs[i * size:(i + 1) * size]) for i in range(groups)]


def owed_restarts(specs, steps, states, recipe, groups, since, now, reason):
    """decide()'s `steps` and the restarts a carried-on rollout still owes: a group (every node with one group)
    whose units are already the release's but whose engine units did not all (re)start after unix time `since`
    (its process died between the two), and that the steps restart for no other reason. Those go first: such
    a group is the one the dead process was restarting, drained at the door or down. Without `since` (a way
    back, a rollback: no restart was begun for it) the ranks restart as the steps say, or all of them when the
    steps restart none."""
    restarts = [s for s in steps if s.kind is Kind.RESTART_RANKS]
    if since is None or groups == 1 or any(not s.target for s in restarts):     # as for the whole
        if restarts or started_since(specs, states, recipe, since, now):
            return steps
        return steps + [Step(Kind.RESTART_RANKS, "all", "", reason)]
    owed = [Step(Kind.RESTART_RANKS, f"group {i}", f"g{i}", reason) for i, group in enumerate(split(specs, groups))
            if f"g{i}" not in {s.target for s in restarts} and not started_since(group, states, recipe, since, now)]
    first = steps.index(restarts[0]) if restarts else len(steps)
    return steps[:first] + owed + steps[first:]


def started_since(specs, states, recipe, since, now):
    """Every engine unit of these nodes (re)started after unix time `since` (each unit's age on its own node's
    clock against the head's `now`; False when `since` is None or a unit is not up)."""
    if since is None:
        return False
    ages = [states[s.name].age(u) for s in specs for u in recipe.units(s)]
    return all(a is not None and a <= now - since for a in ages)


def regrouped(specs, desired, states, recipe):
    """A line when the serving groups change (GROUPS, or which nodes share a rendezvous): the nodes whose engine
    units meet together now (as installed, read by the recipe) are not those the desired units put together.
    No group can then serve while another restarts: they restart at once. "" otherwise, and for the nodes
    with no engine unit yet (a node added: its group starts while the others serve)."""
    def together(text_of, names):
        meet = {}
        for s in (s for s in specs if s.name in names):
            for u in recipe.units(s):
                meet.setdefault(recipe.rendezvous(text_of(s, u)), set()).add(s.name)
        return sorted(sorted(g) for g in meet.values())
    had = {s.name for s in specs if all(recipe.rendezvous(states[s.name].unit(u).text) for u in recipe.units(s))}
    now = together(lambda s, u: states[s.name].unit(u).text, had)
    if now == together(lambda s, u: desired.units[s.name].get(u), had):
        return ""
    return ("the serving groups change (" + " | ".join(", ".join(g) for g in now) + " now): every group restarts at "
            "once, and the door answers 503 until they serve")


def stale_workers(specs, states, recipe, groups=1):
    """A worker's engine unit that (re)started after the head's cannot rejoin its rendezvous: the ranks
    must restart together (when the recipe says so). One line per such unit. Ages are measured on each
    node's own clock, so clock skew between nodes cannot fake a restart. specs: the NodeSpecs, head first, in
    `groups` serving groups of equal size (each its own rendezvous: a worker against its group's first node)."""
    if not recipe.restart_together:
        return []
    if groups > 1:
        return [line for g in split(specs, groups) for line in stale_workers(g, states, recipe)]
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


def decide(specs, desired, states, recipe, groups=1):
    """The steps, in the order launch applies them; the recipe names each node's engine units. groups: the
    serving groups specs split into (GROUPS): the ranks restart as one when every group must and none serves
    (a first launch); else only the groups that must, each its own step (target g<N>) while the others serve,
    one after the other (a rolling release: those not serving first)."""
    steps = []
    each = split(specs, groups)
    group = {s.name: i for i, g in enumerate(each) for s in g}
    reasons = {i: stale_workers(g, states, recipe) for i, g in enumerate(each)}
    changed = {(node, unit) for node, unit, _, _ in changed_units(specs, desired, states)}
    written = set()                                     # (node, state file)
    for s in specs:
        f = states[s.name]
        for rel, (text, _) in desired.files[s.name].items():
            if text is None or f.files.get(rel) != sha(text):
                steps.append(Step(Kind.WRITE, s.name, rel, f"{rel} differs"))
                written.add((s.name, rel))
                if rel != names.GUARD_SETTINGS and rel not in SERVICE_ONLY_FILES:   # ranks read it
                    reasons[group[s.name]].append(f"{rel} changed on {s.name}")
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
            reasons[group[s.name]] += unit_reasons(s, f, unit, f.container(name), (s.name, unit) in changed)
    serving = [all(states[s.name].unit(u).active == "active" for s in g for u in recipe.units(s)) for g in each]
    regroup = regrouped(specs, desired, states, recipe)
    if all(reasons.values()) and (groups == 1 or not any(serving) or regroup):
        steps.append(Step(Kind.RESTART_RANKS, "all", "", "; ".join([regroup] * bool(regroup) + [
            r for i in reasons for r in reasons[i]])))
    else:
        steps += [Step(Kind.RESTART_RANKS, f"group {i}", f"g{i}", "; ".join(reasons[i]))
                  for i in sorted(reasons, key=lambda i: (serving[i], i)) if reasons[i]]
    head = specs[0].name
    steps += exporter_steps(specs, desired, states, changed)
    for svc in HEAD_SERVICES:
        steps += service_steps(svc, head, desired, states[head], changed, written)
    for s in specs[1:]:
        steps += service_steps(SIDE_DOOR, s.name, desired, states[s.name], changed, written)
    return steps


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


class HeadService(NamedTuple):
    """A service the head runs besides its rank, as data: decide() takes its steps and core.rollout.apply
    applies them, in the order of HEAD_SERVICES. A new head service is one entry here (and its unit in the
    head's desired units)."""
    unit: str
    what: str                   # what the lines call it
    start: Kind                 # started when it is desired and not running
    restart: Kind               # restarted when its unit or a file it reads at start changed
    stop: Kind                  # stopped and disabled when it is not desired
    reload: Kind = None         # reloaded (it and the ranks left running) when a file it reloads changed
    reads: tuple = ()           # state files read at start (a change restarts it)
    reloads: tuple = ()         # state files it re-reads on reload
    off: str = ""               # why it is not desired: its switch
    not_running: str = ""
    restart_why: str = ""
    reload_why: str = ""
    starts_after_ranks: bool = False   # when the ranks restart, started after them (not before)
    masks: str = ""             # a unit that would take its place, masked before it starts
    not_by: str = ""            # who never applies its steps (the watchdog does not restart itself)
    socket: str = ""            # a socket unit holding its port: the service Requires= it, so it starts first and
                                # its stop stops the service; it stays through the service's restarts, reloads and
                                # crashes (connections wait in the kernel)
    socket_why: str = ""        # why the socket is taken anew (restarted: the service restarts with it)
    no_socket: str = ""         # why the socket stops while the service stays (a release recorded before it)

    @property
    def kinds(self):
        return (self.start, self.restart, self.stop, self.reload)

    @property
    def units(self):
        """Its units, its socket first: the order they stop in (nothing starts the service again)."""
        return ((self.socket,) if self.socket else ()) + (self.unit,)

    def what_of(self, unit):
        """What the lines call one of its units."""
        return self.what if unit == self.unit else f"socket holding the {self.what}'s port ({unit})"


HEAD_SERVICES = (
    # before the ranks restart, so that it is there to carry the release on
    HeadService(names.WATCHDOG_UNIT, "watchdog", Kind.START_WATCHDOG, Kind.RESTART_WATCHDOG, Kind.STOP_WATCHDOG,
                reads=(names.WATCHDOG_SETTINGS,), off="WATCHDOG=0", not_running="the watchdog is not running",
                restart_why="its unit or settings changed", not_by=names.WATCHDOG_BY),
    # rank 0 may hold PORT until it stops: a gateway not running is started after the ranks restart
    HeadService(names.GATEWAY_UNIT, "gateway", Kind.START_GATEWAY, Kind.RESTART_GATEWAY, Kind.STOP_GATEWAY,
                Kind.RELOAD_GATEWAY, reads=(names.SECRET_KEY,), reloads=(names.GATEWAY_CONFIG,),
                off="GATEWAY=0: rank 0 serves PORT itself", not_running="the gateway is not running",
                restart_why="its unit or rank 0's key changed",
                reload_why="its config changed (the ranks are left alone)", starts_after_ranks=True,
                masks=names.DEBIAN_HAPROXY_UNIT, socket=names.GATEWAY_SOCKET_UNIT,
                socket_why="the socket holding PORT changed or holds nothing: PORT taken anew, the gateway "
                           "restarted with it",
                no_socket="the release runs a gateway that binds PORT itself"),
)
# a group's first node off the head: HAProxy in front of its rank 0 on the fabric, for the head's door only; started
# before the ranks, so that the readiness wait reaches that group through it
SIDE_DOOR = HeadService(names.SIDE_DOOR_UNIT, "side door", Kind.START_SIDE_DOOR, Kind.RESTART_SIDE_DOOR,
                        Kind.STOP_SIDE_DOOR, Kind.RELOAD_SIDE_DOOR, reads=(names.SECRET_KEY,),
                        reloads=(names.SIDE_DOOR_CONFIG, names.SIDE_DOOR_KEYS),
                        off="no group's rank 0 on this node (GROUPS)", not_running="the side door is not running",
                        restart_why="its unit or its group's key changed",
                        reload_why="its config or key map changed (the ranks are left alone)",
                        masks=names.DEBIAN_HAPROXY_UNIT)
SERVICES = HEAD_SERVICES + (SIDE_DOOR,)   # every service of ours a rollout applies, in its order
# state files only our services read (besides the guard's): their change restarts no rank
SERVICE_ONLY_FILES = (names.WATCHDOG_SETTINGS, names.GATEWAY_CONFIG, names.SIDE_DOOR_CONFIG, names.SIDE_DOOR_KEYS)


def _on(u):
    return u.active == "active" or u.enabled == "enabled"


def service_steps(svc, head, desired, f, changed, written):
    """Start, restart, reload or, when it is not desired (its switch off, or a release recorded without
    it), stop and disable one head service. Its socket (HeadService.socket), when it has one: stopped first
    when the service stops; restarted, and the running service with it, when its unit changed or it holds
    nothing; stopped alone when the release runs the service without it (recorded before it)."""
    u = f.unit(svc.unit)
    active = u.active == "active"
    wanted = desired.units[head]
    if svc.unit not in wanted:
        return [Step(svc.stop, head, n, svc.off if n == svc.unit else f"{svc.off} ({n} lets it go first)")
                for n in svc.units if _on(f.unit(n))]
    steps = []
    if svc.socket:
        sock = f.unit(svc.socket)
        if svc.socket not in wanted:
            steps += [Step(svc.stop, head, svc.socket, svc.no_socket)] if _on(sock) else []
        elif (head, svc.socket) in changed and sock.active == "active" or active and sock.active != "active":
            steps.append(Step(svc.restart, head, svc.socket, svc.socket_why))
            if active:
                return steps                    # the service restarts with its socket
    if not active:
        return steps + [Step(svc.start, head, svc.unit, svc.not_running)]
    if (head, svc.unit) in changed or any((head, rel) in written for rel in svc.reads):
        return steps + [Step(svc.restart, head, svc.unit, svc.restart_why)]
    if any((head, rel) in written for rel in svc.reloads):
        return steps + [Step(svc.reload, head, svc.unit, svc.reload_why)]
    return steps
