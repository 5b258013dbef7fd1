"""doit smoke and doit bench: the client tools pointed at this deployment's API with its key. The
tools are imported when a task runs: every doit command imports this module. Their exit codes become
the task's: bad input (the tool's 2, said in its one line) exits 2, a failed check or a server that
cannot be used (1, 3) fails the task (1)."""
from dsv41.client.api import load_key
from dsv41.errors import BadInput, UserError


def _bad_input_exits_2(code):
    if code == 2:
        raise SystemExit(2)              # the tool said why in one line
    return code == 0


def smoke(cfg, json=False, deadline_s=None):
    """`doit smoke [--json] [--deadline-s S]` (S: the whole run's bound, the tool's default when None)."""
    from dsv41.client.api import check_request_timeout
    from dsv41.client.smoke import DEADLINE_S, run_smoke
    try:
        check_request_timeout(None, deadline_s)
        key = load_key(cfg.api_key_file)
    except UserError as err:
        raise BadInput(str(err)) from None
    return _bad_input_exits_2(run_smoke(cfg.api_url, key, model=cfg.served_model_name, as_json=json,
                                        deadline_s=DEADLINE_S if deadline_s is None else deadline_s))


def bench(cfg, args=()):
    """`doit bench [bench options]`: --url and --key-file default to this deployment's (a path, never the key)."""
    from dsv41.client.bench import run_bench
    args = list(args)
    if "--url" not in args:
        args = ["--url", cfg.api_url] + args
    if "--key-file" not in args:
        args += ["--key-file", cfg.api_key_file]
    return _bad_input_exits_2(run_bench(args))
