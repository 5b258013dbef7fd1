"""The node-side verifier (dsv41.node.checkpoint) on small generated checkpoints in the published layout.
The command line is run with the system python3 and only lib/ on the path, as on a worker."""
import hashlib
import json
import os
import subprocess
import sys
import time

import pytest

from dsv41.head.core import verify
from dsv41.node import checkpoint
from dsv41.settings.layers import load_config
from dsv41.errors import UserError
from fixture_checkpoint import make_checkpoint, shard_name

LIB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib")
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
S5, S6 = shard_name(5), shard_name(6)


@pytest.fixture
def ck(tmp_path):
    d = tmp_path / "models" / "Deep Seek 'v4.1' \"flash\""
    facts = make_checkpoint(str(d), shard_bytes=300_000, parts=4)
    return d, tmp_path / "state dir" / "receipt.json", facts


def CK(d, receipt, **kw):
    return checkpoint.Checkpoint(str(d), str(receipt), plan="J268-ho-v31-K5n.json", **kw)


def run(d, receipt, *args, command="verify"):
    argv = [PY, "-m", "dsv41.node.checkpoint", command, str(d), "--receipt", str(receipt),
            "--plan", "J268-ho-v31-K5n.json", *args]
    return subprocess.run(argv, capture_output=True, text=True, env={"PATH": os.environ["PATH"],
                                                                       "PYTHONPATH": LIB})


def snapshot(d):
    """{relative path: sha256} of everything under d (to prove good data is untouched)."""
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, d)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def assert_one_line_failure(r, *words):
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_happy_path_reassembles_verifies_and_writes_receipt(ck):
    d, receipt, facts = ck
    r = run(d, receipt)
    assert r.returncode == 0, r.stderr
    for name, sha in facts["shards"].items():
        assert hashlib.sha256((d / name).read_bytes()).hexdigest() == sha
    assert not list(d.glob("*.part*[0-9]")), "parts are deleted once their shard verified"
    assert not list(d.glob(".*")), "no temp files left"
    rec = json.loads(receipt.read_text())
    assert {k: v["sha256"] for k, v in rec["files"].items()} == facts["shards"]
    assert rec["files"][S5]["size"] == (d / S5).stat().st_size
    assert rec["files"][S5]["mtime_ns"] == (d / S5).stat().st_mtime_ns
    assert rec["exl3_files"] == facts["exl3_files"] == 9
    assert run(d, receipt, command="check").returncode == 0


