"""dsv41's own units on a node, as a rollout applies them (core/rollout.py apply()): a unit file installed
(through `sudo -n` when the node's user is not root), a service started, restarted, reloaded or stopped
and kept enabled while it runs, and the gateway's steps on the head."""
from dsv41 import names
from dsv41.head.core.decide import Kind
from dsv41.head.core.nodes import say


def install_unit(cl, node, name, text):
    """Write /etc/systemd/system/<name> atomically; through sudo -n when the node's user is not root."""
    path = f"{names.UNIT_DIR}/{name}"
    if cl.uid(node) == 0:
        node.write_file(path, text)
    else:
        tmp = f"{cl.paths(node).state_dir}/{names.RUN}/.{name.replace('/', '_')}.tmp"
        node.write_file(tmp, text)
        node.run(["sudo", "-n", "install", "-D", "-m", "0644", tmp, path])   # -D: a drop-in's dir
    say(node, f"installed {path}")


def control(cl, node, kind, unit, what):
    """systemctl start, restart, reload or stop (kind: a core.decide Kind) of a service kept enabled
    (disabled when stopped)."""
    verb = kind.value.split("-")[0]
    cl.systemctl(node, verb, unit)
    cl.systemctl(node, "disable" if verb == "stop" else "enable", "--quiet", unit)
    say(node, f"{verb}{'ped' if verb == 'stop' else 'ed'} the {what}")


def gateway_step(cl, kind):
    """A gateway step on the head; Debian's own haproxy.service is masked first (it would take the same
    config's place and port 80)."""
    if kind is not Kind.STOP_GATEWAY:
        cl.systemctl(cl.head, "mask", "--now", "--quiet", names.DEBIAN_HAPROXY_UNIT, check=False)
    control(cl, cl.head, kind, names.GATEWAY_UNIT, "gateway")
