"""Releases: what ran on the cluster after each launch that changed it, kept on the head.

    $STATE_DIR/releases/<NNNN>/release.json   schema dsv41.release/2 (/1 still read), one per release (dir 0700, file 0600)

Each record is a core/release_record.py Release (what it holds, its states and the only moves between
them). The newest RELEASES_KEEP are kept, never the one in service nor the last good one.

A release changes state through transition() alone: each move checked against the state it leaves
(release_record.check_move), and recorded durably, fsync'd, before the step it names is taken. Whoever
holds the run lock carries an unfinished release on from the record alone (core/rollout.py carry_on():
the watchdog, or the next `doit launch` or `doit rollback`), since the record holds what that needs:
`back_to` (the last good release a failure goes back to), `deadline_s` and `started_at` (the readiness
wait's length and when the ranks began to restart: the deadline carries over), and `carrier` (who
carries it on now, their pid and since when). The silences of its restart name it (core/silences.py), so
whoever finishes it ends them.

How launch uses it, in order (the storage functions, at the end, are the only I/O):

    fields = record_fields(cfg, want, image_ids, checkpoint_on_disk(cfg), node_versions)
    history, fp = load_all(state_dir), fingerprint(fields)
    r = next_step(history, fp)   # a launch killed half-way: print r.line; "finish" goes on under
                                 # r.release.number (no begin); else finish(..., INTERRUPTED, r.line) first,
                                 # and "roll back" applies r.target as below
    refuse_flapping(history, fp, retry_failed, now)   # UserError when this is the release that just failed
    warn = checkpoint_warning(history, fields["checkpoint"])   # print it first when not None
    target = last_good(history, fields["checkpoint"])          # where a failure goes back to (None: nowhere)
    deadline = rollout_deadline_s(history, cfg.start_timeout_s, cfg.rollout_min_timeout_s)
    release = begin(state_dir, fields, cfg.releases_keep)      # BEFORE any node changes
    ... apply, wait for the API within `deadline`, hold ROLLOUT_HOLD_S ...
    finish(state_dir, release.number, GOOD, "ready, healthy for 60 s", startup_s=...)   # now in service
    or: finish(state_dir, release.number, FAILED, "dsv41-r1.service failed")   # recorded before going back
        then, unless ROLLBACK=0 or target is None: decide() and apply Desired(*recorded_state(target,
        key)) with target.image_ids on each node; once it serves: rolled_back(state_dir, release.number, target.number)

`doit status` and `doit top` show in_service(state_dir), and `doit releases` (head/releases.py) the records
and their text differences, through core/release_status.py.
Two releases are "the same" when their fingerprint is: image ids, units, files and settings.
"""
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import time

from dsv41 import names
from dsv41.errors import BadInput, UserError, one_line
from dsv41.head.core import statefiles
from dsv41.head.core.release_history import (RECORD, SCHEMA, folder, last_startup_s, load_all, load_one,
                                              read_history, root, serving_of)
from dsv41.head.core.release_record import (DOWN, FAILED, FAILURES, GOOD, INTERRUPTED, ROLLED_BACK, ROLLING_BACK,
                                            ROLLING_OUT, Release, check_move)
from dsv41.settings.resolved import absent, from_resolved, resolved
from dsv41.node.checkpoint_layout import MANIFEST

SAME = ("image_ids", "units", "files", "settings")          # what makes two releases the same


# ---- the record's content: pure ----------------------------------------------------------------------

def record_fields(cfg, want, image_ids, checkpoint, node_versions):
    """The fields of a release from launch's Config and desired state (core.desired.desired): the
    secret key file is named, not stored; the settings are config.resolved (no secret)."""
    secret = {names.SECRET_KEY}
    files = {node: {rel: [text, mode] for rel, (text, mode) in fs.items() if rel not in secret}
             for node, fs in want.files.items()}
    return _plain({"image": cfg.image, "image_ids": image_ids, "checkpoint": checkpoint, "settings": resolved(cfg),
                   "node_versions": node_versions, "units": want.units, "files": files,
                   "secret_files": {node: sorted(secret & set(fs)) for node, fs in want.files.items()
                                    if secret & set(fs)}})


