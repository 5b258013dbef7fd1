"""Benchmark a running OpenAI-compatible API: prefill, decode at several concurrencies, long context.

Metrics follow `vllm bench serve`: TTFT (POST to first token), TPOT ((E2EL - TTFT) / (tokens - 1)),
ITL (gaps between token messages, pooled), E2EL (POST to last choices message), in ms.
No request carries an output cap; a prefill request is closed after its first token, and a request
still running after --request-timeout-s is cut (finish reason "timeout"). Sizes that cannot fit the
model's max_model_len (from /v1/models, where the server gives it) are skipped. --chart draws the
figures with matplotlib into a PNG and an SVG beside the JSON.

The JSON file (schema "dsv41.bench/1"): schema, label, model, url, ts, definitions, request_timeout_s,
max_model_len (null when /v1/models gives none), prefill_endpoint, skipped [{step, reason}],
prefill [{tokens, prompt_tokens, median_tok_s, ttft_ms, runs [{prompt_tokens, prompt_tokens_from,
ttft_ms, tok_s}]}], decode [{kind, concurrency, per_stream_tok_s_median, aggregate_tok_s,
output_tokens, wall_s, finish {reason: count}, ttft_ms, tpot_ms, itl_ms, e2el_ms, requests [{...,
finish_reason}]}], ctx [{tokens, prompt_tokens, ttft_ms, prefill_tok_s, output_tokens, decode_tok_s,
e2el_ms, finish_reason, recall, answer_tail}], and error when a step stopped the run. Each *_ms
statistic of a step is {mean, median, std, p99}; finish reasons are the server's ("stop", "length"),
"timeout" (cut at the deadline) or "none" (the stream ended without one)."""
import argparse
import ast
import collections
import functools
import io
import json
import random
import statistics
import sys
import sysconfig
import threading
import time
import uuid
from pathlib import Path


from dsv41.client.api import ApiError, Client, TimedOut, check_request_timeout, load_key
from dsv41.errors import UserError, cli, one_line
from dsv41.files import write_atomic

SCHEMA = "dsv41.bench/1"

# Published two-Spark figures (mission.md, "Reported results").
PUBLISHED = {
    ("prefill", 8192): 2050, ("prefill", 32768): 2061,
    ("code", 1, "per_stream"): 40, ("code", 2, "aggregate"): 60, ("prose", 1, "per_stream"): 29,
}
WORDS = ("time year people way day man thing woman life child world school state family student group "
         "country problem hand part place case week company system program question work government number "
         "night point home water room mother area money story fact month lot right study book eye job word "
         "business issue side kind head house service friend father power hour game line end member law car "
         "city community name president team minute idea kid body information back parent face others level "
         "office door health person art war history party result change morning reason research girl guy "
         "moment air teacher force education river stone garden bridge window paper light green quiet").split()
PROMPTS = {
    "prose": ["Write a story of about 400 words about a lighthouse keeper who finds a message in a bottle.",
              "Write an essay of about 400 words on why cities grow near rivers.",
              "Write a story of about 400 words about a train that runs one hour late every day.",
              "Describe, in about 400 words, a walk through a market at dawn."],
    "code": ["Write a Python module with an LRU cache class (get, put, capacity) and pytest tests for it.",
             "Write a Python function that parses an INI file into nested dicts, with docstrings and tests.",
             "Write a Python command-line tool that counts word frequencies in files, with argparse.",
             "Write a Python class implementing a binary heap priority queue, with unit tests."],
    # a quick check of the decode path: short natural answers
    "short": ["In one sentence, what is a lighthouse?", "In one sentence, why is the sky blue?",
              "In one sentence, what does a compiler do?", "In one sentence, what is a river delta?"],
}
CHARS_PER_TOKEN = 4.0
TOKENS_PER_WORD = 1.3
ROOM = 256  # tokens a size must leave free in max_model_len (chat template, the answer), plus 2%


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def stats_ms(values):
    """mean, median, std, p99 (linear interpolation like numpy) of seconds, in ms."""
    v = sorted(x * 1000 for x in values if x is not None)
    if not v:
        return {"mean": None, "median": None, "std": None, "p99": None}
    k = (len(v) - 1) * 0.99
    lo = int(k)
    p99 = v[lo] + (v[min(lo + 1, len(v) - 1)] - v[lo]) * (k - lo)
    return {"mean": round(statistics.fmean(v), 3), "median": round(statistics.median(v), 3),
            "std": round(statistics.pstdev(v), 3), "p99": round(p99, 3)}


