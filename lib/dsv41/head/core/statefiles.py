"""The head's state files, read and written here only (their names are dsv41.names'): each file read
into a value whose shape is checked, a record written atomically and fsync'd, incidents.jsonl appended a
line at a time and fsync'd. A file of another shape or encoding, a folder in its place, one that cannot
be read: BadStateFile, one line naming it and what to do (move it aside), never a traceback.

    ready.json, needs-reboot.json, watchdog.gaveup     markers (core/record.py)
    watchdog.status.json, watchdog.json                what the watchdog last saw, its settings
    incidents.jsonl, incidents/<name>/summary.json     the incidents and their evidence folders
    releases/<NNNN>/release.json, releases/current.json   the release history (core/releases.py)
    image.stamp, units/r<N>/<unit>                     what `doit image` saw, the rendered units
    monitoring/<file>                                  Prometheus' and Alertmanager's configs and units
    doit.lock                                          the run lock (core/runlock.py takes it)
    MODEL_DIR/.cache/dsv41/download.json               what `doit download` fetched (head/download.py)
"""
import json
import math
import os
import stat

from dsv41 import names
from dsv41.errors import UserError, one_line
from dsv41.files import fsync_dir, write_atomic

TIME_MAX = 1e11             # unix seconds: no later time is one this machine wrote (the year 5138)


class BadStateFile(UserError):
    """A state file this version cannot read: its one line names it and says to move it aside."""


def bad(path, why, then="run the command again"):
    return BadStateFile(f"{path} {why}: move it aside (to {os.path.basename(path)}.bad) and {then}")


# ---- shapes -------------------------------------------------------------------------------------------

def TIME(v):
    """A time this machine wrote: unix seconds, finite, after 1970 and before TIME_MAX."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < TIME_MAX:
        raise ValueError(f"{one_line(repr(v), 40)} is not a time")
    return v


def NUMBER(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or abs(v) > TIME_MAX:
        raise ValueError(f"{one_line(repr(v), 40)} is not a number")
    return v


def ANY(v):
    return v


def check(value, shape, where="it"):
    """value when it has `shape`, else ValueError saying where it differs. A shape is a type (int: no
    bool), a function (TIME, NUMBER, ANY), a tuple of alternatives (None among them: may be missing or
    null), [shape] (a list of it), {str: shape} (a mapping of names to it) or {"field": shape, ...} (an
    object with those fields at least; a missing one reads as null)."""
    if isinstance(shape, tuple):
        why = None
        for alt in shape:
            try:
                return check(value, alt, where)
            except ValueError as err:
                why = why if alt is None else err
        raise why
    if shape is None:
        if value is not None:
            raise ValueError(f"{where} is not null")
        return value
    if isinstance(shape, list):
        if not isinstance(value, list):
            raise ValueError(f"{where} is not a list")
        return [check(v, shape[0], f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            raise ValueError(f"{where} is not an object")
        if list(shape) == [str]:
            return {k: check(v, shape[str], f"{where}.{k}") for k, v in value.items()}
        for k, s in shape.items():
            check(value.get(k), s, f"{where}.{k}" if where != "it" else k)
        return value
    if isinstance(shape, type):
        if not isinstance(value, shape) or (shape is int and isinstance(value, bool)):
            raise ValueError(f"{where} is not {'a' if shape is not int else 'an'} {shape.__name__}")
        return value
    return shape(value)


# ---- reading and writing ------------------------------------------------------------------------------

def _in_the_way(file):
    """The file where one of `file`'s folders should be."""
    d = os.path.dirname(file)
    while d and not os.path.isdir(d) and d != os.path.dirname(d):
        if os.path.exists(d):
            return d
        d = os.path.dirname(d)
    return file


def read_bytes(file):
    """The file's bytes, None when there is none; BadStateFile when it cannot be read, or is not a regular
    file (a FIFO would block the reader for ever, a device never end)."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)
        with open(fd, "rb") as f:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise bad(file, "is a folder, not a file" if stat.S_ISDIR(mode) else "is not a regular file (a FIFO?)")
            return f.read()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise bad(file, "is a folder, not a file") from None
    except NotADirectoryError:
        raise bad(_in_the_way(file), "is a file, not a folder") from None
    except OSError as err:
        raise bad(file, f"cannot be read ({err.strerror or err})") from None


def read_text(file):
    data = read_bytes(file)
    try:
        return None if data is None else data.decode()
    except UnicodeDecodeError:
        raise bad(file, "is not UTF-8 text") from None


def read_json(file, shape=ANY, then="run the command again"):
    """The file's JSON checked against `shape` (check()), None when there is no file."""
    text = read_text(file)
    if text is None:
        return None
    try:
        return check(json.loads(text), shape)
    except RecursionError:
        raise bad(file, "is nested too deep", then) from None
    except ValueError as err:
        what = "is not JSON" if isinstance(err, json.JSONDecodeError) else "is not what this version writes"
        raise bad(file, f"{what} ({one_line(err, 120)})", then) from None


