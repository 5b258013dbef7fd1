"""Every command that prints stops quietly when its reader goes away (`| head -1`): exit 0 or 141 (as a
tool killed by SIGPIPE), nothing on stderr but its own lines, never a BrokenPipeError traceback. The
reader here is gone before the command starts, so the first write finds the pipe closed."""
import os
import subprocess
import sys

import pytest

from servers import standin  # noqa: F401  (fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOIT = [sys.executable, "-m", "doit", "-f", os.path.join(ROOT, "dodo.py")]


def closed_reader(argv, env):
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run(argv, stdout=w, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, timeout=120)
    finally:
        os.close(w)
    return p


def quiet(p, codes=(141,)):
    assert p.returncode in codes, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr


COMMANDS = [["list"], ["list", "--all"], ["help", "launch"], ["info", "config"], ["config"],
            ["config", "--json"], ["completion"]]


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(a) for a in COMMANDS])
def test_doit_commands(args, tmp_path):
    quiet(closed_reader(DOIT + args, {**os.environ, "STATE_DIR": str(tmp_path)}))


def test_smoke_and_doit_smoke(standin, tmp_path):  # noqa: F811
    srv, url = standin
    srv.ttft, srv.itl, srv.tokens = 0.0, 0.0, 3
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "lib"), "DSV41_API_KEY": "k"}
    quiet(closed_reader([sys.executable, "-m", "dsv41.client.smoke", url], env))
    (tmp_path / "key").write_text("k\n")
    env = {**os.environ, "STATE_DIR": str(tmp_path), "PORT": url.rsplit(":", 1)[1], "SERVED_MODEL_NAME": "standin",
           "API_KEY_FILE": str(tmp_path / "key")}
    quiet(closed_reader(DOIT + ["smoke", "--json"], env))


@pytest.mark.parametrize("module", ["dsv41.client.bench --help", "dsv41.client.smoke --help", "dsv41.node.facts"])
def test_python_commands(module):
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "lib")}
    quiet(closed_reader([sys.executable, "-m", *module.split()], env), (0, 141))   # argparse drops it: 0
