"""Where a start-up's minutes went: its phases, as the recipe reads them from rank 0's journal (for vLLM:
dsv41/vllm/startup.py), kept in the record of what started the ranks (a release's `startup_phases`, an
incident's `startup`) and in $STATE_DIR/startup.json (the last start-up: `doit status`'s "last time" and
the watchdog's gauges). Engine-neutral: a phase is a key below, its seconds, and for the compile whether
its cache was hit. A phase the log does not show is unknown (None), never a guessed figure; what no
phase covers is shown as "between phases", so the shown seconds add up to the whole."""
from typing import NamedTuple

# key: (what `doit ... show` calls it done, what `doit status` calls it under way)
PHASES = {
    "container": ("container started", "starting the container"),
    "weights": ("weights loaded", "loading weights"),
    "compile": ("compiled", "compiling"),
    "warmup": ("warmed up", "warming up"),
    "kv_cache": ("KV cache sized", "sizing the KV cache"),
    "graphs": ("graphs captured", "capturing graphs"),
    "api": ("API ready", "starting the API"),
}


class Phase(NamedTuple):
    name: str                   # a key of PHASES
    seconds: float | None       # None: unknown (a line missing or not understood)
    cache: str | None = None    # the compile's cache: "hit", "miss", None (unknown, or no cache)


class Startup(NamedTuple):
    """One start-up as its log shows it: the phases in the order they ended, the whole (from the unit's
    start to the API's readiness; None until then, or when either is missing from the log), and the phase
    under way with when it began (unix time), for a start-up not over."""
    phases: tuple = ()
    total: float | None = None
    current: str | None = None
    since: float | None = None


def to_record(phases):
    """[{"phase", "seconds", "cache"}] as records keep them."""
    return [{"phase": p.name, "seconds": None if p.seconds is None else round(p.seconds, 1), "cache": p.cache}
            for p in phases]


def from_record(rows):
    """Phases from a record (an older record has none: ())."""
    return tuple(Phase(r.get("phase", "?"), r.get("seconds"), r.get("cache")) for r in rows or ())


def clock(seconds):
    """4:12, 1:02:03, or "?"."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def seconds_of(phases, name):
    return next((p.seconds for p in phases if p.name == name), None)


def lines(started, title="start-up", indent="  "):
    """The phase table `doit releases show N` and `doit incidents show N` print, of a record's
    {"phases", "total"}."""
    phases, total = from_record(started.get("phases")), started.get("total")
    out = [f"{indent}{title:<11} {clock(total) if total is not None else '?'} from the unit's start to the API"]
    for p in phases:
        said = PHASES.get(p.name, (p.name,))[0] + (f" (cache {p.cache})" if p.cache else "")
        out.append(f"{indent}  {said:<28} {'unknown' if p.seconds is None else clock(p.seconds):>8}")
    known = sum(p.seconds for p in phases if p.seconds is not None)
    if total is not None and total - known >= 1:
        out.append(f"{indent}  {'between phases, or unknown':<28} {clock(total - known):>8}")
    return out


def under_way(current, since, now, last=()):
    """`doit status`'s line while the ranks start: "loading weights, 4:12; 8:30 last time"."""
    if current is None:
        return "starting: phase not known from the log yet"
    elapsed = clock(max(0.0, now - since)) if since is not None else "?"
    before = seconds_of(last, current)
    return (f"{PHASES.get(current, ('', current))[1]}, {elapsed}"
            + (f"; {clock(before)} last time" if before is not None else ""))
