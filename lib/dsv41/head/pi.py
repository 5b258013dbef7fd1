"""doit pi: register this deployment's API with the Pi coding agent on this machine (pi/install.sh)."""
import os
import subprocess

from dsv41.head.core import engine
from dsv41.settings.paths import ROOT


def install(cfg):
    env = {**os.environ, "MAX_LEN": str(engine.for_config(cfg).context_len())}
    url = cfg.dsv41_base_url or cfg.api_url
    return subprocess.run(["bash", str(ROOT / "pi" / "install.sh"), url], env=env).returncode == 0
