"""The release history (core/releases.py) and `doit releases`: what a record holds and what it leaves out,
what changed, pruning, the learned rollout deadline, the no-flapping rule, the rollback target, a launch
killed half-way, and the verb's list and show on records this module wrote."""
import json
import os
import stat
import subprocess
import sys

import pytest

from dsv41 import names
from dsv41.errors import UserError
from dsv41.settings.layers import load_config
from dsv41.head.core import releases as rel
from dsv41.head.core.release_status import text_diff
from dsv41.head.core.desired import Desired

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIN = "ghcr.io/x/engine@sha256:" + "ab" * 32
CK = {"repo": "o/m", "revision": "r1", "manifest_digest": "sha256:" + "11" * 32}
CK2 = {"repo": "o/m", "revision": "r2", "manifest_digest": "sha256:" + "22" * 32}
T0 = 1_800_000_000.0


def fields(unit="ExecStart=run --kv 1\n", image_id="sha256:" + "aa" * 32, checkpoint=CK, kernel="6.11.0", **settings):
    return {"image": PIN, "image_ids": {"head": image_id, "worker1": image_id}, "checkpoint": checkpoint,
            "settings": {"kv_bytes": 1, **settings},
            "node_versions": {n: {"kernel": kernel, "driver": "580.95", "docker": "28.3"} for n in ("head", "worker1")},
            "units": {"head": {"dsv41-r0.service": unit}, "worker1": {"dsv41-r1.service": unit}},
            "files": {"head": {"memguard.json": ['{"floor_gib": 8}\n', 0o644]},
                      "worker1": {"memguard.json": ['{"floor_gib": 8}\n', 0o644]}},
            "secret_files": {"head": [names.SECRET_KEY]}}


def release(number, state, checkpoint=CK, startup_s=None, **kw):
    f = fields(checkpoint=checkpoint, **kw)
    return rel.Release(number=number, time=T0 + number, state=state, changes=["first release"], changes_from=None,
                       startup_s=startup_s, result="", failed_at=T0 + number if state == rel.FAILED else None, **f)


def launch(state_dir, f, state, startup_s=None, keep=10, result="ready", now=T0):
    r = rel.begin(state_dir, f, keep, now=now)
    return rel.finish(state_dir, r.number, state, result, startup_s=startup_s, now=now + 100)


# ---- the record ------------------------------------------------------------------------------------

def test_a_record_holds_what_launch_writes_but_never_a_secret(tmp_path):
    cfg = load_config({"WORKER": "u@w", "STATE_DIR": str(tmp_path), "IMG": PIN, "HF_TOKEN": "hf_sekrit_token"})
    key = "sk-the-api-key-value"
    want = Desired(units={"head": {"dsv41-r0.service": "[Service]\n"}, "worker1": {"dsv41-r1.service": "[Service]\n"}},
                   files={"head": {names.GUARD_SETTINGS: ("{}\n", 0o644), names.SECRET_KEY: (f"{key}\n", 0o600),
                                   names.WATCHDOG_SETTINGS: ("{}\n", 0o600)},
                          "worker1": {names.GUARD_SETTINGS: ("{}\n", 0o644)}})
    f = rel.record_fields(cfg, want, {"head": "sha256:1", "worker1": "sha256:1"}, CK,
                          {"head": {"kernel": "6.11", "driver": "580", "docker": "28"}})
    r = rel.begin(str(tmp_path), f, keep=10, now=T0)
    path = os.path.join(rel.folder(str(tmp_path), 1), rel.RECORD)
    text = open(path).read()
    assert key not in text and "hf_sekrit_token" not in text
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(rel.folder(str(tmp_path), 1)).st_mode) == 0o700
    assert r.state == rel.ROLLING_OUT and r.changes == ["first release"]
    assert r.secret_files == {"head": [names.SECRET_KEY]}
    assert r.settings["port"] == cfg.port and r.files["head"][names.WATCHDOG_SETTINGS] == ["{}\n", 0o600]
    assert rel.changes(rel.load_all(str(tmp_path))[0], f) == ["nothing"]        # the same launch again
    # to run it again exactly as recorded: the same units and files, and the key read now goes back in its file
    again = Desired(*rel.recorded_state(rel.load_all(str(tmp_path))[0], key))
    assert again.units == want.units and again.files == want.files


