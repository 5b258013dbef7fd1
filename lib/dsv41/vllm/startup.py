"""A start-up's phases read from rank 0's journal (`journalctl -u dsv41-r0 -o short-iso-precise`), by the
lines vLLM 0.32 logs (the files named below are vLLM's). Each phase is timed between its own first and
last line on the journal's clock; where its first line is missing, by the figure its last line carries
(vLLM's own measure); else it is unknown. A line worded otherwise is not read: its phase is unknown,
never a figure taken from another line. Only the last start-up in the text counts (from systemd's last
"Starting" line of the unit).

    container  the unit's start (systemd) to vLLM's first log line (a container started, Python imported)
    weights    "Starting to load model" | "Loading model from scratch" (model runner) to the last
               "Loading weights took X seconds" (model_loader: a drafter loads its weights after the model)
    compile    "Starting torch.compile" to the last "torch.compile took X s in total" (compilation/monitor.py);
               its cache: a hit when only "Directly load the compiled graph(s) ... from the cache" or
               "Directly load AOT compilation" shows, a miss when "Compiling a graph for ..." does
               (compilation/backends.py, decorators.py)
    warmup     "Warming up model for the compilation" to "Warming up done." (the CPU build), or the GPU
               build's "Initial profiling/warmup run took X s" (compilation/monitor.py)
    kv_cache   "Available KV cache memory" | "GiB for KV cache" (CPU) | "memory for KV Cache" (the
               KV_BYTES setting) to "KV cache size: N tokens" (v1/core/kv_cache_utils.py)
    graphs     "Capturing CUDA graphs" to "Graph capturing finished in X secs" (gpu model runner)
    api        "init engine (profile, create kv cache, warmup model) took" (v1/engine/core.py) to
               uvicorn's "Application startup complete."

A phase inside another (the CPU build compiles during its warm-up) counts in the inner one only."""
import re
from datetime import datetime

from dsv41.head.core.startup import Phase, Startup

BEGIN = re.compile(r"systemd\[\d+\]: (Starting|Started) ")
VLLM_LINE = re.compile(r"\b(DEBUG|INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d(\.\d+)? \[")
# key: (first line, last line; group 1 of the last: vLLM's own seconds)
MARKS = {
    "weights": (r"Starting to load model|Loading model from scratch", r"Loading weights took ([\d.]+) seconds"),
    "compile": (r"Starting torch\.compile", r"torch\.compile took ([\d.]+) s in total"),
    "warmup": (r"Warming up model for the compilation", r"Warming up done|Initial profiling/warmup run took ([\d.]+) s"),
    "kv_cache": (r"Available KV cache memory|GiB for KV cache|memory for KV Cache", r"KV cache size: [\d,]+ tokens"),
    "graphs": (r"Capturing CUDA graphs", r"Graph capturing finished in ([\d.]+) secs"),
    "api": (r"init engine \(profile, create kv cache, warmup model\) took", r"Application startup complete"),
}
MARKS = {k: (re.compile(a), re.compile(b)) for k, (a, b) in MARKS.items()}
HIT = re.compile(r"Directly load the compiled graph|Directly load AOT compil")
MISS = re.compile(r"Compiling a graph for ")
ALWAYS = ("container", "weights", "kv_cache", "api")     # every vLLM start-up has them: missing is unknown
COMPILES = re.compile(r"torch\.compile|Compiling a graph|Directly load")    # a compile ran: its phase is shown


def _lines(text):
    """[(unix time, message)] of journal lines with a timestamp (others are skipped)."""
    out = []
    for line in text.splitlines():
        stamp, _, rest = line.partition(" ")
        try:
            t = datetime.fromisoformat(stamp).timestamp()
        except ValueError:
            continue
        out.append((t, rest))
    return out


def _last_start(lines):
    """The lines of the last start-up (from systemd's last "Starting", else "Started", line) and its time."""
    for word in ("Starting", "Started"):
        at = [i for i, (_, m) in enumerate(lines) if BEGIN.search(m) and BEGIN.search(m).group(1) == word]
        if at:
            return lines[at[-1]:], lines[at[-1]][0]
    return lines, None


def _spans(lines, began):
    """{phase: (first time or None, last time or None, vLLM's own seconds or None)} of the phases seen."""
    spans = {}
    first = next((t for t, m in lines if VLLM_LINE.search(m)), None)
    if began is not None:
        spans["container"] = (began, first, None)
    for key, (start, end) in MARKS.items():
        starts = [t for t, m in lines if start.search(m)]
        ends = [(t, end.search(m)) for t, m in lines if end.search(m)]
        own = [float(e.group(1)) for _, e in ends if e.lastindex and e.group(1)]
        if starts or ends or key == "compile" and any(COMPILES.search(m) for _, m in lines):
            spans[key] = (starts[0] if starts else None, ends[-1][0] if ends else None,
                          sum(own) if own and len(own) == len(ends) else None)
    return spans


def _inner_start(key, a, b, spans):
    """A phase's start moved past any other phase that ended inside it (that time counts there)."""
    inside = [e for k, (_, e, _) in spans.items() if k != key and e is not None and a < e < b]
    return max([a, *inside])


def startup(text):
    """The last start-up in a journal's text, as core.startup.Startup."""
    lines, began = _last_start(_lines(text))
    spans = _spans(lines, began)
    phases, open_ = [], []
    for key in ("container", *MARKS):
        a, b, own = spans.get(key, (None, None, None))
        if a is not None and b is not None and b >= a:
            seconds = b - _inner_start(key, a, b, spans)
        elif b is not None:
            seconds = own
        else:
            seconds = None
            if a is not None:
                open_.append((_inner_start(key, a, float("inf"), spans), key))
        if key in spans or key in ALWAYS:
            cache = _cache(lines) if key == "compile" else None
            phases.append((b if b is not None else float("inf"), Phase(key, seconds, cache)))
    ordered = tuple(p for _, p in sorted(phases, key=lambda x: x[0]))
    ready = spans.get("api", (None, None, None))[1]
    if ready is not None:
        return Startup(ordered, ready - began if began is not None else None)
    since, current = max(open_) if open_ else (None, None)        # not over: the phases that ended so far
    return Startup(tuple(p for end, p in sorted(phases, key=lambda x: x[0]) if end != float("inf")), None, current,
                   since)


def _cache(lines):
    if any(MISS.search(m) for _, m in lines):
        return "miss"
    return "hit" if any(HIT.search(m) for _, m in lines) else None
