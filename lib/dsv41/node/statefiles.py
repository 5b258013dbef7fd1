"""A node's state files under its $STATE_DIR (their names are dsv41.names'), read and written here only;
standard library only (shipped to nodes). Records are written atomically and fsync'd (dsv41.files). A
node's tools never stop on a file they cannot read: read_json and read_object raise Unreadable, one line
naming the file and why, and each caller says it its way (the guard logs it and keeps its floor, a trip
marker it cannot read still counts as a trip, the probe reports no settings, a receipt it cannot read
means verifying again).

    memguard.json            the guard's floor and mode (launch writes it; the guard and the probe read it)
    memguard.tripped         the trip marker (node/memguard/marker.py says what it holds)
    mem-baseline.json        MemAvailable before the node's first rank started, and the boot it was in
    checkpoint-receipt.json  what was verified in the model dir (node/checkpoint.py)
    run/dsv41-r<N>.cid       the rank containers' ids (docker run --cidfile; the guard reads them)
"""
import json
import os
import re

from dsv41 import names
from dsv41.files import fsync_dir, write_atomic

CID_RE = re.compile(r"^[0-9a-f]{12,64}$")
NUMBER = (int, float)
GUARD_SETTINGS = {"floor_gib": NUMBER, "mode": str, "metrics_dir": str}
MEM_BASELINE = {"mem_available_bytes": int, "boot_id": (str, type(None))}


class Unreadable(ValueError):
    """A state file this version cannot read; str() names it and says why."""


def path(state_dir, name):
    return names.state_path(os.path.expanduser(str(state_dir)), name)


def read_json(file):
    """The file's JSON, None when there is no file; Unreadable when it cannot be read, is not UTF-8 or
    not JSON (a folder in its place, a write cut short)."""
    try:
        with open(file, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise Unreadable(f"{file}: cannot be read ({err.strerror or err})") from None
    try:
        return json.loads(data.decode())
    except UnicodeDecodeError:
        raise Unreadable(f"{file}: not UTF-8 text") from None
    except (ValueError, RecursionError) as err:
        raise Unreadable(f"{file}: not JSON ({err})") from None


def read_object(file, fields=None):
    """read_json's object, its `fields` ({name: type or types}) of those types when present (a bool is
    none of them); Unreadable otherwise."""
    doc = read_json(file)
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise Unreadable(f"{file}: not a JSON object")
    for key, types in (fields or {}).items():
        value = doc.get(key)
        if key in doc and (not isinstance(value, types) or isinstance(value, bool)):
            raise Unreadable(f"{file}: {key} is {value!r:.40}, not what this version writes")
    return doc


def write_json(file, doc, durable=False, **how):
    """A record, atomically and fsync'd; durable: its directory entry too."""
    write_atomic(file, json.dumps(doc, **how))
    if durable:
        fsync_dir(os.path.dirname(file))


def guard_settings(state_dir):
    """memguard.json ({"floor_gib", "mode", "metrics_dir"}) as launch wrote it; None when there is none
    (Unreadable when it cannot be read)."""
    return read_object(path(state_dir, names.GUARD_SETTINGS), GUARD_SETTINGS)


def mem_baseline(state_dir):
    """(MemAvailable bytes, the boot it was recorded in) of the node's baseline, (None, None) without one
    or with one this version cannot read; the boot is None for a baseline of an earlier version."""
    try:
        doc = read_object(path(state_dir, names.MEM_BASELINE), MEM_BASELINE)
    except Unreadable:
        return None, None
    if doc is None or "mem_available_bytes" not in doc:
        return None, None
    return doc["mem_available_bytes"], doc.get("boot_id")


def rank_cids(state_dir):
    """{container id: rank} from the cidfiles in $STATE_DIR/run. A file that cannot be read or holds no
    container id is left out: the guard then finds that rank's processes by their DSV41_RANK=."""
    run, cids = path(state_dir, names.RUN), {}
    try:
        files = os.listdir(run)
    except OSError:
        return cids
    for name in files:
        m = names.CIDFILE_RE.match(name)
        if not m:
            continue
        try:
            with open(os.path.join(run, name), "rb") as f:
                cid = f.read(200).strip().decode("ascii", "replace")
        except OSError:
            continue
        if CID_RE.match(cid):
            cids[cid] = int(m.group(1))
    return cids
