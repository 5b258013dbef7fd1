"""dsv41-watchdog: a service on the head (installed by `doit launch` unless WATCHDOG=0) that brings a dead,
half-dead or wedged cluster back by itself, with the ordered restart launch performs (head rank stopped
first, workers started before the head, ready when a token comes back), at most
WATCHDOG_MAX_RECOVERIES times per WATCHDOG_WINDOW_MIN; past that it gives up and stays hands-off until
`doit launch`. It never acts on stale evidence, while a memory guard is tripped, while a doit run holds
the run lock, or while a start-up is within START_TIMEOUT_MIN.

Every WATCHDOG_INTERVAL_S it observes every node's rank unit and trip marker (one probe per node), the
API's /health and /metrics and, when no request runs or waits or when work has made no progress for
WATCHDOG_STALL_S (every progress signal of the recipe flat), a one-token probe with a deadline;
judge() turns that and what it remembers into a verdict (pure). Before it stops anything it saves an
incident folder (core.recovery, core.incidents); the n-th recovery inside the window waits
WATCHDOG_BACKOFF_S x 2^(n-2) after the previous one (it keeps looking and publishing meanwhile); a
restart whose nodes' memory did not come back starts nothing (NEEDS_REBOOT) until it does. Each
incident gets a journal line at detection and one at the end, and a JSON line in
$STATE_DIR/incidents.jsonl; $STATE_DIR/watchdog.json holds the settings launch gave it,
watchdog.status.json what it last saw (for status and top); dsv41_watchdog.prom in METRICS_DIR is
removed when it stops.

    python -m dsv41.head.watchdog --state-dir DIR
"""
import argparse
import json
import os
import signal
import sys
import threading
import time

from dsv41 import names
from dsv41.errors import UserError, cli, one_line
from dsv41.files import write_atomic
from dsv41.head.config import from_resolved
from dsv41.head.core import incidents, ranks, recovery, runlock
from dsv41.head.core.cluster import Cluster
from dsv41.head.core.hang import OK, recovery_gate
from dsv41.head.core.judge import (ACT_ON, NEEDS_REBOOT, NO_TOKEN, STARTING, TOKEN, VERDICTS, Memory, Observation,
                                   judge, wants_probe)

SCHEMA = "dsv41.watchdog/1"
METRICS_FILE = "dsv41_watchdog.prom"


# ---- observing ------------------------------------------------------------------------------------

def observe(cl, cfg, mem):
    """One look at everything judge() needs; never raises for a node or the API being down. The
    one-token probe goes out when no request runs or waits, and when work has made no progress for
    WATCHDOG_STALL_S (judge.wants_probe). An API that did not answer /health is not asked for more, so
    that a look at a stopped API server costs the /health timeout only."""
    states = cl.observe()                      # each interval asks every node afresh
    client = cl.api(read_timeout=cfg.watchdog_probe_s)
    health, snap, probe = client.health(), None, None
    if health is not None:                     # a server that did not answer /health would not answer this
        try:
            snap = cl.recipe.scrape(timeout=client.health_timeout)
        except UserError:
            pass
    if health == 200 and wants_probe(cfg, mem, snap, cl.recipe):
        probe = token_probe(client, cfg.served_model_name)
    return Observation(time.time(), states, health, snap, probe, ready_at=ranks.ready_at(cfg.state_dir))


def token_probe(client, model):
    """One streamed token within the client's read timeout: TOKEN, NO_TOKEN or "error ..."."""
    try:
        s = client.stream("/completions", {"model": model, "prompt": "Hello", "max_tokens": 1},
                          stop_after_first=True)
        return TOKEN if s.t_first is not None else NO_TOKEN
    except UserError as err:
        status = getattr(err, "status", None)
        if status is None and "timed out" in str(err):
            return NO_TOKEN
        return f"error {status or one_line(err, 120)}"


# ---- acting ---------------------------------------------------------------------------------------

