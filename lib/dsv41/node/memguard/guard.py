"""Memory guard for one node: when MemAvailable falls below a floor, SIGKILL the processes of the
node's dsv41-r* rank containers (directly, not through dockerd), stop their units through systemd and
leave a trip marker that blocks their restart.

Runs on the node with the system python3, standard library only:
    python3 -m dsv41.node.memguard --state-dir DIR --settings DIR/memguard.json   (or --floor-gib, --mode)

The loop: it looks at MemAvailable (scan.py) as often as the headroom above the floor and the
kernel's memory-pressure trigger ask, trips once below the floor (kill.py; the marker, marker.py) and
re-arms above it, re-reads its settings file on SIGHUP, and with a metrics dir (METRICS_DIR,
"metrics_dir" in the settings file) publishes its metrics (textfile.py) every METRICS_EVERY_S and at
each trip.
"""
import argparse
import ctypes
import os
import select
import signal
import socket
import time

from dsv41.errors import UserError, cli
from dsv41.names import DEFAULT_STATE_DIR, GUARD_LOG, RANK_PREFIX, RANK_UNIT_RE, rank_unit
from dsv41.node import statefiles
from dsv41.node.memguard import DEFAULT_FLOOR_GIB, DEFAULT_MODE, GIB, check_floor, check_metrics_dir, check_mode, gib
from dsv41.node.memguard.kill import kill_all, release, systemctl
from dsv41.node.memguard.log import Log, now_iso
from dsv41.node.memguard.marker import below, read_trip, trip_path, trips_so_far, write_trip
from dsv41.node.memguard.scan import MemInfo, comm, fmt_top, scan, top_holders
from dsv41.node.memguard.textfile import METRICS_FILE, Textfile, metrics_lines

SLOW_S, FAST_S, MIN_S = 1.0, 0.1, 0.01  # poll period: far from the floor, near it, at the floor
NEAR_GIB = 4.0  # within this of the floor, look at least every FAST_S
ASSUMED_RATE = 4 * GIB  # bytes/s a loader can eat; the observed rate is used when higher
REARM_GIB = 0.5  # trip again only after MemAvailable was back above floor + this
TOP_BELOW_GIB, TOP_EVERY_S = 10.0, 10.0  # under this, log the top memory holders this often
PSI_FAST_S = 3.0  # after a pressure event, poll at FAST_S at least this long
# PSI triggers, tried in order: windows under 2 s need CAP_SYS_RESOURCE.
PSI_TRIGGERS = (b"some 50000 500000", b"some 100000 2000000")

METRICS_EVERY_S = 5.0          # the metrics file is rewritten at most this often (and at each trip)


def poll_interval(headroom, rate):
    """Seconds to the next look at MemAvailable, from the headroom above the floor (bytes) and the
    fill rate (bytes/s): half the time the headroom lasts, 1 s when far from the floor, at most
    100 ms within NEAR_GIB of it, never under 10 ms."""
    if headroom <= 0:
        return MIN_S
    cap = FAST_S if headroom < NEAR_GIB * GIB else SLOW_S
    return min(cap, max(MIN_S, headroom / (2 * max(rate, ASSUMED_RATE))))


# --- the guard ---------------------------------------------------------------------------------

