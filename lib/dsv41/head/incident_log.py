"""doit incidents [show [N|NAME]]: the incident folders the watchdog and launch saved before a restart
($STATE_DIR/incidents/), newest first: time, verdict, outage, result, evidence; `show N` prints the N-th
newest (1: the last), `show NAME` the one an alert names, with what was gathered from each node and
the stopped processes' stacks."""
import re

from dsv41.errors import BadInput
from dsv41.head.core import incidents as folders


def incidents(cfg, words=()):
    words = list(words)
    if not words:
        print("\n".join(folders.list_lines(cfg.state_dir)))
        return
    if words[0] != "show" or len(words) > 2:
        raise BadInput(f"`doit incidents {' '.join(words)}`: expected `doit incidents` or `doit incidents show [N|NAME]` "
                        "(N: the number `doit incidents` lists, 1 the newest; NAME: the incident's, as an alert names it)")
    which = words[1] if len(words) == 2 else "1"
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,80}", which):
        raise BadInput(f"`doit incidents show {which}`: expected a number `doit incidents` lists (1 the newest) or "
                       "an incident's name, as an alert names it")
    print(folders.show(cfg.state_dir, int(which) if which.isdigit() and len(which) <= 9 else which))
