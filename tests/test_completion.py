"""`doit completion`: bash completes dsv41's task names and each task's options, tested in a real bash
without the bash-completion package (it needs none)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    env = {**os.environ, "STATE_DIR": str(tmp_path_factory.mktemp("state")), "WORKERS": "u@a,u@b"}
    r = subprocess.run([sys.executable, "-m", "doit", "-f", os.path.join(ROOT, "dodo.py"), "completion"],
                       capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    path = tmp_path_factory.mktemp("completion") / "doit"
    path.write_text(r.stdout)
    return path


def complete(script, *words):
    """What bash offers after `doit WORDS...` (the last word is the one being completed)."""
    line = " ".join(["doit", *words])
    code = (f"source {script}; COMP_WORDS=(doit {' '.join(words) or chr(39) * 2}); "
            f"COMP_CWORD={len(words)}; COMP_LINE='{line}'; COMP_POINT={len(line)}; "
            "_dsv41_doit doit; printf '%s\\n' \"${COMPREPLY[@]}\"")
    r = subprocess.run(["bash", "--norc", "--noprofile", "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr          # no "command not found" on any TAB
    return set(r.stdout.split())


def test_task_names(script):
    assert {"status", "stop"} <= complete(script, "st")
    assert {"launch", "logs"} <= complete(script, "l")
    assert "clear-trip" in complete(script, "cl")
    assert complete(script, "_") == set()                     # the internal _workers task is not offered
    assert {"list", "help", "info"} <= complete(script, "")   # doit's own commands too


def test_each_tasks_options_and_arguments(script):
    assert complete(script, "status", "--") == {"--json"}
    assert complete(script, "top", "--") == {"--json", "--once", "--interval"}
    assert complete(script, "logs", "r") == {"r0", "r1", "r2"}          # one rank per node: WORKERS=u@a,u@b
    assert {"memguard", "watchdog", "-f", "-n", "--node"} <= complete(script, "logs", "")


def test_config_completes_the_settings_the_schema_declares(script):
    assert complete(script, "config", "KV") == {"KV_BYTES"}
    assert {"WATCHDOG", "WATCHDOG_PROBE_S", "WATCHDOG_STALL_S"} <= complete(script, "config", "WATCHDOG")
    assert complete(script, "config", "r2.i") == {"r2.ip", "r2.ifname"}
