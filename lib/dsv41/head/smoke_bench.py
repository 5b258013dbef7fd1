"""doit smoke and doit bench: the client tools pointed at this deployment's API with its key. The
tools are imported when a task runs: every doit command imports this module."""
from dsv41.client.api import load_key


def smoke(cfg, json=False):
    from dsv41.client.smoke import run_smoke
    return run_smoke(cfg.api_url, load_key(cfg.api_key_file), model=cfg.served_model_name, as_json=json) == 0


def bench(cfg, args=()):
    """`doit bench [bench options]`: --url and --key-file default to this deployment's (a path, never the key)."""
    from dsv41.client.bench import run_bench
    args = list(args)
    if "--url" not in args:
        args = ["--url", cfg.api_url] + args
    if "--key-file" not in args:
        args += ["--key-file", cfg.api_key_file]
    return run_bench(args) == 0
