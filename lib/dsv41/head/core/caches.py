"""The engine's caches on the nodes: one folder per image under each node's cache/ (names.cache_key), one
subfolder per library (names.ENGINE_CACHES), as each node reports them (node.facts.cache_report).

Before the ranks start (core.recovery's ordered restart: every launch, rollback and recovery) tidy()
compares each library's cache between the ranks; one that some ranks hold and others do not (that rank
would load while the others compile, a tensor-parallel desync hazard) is cleared on every node, said in
one line, so every rank compiles it again, in step. Caches that every rank holds are kept even when their
files differ: a library may key its kernels by rank (the lab's torch inductor wrote as many files of the
same sizes under other names on each rank), and clearing those would make every start a cold one. It also removes the folders of images
that no release kept in the history runs (a rollback finds its image's caches; a new image starts empty).
`doit status` shows each node's sizes (head/status.py)."""
from dsv41 import names
from dsv41.head.core import release_history

def differing(reports):
    """(the folders of the libraries whose cache differs between the nodes, the lines saying what was and
    was not compared) from {node: its report or None}."""
    silent = [node for node, r in reports.items() if not r]
    if silent:
        return [], [f"caches: not compared before the start: {', '.join(silent)} did not report them"]
    out, parts, cut = [], [], []
    for library, _, folder in names.ENGINE_CACHES:
        libs = {node: r["libraries"][folder] for node, r in reports.items()}
        if any(lib["fingerprint"] is None for lib in libs.values()):
            cut.append(library)
        elif len({lib["files"] > 0 for lib in libs.values()}) > 1:       # held by some ranks, not all
            out.append(folder)
            parts.append(f"{library} (" + ", ".join(f"{n} {lib['files']} files, {lib['bytes'] / 1e6:.1f} MB"
                                                     for n, lib in libs.items()) + ")")
    lines = [f"caches differ between the ranks: {'; '.join(parts)}: cleared on every node before the ranks start, "
             "so every rank compiles them again, in step (a cold start for those)"] if parts else []
    if cut:
        lines.append(f"caches: {', '.join(cut)} not compared (more files than a node walks in "
                     "node.facts.CACHE_WALK_S): kept as they are")
    return out, lines


def kept_keys(cfg):
    """The image folders kept: the image about to run and every image the kept releases ran; None when
    the release history cannot be read (nothing is removed then)."""
    try:
        history = release_history.load_all(cfg.state_dir)
    except Exception:  # noqa: BLE001 - a history that cannot be read (said by every verb) removes nothing
        return None
    return {names.cache_key(cfg.image)} | {names.cache_key(r.image) for r in history if r.image}


def tidy(cl, states, log=print):
    """Before the ranks start, with their caches reported in states ({node name: NodeState}): a library
    whose cache differs between the ranks cleared on every node, and the folders of images no kept release
    runs removed, each said in one line."""
    reports = {n.name: states[n.name].caches if n.name in states else None for n in cl.nodes}
    clear, lines = differing(reports)
    keep = kept_keys(cl.cfg)
    for node in cl.nodes:
        r = reports[node.name]
        if not r:
            continue
        root = f"{cl.paths(node).state_dir}/{names.CACHE}"
        old = [o for o in r.get("others", ()) if keep is not None and o not in keep]
        paths = [f"{root}/{r['key']}/{f}" for f in clear] + [f"{root}/{o}" for o in old]
        if old:
            lines.append(f"caches on {node.name}: removed {', '.join(old)}: no kept release runs that image")
        if paths:
            done = node.run(cl.priv(node, ["rm", "-rf", "--", *paths]), check=False)
            if done.code:
                why = (done.stderr.strip().splitlines() or [f"exit {done.code}"])[-1][:200]
                lines.append(f"warning: caches on {node.name} could not be removed: {why}")
    for line in lines:
        log(line)
    return lines