def test_a_release_recorded_before_the_gateway_runs_without_it_and_one_after_with_it(tmp_path):
    from dsv41.settings.resolved import resolved
    cfg = load_config({"WORKER": "u@w", "STATE_DIR": str(tmp_path), "IMG": PIN})
    now = resolved(cfg)
    before = {k: v for k, v in now.items() if k not in ("gateway", "engine_port", "drain_s", "key_rate_per_min",
                                                        "gateway_timeout_s")}
    old = rel.settings_of(release(1, rel.GOOD, **before), cfg)
    assert old.gateway is False and old.engine_url == old.api_url == "http://127.0.0.1:8000/v1"
    new = rel.settings_of(release(2, rel.GOOD, **now), cfg)
    assert new.gateway is True and new.engine_url == "http://127.0.0.1:18000/v1"


def test_a_setting_added_since_a_record_makes_no_new_release_at_what_its_absence_meant(tmp_path):
    """The first launch after an upgrade that adds settings: the same units, files and images at the new
    settings' defaults (GATEWAY: at what a record without it meant, off) are the same release."""
    from dsv41.settings.resolved import resolved
    now = resolved(load_config({"WORKER": "u@w", "STATE_DIR": str(tmp_path), "IMG": PIN, "GATEWAY": "0"}))
    older = {k: v for k, v in now.items() if k not in ("gateway", "engine_port", "drain_s", "watchdog_interval_s")}
    assert rel.fingerprint(fields(**older)) == rel.fingerprint(fields(**now))
    on = resolved(load_config({"WORKER": "u@w", "STATE_DIR": str(tmp_path), "IMG": PIN}))
    assert rel.fingerprint(fields(**older)) != rel.fingerprint(fields(**on))          # the gateway added: a change
    assert rel.fingerprint(fields(**{**now, "drain_s": 7})) != rel.fingerprint(fields(**now))


def test_status_judges_the_door_the_release_in_service_runs_not_the_one_the_settings_say(tmp_path):
    """After `doit rollback` to a release run with GATEWAY=0 the settings still say GATEWAY=1: the engine is
    rank 0 on PORT, and status says so in a line, rather than finding nothing at ENGINE_PORT."""
    from dsv41.head.core.release_status import as_served
    from dsv41.settings.resolved import resolved
    cfg = load_config({"WORKER": "u@w", "STATE_DIR": str(tmp_path), "IMG": PIN})
    assert as_served(cfg) == (cfg, None)                                   # nothing recorded yet
    without = load_config({"WORKER": "u@w", "STATE_DIR": str(tmp_path), "IMG": PIN, "GATEWAY": "0"})
    launch(str(tmp_path), {**fields(), "settings": resolved(without)}, rel.GOOD)
    judged, line = as_served(cfg)
    assert judged.gateway is False and judged.engine_url == judged.api_url == "http://127.0.0.1:8000/v1"
    assert line == ("release 1 in service runs with GATEWAY=0 (the settings say GATEWAY=1): judged as it runs; "
                    "`doit launch` applies the settings")
    assert as_served(without) == (without, None)                           # the settings and the release agree
    launch(str(tmp_path), {**fields(), "settings": resolved(cfg)}, rel.GOOD)
    assert as_served(cfg) == (cfg, None)


def test_the_commands_that_use_what_runs_take_the_layout_of_the_release_in_service(tmp_path):
    """After a rollback to a release run with GATEWAY=0 on another PORT, keys, smoke and the others go by
    what runs: keys says there is no door, smoke asks rank 0 on the release's port, each with the line."""
    from dsv41.settings.resolved import resolved
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if k not in ("WORKER", "WORKERS", "DSV41_PROFILE", "DSV41_API_KEY")}
    env.update({"STATE_DIR": str(state), "WORKER": "u@w", "IMG": PIN, "PORT": "18999", "MPORT": "18998"})
    ran = load_config({"WORKER": "u@w", "STATE_DIR": str(state), "IMG": PIN, "GATEWAY": "0", "PORT": "18997"})
    launch(str(state), {**fields(), "settings": resolved(ran)}, rel.GOOD)
    (state / "api_key").write_text("sk-a-key\n")
    said = "dsv41: release 1 in service runs with GATEWAY=0, PORT=18997 (the settings say GATEWAY=1, PORT=18999)"

    def doit(*args):
        r = subprocess.run([sys.executable, "-m", "doit", "-f", os.path.join(ROOT, "dodo.py"), *args], env=env,
                           capture_output=True, text=True, cwd=ROOT, timeout=120, stdin=subprocess.DEVNULL)
        assert "Traceback" not in r.stderr and said in r.stderr, r.stderr
        return r
    r = doit("keys")
    assert r.returncode == 1 and "dsv41: keys: GATEWAY=0: rank 0 serves PORT with the one key" in r.stderr, r.stderr
    r = doit("smoke", "--deadline-s", "3")
    assert r.returncode != 0 and "127.0.0.1:18997" in r.stdout + r.stderr, r.stdout + r.stderr


