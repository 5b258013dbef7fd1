"""The checked rollout's decisions (core/rollout.py): which release a launch rolls out and what it refuses
before anything changes, what a failure leads to (back to the last good release, nowhere, or left as it is
with ROLLBACK=0), and which release `doit rollback` picks. The nodes are replaced by fakes of apply, the
readiness wait and the hold; the release history is real, in a temporary state dir (the lab's
tests/lab/test_lab_rollout.py runs the same rollouts on real nodes)."""
import time

import pytest

from dsv41.errors import UserError
from dsv41.settings.layers import load_config
from dsv41.head.core import releases as rel, rollout
from dsv41.head.core.decide import Desired, Kind, Step
from dsv41.head.core.gateway import Gateway
from dsv41.head.core.state import NodeState
from dsv41.head.releases import rollback_target

PIN = "ghcr.io/x/engine@sha256:" + "ab" * 32
IDS = {"head": "sha256:" + "aa" * 32, "worker1": "sha256:" + "aa" * 32}
RESTART = [Step(Kind.RESTART_RANKS, "all", "", "dsv41-r0.service changed")]


def config(tmp_path, **env):
    return load_config({"WORKER": "u@w", "STATE_DIR": str(tmp_path), "IMG": PIN, "MODEL_DIR": str(tmp_path / "m"),
                        **env})


def want(kv=1):
    unit = f"ExecStart=run --kv {kv}\n"
    return Desired(units={"head": {"dsv41-r0.service": unit}, "worker1": {"dsv41-r1.service": unit}},
                   files={"head": {}, "worker1": {}})


STATES = {"head": NodeState(versions={"kernel": "6.11"}), "worker1": NodeState(versions={"kernel": "6.11"})}


def begun(cfg, kv, **kw):
    """A launch of want(kv) that recorded its release (run() does it just before the first change)."""
    ro = rollout.prepare(cfg, want(kv), STATES, IDS, **kw)
    rollout.begin(cfg, ro)
    return ro


def good_release(cfg, kv=1, startup_s=100.0):
    ro = begun(cfg, kv)
    rel.finish(cfg.state_dir, ro.release.number, rel.GOOD, "ready", startup_s=startup_s)
    return ro.release.number