class Tokens:
    """Prompt token counting: the server's tokenize endpoint when there is one, else an estimate."""

    def __init__(self, client, model):
        self.client, self.model, self.how = client, model, None

    def count(self, text):
        tries = [("/tokenize", {"model": self.model, "prompt": text}, "count"),  # vLLM
                 ("/extras/tokenize/count", {"input": text}, "count")]  # llama-cpp-python
        if self.how is False:
            return None
        for path, body, key in tries:
            if self.how not in (None, path):
                continue
            try:          # within the client's deadline (--request-timeout-s), as every call
                r = self.client.post_json(path, body, root=True)
                if isinstance(r.get(key), int):
                    self.how = path
                    return r[key]
            except TimedOut:
                raise UserError(f"{path} got no answer within {self.client.read_timeout:g} s "
                                "(--request-timeout-s): the server is stuck or slower than that") from None
            except UserError:  # no usable tokenize endpoint
                pass
        self.how = False
        return None


def random_prompt(tokens, target, rng):
    """Unique random-word text of about `target` tokens (fitted to the server's tokenizer if any)."""
    head = f"{uuid.uuid4().hex} "  # unique first tokens defeat prefix caches
    words = max(1, round(target / TOKENS_PER_WORD))
    for _ in range(3):
        prompt = head + " ".join(rng.choice(WORDS) for _ in range(words))
        n = tokens.count(prompt)
        if not n or abs(n - target) <= max(2, target * 0.02):
            break
        words = max(1, round(words * target / n))
    return prompt


@functools.lru_cache(maxsize=4)
def real_text(chars):
    """Real prose that ships on the machine: licence texts, then standard-library docstrings."""
    out, total, seen = [], 0, set()
    lic = Path("/usr/share/common-licenses")
    files = sorted(lic.iterdir()) if lic.is_dir() else []
    for f in files:
        real = f.resolve()
        if real in seen or not real.is_file():
            continue
        seen.add(real)
        out.append(real.read_text(errors="replace"))
        total += len(out[-1])
        if total >= chars:
            return "\n\n".join(out)[:chars]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for f in sorted(stdlib.rglob("*.py")):
        if "test" in f.parts or "site-packages" in f.parts:
            continue
        try:
            tree = ast.parse(f.read_text(errors="replace"))
        except (SyntaxError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 200:
                    out.append(doc)
                    total += len(doc)
        if total >= chars:
            break
    text = "\n\n".join(out)
    if len(text) < chars:
        raise UserError(f"not enough local text for a {chars}-character context: lower --ctx")
    return text[:chars]


def ctx_prompt(tokens, target, rng):
    """Real text of about `target` tokens with a code hidden in the middle, and a question about it."""
    code = str(rng.randint(100000, 999999))
    question = "\n\nWhat is the vault code stated in the text above? Reply with the number."
    chars = int(target * CHARS_PER_TOKEN)
    for _ in range(3):  # fit to the server's tokenizer when it has a tokenize endpoint
        text = real_text(chars)
        mid = len(text) // 2
        prompt = (f"{uuid.uuid4().hex}\n" + text[:mid] + f"\n\nThe vault code is {code}.\n\n" + text[mid:]
                  + question)
        n = tokens.count(prompt)
        if not n or abs(n - target) <= max(16, target * 0.01):
            break
        chars = int(chars * target / n)
    return prompt, code, n


def finish_counts(reasons):
    """{"stop": 3, "timeout": 1} from the finish reasons of a step's answers (None counts as "none")."""
    return dict(collections.Counter(r or "none" for r in reasons))


def finish_text(counts):
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) if counts else "-"


