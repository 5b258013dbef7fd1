"""dsv41's own units on a node, as a rollout applies them (core/rollout.py apply()): a unit file installed
(through `sudo -n` when the node's user is not root), a service started, restarted, reloaded or stopped
and kept enabled while it runs, and a step of one of our services (core.decide.SERVICES)."""
from dsv41 import names
from dsv41.head.core import commands
from dsv41.head.core.nodes import say


def install_unit(cl, node, name, text):
    """Write /etc/systemd/system/<name> atomically; through sudo -n when the node's user is not root."""
    path = f"{names.UNIT_DIR}/{name}"
    if cl.uid(node) == 0:
        node.write_file(path, text)
    else:
        tmp = f"{cl.paths(node).state_dir}/{names.RUN}/.{name.replace('/', '_')}.tmp"
        node.write_file(tmp, text)
        node.run(commands.install_unit_file(tmp, path))
    say(node, f"installed {path}")


def control(cl, node, kind, unit, what, also=()):
    """systemctl start, restart, reload or stop (kind: a core.decide Kind) of a unit kept enabled, with the
    units `also` names (disabled when stopped)."""
    verb = kind.value.split("-")[0]
    cl.systemctl(node, verb, unit)
    cl.systemctl(node, "disable" if verb == "stop" else "enable", "--quiet", unit, *also)
    say(node, f"{verb}{'ped' if verb == 'stop' else 'ed'} the {what}")


def service_step(cl, svc, step):
    """A step of a service of ours (core.decide.HeadService) on its node, on the unit it names: the service, or
    the socket holding its port (restarted: the service restarts with it, and both stay enabled; stopped:
    it alone). What would take its place (Debian's own haproxy.service: the same config's place and port
    80) is masked first, unless it stops."""
    node = cl.node(cl.specs[step.node])
    if svc.masks and step.kind is not svc.stop:
        cl.systemctl(node, "mask", "--now", "--quiet", svc.masks, check=False)
    also = (svc.unit,) if step.target != svc.unit and step.kind is not svc.stop else ()
    control(cl, node, step.kind, step.target, svc.what_of(step.target), also)
