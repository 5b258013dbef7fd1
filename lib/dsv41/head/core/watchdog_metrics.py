"""The watchdog's textfiles for node_exporter's textfile collector (METRICS_DIR): its verdict, recoveries and the
last start-up (dsv41_watchdog.prom; with GROUPS > 1 one per group, dsv41_watchdog.g<N>.prom, every series labelled
group="g<N>"), and each client key's use at the gateway (dsv41_gateway.prom). prometheus_client is imported where
they are written: only a watchdog with METRICS_DIR needs it."""
import os
import time

from dsv41.head.core.health import VERDICTS

METRICS_FILE = "dsv41_watchdog.prom"
GATEWAY_FILE = "dsv41_gateway.prom"     # each client key's use at the gateway (GATEWAY=1), by the key's name


def metrics_file(scope=None):
    """A watchdog's textfile: dsv41_watchdog.prom, or one group's dsv41_watchdog.g<N>.prom (GROUPS > 1)."""
    return METRICS_FILE if scope is None else METRICS_FILE.replace(".prom", f".g{scope}.prom")


def write_metrics(directory, h, recoveries, gave_up, now, last_end=0, started=None, scope=None):
    """dsv41_watchdog.prom for node_exporter's textfile collector, through prometheus_client (imported
    here: only a watchdog with METRICS_DIR needs it). While a recovery runs, dsv41_watchdog_recovering
    names it (verdict, node, fault_at, incident), so that the alerts of its rank and API stay quiet.
    started: the last start-up ($STATE_DIR/startup.json): a gauge per phase known, and the whole. scope: one
    group's watchdog (GROUPS > 1): its own file (metrics_file), every series labelled group="g<N>"."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, write_to_textfile
    disable_created_metrics()           # no *_created series: the counter counts from the incidents file
    reg = CollectorRegistry()
    g = Gauge("dsv41_watchdog_verdict", "The watchdog's verdict (1 for the current one).", ["verdict"], registry=reg)
    for v in VERDICTS:
        g.labels(v).set(int(v == h.verdict))
    rec = Gauge("dsv41_watchdog_recovering", "1 while a recovery runs, naming its incident.",
                ["verdict", "node", "fault_at", "incident"], registry=reg)
    if h.recovering:
        i = h.recovering
        fault_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(i["fault_at"])) if i.get("fault_at") else ""
        rec.labels(i.get("verdict") or "", i.get("node") or "", fault_at, i["id"]).set(1)
    Gauge("dsv41_watchdog_judging", "1 while a sign of a fault awaits the watchdog's verdict, or a fault awaits "
          "its recovery: the symptom alerts wait.", registry=reg).set(int(h.judging))
    Gauge("dsv41_watchdog_last_recovery_end_timestamp_seconds", "When the last recovery ended (0: none).",
          registry=reg).set(last_end)
    Counter("dsv41_watchdog_recoveries", "Recoveries the watchdog started.", registry=reg).inc(recoveries)
    Gauge("dsv41_watchdog_gave_up", "Whether the watchdog gave up (hands off until doit launch).",
          registry=reg).set(int(gave_up))
    Gauge("dsv41_watchdog_last_check_timestamp_seconds", "When the watchdog last looked.", registry=reg).set(now)
    if started:
        startup_gauges(reg, Gauge, started)
    if scope is not None:
        reg = labelled(reg, "group", f"g{scope}")
    os.makedirs(directory, exist_ok=True)
    write_to_textfile(os.path.join(directory, metrics_file(scope)), reg)


def labelled(reg, name, value):
    """A registry of every sample of reg with one more label (name=value)."""
    class Labelled:
        def collect(self):
            for family in reg.collect():
                family.samples = [sample._replace(labels={**sample.labels, name: value}) for sample in family.samples]
                yield family
    out = type(reg)()
    out.register(Labelled())
    return out


def startup_gauges(reg, Gauge, started):
    """dsv41_startup_phase_seconds{phase, kind, cache} of each phase known of the last start-up (kind:
    launch, rollback, recovery, restart; cache: the compile's hit or miss, "" when none is known), and
    dsv41_startup_seconds{kind}, its whole; an unknown phase has no series, never a made-up figure."""
    kind = started.get("kind") or "?"
    g = Gauge("dsv41_startup_phase_seconds", "Seconds each phase of the last start-up of the ranks took, as rank "
              "0's journal shows it.", ["phase", "kind", "cache"], registry=reg)
    for p in started.get("phases") or ():
        if p.get("seconds") is not None:
            g.labels(p["phase"], kind, p.get("cache") or "").set(p["seconds"])
    if started.get("total") is not None:
        Gauge("dsv41_startup_seconds", "Seconds the last start-up of the ranks took, from rank 0's unit start to "
              "the API.", ["kind"], registry=reg).labels(kind).set(started["total"])


def write_gateway_metrics(directory, use):
    """dsv41_gateway.prom: each client key's use at the gateway, labelled with the key's name (the stick
    table holds names, never a key); use is dsv41.node.gateway.usage()'s {name: {...}}."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, write_to_textfile
    disable_created_metrics()
    reg = CollectorRegistry()
    counters = {field: Counter(f"dsv41_gateway_key_{field}", text, ["key"], registry=reg) for field, text in (
        ("requests", "Requests the gateway received with this key."),
        ("errors", "Requests with this key that ended in an HTTP error or an engine failure."),
        ("unavailable", "Requests with this key the gateway answered 503 (door closed or engine down)."),
        ("limited", "Requests with this key the gateway answered 429 (past KEY_RATE_PER_MIN)."))}
    idle = Gauge("dsv41_gateway_key_idle_seconds", "Seconds since this key was last used.", ["key"], registry=reg)
    for name, u in sorted(use.items()):
        for field, counter in counters.items():
            counter.labels(name).inc(u[field])
        idle.labels(name).set(u["idle_s"])
    os.makedirs(directory, exist_ok=True)
    write_to_textfile(os.path.join(directory, GATEWAY_FILE), reg)


def remove_metrics(directory, files=(METRICS_FILE, GATEWAY_FILE)):
    """A stopped watchdog's last state must not be shown as current: its textfiles go."""
    for name in files if directory else ():
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            pass