class Bench:
    def __init__(self, a, client, model, max_len=None):
        self.a, self.client, self.model, self.max_len = a, client, model, max_len
        self.tokens = Tokens(client, model)
        self.rng = random.Random()
        self.prefill_path = "/completions"
        self.result = {"schema": SCHEMA, "label": a.label or client.base, "model": model, "url": client.base,
                       "ts": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "definitions": "vllm bench serve: TTFT, TPOT=(E2EL-TTFT)/(tokens-1), ITL pooled, E2EL; ms",
                       "request_timeout_s": a.request_timeout_s, "max_model_len": max_len,
                       "prefill_endpoint": "/completions", "skipped": [], "prefill": [], "decode": [], "ctx": []}

    def stream(self, path, body, stop_after_first=False):
        return self.client.stream(path, body, stop_after_first=stop_after_first, deadline_s=self.a.request_timeout_s)

    def no_token(self, s):
        """The error for a stream that brought no token at all (run() names the step)."""
        if s.timed_out:
            return UserError(f"no token within {self.a.request_timeout_s:g} s: the server is stuck or slower "
                             "than that; raise --request-timeout-s")
        return UserError(f"the stream ended without a token (finish {s.finish_reason or 'none'}, "
                         f"{s.messages} messages): a prompt longer than the server's context?")

    def fits(self, n):
        return self.max_len is None or n + n // 50 + ROOM <= self.max_len

    def sampling(self):
        return {"temperature": 0} if self.a.greedy else {}

    def save(self):
        out = Path(self.a.out)
        write_atomic(out, json.dumps(self.result, indent=1) + "\n")
        write_atomic(out.with_suffix(".md"), markdown(self.result))
        if self.a.chart:
            for suffix, data in chart(self.result).items():
                write_atomic(out.with_suffix(suffix), data)

    def first_token(self, prompt):
        """Stream `prompt` and close the stream at its first token (no output cap is sent).
        Uses /v1/completions, or a chat message on servers without it."""
        opts = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}, **self.sampling()}
        if self.prefill_path == "/completions":
            try:
                return self.stream("/completions", {"model": self.model, "prompt": prompt, **opts},
                                   stop_after_first=True)
            except ApiError as err:
                if err.status not in (404, 405):
                    raise
                self.prefill_path = self.result["prefill_endpoint"] = "/chat/completions"
                log("prefill: the server has no /v1/completions; using /v1/chat/completions")
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}], **opts}
        return self.stream("/chat/completions", body, stop_after_first=True)

    def prefill(self, n):
        runs = []
        for rep in range(self.a.reps):
            prompt = random_prompt(self.tokens, n, self.rng)
            s = self.first_token(prompt)
            if s.ttft is None:
                raise self.no_token(s)
            pt = (s.usage or {}).get("prompt_tokens")
            src = "usage"
            if not isinstance(pt, int) or pt <= 0:
                pt, src = self.tokens.count(prompt), "tokenize"
            if not pt:
                pt, src = round(len(prompt.split()) * TOKENS_PER_WORD), "estimate"
            runs.append({"prompt_tokens": pt, "prompt_tokens_from": src, "ttft_ms": round(s.ttft * 1000, 3),
                         "tok_s": round(pt / s.ttft, 2)})
            log(f"prefill {n}: run {rep + 1}/{self.a.reps}: {pt} tokens ({src}), TTFT {s.ttft * 1000:.0f} ms, "
                f"{pt / s.ttft:.1f} tok/s")
        self.result["prefill"].append({
            "tokens": n, "prompt_tokens": int(statistics.median(r["prompt_tokens"] for r in runs)),
            "median_tok_s": round(statistics.median(r["tok_s"] for r in runs), 2),
            "ttft_ms": stats_ms([r["ttft_ms"] / 1000 for r in runs]), "runs": runs})

    def decode(self, kind, conc):
        reqs, walls, total_tokens = [], [], 0
        for rep in range(self.a.dec_reps):
            streams, errors = [None] * conc, []
            barrier = threading.Barrier(conc)

            def one(i):
                prompt = PROMPTS[kind][i % len(PROMPTS[kind])]
                body = {"model": self.model, **self.sampling(),
                        "messages": [{"role": "user", "content": f"(request {uuid.uuid4().hex[:8]}) {prompt}"}]}
                try:
                    barrier.wait()
                    streams[i] = self.stream("/chat/completions", body)
                except Exception as err:  # reported once all threads are back
                    errors.append(err)
                    barrier.abort()

            threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(conc)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
            if real:
                err = real[0]
                raise err if isinstance(err, UserError) else UserError(f"decode {kind} c{conc}: {one_line(err)}")
            bad = [s for s in streams if s.t_first is None]
            if bad:
                raise self.no_token(bad[0])
            wall = max(s.t_last for s in streams) - min(s.t_start for s in streams)
            toks = sum(s.output_tokens for s in streams)
            walls.append(wall)
            total_tokens += toks
            for s in streams:
                reqs.append({
                    "output_tokens": s.output_tokens, "tokens_from": s.tokens_from,
                    "prompt_tokens": (s.usage or {}).get("prompt_tokens"),
                    "ttft_ms": round(s.ttft * 1000, 3), "e2el_ms": round(s.e2el * 1000, 3),
                    "tpot_ms": None if s.tpot is None else round(s.tpot * 1000, 3),
                    "tok_s": None if not s.tpot else round(1 / s.tpot, 2),
                    "finish_reason": s.finish_reason, "ended_by_done": s.done,
                    "reasoning_chars": len(s.reasoning), "text_tail": s.text[-80:], "_itl": s.itls})
            log(f"decode {kind} c{conc}: round {rep + 1}/{self.a.dec_reps}: {toks} tokens in {wall:.2f} s "
                f"= {toks / wall:.1f} tok/s aggregate; per stream "
                + ", ".join(f"{1 / s.tpot:.1f}" if s.tpot else "-" for s in streams)
                + f"; finish {finish_text(finish_counts(s.finish_reason for s in streams))}"
                + self.cut_note(streams))
        itl = [x for r in reqs for x in r.pop("_itl")]
        per_stream = [r["tok_s"] for r in reqs if r["tok_s"]]
        self.result["decode"].append({
            "kind": kind, "concurrency": conc,
            "per_stream_tok_s_median": round(statistics.median(per_stream), 2) if per_stream else None,
            "aggregate_tok_s": round(total_tokens / sum(walls), 2),
            "output_tokens": total_tokens, "wall_s": round(sum(walls), 3),
            "finish": finish_counts(r["finish_reason"] for r in reqs),
            "ttft_ms": stats_ms([r["ttft_ms"] / 1000 for r in reqs]),
            "tpot_ms": stats_ms([r["tpot_ms"] / 1000 for r in reqs if r["tpot_ms"] is not None]),
            "itl_ms": stats_ms(itl), "e2el_ms": stats_ms([r["e2el_ms"] / 1000 for r in reqs]),
            "requests": reqs})

    def ctx(self, n):
        prompt, code, counted = ctx_prompt(self.tokens, n, self.rng)
        body = {"model": self.model, **self.sampling(), "messages": [{"role": "user", "content": prompt}]}
        s = self.stream("/chat/completions", body)
        if s.ttft is None:
            raise self.no_token(s)
        pt = (s.usage or {}).get("prompt_tokens") or counted or round(len(prompt) / CHARS_PER_TOKEN)
        entry = {"tokens": n, "prompt_tokens": pt, "ttft_ms": round(s.ttft * 1000, 3),
                 "prefill_tok_s": round(pt / s.ttft, 2), "output_tokens": s.output_tokens,
                 "decode_tok_s": None if not s.tpot else round(1 / s.tpot, 2),
                 "e2el_ms": round(s.e2el * 1000, 3), "finish_reason": s.finish_reason or "none",
                 "recall": code in s.text, "answer_tail": s.text[-120:]}
        self.result["ctx"].append(entry)
        log(f"ctx {n}: {pt} prompt tokens, TTFT {s.ttft:.2f} s ({entry['prefill_tok_s']} tok/s), "
            f"{s.output_tokens} tokens, finish {entry['finish_reason']}, recall {'yes' if entry['recall'] else 'no'}"
            + self.cut_note([s]))

    def cut_note(self, streams):
        cut = sum(s.timed_out for s in streams)
        return f" ({cut} cut at the {self.a.request_timeout_s:g} s --request-timeout-s deadline)" if cut else ""

    def sized(self, kind, fn, sizes):
        """The steps of one prompt-size kind that fit max_model_len; the others recorded as skipped."""
        steps = []
        for n in sizes:
            if self.fits(n):
                steps.append((f"{kind} {n}", fn, (n,)))
            else:
                why = (f"{n} tokens with room for an answer do not fit the model's max_model_len of "
                       f"{self.max_len} (from /v1/models)")
                self.result["skipped"].append({"step": f"{kind} {n}", "reason": why})
                log(f"{kind} {n}: skipped: {why}")
        return steps

    def run(self):
        steps = self.sized("prefill", self.prefill, self.a.prefill)
        steps += [(f"decode {k} c{c}", self.decode, (k, c)) for k in self.a.kinds for c in self.a.conc]
        steps += self.sized("ctx", self.ctx, self.a.ctx)
        self.save()
        for i, (name, fn, args) in enumerate(steps, 1):
            log(f"[{i}/{len(steps)}] {name}")
            try:
                fn(*args)
            except UserError as err:
                self.result["error"] = f"{name}: {err}"
                self.save()
                raise UserError(f"bench stopped at {name}: {err} (results so far in {self.a.out})") from None
            self.save()


