"""The serving recipe: what the engine is, in one object. Per node the units it runs (and the container
each unit runs), the order they start and stop in, their unit files (the container's argv and
environment), the readiness probe and the metrics that show the engine at work and making progress.

launch, stop, status, decide, the watchdog and top ask the recipe and spell no engine flag, engine
unit name or order themselves; dsv41's own units (the memory guard, the watchdog) are not part of it.
dsv41.vllm (its package: the recipe, the container's argv, its settings, its alert rules and dashboard
panels) is the recipe dsv41 ships; another engine (or another way to run the ranks) is another
subclass of Recipe in a package of its own, chosen in engine.for_config. Only the probes (ready,
scrape) reach the engine; the rest is pure."""
from typing import NamedTuple


class Part(NamedTuple):
    """One engine unit of a node and the container it runs ("" for none)."""
    unit: str
    container: str


class Recipe:
    """What every recipe provides. Subclasses fill in the engine; the order rules default to vLLM's
    rendezvous: workers start before the head, the head stops first."""
    name = ""
    series = None                   # dsv41.client.metrics.Series: the names top and bench read figures by
    rules_template = None           # a jinja2 file of alert rules for Prometheus's dsv41 group, or None
    plan_settings = ()              # its own settings `doit plan` shows among the resolved ones
    memory_settings = "the engine's memory settings"    # what to lower when the memory guard trips
    # metric names read from the engine's /metrics: requests in the engine (a gauge each), and the
    # signals that move while it makes progress (counters or gauges; any of them moving counts)
    work_metrics: tuple = ()
    work_words: tuple = ()          # what each work metric counts, for the watchdog's evidence
    progress_metrics: tuple = ()
    # a worker whose units started after the head's cannot rejoin: every rank restarts together
    restart_together = True
    # {flag: what it gives} the units pass only when the image's server lists it (core.image asks)
    optional_flags: dict = {}

    def __init__(self, cfg):
        self.cfg = cfg

    # ---- units and order ----------------------------------------------------------------------

    def parts(self, spec):
        """(Part, ...) one node runs, in the order they start on that node."""
        raise NotImplementedError

    def units(self, spec):
        return tuple(p.unit for p in self.parts(spec))

    def containers(self, spec):
        return tuple(p.container for p in self.parts(spec) if p.container)

    def start_order(self, specs):
        """[(spec, unit)] in the order a restart starts them: the workers' units, then the head's."""
        return [(s, u) for s in list(specs[1:]) + [specs[0]] for u in self.units(s)]

    def stop_order(self, specs):
        """[(spec, unit)] in the order they stop: the head's units first (a stale rendezvous races)."""
        return [(s, u) for s in [specs[0]] + list(specs[1:]) for u in reversed(self.units(s))]

    def log_units(self, specs):
        """{word `doit logs` takes: (spec, [units])}: r<N> for each node's engine units."""
        return {f"r{s.rank}": (s, list(self.units(s))) for s in specs}

    # ---- unit files ---------------------------------------------------------------------------

    def render(self, render, spec, fabric, paths, master_addr=None, server_flags=()):
        """{unit file name: text} of one node's engine units. render(template, values) renders one of
        units/*.j2 (core.units gives it); fabric and paths as core.units.render_units takes them;
        server_flags: those of optional_flags the image's server lists."""
        raise NotImplementedError

    def rendezvous(self, unit_text):
        """What an engine unit's ranks meet on (its nodes share it: one serving group), read from the unit's
        text; None when it cannot say (no text): decide() then cannot see a change of the groups."""
        return None

    def flag_probe(self, flag):
        """(entrypoint, args) of a container of the image whose output names `flag` when its server takes it."""
        raise NotImplementedError

    # ---- probes -------------------------------------------------------------------------------

    def metrics_url(self):
        raise NotImplementedError

    def scrape(self, timeout, key=None):
        """One snapshot of the engine's /metrics (dsv41.client.metrics.Snapshot), key sent when given; UserError
        when it does not answer."""
        raise NotImplementedError

    def ready(self, client):
        """The readiness probe, with an API client holding the key: True once the engine serves."""
        raise NotImplementedError

    def context_len(self):
        """The longest context the engine serves (tokens), for Pi's model entry; None: unknown."""
        return None

    def dashboard_panels(self):
        """Grafana panels of the engine's series, placed before dsv41's own."""
        return []

    def startup(self, journal):
        """The last start-up in rank 0's journal (`journalctl -o short-iso-precise`) as a
        core.startup.Startup: its phases, each with its seconds (None: unknown), the whole, and the phase
        under way while it starts. None: this recipe reads no phases."""
        return None

    def gpu_memory_wanted(self, total_bytes):
        """(bytes, the setting that decides it) of a node's memory a rank takes, for preflight's memory
        check."""
        raise NotImplementedError

    def work(self, snap):
        """(value, ...) of work_metrics in a metrics snapshot (0 when absent)."""
        return tuple(snap.value(m, 0) for m in self.work_metrics)

    def progress(self, snap):
        """(value, ...) of progress_metrics in a metrics snapshot: any change is progress."""
        return tuple(snap.value(m, 0) for m in self.progress_metrics)

