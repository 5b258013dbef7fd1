"""A release's state machine (core/release_record.py, its moves taken by core/releases.py transition())
and how a release that the process driving it left unfinished is carried on by another (core/rollout.py
carry_on()): every move allowed and every one refused, each recorded durably; older records still read;
who carries it on, as `doit status` says; the deadline carried over on a fake clock; a rollout whose
process was killed with SIGKILL mid-step finished by another process. The nodes are fakes of apply, the
readiness wait and the hold; the records are real (the lab's tests/lab/test_lab_rollout.py kills real
launches)."""
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dsv41.errors import UserError
from dsv41.settings.layers import load_config
from dsv41.settings.resolved import resolved
from dsv41.head.core import release_record, releases as rel, rollout, runlock
from dsv41.head.core.decide import Desired, Kind, Step
from dsv41.head.core.gateway import Gateway
from dsv41.head.core.release_status import service_entry, service_line

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_800_000_000.0
MOVES = release_record.MOVES
STATES = list(MOVES) + [s for moves in MOVES.values() for s in moves if s not in MOVES]
FIELDS = {"image": "i", "image_ids": {}, "checkpoint": {}, "settings": {}, "node_versions": {},
          "units": {"head": {"dsv41-r0.service": "x\n"}}, "files": {}, "secret_files": {}}


def record_of(d, **over):
    """A release's fields with the settings of config(d) resolved, as launch records them."""
    return {**FIELDS, "settings": resolved(config(Path(d))), **over}


def at(d, state, n=None):
    """A release driven to `state` by the allowed moves only (a good release 1 is where it goes back)."""
    if n is None:
        one = rel.begin(d, record_of(d), 10, now=T0)
        rel.finish(d, one.number, rel.GOOD, "ready", now=T0 + 1)
    r = rel.begin(d, record_of(d, units={"head": {"dsv41-r0.service": "y\n"}}), 10, now=T0 + 2, back_to=1)
    path = {rel.ROLLING_OUT: [], rel.GOOD: [(rel.GOOD, {})], rel.INTERRUPTED: [(rel.INTERRUPTED, {})],
            rel.FAILED: [(rel.FAILED, {"back_to": 1})],
            rel.ROLLING_BACK: [(rel.FAILED, {"back_to": 1}), (rel.ROLLING_BACK, {})],
            rel.ROLLED_BACK: [(rel.FAILED, {"back_to": 1}), (rel.ROLLING_BACK, {}), (rel.ROLLED_BACK, {"rolled_back_to": 1})],
            rel.DOWN: [(rel.FAILED, {"back_to": 1}), (rel.ROLLING_BACK, {}), (rel.DOWN, {})]}[state]
    for to, fields in path:
        rel.transition(d, r.number, to, now=T0 + 3, **fields)
    return r.number


@pytest.mark.parametrize("old", STATES)
def test_every_move_is_checked_against_the_state_it_leaves_and_recorded_before_it_returns(tmp_path, old):
    for to in STATES:
        d = str(tmp_path / f"{old}-{to}".replace(" ", "_"))
        n = at(d, old)
        before = rel.load_all(d)
        if to in MOVES.get(old, ()):
            fields = {"rolled_back_to": 1} if to == rel.ROLLED_BACK else {}
            r = rel.transition(d, n, to, now=T0 + 9, **fields)
            assert rel.load_all(d)[-1] == r and r.state == to           # on disk when it returns
        else:
            with pytest.raises(release_record.IllegalMove, match=f"a release {old} cannot become {to}"):
                rel.transition(d, n, to, now=T0 + 9)
            assert rel.load_all(d) == before                            # nothing written


def test_a_release_is_unfinished_while_someone_must_carry_it_on(tmp_path):
    unfinished = {}
    for state in STATES:
        d = str(tmp_path / state.replace(" ", "_"))
        at(d, state)
        unfinished[state] = rel.load_all(d)[-1].unfinished
    assert unfinished == {rel.ROLLING_OUT: True, rel.FAILED: True, rel.ROLLING_BACK: True, rel.GOOD: False,
                          rel.INTERRUPTED: False, rel.ROLLED_BACK: False, rel.DOWN: False}
    d = str(tmp_path / "nowhere")
    n = at(d, rel.ROLLING_OUT)
    r = rel.finish(d, n, rel.FAILED, "r0 failed", back_to=None)     # ROLLBACK=0, or nothing to go back to
    assert not r.unfinished and r.finished_at and rel.unfinished(rel.load_all(d)) is None