def _f(x, nd=1):
    return "-" if x is None else f"{x:,.{nd}f}"


def fmt_rate(x):
    """A tok/s figure as the chart prints it on its bar."""
    return f"{x:,.0f}" if x >= 100 or x == int(x) else f"{x:.1f}"


def comparison_rows(result):
    """(step, measured tok/s, published tok/s or None, finish counts or None) for every measured figure."""
    rows = []
    for p in result["prefill"]:
        rows.append((f"prefill {p['tokens']} (actual {p['prompt_tokens']})", p["median_tok_s"],
                     PUBLISHED.get(("prefill", p["tokens"])), None))
    for d in result["decode"]:
        k, c = d["kind"], d["concurrency"]
        rows.append((f"decode {k} c{c} per stream", d["per_stream_tok_s_median"], PUBLISHED.get((k, c, "per_stream")),
                     d["finish"]))
        rows.append((f"decode {k} c{c} aggregate", d["aggregate_tok_s"], PUBLISHED.get((k, c, "aggregate")),
                     d["finish"]))
    for x in result["ctx"]:
        rows.append((f"ctx {x['tokens']} prefill", x["prefill_tok_s"], None, {x["finish_reason"]: 1}))
    return rows


def markdown(result):
    timeout = result["request_timeout_s"]
    lines = [f"# Benchmark: {result['label']}", "",
             f"Model `{result['model']}` at {result['url']}, {result['ts']}. Metric definitions: "
             "`vllm bench serve` (TPOT = (E2EL - TTFT) / (tokens - 1); per-stream tok/s = 1 / TPOT). "
             f"A request still running after {timeout:g} s is cut (`--request-timeout-s`)"
             + (f"; max_model_len {result['max_model_len']}." if result["max_model_len"] else "."), ""]
    if result.get("error"):
        lines += [f"**Stopped early:** {result['error']}", ""]
    for skip in result["skipped"]:
        lines += [f"**Skipped** {skip['step']}: {skip['reason']}.", ""]
    cut = [f"decode {d['kind']} c{d['concurrency']} ({d['finish']['timeout']} of {len(d['requests'])} requests)"
           for d in result["decode"] if d["finish"].get("timeout")]
    cut += [f"ctx {x['tokens']}" for x in result["ctx"] if x["finish_reason"] == "timeout"]
    if cut:
        lines += [f"**Cut at the {timeout:g} s deadline** (finish timeout; their figures cover the tokens "
                  f"that came before it): {', '.join(cut)}.", ""]
    lines += ["| step | tok/s | two-Spark published | ratio | finish |", "| --- | ---: | ---: | ---: | --- |"]
    for name, got, pub, finish in comparison_rows(result):
        ratio = f"{got / pub:.2f}" if (got and pub) else "-"
        lines.append(f"| {name} | {_f(got)} | {_f(pub, 0) if pub else '-'} | {ratio} | "
                     f"{finish_text(finish) if finish else '-'} |")
    lines += ["", "finish: how the answers ended (stop: the model ended it; length: the server's limit; timeout: "
              "cut at the deadline). Prefill requests are closed at their first token."]
    if result["prefill"]:
        lines += ["", "| prefill tokens | actual | median tok/s | TTFT median ms | TTFT p99 ms |",
                  "| ---: | ---: | ---: | ---: | ---: |"]
        for p in result["prefill"]:
            lines.append(f"| {p['tokens']} | {p['prompt_tokens']} | {_f(p['median_tok_s'])} | "
                         f"{_f(p['ttft_ms']['median'])} | {_f(p['ttft_ms']['p99'])} |")
    if result["decode"]:
        lines += ["", "| kind | conc | per-stream tok/s | aggregate tok/s | TTFT mean/median/p99 ms | "
                  "TPOT mean/median/p99 ms | ITL mean/median/p99 ms | E2EL median ms |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for d in result["decode"]:
            trio = lambda s: f"{_f(s['mean'])} / {_f(s['median'])} / {_f(s['p99'])}"  # noqa: E731
            lines.append(f"| {d['kind']} | {d['concurrency']} | {_f(d['per_stream_tok_s_median'])} | "
                         f"{_f(d['aggregate_tok_s'])} | {trio(d['ttft_ms'])} | {trio(d['tpot_ms'])} | "
                         f"{trio(d['itl_ms'])} | {_f(d['e2el_ms']['median'])} |")
    if result["ctx"]:
        lines += ["", "| context | actual | TTFT ms | prefill tok/s | decode tok/s | finish | recall |",
                  "| ---: | ---: | ---: | ---: | ---: | --- | --- |"]
        for x in result["ctx"]:
            lines.append(f"| {x['tokens']} | {x['prompt_tokens']} | {_f(x['ttft_ms'])} | {_f(x['prefill_tok_s'])} | "
                         f"{_f(x['decode_tok_s'])} | {x['finish_reason']} | {'yes' if x['recall'] else 'no'} |")
    return "\n".join(lines) + "\n"


MEASURED, PUBLISHED_COLOUR = "#2b6cb0", "#a0aec0"


def chart_panels(result):
    """(title, x label, y label, categories, [(series name, values, colour)]) per chart panel with data."""
    panels = []
    pre = result["prefill"]
    if pre:
        panels.append(("Prefill by prompt length", "prompt length (tokens)", "prefill tok/s",
                       [f"{p['tokens']:,}" for p in pre],
                       [("measured", [p["median_tok_s"] for p in pre], MEASURED),
                        ("two-Spark published", [PUBLISHED.get(("prefill", p["tokens"])) for p in pre],
                         PUBLISHED_COLOUR)]))
    dec = result["decode"]
    for what, key, ylabel in (("per_stream", "per_stream_tok_s_median", "decode tok/s per stream"),
                              ("aggregate", "aggregate_tok_s", "aggregate decode tok/s")):
        if dec:
            panels.append((f"Decode {'per stream' if what == 'per_stream' else 'aggregate'} by concurrency",
                           "concurrent streams (prompt kind)", ylabel,
                           [f"{d['concurrency']}\n{d['kind']}" for d in dec],
                           [("measured", [d[key] for d in dec], MEASURED),
                            ("two-Spark published", [PUBLISHED.get((d["kind"], d["concurrency"], what)) for d in dec],
                             PUBLISHED_COLOUR)]))
    if result["ctx"]:
        panels.append(("Long-context prefill", "context length (tokens)", "prefill tok/s",
                       [f"{x['tokens']:,}" for x in result["ctx"]],
                       [("measured", [x["prefill_tok_s"] for x in result["ctx"]], MEASURED)]))
    return panels


def chart(result):
    """{".png": bytes, ".svg": bytes}: one bar panel per kind of step, the measured tok/s beside the
    published two-Spark figure, values on the bars. matplotlib is imported here, only when charting."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.ticker import StrMethodFormatter

    panels = chart_panels(result)
    fig = Figure(figsize=(10, 1.4 + 3.1 * max(1, len(panels))), layout="constrained")
    fig.suptitle(f"dsv41 bench: {result['label']}\nmodel {result['model']}, {result['ts']}", fontsize=11)
    if not panels:
        ax = fig.add_subplot()
        ax.axis("off")
        ax.text(0.5, 0.5, "no step measured yet", ha="center", va="center")
    width = 0.38
    for i, (title, xlabel, ylabel, cats, series) in enumerate(panels):
        ax = fig.add_subplot(len(panels), 1, i + 1)
        shown = [sr for sr in series if any(v is not None for v in sr[1])]
        for j, (name, values, colour) in enumerate(shown):
            offset = 0 if len(shown) == 1 else (j - 0.5) * width
            xs = [k + offset for k, v in enumerate(values) if v is not None]
            vs = [v for v in values if v is not None]
            bars = ax.bar(xs, vs, width * 0.95, label=name, color=colour)
            ax.bar_label(bars, labels=[fmt_rate(v) for v in vs], padding=2, fontsize=8)
        pad = max(0, 3 - len(cats)) / 2  # one or two groups stay narrow, centred
        ax.set_xticks(range(len(cats)), cats)
        ax.set_xlim(-0.5 - pad, len(cats) - 0.5 + pad)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
        ax.margins(y=0.15)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    handles = {h.get_label(): h for ax in fig.axes for h in ax.get_legend_handles_labels()[0]}
    if handles:
        fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncols=len(handles), frameon=False)
    out = {}
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dsv41"}):
        for suffix, fmt in ((".png", "png"), (".svg", "svg")):
            buf = io.BytesIO()
            fig.savefig(buf, format=fmt, dpi=110, metadata={"Date": None} if fmt == "svg" else None)
            out[suffix] = buf.getvalue()
    return out


def parse(args_list):
    p = argparse.ArgumentParser(prog="python -m dsv41.client.bench", description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000/v1", help="API base URL, with or without /v1")
    p.add_argument("--out", required=True, help="results JSON (a .md table and --chart .png/.svg go beside it)")
    p.add_argument("--label", help="name of this run in the results")
    p.add_argument("--model", help="model name (default: the first id from /v1/models)")
    p.add_argument("--key-file", help="API key file when DSV41_API_KEY is unset")
    p.add_argument("--prefill", type=int, nargs="*", default=[8192, 32768], metavar="N")
    p.add_argument("--conc", type=int, nargs="*", default=[1, 2, 4], metavar="C")
    p.add_argument("--kinds", nargs="*", default=["prose", "code"], choices=sorted(PROMPTS))
    p.add_argument("--ctx", type=int, nargs="*", default=[], metavar="N", help="long-context prompt sizes")
    p.add_argument("--reps", type=int, default=3, help="prefill runs per size")
    p.add_argument("--dec-reps", type=int, default=1, help="decode rounds per concurrency")
    p.add_argument("--greedy", action="store_true", help="temperature 0")
    p.add_argument("--request-timeout-s", type=float, default=600.0, metavar="S",
                   help="cut any request still running after S seconds (default 600; no output cap is sent)")
    p.add_argument("--chart", action="store_true", help="also write a PNG and an SVG chart beside --out")
    a = p.parse_args(args_list)
    if any(n < 1 for n in a.prefill + a.conc + a.ctx) or a.reps < 1 or a.dec_reps < 1:
        raise UserError("--prefill, --conc, --ctx, --reps and --dec-reps take positive numbers")
    check_request_timeout(a.request_timeout_s)
    out = Path(a.out)
    if not out.parent.is_dir():
        raise UserError(f"--out {a.out}: directory {out.parent} does not exist")
    return a


def run_bench(args_list):
    """The bench command; returns the exit code (2 with one line on stderr for a user error)."""
    a = None
    try:
        try:
            a = parse(args_list)
        except SystemExit as done:  # argparse: --help or a usage error, already printed
            return done.code or 0
        client = Client(a.url, load_key(a.key_file), read_timeout=a.request_timeout_s)
        entry = client.served_model(a.model)
        max_len = entry.get("max_model_len")
        max_len = max_len if isinstance(max_len, int) and max_len > 0 else None
        log(f"bench: model {entry['id']} at {client.base}, "
            + (f"max_model_len {max_len}" if max_len else "no max_model_len in /v1/models"))
        Bench(a, client, entry["id"], max_len).run()
    except UserError as err:
        print(f"dsv41: {one_line(err, 2000)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dsv41: interrupted{f' (results so far in {a.out})' if a else ''}", file=sys.stderr)
        return 130
    also = [Path(a.out).with_suffix(x) for x in (".md", ".png", ".svg") if x == ".md" or a.chart]
    log(f"bench: wrote {a.out}, " + ", ".join(map(str, also)))
    return 0


@cli
def main():
    sys.exit(run_bench(sys.argv[1:]))


if __name__ == "__main__":
    main()
