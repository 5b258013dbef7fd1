"""Which of vLLM's /metrics series move while one long prompt is prefilled in chunks, alone: sampled every
second. Run it on the head of a cluster serving the real engine with a small BATCH (--max-num-batched-tokens),
for example in the lab after `doit launch` with DSV41_PROFILE=lab-vllm BATCH=64:

    tests/lab/on head /opt/dsv41-venv/bin/python $PWD/bench/prefill_signals.py --words 3000

It prints one line per sample (seconds since the request was sent, running, prompt and generation token
totals, the step count, KV-cache use), then for every vllm series the number of one-second intervals in
which it moved while the prompt was being prefilled (the request running, no prompt token counted yet),
and the same as JSON on the last line. The prompt goes through the door (--url, with the client key); /metrics is
read from the engine itself (--metrics-url, rank 0 on 127.0.0.1:ENGINE_PORT: the door does not serve it).
Standard library only."""
import argparse
import json
import os
import re
import threading
import time
import urllib.request
import uuid

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
WORDS = ("river stone lantern orchard copper meadow signal harbor velvet thunder pepper canyon marble whisper "
         "falcon ember glacier saddle quartz willow").split()
SHOWN = ("vllm:num_requests_running", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
         "vllm:iteration_tokens_total_count", "vllm:kv_cache_usage_perc")


def scrape(url, raw=None):
    """{series name + labels: value} of the vllm:* samples (no buckets, no creation times); the whole
    text is appended to raw (a file) as a JSON line {"t": unix time, "text": ...}."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    if raw:
        raw.write(json.dumps({"t": time.time(), "text": text}) + "\n")
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and m.group(1).startswith("vllm:") and not m.group(1).endswith(("_bucket", "_created")):
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def total(sample, name):
    return sum(v for k, v in sample.items() if k == name or k.startswith(name + "{"))


def post(url, key, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json",
                                                                  "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=900) as r:
        return json.loads(r.read())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the door (PORT)")
    p.add_argument("--metrics-url", default="http://127.0.0.1:18000/metrics",
                   help="the engine's /metrics (127.0.0.1:ENGINE_PORT; with GATEWAY=0, PORT's)")
    p.add_argument("--key-file", default=os.path.expanduser("~/.dsv41-two-sparks/api_key"))
    p.add_argument("--words", type=int, default=3000, help="prompt length in words (unique, so no cache hit)")
    p.add_argument("--every", type=float, default=1.0)
    p.add_argument("--raw", help="also write every scrape's whole text here, one JSON line each")
    a = p.parse_args()
    raw = open(a.raw, "w") if a.raw else None
    key = open(a.key_file).read().strip()
    models = urllib.request.Request(a.url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(models, timeout=10) as r:
        model = json.loads(r.read())["data"][0]["id"]
    prompt = uuid.uuid4().hex + " " + " ".join(WORDS[(i * 7 + i // 20) % len(WORDS)] for i in range(a.words))
    done = {}

    def send():
        t = time.monotonic()
        done["answer"] = post(a.url + "/v1/completions", key, {"model": model, "prompt": prompt, "max_tokens": 1,
                                                               "temperature": 0})
        done["took_s"] = time.monotonic() - t
    samples = [(0.0, scrape(a.metrics_url, raw))]
    t0 = time.monotonic()
    worker = threading.Thread(target=send)
    worker.start()
    while worker.is_alive() or len(samples) < 3:
        time.sleep(max(0.0, a.every - (time.monotonic() - t0) % a.every))
        samples.append((time.monotonic() - t0, scrape(a.metrics_url, raw)))
        if not worker.is_alive() and "after" not in done:
            done["after"] = len(samples)
    worker.join()
    if raw:
        raw.close()
    base_prompt = total(samples[0][1], "vllm:prompt_tokens_total")
    print(f"{'t s':>6} " + " ".join(f"{n.split(':')[1][:24]:>24}" for n in SHOWN))
    for t, s in samples:
        print(f"{t:6.1f} " + " ".join(f"{total(s, n):24g}" for n in SHOWN))
    prefill = [i for i, (_, s) in enumerate(samples) if i and total(s, "vllm:num_requests_running") >= 1
               and total(s, "vllm:prompt_tokens_total") == base_prompt]
    moved, inside = {}, [i for i in prefill if i - 1 in prefill]   # intervals wholly inside the prefill
    for i in inside:
        before, now = samples[i - 1][1], samples[i][1]
        for k in set(before) | set(now):
            if before.get(k) != now.get(k):
                moved[k] = moved.get(k, 0) + 1
    usage = done["answer"]["usage"]
    print(f"prompt {usage['prompt_tokens']} tokens, answered in {done['took_s']:.1f} s; {len(prefill)} samples "
          f"during the prefill (running, no prompt token counted); the series that moved in the {len(inside)} "
          f"intervals between them:")
    for k, n in sorted(moved.items(), key=lambda kv: -kv[1]):
        print(f"  {n:4d}/{len(inside)}  {k}")
    print(json.dumps({"prompt_tokens": usage["prompt_tokens"], "took_s": round(done["took_s"], 1),
                      "prefill_samples": len(prefill), "intervals": len(inside), "moved": moved,
                      "series": {n: [total(s, n) for _, s in samples] for n in SHOWN},
                      "times": [round(t, 1) for t, _ in samples]}))


if __name__ == "__main__":
    main()
