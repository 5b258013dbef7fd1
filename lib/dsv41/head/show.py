"""Tasks that read or report and change nothing on a node: config, smoke, bench, pi."""
import json
import os
import subprocess

from dsv41.config import describe
from dsv41.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def config(cfg, json=False):
    rows = describe(cfg)
    if json:
        print(_json.dumps({k: {"value": v, "source": s} for k, v, s in rows}, indent=2))
        return
    width = max(len(k) for k, _, _ in rows)
    vwidth = min(60, max(len(v) for _, v, _ in rows))
    for k, v, s in rows:
        print(f"{k:<{width}}  {v:<{vwidth}}  ({s})")


_json = json


def api_key(cfg):
    key = os.environ.get("DSV41_API_KEY", "").strip()
    if key:
        return key
    try:
        with open(cfg.api_key_file) as f:
            return f.read().strip()
    except FileNotFoundError:
        raise UserError(f"no API key: {cfg.api_key_file} does not exist; run `doit launch` first "
                        "or export DSV41_API_KEY") from None


def smoke(cfg, json=False):
    from dsv41.smoke import run_smoke
    return run_smoke(cfg.api_url, api_key(cfg), model=cfg.served_model_name, as_json=json) == 0


def bench(cfg, args=()):
    from dsv41.bench import run_bench
    args = list(args)
    if "--url" not in args:
        args = ["--url", cfg.api_url] + args
    os.environ.setdefault("DSV41_API_KEY", api_key(cfg))
    return run_bench(args) == 0


def pi(cfg):
    env = {**os.environ, "MAX_LEN": str(cfg.max_len)}
    url = os.environ.get("DSV41_BASE_URL") or cfg.api_url
    r = subprocess.run(["bash", os.path.join(ROOT, "pi", "install.sh"), url], env=env)
    return r.returncode == 0