class Watchdog:
    def __init__(self, cfg, log=print, clock=time.time):
        self.cfg, self.log, self.clock = cfg, log, clock
        self.cl = Cluster(cfg)
        self.mem = Memory()
        self.state = cfg.state_dir
        self.last = None            # (verdict, evidence) last logged
        self.stop = threading.Event()

    def path(self, name):
        return names.state_path(self.state, name)

    def incidents(self):
        try:
            with open(self.path(names.INCIDENTS)) as f:
                return [json.loads(line) for line in f if line.strip()]
        except (FileNotFoundError, ValueError):
            return []

    def recoveries_in_window(self, now, incidents=None):
        """The restarts within WATCHDOG_WINDOW_S of now (from `incidents` when already read)."""
        return [i for i in (self.incidents() if incidents is None else incidents)
                if i.get("action") == "restart" and now - i["started"] < self.cfg.watchdog_window_s]

    def gave_up(self):
        try:
            with open(self.path(names.WATCHDOG_GAVEUP)) as f:
                return json.load(f)
        except (FileNotFoundError, ValueError):
            return None

    def record(self, incident):
        with open(self.path(names.INCIDENTS), "a") as f:
            f.write(json.dumps(incident) + "\n")

    def say(self, verdict, evidence):
        """A journal line when the verdict (or its evidence's gist) changed."""
        key = (verdict, evidence.split(" (")[0])
        if key != self.last:
            self.log(f"{verdict}: {evidence}")
            self.last = key

    def step(self):
        """One interval: observe, judge, act when the verdict asks for it and nothing forbids it."""
        obs = observe(self.cl, self.cfg, self.mem)
        if recovery.needs_reboot(self.state):
            return self.memory_wait(obs)
        verdict, evidence = judge(self.cfg, obs, self.mem, self.cl.recipe)
        if verdict in ACT_ON:
            self.incident(verdict, evidence, obs.time)
        else:
            self.say(verdict, evidence)
        self.publish(verdict, evidence)
        return verdict

    def memory_wait(self, obs):
        """A restart stopped because a node's memory did not come back: keep looking, and start the
        ranks once it is back (or once a `doit launch --force` cleared the record)."""
        check = recovery.check_now(self.cfg, obs.nodes)
        if check.verdict != OK:
            line = check.line() or (recovery.needs_reboot(self.state) or {}).get("line", "")
            self.say(NEEDS_REBOOT, line)
            self.publish(NEEDS_REBOOT, line)
            return NEEDS_REBOOT
        self.log("the memory came back on every node: starting the ranks")
        self.recover(NEEDS_REBOOT, "the memory came back", obs.time, "start",
                     lambda: recovery.start_when_memory_back(self.cl, log=self.log))
        self.publish(NEEDS_REBOOT if recovery.needs_reboot(self.state) else STARTING, "after the memory came back")
        return NEEDS_REBOOT

    def incident(self, verdict, evidence, now):
        why_not = self.blocked(now)
        if why_not:
            self.say(verdict, f"{evidence}; not acting: {why_not}")
            return
        done = [(i["started"], i["ended"]) for i in self.recoveries_in_window(now)]
        gate = recovery_gate(now, done, window_s=self.cfg.watchdog_window_s,
                             max_recoveries=self.cfg.watchdog_max_recoveries, backoff_s=self.cfg.watchdog_backoff_s)
        if gate.action == "give up":
            reason = f"{verdict} again after {gate.reason}: {evidence}"
            write_atomic(self.path(names.WATCHDOG_GAVEUP), json.dumps({"time": now, "reason": reason}) + "\n")
            self.record({"started": now, "ended": now, "verdict": verdict, "evidence": evidence,
                         "action": "gave up", "result": reason, "took_s": 0})
            self.log(f"GAVE UP: {reason}; hands off until `doit launch`")
            self.last = None
            return
        if gate.action == "wait":
            self.say(verdict, f"{evidence}; backing off: {gate.reason}")
            return
        self.log(f"INCIDENT {verdict}: {evidence}; saving the evidence, then restarting the ranks in order "
                 f"({gate.reason})")
        self.last = None
        fault_at = self.mem.fault_at or now
        self.recover(verdict, evidence, fault_at, "restart", lambda: recovery.restart(self.cl, log=self.log),
                     evidence_first=True)

    def recover(self, verdict, evidence, fault_at, action, do, evidence_first=False):
        """Under the run lock: the incident folder (evidence_first), do(), the wait for a token; the
        outcome in incidents.jsonl and the folder."""
        t0 = self.clock()
        try:
            runlock.take(self.state, "dsv41-watchdog recovery")
        except UserError:
            self.log("not acting: a doit run took the run lock just now")
            return
        folder = None
        result = "interrupted: the watchdog was stopped"
        try:
            if evidence_first:
                folder = recovery.save_evidence(self.cl, verdict, evidence, fault_at, self.log)
            do()
            ranks.wait_ready(self.cl)
            result = "READY"
        except recovery.NeedsReboot as err:
            result = str(err)
        except UserError as err:
            result = f"failed: {one_line(err, 300)}"
        finally:
            runlock.release()
            ended = self.clock()
            took = ended - t0
            self.record({"started": t0, "ended": ended, "verdict": verdict, "evidence": evidence, "action": action,
                         "result": result, "took_s": round(took, 1), "fault_at": fault_at, "incident": folder})
            if folder:
                incidents.record_result(folder, result, ended=ended)
            self.mem = Memory(ran=True)      # it ran the ranks: all of them ending by themselves is still DEAD
            self.log(f"RECOVERED from {verdict} in {took:.0f} s: READY" if result == "READY"
                     else f"RECOVERY {'STOPPED' if result.startswith('interrupted') else 'FAILED'} after {took:.0f} s: "
                          f"{result}")

    def blocked(self, now):
        """Why the watchdog must not act now, or None."""
        marker = self.gave_up()
        if marker:
            return f"it gave up ({marker.get('reason', '?')}); `doit launch` resumes it"
        holder = runlock.holder(self.state)
        if holder:
            return f"a doit run holds the run lock ({holder})"
        return None

    def publish(self, verdict, evidence):
        now = self.clock()
        past = self.incidents()
        status = {"schema": SCHEMA, "time": now, "verdict": verdict, "evidence": evidence,
                  "recoveries_in_window": len(self.recoveries_in_window(now, past)),
                  "max_recoveries": self.cfg.watchdog_max_recoveries, "gave_up": self.gave_up(),
                  "last_incident": past[-1] if past else None}
        write_atomic(self.path(names.WATCHDOG_STATUS), json.dumps(status, indent=1) + "\n")
        if self.cfg.metrics_dir:
            write_metrics(self.cfg.metrics_dir, verdict, sum(i.get("action") == "restart" for i in past),
                          bool(status["gave_up"]), now)

    def run(self):
        c = self.cfg
        self.log(f"watchdog started: every {c.watchdog_interval_s} s; a probe after {c.watchdog_stall_s} s without "
                 f"progress, wedged when it gets no token in {c.watchdog_probe_s} s; at most "
                 f"{c.watchdog_max_recoveries} recoveries per {c.watchdog_window_s // 60} min")
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                self.step()
            except Exception as err:  # noqa: BLE001 - the watchdog never dies from its own error
                self.log(f"error: {type(err).__name__}: {one_line(err, 300)}")
            self.stop.wait(max(1.0, c.watchdog_interval_s - (time.monotonic() - t0)))


