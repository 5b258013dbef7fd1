"""doit plan: the dry run. Resolved settings, each node's fabric and state, unit diffs and the steps launch would
take, each with its reason, and what the release history would record. No unit, container, image, state
file or setting changes on any node; to ask a node, it makes the node's STATE_DIR when missing and ships the
node code to $STATE_DIR/lib there (core.cluster.ship_code), as every command that asks a node does."""
import difflib
import time

from dsv41.head.core import preflight, releases as rel
from dsv41.head.core.cluster import Cluster
from dsv41.head.core.decide import changed_units, decide
from dsv41.head.core.desired import desired, engine_key, read_head_plan


def plan(cfg):
    cfg.require_workers()
    cl = Cluster(cfg)
    fab = preflight.resolved_fabric(cl)
    states = cl.probe_all()
    print("\n".join(settings_lines(cfg, cl.recipe)))
    if cfg.engine_args or cfg.engine_env:
        print(f"engine changes ({cl.recipe.name}'s argv and the container's environment differ from a Spark's "
              "here):")
        for k, v, src in cfg.engine_args + cfg.engine_env:
            print(f"  {k:<28} {'dropped' if v is None else v}  ({src})")
    print("nodes:")
    for n in cl.nodes:
        f, fb = states[n.name], fab[cl.spec(n).rank]
        print(f"  r{cl.spec(n).rank} {n.label}: fabric {fb.ip} on {fb.ifname}, HCAs "
              f"{','.join(fb.hcas)}, GID {fb.gid_index}; image {'present' if f.image_id else 'missing'}; "
              f"MemAvailable {f.mem_available_kib / 2**20:.1f} GiB"
              + ("; memory guard TRIPPED" if f.tripped else ""))
    want = desired(cl, fab, engine_key(cfg), read_head_plan(cfg))
    for node, name, have, text in changed_units(cfg.nodes, want, states):
        print(f"diff {name} on {cl.specs[node].label}:")
        print("".join(difflib.unified_diff((have or "").splitlines(True), text.splitlines(True),
                                           f"installed/{name}", f"rendered/{name}")), end="")
    steps = decide(cfg.nodes, want, states, cl.recipe, cfg.groups)
    missing = [n for n in cl.nodes if not states[n.name].image_id]
    print("launch would:")
    for n in missing:
        print(f"  pull {cfg.image} on {n.label}")
    for s in steps:
        print(f"  {s.line()}")
    if not steps and not missing:
        print("  nothing: everything is installed, running and unchanged")
    for line in release_lines(cfg, want, {n.name: states[n.name].image_id for n in cl.nodes}):
        print(line)


def settings_lines(cfg, recipe):
    """The settings a plan shows first: where things are, the engine's own that size it, the ports."""
    shown = [(key.upper(), getattr(cfg, key)) for key in ("image", "model_dir", "state_dir")]
    shown += [(name, cfg.engine_value(name)) for name in recipe.plan_settings]
    shown += [(key.upper(), getattr(cfg, key)) for key in ("port", "memguard_gib")]
    return ["settings:"] + [f"  {name:<14} {value}" for name, value in shown]


def release_lines(cfg, want, image_ids):
    """What launch would record in the release history, and what it would refuse or could not undo."""
    history, serving = rel.read_history(cfg.state_dir)
    current = next((r for r in history if r.number == serving), None)
    fields = rel.record_fields(cfg, want, image_ids, rel.checkpoint_on_disk(cfg),       # versions: as recorded
                               current.node_versions if current else {})
    fp = rel.fingerprint(fields)
    refusal = rel.flapping(history, fp, time.time())
    if refusal:
        return [f"launch would refuse: {refusal}"]
    warn = rel.checkpoint_warning(history, fields["checkpoint"])
    if current is not None and rel.fingerprint(current) == fp:
        return [f"release: what would run is release {current.number}, in service"]
    changes = rel.changes(current or (history[-1] if history else None), fields)
    return ([warn] if warn else []) + [f"release: launch would record a new release ({'; '.join(changes[:6])})"]
