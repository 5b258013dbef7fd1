"""doit logs r0|r1|...|memguard|watchdog [-f] [-n N] [--node NAME]: a unit's journal on its node."""
from dsv41 import names
from dsv41.errors import BadInput, UserError
from dsv41.head.core.cluster import Cluster


def _log_args(words, follow, lines, node):
    """doit stops parsing options at the first positional word: take -f/-n/--node from anywhere."""
    targets, words = [], list(words)
    while words:
        w = words.pop(0)
        if w in ("-f", "--follow"):
            follow = True
        elif w in ("-n", "--lines", "--node") and words:
            value = words.pop(0)
            if w == "--node":
                node = value
            elif value.isascii() and value.isdigit():
                lines = int(value)
            else:
                raise BadInput(f"-n {value!r} is not a number of lines")
        else:
            targets.append(w)
    return targets, follow, lines, node


def logs(cfg, units=(), follow=False, lines=100, node=""):
    cl = Cluster(cfg)
    targets, follow, lines, node = _log_args(units, follow, lines, node)
    ranks = cl.recipe.log_units(cfg.nodes)
    if node and node not in (n.name for n in cl.nodes):
        raise BadInput(f"--node {node!r} is not a node: choose from " + ", ".join(n.name for n in cl.nodes))
    for t in targets or ["r0"]:
        if t not in ranks and t not in ("memguard", "watchdog"):
            raise BadInput(f"no unit {t!r}: choose from {', '.join(ranks)}, memguard or watchdog")
    missing = []
    for t in targets or ["r0"]:
        if t == "memguard":
            picks = [(n, [names.MEMGUARD_UNIT]) for n in cl.nodes if not node or n.name == node]
        else:
            spec, units = ranks.get(t, (cfg.head, [names.WATCHDOG_UNIT]))
            picks = [(cl.node(spec), units)]
        for n, units in picks:
            seen = cl.probe(n)
            for unit in units:
                if not seen.unit(unit).installed:
                    missing.append(f"{unit} on {n.label}")
                    continue
                print(f"---- {unit} on {n.label} ----", flush=True)
                cl.journal(n, unit, lines, follow=follow and len(picks) == 1 and len(units) == 1, fg=True)
    if missing:
        raise UserError(f"there is no {', '.join(missing)}: `doit launch` installs the units "
                        "(`doit status` shows what runs)")
