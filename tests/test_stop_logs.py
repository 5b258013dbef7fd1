"""doit stop and doit logs on a head with nothing of dsv41 installed (this machine, no worker): they say
what is there and what is not, and a node or unit they do not know is one line, exit 2."""
import os
import subprocess
import sys

import pytest

from dsv41 import names

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OURS = [u for u in (names.MEMGUARD_UNIT, names.WATCHDOG_UNIT, "dsv41-r0.service")
        if os.path.exists(os.path.join(names.UNIT_DIR, u))]
pytestmark = pytest.mark.skipif(bool(OURS), reason=f"this machine has {', '.join(OURS)} installed: not touched")


def doit(tmp_path, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("WORKERS", "DSV41_PROFILE")}
    env.update(STATE_DIR=str(tmp_path / "state"), WORKER="")
    return subprocess.run([sys.executable, "-m", "doit", "-f", os.path.join(ROOT, "dodo.py"), *args], env=env,
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_stop_with_nothing_installed_says_so_and_stops_nothing(tmp_path):
    r = doit(tmp_path, "stop")
    assert r.returncode == 0, r.stderr
    assert "[head] nothing of dsv41 is installed here" in r.stdout + r.stderr
    assert "stopped" not in r.stdout + r.stderr


def test_logs_of_a_unit_that_is_not_installed_says_so_and_fails(tmp_path):
    r = doit(tmp_path, "logs", "r0")
    assert r.returncode == 1 and "----" not in r.stdout, r.stdout
    [line] = r.stderr.splitlines()[-1:]
    assert line == ("dsv41: logs: there is no dsv41-r0.service on head: `doit launch` installs the units "
                    "(`doit status` shows what runs)"), r.stderr


@pytest.mark.parametrize("args,says", [(["r0", "--node", "nope"], "--node 'nope' is not a node: choose from head"),
                                       (["memguard", "--node", "nope"], "--node 'nope' is not a node"),
                                       (["r5"], "no unit 'r5': choose from r0, memguard or watchdog"),
                                       (["r0", "-n", "ten"], "-n 'ten' is not a number of lines")])
def test_logs_of_an_unknown_node_or_unit_is_one_line_before_any_node_is_asked(args, says, tmp_path):
    r = doit(tmp_path, "logs", *args)
    assert r.returncode == 2 and r.stdout == "", r.stdout
    [line] = [ln for ln in r.stderr.splitlines() if ln.startswith("dsv41:")]
    assert line.startswith(f"dsv41: logs: {says}") and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "state" / names.LIB).exists()          # no code was shipped to a node