def test_the_serving_release_follows_good_and_rolled_back(tmp_path):
    d = str(tmp_path)
    n = at(d, rel.ROLLED_BACK)
    assert rel.read_history(d)[1] == 1 and rel.load_all(d)[-1].shown_state == "failed, rolled back to 1"
    assert [r and r.number for r in rel.in_service(d)] == [1, n]     # serving 1, n failed after it
    n2 = at(d, rel.GOOD, n=n)
    assert rel.read_history(d)[1] == n2


def test_a_record_of_the_version_before_still_reads(tmp_path):
    d = str(tmp_path)
    n = at(d, rel.ROLLED_BACK)
    path = Path(rel.folder(d, n)) / rel.RECORD
    doc = json.loads(path.read_text())
    old = {k: v for k, v in doc.items() if k not in ("back_to", "deadline_s", "started_at", "carrier", "rollback_of")}
    path.write_text(json.dumps({**old, "schema": "dsv41.release/1", "state": "failed"}))
    r = rel.load_all(d)[-1]
    assert r.state == rel.ROLLED_BACK and r.rolled_back_to == 1 and r.carrier is None


def test_status_says_who_carries_an_unfinished_release_on(tmp_path):
    d = str(tmp_path)
    at(d, rel.GOOD)
    r = rel.begin(d, record_of(d, units={"head": {"dsv41-r0.service": "z\n"}}), 10, back_to=1,
                  carrier={"by": "doit launch", "pid": 4242, "since": T0})
    def line(run_lock, unit):
        return service_line(service_entry(d, {"run_lock": run_lock, "unit": unit}))
    assert f"release {r.number} rolling out (applying (the ranks not restarted yet)): carried on by `doit " \
           f"launch` pid 4242 since {rel.when(T0)}" in line("pid 4242: launch", "active")
    assert "which ended: the watchdog carries it on at its next look" in line(None, "active")
    assert "the next `doit launch` or `doit rollback` carries it on" in line(None, "inactive")
    rel.carried(d, r.number, "dsv41-watchdog", started_at=T0 + 5)
    assert "carried on by dsv41-watchdog" in line(f"pid {os.getpid()}: dsv41-watchdog: carrying", "active")
    assert "the ranks starting, then the hold" in line(None, "active")


# ---- carried on ----------------------------------------------------------------------------------------

class FakeCluster:
    def __init__(self, cfg):
        self.cfg = cfg
        self.head = type("Head", (), {"name": "head"})()
        self.gateway = Gateway(self)


def config(tmp_path):
    return load_config({"WORKER": "u@w", "STATE_DIR": str(tmp_path), "MODEL_DIR": str(tmp_path / "m"),
                        "IMG": "ghcr.io/x/engine@sha256:" + "ab" * 32})


@pytest.fixture
def fake_nodes(monkeypatch):
    """The nodes as fakes: recorded() says whether the ranks restart; apply, the waits and the hold record
    what they were given; go_back and the page are recorded."""
    seen = {"restart": True, "deadline": None, "applied": 0, "went_back": None, "pages": []}
    monkeypatch.setattr(rollout, "Cluster", FakeCluster)

    def recorded(cl, release, since=None, clock=None):
        steps = [Step(Kind.RESTART_RANKS, "all", "", "as recorded")] if seen["restart"] else []
        return Desired({}, {}), steps, {}
    monkeypatch.setattr(rollout, "recorded", recorded)
    monkeypatch.setattr(rollout, "apply", lambda *a, **kw: seen.update(applied=seen["applied"] + 1))
    monkeypatch.setattr(rollout.ranks, "wait_ready", lambda cl, within=None: seen.update(deadline=within))
    monkeypatch.setattr(rollout, "hold", lambda cl, s: None)
    monkeypatch.setattr(Gateway, "drain", lambda self, reason, *a: None)
    monkeypatch.setattr(Gateway, "open", lambda self: seen.update(opened=True))

    def go_back(cl, failed, target, **kw):
        seen["went_back"] = (failed.number, target.number)
        raise rollout.RolledBack(f"release {failed.number} failed; rolled back to release {target.number}")
    monkeypatch.setattr(rollout, "go_back", go_back)
    monkeypatch.setattr(rollout.silences, "page", lambda cfg, name, *a, **kw: seen["pages"].append(name) or "paged")
    return seen


