"""The one progress display of the node's commands (standard library only; the head's is
dsv41.head.core.progress, on tqdm). A command takes a factory(label, total) -> an object with update(n)
and close(); here: Progress when the command runs alone on a node, MachineProgress when the head runs it
and draws the bar itself (--machine-progress), no_progress for none.
"""
import sys
import threading
import time


class NoProgress:
    """The display of a quiet command: nothing."""

    def update(self, n):
        pass

    def close(self):
        pass


def no_progress(label, total):
    return NoProgress()


def _fmt_time(s):
    s = int(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


class Progress:
    """Byte counter on stderr for a command running alone on a node: in place on a terminal, otherwise one
    plain line every `interval` seconds (none for a step shorter than that) and a closing line after them."""

    INTERVAL_S = 10.0

    def __init__(self, label, total, stream=None, interval=None):
        self.label, self.total, self.done = label, total, 0
        self.stream = stream if stream is not None else sys.stderr
        self.lock = threading.Lock()
        self.tty = _isatty(self.stream)
        self.interval = (0.5 if self.tty else self.INTERVAL_S) if interval is None else interval
        self.enabled = total > 0
        self.printed = self.closed = False
        self.t0 = self.last = time.monotonic()

    def update(self, n):
        with self.lock:
            self.done += n
            now = time.monotonic()
            if self.enabled and not self.closed and now - self.last >= self.interval:
                self.last = now
                self._print(now)

    def _print(self, now, end=""):
        elapsed = max(now - self.t0, 1e-6)
        rate = self.done / elapsed
        eta = _fmt_time((self.total - self.done) / rate) if rate > 0 else "?"
        line = (f"{self.label}: {self.done / 1e9:.2f}/{self.total / 1e9:.2f} GB "
                f"({100 * self.done / self.total:.0f}%), {rate / 1e6:.0f} MB/s, "
                + (f"in {_fmt_time(elapsed)}" if end else f"ETA {eta}"))
        self.stream.write(("\r" + line + end) if self.tty else line + "\n")
        self.stream.flush()
        self.printed = True

    def close(self):
        with self.lock:
            if self.enabled and not self.closed and (self.tty or self.printed):
                self._print(time.monotonic(), "\n")
            self.closed = True


class MachineProgress:
    """`progress <done> <total>` lines (bytes) on stderr, at most every `interval` seconds and once at the
    end, for the head to draw as its own bar when it runs the command on a node."""

    def __init__(self, label, total, stream=None, interval=0.5):
        self.total, self.done, self.interval = total, 0, interval
        self.stream = stream if stream is not None else sys.stderr
        self.lock = threading.Lock()
        self.last = time.monotonic()
        if total > 0:
            self._print()

    def _print(self):
        self.stream.write(f"progress {self.done} {self.total}\n")
        self.stream.flush()

    def update(self, n):
        with self.lock:
            self.done += n
            now = time.monotonic()
            if self.total > 0 and now - self.last >= self.interval:
                self.last = now
                self._print()

    def close(self):
        with self.lock:
            if self.total > 0:
                self._print()


def _isatty(stream):
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