def _plain(data):
    return json.loads(json.dumps(data))


def fingerprint(fields):
    """What makes two releases the same (image ids, units, files, settings), as one sha256; takes a
    Release or record_fields(). A setting at what a record without it means (resolved.absent: a setting
    declared since, at its default) does not count: a version that adds one makes no new release of it."""
    if isinstance(fields, Release):
        fields = dataclasses.asdict(fields)
    meant = _meant()
    same = {k: fields[k] for k in SAME}
    same["settings"] = {k: v for k, v in fields["settings"].items() if k not in meant or meant[k] != v}
    return hashlib.sha256(json.dumps(same, sort_keys=True).encode()).hexdigest()


@functools.cache
def _meant():
    return _plain(absent())


def _short(value, limit=60):
    return one_line(json.dumps(value) if not isinstance(value, str) else value, limit)


def short_id(image_id):
    return (image_id or "-").split(":")[-1][:12]


def changes(prev, new):
    """What differs from release `prev` (None: the first) to `new` (a Release or record_fields()), one
    line each, in `doit plan`'s words."""
    if prev is None:
        return ["first release"]
    p = dataclasses.asdict(prev) if isinstance(prev, Release) else prev
    n = dataclasses.asdict(new) if isinstance(new, Release) else new
    out = []
    if p["image"] != n["image"]:
        out.append(f"image {p['image']} -> {n['image']}")
    for node in sorted(set(p["image_ids"]) | set(n["image_ids"])):
        a, b = p["image_ids"].get(node), n["image_ids"].get(node)
        if a != b:
            out.append(f"image on {node} {short_id(a)} -> {short_id(b)}")
    if p["checkpoint"] != n["checkpoint"]:
        def ck(c):
            return f"{c.get('repo')}@{c.get('revision') or '-'} ({short_id(c.get('manifest_digest'))})"
        out.append(f"checkpoint {ck(p['checkpoint'])} -> {ck(n['checkpoint'])}")
    for what in ("units", "files"):
        for node in sorted(set(p[what]) | set(n[what])):
            a, b = p[what].get(node, {}), n[what].get(node, {})
            for name in sorted(set(a) | set(b)):
                if name not in a:
                    out.append(f"{name} on {node} added")
                elif name not in b:
                    out.append(f"{name} on {node} removed")
                elif a[name] != b[name]:
                    out.append(f"{name} changed on {node}")
    for key in sorted(set(p["settings"]) | set(n["settings"])):
        a, b = p["settings"].get(key), n["settings"].get(key)
        if a != b:
            out.append(f"{key.upper()} {_short(a)} -> {_short(b)}")       # as the setting is spelled
    for node in sorted(set(p["node_versions"]) | set(n["node_versions"])):
        a, b = p["node_versions"].get(node, {}), n["node_versions"].get(node, {})
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                out.append(f"{key} on {node} {a.get(key) or '-'} -> {b.get(key) or '-'}")
    return out or ["nothing"]


# ---- decisions: pure -------------------------------------------------------------------------------

def same_checkpoint(a, b):
    return a.get("repo") == b.get("repo") and a.get("manifest_digest") == b.get("manifest_digest")


def last_good(releases, checkpoint):
    """The rollback target: the newest good release on this checkpoint (the one on disk now); None when
    there is none (the first release, or every good one ran another checkpoint)."""
    return next((r for r in reversed(releases) if r.state == GOOD and same_checkpoint(r.checkpoint, checkpoint)),
                None)


