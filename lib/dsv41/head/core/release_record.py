"""One release's record: what it holds (Release), its states and the only moves between them. No I/O:
core/releases.py stores the records and moves them (transition()).

A record holds when it began, the image reference and the image id on each node, the checkpoint (repo,
revision, manifest digest), every rendered unit and state file launch writes on each node (the API key
file is never stored: only its name, in `secret_files`), the resolved settings (config.resolved: no
secret), each node's kernel, driver and Docker version, what changed against the release it replaced
(`changes_from`), the start-up time and its phases (and those of the going back after a failure), the
state and a result line.

    rolling out  -> good | failed | interrupted      begin(): just before the first change on a node
    failed       -> rolling back                     only when `back_to` names where it goes back
    rolling back -> rolled back | down

"interrupted": a later launch found it unfinished and did something else. A release is unfinished while
it is rolling out, rolling back, or failed with `back_to` set: whoever holds the run lock carries it on
from the record alone (core/releases.py says how)."""
import dataclasses

ROLLING_OUT, GOOD, FAILED, INTERRUPTED = "rolling out", "good", "failed", "interrupted"
ROLLING_BACK, ROLLED_BACK, DOWN = "rolling back", "rolled back", "down"
MOVES = {ROLLING_OUT: (GOOD, FAILED, INTERRUPTED), FAILED: (ROLLING_BACK,), ROLLING_BACK: (ROLLED_BACK, DOWN)}
FAILURES = (FAILED, ROLLING_BACK, ROLLED_BACK, DOWN)     # the release failed, whatever came after


@dataclasses.dataclass(frozen=True)
class Release:
    number: int
    time: float                     # when it began (the head's clock)
    state: str                      # a key or value of MOVES
    image: str                      # the image reference
    image_ids: dict                 # {node: image id}
    checkpoint: dict                # {"repo", "revision", "manifest_digest"}
    settings: dict                  # config.resolved(cfg): no secret
    node_versions: dict             # {node: {"kernel", "driver", "docker"}}
    units: dict                     # {node: {unit file name: text}}
    files: dict                     # {node: {path under the state dir: [text, mode]}}, no secret file
    secret_files: dict              # {node: [path under the state dir]}: written by launch, never stored
    changes: list                   # lines, in `doit plan`'s words
    changes_from: int | None        # the release they are measured against (None: the first)
    startup_s: float | None = None  # from the first rank's start to the API's first token
    result: str = ""
    failed_at: float | None = None
    finished_at: float | None = None
    rolled_back_to: int | None = None
    back_to: int | None = None      # where a failure goes back (FAILED: set only when it will)
    deadline_s: float | None = None     # the readiness wait's length (core/rollout.py deadline())
    started_at: float | None = None     # when the ranks began to restart: the deadline's clock
    carrier: dict | None = None     # {"by": "doit launch", "pid": N, "since": t}: who carries it on
    rollback_of: int | None = None  # made by `doit rollback N`: N's state applied again
    startup_phases: dict | None = None  # its start-up's {"phases": [...], "total"} (core/startup.py); older: None
    back_phases: dict | None = None     # the same of the going back, when it rolled back
    groups: dict | None = None      # rolled group by group (GROUPS > 1): {"g<N>": "restarting" | "good" | "failed" |
                                    # "going back" | "back"}, each written before and after its step; older: None

    @property
    def shown_state(self):
        """As `doit releases` shows it: "failed, rolled back to N" is what the lab tests and people read."""
        return {ROLLED_BACK: f"{FAILED}, rolled back to {self.rolled_back_to}",
                ROLLING_BACK: f"{FAILED}, rolling back to {self.back_to}",
                DOWN: f"{FAILED}, down (going back to {self.back_to} failed too)"}.get(self.state, self.state)

    @property
    def unfinished(self):
        return self.state in (ROLLING_OUT, ROLLING_BACK) or (self.state == FAILED and self.back_to is not None)


class IllegalMove(ValueError):
    """A transition MOVES does not allow: a bug, or two processes carrying one release on."""


def check_move(old, to):
    """None when `old` -> `to` is one of MOVES; else IllegalMove naming both."""
    if to not in MOVES.get(old, ()):
        raise IllegalMove(f"a release {old} cannot become {to} (the moves: "
                          + "; ".join(f"{a} -> {' | '.join(b)}" for a, b in MOVES.items()) + ")")
