"""`doit completion`: bash completes dsv41's task names and each task's options, tested in a real bash
with the bash-completion package loaded."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASH_COMPLETION = "/usr/share/bash-completion/bash_completion"


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    if not os.path.exists(BASH_COMPLETION):
        pytest.skip("the bash-completion package is not installed (apt-get install bash-completion)")
    env = {**os.environ, "STATE_DIR": str(tmp_path_factory.mktemp("state")), "WORKERS": "u@a,u@b"}
    r = subprocess.run([sys.executable, "-m", "doit", "-f", os.path.join(ROOT, "dodo.py"), "completion"],
                       capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    path = tmp_path_factory.mktemp("completion") / "doit"
    path.write_text(r.stdout)
    return path


def complete(script, *words):
    """What bash offers after `doit WORDS...` (the last word is the one being completed)."""
    line = " ".join(["doit", *words])
    code = (f"source {BASH_COMPLETION}; source {script}; COMP_WORDS=(doit {' '.join(words) or chr(39) * 2}); "
            f"COMP_CWORD={len(words)}; COMP_LINE='{line}'; COMP_POINT={len(line)}; "
            "_dsv41_doit doit; printf '%s\\n' \"${COMPREPLY[@]}\"")
    r = subprocess.run(["bash", "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split())


def test_task_names(script):
    assert {"status", "stop"} <= complete(script, "st")
    assert {"launch", "logs"} <= complete(script, "l")
    assert "clear-trip" in complete(script, "cl")


def test_each_tasks_options_and_arguments(script):
    assert complete(script, "status", "--") == {"--json"}
    assert complete(script, "top", "--") == {"--json", "--once", "--interval"}
    assert complete(script, "logs", "r") == {"r0", "r1", "r2"}          # one rank per node: WORKERS=u@a,u@b
    assert {"memguard", "watchdog", "-f", "-n", "--node"} <= complete(script, "logs", "")
