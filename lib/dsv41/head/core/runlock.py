"""The run lock: one mutating doit run (or watchdog recovery) per state dir at a time, held until the
process exits, and by the child processes it hands the lock to (a copy's rsyncs).

With several serving groups (GROUPS) each group's watchdog recovers under its group's own lock
($STATE_DIR/groups/g<N>/doit.lock: Config.records), so one group's recovery never waits on another's; a doit
run's lock and a group's exclude each other: whoever takes one and then finds the other held lets its own go."""
import fcntl
import glob
import os
import sys

from dsv41 import names
from dsv41.errors import UserError
from dsv41.head.core.statefiles import bad

LOCK = names.DOIT_LOCK
_fds = {}           # {state dir or group records dir: the fd holding its lock}


def take(state_dir, what=None):
    """Take the lock or raise a UserError naming its holder (a group's lock: also while a doit run holds the
    whole's; the whole's: also while a group's recovery holds its own). Idempotent within a process."""
    if state_dir in _fds:
        return
    _flock(state_dir, what)
    other = _others(state_dir)
    if other:
        os.close(_fds.pop(state_dir))
        raise UserError(f"another doit run holds {other[0]} ({other[1]}); wait for it to finish or stop it first")


def _others(state_dir):
    """(path, holder) of a lock held that excludes state_dir's: the whole's for a group's, a group's for the
    whole's; None."""
    head, name = os.path.split(os.path.normpath(state_dir))
    if os.path.basename(head) == names.GROUP_RECORDS and names.GROUP_DIR_RE.fullmatch(name):
        dirs = [os.path.dirname(head)]
    else:
        dirs = sorted(glob.glob(os.path.join(glob.escape(state_dir), names.GROUP_RECORDS, "g*")))
    for d in dirs:
        who = _holder(d)
        if who:
            return os.path.join(d, LOCK), who
    return None


def _flock(state_dir, what):
    os.makedirs(state_dir, exist_ok=True)
    path = os.path.join(state_dir, LOCK)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise bad(path, f"cannot be opened ({err.strerror or err})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _written(fd)
        os.close(fd)
        raise UserError(f"another doit run holds {path} ({holder}); wait for it to finish "
                        f"or stop it first") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}: {what or ' '.join(sys.argv[1:]) or 'launch'}\n".encode(), 0)
    _fds[state_dir] = fd


def release():
    while _fds:
        os.close(_fds.popitem()[1])


def held_fds():
    """The locks' fds, for children that must hold them as long as they live."""
    return tuple(_fds.values())


def holder(state_dir):
    """Who holds the lock now ("pid N: command"), or a lock that excludes it (take()), or None when nobody does.
    Takes nothing."""
    other = _others(state_dir)
    return _holder(state_dir) or (other and other[1])


def _holder(state_dir):
    path = os.path.join(state_dir, LOCK)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise bad(path, f"cannot be opened ({err.strerror or err})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _written(fd)
    finally:
        os.close(fd)
    return None


def _written(fd):
    """What the holder wrote in the lock file ("pid N: command")."""
    try:
        return os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
    except OSError:                 # a folder in its place
        return "unknown"
