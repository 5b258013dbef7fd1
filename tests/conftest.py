"""Every test starts from a known environment: the deployment settings a user of the head has exported
(MODEL_DIR, STATE_DIR, PORT, MEMGUARD_GIB, WORKER, a profile, ...) are removed for the test's run, so a
test that starts `doit` or reads the Config sees the defaults unless it sets a value itself."""
import os

import pytest

from dsv41.settings import schema


def deployment_vars(env):
    return [k for k in env if k in schema.BY_NAME or schema.PER_NODE_RE.match(k) or k == "DSV41_API_KEY"]


@pytest.fixture(autouse=True)
def _no_user_settings(monkeypatch):
    for k in deployment_vars(os.environ):
        monkeypatch.delenv(k)
