"""Checkpoint verification speed, each figure a ratio against a baseline measured in the same run.

1. verify: the original procedure (`cat` the parts of shards 5 and 6 into place, then
   `sha256sum -c sha256-manifest.txt`) against `python3 -m dsv41.node.checkpoint verify` from the same parts,
   warm cache (target >= 2.5x on 2 cores); also GB/s and the fraction of the hash-bound limit
   bytes / (cores x single-core sha256 speed).
2. one shard: reassemble+verify from parts against `cat parts > shard && sha256sum shard` (target <= 0.5x
   time); also against the durable variant with `sync shard` (ours fsyncs before the rename).
3. a second verify with nothing changed at two sizes (target < 0.5 s, larger <= 1.2x smaller).

The baselines are coreutils, measured in the same run. The verifier is run as `python3 -m CHECKPOINT`
(the command the head runs on a node) and, for one shard, as CHECKPOINT's Checkpoint: the one module path
this benchmark names.

Env: BENCH_SHARD_MB (default 400), BENCH_BIG_GB (default 8), BENCH_DIR (default: a temp dir in /tmp).
Disk use peaks at about max(12 x BENCH_SHARD_MB, BENCH_BIG_GB) and is removed at the end.
"""
import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(ROOT, "lib"), os.path.join(ROOT, "tests")]

from fixture_checkpoint import PLAN, make_checkpoint, shard_name  # noqa: E402

CHECKPOINT = "dsv41.node.checkpoint"    # the node's verifier: its command line and its Checkpoint
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.path.join(ROOT, "lib")}
CORES = os.cpu_count() or 1


def sh(cmd, cwd=None):
    subprocess.run(cmd, shell=True, check=True, cwd=cwd, stdout=subprocess.DEVNULL)


def timed(fn, repeat=2, before=None):
    best = float("inf")
    for _ in range(repeat):
        if before:
            before()
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def warm(paths):
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.read(16 << 20):
                pass


def verify_cli(d, receipt, *extra):
    subprocess.run([PY, "-m", CHECKPOINT, "verify", d, "--receipt", receipt, "--plan", PLAN,
                    "--quiet", *extra], check=True, env=ENV)


def sha256_speed():
    buf = os.urandom(256 << 20)
    t = time.perf_counter()
    hashlib.sha256(buf).digest()
    return len(buf) / (time.perf_counter() - t)


def inputs(d):
    return [os.path.join(d, n) for n in sorted(os.listdir(d)) if n.startswith("model-")]


def bench_verify(work, shard):
    d = os.path.join(work, "ckpt")
    make_checkpoint(d, shard_bytes=shard, parts=4)
    receipt = os.path.join(work, "receipt.json")
    built = [os.path.join(d, shard_name(i)) for i in (5, 6)]

    def reset():
        for p in built + [receipt]:
            if os.path.exists(p):
                os.unlink(p)
        warm(inputs(d))

    def baseline():
        for i in (5, 6):
            sh(f"cat {shard_name(i)}.part* > {shard_name(i)}", cwd=d)
        sh("sha256sum -c --quiet sha256-manifest.txt", cwd=d)

    t_base = timed(baseline, before=reset)
    t_ours = timed(lambda: verify_cli(d, receipt, "--keep-parts"), before=reset)
    total = 6 * shard
    speed = sha256_speed()
    limit = total / (CORES * speed)
    print(f"verify, 6 shards x {shard / 1e6:.0f} MB (5 and 6 from 4 parts each), warm cache, {CORES} cores:")
    print(f"  baseline cat + sha256sum -c: {t_base:.2f} s; dsv41 verify: {t_ours:.2f} s")
    print(f"  speed-up {t_base / t_ours:.2f}x (target >= 2.5x); {total / t_ours / 1e9:.2f} GB/s; "
          f"{100 * limit / t_ours:.0f}% of the hash-bound limit ({CORES} x {speed / 1e9:.2f} GB/s single-core "
          f"sha256; includes writing and fsyncing 2 shards)")

    # 2. one shard from its parts
    s5 = built[0]

    def reset5():
        for p in (s5, receipt):
            if os.path.exists(p):
                os.unlink(p)
        warm([p for p in inputs(d) if ".part" in p and shard_name(5) in p])

    name = shard_name(5)
    t_cat = timed(lambda: sh(f"cat {name}.part* > {name} && sha256sum {name}", cwd=d), before=reset5)
    t_cat_sync = timed(lambda: sh(f"cat {name}.part* > {name} && sync {name} && sha256sum {name}", cwd=d),
                       before=reset5)

    def ours5():
        Checkpoint = importlib.import_module(CHECKPOINT).Checkpoint
        Checkpoint(d, receipt, keep_parts=True, quiet=True).verify(only={name}, strict=False)
        assert os.path.exists(s5)

    t_one = timed(ours5, before=reset5)
    print(f"reassemble+verify one {shard / 1e6:.0f} MB shard from 4 parts:")
    print(f"  baseline cat > shard && sha256sum: {t_cat:.2f} s; with `sync shard`: {t_cat_sync:.2f} s; "
          f"dsv41: {t_one:.2f} s (fsynced)")
    print(f"  time ratio {t_one / t_cat:.2f}x (target <= 0.5x); against the durable baseline "
          f"{t_one / t_cat_sync:.2f}x")
    shutil.rmtree(d)


def bench_noop(work, total_bytes):
    d = os.path.join(work, f"noop-{total_bytes}")
    make_checkpoint(d, shard_bytes=total_bytes // 6, split=(), bank_files=200)
    receipt = os.path.join(work, f"receipt-{total_bytes}.json")
    verify_cli(d, receipt)
    t = timed(lambda: verify_cli(d, receipt), repeat=5)
    shutil.rmtree(d)
    return t


def main():
    shard = int(float(os.environ.get("BENCH_SHARD_MB", "400")) * 1e6)
    big = int(float(os.environ.get("BENCH_BIG_GB", "8")) * 1e9)
    work = tempfile.mkdtemp(prefix="dsv41-bench-", dir=os.environ.get("BENCH_DIR"))
    try:
        bench_verify(work, shard)
        small = bench_noop(work, big // 8)
        large = bench_noop(work, big)
        print("second verify, nothing changed (process start included):")
        print(f"  {big / 8e9:.1f} GB: {small:.3f} s; {big / 1e9:.1f} GB: {large:.3f} s (target < 0.5 s); "
              f"larger/smaller {large / small:.2f}x (target <= 1.2x)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
