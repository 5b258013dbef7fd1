"""Every node's node_exporter for Prometheus (Debian's prometheus-node-exporter), as launch sets it up
when METRICS_DIR is set: a systemd drop-in giving it the textfile collector on METRICS_DIR and the
systemd collector for dsv41's units, then enabled and (re)started. Serving needs none of it: a node
without the package only gets a note."""
from dsv41 import names
from dsv41.head.core import commands, units

BINARY = "/usr/bin/prometheus-node-exporter"
USER = "prometheus"                  # the package's user: it must read METRICS_DIR
TEMPLATE = "prometheus-node-exporter.dsv41.conf.j2"
UNIT_INCLUDE = "dsv41-.+[.]service"   # the systemd collector's units: the ranks, the guard, the watchdog


def argv(cfg):
    return [BINARY, f"--web.listen-address=:{cfg.exporter_port}",
            f"--collector.textfile.directory={cfg.metrics_dir}",
            "--collector.systemd", f"--collector.systemd.unit-include={UNIT_INCLUDE}",
            "--collector.systemd.enable-restarts-metrics"]


def dropin(cfg):
    """{the drop-in's path under UNIT_DIR: text} a node must hold; empty without METRICS_DIR."""
    if not cfg.metrics_dir:
        return {}
    text = units.environment().get_template(TEMPLATE).render(exporter=argv(cfg))
    return {names.EXPORTER_DROPIN: text}


def start(cl, node):
    """METRICS_DIR readable by the exporter's user, the exporter unmasked, enabled and restarted with
    the drop-in. -> the line to say on the node: what was started, or what it lacks (a node without the
    package, or whose METRICS_DIR the exporter cannot read); serving goes on either way."""
    d = cl.cfg.metrics_dir
    unit = names.EXPORTER_UNIT
    if node.run(commands.is_executable(BINARY), check=False).code:
        return (f"note: {BINARY} is missing, so Prometheus gets no node metrics from it: "
                "apt install prometheus-node-exporter (serving does not need it)")
    for argv in (commands.mkdir(d), commands.chmod("a+rx", d),
                 commands.systemctl("unmask", unit),                # a masked package service (the lab's)
                 commands.systemctl("enable", "--quiet", unit), commands.systemctl("restart", unit)):
        r = node.run(cl.priv(node, argv), check=False)
        if r.code:
            return (f"note: `{' '.join(argv)}` failed ({r.stderr.strip()[-200:]}); Prometheus gets no "
                    f"node metrics from it (`journalctl -u {unit}`; serving does not need it)")
    if node.run(cl.priv(node, commands.can_read_dir(USER, d)), check=False).code:
        return (f"note: the exporter's user {USER} cannot read METRICS_DIR={d} (a parent directory is "
                "closed to it, e.g. a home): choose a METRICS_DIR such as /var/lib/dsv41/metrics")
    return f"started {unit}: textfile metrics from {d}, dsv41's units, on port {cl.cfg.exporter_port}"
