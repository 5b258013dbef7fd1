"""The memory guard's trip marker, `$STATE_DIR/memguard.tripped`: the guard writes it when it trips (in
enforce mode) and the rank units do not start while it exists; the probe reads it for the launcher and
status, and `doit clear-trip` removes it.

Its JSON: time (of the reading), killed_at, host, mode, mem_available_gib, floor_gib (and _bytes),
killed [{pid, rank, comm, rss_gib, how, result}], units, top [{pid, comm, rss_gib}], trips.
"""
import json
import math
import os

from dsv41.names import TRIP_MARKER
from dsv41.node import statefiles
from dsv41.node.memguard import GIB


def trip_path(state_dir):
    return statefiles.path(state_dir, TRIP_MARKER)


def parse_trip(raw, where=TRIP_MARKER):
    """A trip marker's bytes (e.g. read from a worker with Node.read_file) as a dict; a marker that
    cannot be parsed still counts as a trip: {"error": ...}."""
    try:
        trip = json.loads(raw)
        if not isinstance(trip, dict):
            raise ValueError("not a JSON object")
        return trip
    except ValueError as err:
        return {"error": f"unreadable trip marker {where}: {err}"}


def read_trip(state_dir):
    """The node's trip marker as a dict, or None when it has not tripped."""
    try:
        return statefiles.read_object(trip_path(state_dir))
    except statefiles.Unreadable as err:
        return {"error": f"unreadable trip marker {err}"}


def trips_so_far(state_dir):
    """The trips the marker counts: none without a marker, one for a marker that does not say."""
    old = read_trip(state_dir) or {}
    return old.get("trips") if isinstance(old.get("trips"), int) else (1 if old else 0)


def write_trip(state_dir, trip, durable=False):
    """Write the trip marker atomically; durable: its directory entry too (an fsync of the state dir)."""
    statefiles.write_json(trip_path(state_dir), trip, durable=durable, indent=1)


def below(avail, floor):
    """'MemAvailable 18.998 GiB < floor 19.000 GiB': MemAvailable rounded down, so it never shows equal
    to the floor it fell under."""
    return f"MemAvailable {math.floor(avail / GIB * 1000) / 1000:.3f} GiB < floor {floor / GIB:.3f} GiB"


def describe_trip(trip):
    """One line about a trip marker (as the launcher and status show it)."""
    if not all(isinstance(trip.get(k), (int, float)) for k in ("mem_available_bytes", "floor_bytes")):
        return f"tripped ({trip.get('error') or 'marker without readings'})"
    return f"tripped at {trip.get('time', '?')} on {trip.get('host', '?')}: " + below(
        trip["mem_available_bytes"], trip["floor_bytes"])


def clear_trip(state_dir):
    """Remove the trip marker (no error when absent); returns what it said, or None."""
    trip = read_trip(state_dir)
    try:
        os.unlink(trip_path(state_dir))
    except FileNotFoundError:
        pass
    return trip
