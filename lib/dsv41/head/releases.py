"""doit releases [show [N]]: the releases launch recorded ($STATE_DIR/releases/, core/releases.py), oldest
first: number, when, image digest, checkpoint revision, what changed, start-up, result, and which one
serves; `show N` prints release N (default: the one in service) with its difference from the one before.
`doit rollback [N]` goes back to release N (default: the last good one before the one in service)."""
import difflib
import re

from dsv41.errors import BadInput, UserError, one_line
from dsv41.head.core import releases as rel, rollout

USAGE = ("expected `doit releases` or `doit releases show [N]` (N: a number `doit releases` lists; "
         "default the one in service)")


def _image(r):
    m = re.search(r"@sha256:([0-9a-f]{12})", r.image)
    return m.group(1) if m else rel.short_id(next(iter(r.image_ids.values()), None))


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
        lines.append(f"{mark} {r.number:>4}  {rel.when(r.time):<20}  {_image(r):<12}  "
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
           f"  began       {rel.when(r.time)}   finished {rel.when(r.finished_at)}   start-up {_secs(r.startup_s)}",
           f"  result      {r.result or '-'}" + (f"   failed at {rel.when(r.failed_at)}" if r.failed_at else ""),
           f"  image       {r.image}"]
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


def _number(word):
    """A release number as typed: at most 9 ASCII digits (str.isdigit() also takes "²", which int() refuses,
    and int() refuses 5,000 digits)."""
    return word.isascii() and word.isdigit() and len(word) <= 9


def releases(cfg, words=()):
    words = list(words)
    history, serving = rel.read_history(cfg.state_dir)
    if not words:
        print("\n".join(list_lines(history, serving)))
        return
    if words[0] != "show" or len(words) > 2 or (len(words) == 2 and not _number(words[1])):
        raise BadInput(f"`doit releases {' '.join(words)}`: {USAGE}")
    if len(words) == 2:
        number = int(words[1])
    elif serving is not None or history:
        number = serving if serving is not None else history[-1].number
    else:
        raise UserError("no releases yet: `doit launch` records one each time it changes what runs")
    print("\n".join(show_lines(history, serving, number)))


def rollback_target(history, serving, number=None):
    """The release `doit rollback [N]` applies: N, else the last good release before the one in service;
    UserError naming why there is none."""
    if number is None:
        below = serving if serving is not None else float("inf")
        target = next((r for r in reversed(history) if r.state == rel.GOOD and r.number < below), None)
        if target is None:
            raise UserError("no good release before the one in service to go back to (`doit releases` lists them)")
        return target
    target = next((r for r in history if r.number == number), None)
    if target is None:
        raise UserError(f"no release {number}: `doit releases` lists the {len(history)} kept")
    if target.state != rel.GOOD:
        raise UserError(f"release {number} is {target.shown_state}, not good: `doit rollback` goes back only to a "
                        "release that served")
    if target.number == serving:
        raise UserError(f"release {number} is the one in service: nothing to go back to")
    return target


def rollback(cfg, words=()):
    words = list(words)
    if len(words) > 1 or (words and not _number(words[0])):
        raise BadInput(f"`doit rollback {' '.join(words)}`: expected `doit rollback` or `doit rollback N` "
                        "(N: a good release `doit releases` lists)")
    number = int(words[0]) if words else None
    said = rollout.carry_on_way_back(cfg, "doit rollback")    # a dead process's way back: finished first
    if said:
        print(said)
    _, n = rollout.next_step(cfg.state_dir)
    if n is not None:                       # a rollout a dead process left: finished first, from its record
        left = n.release
        rollout.carry_on(cfg, left, "doit rollback")
        if left.rollback_of is not None and number in (None, left.rollback_of):
            print(f"release {left.rollback_of}'s state serves again as release {left.number}: the rollback a "
                  "dead `doit rollback` left half-way is done")
            return
    history, serving = rel.read_history(cfg.state_dir)
    rollout.rollback(cfg, history, rollback_target(history, serving, number))
