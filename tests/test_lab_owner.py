"""A lab records which checkout brought it up and what for; up.sh (so the lab tests' fixture, the
benchmarks and `make demo`) refuses a lab of another checkout, or one made for another use, with one
line saying how to take it down, and touches nothing of it. Run against a recorded lab state in a temp
dir (LAB_STATE), so no lab is needed and none is touched; needs root and the lab's tools."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "lab"))

import labctl  # noqa: E402

pytestmark = pytest.mark.skipif(labctl.missing() is not None, reason=str(labctl.missing()))

CASES = [("another checkout's demo", "/srv/other-checkout\ndemo\n", "tests", "demo from /srv/other-checkout"),
         ("this checkout's demo", f"{ROOT}\ndemo\n", "tests", f"demo from {ROOT}"),
         ("this checkout's tests, for a benchmark", f"{ROOT}\ntests\n", "bench", f"tests from {ROOT}"),
         ("a lab that recorded no checkout", None, "tests", "not recorded as any checkout's")]


@pytest.mark.parametrize("owner,what_for,says", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_lab_that_is_not_ours_is_refused_and_left_alone(owner, what_for, says, tmp_path):
    state = tmp_path / "lab"
    (state / "nodes" / "head").mkdir(parents=True)
    if owner is not None:
        (state / "owner").write_text(owner)
    before = sorted(p.name for p in state.rglob("*"))
    with pytest.raises(labctl.LabRefused) as refused:
        labctl.up(what_for, LAB_STATE=str(state))
    line = str(refused.value)
    assert line.startswith("lab: the lab that is up is ") and says in line, line
    checkout = owner.split()[0] if owner else ROOT
    assert f"take it down with 'make -C {checkout} lab-down'" in line
    assert sorted(p.name for p in state.rglob("*")) == before       # nothing of it touched


def test_make_demo_refuses_another_checkouts_lab_before_anything_else(tmp_path):
    state = tmp_path / "lab"
    state.mkdir()
    (state / "owner").write_text("/srv/other-checkout\nbench\n")
    r = subprocess.run(["bash", os.path.join(ROOT, "tests/lab/demo.sh")], env={**os.environ, "LAB_STATE": str(state)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    [line] = r.stderr.splitlines()
    assert "bench from /srv/other-checkout" in line and "make -C /srv/other-checkout lab-down" in line
