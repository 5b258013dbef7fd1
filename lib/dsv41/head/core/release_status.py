"""The release history as `doit status` and `doit top` show it: one entry (the release in service,
the newest that failed after it, one rolling out) and its line, and the door they judge: the one the release
in service runs (as_served). The records are core.releases'."""
import dataclasses

from dsv41.errors import UserError, one_line
from dsv41.settings import layout
from dsv41.head.core.releases import (ROLLING_OUT, carrier_line, in_service, read_history, settings_of, short_id,
                                      unfinished, when)



def history_of(state_dir):
    """The history as core.releases.read_history() reads it, once for a command: (releases, the number in
    service), or the UserError saying why it cannot be read."""
    try:
        return read_history(state_dir)
    except UserError as err:
        return err


def as_served(cfg, history=None):
    """(cfg, None), or, when the release in service runs another layout than the settings say (`doit
    rollback` to a release recorded before the gateway, or with GATEWAY=0; another PORT), (cfg with the
    release's GATEWAY, PORT and ENGINE_PORT, the line saying so): the commands that judge or use what runs
    (status, top, stop, keys, smoke, bench, pi, monitoring) take its layout."""
    history = history_of(cfg.state_dir) if history is None else history
    if isinstance(history, UserError):
        return cfg, None                 # service_entry says why
    serving, _ = in_service(cfg.state_dir, history)
    try:
        ran = settings_of(serving, cfg) if serving else cfg
    except UserError as err:
        return cfg, f"{one_line(err, 300)}; judged by the settings"
    differs = [k for k in layout.SETTINGS if getattr(ran, k) != getattr(cfg, k)]
    if not differs:
        return cfg, None

    def shown(c):
        return ", ".join(f"{k.upper()}={int(getattr(c, k))}" for k in differs)
    return (dataclasses.replace(cfg, **{k: getattr(ran, k) for k in layout.SETTINGS}),
            f"release {serving.number} in service runs with {shown(ran)} (the settings say {shown(cfg)}): "
            "judged as it runs; `doit launch` applies the settings")


def _brief(r):
    return r and {"number": r.number, "state": r.shown_state, "began": r.time, "image": r.image,
                  "result": r.result, "failed_at": r.failed_at, "rolled_back_to": r.rolled_back_to}


def step_of(r):
    """The step an unfinished release is on, in words."""
    if r.state != ROLLING_OUT:
        return f"going back to release {r.back_to}"
    return "the ranks starting, then the hold" if r.started_at else "applying (the ranks not restarted yet)"


def service_entry(state_dir, watchdog=None, history=None):
    """What `doit status` and `doit top` show of the history: {"serving", "failed" (the newest that failed
    after it), "rolling_out" (an unfinished one, with its step, its carrier and who carries it on now)}
    (each a release's brief or None), or {"error": line}. watchdog: core.record.watchdog_entry() (whether
    it runs, who holds the run lock); history: history_of(state_dir), when the command read it already."""
    history = history_of(state_dir) if history is None else history
    if isinstance(history, UserError):
        return {"error": str(history)}
    serving, failed = in_service(state_dir, history)
    left = unfinished(history[0])
    entry = {"serving": _brief(serving), "failed": _brief(failed), "rolling_out": _brief(left)}
    if left:
        w = watchdog or {}
        entry["rolling_out"].update(step=step_of(left), carrier=left.carrier,
                                    carried=carrier_line(left, w.get("run_lock"), w.get("unit") == "active"))
    return entry


def service_line(e):
    """The entry as one line."""
    if "error" in e:
        return f"release: {e['error']}"
    s, f, u = e["serving"], e["failed"], e["rolling_out"]
    line = (f"release {s['number']} in service (began {when(s['began'])}, image {short_id(s['image'])})" if s
            else "release: none in service yet (`doit launch` records one)")
    if f:
        line += (f"; release {f['number']} failed at {when(f['failed_at'])}: {one_line(f['result'], 120)}"
                 + (f", rolled back to {f['rolled_back_to']}" if f["rolled_back_to"] else ""))
    if u:
        line += f"; release {u['number']} {u['state']} ({u.get('step', '?')}): {u.get('carried', '?')}"
    return line