def test_status_reads_the_history_once_for_the_layout_and_the_release_line(tmp_path, monkeypatch):
    from dsv41.head.core import release_status, releases
    from dsv41.settings.resolved import resolved
    cfg = load_config({"WORKER": "u@w", "STATE_DIR": str(tmp_path), "IMG": PIN})
    launch(str(tmp_path), {**fields(), "settings": resolved(cfg)}, rel.GOOD)
    history = release_status.history_of(cfg.state_dir)
    monkeypatch.setattr(release_status, "read_history", lambda sd: pytest.fail("the history read again"))
    monkeypatch.setattr(releases, "read_history", lambda sd: pytest.fail("the history read again"))
    assert release_status.as_served(cfg, history) == (cfg, None)
    entry = release_status.service_entry(cfg.state_dir, None, history)
    assert entry["serving"]["number"] == 1 and entry["failed"] is None and entry["rolling_out"] is None


def test_a_release_whose_settings_this_version_cannot_read_never_runs_on_todays(tmp_path):
    """A recorded PORT of "abc", or a setting of a newer version: refused naming the record (a rollback, a
    way back), and status judges by the settings with that line instead of a traceback."""
    from dsv41.head.core.release_status import as_served
    from dsv41.settings.resolved import resolved
    cfg = load_config({"WORKER": "u@w", "STATE_DIR": str(tmp_path), "IMG": PIN})
    for n, settings, said in ((1, {**resolved(cfg), "port": "abc"}, "port='abc', not a number"),
                              (2, {**resolved(cfg), "gpu_cores": 2}, "'gpu_cores', which this version does not know")):
        launch(str(tmp_path), {**fields(), "settings": settings}, rel.GOOD)
        record = os.path.join(str(tmp_path), "releases", f"{n:04d}", "release.json")
        with pytest.raises(UserError, match=f"^{record}: release {n}'s settings cannot be read") as err:
            rel.settings_of(rel.load_all(str(tmp_path))[-1], cfg)
        assert said in str(err.value) and "not run on today's settings" in str(err.value)
        judged, line = as_served(cfg)
        assert judged == cfg and line.startswith(record) and line.endswith("; judged by the settings")


def test_the_checkpoint_on_disk_is_named_by_its_manifest(tmp_path):
    cfg = load_config({"WORKER": "u@w", "STATE_DIR": str(tmp_path), "MODEL_DIR": str(tmp_path / "m"),
                       "REVISION": "abc123"})
    assert rel.checkpoint_on_disk(cfg) == {"repo": cfg.hf_repo, "revision": "abc123", "manifest_digest": ""}
    os.makedirs(tmp_path / "m")
    (tmp_path / "m" / "sha256-manifest.txt").write_text("00  a.safetensors\n")
    one = rel.checkpoint_on_disk(cfg)["manifest_digest"]
    (tmp_path / "m" / "sha256-manifest.txt").write_text("11  a.safetensors\n")
    assert one.startswith("sha256:") and rel.checkpoint_on_disk(cfg)["manifest_digest"] != one


def test_what_changed_is_said_in_plan_words_and_show_diffs_the_text():
    a = release(1, rel.GOOD)
    b = release(2, rel.GOOD, unit="ExecStart=run --kv 2\n", kernel="6.14.0", image_id="sha256:" + "bb" * 32,
                kv_bytes=2)
    got = rel.changes(a, b)
    assert "dsv41-r0.service changed on head" in got and "dsv41-r1.service changed on worker1" in got
    assert "image on head aaaaaaaaaaaa -> bbbbbbbbbbbb" in got and "KV_BYTES 1 -> 2" in got
    assert "kernel on worker1 6.11.0 -> 6.14.0" in got and not any("memguard.json" in x for x in got)
    assert rel.changes(None, b) == ["first release"] and rel.changes(a, a) == ["nothing"]
    moved = rel.changes(a, release(3, rel.GOOD, checkpoint=CK2))
    assert moved == ["checkpoint o/m@r1 (111111111111) -> o/m@r2 (222222222222)"]
    diff = text_diff(a, b)
    assert "-ExecStart=run --kv 1" in diff and "+ExecStart=run --kv 2" in diff and "+++ 2/head/dsv41-r0.service" in diff


