"""What the watchdog's defaults cost: seconds from a fault to the watchdog seeing it, and from the fault
to the API generating again, for a killed worker rank and for a wedged engine, in the two-node lab with
the stand-in engine and the default WATCHDOG_INTERVAL_S (15 s) and WATCHDOG_PROBE_S (60 s). The baseline
is the fastest a person could do: a `doit launch` typed the moment the fault happens. Needs root and the
lab; prints a reason and exits 2 otherwise (no figure is not a pass)."""
import sys
import time

from lab import launched

STATE = "/root/.dsv41-two-sparks"


def recovered(lab, since, timeout=600):
    """The first incident after `since` that ended READY (the lab's nodes share this clock)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for inc in lab.incidents(STATE):
            if inc["started"] >= since and inc["result"] == "READY":
                return inc
        time.sleep(1)
    raise SystemExit(f"no recovery within {timeout} s")


def main():
    lab = launched()
    if lab is None:
        return 2
    lab.on("head", f"rm -f {STATE}/incidents.jsonl {STATE}/watchdog.gaveup")
    lab.doit("launch")                                  # the default watchdog settings
    rows = []
    for fault, node, cmd in (("killed worker rank", "worker1", "docker kill dsv41-r1"),
                             ("wedged engine", "head", "docker kill --signal USR1 dsv41-r0")):
        time.sleep(20)                                  # a quiet interval first
        t0 = time.time()
        lab.on(node, cmd)
        inc = recovered(lab, t0)
        rows.append((fault, inc["verdict"], inc["started"] - t0, inc["ended"] - t0))
    lab.on("head", "systemctl stop dsv41-watchdog")       # baseline: a person relaunches at once
    lab.on("worker1", "docker kill dsv41-r1")
    t0 = time.time()
    lab.doit("launch", check=False)
    by_hand = time.time() - t0
    print("watchdog defaults: interval 15 s, idle probe deadline 60 s")
    for fault, verdict, seen, ready in rows:
        print(f"{fault:<20} seen as {verdict:<9} after {seen:5.1f} s, READY after {ready:5.1f} s "
              f"({ready / by_hand:.1f}x a `doit launch` typed at once: {by_hand:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