def checkpoint_warning(releases, checkpoint):
    """One line when this launch runs a checkpoint other than the last good release's: a failure
    cannot go back past it. None otherwise (and for the first release)."""
    good = next((r for r in reversed(releases) if r.state == GOOD), None)
    if good is None or same_checkpoint(good.checkpoint, checkpoint):
        return None
    return (f"warning: this launch runs checkpoint {checkpoint.get('repo')}@{checkpoint.get('revision') or '-'}, "
            f"not release {good.number}'s {good.checkpoint.get('repo')}@{good.checkpoint.get('revision') or '-'}: "
            "a failure cannot be rolled back past the checkpoint")


def rollout_deadline_s(releases, start_timeout_s, min_timeout_s):
    """How long a rollout waits for the API: twice the last good release's start-up, at least
    min_timeout_s (ROLLOUT_MIN_TIMEOUT_MIN), at most start_timeout_s (START_TIMEOUT_MIN); the latter
    when no good release measured one."""
    startup = last_startup_s(releases)
    if startup is None:
        return start_timeout_s
    return min(start_timeout_s, max(min_timeout_s, 2 * startup))


def when(t):
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + "Z" if t else "-"


def _ago(s):
    return f"{s:.0f} s ago" if s < 120 else f"{s / 60:.0f} min ago" if s < 7200 else f"{s / 3600:.0f} h ago"


def flapping(releases, fp, now):
    """The line that refuses this launch when the newest release failed and this launch is the same
    release (fingerprint fp); None otherwise."""
    last = next((r for r in reversed(releases) if r.state in (GOOD, *FAILURES)), None)
    if last is None or last.state not in FAILURES or fingerprint(last) != fp:
        return None
    at = last.failed_at or last.time
    return (f"release {last.number} failed at {when(at)} ({_ago(now - at)}: {one_line(last.result, 160)}) "
            "and this launch is the same release: fix the cause, or `doit launch --retry-failed` to try it anyway")


def refuse_flapping(releases, fp, retry_failed, now):
    """UserError with flapping()'s line, unless retry_failed."""
    line = None if retry_failed else flapping(releases, fp, now)
    if line:
        raise UserError(line)


def unfinished(releases):
    """The release a rollout has not finished (rolling out, rolling back, or failed on its way back: being
    carried on, or left by a process that died), or None."""
    return next((r for r in reversed(releases) if r.unfinished), None)


@dataclasses.dataclass(frozen=True)
class NextStep:
    action: str                      # "go back", "finish", "roll back" or "replace"
    release: Release                 # the unfinished one
    target: Release | None           # "roll back": the release to go back to
    line: str                        # what to tell the user


def next_step(releases, fp=None):
    """The one decision about a release a dead process left unfinished (None: there is none), for launch
    (fp: the fingerprint of what it would run), `doit rollback` and the watchdog (fp None: as recorded).
    A way back is finished first, whoever asks ("go back"). A rollout is finished from its record when fp
    is None or is that release ("finish": no begin(), finish() it); "roll back" when fp is the release in
    service before it (record the unfinished one INTERRUPTED, which leaves the target in service, and apply
    it as recorded); "replace" otherwise (record it INTERRUPTED, then begin() a new release)."""
    r = unfinished(releases)
    if r is None:
        return None
    if r.state != ROLLING_OUT:
        return NextStep("go back", r, None, f"release {r.number} was left {r.shown_state}: its way back is "
                        "finished first")
    said = f"release {r.number} was interrupted half-way (began {when(r.time)})"
    if fp is None or fingerprint(r) == fp:
        return NextStep("finish", r, None, f"{said}: " + ("this launch finishes its rollout" if fp else
                                                          "its rollout is finished as recorded"))
    back = next((x for x in releases if x.number == r.changes_from and x.state == GOOD), None)
    if back is not None and fingerprint(back) == fp:
        return NextStep("roll back", r, back, f"{said}: this launch goes back to release {back.number} as recorded")
    return NextStep("replace", r, None, f"{said}: it is recorded as interrupted and this launch replaces it")