def seen(problems, read, *args, default=None):
    """read(*args), strict when problems is None; else a file that cannot be read is said in problems
    (its one line) and read as `default`: status and top answer with what they can see."""
    if problems is None:
        return read(*args)
    try:
        return read(*args)
    except BadStateFile as err:
        if str(err) not in problems:
            problems.append(str(err))
        return default


def write_file(file, data, mode=0o644):
    """Bytes or text, atomically and fsync'd (files.write_atomic); BadStateFile when it cannot be written
    (a folder in its place, or a file in place of its folder)."""
    try:
        write_atomic(file, data, mode)
    except (NotADirectoryError, FileExistsError):       # making its folder met a file
        raise bad(_in_the_way(file), "is a file, not a folder") from None
    except OSError as err:
        raise bad(file, f"cannot be written ({err.strerror or err})") from None


def write_json(file, doc, mode=0o644, indent=1, durable_dir=False):
    """A record, atomically and fsync'd (the rename too with durable_dir)."""
    write_file(file, json.dumps(doc, indent=indent) + "\n", mode)
    if durable_dir:
        fsync_dir(os.path.dirname(file))


def remove(file):
    try:
        os.unlink(file)
        return True
    except FileNotFoundError:
        return False
    except IsADirectoryError:
        raise bad(file, "is a folder, not a file") from None


def append_line(file, doc):
    """One JSON line appended and fsync'd (incidents.jsonl), its folder made first (a group's records)."""
    try:
        os.makedirs(os.path.dirname(file), exist_ok=True)
        with open(file, "a") as f:
            f.write(json.dumps(doc) + "\n")
            f.flush()
            os.fsync(f.fileno())
    except IsADirectoryError:
        raise bad(file, "is a folder, not a file") from None


def parse_lines(lines, shape, file):
    """JSON lines (bytes or text) as [(line number, value)] of the lines of `shape`; a line that is not
    JSON (a write torn by a crash) is skipped; one of another shape or not UTF-8 is BadStateFile naming
    the file and the line."""
    out = []
    for n, raw in enumerate(lines, 1):
        try:
            line = raw.decode() if isinstance(raw, bytes) else raw
        except UnicodeDecodeError:
            raise bad(file, f"line {n} is not UTF-8 text") from None
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(value, dict):
            continue
        try:
            out.append((n, check(value, shape)))
        except ValueError as err:
            raise bad(file, f"line {n} is not what this version writes ({one_line(err, 120)})") from None
    return out


def listdir(folder):
    """The names in a folder, [] when there is none; BadStateFile when it is a file or cannot be read."""
    try:
        return os.listdir(folder)
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        raise bad(folder, "is a file, not a folder") from None
    except OSError as err:
        raise bad(folder, f"cannot be read ({err.strerror or err})") from None


# ---- the files' shapes --------------------------------------------------------------------------------

OPT_TIME, OPT_STR, OPT_NUMBER, OPT_INT = (TIME, None), (str, None), (NUMBER, None), (int, None)
READY = {"time": TIME}
NEEDS_REBOOT = {"time": TIME, "line": str}
GAVE_UP = {"time": TIME, "reason": str}
# an incidents.jsonl line: "open", "phase" or "close" (or an earlier version's whole incident: no event)
PHASES = ([{"phase": str, "seconds": OPT_NUMBER, "cache": OPT_STR}], None)   # core/startup.py to_record()
STARTED = ({"phases": PHASES, "total": OPT_NUMBER}, None)       # a start-up in a release's or incident's record
INCIDENT_EVENT = {"event": OPT_STR, "id": OPT_STR, "started": OPT_TIME, "verdict": OPT_STR, "evidence": OPT_STR,
                  "fault_at": OPT_TIME, "node": OPT_STR, "action": OPT_STR, "by": OPT_STR, "pid": OPT_INT,
                  "phase": OPT_STR, "folder": OPT_STR, "incident": OPT_STR, "result": OPT_STR, "ended": OPT_TIME,
                  "took_s": OPT_NUMBER, "startup": STARTED}
