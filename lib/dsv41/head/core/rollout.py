"""A checked rollout: how `doit launch` and `doit rollback` change what runs, and go back when it fails.

    ro = prepare(cfg, want, states, image_ids, retry_failed)   # before anything changes: refuses the
                                        # release that just failed, says what cannot be undone
    run(cl, ro, want, steps, states, ...)   # begins the release, applies it, ready within the deadline,
                                            # healthy for the hold

A release fails when a rank unit fails, when it is not ready within its deadline (twice the last good
release's start-up, within ROLLOUT_MIN_TIMEOUT_MIN..START_TIMEOUT_MIN), or when it does not stay healthy
for ROLLOUT_HOLD_S. It is recorded failed first; then, unless ROLLBACK=0 or there is nothing to go back
to, go_back() restarts the ranks on the last good release exactly as recorded (its units, files and
image id, checked on every node first), with an incident and the failed ranks' evidence, and ends
RolledBack (exit 10: serving again) or Down (exit 11: the way back failed too; it never loops). A
rollout that only rewrote files without restarting the ranks is recorded, not held. The release record
and its states are core.releases.

Every step is recorded before it is taken, so the process doing it may die at any point: carry_on()
finishes an unfinished release from its record alone (never conf/), under the run lock, with this same
code. The watchdog does it at its next look once the process that held the lock is gone (it is never
stopped for a rollout: the lock is the hand-over, and apply() starts it before the ranks restart); with
WATCHDOG=0 the next `doit launch` or `doit rollback` does.

apply() takes core.decide's steps on the nodes: state files written, units installed, the memory guards
started or reloaded, the watchdog started or restarted (never by itself), the ranks restarted through the
one ordered restart (core.recovery.restart), the exporters started."""
import contextlib
import dataclasses
import os
import time

from dsv41 import names
from dsv41.errors import UserError, one_line
from dsv41.head.core import exporter, observe, progress, ranks, recovery, releases as rel, silences
from dsv41.head.core.cluster import Cluster, engine_key, group_key, say
from dsv41.head.core.decide import SERVICE_ONLY_FILES, SERVICES, Desired, Kind, decide, owed_restarts
from dsv41.head.core.unit_install import control, install_unit, service_step


BY_WATCHDOG = names.WATCHDOG_BY     # who carries a release on when its process died


class RolledBack(UserError):
    """The change failed and the last good release serves again."""
    exit_code = 10
    exit_now = True


class Down(UserError):
    """The change failed and going back failed too: the cluster is down."""
    exit_code = 11
    exit_now = True


@dataclasses.dataclass
class Rollout:
    release: rel.Release | None     # the release rolled out (None: what runs is the one in service, or it
                                    # is begun by run(), from `fields`, just before the first change)
    target: rel.Release | None      # where a failure goes back to (None: nowhere)
    deadline: tuple                 # (seconds, what sets them) for the readiness wait
    resumed: bool = False           # a release a dead process left unfinished, carried on now
    lines: tuple = ()               # what to say before anything changes
    fields: dict | None = None      # the release to begin (core.releases.record_fields())
    rollback_of: int | None = None  # `doit rollback`: the release whose state it applies again


def deadline(history, cfg):
    """(seconds, what sets them): twice the last good start-up, within the floor and START_TIMEOUT_MIN."""
    s = rel.rollout_deadline_s(history, cfg.start_timeout_s, cfg.rollout_min_timeout_s)
    good = next((r for r in reversed(history) if r.state == rel.GOOD and r.startup_s), None)
    if good is None:
        return s, "START_TIMEOUT_MIN: no good release measured a start-up yet"
    return s, (f"the rollout deadline: twice release {good.number}'s start-up, within ROLLOUT_MIN_TIMEOUT_MIN "
               "and START_TIMEOUT_MIN")