def test_a_rollout_whose_ranks_had_started_gets_what_was_left_of_its_deadline(tmp_path, fake_nodes):
    cfg = config(tmp_path)
    d = cfg.state_dir
    at(d, rel.GOOD)
    r = rel.begin(d, record_of(d, units={"head": {"dsv41-r0.service": "z\n"}}), 10, back_to=1, deadline_s=600)
    rel.carried(d, r.number, "doit launch", started_at=T0)          # then the launch was killed
    fake_nodes["restart"] = False                                   # the ranks run it, started after T0
    rollout.carry_on(cfg, rel.load_all(d)[-1], "dsv41-watchdog", clock=lambda: T0 + 450)
    assert fake_nodes["deadline"] == (150, "what was left of the recorded rollout deadline")
    done = rel.load_all(d)[-1]
    assert done.state == rel.GOOD and rel.read_history(d)[1] == r.number and done.carrier["by"] == "dsv41-watchdog"
    assert fake_nodes.get("opened")                                # its restart is over: the door opens

    r2 = rel.begin(d, record_of(d, units={"head": {"dsv41-r0.service": "w\n"}}), 10, back_to=r.number, deadline_s=600)
    fake_nodes["restart"] = True                                    # killed before the ranks restarted
    rollout.carry_on(cfg, r2, "dsv41-watchdog", clock=lambda: T0 + 450)
    assert fake_nodes["deadline"] == (600, "the recorded rollout deadline")        # a start-up of its own


def test_a_way_back_cut_half_way_is_finished_and_pages_once(tmp_path, fake_nodes):
    cfg = config(tmp_path)
    n = at(cfg.state_dir, rel.ROLLING_BACK)
    with pytest.raises(rollout.RolledBack):
        rollout.carry_on(cfg, rel.load_all(cfg.state_dir)[-1], "dsv41-watchdog")
    assert fake_nodes["went_back"] == (n, 1) and fake_nodes["pages"] == ["DSV41ReleaseFailed"]


def test_a_rollout_killed_mid_step_is_finished_by_another_process(tmp_path, fake_nodes):
    """A real process runs the rollout (its nodes faked) and is killed with SIGKILL while the ranks start:
    its release stays rolling out with where it was, the run lock is free, and this process carries it on
    to good, as the watchdog does."""
    cfg = config(tmp_path)
    at(cfg.state_dir, rel.GOOD)
    record = json.dumps(record_of(cfg.state_dir, units={"head": {"dsv41-r0.service": "k\n"}}))
    script = textwrap.dedent(f"""
        import time
        from dsv41.settings.layers import load_config
        from dsv41.head.core import rollout, runlock, releases as rel
        from dsv41.head.core.decide import Desired, Kind, Step
        cfg = load_config({{"WORKER": "u@w", "STATE_DIR": {cfg.state_dir!r}, "MODEL_DIR": {cfg.model_dir!r},
                           "IMG": {cfg.image!r}}})
        import json
        runlock.take(cfg.state_dir, "launch")
        fields = {record!r}
        good = rel.load_all(cfg.state_dir)[0]
        ro = rollout.Rollout(None, good, (600, "test"), fields=json.loads(fields))
        rollout.apply = lambda *a, **kw: None
        from dsv41.head.core.gateway import Gateway
        Gateway.drain = lambda *a, **kw: None
        def starting(cl, within=None):
            print("ranks starting", flush=True)
            time.sleep(60)
        rollout.ranks.wait_ready = starting
        class C:
            def __init__(self, cfg):
                self.cfg, self.head = cfg, None
                self.gateway = Gateway(self)
        rollout.run(C(cfg), ro, Desired({{}}, {{}}), [Step(Kind.RESTART_RANKS, "all", "", "x")], {{}})
        """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT / "lib")})
    try:
        assert child.stdout.readline().strip() == "ranks starting"
        left = rel.unfinished(rel.load_all(cfg.state_dir))
        assert runlock.holder(cfg.state_dir) == f"pid {child.pid}: launch"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert runlock.holder(cfg.state_dir) is None                     # the flock went with it
    assert left.state == rel.ROLLING_OUT and left.started_at and left.carrier["pid"] == child.pid
    assert left.back_to == 1 and left.deadline_s == 600
    runlock.take(cfg.state_dir, "dsv41-watchdog: carrying")
    try:
        rollout.carry_on(cfg, left, "dsv41-watchdog")
    finally:
        runlock.release()
    done = rel.load_all(cfg.state_dir)[-1]
    assert done.number == left.number and done.state == rel.GOOD and rel.read_history(cfg.state_dir)[1] == done.number
    assert fake_nodes["pages"] == []


