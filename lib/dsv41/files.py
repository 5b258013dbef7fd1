"""Atomic file writes (standard library only: runs on every node too)."""
import os
import tempfile


def write_atomic(path, data, mode=0o644):
    """Write bytes (or text) to path: a temp file in the same dir, fsync, chmod, rename. A reader
    sees the old file or the new one, never half of either."""
    if isinstance(data, str):
        data = data.encode()
    path = os.fspath(path)
    d = os.path.dirname(path) or "."
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_textfile(directory, name, lines):
    """Metrics for node_exporter's textfile collector: <directory>/<name>, written atomically."""
    write_atomic(os.path.join(directory, name), "\n".join(lines) + "\n")


def fsync_dir(path):
    """Make a rename in `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