def lock_memory():
    """Keep the guard's pages resident (mlockall) so it cannot stall on page-ins; best effort."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mlockall(1 | 2) != 0:  # MCL_CURRENT | MCL_FUTURE
            return os.strerror(ctypes.get_errno())
    except (OSError, AttributeError) as err:
        return str(err)
    return None


def open_psi(path="/proc/pressure/memory"):
    """(fd, trigger) for a memory-pressure poll trigger, or (None, reason)."""
    reason = "no trigger accepted"
    for trigger in PSI_TRIGGERS:
        try:
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        except OSError as err:
            return None, f"{path}: {err.strerror}"
        try:
            os.write(fd, trigger + b"\0")
            return fd, trigger.decode()
        except OSError as err:
            reason = f"{trigger.decode()}: {err.strerror}"
            os.close(fd)
    return None, reason


class Guard:
    def __init__(self, floor, mode, state_dir, log, settings=None, metrics_dir=""):
        self.floor, self.mode, self.state_dir, self.log = floor, mode, state_dir, log
        self.settings, self.reload = settings, settings is not None
        self.cli_metrics_dir = self.metrics_dir = metrics_dir
        self.trips, self.last_trip = 0, 0.0          # since this process started
        self.next_metrics = 0.0
        self.textfile = None
        self.metrics_error = None                    # the write error last logged
        self.mem = MemInfo()
        self.armed = True
        self.running = True
        self.rate = 0.0
        self.last = None  # (time, MemAvailable)
        self.psi_until = 0.0
        self.next_top = 0.0
        self.poller = select.poll()
        self.psi_fd = None
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.on_signal)
        signal.signal(signal.SIGHUP, self.on_hup)
        self.poller.register(self.wake_r, select.POLLIN)

    def on_signal(self, signum, frame):
        self.running = False

    def on_hup(self, signum, frame):
        self.reload = True

    def load_settings(self):
        """Floor and mode from the settings file (systemctl reload re-reads it, so a new
        MEMGUARD_GIB never restarts the guard, nor the ranks bound to it)."""
        self.reload = False
        try:
            data = statefiles.read_object(self.settings)
            if data is None:
                return
            floor = int(check_floor(data["floor_gib"], "floor_gib") * GIB)
            mode = check_mode(data.get("mode", self.mode), "mode")
            metrics_dir = check_metrics_dir(data.get("metrics_dir", self.cli_metrics_dir), "metrics_dir")
        except (ValueError, KeyError, TypeError, UserError) as err:      # statefiles.Unreadable too
            self.log(f"settings {self.settings} ignored ({type(err).__name__}: {err}); keeping floor "
                     f"{gib(self.floor):.2f} GiB, mode {self.mode}")
            return
        if (floor, mode) != (self.floor, self.mode):
            self.floor, self.mode, self.armed = floor, mode, True
            self.log(f"settings from {self.settings}: floor {gib(floor):.2f} GiB, mode {mode}")
            self.next_metrics = 0.0
        if metrics_dir != self.metrics_dir:
            if self.metrics_dir:           # no stale file left where node_exporter still reads
                self.writer().submit(self.metrics_dir, None)
            self.metrics_dir, self.next_metrics = metrics_dir, 0.0
            self.log(f"settings from {self.settings}: " + self.describe_metrics())

    def start(self):
        if self.reload:
            self.load_settings()
        oom = "oom_score_adj -1000"
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("-1000")
        except OSError as err:
            oom = f"oom_score_adj unchanged ({err.strerror})"
        locked = lock_memory()
        self.psi_fd, psi = open_psi()
        if self.psi_fd is not None:
            self.poller.register(self.psi_fd, select.POLLPRI)
        avail = self.mem.available()
        locked = "memory locked" if locked is None else f"memory not locked ({locked})"
        psi = f"PSI trigger {psi}" if self.psi_fd is not None else f"no PSI trigger ({psi}), polling only"
        self.log(f"memguard started: mode {self.mode}, floor {gib(self.floor):.2f} GiB, "
                 f"MemAvailable {gib(avail):.2f} GiB, pid {os.getpid()}, {oom}, {locked}, {psi}, "
                 + self.describe_metrics())
        trip = read_trip(self.state_dir)
        if trip is not None:
            self.log(f"trip marker {trip_path(self.state_dir)} present (from {trip.get('time', '?')}): "
                     f"rank units stay blocked until it is removed")

    def run(self):
        self.start()
        while self.running:
            try:
                if self.reload:
                    self.load_settings()
                delay = self.step()
            except Exception as err:  # the guard never dies from its own error
                self.log(f"error: {type(err).__name__}: {err}")
                delay = FAST_S
            self.wait(delay)
        if self.textfile:
            self.textfile.close()
        self.log("memguard stopping (signal)")

    def describe_metrics(self):
        if not self.metrics_dir:
            return "no metrics file (METRICS_DIR unset)"
        return f"metrics in {os.path.join(self.metrics_dir, METRICS_FILE)} every {METRICS_EVERY_S:g} s"

    def writer(self):
        if self.textfile is None:
            self.textfile = Textfile()
        return self.textfile

    def publish(self, avail, now):
        """Hand the metrics to the writer thread (at most every METRICS_EVERY_S, and at each trip);
        log a write failure once, and its end."""
        self.next_metrics = now + METRICS_EVERY_S
        w = self.writer()
        if w.error != self.metrics_error:
            self.log(f"cannot write metrics: {w.error}" if w.error else f"metrics written again to {self.metrics_dir}")
            self.metrics_error = w.error
        w.submit(self.metrics_dir, metrics_lines(avail, self.floor, self.mode, self.trips, self.last_trip,
                                                 os.path.exists(trip_path(self.state_dir))))

    def wait(self, delay):
        for fd, ev in self.poller.poll(delay * 1000):
            if fd == self.wake_r:
                try:
                    os.read(self.wake_r, 64)
                except OSError:
                    pass
            elif ev & (select.POLLERR | select.POLLNVAL):
                self.log("PSI trigger failed; polling only")
                self.poller.unregister(fd)
                os.close(fd)
                self.psi_fd = None
            else:
                self.psi_until = time.monotonic() + PSI_FAST_S

    def step(self):
        """One look at MemAvailable; returns seconds until the next."""
        now = time.monotonic()
        avail = self.mem.available()
        if self.last:
            dt = now - self.last[0]
            fill = (self.last[1] - avail) / dt if dt > 0 else 0.0
            self.rate = max(fill, self.rate * 0.5 ** (dt / 2.0))
        self.last = (now, avail)
        if avail < self.floor:
            if self.armed:
                self.armed = False
                self.trips, self.last_trip = self.trips + 1, time.time()
                self.trip(avail)
                if self.metrics_dir:
                    self.publish(avail, now)
        elif not self.armed and avail > self.floor + REARM_GIB * GIB:
            self.armed = True
            self.log(f"re-armed: MemAvailable {gib(avail):.2f} GiB is back above floor "
                     f"{gib(self.floor):.2f} GiB + {REARM_GIB} GiB")
        if avail < TOP_BELOW_GIB * GIB and now >= self.next_top:
            self.next_top = now + TOP_EVERY_S
            _, sizes = scan({}, want_ranks=False)
            self.log(f"low memory: MemAvailable {gib(avail):.2f} GiB (floor {gib(self.floor):.2f} GiB); "
                     f"top: {fmt_top(top_holders(sizes))}")
        if self.metrics_dir and now >= self.next_metrics:
            self.publish(avail, now)
        delay = poll_interval(avail - self.floor, self.rate)
        return min(delay, FAST_S) if now < self.psi_until else delay

    def trip(self, avail):
        t0 = time.monotonic()
        cids = statefiles.rank_cids(self.state_dir)
        ranks, sizes = scan(cids)
        units = {rank_unit(r) for r, _ in ranks.values() if r is not None}
        units |= {rank_unit(r) for r in cids.values()}
        rss = dict((pid, size) for size, pid in sizes)
        marker = {
            "time": now_iso(), "host": socket.gethostname(), "mode": self.mode,
            "mem_available_gib": gib(avail), "floor_gib": gib(self.floor),
            "mem_available_bytes": avail, "floor_bytes": self.floor,
            "killed": [{"pid": pid, "rank": rank, "comm": comm(pid), "rss_gib": gib(rss.get(pid, 0)),
                        "how": how, "result": "pending"} for pid, (rank, how) in sorted(ranks.items())],
            "units": sorted(units), "top": top_holders(sizes),
        }
        head = below(avail, self.floor)
        if self.mode != "enforce":
            listed = systemctl(["list-units", f"{RANK_PREFIX}*", "--all", "--plain", "--no-legend"], self.log)
            units |= {m.group(0) for m in RANK_UNIT_RE.finditer(listed or "")}
            self.log(f"TRIP (observe): {head}: would kill {self.describe(marker['killed'])} and stop "
                     f"{', '.join(sorted(units)) or 'no units'}; top: {fmt_top(marker['top'])}")
            return
        path = trip_path(self.state_dir)
        marker["trips"] = trips_so_far(self.state_dir) + 1
        try:
            write_trip(self.state_dir, marker)
        except OSError as err:
            self.log(f"cannot write trip marker {path}: {err}")
        results, fds = kill_all(sorted(ranks), self.log)
        ms = (time.monotonic() - t0) * 1000
        marker["killed_at"] = now_iso()
        release(fds)
        for k in marker["killed"]:
            k["result"] = results.get(k["pid"], "?")
        self.log(f"TRIP: {head}: killed {self.describe(marker['killed'])} ({ms:.0f} ms after the reading); "
                 f"top: {fmt_top(marker['top'])}")
        listed = systemctl(["list-units", f"{RANK_PREFIX}*", "--all", "--plain", "--no-legend"], self.log)
        units |= {m.group(0) for m in RANK_UNIT_RE.finditer(listed or "")}
        marker["units"] = sorted(units)
        for unit in marker["units"]:
            if systemctl(["stop", "--no-block", unit], self.log) is not None:
                self.log(f"asked systemd to stop {unit}")
        try:
            write_trip(self.state_dir, marker, durable=True)
        except OSError as err:
            self.log(f"cannot update trip marker {path}: {err}")
        self.log(f"trip marker {path} written; rank units stay blocked until it is removed")

    @staticmethod
    def describe(killed):
        if not killed:
            return "no rank processes (none found)"
        return ", ".join(f"{k['comm']}[{k['pid']}] rank {k['rank']} ({k['how']}, {k['rss_gib']:.2f} GiB"
                         + (f", {k['result']})" if k["result"] != "pending" else ")") for k in killed)


# --- command line ------------------------------------------------------------------------------

def parse_args(argv=None, env=None):
    env = os.environ if env is None else env
    p = argparse.ArgumentParser(prog="dsv41-memguard", description=__doc__.split("\n\n")[0])
    p.add_argument("--floor-gib", default=env.get("MEMGUARD_GIB", str(DEFAULT_FLOOR_GIB)),
                   help=f"stop the ranks below this much MemAvailable (env MEMGUARD_GIB, default {DEFAULT_FLOOR_GIB:g})")
    p.add_argument("--mode", default=env.get("MEMGUARD_MODE", DEFAULT_MODE),
                   help=f"enforce (kill and stop) or observe (only log) (env MEMGUARD_MODE, default "
                        f"{DEFAULT_MODE})")
    p.add_argument("--state-dir", default=env.get("STATE_DIR", DEFAULT_STATE_DIR),
                   help=f"absolute, or starting with ~/ (env STATE_DIR, default {DEFAULT_STATE_DIR})")
    p.add_argument("--log", default=None, help="log file (default $STATE_DIR/memguard.log)")
    p.add_argument("--settings", default=None,
                   help="JSON file {floor_gib, mode, metrics_dir} overriding those options; re-read on SIGHUP")
    p.add_argument("--metrics-dir", default=env.get("METRICS_DIR", ""),
                   help=f"node_exporter textfile collector dir for {METRICS_FILE} (env METRICS_DIR; empty: none)")
    args = p.parse_args(argv)
    args.floor = int(check_floor(args.floor_gib, "--floor-gib (MEMGUARD_GIB)") * GIB)
    check_mode(args.mode, "--mode (MEMGUARD_MODE)")
    args.metrics_dir = check_metrics_dir(os.path.expanduser(args.metrics_dir), "--metrics-dir (METRICS_DIR)")
    args.state_dir = os.path.expanduser(args.state_dir)
    if not os.path.isabs(args.state_dir):          # as the settings check: a relative dir moves with the cwd
        raise UserError(f"--state-dir (STATE_DIR)={args.state_dir!r} is not valid: expected an absolute "
                        "directory or one starting with ~/")
    args.log = os.path.abspath(os.path.expanduser(args.log or os.path.join(args.state_dir, GUARD_LOG)))
    if args.settings:
        args.settings = os.path.abspath(os.path.expanduser(args.settings))
        if not os.path.isfile(args.settings):      # a guard on defaults it was not given would be a surprise
            raise UserError(f"--settings {args.settings} does not exist: run `doit launch` (it writes "
                            "memguard.json), or leave --settings out to run on the options given")
    return args


@cli
def main(argv=None):
    args = parse_args(argv)
    try:
        os.makedirs(args.state_dir, exist_ok=True)
        log = Log(args.log)
    except OSError as err:
        raise UserError(f"memory guard cannot write {err.filename or args.state_dir}: {err.strerror}; "
                        f"point --state-dir/--log at a writable directory") from None
    Guard(args.floor, args.mode, args.state_dir, log, args.settings, args.metrics_dir).run()

