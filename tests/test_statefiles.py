"""Every state file of the head (core/statefiles.py), each broken four ways (a wrong type, not UTF-8, a
folder in its place, truncated), read by each command that reads it, in-process: a command that needs
the file fails with one line naming it and saying to move it aside; `doit status` and `doit top --once`
say that line and answer with what they can see (here: nothing deployed, NOT RUNNING, 3). Never a
traceback."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from dsv41 import names
from dsv41.errors import UserError
from dsv41.head import incident_log, releases, status, top, watchdog
from dsv41.head.core import incidents, record, release_status, statefiles
from dsv41.head.core import releases as rel
from dsv41.settings.layers import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T = 1_800_000_000.0
INCIDENT = "20270115T080000Z-DEAD"
RELEASE = {"schema": rel.SCHEMA, "number": 1, "time": T, "state": "good", "image": "img@sha256:" + "ab" * 32,
           "image_ids": {"head": "sha256:" + "aa" * 32}, "checkpoint": {"repo": "o/m", "revision": "", "manifest_digest": ""},
           "settings": {}, "node_versions": {"head": {"kernel": "6.11"}}, "units": {"head": {"dsv41-r0.service": "x\n"}},
           "files": {"head": {"memguard.json": ["{}\n", 420]}}, "secret_files": {}, "changes": ["first release"],
           "changes_from": None, "startup_s": 90.0, "result": "ready", "failed_at": None, "finished_at": T + 100,
           "rolled_back_to": None}
OPEN = {"event": "open", "id": INCIDENT, "started": T, "verdict": "DEAD", "evidence": "no token", "fault_at": T - 5,
        "node": None, "action": "restart", "by": "dsv41-watchdog", "pid": 1, "phase": "saving the evidence"}
SUMMARY = {"schema": incidents.SCHEMA, "time": T, "verdict": "DEAD", "evidence": "no token", "fault_at": T - 5,
           "ended": None, "outage_s": None, "result": "pending", "nodes": {"head": {"files": [], "notes": []}}}
STAMP = {"image": "img@sha256:" + "ab" * 32, "ids": {"head": "sha256:" + "aa" * 32},
         "server_flags": {"img@sha256:" + "ab" * 32: {"id": "sha256:" + "aa" * 32, "flags": ["--shutdown-timeout"]}}}

# file (under the state dir) -> (its good text, its wrong types: the cases among them)
FILES = {
    names.READY: ({"time": T}, [{"time": "x"}, {"time": 1e300}, [T]]),
    names.NEEDS_REBOOT: ({"time": T, "line": "worker1 did not come back"}, [{"time": T, "line": 5}, "x"]),
    names.WATCHDOG_GAVEUP: ({"time": T, "reason": "budget spent"}, [{"time": T}, None]),
    names.WATCHDOG_STATUS: ({"time": T, "verdict": "HEALTHY", "evidence": "ok", "gave_up": None, "last_incident": None},
                            [[1, 2], {"time": T, "verdict": "DEAD", "evidence": "x",
                                      "last_incident": {"id": "a", "open": False, "started": 1e300}}]),
    names.INCIDENTS: ([OPEN], [[{**OPEN, "started": "x"}], [{**OPEN, "started": 1e300}], [{**OPEN, "pid": "1"}]]),
    names.WATCHDOG_SETTINGS: ({"config": {}}, [{"config": []}, [1]]),
    f"{names.RELEASES}/0001/{names.RELEASE_RECORD}": (RELEASE, [{**RELEASE, "time": "x"}, {**RELEASE, "units": []},
                                                             {**RELEASE, "image": 5}, {**RELEASE, "state": "odd"},
                                                             {**RELEASE, "files": {"head": {"a": ["x"]}}}]),
    f"{names.INCIDENT_DIRS}/{INCIDENT}/{names.INCIDENT_SUMMARY}": (SUMMARY, [[SUMMARY], {**SUMMARY, "time": "x"},
                                                                          {**SUMMARY, "nodes": {"head": []}}]),
    names.IMAGE_STAMP: (STAMP, [{**STAMP, "image": 5}, {**STAMP, "server_flags": {"img": ["--shutdown-timeout"]}}, [STAMP]]),
}


def text(doc, name):
    if name == names.INCIDENTS:
        return "".join(json.dumps(e) + "\n" for e in doc)
    return json.dumps(doc, indent=1) + "\n"


def state(tmp_path, name, how, wrong=None):
    """A state dir holding every file good but `name`, broken `how`; -> (its path, the broken file)."""
    sd = tmp_path / "state"
    for n, (good, _) in FILES.items():
        (sd / n).parent.mkdir(parents=True, exist_ok=True)
        (sd / n).write_text(text(good, n))
    path = sd / name
    good = text(FILES[name][0], name)
    if how == "a wrong type":
        path.write_text(text(wrong, name))
    elif how == "not UTF-8":
        path.write_bytes(good.encode()[:-3] + b"\xff\xfe" + good.encode()[-3:])
    elif how == "a folder":
        path.unlink()
        path.mkdir()
    elif how == "truncated":
        path.write_text(good[: len(good) // 2])
    return str(sd), str(path)


def cfg_for(monkeypatch, sd):
    monkeypatch.setenv("STATE_DIR", sd)
    monkeypatch.setenv("PORT", "18999")
    monkeypatch.setenv("MPORT", "18998")
    return load_config()


def readers(cfg, name):
    """The commands (in-process) that need this file to answer: each must fail with the one line."""
    sd = cfg.state_dir
    out = {
        names.READY: [],
        names.NEEDS_REBOOT: [lambda: record.needs_reboot(sd)],                      # launch
        names.WATCHDOG_GAVEUP: [lambda: record.gave_up(sd)],                        # launch, the watchdog
        names.WATCHDOG_STATUS: [lambda: record.watchdog_status(sd)],
        names.INCIDENTS: [lambda: incident_log.incidents(cfg), lambda: record.incidents(sd)],
        names.WATCHDOG_SETTINGS: [lambda: watchdog.load_settings(sd)],
        f"{names.RELEASES}/0001/{names.RELEASE_RECORD}": [lambda: releases.releases(cfg),
                                                          lambda: releases.releases(cfg, ["show", "1"]),
                                                          lambda: releases.rollback(cfg, ["1"])],
        f"{names.INCIDENT_DIRS}/{INCIDENT}/{names.INCIDENT_SUMMARY}": [lambda: incident_log.incidents(cfg),
                                                                      lambda: incident_log.incidents(cfg, ["show"])],
        names.IMAGE_STAMP: [lambda: statefiles.server_flags(sd, STAMP["image"])],           # render, plan, launch
    }
    return out[name]


def run_status(cfg, capsys):
    with pytest.raises(SystemExit) as ex:
        status.status(cfg)
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return ex.value.code, out


def one_line_about(err, path):
    assert "\n" not in str(err) and path in str(err) and "move it aside" in str(err), str(err)


CASES = [(name, how, wrong) for name, (_, wrongs) in FILES.items()
         for how, wrong in [*(("a wrong type", w) for w in wrongs), ("not UTF-8", None), ("a folder", None),
                            ("truncated", None)]]


@pytest.mark.parametrize("name,how,wrong", CASES, ids=[f"{n}-{h}-{i}" for i, (n, h, _) in enumerate(CASES)])
def test_a_broken_state_file_is_one_line_for_every_command_that_reads_it(tmp_path, monkeypatch, capsys, name, how, wrong):
    sd, path = state(tmp_path, name, how, wrong)
    cfg = cfg_for(monkeypatch, sd)
    torn = how == "truncated" and name == names.INCIDENTS       # a torn last line: a crash while appending
    for read in readers(cfg, name):
        if torn:
            read()
            continue
        with pytest.raises(UserError) as err:
            read()
        one_line_about(err.value, path)
    capsys.readouterr()
    code, out = run_status(cfg, capsys)
    assert code == 3 and "NOT RUNNING" in out.out, out        # what it can see: nothing deployed here
    said = [line for line in out.err.splitlines() if path in line] + [
        line for line in out.out.splitlines() if line.startswith("release:") and path in line]
    reads = name not in (names.WATCHDOG_SETTINGS, f"{names.INCIDENT_DIRS}/{INCIDENT}/{names.INCIDENT_SUMMARY}",
                         names.IMAGE_STAMP)
    assert len(said) == (1 if reads and not torn else 0), out
    if said:
        assert "move it aside" in said[0]
    top.top(cfg, once=True, interval=0)                         # doit top --once: the same lines
    out = capsys.readouterr()
    assert "cluster: NOT RUNNING" in out.out and len([ln for ln in (out.out + out.err).splitlines() if path in ln]) == len(said)


def test_the_good_files_read_as_their_values(tmp_path, monkeypatch, capsys):
    sd, _ = state(tmp_path, names.READY, "good")
    cfg = cfg_for(monkeypatch, sd)
    assert record.ready_at(sd) == T and record.needs_reboot(sd)["line"] == "worker1 did not come back"
    assert record.gave_up(sd)["reason"] == "budget spent" and record.watchdog_status(sd)["verdict"] == "HEALTHY"
    [inc] = record.incidents(sd)
    assert inc["id"] == INCIDENT and inc["open"] and inc["started"] == T
    assert [r.number for r in rel.load_all(sd)] == [1] and rel.read_history(sd)[1] == 1
    assert release_status.service_entry(sd)["serving"]["number"] == 1
    assert statefiles.server_flags(sd, STAMP["image"]) == ("--shutdown-timeout",)
    assert statefiles.server_flags(sd, "another image") == ()           # not asked yet: the units go without
    assert [e["result"] for e in incidents.entries(sd)] == ["open: saving the evidence", "pending"]
    code, out = run_status(cfg, capsys)
    assert code == 3 and "dsv41:" not in out.err and "release 1 in service" in out.out


def test_a_file_in_place_of_a_folder_and_a_folder_in_place_of_the_lock(tmp_path, monkeypatch, capsys):
    sd = tmp_path / "state"
    sd.mkdir()
    (sd / names.RELEASES).write_text("x")
    (sd / names.INCIDENT_DIRS).write_text("x")
    (sd / names.DOIT_LOCK).mkdir()
    cfg = cfg_for(monkeypatch, str(sd))
    for read in (lambda: releases.releases(cfg), lambda: incident_log.incidents(cfg)):
        with pytest.raises(UserError, match="is a file, not a folder: move it aside"):
            read()
    assert record.view(str(sd)).lock is None                      # nobody holds a folder
    code, out = run_status(cfg, capsys)
    assert code == 3 and "is a file, not a folder" in out.out, out       # the release line says it


def test_the_check_names_where_a_value_differs():
    with pytest.raises(ValueError, match=r"units\.head is not an object"):
        statefiles.check({"units": {"head": []}}, {"units": {str: {str: str}}})
    with pytest.raises(ValueError, match="'x' is not a time"):
        statefiles.check({"t": "x"}, {"t": statefiles.OPT_TIME})
    assert statefiles.check({"extra": 1}, {"t": statefiles.OPT_TIME}) == {"extra": 1}
    with pytest.raises(ValueError, match="is not an int"):
        statefiles.check(True, int)


def doit(args, env):
    e = {k: v for k, v in os.environ.items() if k not in ("WORKER", "WORKERS", "DSV41_PROFILE")}
    e.update({"PORT": "18999", "MPORT": "18998", **env})
    return subprocess.run([sys.executable, "-m", "doit", "-f", os.path.join(ROOT, "dodo.py"), *args],
                          capture_output=True, text=True, env=e, cwd=ROOT, timeout=120)


def test_a_state_dir_that_is_a_file_is_bad_input_and_a_broken_doit_db_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    r = doit(["status"], {"STATE_DIR": str(tmp_path / "file")})
    assert r.returncode == 2 and r.stderr.strip() == (f"dsv41: STATE_DIR {tmp_path / 'file'} is a file, not a folder: "
                                                      "set STATE_DIR to a folder this user can write")
    r = doit(["status"], {"STATE_DIR": str(tmp_path / "file" / "sub")})
    assert r.returncode == 2 and "cannot be made (Not a directory)" in r.stderr and "Traceback" not in r.stderr
    sd = tmp_path / "state"
    sd.mkdir()
    (sd / names.DOIT_DB).write_text("not a database")
    (sd / names.WATCHDOG_STATUS).write_text("[1]")
    r = doit(["status"], {"STATE_DIR": str(sd)})
    said = [line for line in r.stderr.splitlines() if line.startswith("dsv41:")]
    assert r.returncode == 3 and "Traceback" not in r.stderr and len(said) == 2, r.stderr
    assert "doit.db cannot be read (file is not a database): move it aside" in said[0]
    assert "watchdog.status.json is not what this version writes (it is not an object)" in said[1]
    shutil.rmtree(sd)


# ---- the node's files (node/statefiles.py): here the head is the node, its state dir the same --------------

TRIP = {"time": "2027-01-15T08:00:00", "host": "head", "mem_available_bytes": 1 << 30, "floor_bytes": 2 << 30}
NODE_FILES = {
    names.GUARD_SETTINGS: ({"floor_gib": 8, "mode": "enforce"}, [{"floor_gib": "8"}, {"floor_gib": True}, [8]]),
    names.MEM_BASELINE: ({"mem_available_bytes": 10 << 30, "boot_id": "b"},
                         [{"mem_available_bytes": "x"}, {"mem_available_bytes": 1, "boot_id": 5}, None]),
    names.TRIP_MARKER: (TRIP, [[1], {**TRIP, "mem_available_bytes": "x"}, {**TRIP, "floor_bytes": None}]),
    names.RECEIPT: ({"version": 1, "model_dir": "/m", "files": {}}, [[1], {"version": 1, "model_dir": 5}]),
}
NODE_CASES = [(name, how, wrong) for name, (_, wrongs) in NODE_FILES.items()
              for how, wrong in [*(("a wrong type", w) for w in wrongs), ("not UTF-8", None), ("a folder", None),
                                 ("truncated", None)]]


@pytest.mark.parametrize("name,how,wrong", NODE_CASES, ids=[f"{n}-{h}-{i}" for i, (n, h, _) in enumerate(NODE_CASES)])
def test_a_broken_node_file_is_read_as_absent_or_said_never_fatal(tmp_path, monkeypatch, capsys, name, how, wrong):
    from dsv41.node import probe
    from dsv41.node import statefiles as node_files
    from dsv41.node.checkpoint import Checkpoint
    from dsv41.node.memguard import marker
    sd = tmp_path / "state"
    sd.mkdir()
    good = json.dumps(NODE_FILES[name][0])
    path = sd / name
    if how == "a wrong type":
        path.write_text(json.dumps(wrong))
    elif how == "not UTF-8":
        path.write_bytes(good.encode()[:-2] + b"\xff" + good.encode()[-2:])
    elif how == "a folder":
        path.mkdir()
    else:
        path.write_text(good[: len(good) // 2])
    assert probe.guard_settings(sd) is None or name != names.GUARD_SETTINGS
    assert node_files.mem_baseline(sd) == (None, None) or name != names.MEM_BASELINE
    assert Checkpoint("/m", str(sd / names.RECEIPT)).load_receipt() is None or name != names.RECEIPT
    trip = marker.read_trip(sd)
    if name == names.TRIP_MARKER:                   # a marker it cannot read still counts as a trip
        assert trip and marker.describe_trip(trip).startswith("tripped (")
    code, out = run_status(cfg_for(monkeypatch, str(sd)), capsys)
    assert code == (5 if name == names.TRIP_MARKER else 3), out


def test_the_good_node_files_read_as_their_values(tmp_path):
    from dsv41.node import probe
    from dsv41.node import statefiles as node_files
    from dsv41.node.memguard import marker
    for name, (good, _) in NODE_FILES.items():
        (tmp_path / name).write_text(json.dumps(good))
    assert probe.guard_settings(tmp_path) == {"floor_gib": 8, "mode": "enforce"}
    assert node_files.mem_baseline(tmp_path) == (10 << 30, "b")
    assert marker.describe_trip(marker.read_trip(tmp_path)).startswith("tripped at 2027-01-15T08:00:00 on head")


def test_the_guard_takes_the_rank_containers_from_good_cidfiles_only(tmp_path):
    from dsv41.node import statefiles as node_files
    run = tmp_path / names.RUN
    run.mkdir()
    good = "ab" * 32
    (run / "dsv41-r0.cid").write_text(good + "\n")
    (run / "dsv41-r1.cid").write_bytes(b"\xff\xfe not an id")    # not UTF-8, not an id
    (run / "dsv41-r2.cid").mkdir()                                   # a folder in its place
    (run / "dsv41-r3.cid").write_text("")                            # docker run cut short before writing it
    (run / "other.cid").write_text("cd" * 32)                        # not a rank's
    assert node_files.rank_cids(tmp_path) == {good: 0}
    assert node_files.rank_cids(tmp_path / "none") == {}


def test_a_generated_file_that_cannot_be_written_is_one_line(tmp_path):
    from dsv41.head.core import image
    (tmp_path / names.IMAGE_STAMP).mkdir()
    with pytest.raises(statefiles.BadStateFile, match=r"image.stamp is a folder, not a file: move it aside"):
        statefiles.stamp_image(str(tmp_path), "img", {"head": "sha256:1"}, [])
    (tmp_path / names.UNITS).write_text("x")
    with pytest.raises(statefiles.BadStateFile, match=rf"{tmp_path}/units is a file, not a folder: move it aside"):
        statefiles.write_if_changed(str(tmp_path / names.UNITS / "r0" / "dsv41-r0.service"), b"x")
    assert image.statefiles is statefiles                      # `doit image` writes its stamp through it