def test_begin_measures_changes_against_the_release_in_service(tmp_path):
    d = str(tmp_path)
    launch(d, fields(), rel.GOOD)
    launch(d, fields(unit="v2\n"), rel.FAILED, result="dsv41-r1.service failed")     # went back to 1
    third = rel.begin(d, fields(unit="v3\n", kv_bytes=3), 10)
    assert third.changes_from == 1 and "KV_BYTES 1 -> 3" in third.changes


# ---- pruning -----------------------------------------------------------------------------------------

def test_pruning_keeps_the_newest_and_never_the_one_in_service_or_the_last_good(tmp_path):
    d = str(tmp_path)
    launch(d, fields(unit="1\n"), rel.GOOD, startup_s=50)                # 1: good, then in service
    for n in range(2, 6):
        launch(d, fields(unit=f"{n}\n"), rel.FAILED, keep=2)
    assert [r.number for r in rel.load_all(d)] == [1, 4, 5]
    assert rel.in_service(d)[0].number == 1 and rel.in_service(d)[1].number == 5
    assert rel.to_prune([release(n, rel.GOOD) for n in (1, 2, 3)], 1, serving=1) == [2]
    failing = [release(1, rel.GOOD), release(2, rel.FAILED), release(3, rel.FAILED)]
    assert rel.to_prune(failing, 1, serving=None) == [2]                 # the last good one stays


# ---- the learned deadline ------------------------------------------------------------------------

def test_the_rollout_deadline_is_twice_the_last_good_start_up_within_bounds():
    def deadline(*history):
        return rel.rollout_deadline_s(list(history), start_timeout_s=45 * 60, min_timeout_s=10 * 60)
    assert deadline() == 45 * 60                                              # the first release
    assert deadline(release(1, rel.GOOD, startup_s=400)) == 800
    assert deadline(release(1, rel.GOOD, startup_s=60)) == 600                # at least ROLLOUT_MIN_TIMEOUT_MIN
    assert deadline(release(1, rel.GOOD, startup_s=2000)) == 45 * 60          # at most START_TIMEOUT_MIN
    assert deadline(release(1, rel.GOOD, startup_s=400), release(2, rel.FAILED, startup_s=1500)) == 800
    assert rel.rollout_deadline_s([release(1, rel.GOOD, startup_s=60)], 5 * 60, 10 * 60) == 5 * 60


# ---- no flapping ----------------------------------------------------------------------------------

def test_the_release_that_just_failed_is_refused_unless_retried_or_changed(tmp_path):
    d = str(tmp_path)
    launch(d, fields(), rel.GOOD)
    bad = fields(unit="broken\n")
    launch(d, bad, rel.FAILED, result="not ready within 600 s", now=T0 + 1000)
    history = rel.load_all(d)
    with pytest.raises(UserError) as err:
        rel.refuse_flapping(history, rel.fingerprint(bad), retry_failed=False, now=T0 + 1100 + 300)
    line = str(err.value)
    assert "\n" not in line and "release 2 failed at 2027-01-15 08:18:20Z (5 min ago: not ready within 600 s)" in line
    assert "--retry-failed" in line
    assert rel.refuse_flapping(history, rel.fingerprint(bad), retry_failed=True, now=T0) is None
    assert rel.refuse_flapping(history, rel.fingerprint(fields(unit="fixed\n")), False, T0) is None
    assert rel.refuse_flapping(history, rel.fingerprint(fields()), False, T0) is None          # back to release 1


# ---- the rollback target ----------------------------------------------------------------------------

def test_the_rollback_target_is_the_last_good_release_on_the_checkpoint_on_disk():
    assert rel.last_good([], CK) is None                                                       # the first release
    assert rel.last_good([release(1, rel.ROLLING_OUT)], CK) is None
    history = [release(1, rel.GOOD), release(2, rel.GOOD), release(3, rel.FAILED)]
    assert rel.last_good(history, CK).number == 2                                               # skips the failed
    moved = [*history, release(4, rel.GOOD, checkpoint=CK2)]
    assert rel.last_good(moved, CK).number == 2 and rel.last_good(moved, CK2).number == 4
    assert rel.last_good([release(1, rel.GOOD)], CK2) is None                                   # never across it