def prepare(cfg, want, states, image_ids, retry_failed=False, now=None):
    """What this launch rolls out: `want` (core.desired) on image_ids, on the nodes as probed (with their
    versions). Refuses (UserError, nothing written) the release that just failed unless retry_failed;
    records a release a killed launch left unfinished as interrupted unless this launch finishes it;
    begins a new release when what would run differs from the release in service. -> Rollout."""
    sd = cfg.state_dir
    fields = rel.record_fields(cfg, want, image_ids, rel.checkpoint_on_disk(cfg),
                               {node: f.versions or {} for node, f in states.items()})
    history, serving = rel.read_history(sd)
    fp = rel.fingerprint(fields)
    rel.refuse_flapping(history, fp, retry_failed, time.time() if now is None else now)
    lines = []
    warn = rel.checkpoint_warning(history, fields["checkpoint"])
    if warn:
        lines.append(warn)
    r = rel.next_step(history, fp)
    r = None if r is not None and r.action == "go back" else r     # finished before: carry_on_way_back
    if r is not None:
        lines.append(r.line)
        if r.action == "finish":
            rest = [x for x in history if x.number != r.release.number]
            return Rollout(r.release, rel.last_good(rest, fields["checkpoint"]), deadline(rest, cfg), resumed=True,
                           lines=tuple(lines))
        rel.finish(sd, r.release.number, rel.INTERRUPTED, r.line)
        if r.action == "roll back":
            return Rollout(None, None, deadline(history, cfg), lines=tuple(lines))   # r.target is in service
    current = next((x for x in history if x.number == serving), None)
    if r is None and current is not None and rel.fingerprint(current) == fp:
        return Rollout(None, None, deadline(history, cfg), lines=tuple(lines))
    target = rel.last_good(history, fields["checkpoint"])
    draft = rel.draft(history, serving, fields)         # numbers and fields: an INTERRUPTED above changes neither
    lines.append(f"release {draft.number}: " + "; ".join(draft.changes[:6])
                 + (f" (+{len(draft.changes) - 6} more: `doit releases show {draft.number}`)"
                    if len(draft.changes) > 6 else ""))
    return Rollout(None, target, deadline(history, cfg), lines=tuple(lines), fields=fields)


def run(cl, ro, want, steps, states, *, force=False, fault=None, by="doit launch", began=None):
    """Begin the release (ro.fields) just before the first change, apply the steps, wait for the API (within
    the rollout's deadline when the ranks restart for a new release), hold it, and record the result. A
    failure of a new release goes back (go_back, which raises RolledBack or Down); a repair of the release in
    service fails as before. Silences and the page: settled(). -> start-up seconds (None when the ranks did
    not restart)."""
    cfg = cl.cfg
    began = time.time() if began is None else began
    restarting = any(s.kind is Kind.RESTART_RANKS for s in steps)
    begin(cfg, ro, by)
    with settled(cl, ro, restarting):
        return checked_run(cl, ro, want, steps, states, restarting, force=force, fault=fault, by=by, began=began)


def begin(cfg, ro, by="doit launch"):
    """Record ro's release rolling out (from ro.fields; nothing when there is none), with what whoever
    carries it on needs: where a failure goes back, the deadline, who carries it on now."""
    if ro.fields is not None:
        ro.release = rel.begin(cfg.state_dir, ro.fields, cfg.releases_keep, back_to=ro.target and ro.target.number,
                               deadline_s=ro.deadline[0], rollback_of=ro.rollback_of,
                               carrier={"by": by, "pid": os.getpid(), "since": time.time()})
        ro.fields = None
    return ro.release


@contextlib.contextmanager
def settled(cl, ro, restarting):
    """Planned work is over, served or not: every silence of ours ends two scrapes later (the restart's own
    alerts resolve first; a cluster left down alerts), and a release that failed pages once
    (DSV41ReleaseFailed)."""
    cfg = cl.cfg
    outcome = None
    try:
        yield
    except (RolledBack, Down) as err:
        outcome = err
        raise
    finally:
        quiet_s = 0
        if restarting and silences.silences(cfg):     # after the restart's alerts resolved (two scrapes)
            quiet_s = 2 * cfg.scrape_interval_s + silences.RESOLVE_SLACK_S
            say(cl.head, silences.end_soon(cfg, quiet_s))
        if outcome is not None:             # the failed release is an incident: it pages once
            n = ro.release.number
            say(cl.head, silences.page(cfg, "DSV41ReleaseFailed", one_line(outcome, 300),
                                       f"`doit releases show {n}` has what changed; `doit incidents show 1` the "
                                       "failed ranks' evidence", {"release": str(n)}, silenced_s=quiet_s))


