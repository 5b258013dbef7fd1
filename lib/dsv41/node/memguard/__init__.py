"""The memory guard, one on each node: when MemAvailable falls below a floor it SIGKILLs the processes
of the node's rank containers, stops their units and leaves a trip marker that blocks their restart.
It runs as `python3 -m dsv41.node.memguard` (the dsv41-memguard unit); a module for each job:

    guard.py      the loop: when to look, when to trip and what a trip does; the settings file; options
    scan.py       what it reads from /proc: MemAvailable, the rank processes, the biggest memory holders
    kill.py       how it stops the ranks: SIGKILL through pidfds, process_mrelease, systemctl
    marker.py     the trip marker (the probe reads it for the launcher and status)
    textfile.py   its metrics file for node_exporter's textfile collector
    log.py        its log lines

This module holds the settings the guard accepts and their unit: the head's settings schema checks
MEMGUARD_GIB and MEMGUARD_MODE with them, so it imports nothing of the guard and the head never loads
the rest.
"""
import os
import re

from dsv41.errors import UserError

FLOOR_GIB = (0.1, 1024)        # the floors the guard accepts, in GiB
DEFAULT_FLOOR_GIB = 1.0        # MEMGUARD_GIB's default (the settings schema reads it from here)
MODES = ("enforce", "observe")
DEFAULT_MODE = "enforce"       # MEMGUARD_MODE's default (the settings schema reads it from here)
GIB = 1 << 30


def gib(nbytes):
    return round(nbytes / GIB, 2)


def check_floor(value, var="MEMGUARD_GIB"):
    """The floor in GiB, or UserError naming the accepted range (the one rule, used by the Config too)."""
    text = str(value).strip()          # in ASCII digits: float() also takes any Unicode digit and 1_0
    gib_ = float(text) if re.fullmatch(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+", text) else float("nan")
    lo, hi = FLOOR_GIB
    if not lo <= gib_ <= hi:
        raise UserError(f"{var}={value!r} is not valid: expected the memory guard's floor in GiB, "
                        f"a number from {lo:g} to {hi:g}")
    return gib_


def check_mode(value, var="MEMGUARD_MODE"):
    if value not in MODES:
        raise UserError(f"{var}={value!r} is not valid: expected {' or '.join(MODES)}")
    return value


def check_metrics_dir(value, var="METRICS_DIR"):
    """The metrics dir: an absolute directory, or empty for no metrics file."""
    if not isinstance(value, str) or (value and not os.path.isabs(value)) or "\0" in value:
        raise UserError(f"{var}={value!r} is not valid: expected an absolute directory, or empty for no metrics file")
    return value.rstrip("/") or ("/" if value else "")
