"""The unit tests pass on the head of a real deployment, where the user has the settings exported:
the config, decision and pipe tests run here again with MODEL_DIR, STATE_DIR, PORT, MEMGUARD_GIB and a
worker in the environment (tests/conftest.py gives every test the defaults unless it sets a value)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.soak           # it runs three modules of the per-landing suite again (about 80 s)
def test_config_tests_pass_with_a_users_settings_exported(tmp_path):
    user = {"MODEL_DIR": str(tmp_path / "models/x"), "STATE_DIR": str(tmp_path / "state"), "PORT": "8001",
            "MEMGUARD_GIB": "2", "WORKER": "me@10.10.10.11", "SSH_TIMEOUT_S": "5", "DSV41_API_KEY": "k"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not lab",
                        "tests/test_config.py", "tests/test_decide.py", "tests/test_pipes.py"],
                       env={**os.environ, **user}, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    assert not (tmp_path / "state").exists()      # no test wrote into the user's state dir