def checked_run(cl, ro, want, steps, states, restarting, *, force, fault, by, began):
    cfg = cl.cfg
    checked = ro.release is not None and (restarting or ro.resumed)
    why = f"release {ro.release.number} rolling out" if ro.release else f"restarting ({by})"
    if any(s.kind is Kind.RESTART_RANKS and not s.target for s in steps) and fault is None:
        recovery.door(cl, lambda line: say(cl.head, line), why, starting=True, drain=True)   # planned: the requests
                                                                                            # in flight finish first
    t, t_wall, phases = time.monotonic(), time.time(), None
    try:
        if restarting and ro.release is not None:       # the deadline's clock, for whoever carries it on
            rel.carried(cfg.state_dir, ro.release.number, by, started_at=time.time())
        apply(cl, want, steps, states, force, fault, within=ro.deadline if checked else None, by=by,
              owner=ro.release and ro.release.number)
        ranks.wait_ready(cl, ro.deadline if checked else None)
        startup = time.monotonic() - t if restarting else None
        if restarting:
            phases = ranks.measured(cl, "rollback" if ro.rollback_of else "launch",
                                    f"release {ro.release.number}" if ro.release else by, t_wall)
        if checked:
            hold(cl, cfg.rollout_hold_s)
    except recovery.NeedsReboot as err:
        if ro.release is not None:
            rel.finish(cfg.state_dir, ro.release.number, rel.INTERRUPTED, f"not started: {one_line(err, 200)}")
        raise
    except UserError as err:
        if ro.release is None:
            raise
        failed(cl, ro, err, checked, began=began, by=by)
    if restarting or ro.resumed:            # served: the door opens (a rollout carried on after its restart: here)
        recovery.door(cl, print)
    if ro.release is not None:
        rel.finish(cfg.state_dir, ro.release.number, rel.GOOD,
                   "ready" + (f", healthy for {cfg.rollout_hold_s:.0f} s" if checked else ", no rank restarted"),
                   startup_s=startup, phases=phases)
        print(f"release {ro.release.number} is good and in service")
    return startup


def failed(cl, ro, err, checked, *, began, by):
    """Release ro.release failed (err): recorded failed, with where it goes back when it will; then back to
    ro.target (raises RolledBack or Down), or UserError saying why it stays as it is."""
    cfg = cl.cfg
    back = checked and ro.target is not None and cfg.rollback
    f = rel.finish(cfg.state_dir, ro.release.number, rel.FAILED, one_line(err, 300),
                   back_to=ro.target.number if back else None)
    if not checked:
        raise err
    if ro.target is None:
        fault = recovery.fault(f"release {f.number} failed: {one_line(f.result, 200)}", f.failed_at)
        inc = recovery.evidence_only(cl, fault, "left down: no good release to go back to", by=by,
                                     log=lambda m: print(f"[head] {m}"))
        raise UserError(f"release {f.number} failed ({one_line(err, 300)}); there is no good release to go "
                        f"back to on this checkpoint (evidence: `doit incidents show {inc['id']}`): fix the cause "
                        "and launch again") from None
    if not cfg.rollback:
        raise UserError(f"release {f.number} failed ({one_line(err, 300)}); ROLLBACK=0, so it stays as it "
                        f"is: `doit rollback {ro.target.number}` goes back") from None
    go_back(cl, f, ro.target, began=began, by=by)


def hold(cl, seconds):
    """The release stays healthy for `seconds` (ROLLOUT_HOLD_S): at each look the cluster's Health
    (core.observe.judged, as status and the watchdog judge it) is READY (HEALTHY or BUSY), so a rank
    still activating, restarted on its own, unreachable or tripped, or an API that does not answer,
    fails it; the last look asks the recipe's readiness for a token (none: WEDGED). UserError naming
    what failed. A state file that cannot be read is read as absent (launch has said it)."""
    end = time.monotonic() + seconds
    print(f"holding: the release must stay healthy for {seconds:.0f} s (ROLLOUT_HOLD_S)", flush=True)
    with progress.bar(f"holding: the release must stay healthy for {seconds:.0f} s (ROLLOUT_HOLD_S)",
                      seconds, unit="s") as bar:
        while True:
            left = end - time.monotonic()
            last = left <= 0
            _, h = observe.judged(cl, scrape=False, probe="ready" if last else None, problems=[])
            if h.word != "READY":
                bar.close()
                ranks.show_rank_logs(cl)
                raise UserError(f"{h.verdict}: {h.evidence} {'at the end of' if last else 'during'} the hold "
                                "(ROLLOUT_HOLD_S)")
            if last:
                return
            time.sleep(min(2.0, left))
            bar.update(min(2.0, left))


