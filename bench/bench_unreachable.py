"""`doit status` with a frozen worker (every process of the node stopped, as a hung Spark) against the
same command with the worker up, in the two-node lab, with the default SSH_TIMEOUT_S (10 s). The target:
the frozen case costs about SSH_TIMEOUT_S + 1 s more than the baseline, not the 75-95 s of a kept ssh
connection waiting out its keep-alives. Needs root and the lab; prints a reason and exits 2 otherwise (no
figure is not a pass)."""
import statistics
import sys

from lab import launched, timed

RUNS = 3


def main():
    lab = launched()
    if lab is None:
        return 2
    up = [timed(lab, "status")[0] for _ in range(RUNS)]
    frozen = []
    lab.freeze("worker1", True)
    try:
        for _ in range(RUNS):
            took, r = timed(lab, "status")
            if r.returncode != 4:
                raise SystemExit(f"status with the worker frozen exited {r.returncode}, not 4 (UNREACHABLE)")
            frozen.append(took)
    finally:
        lab.freeze("worker1", False)
    base, slow = statistics.median(up), statistics.median(frozen)
    print(f"doit status, worker up (baseline):   median {base:5.2f} s  ({', '.join(f'{t:.2f}' for t in up)})")
    print(f"doit status, worker frozen:          median {slow:5.2f} s  ({', '.join(f'{t:.2f}' for t in frozen)})")
    print(f"frozen / baseline: {slow / base:.1f}x; extra {slow - base:.1f} s against SSH_TIMEOUT_S 10 s + 1 s "
          f"({'within' if slow - base <= 11.5 else 'OVER'} target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
