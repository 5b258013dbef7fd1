"""dsv41: serve DeepSeek-V4.1-Flash on DGX Spark nodes. The task graph, and only that.

Each task calls one function in lib/dsv41; `doit list` is the command reference. `doit` alone runs
`launch`. A second `launch` with nothing changed does no real work: every expensive step has a
receipt or a stamp and an uptodate rule.
"""
import importlib
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))

from doit.tools import config_changed  # noqa: E402

from dsv41.config import load_config  # noqa: E402
from dsv41.doit_setup import Reporter, SizeMtimeChecker, action  # noqa: E402
from dsv41.errors import UserError, one_line  # noqa: E402

try:
    CFG = load_config()
except UserError as err:
    print(f"dsv41: {one_line(err, 2000)}", file=sys.stderr)
    sys.exit(2)

os.makedirs(CFG.state_dir, exist_ok=True)
DOIT_CONFIG = {
    "default_tasks": ["launch"],
    "dep_file": os.path.join(CFG.state_dir, "doit.db"),
    "backend": "sqlite3",
    "check_file_uptodate": SizeMtimeChecker,
    "reporter": Reporter,
    "verbosity": 2,
    "action_string_formatting": "new",
}

JSON = {"name": "json", "long": "json", "type": bool, "default": False, "help": "print JSON"}


def call(target, mutates=False):
    """A doit action running `module:function(cfg, **params)` from lib/dsv41, imported when run."""
    module, func = target.split(":")

    def run(**params):
        return getattr(importlib.import_module(f"dsv41.{module}"), func)(CFG, **params)

    run.__name__ = func
    return action(run, lock_dir=CFG.state_dir if mutates else None)


def task_config():
    """Print the effective configuration, one setting a line with where it came from."""
    return {"actions": [call("show:config")], "params": [JSON], "uptodate": [False]}


def task_preflight():
    """Check every node before anything changes: one PASS/WARN/FAIL line per check, with the fix."""
    return {"actions": [call("preflight:task")], "params": [JSON], "uptodate": [False]}


def task_download():
    """Download the checkpoint into MODEL_DIR (resumable, REVISION/HF_TOKEN honoured), then verify."""
    return {"actions": [call("checkpoint:download", mutates=True)],
            "uptodate": [lambda: _fresh("fresh_locally"),
                         config_changed({"repo": CFG.hf_repo, "revision": CFG.revision})]}


def task_verify():
    """Reassemble part files and verify every shard against the manifest; writes a receipt."""
    return {"actions": [call("checkpoint:verify", mutates=True)],
            "uptodate": [lambda: _fresh("fresh_locally")]}


def task_copy():
    """Copy the verified model to every worker over the fabric and verify it there."""
    return {"actions": [call("checkpoint:copy", mutates=True)], "task_dep": ["_workers", "verify"],
            "uptodate": [lambda: _fresh("fresh_on_workers")]}


def task__workers():
    """(internal) copy and launch need a worker: say so before anything else runs."""
    return {"actions": [action(lambda: CFG.require_workers() and None)], "uptodate": [False]}


def task_image():
    """Pull the pinned image on every node when missing; fail when nodes hold different images."""
    return {"actions": [call("image:pull", mutates=True)], "uptodate": [False]}


def task_render():
    """Render every node's systemd units into $STATE_DIR/units/r<N>/ (no node contacted when every
    per-node value is given by override)."""
    return {"actions": [call("lifecycle:render", mutates=True)], "uptodate": [False]}


def task_launch():
    """Bring the cluster up: preflight, checkpoint, image, state, units, start in order, wait for
    the API. Does nothing when everything is already up and unchanged."""
    return {"actions": [call("lifecycle:launch", mutates=True)], "task_dep": ["copy"],
            "uptodate": [False]}


def task_status():
    """Per-node table: memory guard, rank units, containers, MemAvailable, GPU memory, API health."""
    return {"actions": [call("lifecycle:status")], "params": [JSON], "uptodate": [False]}


def task_logs():
    """Journal of a unit on its node: doit logs r0|r1|...|memguard [-f] [-n N] [--node NAME]."""
    return {"actions": [call("lifecycle:logs")], "pos_arg": "units", "uptodate": [False],
            "params": [{"name": "follow", "short": "f", "type": bool, "default": False,
                        "help": "follow the journal"},
                       {"name": "lines", "short": "n", "type": int, "default": 100,
                        "help": "how many lines"},
                       {"name": "node", "long": "node", "type": str, "default": "",
                        "help": "memguard: which node (default all)"}]}


def task_stop():
    """Stop the head's rank first, then the workers', then the memory guards (idempotent)."""
    return {"actions": [call("lifecycle:stop", mutates=True)], "uptodate": [False]}


def task_plan():
    """Dry run: resolved settings, per-node facts, unit diffs and the actions launch would take."""
    return {"actions": [call("lifecycle:plan")], "uptodate": [False]}


def task_clear_trip():
    """Clear a tripped memory guard on every node (after lowering KV_BYTES or GPU_UTIL)."""
    return {"basename": "clear-trip", "actions": [call("lifecycle:clear_trip", mutates=True)],
            "uptodate": [False]}


def task_smoke():
    """Smoke-test the API: text, tools, vision, reasoning, stream; PASS/FAIL per check."""
    return {"actions": [call("show:smoke")], "params": [JSON], "uptodate": [False]}


def task_bench():
    """Benchmark prefill, decode and long context: doit bench -- --out FILE [bench options]."""
    return {"actions": [call("show:bench")], "pos_arg": "args", "uptodate": [False]}


def task_pi():
    """Register the API with the Pi coding agent on this machine (pi/install.sh)."""
    return {"actions": [call("show:pi")], "uptodate": [False]}


def task_fabric_bench():
    """Measure the fabric between head and worker with ib_write_bw and compare with expectations."""
    return {"basename": "fabric-bench", "actions": [call("fabric:bench_task")], "uptodate": [False]}


def _fresh(name):
    try:
        return getattr(importlib.import_module("dsv41.checkpoint"), name)(CFG)
    except UserError:
        return False
