"""dsv41-watchdog: a service on the head (installed by `doit launch` unless WATCHDOG=0) that brings a dead,
half-dead or wedged cluster back by itself, with the ordered restart launch performs (head rank stopped
first, workers started before the head, ready when a token comes back), at most
WATCHDOG_MAX_RECOVERIES times per WATCHDOG_WINDOW_MIN; past that it gives up and stays hands-off until
`doit launch`. It never acts on stale evidence, while a memory guard is tripped, while a doit run holds
the run lock, or while a start-up is within START_TIMEOUT_MIN.

Every WATCHDOG_INTERVAL_S it observes (core.observe.look) every node's rank unit and trip marker (one
probe per node), the API's /health and /metrics and, when no request runs or waits or when work has made no progress for
WATCHDOG_STALL_S (every progress signal of the recipe flat), a one-token probe with a deadline;
core.health.assess() turns that, the record and what it remembers into one Health (pure): the verdict
and the action the recovery gate allows (the n-th recovery inside the window waits WATCHDOG_BACKOFF_S x
2^(n-2) after the previous one; it keeps looking and publishing meanwhile). A recovery is the one ordered
restart (core.recovery.restart): the incident opened in the record and published as RECOVERING before
anything is stopped, its evidence, the containers killed, the ordered stop, the memory check,
the ordered start and the wait for a token. A restart whose nodes' memory did not come back starts nothing
(NEEDS_REBOOT) until it does. An incident a killed watchdog left open is closed as interrupted when the
next one starts, and counts in the budget. $STATE_DIR/watchdog.json holds the settings launch gave it;
what it last judged goes to the record (core.record) for status and top, and to dsv41_watchdog.prom in
METRICS_DIR (with the gateway, each client key's use to dsv41_gateway.prom), removed when it stops.

With several serving groups (GROUPS > 1) the service runs one watchdog process per group (supervise(), each
started again if it ends): each judges and restarts its own group alone, under its group's run lock, with its
records, incidents and metrics apart (Config.records: $STATE_DIR/groups/g<N>), its journal lines marked
`[group N]`; the first group's carries releases on and publishes the door's per-key use.

    python -m dsv41.head.watchdog --state-dir DIR [--group N]
"""
import argparse
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time

from dsv41.errors import UserError, cli, one_line
from dsv41.settings.resolved import from_resolved
from dsv41.head.core import incident_page, observe, record, recovery, rollout, runlock, statefiles
from dsv41.head.core.cluster import Cluster
from dsv41.head.core.health import RECOVERING, TOKEN, Health, Memory
from dsv41.head.core.watchdog_metrics import (GATEWAY_FILE, metrics_file, remove_metrics, write_gateway_metrics,
                                              write_metrics)
from dsv41.node import gateway as node_gateway

SCHEMA = "dsv41.watchdog/2"
BY = rollout.BY_WATCHDOG
LOOK_SLOW_S = 5     # a look still waiting after this (a probe with no token yet, a node slow to answer) is a sign


# ---- acting ---------------------------------------------------------------------------------------

