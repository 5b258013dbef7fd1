"""doit releases [show [N]]: the releases launch recorded ($STATE_DIR/releases/, core/releases.py), oldest
first: number, when, image digest, checkpoint revision, what changed, start-up, result, and which one
serves; `show N` prints release N (default: the one in service) with its difference from the one before.
`doit rollback [N]` goes back to release N (default: the last good one before the one in service)."""
from dsv41.errors import BadInput, UserError
from dsv41.head.core import release_status, releases as rel, rollout

USAGE = ("expected `doit releases` or `doit releases show [N]` (N: a number `doit releases` lists; "
         "default the one in service)")


def _number(word):
    """A release number as typed: at most 9 ASCII digits (str.isdigit() also takes "²", which int() refuses,
    and int() refuses 5,000 digits)."""
    return word.isascii() and word.isdigit() and len(word) <= 9


def releases(cfg, words=()):
    words = list(words)
    history, serving = rel.read_history(cfg.state_dir)
    if not words:
        print("\n".join(release_status.list_lines(history, serving)))
        return
    if words[0] != "show" or len(words) > 2 or (len(words) == 2 and not _number(words[1])):
        raise BadInput(f"`doit releases {' '.join(words)}`: {USAGE}")
    if len(words) == 2:
        number = int(words[1])
    elif serving is not None or history:
        number = serving if serving is not None else history[-1].number
    else:
        raise UserError("no releases yet: `doit launch` records one each time it changes what runs")
    print("\n".join(release_status.show_lines(history, serving, number)))


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
