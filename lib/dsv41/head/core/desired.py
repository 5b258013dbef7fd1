"""The desired state of every node, computed on the head: rendered units and the state files (the
guard's settings, the EXL3 plan copy, on the head the key file rank 0 mounts, the watchdog's settings and
the gateway's config). Also the keys themselves."""
import json
import os

from dsv41 import names
from dsv41.errors import UserError
from dsv41.head.core import exporter, statefiles, units
from dsv41.head.core.apikey import engine_key, group_key, read_key, read_or_create_key  # noqa: F401 (the verbs' way to the keys)
from dsv41.settings.resolved import resolved
from dsv41.head.core.decide import Desired  # noqa: F401 (what desired() returns)


def guard_settings(cfg):
    """The memory guard's floor and mode, and METRICS_DIR when set (where it keeps its textfile
    metrics): a file the guard re-reads on `systemctl reload`, so a new MEMGUARD_GIB or METRICS_DIR
    changes neither its unit nor the ranks."""
    settings = {"floor_gib": cfg.memguard_gib, "mode": cfg.memguard_mode}
    if cfg.metrics_dir:
        settings["metrics_dir"] = cfg.metrics_dir
    return json.dumps(settings) + "\n"


def read_head_plan(cfg):
    path = os.path.join(cfg.model_dir, "exl3", "plan", cfg.plan_name)
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        raise UserError(f"EXL3 plan {path} is missing: run `doit download` (or check PLAN_NAME)") from None


def watchdog_settings(cfg):
    """The watchdog's settings: the resolved Config without secrets (config.resolved), so that it runs
    on what launch resolved, never on the environment or conf/ of a later day."""
    return statefiles.watchdog_settings_text(resolved(cfg))


def state_files(cfg, spec, key, plan_text):
    """{path under the state dir: (text, mode)} one node must hold (text None when the key is not
    known yet, as in a dry run). key: rank 0's (core.apikey.engine_key); a side door's node gets its group's
    key (created once on the head) and the side door's files."""
    is_head = spec.name == cfg.all_nodes[0].name
    files = {names.GUARD_SETTINGS: (guard_settings(cfg), 0o644),
             f"{names.PLANS}/{cfg.plan_name}": (units.rewrite_plan(plan_text), 0o644)}
    if cfg.side_door_node(spec):        # its group's own key, and the side door letting only the door's in
        files[names.SECRET_KEY] = (f"{group_key(cfg, cfg.group_of(spec), create=True)}\n" if key else None, 0o600)
        files[names.SIDE_DOOR_CONFIG] = (units.side_door_node_config(cfg, spec), 0o644)
        files[names.SIDE_DOOR_KEYS] = (units.side_door_key_map(names.key_hash(key)) if key else None, 0o600)
    if is_head:
        files[names.SECRET_KEY] = (f"{key}\n" if key else None, 0o600)
        if cfg.watchdog:
            files[names.WATCHDOG_SETTINGS] = (watchdog_settings(cfg), 0o600)
        if cfg.layout.door:
            files[names.GATEWAY_CONFIG] = (units.gateway_config(cfg), 0o644)
    return files


def desired(cl, fab, key, plan_text):
    """Desired state of every node of the Cluster; pure given the nodes' paths (known after probing), but for
    the group keys a side door's node holds (created once on the head)."""
    return Desired(
        units={n.name: {**units.render_units(cl.cfg, cl.recipe, cl.spec(n), fab, cl.paths(n)),
                        **exporter.dropin(cl.cfg)} for n in cl.nodes},   # the drop-in: with METRICS_DIR
        files={n.name: state_files(cl.cfg, cl.spec(n), key, plan_text) for n in cl.nodes})