INCIDENT = {**INCIDENT_EVENT, "id": str, "open": bool}
STARTUP = {"time": TIME, "kind": str, "of": OPT_STR, "phases": PHASES, "total": OPT_NUMBER}
WATCHDOG_STATUS = {"time": TIME, "verdict": str, "evidence": str, "health": (dict, None),
                   "recoveries_in_window": OPT_INT, "max_recoveries": OPT_INT, "gave_up": (GAVE_UP, None),
                   "last_incident": (INCIDENT, None)}
WATCHDOG_SETTINGS = {"config": dict}
SUMMARY = {"time": OPT_TIME, "verdict": OPT_STR, "evidence": OPT_STR, "fault_at": OPT_TIME, "ended": OPT_TIME,
           "outage_s": OPT_NUMBER, "result": OPT_STR,
           "nodes": ({str: {"error": OPT_STR, "files": ([str], None), "notes": ([str], None),
                            "took_s": OPT_NUMBER, "capped": (bool, None)}}, None)}


def FILE_ENTRY(v):
    """A release's state file: [text, mode]."""
    if not (isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) and isinstance(v[1], int)):
        raise ValueError(f"{one_line(repr(v), 40)} is not [text, mode]")
    return v


def one_of(*words):
    def word(v):
        if v not in words:
            raise ValueError(f"{one_line(repr(v), 40)} is not one of {', '.join(words)}")
        return v
    return word


RELEASE = {"schema": str, "number": int, "time": TIME, "image": str, "image_ids": {str: OPT_STR},
           "state": one_of("rolling out", "good", "failed", "interrupted", "rolling back", "rolled back", "down"),
           "checkpoint": {"repo": OPT_STR, "revision": OPT_STR, "manifest_digest": OPT_STR},
           "settings": dict, "node_versions": {str: {str: ANY}}, "units": {str: {str: str}},
           "files": {str: {str: FILE_ENTRY}}, "secret_files": {str: [str]}, "changes": [str], "changes_from": OPT_INT,
           "startup_s": OPT_NUMBER, "result": str, "failed_at": OPT_TIME, "finished_at": OPT_TIME,
           "rolled_back_to": OPT_INT, "back_to": OPT_INT, "deadline_s": OPT_NUMBER, "started_at": OPT_TIME,
           "carrier": (None, {"by": str, "pid": int, "since": TIME}), "rollback_of": OPT_INT,
           "startup_phases": STARTED, "back_phases": STARTED}
DOWNLOAD_RECORDS = {str: {"etag": str, "size": int, "mtime_ns": int}}


# ---- markers and the watchdog's files -----------------------------------------------------------------

def ready_at(state_dir):
    doc = read_json(names.state_path(state_dir, names.READY), READY)
    return None if doc is None else float(doc["time"])


def mark_ready(state_dir, now):
    write_json(names.state_path(state_dir, names.READY), {"time": now})


def needs_reboot(state_dir):
    return read_json(names.state_path(state_dir, names.NEEDS_REBOOT), NEEDS_REBOOT,
                     "reboot the node it names before `doit launch`")


def set_needs_reboot(state_dir, line, now):
    write_json(names.state_path(state_dir, names.NEEDS_REBOOT), {"time": now, "line": line})


def clear_needs_reboot(state_dir):
    return remove(names.state_path(state_dir, names.NEEDS_REBOOT))


def last_startup(state_dir):
    return read_json(names.state_path(state_dir, names.STARTUP), STARTUP)


def set_startup(state_dir, doc):
    write_json(names.state_path(state_dir, names.STARTUP), doc)


def gave_up(state_dir):
    return read_json(names.state_path(state_dir, names.WATCHDOG_GAVEUP), GAVE_UP, "`doit launch` (the watchdog had given up)")


def set_gave_up(state_dir, reason, now):
    write_json(names.state_path(state_dir, names.WATCHDOG_GAVEUP), {"time": now, "reason": reason})


def clear_gave_up(state_dir):
    return remove(names.state_path(state_dir, names.WATCHDOG_GAVEUP))


def watchdog_status(state_dir):
    """What the watchdog last published, or {}."""
    return read_json(names.state_path(state_dir, names.WATCHDOG_STATUS), WATCHDOG_STATUS,
                     "let the watchdog write it again (within a minute)") or {}


def publish_status(state_dir, doc):
    write_json(names.state_path(state_dir, names.WATCHDOG_STATUS), doc)


def watchdog_settings(state_dir):
    """The resolved settings launch wrote for the watchdog (its "config"); UserError when there are none."""
    file = names.state_path(state_dir, names.WATCHDOG_SETTINGS)
    doc = read_json(file, WATCHDOG_SETTINGS, "run `doit launch`")
    if doc is None:
        raise UserError(f"the watchdog's settings {file} are missing: run `doit launch`")
    return doc["config"]