class Watchdog:
    """One watchdog's loop over the serving group its Config holds (all the nodes with GROUPS=1; with more, one
    process each: Config.group_config). `whole`: the Config of every node, for the releases it carries on."""
    def __init__(self, cfg, log=print, clock=time.time, whole=None):
        self.cfg, self.log, self.clock = cfg, log, clock
        self.whole = whole or cfg
        self.cl = Cluster(cfg)
        self.mem = Memory()
        self.state = cfg.state_dir          # the head's: the releases, the gateway
        self.records = cfg.records          # its own: status, incidents, run lock (a group's folder with GROUPS > 1)
        self.first = cfg.scope in (None, 0)     # the one that carries releases on and publishes the gateway's use
        self.last = None            # (verdict, evidence) last logged
        self.gateway_problem = None  # why the gateway's per-key use could not be read, as last logged
        self.stuck = None           # (what, why, its alert's Event): a release it cannot carry on, paged
        self.published = None       # (Health, the other figures) last written to METRICS_DIR
        self.writing = threading.Lock()  # one writer of METRICS_DIR's file at a time (the look's timer, publish)
        self.stop = threading.Event()

    def say(self, verdict, evidence):
        """A journal line when the verdict (or its evidence's gist) changed."""
        key = (verdict, evidence.split(" (")[0])
        if key != self.last:
            self.log(f"{verdict}: {evidence}")
            self.last = key

    def look(self):
        """One observation (core.observe.look: the one-token probe when idle or stalled) and its Health. A
        token for a start of rank 0 no readiness wait saw generate (a recovery whose watchdog was killed)
        marks it ready, as that wait would have: `doit status`, which sends no probe, then agrees."""
        slow = threading.Timer(LOOK_SLOW_S, self.judging_meanwhile)
        slow.daemon = True
        slow.start()
        try:
            obs, h = observe.judged(self.cl, self.mem, probe="idle")
        finally:
            with self.writing:
                slow.cancel()
        if obs.probe == TOKEN and self.mem.ready_start is not None and (obs.ready_at or 0) < self.mem.ready_start:
            record.mark_ready(self.records, max(self.clock(), self.mem.ready_start))
        return obs, h

    def resume(self):
        """At start: an incident a watchdog killed mid-recovery left open is closed as interrupted (with
        what is seen now); it counts in the budget, and all ranks stopped is still DEAD (it ran them)."""
        _, h = self.look()
        for inc in record.close_interrupted(self.records, f"{h.verdict}: {h.evidence}"):
            self.log(f"closed incident {inc['id']} as interrupted: its recovery ended mid-way ({inc.get('phase')})")
            self.mem.ran = True
        self.publish(h)

    def step(self):
        """One interval: a release a dead process left unfinished is carried on first; else look, then do
        what the Health's action says (the gate is part of it)."""
        if self.carry_on():
            return None
        obs, h = self.look()
        if h.action in ("restart", "start"):
            self.recover(h)
        elif h.action == "give up":
            self.give_up(h, obs.time)
        else:
            self.say(h.verdict, h.evidence + (f"; not acting: {h.why}" if h.why and not h.action
                                               else f"; backing off: {h.why}" if h.action == "wait" else ""))
            self.publish(h)
            if h.word == "READY":
                self.open_door_left_closed()
        return h.verdict

    def open_door_left_closed(self):
        """The gateway's door left closed while the cluster is ready (a command that died after its drain,
        a door that could not be opened) opens, unless a command runs or `doit stop` closed it."""
        if runlock.holder(self.records):
            return
        try:
            line = recovery.open_left_closed(self.cl, self.log)
            if line:
                self.log(line)
        except UserError as err:
            self.say("UNKNOWN", f"the gateway cannot be asked: {one_line(err, 200)}")

    def give_up(self, h, now):
        reason = f"{h.verdict} again after {h.why}: {h.evidence}"
        record.set_gave_up(self.records, reason, now)
        inc = record.open_incident(self.records, verdict=h.verdict.value, evidence=h.evidence, fault_at=h.fault_at,
                                   node=h.node, action="gave up", by=BY, now=now)
        record.close_incident(self.records, inc, reason, ended=now)
        self.log(f"GAVE UP: {reason}; hands off until `doit launch`")
        self.last = None
        self.publish(h)

    def carry_on(self):
        """A release left rolling out or rolling back by a process that died (the run lock is free: its flock
        went with it) is finished from its record with launch's own code (core.rollout.carry_on), under the
        lock; it pages as a launch would. One whose record (or the history) this version cannot read is
        never run on today's settings: it pages that it needs a person (needs_person). Silences of ours
        whose release is final end (two scrapes from now). Only the first group's watchdog carries releases on
        (a release is every group's). -> True when it carried one on."""
        if not self.first:
            return False
        try:
            history, n = rollout.next_step(self.state)
        except UserError as err:            # the next command names the file; the watchdog goes on
            self.needs_person("the release history", one_line(err, 300))
            return False
        left = n and n.release              # carried on as recorded (core.releases.next_step), whatever its state
        if left is not None and not runlock.holder(self.state):
            try:
                rollout.rel.settings_of(left, self.whole)     # a record this version cannot read is never run
            except UserError as err:
                self.needs_person(f"release {left.number}", one_line(err, 300))
                return False
        self.needs_person(None, None)
        if left is None:
            line = incident_page.end_final_silences(self.whole, history)
            if line:
                self.log(line)
            return False
        if runlock.holder(self.state):      # its carrier lives: it waits, as for any doit run
            return False
        try:
            runlock.take(self.state, f"{BY}: carrying release {left.number} on")
        except UserError:
            return False
        by = (left.carrier or {}).get("by", "a doit run")
        self.log(f"release {left.number} was left {left.shown_state} by {by}, which ended: carrying it on")
        self.last = None
        now = self.clock()
        pager = self.alert("carry-on-alert", lambda ends: incident_page.page_carry_on(
            self.whole, left.number, left.shown_state, by, now, ends), now)
        try:
            rollout.carry_on(self.whole, left, BY)
            self.log(f"release {left.number} carried on: good and in service")
        except (rollout.RolledBack, rollout.Down, UserError) as err:
            self.log(f"release {left.number} carried on: {one_line(err, 400)}")
        finally:
            pager.set()
            runlock.release()
            self.mem = Memory(ran=True)
            self.publish_after()
        return True

    def needs_person(self, what, why):
        """A release it cannot carry on (what: "release N" or "the release history"; why: the line naming
        the file): said once in the journal and paged as one alert (core.incident_page) for as long as it
        lasts; nothing on a node is touched for it. (None, None): it can again, and the alert resolves."""
        if self.stuck is not None and self.stuck[:2] != (what, why):
            self.stuck[2].set()
            self.log(f"{self.stuck[0]}: no longer needs a person")
            self.stuck = None
        if what is not None and self.stuck is None:
            self.log(f"NEEDS A PERSON: {what} cannot be carried on: {why}")
            now = self.clock()
            post = lambda ends: incident_page.page_needs_person(self.cfg, what, why, now, ends)   # noqa: E731
            self.stuck = (what, why, self.alert("needs-a-person", post, now))

    def recover(self, h):
        """Under the run lock: the one ordered restart (core.recovery.restart), RECOVERING published
        before anything is stopped and at each step."""
        try:
            runlock.take(self.records, "dsv41-watchdog recovery")
        except UserError:                   # a launch restarting the ranks, say: it carries its own check
            self.say(h.verdict, f"{h.evidence}; not acting: the run lock is held "
                                f"({runlock.holder(self.records) or 'just now'})")
            self.publish(h)
            return
        try:
            n = rollout.next_step(self.state)[1]
        except UserError as err:            # an unreadable history never stops a recovery
            self.log(f"warning: {one_line(err, 200)}")
            n = None
        if n is not None:                   # begun since this look: carried on at the next, never healed
            runlock.release()
            self.say(h.verdict, f"{h.evidence}; not acting: release {n.release.number} is unfinished")
            self.publish(h)
            return
        self.log(f"{h.why}: starting the ranks ({h.verdict}: {h.evidence})" if h.action == "start" else
                 f"INCIDENT {h.verdict}: {h.evidence}; saving the evidence, then restarting the ranks in order ({h.why})")
        self.last = None
        t0 = self.clock()
        inc = None

        pager = None

        def on_phase(i):
            nonlocal inc, pager
            if pager is None and i["open"]:
                pager = self.paging(i)       # the incident pages from its start, however short it is
            inc = i
            if i["open"]:
                self.publish(Health(RECOVERING, (f"recovering from {h.verdict}: {i['phase']}",), h.node, h.fault_at,
                                    recovering=i))
        try:
            recovery.restart(self.cl, fault=h, by=BY, log=self.log, on_phase=on_phase, clock=self.clock)
        except UserError:
            pass                    # the incident has the result
        finally:
            runlock.release()
            self.mem = Memory(ran=True)      # it ran the ranks: all of them ending by themselves is still DEAD
            if pager is not None:
                pager.set()                 # its thread posts the resolve
            took = self.clock() - t0
            result = (inc or {}).get("result", "?")
            self.log(f"RECOVERED from {h.verdict} in {took:.0f} s: READY" if result == "READY"
                     else f"RECOVERY {'STOPPED' if result.startswith('interrupted') else 'FAILED'} after {took:.0f} s: "
                          f"{result}")
            self.publish_after()

    def paging(self, inc):
        """The incident's alert (core.incident_page.page_incident) from the recovery's start until the
        returned Event is set."""
        return self.alert("incident-alert", lambda ends: incident_page.page_incident(self.cfg, inc, ends),
                          inc["started"])

    def alert(self, name, post, started):
        """An alert of the watchdog's own, when monitoring is on (METRICS_DIR): post(ends) -> a line, called
        now and every RESEND_S on a thread until the returned Event is set, then once more to resolve it as
        soon as it may (a firing alert's end cannot be moved earlier, so the resolve waits for a group wait
        and a scrape past its start). The first line is logged, and any other that differs from the last."""
        done, said = threading.Event(), [None]

        def send(ended=False):
            if self.cfg.metrics_dir:
                line = post(incident_page.alert_ends(self.cfg, started, self.clock(), ended))
                if line != said[0]:
                    self.log(line)
                    said[0] = line

        def resend():
            while not done.wait(incident_page.RESEND_S):
                send()
            left = incident_page.alert_ends(self.cfg, started, self.clock(), ended=True) - self.clock()
            if 0 < left < 3600:
                time.sleep(left)
            send(ended=True)
        send()
        threading.Thread(target=resend, name=name, daemon=True).start()
        return done

    def publish_after(self):
        try:
            self.publish(self.look()[1])
        except Exception as err:  # noqa: BLE001 - the next interval publishes again
            self.log(f"error: {type(err).__name__}: {one_line(err, 300)}")

    def judging_meanwhile(self):
        """A look that has not ended in LOOK_SLOW_S (its probe waits for a token, a node is slow to answer) is
        a sign the watchdog has not ruled on: published as judging at once, so that no symptom alert pages
        before the verdict does, even while that look waits out WATCHDOG_PROBE_S."""
        with self.writing:
            if self.published is not None and self.cfg.metrics_dir and not slow_ended(threading.current_thread()):
                h, args = self.published
                write_metrics(self.cfg.metrics_dir, dataclasses.replace(h, judging=True), *args)

    def publish(self, h):
        now = self.clock()
        past = record.incidents(self.records)
        restarts = [i for i in past if i.get("action") == record.RESTART]
        inside = [i for i in restarts if now - i["started"] < self.cfg.watchdog_window_s]
        status = {"schema": SCHEMA, "time": now, "verdict": h.verdict.value, "evidence": h.evidence,
                  "health": h.as_json(), "recoveries_in_window": len(inside),
                  "max_recoveries": self.cfg.watchdog_max_recoveries, "gave_up": record.gave_up(self.records),
                  "last_incident": past[-1] if past else None}
        record.publish_status(self.records, status)
        if self.cfg.metrics_dir:
            ends = [i["ended"] for i in restarts if i.get("ended")]
            args = (len(restarts), bool(status["gave_up"]), now, max(ends, default=0), record.last_startup(self.records),
                    self.cfg.scope)
            with self.writing:
                write_metrics(self.cfg.metrics_dir, h, *args)
                self.published = (h, args)
            if self.cfg.layout.door and self.first:
                self.publish_gateway()

    def publish_gateway(self):
        """dsv41_gateway.prom from the gateway's stick table; a table that cannot be read removes it (no stale
        figures), is logged when that changes, and never stops the watchdog."""
        try:
            write_gateway_metrics(self.cfg.metrics_dir, node_gateway.usage())
            problem = None
        except Exception as err:  # noqa: BLE001 - the next interval tries again
            problem = f"the gateway's per-key use cannot be read: {type(err).__name__}: {one_line(err, 200)}"
            remove_metrics(self.cfg.metrics_dir, (GATEWAY_FILE,))
        if problem != self.gateway_problem:
            self.log(problem or "the gateway's per-key use is read again")
            self.gateway_problem = problem

    def run(self):
        c = self.cfg
        self.log(f"watchdog started: every {c.watchdog_interval_s} s; a probe after {c.watchdog_stall_s} s without "
                 f"progress, wedged when it gets no token in {c.watchdog_probe_s} s; at most "
                 f"{c.watchdog_max_recoveries} recoveries per {c.watchdog_window_s // 60} min")
        first = True
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                if first:
                    self.resume()
                    first = False
                self.step()
            except Exception as err:  # noqa: BLE001 - the watchdog never dies from its own error
                self.log(f"error: {type(err).__name__}: {one_line(err, 300)}")
            self.stop.wait(max(1.0, c.watchdog_interval_s - (time.monotonic() - t0)))


