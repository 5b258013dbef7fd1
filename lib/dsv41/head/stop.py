"""doit stop (the cluster's alerts silenced first, for ALERT_SILENCE_MAX_H or until `doit launch` is ready;
the watchdog next, so it never fights the stop; the gateway's drain (new requests 503, those in flight
finish); then the engine's units in the recipe's stop order, then the memory guards; the gateway stays,
answering 503, unless --free-port) and doit clear-trip.
Stop is what people reach for when things are broken: it stops everything on every node it can reach,
then fails naming each node it could not reach and what may still run there. It says what it stopped,
what was installed but not running, and which node has nothing of dsv41 installed.

`doit stop --group N` (GROUPS > 1) stops one serving group while the others serve: its watchdog is told to keep
its hands off until `doit launch` (a recovery it has in progress is ended), its server at the door drains, then
its ranks, memory guards and side door stop."""
from dsv41 import names
from dsv41.errors import UserError, one_line
from dsv41.head.core import recovery, runlock, silences
from dsv41.head.core.cluster import Cluster, say

RUNNING = ("active", "activating", "reloading", "deactivating", "")    # "": systemd did not say
GROUP_STOPPED = "stopped by `doit stop --group`: hands off until `doit launch`"


def stop(cfg, free_port=False, group=None):
    if group is not None:
        return stop_group(cfg, group)
    cl = Cluster(cfg)
    say(cl.head, silences.silence(cfg, "doit stop"))
    cl.connect()
    missed, seen = {}, {}
    for node in cl.nodes:                           # which units each node has installed, and their states
        try:
            seen[node.name] = cl.probe(node) if not node.unreachable else None
        except UserError as err:                    # it stopped answering, or answered nonsense
            missed.setdefault(node, err)
        if seen.get(node.name) and not any(seen[node.name].unit(u).installed for u in cl.unit_names(node)):
            say(node, "nothing of dsv41 is installed here")

    def on(node, unit, what):
        if node.unreachable:
            missed.setdefault(node, node.unreachable)
            return
        u = seen[node.name].unit(unit) if seen.get(node.name) else None
        if u is None or not u.installed:
            return
        try:
            cl.systemctl(node, "stop", unit, check=False)
            say(node, f"stopped {what}" if u.active in RUNNING else f"{what} was not running")
        except UserError as err:                    # the node stopped answering
            missed.setdefault(node, err)

    # the watchdog first, before the run lock: a recovery it has in progress ends and frees the lock
    on(cl.head, names.WATCHDOG_UNIT, "the watchdog")
    runlock.take(cfg.state_dir)
    if not cl.head.unreachable:             # new requests 503, those in flight finish (DRAIN_S)
        recovery.door(cl, lambda line: say(cl.head, line), cl.gateway.STOPPED, drain=True)
    stop_units(cl, on)
    gateway_after_stop(cl, seen, free_port, on)
    if missed:
        raise UserError("not stopped: " + "; ".join(
            f"{n.label} did not answer ({one_line(err, 160)}), so {', '.join(cl.engine_units(n))} and "
            f"{names.MEMGUARD_UNIT} may still run there" for n, err in missed.items())
            + "; run `doit stop` again once it answers")


def stop_units(cl, on):
    """Every group's ranks in the recipe's stop order, then the memory guards and the side doors."""
    for spec, unit in [o for g in cl.groups() for o in cl.recipe.stop_order(g.cfg.nodes)]:
        on(cl.node(spec), unit, unit)
    for node in cl.nodes:
        on(node, names.MEMGUARD_UNIT, "the memory guard")
        on(node, names.SIDE_DOOR_UNIT, "the side door")


def stop_group(cfg, index):
    """`doit stop --group N`: one serving group taken out while the others serve (the module's docstring)."""
    if cfg.groups == 1:
        raise UserError("--group: there is one serving group (GROUPS=1): `doit stop` stops it")
    if not 0 <= index < cfg.groups:
        raise UserError(f"--group {index}: the groups are 0 to {cfg.groups - 1} (GROUPS={cfg.groups})")
    cl = Cluster(cfg.group_config(index))
    recovery.take_out(cl, GROUP_STOPPED, lambda line: say(cl.home, line))
    say(cl.home, f"group {index} ({', '.join(s.name for s in cl.cfg.nodes)}) is stopped and out of the door; the "
                 "others serve; `doit launch` starts it again")


def gateway_after_stop(cl, seen, free_port, on):
    """The gateway stays and answers 503 "stopped by `doit stop`" (clients wait and are told why); with
    --free-port it stops too, with the socket unit that holds PORT for it (first: nothing starts the gateway
    again), both disabled, and PORT is free."""
    head = seen.get(cl.head.name)
    installed = [u for u in (names.GATEWAY_SOCKET_UNIT, names.GATEWAY_UNIT) if head and head.unit(u).installed]
    if not installed:
        return
    g = head.unit(names.GATEWAY_UNIT)
    if free_port:
        for unit in installed:
            on(cl.head, unit, f"the gateway: port {cl.layout.port} is free" if unit == names.GATEWAY_UNIT else
               f"the socket holding the gateway's port ({unit})")
        cl.systemctl(cl.head, "disable", "--quiet", *installed, check=False)
    elif g.active == "active":
        say(cl.head, f"the gateway stays on port {cl.layout.port}, answering 503 \"{cl.gateway.STOPPED}\" "
                     "(`doit stop --free-port` stops it too)")


def clear_trip(cfg):
    """Remove every trip marker. The watchdog stops too, until the next `doit launch` starts it: it
    would otherwise restart the ranks with the settings that tripped the guard."""
    cl = Cluster(cfg)
    cl.connect()
    cl.systemctl(cl.head, "stop", names.WATCHDOG_UNIT, check=False)
    for n in cl.nodes:
        marker = names.state_path(cl.paths(n).state_dir, names.TRIP_MARKER)
        r = cl.remove(n, marker)
        if not r.ok:
            raise UserError(f"{n.label}: could not remove {marker}: {one_line(r.stderr) or f'exit {r.code}'}")
        say(n, f"cleared {marker}")
    say(cl.head, "the watchdog is stopped until the next `doit launch`")
