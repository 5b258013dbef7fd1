"""An engine's Prometheus /metrics, read with prometheus_client's parser: one Snapshot per scrape; rates
from counter deltas and percentiles from histogram bucket deltas between two snapshots (what happened
in the interval, not since the server started). Which series say what is the engine's (a Series, from
its recipe: dsv41/vllm/recipe.py for vLLM); nothing here names one."""
import math
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import requests
from prometheus_client.parser import text_string_to_metric_families

from dsv41.client.api import bounded
from dsv41.errors import UserError, one_line



class Series(NamedTuple):
    """The names of the series an engine is observed by."""
    running: str                # gauge: requests being served
    waiting: str                # gauge: requests queued
    kv_usage: str               # gauge: KV-cache use, 0..1 (the fullest engine counts)
    prompt_tokens: str          # counter: prompt tokens processed
    generation_tokens: str      # counter: tokens generated
    preemptions: str            # counter: requests preempted
    ttft: str                   # histogram: time to first token, seconds
    itl: str                    # histogram: inter-token latency, seconds


@dataclass
class Snapshot:
    time: float
    samples: dict = field(default_factory=dict)      # sample name -> {labels (sorted tuple): value}

    def value(self, name, default=None):
        """A sample summed over its label sets (engines, models); default when absent."""
        series = self.samples.get(name)
        return sum(series.values()) if series else default

    def peak(self, name, default=None):
        """A gauge's largest value over its label sets (a fraction such as KV-cache usage)."""
        series = self.samples.get(name)
        return max(series.values()) if series else default

    def buckets(self, name):
        """A histogram's cumulative bucket counts {upper bound: count}, summed over label sets."""
        out = {}
        for labels, v in self.samples.get(name + "_bucket", {}).items():
            le = float(dict(labels)["le"])
            out[le] = out.get(le, 0.0) + v
        return dict(sorted(out.items()))


def parse(text, at=None):
    """A Snapshot of the exposition text; ValueError when it is not Prometheus text."""
    snap = Snapshot(time.time() if at is None else at)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            snap.samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return snap


def rate(a, b, name):
    """Per-second increase of a counter from snapshot a to b; None when unknown (or reset)."""
    va, vb = a.value(name), b.value(name)
    if va is None or vb is None or vb < va or b.time <= a.time:
        return None
    return (vb - va) / (b.time - a.time)


def quantile(a, b, name, q):
    """The q-quantile (0..1) of a histogram's observations between snapshots a and b, interpolated
    within the bucket as Prometheus' histogram_quantile does; None when nothing was observed."""
    before, after = a.buckets(name), b.buckets(name)
    delta = [(le, after[le] - before.get(le, 0.0)) for le in after]
    if not delta or delta[-1][1] <= 0:
        return None
    rank, prev_le, prev_count = q * delta[-1][1], 0.0, 0.0
    for le, count in delta:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            width = count - prev_count
            return prev_le + (le - prev_le) * ((rank - prev_count) / width if width else 0.0)
        prev_le, prev_count = le, count
    return None


def metrics_url(api_url):
    """The engine's /metrics beside an OpenAI-compatible base URL: http://h:8000/v1 -> http://h:8000/metrics."""
    url = api_url.rstrip("/")
    return (url[: -len("/v1")] if url.endswith("/v1") else url) + "/metrics"


def scrape(url, timeout=5.0, key=None):
    """A Snapshot of one GET of url (timed when the answer arrived), within `timeout` seconds of wall time
    (a server that trickles cannot stretch it: api.bounded); UserError in one line when the server does
    not answer in time, answers with an error, or answers with something that is not Prometheus text.
    key: sent as a bearer token (a serving group behind its side door lets nothing in without it)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        r = bounded(lambda: requests.get(url, timeout=(min(2.0, timeout), timeout), headers=headers), timeout,
                    f"GET {url}")
    except requests.exceptions.ConnectionError as err:
        why = "connection refused" if "refused" in str(err).lower() else one_line(err, 120)
        raise UserError(f"no answer from {url} ({why})") from None
    except requests.exceptions.RequestException as err:
        why = "timed out" if isinstance(err, requests.exceptions.Timeout) else one_line(err, 120)
        raise UserError(f"no answer from {url} ({why})") from None
    at = time.time()
    if r.status_code != 200:
        raise UserError(f"{url} answered HTTP {r.status_code}: {one_line(r.text, 120) or 'no body'}")
    try:
        return parse(r.text, at)
    except ValueError as err:
        raise UserError(f"{url} did not answer Prometheus text ({one_line(err, 120)})") from None


def engine(a, b, series):
    """What the engine is doing, read by its Series, from snapshot b and, for the last interval, the earlier snapshot a
    (None: rates and percentiles are None). Percentiles come from the histogram bucket deltas, so
    they describe the requests of the interval, not everything since the server started.

    running, waiting: requests now; kv_cache_usage_pct: 0..100 (the fullest engine);
    prompt_tokens_per_s, generation_tokens_per_s: counter increase / interval; ttft_p50_s, ttft_p95_s,
    itl_p50_s, itl_p95_s: seconds (None when nothing was observed); preemptions_total, and
    preemptions_in_interval; interval_s: b.time - a.time."""
    s = series
    kv = b.peak(s.kv_usage)
    out = {"running": _count(b.value(s.running)), "waiting": _count(b.value(s.waiting)),
           "kv_cache_usage_pct": None if kv is None else round(kv * 100, 3),
           "preemptions_total": _count(b.value(s.preemptions)), "interval_s": None,
           "prompt_tokens_per_s": None, "generation_tokens_per_s": None, "preemptions_in_interval": None,
           "ttft_p50_s": None, "ttft_p95_s": None, "itl_p50_s": None, "itl_p95_s": None}
    if a is None or b.time <= a.time:
        return out
    pa, pb = a.value(s.preemptions), b.value(s.preemptions)
    out.update(interval_s=round(b.time - a.time, 3),
               prompt_tokens_per_s=rate(a, b, s.prompt_tokens), generation_tokens_per_s=rate(a, b, s.generation_tokens),
               preemptions_in_interval=_count(pb - pa) if pa is not None and pb is not None and pb >= pa else None,
               ttft_p50_s=quantile(a, b, s.ttft, 0.5), ttft_p95_s=quantile(a, b, s.ttft, 0.95),
               itl_p50_s=quantile(a, b, s.itl, 0.5), itl_p95_s=quantile(a, b, s.itl, 0.95))
    return out


def _count(v):
    """A count as an int (Prometheus sends floats); None stays None."""
    return int(v) if v is not None and math.isfinite(v) and v == int(v) else v
