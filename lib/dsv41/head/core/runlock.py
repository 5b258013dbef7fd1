"""The run lock: one mutating doit run (or watchdog recovery) per state dir at a time, held until the
process exits, and by the child processes it hands the lock to (a copy's rsyncs)."""
import fcntl
import os
import sys

from dsv41 import names
from dsv41.errors import UserError
from dsv41.head.core.statefiles import bad

LOCK = names.DOIT_LOCK
_fd = None


def take(state_dir, what=None):
    """Take the lock or raise a UserError naming its holder. Idempotent within a process."""
    global _fd
    if _fd is not None:
        return
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
    _fd = fd


def release():
    global _fd
    if _fd is not None:
        os.close(_fd)
        _fd = None


def held_fds():
    """The lock's fd, for children that must hold it as long as they live."""
    return () if _fd is None else (_fd,)


def holder(state_dir):
    """Who holds the lock now ("pid N: command"), or None when nobody does. Takes nothing."""
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
