"""The memory guard's metrics file, <METRICS_DIR>/dsv41_memguard.prom for node_exporter's textfile
collector: MemAvailable, the floor, the mode, trips since the guard started and the last trip's time,
whether the trip marker exists. Written by a thread of its own so that a slow disk never delays a
reading.
"""
import os
import threading

from dsv41.files import write_textfile
from dsv41.node.memguard import MODES

METRICS_FILE = "dsv41_memguard.prom"


def metrics_lines(avail, floor, mode, trips, last_trip, tripped):
    """The guard's metrics in Prometheus' text format, for node_exporter's textfile collector."""
    return [
        "# HELP dsv41_memguard_mem_available_bytes MemAvailable at the guard's last reading.",
        "# TYPE dsv41_memguard_mem_available_bytes gauge",
        f"dsv41_memguard_mem_available_bytes {avail}",
        "# HELP dsv41_memguard_floor_bytes Below this MemAvailable the guard stops the ranks (MEMGUARD_GIB).",
        "# TYPE dsv41_memguard_floor_bytes gauge",
        f"dsv41_memguard_floor_bytes {floor}",
        "# HELP dsv41_memguard_mode The guard's mode, 1 for the current one (observe only logs).",
        "# TYPE dsv41_memguard_mode gauge",
        *(f'dsv41_memguard_mode{{mode="{m}"}} {int(m == mode)}' for m in MODES),
        "# HELP dsv41_memguard_trips_total Times MemAvailable fell below the floor since the guard started.",
        "# TYPE dsv41_memguard_trips_total counter",
        f"dsv41_memguard_trips_total {trips}",
        "# HELP dsv41_memguard_last_trip_timestamp_seconds When the guard last tripped (0: not since it started).",
        "# TYPE dsv41_memguard_last_trip_timestamp_seconds gauge",
        f"dsv41_memguard_last_trip_timestamp_seconds {last_trip:.3f}",
        "# HELP dsv41_memguard_tripped 1 while the trip marker blocks the rank units (until doit clear-trip).",
        "# TYPE dsv41_memguard_tripped gauge",
        f"dsv41_memguard_tripped {int(tripped)}",
    ]


class Textfile:
    """Writes the metrics file on a thread of its own (write_textfile fsyncs; the guard's loop never
    waits for a disk). Only the newest lines are written; a failure is kept in .error for the guard
    to log from its own thread."""

    STACK = 256 << 10      # mlockall(MCL_FUTURE) locks a thread's stack too: keep it small

    def __init__(self):
        self.cv = threading.Condition()
        self.pending = None             # (directory, lines or None to remove the file)
        self.error = None
        self.done = False
        old = threading.stack_size(self.STACK)
        try:
            self.thread = threading.Thread(target=self.run, name="metrics", daemon=True)
            self.thread.start()
        finally:
            threading.stack_size(old)

    def submit(self, directory, lines):
        with self.cv:
            self.pending = (directory, lines)
            self.cv.notify()

    def run(self):
        while True:
            with self.cv:
                while self.pending is None and not self.done:
                    self.cv.wait()
                if self.pending is None:
                    return
                (directory, lines), self.pending = self.pending, None
            try:
                if lines is None:
                    try:
                        os.unlink(os.path.join(directory, METRICS_FILE))
                    except FileNotFoundError:
                        pass
                else:
                    write_textfile(directory, METRICS_FILE, lines)
                self.error = None
            except OSError as err:
                self.error = f"{err.filename or directory}: {err.strerror}"

    def close(self, timeout=2.0):
        """Write what is pending, then stop."""
        with self.cv:
            self.done = True
            self.cv.notify()
        self.thread.join(timeout)