def check_images(release, states):
    """Every node still holds the release's image under its reference, with the recorded id (the units
    run with --pull never; states: a probe of a Cluster on the release's settings); UserError otherwise."""
    for node, want in sorted(release.image_ids.items()):
        have = states[node].image_id if node in states else None
        if want and have != want:
            raise UserError(f"{node} holds {rel.short_id(have) if have else 'no image'} as {release.image}, not "
                            f"release {release.number}'s {rel.short_id(want)}: `docker tag {want} {release.image}` "
                            "there (or pull it) first")


def recorded(cl, release, since=None, clock=time.time):
    """(Desired, steps, states) that run `release` exactly as recorded, from the nodes as they are now. The
    ranks restart whatever else differs, unless every engine unit (re)started after `since` (unix time: a
    carried-on rollout's started_at) and none needs to for another reason: then the wait goes on. With
    several groups, each group's (decide.owed_restarts)."""
    key = engine_key(cl.cfg)            # with several groups, a group's first node off the head holds its own

    def key_of(node):
        return key and group_key(cl.cfg, cl.cfg.group_of(cl.specs[node]), create=True)
    want = Desired(*rel.recorded_state(release, key_of))
    states = cl.probe_all(versions=True)
    tripped = next((n for n in cl.nodes if states[n.name].tripped), None)
    if tripped is not None:                 # the rank units do not start while a guard is tripped
        raise UserError(f"the memory guard on {tripped.label} {states[tripped.name].tripped['line']}: `doit clear-trip` "
                        f"after lowering {cl.recipe.memory_settings}, then `doit launch`")
    check_images(release, states)
    steps = decide(cl.cfg.nodes, want, states, cl.recipe, cl.cfg.groups)
    return want, owed_restarts(cl.cfg.nodes, steps, states, cl.recipe, cl.cfg.groups, since, clock(),
                               f"release {release.number} as recorded"), states


def go_back(cl, failed, target, *, began, by):
    """Restart the ranks on `target` as recorded after `failed` failed (recorded rolling back first);
    raises RolledBack or Down."""
    sd = cl.cfg.state_dir
    why = one_line(failed.result, 200)
    if failed.state == rel.FAILED:
        rel.rolling_back(sd, failed.number)
    print(f"release {failed.number} failed ({why}): going back to release {target.number} as recorded")
    fault = recovery.fault(f"release {failed.number} failed: {why}", failed.failed_at)
    try:
        back = Cluster(rel.settings_of(target, cl.cfg))
        want, steps, states = recorded(back, target)
        t0 = time.time()
        apply(back, want, steps, states, fault=fault, by=by, owner=failed.number,
              why=f"release {failed.number} failed: going back to release {target.number}")
        ranks.wait_ready(back)
        phases = ranks.measured(back, "rollback", f"release {failed.number} back to {target.number}", t0)
    except UserError as err:
        rel.down(sd, failed.number, one_line(err, 200))
        raise Down(f"release {failed.number} failed ({why}) and going back to release {target.number} failed too "
                   f"({one_line(err, 200)}): the cluster is down; `doit incidents show 1` has the evidence, "
                   "`doit releases` the history") from None
    rel.rolled_back(sd, failed.number, target.number, phases=phases)
    now = time.time()
    since = f"this {by}" if by.startswith("doit") else f"release {failed.number}"     # carried on: the release
    raise RolledBack(f"release {failed.number} failed ({why}); rolled back to release {target.number}, serving "
                     f"again at {rel.when(now)} ({now - began:.0f} s after {since} began)")