def slow_ended(timer):
    """A look's timer (threading.Timer) cancelled since it fired: its look ended, so it writes nothing."""
    return isinstance(timer, threading.Timer) and timer.finished.is_set()


def load_settings(state_dir):
    """The Config launch resolved for the watchdog ($STATE_DIR/watchdog.json): neither the environment
    nor the checkout's conf/ is read, so only a `doit launch` (which restarts the watchdog when the file
    changes) changes what it does."""
    state_dir = os.path.expanduser(state_dir)
    return from_resolved(statefiles.watchdog_settings(state_dir))


def supervise(cfg, argv, log, stop):
    """With GROUPS > 1: one watchdog process per serving group (argv + --group N), each judging and restarting its
    group alone under its own run lock; one that ends by itself is started again. Returns when stop is set, its
    processes ended and their textfiles gone (one ended before it could remove its own)."""
    procs = {}
    while not stop.is_set():
        for i in range(cfg.groups):
            p = procs.get(i)
            if p is not None and p.poll() is None:
                continue
            if p is not None:
                log(f"group {i}'s watchdog ended (exit {p.returncode}): started again")
            procs[i] = subprocess.Popen([*argv, "--group", str(i)])
        stop.wait(2)
    for p in procs.values():
        p.terminate()
    for p in procs.values():
        p.wait()
    remove_metrics(cfg.metrics_dir, tuple(metrics_file(i) for i in range(cfg.groups)) + (GATEWAY_FILE,))


