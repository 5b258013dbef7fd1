"""What checking every setting against the schema costs each command: `doit list` (which loads the
settings, as every command does) on this tree against the tree of BASELINE, the last commit before the
settings schema, checked out into a temporary worktree (bench/baseline.py); best of 7 runs each, in the
same run. The target: at most 1.2x."""
import os
import subprocess
import sys
import tempfile
import time

import baseline

ROOT = baseline.ROOT
RUNS = 7
# ce72b26 (Lab node template carries prometheus...): the parent of 0581d4f, which declared every setting in
# one schema (then head/schema.py) checked on each load; its config.py read conf/defaults.toml unchecked.
BASELINE = "ce72b267c466193e5d0f9c63465f81a198a88df4"


def best(tree, state):
    """The fastest of RUNS `doit list` of tree's dodo.py, with tree's lib/ on sys.path."""
    env = {k: v for k, v in os.environ.items() if k not in ("DSV41_PROFILE", "WORKER", "WORKERS")}
    env = baseline.env(tree, {**env, "STATE_DIR": state})
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "doit", "-f", os.path.join(tree, "dodo.py"), "list"], env=env,
                           cwd=tree, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if r.returncode:
            raise SystemExit(f"bench_config: doit list in {tree} exited {r.returncode}: "
                             f"{' '.join(r.stderr.split())[-300:]}")
    return min(times)


def main():
    with baseline.checkout(BASELINE) as old, tempfile.TemporaryDirectory() as tmp:
        before, after = best(old, os.path.join(tmp, "s1")), best(ROOT, os.path.join(tmp, "s2"))
    print(f"doit list: {after:.3f} s with the schema, {before:.3f} s before it ({BASELINE[:12]}): "
          f"{after / before:.2f}x (target at most 1.2x)")
    return 0 if after / before <= 1.2 else 1


if __name__ == "__main__":
    sys.exit(main())