def carry_on(cfg, release, by, clock=time.time):
    """Finish `release`, which a process that died left unfinished, from its record alone (its settings,
    units, files and image ids; never conf/): a way back is finished; a rollout goes on where it was (the
    ranks restarted unless they already started for it, then the rest of its recorded deadline when they
    had, and the hold), then good, or failed and back to its back_to. The caller holds the run lock.
    Raises RolledBack or Down as a launch would; -> the start-up seconds, or None."""
    history = rel.load_all(cfg.state_dir)
    target = next((r for r in history if r.number == release.back_to and r.state == rel.GOOD), None)
    cl = Cluster(rel.settings_of(release, cfg))
    release = rel.carried(cfg.state_dir, release.number, by)
    print(f"release {release.number} ({release.shown_state}) was left unfinished: {by} carries it on")
    ro = Rollout(release, target, (release.deadline_s or cl.cfg.start_timeout_s, "the recorded rollout deadline"),
                 resumed=True)
    if release.state != rel.ROLLING_OUT:
        with settled(cl, ro, restarting=True):
            if target is None:
                if release.state == rel.FAILED:
                    rel.rolling_back(cfg.state_dir, release.number)
                rel.down(cfg.state_dir, release.number, f"release {release.back_to} is no longer a good release")
                raise Down(f"release {release.number} failed and release {release.back_to}, where it went back, "
                           "is no longer kept: the cluster is down; `doit releases` the history")
            go_back(cl, release, target, began=release.time, by=by)
    try:
        want, steps, states = recorded(cl, release, since=release.started_at, clock=clock)
    except UserError as err:                # it cannot even be applied as recorded: the release failed
        with settled(cl, ro, restarting=False):
            failed(cl, ro, err, True, began=release.time, by=by)
    if not any(s.kind is Kind.RESTART_RANKS for s in steps):       # they started for it: what is left
        left = (release.deadline_s or cl.cfg.start_timeout_s) - (clock() - release.started_at)
        ro.deadline = (max(1.0, left), "what was left of the recorded rollout deadline")
    return run(cl, ro, want, steps, states, by=by, began=release.time)


def next_step(state_dir):
    """(the release history, what to do about the release it leaves unfinished: core.releases.next_step as
    recorded, or None)."""
    history = rel.load_all(state_dir)
    return history, rel.next_step(history)


def carry_on_way_back(cfg, by):
    """A way back that a dead process left half-way is finished before anything else (a launch's or a
    rollback's first step): its outcome is said, not raised. -> the line, or None when there was none."""
    _, n = next_step(cfg.state_dir)
    if n is None or n.action != "go back":
        return None
    try:
        carry_on(cfg, n.release, by)
    except (RolledBack, Down) as err:
        return str(err)
    return None


# ---- applying the steps ----------------------------------------------------------------------------

def apply(cl, want, steps, states, force=False, fault=None, within=None, by="doit launch", owner=None, why=None):
    """decide()'s steps in one ordered pass: state files, units, the memory guards, our services
    (core.decide.SERVICES: the head's, then the side doors; in their order and as each says), the ranks
    through recovery.restart, the services that start after them, the exporters. fault: the Health that calls
    for the restart; within: the readiness wait's deadline; by: who restarts; owner: the release whose restart
    it is, named by its silence and by the gateway's 503s unless why says otherwise.

    A group restarted alone (decide(): while others serve) gets what its ranks read (their units and files,
    its memory guards) only just before its restart, and is held healthy (ROLLOUT_HOLD_S, for a checked
    release) before the next group's: a failure stops the rollout there, the groups after it never changed."""
    by_name = {n.name: n for n in cl.nodes}
    groups = cl.groups()
    later_of = {s.target: [] for s in steps if s.kind is Kind.RESTART_RANKS and s.target}
    for s in steps:                         # what a group restarted alone reads waits for its restart
        if s.node in by_name and rank_step(cl, s):
            g = f"g{cl.cfg.group_of(cl.specs[s.node])}"
            if g in later_of:
                later_of[g].append(s)
    deferred = [s for group_steps in later_of.values() for s in group_steps]
    node_steps(cl, want, [s for s in steps if s not in deferred])
    restarting = any(s.kind is Kind.RESTART_RANKS for s in steps)
    services = [(svc, s) for svc in SERVICES if by != svc.not_by for s in steps if s.kind in svc.kinds]
    later = [(svc, s) for svc, s in services if restarting and svc.starts_after_ranks and s.kind is svc.start]
    for svc, s in services:
        if (svc, s) not in later:
            service_step(cl, svc, s)
    rolling = [s for s in steps if s.kind is Kind.RESTART_RANKS]
    for n, s in enumerate(rolling):
        print(f"(re)starting the ranks{f' of group {s.target[1:]}' if s.target else ''}: {s.reason}")
        owned = f"{by}, release {owner}" if owner else f"{by}, pid {os.getpid()}"    # whose work it is
        say(cl.head, silences.silence(cl.cfg, owned))   # planned: the rank and API alerts stay quiet
        which = groups[int(s.target[1:])] if s.target else cl      # one group's: its server alone drains
        step = (lambda where: rel.group_step(cl.cfg.state_dir, owner, s.target, where)) if s.target and owner \
            else (lambda where: None)
        step("going back" if fault else "restarting")
        if s.target:
            node_steps(cl, want, later_of[s.target])
            if not fault:
                recovery.door(which, lambda line: say(cl.head, line), "restarting", starting=True, drain=True)
        try:
            recovery.restart(which, fault=fault, by=by, force=force, log=lambda m: print(f"[head] {m}"), within=within,
                             why=why or (f"release {owner} rolling out" if owner and not fault else None))
            if s.target and within and n + 1 < len(rolling):       # held before the next group leaves the door
                hold(which, cl.cfg.rollout_hold_s)
        except UserError:
            step("failed")
            raise
        step("back" if fault else "good")
    for svc, s in later:
        service_step(cl, svc, s)
    for s in steps:
        if s.kind is Kind.START_EXPORTER:            # monitoring: never stops the launch
            say(by_name[s.node], exporter.start(cl, by_name[s.node]))