def test_a_new_checkpoint_says_first_that_a_failure_cannot_go_back_past_it():
    history = [release(1, rel.GOOD)]
    line = rel.checkpoint_warning(history, CK2)
    assert line.startswith("warning: this launch runs checkpoint o/m@r2, not release 1's o/m@r1")
    assert "cannot be rolled back past the checkpoint" in line and "\n" not in line
    assert rel.checkpoint_warning(history, CK) is None and rel.checkpoint_warning([], CK2) is None


# ---- a launch killed half-way ---------------------------------------------------------------------------

def test_a_launch_killed_between_begin_and_finish_is_found_by_the_next(tmp_path):
    d = str(tmp_path)
    launch(d, fields(), rel.GOOD)
    code = ("import sys, os; sys.path.insert(0, sys.argv[2]); from dsv41.head.core import releases as rel; "
            f"rel.begin(sys.argv[1], {fields(unit='new')!r}, 10); os.kill(os.getpid(), 9)")
    r = subprocess.run([sys.executable, "-c", code, d, os.path.join(ROOT, "lib")], capture_output=True)
    assert r.returncode == -9
    history = rel.load_all(d)
    assert rel.unfinished(history).number == 2
    same = rel.next_step(history, rel.fingerprint(fields(unit="new")))
    assert same.action == "finish" and same.release.number == 2
    assert same.line.startswith("release 2 was interrupted half-way (began ") and "finishes its rollout" in same.line
    back = rel.next_step(history, rel.fingerprint(fields()))
    assert back.action == "roll back" and back.target.number == 1
    other = rel.next_step(history, rel.fingerprint(fields(unit="other")))
    assert other.action == "replace" and other.target is None
    recorded = rel.next_step(history)                   # the watchdog and `doit rollback`: as recorded
    assert recorded.action == "finish" and recorded.line.endswith("its rollout is finished as recorded")
    rel.finish(d, 2, rel.INTERRUPTED, other.line)
    assert rel.next_step(rel.load_all(d), rel.fingerprint(fields(unit="new"))) is None
    assert rel.in_service(d) == (rel.load_all(d)[0], None)


def test_the_release_in_service_is_read_from_the_records_alone_and_kept_through_pruning(tmp_path):
    """Good 1 on one checkpoint, good 2 on another, then 3 on the first fails and goes back to 1 (the last
    good on its checkpoint): 1 serves though 2 is the newest good, and pruning keeps 3, which says so."""
    d = str(tmp_path)
    launch(d, fields(), rel.GOOD)
    launch(d, fields(unit="2\n", checkpoint=CK2), rel.GOOD)
    r = rel.begin(d, fields(unit="3\n"), 10)
    rel.finish(d, r.number, rel.FAILED, "not ready", back_to=1)
    rel.rolling_back(d, r.number)
    rel.rolled_back(d, r.number, 1)
    assert rel.read_history(d)[1] == 1 and rel.in_service(d)[0].number == 1
    for n in range(4, 8):                       # failed, going nowhere: 1 still serves
        launch(d, fields(unit=f"{n}\n"), rel.FAILED, keep=2)
    assert [x.number for x in rel.load_all(d)] == [1, 2, 3, 6, 7] and rel.read_history(d)[1] == 1


def test_a_way_back_left_half_way_is_finished_first_whoever_asks(tmp_path):
    """A release that failed and was going back when its process died: launch (whatever it would run),
    rollback and the watchdog all get the same next step, its way back finished first."""
    d = str(tmp_path)
    launch(d, fields(), rel.GOOD)
    r = rel.begin(d, fields(unit="new"), 10)
    rel.finish(d, r.number, rel.FAILED, "not ready", back_to=1)
    rel.rolling_back(d, r.number)
    history = rel.load_all(d)
    for fp in (None, rel.fingerprint(fields(unit="new")), rel.fingerprint(fields()), rel.fingerprint(fields(unit="x"))):
        n = rel.next_step(history, fp)
        assert (n.action, n.release.number) == ("go back", 2) and "its way back is finished first" in n.line


def test_a_folder_left_by_a_kill_before_its_record_is_skipped_and_its_number_reused(tmp_path):
    d = str(tmp_path)
    launch(d, fields(), rel.GOOD)
    os.makedirs(rel.folder(d, 2))
    assert [r.number for r in rel.load_all(d)] == [1]
    assert rel.begin(d, fields(unit="x"), 10).number == 2


# ---- the verb ------------------------------------------------------------------------------------------

