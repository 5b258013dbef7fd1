"""The release history on disk, read (core/releases.py writes it and decides from it):

    $STATE_DIR/releases/<NNNN>/release.json   schema dsv41.release/2 (/1 still read), one per release

Which release is in service is read from the records alone (serving_of), so it is stored once and
committed with the record that makes it so (a release good, or one rolled back to another); a
current.json an older version wrote is not read.

Every record is loaded as a core/release_record.py Release and the whole is checked: a record that cannot
be read, or a history that makes no sense, is one line naming the file, and nothing acts on it. Its
imports are few, so the gateway (the Retry-After of its 503s) reads the last start-up here."""
import dataclasses
import os
import re

from dsv41 import names
from dsv41.errors import UserError
from dsv41.head.core import statefiles
from dsv41.head.core.release_record import FAILED, GOOD, ROLLED_BACK, Release

SCHEMA = "dsv41.release/2"
OLDER = ("dsv41.release/1",)        # read too: a failed release with rolled_back_to is ROLLED_BACK there
DIR = names.RELEASES
RECORD = names.RELEASE_RECORD
FOLDER_RE = re.compile(r"^\d{4,}$")


def root(state_dir):
    return os.path.join(state_dir, DIR)


def folder(state_dir, number):
    return os.path.join(root(state_dir), f"{number:04d}")


def last_startup_s(releases):
    """The last good release's measured start-up (None when none measured one)."""
    return next((r.startup_s for r in reversed(releases) if r.state == GOOD and r.startup_s), None)


def load_one(state_dir, number):
    """Release `number`, or None when its folder has no record."""
    data = statefiles.release_record(state_dir, f"{number:04d}")
    if data is None:
        return None
    path = os.path.join(folder(state_dir, number), RECORD)
    schema = data.pop("schema")
    if schema not in (SCHEMA, *OLDER) or data["number"] != number:
        raise statefiles.bad(path, f"is not a {SCHEMA} record of release {number}",
                             "run the command again (the other releases stay)")
    if schema in OLDER and data.get("state") == FAILED and data.get("rolled_back_to"):
        data = {**data, "state": ROLLED_BACK, "back_to": data["rolled_back_to"]}
    return Release(**{f.name: data.get(f.name, None if f.default is dataclasses.MISSING else f.default)
                      for f in dataclasses.fields(Release)})


def load_all(state_dir):
    """Every release, oldest first; UserError (one line) naming a record that cannot be read, or a history that
    makes no sense (a folder this version does not write, as 00002 beside 0002; two releases unfinished at
    once): nothing acts on it. A folder without a record (a launch killed while creating it, before
    anything changed) is skipped."""
    folders = sorted(d for d in statefiles.listdir(root(state_dir)) if FOLDER_RE.match(d))
    odd = next((d for d in folders if len(d) > 9 or d != f"{int(d):04d}"), None)
    if odd:
        raise statefiles.bad(os.path.join(root(state_dir), odd), "is not a release folder this version writes "
                             "(release 2's is 0002)", "run the command again (the other releases stay)")
    out = [r for r in (load_one(state_dir, int(d)) for d in folders) if r is not None]
    left = [r for r in out if r.unfinished]
    if len(left) > 1:
        raise UserError(f"{root(state_dir)}: releases {left[0].number} and {left[1].number} are both unfinished "
                        f"({left[0].shown_state}; {left[1].shown_state}), which no run of dsv41 leaves: move the "
                        f"folder of the one that did not run aside (to {left[-1].number:04d}.bad)")
    return out


def serving_of(releases):
    """The number of the release in service, from the records alone: the newest release that put one in
    service says which, a good one itself, one rolled back the release it went back to (None: none did).
    A release that failed and is down, or was interrupted, leaves the one before in service."""
    for r in reversed(releases):
        if r.state == GOOD:
            return r.number
        if r.state == ROLLED_BACK:
            return r.rolled_back_to
    return None


def read_history(state_dir):
    """(every release, oldest first, the number of the one in service or None): the history read once,
    UserError as load_all, or when the release in service is not kept."""
    releases = load_all(state_dir)
    serving = serving_of(releases)
    if serving is not None and not any(r.number == serving for r in releases):
        raise UserError(f"{root(state_dir)}: release {serving}, in service by the records, is not kept: move the "
                        "folders aside and run `doit launch` (it records what serves)")
    return releases, serving
