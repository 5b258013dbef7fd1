"""vLLM's Prometheus /metrics, read with prometheus_client's parser: one Snapshot per scrape; rates
from counter deltas and percentiles from histogram bucket deltas between two snapshots (what happened
in the interval, not since the server started)."""
import math
import time
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREEMPTIONS = "vllm:num_preemptions_total"
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"


@dataclass
class Snapshot:
    time: float
    samples: dict = field(default_factory=dict)      # sample name -> {labels (sorted tuple): value}

    def value(self, name, default=None):
        """A sample summed over its label sets (engines, models); default when absent."""
        series = self.samples.get(name)
        return sum(series.values()) if series else default

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