def test_second_verify_rehashes_nothing_unless_size_or_mtime_changed(ck, monkeypatch):
    d, receipt, _ = ck
    CK(d, receipt).verify()
    hashed = []
    real = checkpoint.hash_file
    monkeypatch.setattr(checkpoint, "hash_file", lambda p, pr=None: hashed.append(p) or real(p, pr))
    CK(d, receipt).verify()
    assert hashed == []
    st = (d / shard_name(2)).stat()
    os.utime(d / shard_name(2), ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert run(d, receipt, command="check").returncode == 1
    CK(d, receipt).verify()
    assert [os.path.basename(p) for p in hashed] == [shard_name(2)]


def test_flipped_byte_in_a_part_is_never_promoted(ck):
    d, receipt, facts = ck
    part = d / f"{S5}.part02"
    data = bytearray(part.read_bytes())
    data[1234] ^= 0x01
    part.write_bytes(bytes(data))
    before = snapshot(d)
    r = run(d, receipt)
    actual = hashlib.sha256(b"".join((d / f"{S5}.part{k:02d}").read_bytes() for k in range(4))).hexdigest()
    assert_one_line_failure(r, S5, facts["shards"][S5], actual)
    after = snapshot(d)
    assert not (d / S5).exists()
    assert {k: v for k, v in after.items() if ".part" in k and S5 in k} == \
        {k: v for k, v in before.items() if ".part" in k and S5 in k}, "the parts are kept"
    assert (d / S6).exists(), "the good shard is still reassembled"
    assert not list(d.glob(".*tmp")), "the temp file is removed"
    rec = json.loads(receipt.read_text())
    assert S5 not in rec["files"] and S6 in rec["files"]


def test_missing_part_in_the_middle_names_shard_and_part(ck):
    d, receipt, _ = ck
    (d / f"{S6}.part01").unlink()
    before = snapshot(d)
    r = run(d, receipt)
    assert_one_line_failure(r, S6, "part 01 is missing")
    assert not (d / S6).exists()
    assert {k: v for k, v in snapshot(d).items() if S6 in k} == {k: v for k, v in before.items() if S6 in k}


def test_truncated_part(ck):
    d, receipt, facts = ck
    last = d / f"{S6}.part03"
    last.write_bytes(last.read_bytes()[:-10])
    r = run(d, receipt)
    assert_one_line_failure(r, S6, facts["shards"][S6], "damaged or truncated")
    assert not (d / S6).exists() and last.exists()


def test_interrupted_reassembly_then_clean_rerun(ck):
    d, receipt, facts = ck
    # an interrupted run leaves half a temp file behind
    stale = d / f".{S5}{checkpoint.TMP_SUFFIX}"
    stale.write_bytes((d / f"{S5}.part00").read_bytes()[:1000] + b"garbage")
    r = run(d, receipt)
    assert r.returncode == 0, r.stderr
    assert not stale.exists()
    assert hashlib.sha256((d / S5).read_bytes()).hexdigest() == facts["shards"][S5]


def test_killed_between_rename_and_part_deletion(ck):
    d, receipt, facts = ck
    # the shard was renamed into place but the run died before recording it and deleting the parts
    (d / S5).write_bytes(b"".join((d / f"{S5}.part{k:02d}").read_bytes() for k in range(4)))
    r = run(d, receipt)
    assert r.returncode == 0, r.stderr
    assert not list(d.glob(f"{S5}.part*"))
    assert json.loads(receipt.read_text())["files"][S5]["sha256"] == facts["shards"][S5]


def test_killed_during_verify_subprocess_then_rerun(tmp_path):
    d = tmp_path / "m"
    facts = make_checkpoint(str(d), shard_bytes=40_000_000, parts=3)
    receipt = tmp_path / "r.json"
    p = subprocess.Popen([PY, "-m", "dsv41.node.checkpoint", "verify", str(d), "--receipt", str(receipt)],
                         env={"PATH": os.environ["PATH"], "PYTHONPATH": LIB}, stderr=subprocess.DEVNULL)
    stale = d / f".{S5}{checkpoint.TMP_SUFFIX}"
    deadline = time.monotonic() + 20
    while p.poll() is None and not stale.exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    p.kill()  # in the middle of a reassembly (if the machine was not faster than the poll)
    p.wait()
    r = run(d, receipt)
    assert r.returncode == 0, r.stderr
    assert {k: v["sha256"] for k, v in json.loads(receipt.read_text())["files"].items()} == facts["shards"]
    assert not list(d.glob(".*")) and not list(d.glob("*.part*[0-9]"))


def test_keep_parts(ck, monkeypatch):
    d, receipt, _ = ck
    parts = sorted(p.name for p in d.glob("*.part[0-9]*"))
    assert run(d, receipt, "--keep-parts").returncode == 0
    assert sorted(p.name for p in d.glob("*.part[0-9]*")) == parts and (d / S5).exists()
    # a second run with the parts still there does no reassembly
    monkeypatch.setattr(checkpoint.Checkpoint, "_assemble", lambda *a: pytest.fail("reassembled again"))
    CK(d, receipt, keep_parts=True).verify()
    assert run(d, receipt, command="check").returncode == 0


def test_keep_parts_from_config(ck, tmp_path):
    d, _, _ = ck
    cfg = load_config({"MODEL_DIR": str(d), "STATE_DIR": str(tmp_path / "st"), "KEEP_PARTS": "1"})
    rec = verify.verify(cfg)
    assert (d / f"{S5}.part00").exists() and S5 in rec["files"]
    assert os.path.exists(os.path.join(cfg.state_dir, 'checkpoint-receipt.json'))
    assert verify.is_fresh(cfg)
    (d / "exl3" / "qn" / "L09.part.safetensors").write_bytes(b"new")
    assert not verify.is_fresh(cfg)
    assert verify.verify(cfg)["exl3_files"] == 10


def test_damaged_whole_shard_is_left_in_place(ck):
    d, receipt, facts = ck
    bad = d / shard_name(3)
    data = bytearray(bad.read_bytes())
    data[7] ^= 0xFF
    bad.write_bytes(bytes(data))
    r = run(d, receipt)
    assert_one_line_failure(r, shard_name(3), facts["shards"][shard_name(3)],
                            hashlib.sha256(bytes(data)).hexdigest())
    assert bad.read_bytes() == bytes(data)


@pytest.mark.parametrize("breakage, words", [
    (lambda d: (d / "exl3" / "plan" / "J268-ho-v31-K5n.json").unlink(), ["J268-ho-v31-K5n.json", "missing"]),
    (lambda d: (d / "exl3" / "plan" / "J268-ho-v31-K5n.json").write_text("{}"), ["qdir"]),
    (lambda d: (d / "exl3" / "plan" / "J268-ho-v31-K5n.json").write_text("{oops"), ["not valid JSON"]),
    (lambda d: [p.unlink() for p in (d / "exl3" / "q31s").iterdir()], ["q31s", "empty"]),
    (lambda d: (d / "config.json").unlink(), ["config.json", "missing"]),
    (lambda d: (d / shard_name(1)).unlink(), [shard_name(1), "missing"]),
    (lambda d: (d / "sha256-manifest.txt").write_text("nonsense line\n"), ["sha256-manifest.txt", "line 1"]),
    (lambda d: (d / "sha256-manifest.txt").unlink(), ["sha256-manifest.txt", "missing"]),
])
def test_broken_checkpoint_one_line(ck, breakage, words):
    d, receipt, _ = ck
    breakage(d)
    r = run(d, receipt)
    assert_one_line_failure(r, *words)
    assert r.stderr.startswith("dsv41: ")
    assert run(d, receipt, command="check").returncode == 1


def test_missing_model_dir(tmp_path):
    r = run(tmp_path / "no such dir", tmp_path / "r.json")
    assert_one_line_failure(r, "no such dir", "does not exist")


def test_check_json_reports_fresh_files_and_listing(ck):
    d, receipt, _ = ck
    assert run(d, receipt).returncode == 0
    r = run(d, receipt, "--json", command="check")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["fresh"] and len(out["fresh_files"]) == 6
    assert "config.json" in out["listing"] and out["free"] > 0


def test_receipt_for_another_model_dir_is_ignored(ck, tmp_path):
    d, receipt, _ = ck
    assert run(d, receipt).returncode == 0
    other = tmp_path / "other"
    make_checkpoint(str(other), shard_bytes=1000, parts=2)
    assert run(other, receipt, command="check").returncode == 1
    with pytest.raises(UserError):
        checkpoint.Checkpoint(str(other / "x"), str(receipt)).verify()


# ---- progress: one display, in place on a terminal, plain lines otherwise -------------------------------

def on_pty(argv, env, cols=100):
    """Run argv with stderr on a pseudo-terminal (raw: a newline stays a newline, so a carriage return in
    the output can only be an in-place update); returns (exit code, what it wrote there)."""
    import fcntl
    import pty
    import struct
    import termios
    import tty
    master, slave = pty.openpty()
    tty.setraw(slave)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, cols, 0, 0))
    p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:              # EIO: the child's end is closed
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return p.wait(), out.decode(errors="replace")