@cli
def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m dsv41.head.watchdog", description=__doc__.splitlines()[0])
    p.add_argument("--state-dir", required=True, help="the head's state dir (it holds watchdog.json)")
    p.add_argument("--group", type=int, help="watch only this serving group (GROUPS > 1: started by the watchdog)")
    a = p.parse_args(argv)
    whole = load_settings(a.state_dir)
    stop = threading.Event()
    if whole.groups > 1 and a.group is None:
        def on_term_all(*_):
            stop.set()
        signal.signal(signal.SIGTERM, on_term_all)
        supervise(whole, [sys.executable, "-m", "dsv41.head.watchdog", "--state-dir", a.state_dir],
                  lambda msg: print(msg, flush=True), stop)
        return 0
    if a.group is not None and not 0 <= a.group < whole.groups:
        raise UserError(f"--group {a.group}: there are {whole.groups} group(s), 0 to {whole.groups - 1}")
    cfg = whole if a.group is None else whole.group_config(a.group)
    tag = "" if cfg.scope is None else f"[group {cfg.scope}] "
    w = Watchdog(cfg, log=lambda msg: print(tag + msg, flush=True), whole=whole)

    def on_term(*_):         # also ends a recovery in progress: `doit stop` stops the watchdog first
        w.stop.set()
        raise SystemExit(0)
    signal.signal(signal.SIGTERM, on_term)
    try:
        w.run()
    finally:
        remove_metrics(w.cfg.metrics_dir, (metrics_file(cfg.scope),) + ((GATEWAY_FILE,) if w.first else ()))
        w.log("watchdog stopping")
    return 0


if __name__ == "__main__":
    sys.exit(main())