def doit(args, tmp_path):
    e = {k: v for k, v in os.environ.items() if k not in ("WORKER", "WORKERS", "DSV41_PROFILE")}
    e.update({"STATE_DIR": str(tmp_path)})
    return subprocess.run([sys.executable, "-m", "doit", "-f", os.path.join(ROOT, "dodo.py"), *args],
                          capture_output=True, text=True, env=e, cwd=ROOT, timeout=120)


def test_doit_releases_lists_and_shows_them(tmp_path):
    d = str(tmp_path)
    r = doit(["releases"], tmp_path)
    assert r.returncode == 0 and "no releases yet" in r.stdout, r.stderr
    launch(d, fields(), rel.GOOD, startup_s=95)
    r2 = rel.begin(d, fields(unit="ExecStart=run --kv 2\n", kv_bytes=2), 10, now=T0)
    rel.finish(d, r2.number, rel.FAILED, "dsv41-r1.service failed", back_to=1, now=T0 + 100)
    rel.rolling_back(d, 2)
    rel.rolled_back(d, 2, 1)
    assert [r.number for r in rel.in_service(d)] == [1, 2]              # serving 1, 2 failed after it
    r = doit(["releases"], tmp_path)
    assert r.returncode == 0, r.stderr
    rows = {line[2:].split()[0]: line for line in r.stdout.splitlines()[1:-1]}
    assert rows["1"].startswith("* ") and "abababababab" in rows["1"] and "r1" in rows["1"]
    assert "95 s" in rows["1"] and "good" in rows["1"] and "first release" in rows["1"]
    assert rows["2"].startswith("  ") and "failed, rolled back to 1" in rows["2"]
    assert "dsv41-r0.service changed on head (+2 more)" in rows["2"]
    r = doit(["releases", "show", "2"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "release 2: failed, rolled back to 1" in r.stdout and "changes against release 1:" in r.stdout
    assert "  KV_BYTES 1 -> 2" in r.stdout and "+ExecStart=run --kv 2" in r.stdout
    assert "secrets/api_key: written by launch, not stored here" in r.stdout
    r = doit(["releases", "show"], tmp_path)
    assert "release 1: good (in service)" in r.stdout
    r = doit(["releases", "show", "7"], tmp_path)
    assert r.returncode != 0 and "no release 7" in r.stderr and "Traceback" not in r.stderr
    r = doit(["releases", "shwo"], tmp_path)
    assert r.returncode != 0 and "expected `doit releases` or `doit releases show [N]`" in r.stderr


def test_a_corrupt_record_is_one_line_not_a_traceback(tmp_path):
    d = str(tmp_path)
    launch(d, fields(), rel.GOOD)
    path = os.path.join(rel.folder(d, 1), rel.RECORD)
    with open(path, "w") as f:
        f.write('{"schema": "dsv41.release/1", "number": 1')
    r = doit(["releases"], tmp_path)
    err = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode != 0 and "Traceback" not in r.stderr
    err = [line for line in err if line.startswith("dsv41:")]
    assert len(err) == 1 and f"{path} is not JSON" in err[0] and "move it aside" in err[0], r.stderr
    with open(path, "w") as f:
        json.dump({"schema": "dsv41.release/1", "number": 1, "state": "good"}, f)
    with pytest.raises(UserError, match="is not what this version writes"):
        rel.load_all(d)


def test_words_and_records_that_were_tracebacks_are_one_line(tmp_path, capsys):
    """`doit releases show` with 5,000 digits, `doit rollback` the same, `doit incidents show ³`: bad input
    (exit 2); a record whose changes are empty is listed."""
    from dsv41.errors import BadInput
    from dsv41.head import incident_log, releases as doit_releases
    cfg = load_config({"WORKER": "u@w", "STATE_DIR": str(tmp_path), "IMG": PIN})
    for call, words in ((doit_releases.releases, ["show", "9" * 5000]), (doit_releases.rollback, ["9" * 5000]),
                        (incident_log.incidents, ["show", "³"]), (incident_log.incidents, ["show", "a b"])):
        with pytest.raises(BadInput, match="expected"):
            call(cfg, words)
    launch(str(tmp_path), fields(), rel.GOOD)
    path = os.path.join(str(tmp_path), "releases", "0001", "release.json")
    doc = json.load(open(path))
    json.dump({**doc, "changes": []}, open(path, "w"))
    doit_releases.releases(cfg, [])
    assert "   1  " in capsys.readouterr().out
