"""doit stop (the cluster's alerts silenced first, for ALERT_SILENCE_MAX_H or until `doit launch` is ready;
the watchdog next, so it never fights the stop; the gateway's drain (new requests 503, those in flight
finish); then the engine's units in the recipe's stop order, then the memory guards; the gateway stays,
answering 503, unless --free-port) and doit clear-trip.
Stop is what people reach for when things are broken: it stops everything on every node it can reach,
then fails naming each node it could not reach and what may still run there. It says what it stopped,
what was installed but not running, and which node has nothing of dsv41 installed."""
from dsv41 import names
from dsv41.errors import UserError, one_line
from dsv41.head.core import recovery, runlock, silences
from dsv41.head.core.cluster import Cluster, say

RUNNING = ("active", "activating", "reloading", "deactivating", "")    # "": systemd did not say


def stop(cfg, free_port=False):
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
    for spec, unit in cl.recipe.stop_order(cfg.nodes):
        on(cl.node(spec), unit, unit)
    for node in cl.nodes:
        on(node, names.MEMGUARD_UNIT, "the memory guard")
    gateway_after_stop(cl, seen, free_port, on)
    if missed:
        raise UserError("not stopped: " + "; ".join(
            f"{n.label} did not answer ({one_line(err, 160)}), so {', '.join(cl.engine_units(n))} and "
            f"{names.MEMGUARD_UNIT} may still run there" for n, err in missed.items())
            + "; run `doit stop` again once it answers")


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