def test_node_verifier_prints_plain_lines_when_stderr_is_not_a_terminal(ck, capfd):
    d, receipt, _ = ck
    CK(d, receipt, progress=lambda label, total: checkpoint.Progress(label, total, interval=0)).verify()
    err = capfd.readouterr().err
    lines = err.splitlines()
    assert "\r" not in err and len(lines) > 2, err
    assert all(ln.startswith(f"verify {d}: ") for ln in lines), err
    assert "ETA" in lines[0] and "(100%)" in lines[-1] and " in 00:0" in lines[-1], err


def test_node_verifier_quiet_when_shorter_than_the_interval(ck):
    d, receipt, _ = ck
    r = run(d, receipt)                          # stderr is a pipe; the default interval is 10 s
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_node_verifier_updates_in_place_on_a_terminal(tmp_path):
    d = tmp_path / "m"
    make_checkpoint(str(d), shard_bytes=20_000_000, parts=3)
    code, out = on_pty([PY, "-m", "dsv41.node.checkpoint", "verify", str(d), "--receipt", str(tmp_path / "r.json")],
                       {"PATH": os.environ["PATH"], "PYTHONPATH": LIB})
    assert code == 0, out
    assert out.startswith(f"\rverify {d}: ") and out.endswith("\n") and out.count("\n") == 1, repr(out)
    assert out.rstrip("\n").rsplit("\r", 1)[-1].startswith(f"verify {d}: 0.12/0.12 GB (100%)"), repr(out)


