"""The `lab` fixture: the lab (tests/lab/up.sh, driven through labctl.Lab), brought up once per session
if it is not up. A lab this fixture brought up is taken down at the end of the session unless LAB_KEEP=1.
It uses only a lab of this checkout, brought up for the tests or by `make lab-up`: a lab that another
checkout, a demo or a benchmark brought up fails the session with one line saying how to take it down
(a failure, not a skip: a run beside someone's lab must not pass by testing nothing, nor wreck it).

The `launched` fixture (session) makes a fixture checkpoint on the head, then verify, copy and launch
from nothing; tests that break the cluster put it back before they end.

The modules that mostly wait (alerts, monitoring, the rollout) run first: `make test` runs the unit tests
beside them. The three-node module runs last: it replaces the lab with one of three nodes, and nothing
after it has to bring two back.
"""
import os
import shlex
import subprocess
import time

import pytest

from labctl import LAB_DIR, MODEL, Lab, LabRefused, missing, up


FIRST = ("test_lab_alerts.py", "test_lab_monitoring.py", "test_lab_rollout.py")   # beside the unit tests
LAST = ("test_three_nodes.py", "test_groups_lab.py")


def run_order(name):
    return (0, FIRST.index(name)) if name in FIRST else (2, LAST.index(name)) if name in LAST else (1, name)


def pytest_collection_modifyitems(items):
    """The lab's modules: FIRST, then in name order, then LAST; stable, so each module's own order is kept."""
    items.sort(key=lambda item: (str(item.path.parent), run_order(item.path.name)))


def lab_up(**env):
    """The lab up for the tests (up.sh with LAB_FOR=tests); True when this call brought it up."""
    try:
        return up("tests", **env)
    except (LabRefused, RuntimeError) as err:
        why = str(err)
    pytest.fail(why, pytrace=False)          # outside the except: the one line, no chained traceback


@pytest.fixture(scope="session")
def lab():
    reason = missing()
    if reason:
        pytest.skip(reason)
    started = lab_up()
    yield Lab()
    if started and os.environ.get("LAB_KEEP") != "1":
        subprocess.run(["bash", str(LAB_DIR / "down.sh")], capture_output=True, text=True, timeout=300)


def launch_from_nothing(lab, env=None, mb=4):
    """Nothing of dsv41 on any node, a fixture checkpoint on the head, then verify, copy and launch."""
    for rank, node in enumerate(lab.ip):
        lab.on(node, "systemctl stop dsv41-watchdog dsv41-gateway.socket dsv41-gateway dsv41-r* dsv41-memguard 2>/dev/null; "
               "rm -rf /root/.dsv41-two-sparks "
               "/root/lab-model /etc/systemd/system/dsv41-*; systemctl daemon-reload", check=False)
    lab.on("head", f"{lab.venv}/bin/python {shlex.quote(lab.repo)}/tests/fixture_checkpoint.py {MODEL} --mb {mb}")
    t0 = time.monotonic()
    r = lab.doit("launch", env)
    print(f"launch from nothing took {time.monotonic() - t0:.1f} s")
    return r


@pytest.fixture(scope="session")
def launched(lab):
    """The stand-in cluster launched from nothing (tests that break it put it back)."""
    return launch_from_nothing(lab)
