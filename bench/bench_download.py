"""Download throughput from the Hub stand-in (tests/hubstub.py: real HTTP on loopback, its LFS "CDN" on
127.0.0.2), the current `doit download` against a baseline measured in the same run: the download module
as it was before it moved to huggingface_hub's public API only (commit BASELINE, read with `git show`; it
drove the private `http_get(..., _tqdm_bar=)`). Same checkpoint, same stand-in, a fresh MODEL_DIR each run.
Verification is left out of both (bench_checkpoint.py measures it): the figure is bytes fetched / seconds.

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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(ROOT, "lib"), os.path.join(ROOT, "tests")]

from fixture_checkpoint import make_checkpoint  # noqa: E402
from hubstub import HubStub  # noqa: E402

BASELINE = "9ecaf04"        # the last commit with the private-API download module

# Runs in a fresh interpreter (huggingface_hub reads HF_* at import): load the module, leave out the final
# verification, time download(cfg), print the seconds.
CHILD = r"""
import importlib.util, sys, time
sys.path.insert(0, sys.argv[2])
path = sys.argv[1]
if path == "-":
    from dsv41.head import download as mod
else:
    spec = importlib.util.spec_from_file_location("baseline_download", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
mod.verify = lambda cfg: None
from dsv41.settings.layers import load_config
cfg = load_config()
t = time.perf_counter()
mod.download(cfg)
print(time.perf_counter() - t)
"""


def baseline_module(work):
    path = os.path.join(work, "baseline_download.py")
    r = subprocess.run(["git", "-C", ROOT, "show", f"{BASELINE}:lib/dsv41/head/download.py"],
                       capture_output=True, text=True)
    if r.returncode:
        return None, f"git show {BASELINE} failed: {r.stderr.strip()[:200]}"
    with open(path, "w") as f:
        f.write(r.stdout)
    return path, None


def fetch(hub, work, module, run):
    model = os.path.join(work, f"model-{run}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(HF_ENDPOINT=hub.endpoint, HF_HOME=os.path.join(work, "hf-home"), HF_HUB_DISABLE_TELEMETRY="1",
               MODEL_DIR=model, STATE_DIR=os.path.join(work, f"state-{run}"))
    r = subprocess.run([sys.executable, "-c", CHILD, module, os.path.join(ROOT, "lib")], env=env,
                       capture_output=True, text=True)
    shutil.rmtree(model, ignore_errors=True)
    shutil.rmtree(env["STATE_DIR"], ignore_errors=True)
    if r.returncode:
        if module != "-":                                 # e.g. a huggingface_hub without the private API
            return None, f"the baseline failed: {' '.join(r.stderr.split())[-300:]}"
        raise SystemExit(f"download failed: {r.stderr.strip()[-600:]}")
    return float(r.stdout.strip().splitlines()[-1]), None


def main():
    total_mb = float(os.environ.get("BENCH_DL_MB", "300"))
    runs = int(os.environ.get("BENCH_RUNS", "3"))
    work = tempfile.mkdtemp(prefix="dsv41-bench-dl-", dir=os.environ.get("BENCH_DIR"))
    try:
        base_mod, why = baseline_module(work)
        src = os.path.join(work, "repo")
        make_checkpoint(src, shard_bytes=int(total_mb * 1e6 / 6), parts=4)
        with HubStub(src) as hub:
            nbytes = sum(f["size"] for f in hub.files.values())
            times = {"baseline": [], "current": []}
            for i in range(runs):                        # interleaved: drift hits both alike
                if base_mod:
                    took, why = fetch(hub, work, base_mod, f"b{i}")
                    if took is None:
                        base_mod = None
                    else:
                        times["baseline"].append(took)
                times["current"].append(fetch(hub, work, "-", f"c{i}")[0])
        print(f"download from the Hub stand-in, {len(hub.files)} files, {nbytes / 1e6:.0f} MB, fresh MODEL_DIR, "
              f"median of {runs}, {os.cpu_count()} cores shared with the stand-in:")
        cur = nbytes / statistics.median(times["current"]) / 1e6
        if base_mod:
            base = nbytes / statistics.median(times["baseline"]) / 1e6
            print(f"  baseline (private http_get, {BASELINE}): {base:.0f} MB/s; current (public API): {cur:.0f} MB/s")
            print(f"  current / baseline throughput {cur / base:.2f}x (target >= 0.9x)")
        else:
            print(f"  current (public API): {cur:.0f} MB/s; no baseline: {why}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
