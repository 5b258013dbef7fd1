"""The rules that tell a hang from a long job and keep recoveries from making things worse. Pure: no
I/O here; the caller passes /metrics snapshots, times, readings and, for the waits, its own clock.

- Progress: every signal the engine moves while it works (the recipe's progress_metrics; its
  work_metrics count the requests running and waiting). While requests run or wait
  and none of them has moved, the engine has made no progress for Progress.update()'s seconds.
- Backoff: before the n-th recovery inside one window, wait backoff x 2^(n-2) after the previous one
  ended (none before the first); a window that holds no recovery starts the count again.
- Memory return: after the ranks stopped, each node's MemAvailable must be back within a margin of
  the baseline recorded before its first rank started, or nothing may start: NEEDS_REBOOT.
"""
from dataclasses import dataclass, field

GIB = 1 << 30
BACK, SHORT, UNREAD = "BACK", "SHORT", "UNREAD"   # a MemoryCheck's verdicts


def signals(snap, series):
    """The progress signals of one snapshot: {series: {labels: value}} (absent series: empty)."""
    return {name: dict(snap.samples.get(name, {})) for name in series}


def work(snap, series):
    """(running, waiting, ...) requests in one snapshot, one per work series."""
    return tuple(snap.value(name, 0) or 0 for name in series)


@dataclass
class Progress:
    """What the engine's progress signals were and since when none of them moved while it worked.

    update(snap) -> seconds every signal has been flat with requests running or waiting (0 when idle
    or when something moved since the last snapshot). last_progress is when progress was last seen
    (an idle engine counts as progressing: it owes nothing), moved the series that moved last time.
    for_recipe(recipe) watches the recipe's signals."""
    series: tuple                    # the recipe's progress_metrics
    work_series: tuple               # the recipe's work_metrics
    seen: dict | None = None
    last_progress: float | None = None
    moved: tuple = ()

    @classmethod
    def for_recipe(cls, recipe):
        return cls(tuple(recipe.progress_metrics), tuple(recipe.work_metrics))

    def update(self, snap):
        now = signals(snap, self.series)
        self.moved = tuple(n for n in self.series if self.seen is not None and now[n] != self.seen[n])
        if self.seen is None or self.moved or not any(work(snap, self.work_series)):
            self.seen, self.last_progress = now, snap.time
            return 0.0
        return max(0.0, snap.time - self.last_progress)


# ---- backoff ------------------------------------------------------------------------------------------

def backoff_wait(n, backoff_s):
    """Seconds to wait before the n-th recovery inside one window: none before the first,
    backoff_s before the second, then doubling (backoff_s x 2^(n-2))."""
    return 0.0 if n <= 1 else backoff_s * 2 ** (n - 2)


@dataclass(frozen=True)
class Gate:
    action: str          # "restart", "wait" or "give up"
    n: int               # which recovery inside the window this one would be
    wait_s: float        # seconds left before it may start ("wait"), else 0
    reason: str


def recovery_gate(now, recoveries, *, window_s, max_recoveries, backoff_s):
    """May a recovery start now? recoveries: (started, ended) of the restarts done so far, any age.

    Only those that started inside the window (now - window_s, now] count. With max_recoveries of them
    the watchdog gives up (the budget); otherwise the n-th waits backoff_wait(n) after the previous one
    ended. Never sleeps: a caller that is told "wait" keeps observing and asks again."""
    inside = sorted((s, e) for s, e in recoveries if now - s < window_s)
    n = len(inside) + 1
    if len(inside) >= max_recoveries:
        return Gate("give up", n, 0.0, f"{len(inside)} recoveries within {window_s / 60:g} min "
                                        f"(WATCHDOG_MAX_RECOVERIES {max_recoveries})")
    wait = backoff_wait(n, backoff_s)
    if wait:
        left = max(e for _, e in inside) + wait - now
        if left > 0:
            return Gate("wait", n, left, f"recovery {n} in {window_s / 60:g} min waits {wait:g} s after the "
                                         f"previous one (WATCHDOG_BACKOFF_S {backoff_s:g}); {left:.0f} s left")
    return Gate("restart", n, 0.0, f"recovery {n} of at most {max_recoveries} in {window_s / 60:g} min")


# ---- memory return ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MemoryCheck:
    verdict: str                 # BACK, SHORT (a node is short: NEEDS_REBOOT), UNREAD (a node could not be read)
    lines: tuple = ()            # one per node that is short or unread
    warnings: tuple = ()         # one per node without a baseline (not checked)
    missing_gib: dict = field(default_factory=dict)   # node -> GiB below its baseline (short nodes)

    def line(self):
        return "; ".join(self.lines)


def memory_returned(baselines, available, return_gib):
    """Is every node's memory back? baselines, available: {node: MemAvailable bytes} (available None:
    the node could not be read). A node is back when available >= baseline - return_gib GiB; a node
    without a baseline is skipped with one warning line."""
    short, unread, warnings, missing = [], [], [], {}
    for node, now in available.items():
        base = baselines.get(node)
        if base is None:
            warnings.append(f"{node}: no MemAvailable baseline yet (recorded when launch starts its rank); "
                            f"its memory is not checked")
            continue
        if now is None:
            unread.append(f"{node}: MemAvailable could not be read; cannot tell whether its memory came back")
            continue
        gap = (base - now) / GIB
        if gap > return_gib:
            missing[node] = round(gap, 1)
            short.append(f"{node}: MemAvailable {now / GIB:.1f} GiB is {gap:.1f} GiB below its baseline "
                         f"{base / GIB:.1f} GiB (MEM_RETURN_GIB {return_gib:g}): memory did not come back; "
                         f"reboot {node}, or `doit launch --force` to start anyway")
    verdict = SHORT if short else UNREAD if unread else BACK
    return MemoryCheck(verdict, tuple(short + unread), tuple(warnings), missing)


def wait_memory_back(read, baselines, *, return_gib, return_s, clock, sleep, every_s=2.0):
    """Ask read() -> {node: MemAvailable bytes or None} until every node is back or return_s passed;
    -> the last MemoryCheck (as soon as it is BACK). clock and sleep are the caller's."""
    end = clock() + return_s
    while True:
        check = memory_returned(baselines, read(), return_gib)
        if check.verdict == BACK or clock() >= end:
            return check
        sleep(min(every_s, max(0.0, end - clock())))
