"""The vLLM recipe: one rank container per node under one systemd unit (dsv41-r<N>), workers started
before the head and stopped after it (vllm/argv.py: the container), ready when a token comes back,
observed by vLLM's /metrics series (named here and in the rule and dashboard fragments beside this
file, nowhere else), sized by its own settings (vllm/settings.py: the settings package reads them). Only the probes
(ready, scrape) reach the engine."""
import json
import re
from pathlib import Path

from dsv41 import names
from dsv41.client import metrics
from dsv41.head.core.recipe import Part, Recipe
from dsv41.vllm import startup
from dsv41.vllm.argv import RANK_TEMPLATE, rank_vars

HERE = Path(__file__).resolve().parent
# vLLM 0.32's names for what top, the watchdog and bench read (client/metrics.py says what each is)
SERIES = metrics.Series(
    running="vllm:num_requests_running", waiting="vllm:num_requests_waiting", kv_usage="vllm:kv_cache_usage_perc",
    prompt_tokens="vllm:prompt_tokens_total", generation_tokens="vllm:generation_tokens_total",
    preemptions="vllm:num_preemptions_total", ttft="vllm:time_to_first_token_seconds",
    itl="vllm:inter_token_latency_seconds")


class Vllm(Recipe):
    name = "vllm"
    series = SERIES
    work_metrics = (SERIES.running, SERIES.waiting)
    work_words = ("running", "waiting")
    # What moves while the engine works. Measured (docs/faults.md, "Hangs: what moves during a long prefill"):
    # vLLM records iteration stats only for steps with output, so while a long prompt is prefilled chunk by
    # chunk alone, the token totals and the step count (the _count of the tokens-per-step histogram) stand
    # still and only the KV-cache use grows, block by block; with output, the step count and the token
    # totals move at every step; the others move on admission, preemption and completion.
    progress_metrics = ("vllm:iteration_tokens_total_count", SERIES.prompt_tokens, SERIES.generation_tokens,
                        SERIES.kv_usage, SERIES.preemptions, "vllm:prefix_cache_queries_total",
                        "vllm:request_success_total")
    rules_template = HERE / "rules.yml.j2"
    plan_settings = ("KV_BYTES", "MAX_LEN", "MAX_SEQS", "NSPEC", "GPU_UTIL")
    memory_settings = "KV_BYTES or GPU_UTIL"

    def parts(self, spec):
        return (Part(names.rank_unit(spec.rank), names.rank_name(spec.rank)),)

    optional_flags = {"--shutdown-timeout": "a stopped rank 0 first finishes the requests in flight, for up to DRAIN_S"}

    def render(self, render, spec, fabric, paths, master_addr=None, server_flags=()):
        return {names.rank_unit(spec.rank): render(RANK_TEMPLATE, rank_vars(self.cfg, spec, fabric, paths, master_addr,
                                                                          server_flags))}

    def rendezvous(self, unit_text):
        """(--master-addr, --nnodes) of a rank unit: its group's first node and its size."""
        found = [re.search(rf"{flag}\s+(\S+)", unit_text or "") for flag in ("--master-addr", "--nnodes")]
        return tuple(m.group(1) for m in found) if all(found) else None

    def flag_probe(self, flag):
        """vLLM's help for one argument (`vllm serve --help=shutdown-timeout` lists it when it has it)."""
        command = self.cfg.engine_settings().engine_cmd
        return command[0], [*command[1:], f"--help={flag.lstrip('-')}"]

    def metrics_url(self):
        return metrics.metrics_url(self.cfg.engine_url)

    def scrape(self, timeout, key=None):
        return metrics.scrape(self.metrics_url(), timeout=timeout, key=key)

    def ready(self, client):
        """/v1/models answers with the key and one token is generated."""
        return client.generates(self.cfg.served_model_name)

    def context_len(self):
        return self.cfg.engine_value("MAX_LEN")

    def dashboard_panels(self):
        return json.loads((HERE / "panels.json").read_text())

    def startup(self, journal):
        """The last start-up's phases in rank 0's journal (vllm/startup.py reads vLLM 0.32's lines)."""
        return startup.startup(journal)

    def gpu_memory_wanted(self, total_bytes):
        """GPU_UTIL of the node's memory (unified on a Spark), and the setting that says so."""
        return self.cfg.engine_value("GPU_UTIL") * total_bytes, "GPU_UTIL"
