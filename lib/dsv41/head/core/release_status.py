"""The release history as people see it, in one place: `doit releases` (the list, one release with its
text difference), and what `doit status` and `doit top` show (one entry: the release in service, the
newest that failed after it, one rolling out, who carries it on) with the door they judge, the one the
release in service runs (as_served). The records are core.releases'."""
import dataclasses
import difflib
import re

from dsv41.errors import UserError, one_line
from dsv41.head.core import startup
from dsv41.head.core.releases import (ROLLING_OUT, in_service, read_history, settings_of, short_id,
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
    ran_with, said = ran.layout.settings(), cfg.layout.settings()
    differs = [k for k in ran_with if ran_with[k] != said[k]]
    if not differs:
        return cfg, None

    def shown(values):
        return ", ".join(f"{k.upper()}={int(values[k])}" for k in differs)
    return (dataclasses.replace(cfg, **ran_with),
            f"release {serving.number} in service runs with {shown(ran_with)} (the settings say {shown(said)}): "
            "judged as it runs; `doit launch` applies the settings")


def carrier_line(release, holder, watchdog_on):
    """Who carries an unfinished release on, for `doit status`: holder is the run lock's ("pid N: ...",
    None when free), watchdog_on whether dsv41-watchdog runs."""
    c = release.carrier or {}
    who = f"`{c['by']}` pid {c['pid']}" if c.get("by", "").startswith("doit") else c.get("by") or "a doit run"
    since = f" since {when(c['since'])}" if c.get("since") else ""
    if holder:
        return (f"carried on by {who}{since}" if holder.startswith(f"pid {c.get('pid')}:")
                else f"the run lock is held ({holder}): that run carries it on")
    if watchdog_on:
        return f"left by {who}{since}, which ended: the watchdog carries it on at its next look"
    return (f"left by {who}{since}, which ended; the watchdog is not running (WATCHDOG=0, or `doit stop`): "
            "the next `doit launch` or `doit rollback` carries it on")


def _brief(r):
    return r and {"number": r.number, "state": r.shown_state, "began": r.time, "image": r.image,
                  "result": r.result, "failed_at": r.failed_at, "rolled_back_to": r.rolled_back_to,
                  "groups": r.groups}


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
        if u.get("groups"):
            line += " [" + ", ".join(f"{g} {where}" for g, where in sorted(u["groups"].items())) + "]"
    return line


# ---- `doit releases`: the list, one release, its text difference ---------------------------------

def _image(r):
    m = re.search(r"@sha256:([0-9a-f]{12})", r.image)
    return m.group(1) if m else short_id(next(iter(r.image_ids.values()), None))


def _secs(s):
    return "-" if s is None else f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def list_lines(history, serving):
    if not history:
        return ["no releases yet: `doit launch` records one each time it changes what runs"]
    lines = [f"  {'N':>4}  {'when (UTC)':<20}  {'image':<12}  {'revision':<12}  {'start-up':>8}  "
             f"{'result':<28}  changes"]
    for r in history:
        mark = "*" if r.number == serving else " "
        more = f" (+{len(r.changes) - 1} more)" if len(r.changes) > 1 else ""
        first = r.changes[0] if r.changes else "-"
        lines.append(f"{mark} {r.number:>4}  {when(r.time):<20}  {_image(r):<12}  "
                     f"{one_line(r.checkpoint.get('revision') or 'latest', 12):<12}  {_secs(r.startup_s):>8}  "
                     f"{one_line(r.shown_state, 28):<28}  {one_line(first, 80)}{more}")
    lines.append("* in service" if serving is not None else "none in service")
    return lines


def show_lines(history, serving, number):
    by = {r.number: r for r in history}
    if number not in by:
        raise UserError(f"no release {number}: {len(history)} kept in the release history "
                        "(`doit releases` lists them)")
    r = by[number]
    ck = r.checkpoint
    out = [f"release {r.number}: {r.shown_state}" + (" (in service)" if r.number == serving else ""),
           f"  began       {when(r.time)}   finished {when(r.finished_at)}   start-up {_secs(r.startup_s)}",
           f"  result      {r.result or '-'}" + (f"   failed at {when(r.failed_at)}" if r.failed_at else "")]
    if r.startup_phases:                    # an older record has none
        out += startup.lines(r.startup_phases)
    if r.back_phases:
        out += startup.lines(r.back_phases, f"back to {r.rolled_back_to}")
    if r.groups:                            # rolled group by group
        out.append("  groups      " + ", ".join(f"{g} {where}" for g, where in sorted(r.groups.items())))
    out.append(f"  image       {r.image}")
    out += [f"    on {node:<10} {image_id}" for node, image_id in sorted(r.image_ids.items())]
    out.append(f"  checkpoint  {ck.get('repo')}@{ck.get('revision') or 'latest'}   "
               f"manifest {ck.get('manifest_digest') or '-'}")
    for node, v in sorted(r.node_versions.items()):
        out.append(f"  {node:<11} kernel {v.get('kernel') or '-'}, driver {v.get('driver') or '-'}, "
                   f"docker {v.get('docker') or '-'}")
    for node in sorted(set(r.units) | set(r.files)):
        out.append(f"  {node:<11} units {', '.join(sorted(r.units.get(node, {}))) or '-'}; "
                   f"files {', '.join(sorted(r.files.get(node, {}))) or '-'}")
    for node, secret in sorted(r.secret_files.items()):
        out.append(f"  {node:<11} {', '.join(secret)}: written by launch, not stored here")
    out.append("changes" + (f" against release {r.changes_from}:" if r.changes_from else ":"))
    out += [f"  {line}" for line in r.changes]
    prev = by.get(r.changes_from)
    if prev is not None:
        out += text_diff(prev, r)
    elif r.changes_from:
        out.append(f"  (release {r.changes_from} is no longer kept: no text difference)")
    return out


def text_diff(prev, new):
    """Unified diffs of every unit and file that differs from `prev` to `new` (Releases)."""
    out = []
    for what in ("units", "files"):
        a_all, b_all = getattr(prev, what), getattr(new, what)
        for node in sorted(set(a_all) | set(b_all)):
            a, b = a_all.get(node, {}), b_all.get(node, {})
            for name in sorted(set(a) | set(b)):
                ta, tb = a.get(name), b.get(name)
                if what == "files":
                    ta, tb = ta and ta[0], tb and tb[0]
                if ta != tb:
                    out += difflib.unified_diff((ta or "").splitlines(), (tb or "").splitlines(),
                                                f"{prev.number}/{node}/{name}", f"{new.number}/{node}/{name}",
                                                lineterm="")
    return out
