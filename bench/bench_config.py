"""What checking every setting against the schema costs each command: `doit list` (which loads the
Config, as every command does) on this tree against the tree before the schema (the parent of the commit
that added lib/dsv41/head/core/schema.py), best of 7 runs each. The target: at most 1.2x."""
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = 7


def best(tree, state):
    env = {k: v for k, v in os.environ.items() if k not in ("DSV41_PROFILE", "WORKER", "WORKERS")}
    env["STATE_DIR"] = state
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "doit", "-f", os.path.join(tree, "dodo.py"), "list"], env=env,
                       cwd=tree, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    git = ["git", "-C", ROOT]
    added = subprocess.run(git + ["log", "--diff-filter=A", "--format=%H", "--", "lib/dsv41/head/core/schema.py"],
                           capture_output=True, text=True, check=True).stdout.split()
    if not added:
        print("bench_config: schema.py is not committed yet; nothing to compare")
        return 0
    base = added[-1] + "^"
    with tempfile.TemporaryDirectory() as tmp:
        old = os.path.join(tmp, "before")
        os.mkdir(old)
        archive = subprocess.run(git + ["archive", base], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", old], input=archive, check=True)
        before, after = best(old, os.path.join(tmp, "s1")), best(ROOT, os.path.join(tmp, "s2"))
    print(f"doit list: {after:.3f} s with the schema, {before:.3f} s before it ({base[:12]}): "
          f"{after / before:.2f}x (target at most 1.2x)")
    return 0 if after / before <= 1.2 else 1


if __name__ == "__main__":
    sys.exit(main())