def write_metrics(directory, verdict, recoveries, gave_up, now):
    """dsv41_watchdog.prom for node_exporter's textfile collector, through prometheus_client (imported
    here: only a watchdog with METRICS_DIR needs it)."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, write_to_textfile
    disable_created_metrics()           # no *_created series: the counter counts from the incidents file
    reg = CollectorRegistry()
    g = Gauge("dsv41_watchdog_verdict", "The watchdog's verdict (1 for the current one).", ["verdict"], registry=reg)
    for v in VERDICTS:
        g.labels(v).set(int(v == verdict))
    Counter("dsv41_watchdog_recoveries", "Recoveries the watchdog started.", registry=reg).inc(recoveries)
    Gauge("dsv41_watchdog_gave_up", "Whether the watchdog gave up (hands off until doit launch).",
          registry=reg).set(int(gave_up))
    Gauge("dsv41_watchdog_last_check_timestamp_seconds", "When the watchdog last looked.", registry=reg).set(now)
    os.makedirs(directory, exist_ok=True)
    write_to_textfile(os.path.join(directory, METRICS_FILE), reg)


def remove_metrics(directory):
    """A stopped watchdog's last state must not be shown as current: its textfile goes."""
    if directory:
        try:
            os.unlink(os.path.join(directory, METRICS_FILE))
        except FileNotFoundError:
            pass


def settings_file(state_dir):
    return names.state_path(state_dir, names.WATCHDOG_SETTINGS)


def load_settings(state_dir):
    """The Config launch resolved for the watchdog ($STATE_DIR/watchdog.json): neither the environment
    nor the checkout's conf/ is read, so only a `doit launch` (which restarts the watchdog when the file
    changes) changes what it does."""
    path = settings_file(os.path.expanduser(state_dir))
    try:
        with open(path) as f:
            data = json.load(f)["config"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserError(f"cannot read the watchdog's settings {path} ({err}): run `doit launch`") from None
    return from_resolved(data)


@cli
def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m dsv41.head.watchdog", description=__doc__.splitlines()[0])
    p.add_argument("--state-dir", required=True, help="the head's state dir (it holds watchdog.json)")
    a = p.parse_args(argv)
    w = Watchdog(load_settings(a.state_dir), log=lambda msg: print(msg, flush=True))

    def on_term(*_):         # also ends a recovery in progress: `doit stop` stops the watchdog first
        w.stop.set()
        raise SystemExit(0)
    signal.signal(signal.SIGTERM, on_term)
    try:
        w.run()
    finally:
        remove_metrics(w.cfg.metrics_dir)
        w.log("watchdog stopping")
    return 0


if __name__ == "__main__":
    sys.exit(main())
