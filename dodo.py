"""dsv41: serve DeepSeek-V4.1-Flash on DGX Spark nodes. The task graph, and only that.

Each task calls one function in lib/dsv41/head; `doit list` is the command reference. `doit` alone
runs `launch`. A second `launch` with nothing changed does no real work: every expensive step has a
receipt or a stamp and an uptodate rule.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))

from doit.tools import config_changed  # noqa: E402

from dsv41.errors import UserError, one_line  # noqa: E402
from dsv41.head import (alerts, completion, config, copy_checkpoint, download, fabric_bench,  # noqa: E402
                        incident_log, keys, launch, logs, monitoring, pi, plan, releases, render, smoke_bench,
                        status, stop)
from dsv41.head.core import image, preflight, release_status, verify  # noqa: E402
from dsv41.head.core.doit_setup import (Reporter, SizeMtimeChecker, action, bad_options_exit_2,  # noqa: E402
                                        dep_file, quiet_on_closed_pipe)
from dsv41.settings.layers import load_config  # noqa: E402

quiet_on_closed_pipe()                  # `doit ... | head -1` ends quietly, as head expects
bad_options_exit_2()                    # `doit status --bogus` is bad input (2), not NOT RUNNING (3)
try:
    CFG = load_config()
    DEP_FILE = dep_file(CFG.state_dir)   # the state dir made; doit.db, or a record in memory when it is broken
except UserError as err:
    print(f"dsv41: {one_line(err, 2000)}", file=sys.stderr)
    sys.exit(2)

DOIT_CONFIG = {
    "default_tasks": ["launch"],
    "dep_file": DEP_FILE,
    "backend": "sqlite3",
    "check_file_uptodate": SizeMtimeChecker,
    "reporter": Reporter,
    "verbosity": 2,
    "action_string_formatting": "new",
}

JSON = {"name": "json", "long": "json", "type": bool, "default": False, "help": "print JSON"}


def call(func, mutates=False, served=False):
    """A doit action running func(CFG, **params); mutating tasks take the run lock first. served: func
    works with what runs, so it gets the layout of the release in service (which a rollback may have
    made other than the settings'), said on stderr when it differs."""
    def run(**params):
        return func(as_served(CFG) if served else CFG, **params)
    return action(run, name=func.__name__, lock_dir=CFG.state_dir if mutates else None)


def as_served(cfg):
    cfg, line = release_status.as_served(cfg)
    if line:
        print(f"dsv41: {line}", file=sys.stderr)
    return cfg


def top(cfg, **params):
    """doit top, imported when it runs: rich and prometheus_client would add about 30 ms to every command."""
    from dsv41.head import top as screen
    return screen.top(cfg, **params)


def fresh(check):
    """An uptodate rule from a freshness check; a node that cannot be asked means not fresh."""
    def uptodate():
        try:
            return check(CFG)
        except UserError:
            return False
    return uptodate


def task_config():
    """Print every effective setting (or those named: doit config PORT r1.ip) and where it came from."""
    return {"actions": [call(config.show)], "params": [JSON], "pos_arg": "setting", "uptodate": [False]}


def task_preflight():
    """Check every node before anything changes: one PASS/WARN/FAIL line per check, with the fix."""
    return {"actions": [call(preflight.task)], "params": [JSON], "uptodate": [False]}


def task_download():
    """Download the checkpoint into MODEL_DIR (resumable, REVISION/HF_TOKEN honoured), then verify."""
    return {"actions": [call(download.download, mutates=True)],
            "uptodate": [fresh(verify.is_fresh), config_changed({"repo": CFG.hf_repo, "revision": CFG.revision})]}


def task_verify():
    """Reassemble part files and verify every shard against the manifest; writes a receipt."""
    return {"actions": [call(verify.verify, mutates=True)], "uptodate": [fresh(verify.is_fresh)]}


def task_copy():
    """Copy the verified model to every worker over the fabric and verify it there."""
    return {"actions": [call(copy_checkpoint.copy, mutates=True)], "task_dep": ["_workers", "verify"],
            "uptodate": [fresh(copy_checkpoint.fresh_on_workers)]}


def task__workers():
    """(internal) copy and launch need a worker: say so before anything else runs."""
    return {"actions": [action(lambda: CFG.require_workers() and None)], "uptodate": [False]}


def task_image():
    """Pull the pinned image on every node when missing; fail when nodes hold different images."""
    return {"actions": [call(image.pull, mutates=True)], "uptodate": [False]}


def task_render():
    """Render every node's systemd units into $STATE_DIR/units/r<N>/; no installed unit changes.

    No node is contacted when every per-node value is given by override (asking one ships the node code)."""
    return {"actions": [call(render.render, mutates=True)], "uptodate": [False]}


def task_launch():
    """Bring the cluster up: preflight, checkpoint, image, units, start in order, wait for the API.

    Does nothing when everything is already up and unchanged."""
    return {"actions": [call(launch.launch, mutates=True)], "task_dep": ["copy"], "uptodate": [False],
            "params": [{"name": "force", "long": "force", "type": bool, "default": False,
                        "help": "start the ranks although a node's memory did not come back (NEEDS_REBOOT)"},
                       {"name": "retry_failed", "long": "retry-failed", "type": bool, "default": False,
                        "help": "launch the release that just failed and was rolled back, anyway"}]}


def task_status():
    """Per-node table: memory guard, rank units, containers, MemAvailable, GPU memory, API health."""
    return {"actions": [call(status.status)], "params": [JSON], "uptodate": [False]}


def task_top():
    """Live view: each node's memory against its guard's floor, guard and rank; the engine; the watchdog."""
    return {"actions": [call(top)], "uptodate": [False], "io": {"capture": False}, "params": [  # frames: no copy
        JSON, {"name": "once", "long": "once", "type": bool, "default": False, "help": "print one snapshot and exit"},
        {"name": "interval", "long": "interval", "type": float, "default": 2.0, "help": "seconds between refreshes"}]}


def task_logs():
    """Journal of a unit on its node: doit logs r0|r1|...|memguard|watchdog [-f] [-n N] [--node NAME]."""
    return {"actions": [call(logs.logs)], "pos_arg": "units", "uptodate": [False],
            "params": [{"name": "follow", "short": "f", "type": bool, "default": False,
                        "help": "follow the journal"},
                       {"name": "lines", "short": "n", "type": int, "default": 100,
                        "help": "how many lines"},
                       {"name": "node", "long": "node", "type": str, "default": "",
                        "help": "memguard: which node (default all)"}]}


def task_incidents():
    """Incidents saved before each restart, newest first: doit incidents [show [N]] (N=1: the last)."""
    return {"actions": [call(incident_log.incidents)], "pos_arg": "words", "uptodate": [False]}


def task_releases():
    """What ran after each launch that changed it, and which one serves: doit releases [show [N]]."""
    return {"actions": [call(releases.releases)], "pos_arg": "words", "uptodate": [False]}


def task_keys():
    """The gateway's client keys: doit keys [list | add NAME | revoke NAME | rotate NAME] (a new key is shown once)."""
    return {"actions": [call(keys.keys, served=True)], "pos_arg": "words", "uptodate": [False]}


def task_rollback():
    """Go back to release N (default: the last good one before the one in service), checked as a launch is."""
    return {"actions": [call(releases.rollback, mutates=True)], "pos_arg": "words", "uptodate": [False]}


def task_stop():
    """Stop the watchdog, drain, the head's rank, then the workers', then the memory guards (idempotent)."""
    return {"actions": [call(stop.stop, served=True)], "uptodate": [False],        # takes the run lock itself
            "params": [{"name": "free_port", "long": "free-port", "type": bool, "default": False,
                        "help": "stop the gateway too: PORT is free (without it clients get 503 \"stopped\")"},
                       {"name": "group", "long": "group", "type": int, "default": None,
                        "help": "stop serving group N only (GROUPS > 1): it drains and stops, the others serve"}]}


def task_plan():
    """Dry run: resolved settings, per-node facts, unit diffs and the steps launch would take."""
    return {"actions": [call(plan.plan)], "uptodate": [False]}


def task_clear_trip():
    """Clear a tripped memory guard on every node (after lowering KV_BYTES or GPU_UTIL); launch next."""
    return {"basename": "clear-trip", "actions": [call(stop.clear_trip, mutates=True)], "uptodate": [False]}


def task_monitoring():
    """Prometheus config, alert rules and a Grafana dashboard in $STATE_DIR/monitoring/ (--install runs them)."""
    return {"actions": [call(monitoring.monitoring, mutates=True, served=True)], "uptodate": [False],
            "params": [{"name": "install", "long": "install", "type": bool, "default": False,
                        "help": "run dsv41-prometheus.service on the head with them"}]}


def task_alerts():
    """What Alertmanager fires and silences: doit alerts [test] (test: a test alert through every receiver)."""
    return {"actions": [call(alerts.alerts)], "pos_arg": "words", "uptodate": [False]}


def task_smoke():
    """Smoke-test the API: text, tools, vision, reasoning, stream; PASS/FAIL per check."""
    return {"actions": [call(smoke_bench.smoke, served=True)], "uptodate": [False], "params": [
        JSON, {"name": "deadline_s", "long": "deadline-s", "type": float, "default": None,
               "help": "end the whole run within S seconds: checks still to run then fail (default: the smoke tool's)"}]}


def task_bench():
    """Benchmark prefill, decode and long context: doit bench -- --out FILE [bench options]."""
    return {"actions": [call(smoke_bench.bench, served=True)], "pos_arg": "args", "uptodate": [False]}


def task_pi():
    """Register the API with the Pi coding agent on this machine (pi/install.sh)."""
    return {"actions": [call(pi.install, served=True)], "uptodate": [False]}


def task_fabric_bench():
    """Measure the fabric between head and worker with ib_write_bw and compare with expectations."""
    return {"basename": "fabric-bench", "actions": [call(fabric_bench.bench_task)], "uptodate": [False]}


def task_completion():
    """Print bash completion for doit with every task's options: eval "$(doit completion)"."""
    return {"actions": [call(completion.show)], "uptodate": [False]}