def test_node_verifier_machine_progress_lines(ck):
    d, receipt, _ = ck
    r = run(d, receipt, "--machine-progress")
    assert r.returncode == 0, r.stderr
    steps = [tuple(map(int, ln.split()[1:])) for ln in r.stderr.splitlines()]
    assert all(ln.startswith("progress ") for ln in r.stderr.splitlines()), r.stderr
    assert steps[0] == (0, 6 * 300_000) and steps[-1] == (6 * 300_000, 6 * 300_000), steps


def test_head_verify_prints_plain_lines_when_stderr_is_not_a_terminal(ck, tmp_path, capfd, monkeypatch):
    from dsv41.head.core import progress
    d, _, _ = ck
    monkeypatch.setattr(progress, "INTERVAL_S", 0)
    verify.verify(load_config({"MODEL_DIR": str(d), "STATE_DIR": str(tmp_path / "st")}))
    err = capfd.readouterr().err
    lines = err.splitlines()
    assert "\r" not in err and len(lines) > 2, err
    assert all(ln.startswith(f"verify {d}: ") for ln in lines), err
    assert "MB/s, ETA" in lines[0] and lines[-1].startswith(f"verify {d}: 1.80MB/1.80MB (100%) in 00:0"), err


def test_head_verify_updates_one_bar_in_place_on_a_terminal(tmp_path):
    d = tmp_path / "m"
    make_checkpoint(str(d), shard_bytes=20_000_000, parts=3)
    code = (f"from dsv41.head.core import verify; from dsv41.settings.layers import load_config; "
            f"verify.verify(load_config({{'MODEL_DIR': {str(d)!r}, 'STATE_DIR': {str(tmp_path / 'st')!r}}}))")
    rc, out = on_pty([sys.executable, "-c", code], {**os.environ, "PYTHONPATH": LIB}, cols=200)
    assert rc == 0, out
    assert out.count("\n") == 1 and out.endswith("\n") and "\r" in out, repr(out)   # tqdm, redrawn in place
    final = out.rstrip("\n").rsplit("\r", 1)[-1]
    assert final.startswith(f"verify {d}: 100%|") and "120MB/120MB [" in final and "B/s]" in final, repr(final)


def test_manifest_lines_for_part_files_do_not_outlive_the_parts(tmp_path):
    """A manifest may list the .partNN files too: the rebuilt shard's hash covers them, and once the
    parts are removed the checkpoint stays verified."""
    d = tmp_path / "m"
    facts = make_checkpoint(str(d), shard_bytes=300_000, parts=2)
    with open(d / "sha256-manifest.txt", "a") as f:
        for parts in facts["parts"].values():
            for p in parts:
                f.write(f"{hashlib.sha256((d / p).read_bytes()).hexdigest()}  {p}\n")
    ck = checkpoint.Checkpoint(str(d), str(tmp_path / "receipt.json"), plan=facts["plan"])
    rec = ck.verify()
    assert set(rec["files"]) == set(facts["shards"]) and not list(d.glob("*.part*"))
    assert ck.check()[0]
