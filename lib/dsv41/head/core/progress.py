"""The head's one progress display (download, reassembly and verification, copy, the start-up wait):
a tqdm bar updated in place when stderr is a terminal, one plain line every INTERVAL_S seconds when it is
not (journald, CI, a pipe), never both.

    from dsv41.head.core import progress

    with progress.bar("download 0xSero/DeepSeek-V4.1-Flash-Spark", total_bytes) as b:
        b.update(len(chunk))                 # thread-safe; n may be negative (a transfer that restarted)

    wait = progress.bar("waiting for the API at http://10.10.10.10:8000/v1", timeout_s, unit="s")
    wait.update(seconds_since_the_last_update)
    wait.close()

bar(label, total, unit="B", *, initial=0, stream=None, interval=None) -> Bar
    label     what is progressing; the line starts with it
    total     the amount at 100%: bytes for unit "B" (shown as kB/MB/GB, with rate and ETA), seconds for
              unit "s" (elapsed out of total, no rate, for waits with a timeout), a count for any other
              unit ("files"). A bar whose total is not positive shows nothing.
    initial   already done before this run (a resumed download): counts towards the percentage, not the rate
    stream    where to write; default sys.stderr, looked up when the bar is made. Its isatty() picks the mode.
    interval  seconds between plain lines when the stream is not a terminal; default INTERVAL_S (10)

Bar.update(n=1), Bar.close() (idempotent; also the end of a `with` block), Bar.n (done so far), Bar.total.

Plain-line mode prints nothing for a step shorter than the interval, and a closing line
("<label>: 4.20GB/4.20GB (100%) in 00:38, 110MB/s") only after it printed at least one, so quick steps
stay quiet in logs and long ones end with their total. Lines never contain a carriage return.

Node code cannot import tqdm: a node's verifier prints `progress <done> <total>` lines with
--machine-progress, and the head feeds them to a bar (see dsv41.head.copy_checkpoint).
"""
import sys
import threading
import time

INTERVAL_S = 10.0           # plain lines when stderr is not a terminal
TTY_INTERVAL_S = 0.5        # redraws of the in-place bar at most this often

# bar_format for the in-place bar (None: tqdm's default) and for plain lines and the closing line
_TTY = {"B": "{l_bar}{bar}| {n_fmt}B/{total_fmt}B [{elapsed}<{remaining}, {rate_fmt}]",
        "s": "{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s"}
_LINE = {"B": "{desc}: {n_fmt}B/{total_fmt}B ({percentage:.0f}%), {rate_fmt}, ETA {remaining}",
         "s": "{desc}: {n:.0f}/{total:.0f} s ({percentage:.0f}%)"}
_LINE_OTHER = "{desc}: {n_fmt}/{total_fmt} {unit} ({percentage:.0f}%), {rate_fmt}, ETA {remaining}"
_DONE = {"B": "{desc}: {n_fmt}B/{total_fmt}B ({percentage:.0f}%) in {elapsed}, {rate_fmt}",
         "s": "{desc}: {n:.0f} of {total:.0f} s used"}
_DONE_OTHER = "{desc}: {n_fmt}/{total_fmt} {unit} ({percentage:.0f}%) in {elapsed}, {rate_fmt}"


def _isatty(stream):
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Bar:
    """See the module docstring. Build it with bar()."""

    def __init__(self, label, total, unit="B", initial=0, stream=None, interval=None):
        from tqdm import tqdm        # here, not at import: dodo imports the head's modules on every command
        self._tqdm = tqdm
        self.label, self.unit = label, unit
        self.total = total or 0
        self.n = self.initial = initial
        self.stream = stream if stream is not None else sys.stderr
        self.interval = INTERVAL_S if interval is None else interval
        self.enabled = self.total > 0
        self.tty = self.enabled and _isatty(self.stream)
        self.lock = threading.Lock()
        self.printed = self.closed = False
        self.t0 = self.last = time.monotonic()
        self._bar = None
        if self.tty:
            self._bar = tqdm(total=self.total, initial=initial, desc=label, unit=unit, unit_scale=unit == "B",
                             unit_divisor=1000, file=self.stream, mininterval=TTY_INTERVAL_S,
                             dynamic_ncols=True, leave=True, bar_format=_TTY.get(unit))

    def update(self, n=1):
        with self.lock:
            if self.closed:
                return
            self.n += n
            if self._bar is not None:
                self._bar.update(n)
            elif self.enabled:
                now = time.monotonic()
                if now - self.last >= self.interval:
                    self.last = now
                    self._line(now, _LINE.get(self.unit, _LINE_OTHER))

    def _line(self, now, fmt):
        elapsed = now - self.t0
        rate = (self.n - self.initial) / elapsed if elapsed > 0 else None
        # past its total (a wait that ran over) tqdm drops the total, which the formats need
        text = self._tqdm.format_meter(min(self.n, self.total), self.total, elapsed, prefix=self.label, unit=self.unit,
                                       unit_scale=self.unit == "B", unit_divisor=1000, rate=rate,
                                       bar_format=fmt, initial=self.initial)
        self.stream.write(text + "\n")
        self.stream.flush()
        self.printed = True

    def close(self):
        with self.lock:
            if self.closed:
                return
            self.closed = True
            if self._bar is not None:
                self._bar.close()
            elif self.enabled and self.printed:
                self._line(time.monotonic(), _DONE.get(self.unit, _DONE_OTHER))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def bar(label, total, unit="B", *, initial=0, stream=None, interval=None):
    """A progress display for `total` units of work; see the module docstring."""
    return Bar(label, total, unit, initial, stream, interval)