def watchdog_settings_text(config):
    """watchdog.json's text: the resolved settings (launch writes it on the head as one of the files it
    puts on a node, core/desired.py)."""
    return json.dumps({"config": config}, indent=1, sort_keys=True) + "\n"


def incident_lines(state_dir):
    """incidents.jsonl's lines (bytes), [] when there is none."""
    return (read_bytes(names.state_path(state_dir, names.INCIDENTS)) or b"").splitlines()


def incident_events(lines, file=names.INCIDENTS):
    """incidents.jsonl's lines as [(line number, event)] (parse_lines)."""
    return parse_lines(lines, INCIDENT_EVENT, file)


def append_incident_event(state_dir, event):
    append_line(names.state_path(state_dir, names.INCIDENTS), event)


# ---- incident folders ---------------------------------------------------------------------------------

def summary(folder):
    """An incident folder's summary.json, None when it has none."""
    return read_json(os.path.join(folder, names.INCIDENT_SUMMARY), SUMMARY)


def write_summary(folder, doc):
    write_json(os.path.join(folder, names.INCIDENT_SUMMARY), doc, mode=0o600)


# ---- releases -----------------------------------------------------------------------------------------

def releases_dir(state_dir):
    return names.state_path(state_dir, names.RELEASES)


def release_record(state_dir, folder_name):
    """releases/<folder>/release.json checked (still with its "schema"), None when there is none."""
    return read_json(names.state_path(releases_dir(state_dir), folder_name, names.RELEASE_RECORD), RELEASE,
                     "run the command again (the other releases stay)")


def write_release(state_dir, folder_name, doc):
    os.makedirs(releases_dir(state_dir), mode=0o700, exist_ok=True)
    os.makedirs(names.state_path(releases_dir(state_dir), folder_name), mode=0o700, exist_ok=True)
    write_json(names.state_path(releases_dir(state_dir), folder_name, names.RELEASE_RECORD), doc, 0o600, durable_dir=True)
    fsync_dir(releases_dir(state_dir))


def forget_current(state_dir):
    """The pointer to the release in service an older version kept (releases/current.json) removed: the
    records say which serves, and an older version run again would trust a stale one."""
    try:
        os.remove(names.state_path(releases_dir(state_dir), names.RELEASE_CURRENT))
    except FileNotFoundError:
        pass


# ---- what `doit image` saw, the rendered units --------------------------------------------------------

def write_if_changed(file, data, mode=0o644):
    """Write bytes atomically unless the file holds them already; -> whether it was written."""
    if read_bytes(file) == data:
        return False
    write_file(file, data, mode)
    return True


IMAGE_STAMP = {"image": str, "ids": {str: OPT_STR}, "server_flags": ({str: {"id": str, "flags": [str]}}, None)}


def stamp_image(state_dir, image, ids, server_flags):
    """image.stamp: the image and the id every node held, and for each image asked so far (by reference)
    its id and the recipe's optional flags its server lists (core.image asks)."""
    data = json.dumps({"image": image, "ids": ids, "server_flags": server_flags}, indent=1, sort_keys=True).encode()
    write_if_changed(names.state_path(state_dir, names.IMAGE_STAMP), data)


def asked_images(state_dir):
    """{image: {"id", "flags"}} of the images whose server `doit image` asked ({} before it did)."""
    stamp = read_json(names.state_path(state_dir, names.IMAGE_STAMP), IMAGE_STAMP, "run `doit image` again")
    return (stamp or {}).get("server_flags") or {}


def server_flags(state_dir, image):
    """The optional flags `image`'s server lists as `doit image` found them, () when it has not asked
    (the units then go without them)."""
    return tuple(asked_images(state_dir).get(image, {}).get("flags", ()))


# ---- what `doit download` fetched ---------------------------------------------------------------------

def download_dir(model_dir):
    """Where `doit download` keeps its partial files and its records in the model dir."""
    return os.path.join(model_dir, names.DOWNLOAD_DIR)


def download_records(model_dir):
    """{path in the repo: {"etag", "size", "mtime_ns"}} of the files earlier downloads fetched, {} when none."""
    return read_json(os.path.join(model_dir, names.DOWNLOAD_RECORDS), DOWNLOAD_RECORDS,
                     "run `doit download` again (files already here are checked against the checkpoint's receipt)") or {}


def write_download_records(model_dir, records):
    write_json(os.path.join(model_dir, names.DOWNLOAD_RECORDS), records)
