"""Reading and writing a checkpoint's big files without filling the page cache (unified memory is
shared with the GPU): large sequential reads dropped from the cache as they go, writes whose write-back
starts early and whose pages go once on disk, and the sha256 of a file on the way.
"""
import ctypes
import hashlib
import os

from dsv41.node.progress import NoProgress

CHUNK = 8 << 20
WINDOW = 64 << 20                       # write-back / page-cache drop granularity


def drop(fd, offset=0, length=0):
    """Drop a file's pages (all, or a range) from the page cache; best effort."""
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    except (AttributeError, OSError):
        pass


def _sync_file_range():
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
        fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
        return fn
    except (OSError, AttributeError):
        return None


_SFR = _sync_file_range()


class Writer:
    """Sequential writer that starts write-back of each 64 MiB window as soon as it is full and drops the
    previous one from the page cache once on disk: the final fsync has little left to do and a 100 GB
    shard never sits in memory (unified memory is shared with the GPU)."""

    def __init__(self, fd):
        self.fd, self.off, self.mark, self.prev = fd, 0, 0, None

    def write(self, mv):
        while mv:
            n = os.write(self.fd, mv)
            mv, self.off = mv[n:], self.off + n
        if _SFR and self.off - self.mark >= WINDOW:
            _SFR(self.fd, self.mark, self.off - self.mark, 2)            # start write-back
            if self.prev:
                _SFR(self.fd, self.prev[0], self.prev[1], 1 | 2 | 4)     # wait for the previous window
                drop(self.fd, *self.prev)
            self.prev, self.mark = (self.mark, self.off - self.mark), self.off

    def finish(self):
        os.fsync(self.fd)
        drop(self.fd)


def read_into(path, sink, progress):
    """Stream a file in large reads to sink(memoryview); drops it from the page cache as it goes."""
    buf = bytearray(CHUNK)
    mv = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except (AttributeError, OSError):
            pass
        off = dropped = 0
        while True:
            n = f.readinto(buf)
            if not n:
                break
            sink(mv[:n])
            off += n
            progress.update(n)
            if off - dropped >= WINDOW:
                drop(fd, dropped, off - dropped)
                dropped = off
        drop(fd)
    return off


def hash_file(path, progress=None):
    h = hashlib.sha256()
    read_into(path, h.update, progress or NoProgress())
    return h.hexdigest()
