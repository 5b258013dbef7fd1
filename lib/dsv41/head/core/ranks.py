"""The engine's units across the cluster, in the recipe's order: kill, stop and start them (the steps of
core.recovery.restart, the one ordered restart), the readiness wait, and which unit is down."""
import time

from dsv41.errors import UserError
from dsv41.head.core import progress, record
from dsv41.head.core import startup as core_startup
from dsv41.head.core.nodes import say


def stop_ranks(cl):
    for g in cl.groups():                   # each serving group in the recipe's order, its first node's rank first
        for spec, unit in cl.recipe.stop_order(g.cfg.nodes):
            cl.systemctl(cl.node(spec), "stop", unit, check=False)


def kill_ranks(cl):
    """A broken cluster's engine containers killed at once, in the stop order, before their units stop: a
    stopped (SIGSTOP) or wedged process never acts on the SIGTERM of a graceful stop, which would cost the
    whole stop grace. A node that cannot be reached is left to the units' stop."""
    for spec in [s for g in cl.groups() for s in g.cfg.nodes]:     # each group's first node first, as it stops
        for name in cl.recipe.containers(spec):
            try:
                cl.docker_kill(cl.node(spec), name)
            except UserError:
                pass


def start_ranks(cl):
    for spec, unit in [o for g in cl.groups() for o in cl.recipe.start_order(g.cfg.nodes)]:
        node = cl.node(spec)
        cl.systemctl(node, "reset-failed", unit, check=False)
        cl.systemctl(node, "start", unit)
        say(node, f"started {unit}")


def wait_ready(cl, within=None):
    """Ready: the recipe's readiness probe passes (for vLLM: /v1/models answers with the key and one
    token is generated) at each serving group's engine, while every engine unit stays active. A failed unit
    stops the wait at once with its journal. within: (seconds, what sets them), default START_TIMEOUT_MIN's."""
    cfg = cl.cfg
    limit, what = within or (cfg.start_timeout_s, "START_TIMEOUT_MIN")
    groups = cl.groups()
    pending = [g.engine_client(read_timeout=60, create_key=True) for g in groups]
    where = " and ".join(c.base for c in pending)
    started = last = time.monotonic()
    with progress.bar(f"waiting for the API at {where} (a first start takes about 12 min)",
                      limit, unit="s") as wait:
        while True:
            problem = ranks_down(cl)
            if problem:
                wait.close()
                show_rank_logs(cl)
                raise UserError(f"{problem}; its journal is above (doit logs r<N> for more)")
            pending = [c for c in pending if not cl.recipe.ready(c)]
            if not pending:
                for d in {cfg.records, *(g.cfg.records for g in groups)}:
                    record.mark_ready(d)
                return
            now = time.monotonic()
            wait.update(now - last)
            last = now
            if now - started > limit:
                wait.close()
                show_rank_logs(cl)
                raise UserError(f"the API did not become ready within {limit / 60:.3g} min "
                                f"({what}); the ranks' journals are above")
            time.sleep(2)


def startup(cl, since_s=3600.0):
    """The last start-up in rank 0's journal of the last since_s seconds, as the recipe reads it
    (core.startup.Startup), or None: the recipe reads none, or the journal cannot be read."""
    try:
        units = cl.engine_units(cl.head)
        r = cl.journal(cl.head, units[0], check=False, since_s=since_s) if units else None
        return cl.recipe.startup(r.stdout) if r is not None and r.code == 0 else None
    except Exception:  # noqa: BLE001 - the phases are told, never a reason for a served start-up to fail
        return None


def measured(cl, kind, of, began):
    """The start-up that began at `began` (the head's clock: unix time) and was just served, read from
    rank 0's journal, kept as the last start-up (record.set_startup) -> {"phases", "total"} for the record
    of what started it (a release, an incident), or None when no phase could be read."""
    s = startup(cl, time.time() - began + 120)
    if s is None:
        return None
    rows = core_startup.to_record(s.phases)
    total = None if s.total is None else round(s.total, 1)
    record.set_startup(cl.cfg.records, {"time": time.time(), "kind": kind, "of": of, "phases": rows, "total": total})
    return {"phases": rows, "total": total}


def ranks_down(cl):
    """None when every engine unit is active, else a sentence naming the first that is not."""
    for node in cl.nodes:
        for unit in cl.engine_units(node):
            props = cl.unit_props(node, unit, "ActiveState", "SubState", "Result")
            if (props.get("ActiveState") not in ("active", "activating", "reloading")
                    or props.get("SubState") == "auto-restart"):  # its container exited
                return (f"rank {unit} on {node.label} is {props.get('ActiveState', 'unknown')} "
                        f"({props.get('Result', '?')})")
    return None


def show_rank_logs(cl, lines=40):
    for node in cl.nodes:
        for unit in cl.engine_units(node):
            r = cl.journal(node, unit, lines=lines, check=False)
            print(f"---- last {lines} lines of {unit} on {node.label} ----")
            print(r.stdout.rstrip() or r.stderr.rstrip() or "(empty)")
