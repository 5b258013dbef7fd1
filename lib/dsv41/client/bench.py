"""Benchmark a running OpenAI-compatible API: prefill, decode at several concurrencies, long context.

Metrics follow `vllm bench serve`: TTFT (POST to first token), TPOT ((E2EL - TTFT) / (tokens - 1)),
ITL (gaps between token messages, pooled), E2EL (POST to last choices message), in ms.
No request carries an output cap; a prefill request is closed after its first token, and a request
still running after --request-timeout-s is cut (finish reason "timeout"); the whole run ends within
--deadline-s (default 4 h), its results so far kept. Exit 0, 2 for bad input, 3 when the server cannot
be used (one line on stderr each). Sizes that cannot fit the
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
import json
import random
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

from dsv41.client.api import (ApiError, Client, RunDeadline, ServerFault, TimedOut, check_request_timeout,
                              load_key)
from dsv41.client.bench_prompts import CHARS_PER_TOKEN, PROMPTS, TOKENS_PER_WORD, Tokens, ctx_prompt, random_prompt
from dsv41.client.bench_report import chart, finish_counts, finish_text, markdown
from dsv41.errors import UserError, cli, one_line
from dsv41.files import write_atomic

SCHEMA = "dsv41.bench/1"
DEADLINE_S = 4 * 3600     # the whole run's (--deadline-s)
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
        if s.timed_out and self.client.past_deadline:
            return RunDeadline(f"the run's deadline of {self.a.deadline_s:g} s passed (--deadline-s)")
        if s.timed_out:
            return TimedOut(f"no token within {self.a.request_timeout_s:g} s: the server is stuck or slower "
                            "than that; raise --request-timeout-s")
        return ServerFault(f"the stream ended without a token (finish {s.finish_reason or 'none'}, "
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
        pt = (s.usage or {}).get("prompt_tokens")
        pt = pt if isinstance(pt, int) and pt > 0 else counted or round(len(prompt) / CHARS_PER_TOKEN)
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
                stopped = UserError(f"bench stopped at {name}: {err} (results so far in {self.a.out})")
                stopped.exit_code = err.exit_code           # a server fault stays one
                raise stopped from None
            self.save()


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
    p.add_argument("--deadline-s", type=float, default=DEADLINE_S, metavar="S",
                   help=f"end the whole run within S seconds, results so far kept (default {DEADLINE_S})")
    p.add_argument("--chart", action="store_true", help="also write a PNG and an SVG chart beside --out")
    a = p.parse_args(args_list)
    if any(n < 1 for n in a.prefill + a.conc + a.ctx) or a.reps < 1 or a.dec_reps < 1:
        raise UserError("--prefill, --conc, --ctx, --reps and --dec-reps take positive numbers")
    check_request_timeout(a.request_timeout_s, a.deadline_s)
    out = Path(a.out)
    if not out.parent.is_dir():
        raise UserError(f"--out {a.out}: directory {out.parent} does not exist")
    return a


def run_bench(args_list):
    """The bench command; returns the exit code: 0, 2 (one line on stderr) for bad input, 3 when the
    server cannot be used (not reachable, no answer in time, not an OpenAI-compatible answer)."""
    a = None
    try:
        try:
            a = parse(args_list)
        except SystemExit as done:  # argparse: --help or a usage error, already printed
            return done.code or 0
        client = Client(a.url, load_key(a.key_file), read_timeout=a.request_timeout_s, deadline_s=a.deadline_s)
        entry = client.served_model(a.model)
        max_len = entry.get("max_model_len")
        max_len = max_len if isinstance(max_len, int) and max_len > 0 else None
        log(f"bench: model {entry['id']} at {client.base}, "
            + (f"max_model_len {max_len}" if max_len else "no max_model_len in /v1/models"))
        Bench(a, client, entry["id"], max_len).run()
    except UserError as err:
        print(f"dsv41: {one_line(err, 2000)}", file=sys.stderr)
        return err.exit_code
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
