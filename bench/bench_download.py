"""Download throughput from the Hub stand-in (tests/hubstub.py: real HTTP on loopback, its LFS "CDN" on
127.0.0.2), the current `doit download` against a baseline measured in the same run: the download code as
it was before it moved to huggingface_hub's public API only, run from the tree of commit BASELINE checked
out into a temporary worktree (bench/baseline.py; it drove the private `http_get(..., _tqdm_bar=)`). Same
checkpoint, same stand-in, a fresh MODEL_DIR each run. Verification is left out of both (bench_checkpoint.py
measures it): the figure is bytes fetched / seconds.

The stand-in and the client share this machine's cores, so the absolute MB/s says more about the machine
than about a real uplink; the ratio is the point (target >= 0.9x: the public API costs no throughput).

Env: BENCH_DL_MB (default 300, the checkpoint's size), BENCH_RUNS (default 3, median), BENCH_DIR.
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import baseline

ROOT = baseline.ROOT
sys.path.insert(0, os.path.join(ROOT, "tests"))

from fixture_checkpoint import make_checkpoint  # noqa: E402
from hubstub import HubStub  # noqa: E402

# d150ddf (One progress display: tqdm on the head...): the parent of bc129ca, which moved the download to
# huggingface_hub's public API and wrote this benchmark against the module before it (the same file as
# at 9ecaf04, the commit the benchmark first named).
BASELINE = "d150ddf45a6ce02f5dde54dbda1dc77ba9330b92"

# Runs in a fresh interpreter (huggingface_hub reads HF_* at import) with the tree's lib/ on sys.path: what
# `doit download` calls, through the tree's own dodo.py (its config and download function), without the
# final verification; prints the seconds.
CHILD = r"""
import runpy, sys, time
dodo = runpy.run_path(sys.argv[1])
download, cfg = dodo["download"].download, dodo["CFG"]
if "verify" not in download.__globals__:
    sys.exit("bench_download: download() calls no verify(cfg) of its module any more: update CHILD to leave it out")
download.__globals__["verify"] = lambda cfg: None
t = time.perf_counter()
download(cfg)
print(time.perf_counter() - t)
"""


def fetch(hub, work, tree, run):
    """Seconds the download of tree (the current one or the baseline's) took into a fresh MODEL_DIR."""
    model = os.path.join(work, f"model-{run}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(HF_ENDPOINT=hub.endpoint, HF_HOME=os.path.join(work, "hf-home"), HF_HUB_DISABLE_TELEMETRY="1",
               MODEL_DIR=model, STATE_DIR=os.path.join(work, f"state-{run}"))
    r = subprocess.run([sys.executable, "-c", CHILD, os.path.join(tree, "dodo.py")], env=baseline.env(tree, env),
                       cwd=tree, capture_output=True, text=True)
    shutil.rmtree(model, ignore_errors=True)
    shutil.rmtree(env["STATE_DIR"], ignore_errors=True)
    if r.returncode:
        which = f"the baseline ({BASELINE[:12]})" if tree != ROOT else "the current download"
        raise SystemExit(f"bench_download: {which} failed: {' '.join(r.stderr.split())[-600:]}")
    return float(r.stdout.strip().splitlines()[-1])


def main():
    total_mb = float(os.environ.get("BENCH_DL_MB", "300"))
    runs = int(os.environ.get("BENCH_RUNS", "3"))
    work = tempfile.mkdtemp(prefix="dsv41-bench-dl-", dir=os.environ.get("BENCH_DIR"))
    try:
        with baseline.checkout(BASELINE) as old:
            src = os.path.join(work, "repo")
            make_checkpoint(src, shard_bytes=int(total_mb * 1e6 / 6), parts=4)
            with HubStub(src) as hub:
                nbytes = sum(f["size"] for f in hub.files.values())
                times = {"baseline": [], "current": []}
                for i in range(runs):                    # interleaved: drift hits both alike
                    times["baseline"].append(fetch(hub, work, old, f"b{i}"))
                    times["current"].append(fetch(hub, work, ROOT, f"c{i}"))
        print(f"download from the Hub stand-in, {len(hub.files)} files, {nbytes / 1e6:.0f} MB, fresh MODEL_DIR, "
              f"median of {runs}, {os.cpu_count()} cores shared with the stand-in:")
        cur = nbytes / statistics.median(times["current"]) / 1e6
        base = nbytes / statistics.median(times["baseline"]) / 1e6
        print(f"  baseline (private http_get, {BASELINE[:12]}): {base:.0f} MB/s; current (public API): {cur:.0f} MB/s")
        print(f"  current / baseline throughput {cur / base:.2f}x (target >= 0.9x)")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