def test_doit_rollback_finishes_a_rollback_a_dead_one_left_and_stops_there(tmp_path, fake_nodes, monkeypatch):
    from dsv41.head import releases as doit_releases
    cfg = config(tmp_path)
    d = cfg.state_dir
    at(d, rel.GOOD)
    two = rel.begin(d, record_of(d, units={"head": {"dsv41-r0.service": "2\n"}}), 10, back_to=1)
    rel.finish(d, two.number, rel.GOOD, "ready")
    three = rel.begin(d, record_of(d), 10, back_to=two.number, rollback_of=1)      # `doit rollback` killed here
    called = []
    monkeypatch.setattr(rollout, "rollback", lambda *a: called.append(a))
    doit_releases.rollback(cfg)
    assert rel.load_all(d)[-1].state == rel.GOOD and rel.read_history(d)[1] == three.number and called == []
    with pytest.raises(UserError, match="the one in service"):
        doit_releases.rollback(cfg, [str(three.number)])


def test_doit_rollback_applies_a_release_as_a_new_one_and_says_so(tmp_path, fake_nodes, capsys):
    cfg = config(tmp_path)
    d = cfg.state_dir
    base = record_of(d, checkpoint=rel.checkpoint_on_disk(cfg))
    one = rel.begin(d, base, 10)
    rel.finish(d, one.number, rel.GOOD, "ready")
    two = rel.begin(d, {**base, "units": {"head": {"dsv41-r0.service": "2\n"}}}, 10, back_to=1)
    rel.finish(d, two.number, rel.GOOD, "ready")
    rollout.rollback(cfg, rel.load_all(d), rel.load_all(d)[0])
    out = capsys.readouterr().out
    made = rel.load_all(d)[-1]
    assert made.number == 3 and made.state == rel.GOOD and made.rollback_of == 1 and made.back_to == 2
    assert made.carrier["by"] == "doit rollback" and rel.read_history(d)[1] == 3
    assert "release 1's state serves again as release 3" in out, out


def test_a_history_that_makes_no_sense_is_refused_naming_the_file_and_nothing_acts_on_it(tmp_path):
    """Folders 0002 and 00002, two releases rolling out at once, a release.json that is a FIFO: every command
    that reads the history refuses in one line (none hangs), and `doit rollback` rewrites no record. A
    current.json an older version left is not read: the records say which release serves."""
    from dsv41.head import releases as doit_releases
    cfg = config(tmp_path)
    d = cfg.state_dir

    def refused(match):
        before = {p: p.read_bytes() for p in Path(d, "releases").rglob("release.json") if p.is_file()}
        for call in (lambda: rel.read_history(d), lambda: doit_releases.releases(cfg, []),
                     lambda: doit_releases.rollback(cfg, ["1"])):
            with pytest.raises(UserError, match=match):
                call()
        assert {p: p.read_bytes() for p in Path(d, "releases").rglob("release.json") if p.is_file()} == before
        assert service_line(service_entry(d)).startswith("release: ")

    at(d, rel.GOOD)
    os.rename(os.path.join(d, "releases", "0002"), os.path.join(d, "releases", "00002"))
    refused(r"releases/00002 is not a release folder this version writes")
    os.rename(os.path.join(d, "releases", "00002"), os.path.join(d, "releases", "0002"))
    serving = rel.read_history(d)[1]
    Path(d, "releases", "current.json").write_text('{"number": 7}')
    assert rel.read_history(d)[1] == serving
    r3 = rel.begin(d, record_of(d, units={"head": {"dsv41-r0.service": "3\n"}}), 10, back_to=1)
    assert not Path(d, "releases", "current.json").exists()      # an older version run again finds no stale one
    rel.finish(d, r3.number, rel.FAILED, "dsv41-r0.service failed")             # final: goes nowhere
    assert rel.read_history(d)[1] == serving                     # a failed release leaves the one before
    r4 = rel.begin(d, record_of(d, units={"head": {"dsv41-r0.service": "4\n"}}), 10, back_to=1)
    r5 = dict(json.loads(Path(rel.folder(d, r4.number), "release.json").read_text()), number=r4.number + 1)
    os.makedirs(rel.folder(d, r4.number + 1))
    Path(rel.folder(d, r4.number + 1), "release.json").write_text(json.dumps(r5))
    refused(rf"releases {r4.number} and {r4.number + 1} are both unfinished")
    os.unlink(Path(rel.folder(d, r4.number + 1), "release.json"))
    os.mkfifo(Path(rel.folder(d, r4.number + 1), "release.json"))
    refused("release.json is not a regular file")
