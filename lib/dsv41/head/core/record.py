"""The record: everything the watchdog and launch keep on the head between runs, what it means (its files
are read and written, their shapes checked, by core/statefiles.py).

    $STATE_DIR/ready.json             when a readiness wait last saw a token (the head's clock)
    $STATE_DIR/startup.json           the last start-up of the ranks: its kind, phases and whole (core/startup.py)
    $STATE_DIR/needs-reboot.json      a restart stopped: a node's memory did not come back ({time, line})
    $STATE_DIR/watchdog.gaveup        the watchdog gave up: hands off until `doit launch` ({time, reason})
    $STATE_DIR/watchdog.status.json   what the watchdog last judged (for status and top)
    $STATE_DIR/incidents.jsonl        the incidents, one event a line: "open" before anything is done,
                                      "phase" as a recovery moves on, "close" when it ended

An incident is opened before its evidence is saved or anything is stopped, so a watchdog killed at any
point of a recovery leaves it open: the next watchdog closes it as interrupted (close_interrupted) and
counts it in the budget. Each line is appended and fsync'd; a torn last line is skipped. Lines of
earlier versions (one line per ended incident, no "event") read as closed incidents."""
import os
import time

from dsv41 import names
from dsv41.head.core import runlock, statefiles
from dsv41.head.core.health import Record

RESTART = "restart"            # the watchdog's restarts: what its budget and backoff count


# ---- markers ------------------------------------------------------------------------------------------

def mark_ready(state_dir, now=None):
    """A readiness wait saw a token: an engine that stops generating after this is a fault, not a start-up."""
    try:
        statefiles.mark_ready(state_dir, time.time() if now is None else now)
    except (OSError, statefiles.BadStateFile):     # a mark it cannot write never fails the wait
        pass


def ready_at(state_dir, problems=None):
    """When a readiness wait last saw a token, or None (problems: statefiles.seen)."""
    return statefiles.seen(problems, statefiles.ready_at, state_dir)


def set_startup(state_dir, doc):
    """The last start-up's phases ({"time", "kind", "of", "phases", "total"}); one that cannot be written
    never fails the start-up."""
    try:
        statefiles.set_startup(state_dir, doc)
    except (OSError, statefiles.BadStateFile):
        pass


def last_startup(state_dir, problems=None):
    """The last start-up's phases as set_startup wrote them, or None (problems: statefiles.seen)."""
    return statefiles.seen(problems, statefiles.last_startup, state_dir)


def needs_reboot(state_dir):
    """The NEEDS_REBOOT marker ({"time", "line"}) or None."""
    return statefiles.needs_reboot(state_dir)


def set_needs_reboot(state_dir, line, now=None):
    statefiles.set_needs_reboot(state_dir, line, time.time() if now is None else now)


def clear_needs_reboot(state_dir):
    return statefiles.clear_needs_reboot(state_dir)


def gave_up(state_dir):
    """The watchdog's gave-up marker ({"time", "reason"}) or None."""
    return statefiles.gave_up(state_dir)


def set_gave_up(state_dir, reason, now):
    statefiles.set_gave_up(state_dir, reason, now)


def clear_gave_up(state_dir):
    return statefiles.clear_gave_up(state_dir)


def watchdog_status(state_dir):
    """What the watchdog last published, or {}."""
    return statefiles.watchdog_status(state_dir)


def publish_status(state_dir, doc):
    statefiles.publish_status(state_dir, doc)


def watchdog_entry(cfg, head, problems=None):
    """The watchdog's unit state (head: the head's state.NodeState, None when unknown) and what it
    last saw (watchdog.status.json on the head; problems: statefiles.seen)."""
    unit = head.unit(names.WATCHDOG_UNIT) if head is not None else None
    entry = {"enabled": cfg.watchdog, "unit": (unit.active or "not installed") if unit and unit.installed else "not installed"}
    entry.update(statefiles.seen(problems, watchdog_status, cfg.records, default={}))    # a group's: its own
    entry["run_lock"] = statefiles.seen(problems, runlock.holder, cfg.records)    # "pid N: what", or None
    return entry


def watchdog_line(w):
    """What the watchdog is doing, from its unit and its status file (the setting only adds a note)."""
    running = w["unit"] == "active"
    if not running and not w["enabled"]:
        return "watchdog: off (WATCHDOG=0)"
    seen = (f", saw {w['verdict']} {time.time() - w['time']:.0f} s ago: {w['evidence']}"
            if running and "verdict" in w else "")
    line = f"watchdog: {w['unit']}{seen}" + ("" if w["enabled"] else " (WATCHDOG=0: the next launch stops it)")
    if w.get("gave_up"):
        line += f"; GAVE UP ({w['gave_up'].get('reason', '?')}): hands off until `doit launch`"
    last = w.get("last_incident")
    if last:
        line += (f"; last incident {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(last['started']))}: "
                 f"{last.get('verdict')}, {last.get('action')}, {last.get('result') or 'under way'}"
                 + (f" ({last['took_s']:.0f} s)" if last.get("took_s") is not None else ""))
    return line