def rank_step(cl, s):
    """Whether a step changes what a node's ranks read: a state file they read, their unit or the memory
    guard's, the guard itself (not the head's services and what only they read)."""
    spec = cl.specs[s.node]
    return (s.kind is Kind.WRITE and s.target not in SERVICE_ONLY_FILES
            or s.kind is Kind.INSTALL and (s.target in cl.recipe.units(spec) or s.target == names.MEMGUARD_UNIT)
            or s.kind in (Kind.START_GUARD, Kind.RESTART_GUARD, Kind.RELOAD_GUARD))


def node_steps(cl, want, steps):
    """The state files, unit files and memory guards of `steps`: written, installed (systemd reloaded once a
    node), started or reloaded."""
    by_name = {n.name: n for n in cl.nodes}
    for s in steps:
        node = by_name.get(s.node)
        if s.kind is Kind.WRITE:
            state = cl.paths(node).state_dir
            text, mode = want.files[node.name][s.target]
            node.write_file(f"{state}/{s.target}", text, mode=mode)
            if s.target == names.SECRET_KEY:      # the key's old place (an env file): gone
                cl.remove(node, f"{state}/{names.KEY_ENV}")
            say(node, f"wrote {state}/{s.target}" + (f" (mode {mode:o})" if mode != 0o644 else ""))
        elif s.kind is Kind.INSTALL:
            install_unit(cl, node, s.target, want.units[node.name][s.target])
    for name in {s.node for s in steps if s.kind is Kind.INSTALL}:
        cl.systemctl(by_name[name], "daemon-reload")
    for s in steps:
        if s.kind in (Kind.START_GUARD, Kind.RESTART_GUARD, Kind.RELOAD_GUARD):
            control(cl, by_name[s.node], s.kind, names.MEMGUARD_UNIT, "memory guard")


def rollback(cfg, history, target):
    """`doit rollback [N]`: release `target` applied as recorded, through the checked rollout, as a new
    release; the last good release on this checkpoint is where its failure goes back."""
    began = time.time()
    on_disk = rel.checkpoint_on_disk(cfg)
    if not rel.same_checkpoint(target.checkpoint, on_disk):
        raise UserError(f"release {target.number} ran checkpoint {target.checkpoint.get('repo')}@"
                        f"{target.checkpoint.get('revision') or 'latest'}, not the one in {cfg.model_dir}: a rollback "
                        "never starts a release on a checkpoint it did not record")
    cl = Cluster(rel.settings_of(target, cfg))
    cl.cfg.require_workers()
    want, steps, states = recorded(cl, target)
    fields = {k: getattr(target, k) for k in ("image", "image_ids", "settings", "units", "files", "secret_files")}
    fields.update(checkpoint=on_disk, node_versions={n: states[n].versions or {} for n in states})
    back = rel.last_good(history, on_disk)
    print(f"release {rel.draft(history, rel.serving_of(history), fields).number}: release {target.number} as "
          f"recorded; if it fails, back to release {back.number if back else '-'}")
    ro = Rollout(None, back, deadline(history, cl.cfg), fields=fields, rollback_of=target.number)
    run(cl, ro, want, steps, states, by="doit rollback", began=began)
    print(f"release {target.number}'s state serves again as release {ro.release.number}; conf/ still says what "
          "`doit plan` shows: the next `doit launch` applies it")