def recorded_state(release, key):
    """(units, files) to write on each node to run `release` exactly as recorded, in core.desired's
    shape (`Desired(*recorded_state(r, key))` is what decide() takes): its units and files, and the API
    key file where the release had one (`key`: the key itself, read now: it is never stored; or key(node) -> that
    node's key, with several serving groups). The image ids to run are release.image_ids."""
    files = {node: {rel: (text, mode) for rel, (text, mode) in fs.items()} for node, fs in release.files.items()}
    for node, rels in release.secret_files.items():
        for rel in rels:
            k = key(node) if callable(key) else key
            files.setdefault(node, {})[rel] = (f"{k}\n" if k else None, 0o600)
    return {node: dict(us) for node, us in release.units.items()}, files


def to_prune(releases, keep, serving):
    """The numbers beyond the newest `keep`, never the release in service (number `serving`), the newest
    good one, nor the newest that put one in service (release_history.serving_of reads it)."""
    good = next((r.number for r in reversed(releases) if r.state == GOOD), None)
    put = next((r.number for r in reversed(releases) if r.state in (GOOD, ROLLED_BACK)), None)
    return [r.number for r in releases[:max(0, len(releases) - max(1, keep))] if r.number not in (serving, good, put)]


# ---- storage: the only I/O ---------------------------------------------------------------------------

def _write(state_dir, release):
    statefiles.write_release(state_dir, f"{release.number:04d}", {"schema": SCHEMA, **dataclasses.asdict(release)})


def draft(history, serving, fields, now=None, **carry):
    """The release begin() would record (not written): its number, and what changed against the release in
    service (else the newest); carry: back_to, deadline_s, carrier."""
    prev = next((r for r in history if r.number == serving), history[-1] if history else None)
    fields = _plain(fields)
    return Release(number=history[-1].number + 1 if history else 1, time=time.time() if now is None else now,
                   state=ROLLING_OUT, changes=changes(prev, fields), changes_from=prev and prev.number,
                   **fields, **carry)


def begin(state_dir, fields, keep, now=None, **carry):
    """Record a new release "rolling out" (fields: record_fields(); carry: back_to, deadline_s, carrier);
    durable when it returns, so call it just before the first change on a node. Drops the oldest beyond
    `keep` (never the one in service or the last good one). -> the Release."""
    history = load_all(state_dir)
    serving = serving_of(history)
    release = draft(history, serving, fields, now, **carry)
    _write(state_dir, release)
    statefiles.forget_current(state_dir)     # an older version's pointer: the records say what serves
    for n in to_prune([*history, release], keep, serving):
        shutil.rmtree(folder(state_dir, n), ignore_errors=True)
    return release


def transition(state_dir, number, to, now=None, **fields):
    """Move release `number` to state `to`, checked against the state it leaves, with `fields`; durable
    (fsync'd) when it returns. GOOD makes it the release in service, ROLLED_BACK its rolled_back_to (the
    records say which: release_history.serving_of). FAILED
    records failed_at, every final state finished_at. -> the updated Release."""
    old = load_one(state_dir, number)
    if old is None:
        raise UserError(f"release {number} is not in {root(state_dir)}: `doit releases` lists them")
    check_move(old.state, to)
    now = time.time() if now is None else now
    stamps = {"failed_at": now} if to == FAILED else {}
    if to in (GOOD, INTERRUPTED, ROLLED_BACK, DOWN) or (to == FAILED and fields.get("back_to") is None):
        stamps["finished_at"] = now             # final: nothing is left to carry on
    release = dataclasses.replace(old, state=to, **stamps, **fields)
    _write(state_dir, release)              # GOOD or ROLLED_BACK: the commit point of what is in service
    return release


def finish(state_dir, number, state, result, startup_s=None, now=None, back_to=None, phases=None):
    """A rollout's end: GOOD (then it is the release in service), FAILED (back_to: where it goes back
    next, None when it goes nowhere) or INTERRUPTED; phases: its start-up's (core/startup.py to_record()).
    A rollout group by group that ends GOOD is good on every group it was restarting (one whose step a process
    that died left unrecorded, then carried on). -> the updated Release."""
    old = load_one(state_dir, number) if state == GOOD else None
    done = {g: "good" if where == "restarting" else where for g, where in ((old and old.groups) or {}).items()}
    return transition(state_dir, number, state, now, result=result, **({"groups": done} if done else {}),
                      **({"back_to": back_to} if state == FAILED else {}),
                      **({} if startup_s is None else {"startup_s": round(startup_s, 1)}),
                      **({} if phases is None else {"startup_phases": phases}))