# ---- incidents ----------------------------------------------------------------------------------------

def incident_id(verdict, now, taken=()):
    """The incident's name, also its evidence folder's: <UTC time>-<verdict>[-N]."""
    base = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now)) + "-" + verdict
    n, name = 1, base
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    return name


def _append(state_dir, event):
    statefiles.append_incident_event(state_dir, event)


def open_incident(state_dir, *, verdict, evidence, fault_at, node=None, action=RESTART, by="dsv41-watchdog",
                  now=None):
    """Record an incident before anything is done about it; -> the incident (a dict with its "id")."""
    now = time.time() if now is None else now
    inc = {"event": "open", "id": incident_id(verdict, now, {i["id"] for i in incidents(state_dir)}),
           "started": now, "verdict": verdict, "evidence": evidence, "fault_at": fault_at, "node": node,
           "action": action, "by": by, "pid": os.getpid(), "phase": "saving the evidence"}
    _append(state_dir, inc)
    return _fold({}, inc)


def set_phase(state_dir, inc, phase, **fields):
    """What the recovery does now (and fields learned on the way: its folder); -> the updated incident."""
    _append(state_dir, {"event": "phase", "id": inc["id"], "phase": phase, **fields})
    return {**inc, "phase": phase, **fields}


def close_incident(state_dir, inc, result, ended=None):
    """The incident's end: its result and when it ended; -> the closed incident."""
    ended = time.time() if ended is None else ended
    event = {"event": "close", "id": inc["id"], "result": result, "ended": ended,
             "took_s": round(ended - inc["started"], 1)}
    _append(state_dir, event)
    return _fold(dict(inc), event)


def _fold(inc, event):
    inc.update({k: v for k, v in event.items() if k != "event"})
    inc["open"] = event.get("event") in ("open", "phase") if "event" in event else False
    return inc


def incidents(state_dir):
    """Every incident, oldest first, its events folded (open: not closed yet)."""
    return fold(statefiles.incident_lines(state_dir), names.state_path(state_dir, names.INCIDENTS))


def fold(lines, file=names.INCIDENTS):
    """incidents.jsonl's lines as incidents, oldest first: one dict each, "open" True until it closed
    ("result" is "" while open). A torn line (a crash while writing) is skipped; one of another shape is
    statefiles.BadStateFile."""
    by_id, order = {}, []
    for n, event in statefiles.incident_events(lines, file):
        key = event.get("id") or f"line-{n - 1}"          # an earlier version's line: one closed incident
        if key not in by_id:
            by_id[key], _ = {"id": key, "result": ""}, order.append(key)
        _fold(by_id[key], event)
    return [by_id[k] for k in order]


def live(inc, lock):
    """Is the open incident's process the one holding the run lock ("pid N: ...")?"""
    return bool(lock) and lock.startswith(f"pid {inc.get('pid')}:")


def open_incidents(state_dir):
    return [i for i in incidents(state_dir) if i["open"]]


def close_interrupted(state_dir, seen, now=None):
    """Close every open incident whose process no longer runs its recovery as interrupted, saying what is
    seen now; -> those closed."""
    lock = runlock.holder(state_dir)
    return [close_incident(state_dir, inc, f"interrupted: the recovery's process ended mid-way ({inc.get('phase')}); "
                                           f"seen now: {seen}", ended=now)
            for inc in open_incidents(state_dir) if not live(inc, lock)]


def recoveries(state_dir, now=None, known=None):
    """(started, ended) of the watchdog's restarts, open ones included (ended: now), for the budget
    (known: the incidents when already read)."""
    now = time.time() if now is None else now
    return [(i["started"], i.get("ended") or now) for i in (incidents(state_dir) if known is None else known)
            if i.get("action") == RESTART and "started" in i]


def view(state_dir, now=None, problems=None):
    """What the record holds that bears on the cluster's health (core.health.Record). problems: None,
    a file that cannot be read is statefiles.BadStateFile; a list, it is said there and read as absent
    (statefiles.seen)."""
    lock = statefiles.seen(problems, runlock.holder, state_dir)
    known = statefiles.seen(problems, incidents, state_dir, default=[])
    running = [i for i in known if i["open"] and live(i, lock)]
    return Record(recovering=running[-1] if running else None,
                  needs_reboot=statefiles.seen(problems, needs_reboot, state_dir),
                  gave_up=statefiles.seen(problems, gave_up, state_dir), lock=lock,
                  recoveries=tuple(recoveries(state_dir, now, known)))
