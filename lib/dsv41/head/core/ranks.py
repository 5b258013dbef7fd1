"""The engine's units across the cluster, in the recipe's order: kill, stop and start them (the steps of
core.recovery.restart, the one ordered restart), the readiness wait, and which unit is down."""
import time

from dsv41.errors import UserError
from dsv41.head.core import progress, record
from dsv41.head.core.nodes import say


def stop_ranks(cl):
    for spec, unit in cl.recipe.stop_order(cl.cfg.nodes):
        cl.systemctl(cl.node(spec), "stop", unit, check=False)


def kill_ranks(cl):
    """A broken cluster's engine containers killed at once, in the stop order, before their units stop: a
    stopped (SIGSTOP) or wedged process never acts on the SIGTERM of a graceful stop, which would cost the
    whole stop grace. A node that cannot be reached is left to the units' stop."""
    for spec in cl.cfg.nodes:               # the head first, as in the stop order
        for name in cl.recipe.containers(spec):
            try:
                cl.docker_kill(cl.node(spec), name)
            except UserError:
                pass


def start_ranks(cl):
    for spec, unit in cl.recipe.start_order(cl.cfg.nodes):
        node = cl.node(spec)
        cl.systemctl(node, "reset-failed", unit, check=False)
        cl.systemctl(node, "start", unit)
        say(node, f"started {unit}")


def wait_ready(cl, within=None):
    """Ready: the recipe's readiness probe passes (for vLLM: /v1/models answers with the key and one
    token is generated), while every engine unit stays active. A failed unit stops the wait at once
    with its journal. within: (seconds, what sets them), default START_TIMEOUT_MIN's."""
    cfg = cl.cfg
    limit, what = within or (cfg.start_timeout_s, "START_TIMEOUT_MIN")
    client = cl.engine_client(read_timeout=60, create_key=True)
    started = last = time.monotonic()
    with progress.bar(f"waiting for the API at {client.base} (a first start takes about 12 min)",
                      limit, unit="s") as wait:
        while True:
            problem = ranks_down(cl)
            if problem:
                wait.close()
                show_rank_logs(cl)
                raise UserError(f"{problem}; its journal is above (doit logs r<N> for more)")
            if cl.recipe.ready(client):
                record.mark_ready(cfg.state_dir)
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