class FakeCluster:
    """Stands in for core.cluster.Cluster: the rollout only reads its cfg and names its head here (apply
    and the waits are faked)."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.head = type("Head", (), {"name": "head"})()
        self.gateway = Gateway(self)


@pytest.fixture
def nodes(monkeypatch):
    """apply, the readiness wait and the hold as fakes: `fail` names the step that raises."""
    calls = {"fail": None, "went_back": None, "evidence": None}

    def step(name):
        def run(*a, **kw):
            if calls["fail"] == name:
                raise UserError(f"{name} failed here")
        return run
    monkeypatch.setattr(rollout, "apply", step("apply"))
    monkeypatch.setattr(rollout.ranks, "wait_ready", step("ready"))
    monkeypatch.setattr(rollout, "hold", step("hold"))
    calls["drains"] = []

    def drain(gateway, reason, *a):                   # the gateway's drain: the requests in flight take 0.5 s
        calls["drains"].append(reason)
        time.sleep(0.5)
    monkeypatch.setattr(Gateway, "drain", drain)
    calls["opened"] = 0
    monkeypatch.setattr(Gateway, "open", lambda gateway: calls.update(opened=calls["opened"] + 1))

    def go_back(cl, failed, target, **kw):
        calls["went_back"] = (failed.number, target.number)
        raise rollout.RolledBack("rolled back")
    monkeypatch.setattr(rollout, "go_back", go_back)
    calls["pages"] = []
    monkeypatch.setattr(rollout.silences, "page", lambda cfg, name, summary, *a, **kw: calls["pages"].append(
        (name, summary)) or f"paged {name}")
    monkeypatch.setattr(rollout.recovery, "evidence_only",
                        lambda cl, fault, result, **kw: calls.update(evidence=fault.evidence) or {"id": "inc-1"})
    return calls


def test_the_release_in_service_is_not_recorded_again_and_a_change_begins_one(tmp_path):
    cfg = config(tmp_path)
    first = good_release(cfg)
    same = rollout.prepare(cfg, want(), STATES, IDS)
    assert same.release is None and rel.load_all(cfg.state_dir)[-1].number == first
    changed = rollout.prepare(cfg, want(2), STATES, IDS)
    assert changed.release is None and rel.load_all(cfg.state_dir)[-1].number == first     # not yet begun
    assert any(f"release {first + 1}: " in line and "dsv41-r0.service changed on head" in line
               for line in changed.lines)
    rollout.begin(cfg, changed)                                      # just before the first change on a node
    r = rel.load_all(cfg.state_dir)[-1]
    assert r == changed.release and r.number == first + 1 and changed.target.number == first
    assert r.state == rel.ROLLING_OUT and r.back_to == first and r.carrier["by"] == "doit launch"
    assert r.deadline_s == changed.deadline[0] == 600               # twice 100 s is below the 10 min floor


def test_the_release_that_just_failed_is_refused_before_anything_is_written(tmp_path):
    cfg = config(tmp_path)
    good_release(cfg)
    bad = begun(cfg, 2)
    rel.finish(cfg.state_dir, bad.release.number, rel.FAILED, "dsv41-r0.service failed")
    before = rel.load_all(cfg.state_dir)
    with pytest.raises(UserError, match="--retry-failed"):
        rollout.prepare(cfg, want(2), STATES, IDS)
    assert rel.load_all(cfg.state_dir) == before
    again = begun(cfg, 2, retry_failed=True)
    assert again.release.number == bad.release.number + 1


def test_a_release_left_rolling_out_is_finished_by_the_same_launch_or_recorded_interrupted(tmp_path):
    cfg = config(tmp_path)
    first = good_release(cfg)
    killed = begun(cfg, 2).release                                      # then the launch was killed
    resumed = rollout.prepare(cfg, want(2), STATES, IDS)
    assert resumed.resumed and resumed.release.number == killed.number and resumed.target.number == first
    assert "finishes its rollout" in resumed.lines[-1]
    back = rollout.prepare(cfg, want(1), STATES, IDS)                  # the settings of the release before
    assert back.release is None and rel.read_history(cfg.state_dir)[1] == first     # the records say so
    assert rel.load_all(cfg.state_dir)[-1].state == rel.INTERRUPTED


def test_a_failed_change_goes_back_to_the_last_good_release(tmp_path, nodes):
    cfg = config(tmp_path)
    first = good_release(cfg)
    ro = rollout.prepare(cfg, want(2), STATES, IDS)
    nodes["fail"] = "ready"
    with pytest.raises(rollout.RolledBack):
        rollout.run(FakeCluster(cfg), ro, want(2), RESTART, STATES)
    assert nodes["went_back"] == (ro.release.number, first)
    assert nodes["pages"] == [("DSV41ReleaseFailed", "rolled back")]        # the failed release pages once
    failed = rel.load_all(cfg.state_dir)[-1]
    assert failed.state == rel.FAILED and "ready failed here" in failed.result
    assert failed.back_to == first and failed.unfinished       # recorded before going back: a successor goes on


def test_a_release_that_does_not_stay_healthy_for_the_hold_fails_too(tmp_path, nodes):
    cfg = config(tmp_path)
    good_release(cfg)
    ro = rollout.prepare(cfg, want(2), STATES, IDS)
    nodes["fail"] = "hold"
    with pytest.raises(rollout.RolledBack):
        rollout.run(FakeCluster(cfg), ro, want(2), RESTART, STATES)
    assert "hold failed here" in rel.load_all(cfg.state_dir)[-1].result


def test_a_good_change_is_in_service_with_its_start_up(tmp_path, nodes):
    cfg = config(tmp_path)
    good_release(cfg)
    ro = rollout.prepare(cfg, want(2), STATES, IDS)
    rollout.run(FakeCluster(cfg), ro, want(2), RESTART, STATES)
    r = rel.load_all(cfg.state_dir)[-1]
    assert r.state == rel.GOOD and r.startup_s is not None and rel.read_history(cfg.state_dir)[1] == r.number
    assert nodes["pages"] == []
    assert nodes["drains"] == [f"release {r.number} rolling out"] and r.startup_s < 0.5   # the drain is not start-up
    assert nodes["opened"] == 1                                     # served: the door opens


def test_with_rollback_off_or_nothing_to_go_back_to_it_stays_down_with_one_line(tmp_path, nodes):
    cfg = config(tmp_path, ROLLBACK="0")
    good_release(cfg)
    ro = rollout.prepare(cfg, want(2), STATES, IDS)
    nodes["fail"] = "apply"
    with pytest.raises(UserError, match=r"ROLLBACK=0, so it stays as it is: `doit rollback 1` goes back"):
        rollout.run(FakeCluster(cfg), ro, want(2), RESTART, STATES)
    assert nodes["went_back"] is None

    first = config(tmp_path / "fresh")
    ro = rollout.prepare(first, want(), STATES, IDS)
    with pytest.raises(UserError, match="no good release to go back to"):
        rollout.run(FakeCluster(first), ro, want(), RESTART, STATES)
    assert "release 1 failed" in nodes["evidence"] and nodes["went_back"] is None


def test_a_repair_of_the_release_in_service_fails_as_before(tmp_path, nodes):
    cfg = config(tmp_path)
    good_release(cfg)
    ro = rollout.prepare(cfg, want(), STATES, IDS)
    nodes["fail"] = "ready"
    with pytest.raises(UserError, match="ready failed here"):
        rollout.run(FakeCluster(cfg), ro, want(), RESTART, STATES)
    assert nodes["went_back"] is None and rel.load_all(cfg.state_dir)[-1].state == rel.GOOD


def test_doit_rollback_picks_the_last_good_release_before_the_one_in_service(tmp_path):
    cfg = config(tmp_path)
    one, two = good_release(cfg, kv=1), good_release(cfg, kv=2)
    bad = begun(cfg, 3).release
    rel.finish(cfg.state_dir, bad.number, rel.FAILED, "r0 failed")
    history = rel.load_all(cfg.state_dir)
    assert rollback_target(history, two).number == one
    with pytest.raises(UserError, match="not good"):
        rollback_target(history, two, bad.number)
    with pytest.raises(UserError, match="the one in service"):
        rollback_target(history, two, two)
    with pytest.raises(UserError, match="no good release before"):
        rollback_target(history, one)