def rolling_back(state_dir, number, now=None):
    """Failed release `number` starts going back to its back_to: recorded before any node changes."""
    return transition(state_dir, number, ROLLING_BACK, now)


def rolled_back(state_dir, number, target, now=None, phases=None):
    """The ranks of failed release `number` went back to release `target` and it serves again: both
    recorded (the failed one says where it went, and the going back's start-up phases; the target is in
    service). -> the failed Release."""
    return transition(state_dir, number, ROLLED_BACK, now, rolled_back_to=target,
                      **({} if phases is None else {"back_phases": phases}))


def down(state_dir, number, why, now=None):
    """Going back failed too: the cluster is down, and the record says why."""
    old = load_one(state_dir, number)
    return transition(state_dir, number, DOWN, now, result=f"{old.result}; going back failed: {why}" if old else why)


def carried(state_dir, number, by, now=None, **fields):
    """Who carries unfinished release `number` on from now (by: "doit launch", "dsv41-watchdog"), and the
    fields of the step it takes (started_at): recorded before that step."""
    now = time.time() if now is None else now
    return _update(state_dir, number, carrier={"by": by, "pid": os.getpid(), "since": now}, **fields)


def group_step(state_dir, number, group, where):
    """How far release `number` got with serving group `group` ("g<N>") in a rollout group by group: recorded
    before each group's restart and once it is good (or failed, or back)."""
    old = load_one(state_dir, number)
    return _update(state_dir, number, groups={**((old and old.groups) or {}), group: where})


def _update(state_dir, number, **changed):
    old = load_one(state_dir, number)
    if old is None:
        raise UserError(f"release {number} is not in {root(state_dir)}: `doit releases` lists them")
    release = dataclasses.replace(old, **changed)
    _write(state_dir, release)
    return release


def in_service(state_dir, read=None):
    """(the release in service or None, the newest release that failed after it or None): what `doit
    status` and `doit top` name; UserError (one line) when a record cannot be read. read: the history as
    read_history() gave it already (a command reads it once). A rollout under way (or left unfinished) is
    unfinished(load_all(state_dir))."""
    history, serving = read or read_history(state_dir)
    current = next((r for r in history if r.number == serving), None)
    failed = next((r for r in reversed(history) if r.state in FAILURES and r.number > (serving or 0)), None)
    return current, failed


def settings_of(release, cfg):
    """The Config a recorded release ran on (its API port, model name, key file, readiness; a release
    recorded before the gateway ran without one: settings.resolved reads old records). UserError naming
    the record when this version cannot read them (a newer version's, or a value of the wrong kind): a
    release never runs on today's settings instead."""
    try:
        return dataclasses.replace(from_resolved(release.settings), hf_token=cfg.hf_token)
    except BadInput as err:                 # settings.kinds.ConfigError: the record cannot be read
        raise UserError(f"{os.path.join(folder(cfg.state_dir, release.number), RECORD)}: release {release.number}'s "
                        f"settings cannot be read by this version ({err}): it is not run on today's settings; "
                        "`doit launch` records a release of them") from None


def checkpoint_on_disk(cfg):
    """The checkpoint in MODEL_DIR on the head: repo, revision (as configured: "" is the latest) and the
    sha256 of its manifest ("" when there is none yet)."""
    try:
        with open(os.path.join(cfg.model_dir, MANIFEST), "rb") as f:
            digest = "sha256:" + hashlib.sha256(f.read()).hexdigest()
    except FileNotFoundError:
        digest = ""
    return {"repo": cfg.hf_repo, "revision": cfg.revision, "manifest_digest": digest}
