"""`doit copy` for real: rsync over the Node layer's ssh to an OpenSSH server on 127.0.0.1 whose sessions
get their own HOME (the worker's), then the shipped verifier runs there with the system python3."""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from dsv41.head import copy_checkpoint as head_copy
from dsv41.head.core import runlock, verify
from dsv41.node import checkpoint_layout
from dsv41.settings.layers import load_config
from dsv41.errors import UserError
from fixture_checkpoint import make_checkpoint, shard_name
from sshd import free_port, need_sshd, start_sshd, stop_sshd


@pytest.fixture(scope="module")
def worker_sshd(tmp_path_factory):
    """tests/sshd.py's server plus `SetEnv HOME=<worker home>` so head and worker paths differ."""
    need_sshd()
    home = tmp_path_factory.mktemp("worker-home")
    proc, facts = start_sshd(tmp_path_factory.mktemp("sshd"), f"SetEnv HOME={home}\n")
    facts.home = home
    yield facts
    stop_sshd(proc)


@pytest.fixture
def setup(worker_sshd, tmp_path, monkeypatch):
    head_home = tmp_path / "head home"
    monkeypatch.setenv("HOME", str(head_home))
    model = head_home / "models" / "Deep Seek 'v4.1' \"flash\""
    facts = make_checkpoint(str(model), shard_bytes=1_500_000, parts=3)
    wmodel = worker_sshd.home / f"w-{tmp_path.name}" / "my \"models\" 'dir'"
    cfg = load_config({"HOME": str(head_home), "MODEL_DIR": str(model), "STATE_DIR": f"~/st-{tmp_path.name}",
                       "WORKER": worker_sshd.target, "SSH_OPTS": worker_sshd.ssh_opts,
                       "WORKER_MODEL_DIR": str(wmodel)})
    wreceipt = worker_sshd.home / f"st-{tmp_path.name}" / "checkpoint-receipt.json"
    yield SimpleNamespace(cfg=cfg, model=model, wmodel=wmodel, wreceipt=wreceipt, facts=facts)
    shutil.rmtree(wmodel.parent, ignore_errors=True)
    shutil.rmtree(wreceipt.parent, ignore_errors=True)


def no_copy(monkeypatch):
    monkeypatch.setattr(head_copy, "_rsync", lambda *a: pytest.fail("rsync ran"))
    monkeypatch.setattr(head_copy, "_start_verify", lambda *a: pytest.fail("verified again"))


def test_copy_verifies_on_the_worker_and_second_copy_is_a_noop(setup, monkeypatch):
    s = setup
    assert not head_copy.fresh_on_workers(s.cfg)
    head_copy.copy(s.cfg)
    for name, sha in s.facts["shards"].items():
        assert (s.wmodel / name).exists()
    assert not list(s.wmodel.glob("*.part0*")) and not (s.wmodel / ".cache").exists()
    assert (s.wmodel / "exl3" / "plan" / "J268-ho-v31-K5n.json").exists()
    wrec = json.loads(s.wreceipt.read_text())
    assert {k: v["sha256"] for k, v in wrec["files"].items()} == s.facts["shards"]
    assert wrec["exl3_files"] == 9 and wrec["model_dir"] == str(s.wmodel)
    assert head_copy.fresh_on_workers(s.cfg)
    no_copy(monkeypatch)
    head_copy.copy(s.cfg)


def test_progress_of_the_verify_on_the_worker_reaches_the_head(setup, capfd, monkeypatch):
    """The worker's verifier reports machine-readable progress; the head shows it as its own display
    (plain lines here, stderr being no terminal), the raw lines never."""
    from dsv41.head.core import progress
    s = setup
    monkeypatch.setattr(progress, "INTERVAL_S", 0)
    head_copy.copy(s.cfg)
    err = capfd.readouterr().err
    name = s.cfg.workers[0].name
    remote = [ln for ln in err.splitlines() if ln.startswith(f"verify on {name}: ")]
    assert len(remote) >= 2 and remote[-1].startswith(f"verify on {name}: 9.00MB/9.00MB (100%) in "), err
    assert "\r" not in err and not re.search(r"^\S+: progress \d+ \d+$", err, re.M), err
    assert [ln for ln in err.splitlines() if ln.startswith(f"copy to {name}: ")], err


def test_interrupted_copy_resumes_from_the_partial(setup):
    s = setup
    verify.verify(s.cfg)
    name = shard_name(2)
    # what a killed rsync leaves: the first part of a file in the partial dir, nothing at the final name
    partial = s.wmodel / checkpoint_layout.PARTIAL_DIR / name
    partial.parent.mkdir(parents=True)
    partial.write_bytes((s.model / name).read_bytes()[:700_000])
    head_copy.copy(s.cfg)
    assert (s.wmodel / name).read_bytes() == (s.model / name).read_bytes()
    assert not partial.exists()
    assert head_copy.fresh_on_workers(s.cfg)


def test_changed_file_on_the_worker_is_sent_again(setup):
    s = setup
    head_copy.copy(s.cfg)
    f = s.wmodel / shard_name(3)
    f.write_bytes(b"x" * f.stat().st_size)
    assert not head_copy.fresh_on_workers(s.cfg)
    head_copy.copy(s.cfg)
    assert f.read_bytes() == (s.model / shard_name(3)).read_bytes()


def test_damaged_copy_fails_one_line_then_is_resent(setup):
    s = setup
    head_copy.copy(s.cfg)
    f = s.wmodel / shard_name(4)
    st = f.stat()
    data = bytearray(f.read_bytes())
    data[10] ^= 1
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))   # same size and mtime: rsync alone would skip it
    s.wreceipt.unlink()
    with pytest.raises(UserError) as e:
        head_copy.copy(s.cfg)
    msg = str(e.value)
    assert "\n" not in msg and shard_name(4) in msg and s.facts["shards"][shard_name(4)] in msg
    head_copy.copy(s.cfg)
    assert f.read_bytes() == (s.model / shard_name(4)).read_bytes()
    assert head_copy.fresh_on_workers(s.cfg)


def test_worker_with_its_own_verified_download_is_skipped(setup, monkeypatch):
    s = setup
    verify.verify(s.cfg)
    # the worker got the model another way (its own `doit download`): other mtimes, same content
    shutil.copytree(s.model, s.wmodel)
    subprocess.run(["/usr/bin/python3", "-m", "dsv41.node.checkpoint", "verify", str(s.wmodel), "--receipt",
                    str(s.wreceipt), "--plan", s.cfg.plan_name], check=True,
                   env={"PATH": os.environ["PATH"], "PYTHONPATH": checkpoint_layout.__file__.rsplit("/dsv41/", 1)[0]})
    no_copy(monkeypatch)
    head_copy.copy(s.cfg)
    assert head_copy.fresh_on_workers(s.cfg)


def test_unreachable_worker(setup, tmp_path):
    s = setup
    cfg = load_config({"HOME": os.environ["HOME"], "MODEL_DIR": str(s.model), "STATE_DIR": str(tmp_path / "st"),
                       "WORKER": "root@127.0.0.1", "SSH_OPTS": f"-p {free_port()} -o ConnectTimeout=2"})
    assert not head_copy.fresh_on_workers(cfg)
    with pytest.raises(UserError) as e:
        head_copy.copy(cfg)
    assert "\n" not in str(e.value) and "127.0.0.1" in str(e.value)


def test_copy_needs_a_worker(setup, tmp_path):
    cfg = load_config({"MODEL_DIR": str(setup.model), "STATE_DIR": str(tmp_path / "st")})
    with pytest.raises(UserError, match="WORKER"):
        head_copy.copy(cfg)


def test_killed_copy_leaves_no_rsync_behind_and_frees_the_run_lock(setup, tmp_path):
    """kill -9 of doit mid-copy: its rsyncs end with it (they would race the next run) and the run
    lock, which they hold too while they live, is free again."""
    psutil = pytest.importorskip("psutil")
    s = setup
    slow = tmp_path / "slow-bin"
    slow.mkdir()
    (slow / "rsync").write_text(f'#!/bin/sh\nexec {shutil.which("rsync")} --bwlimit=300 "$@"\n')
    (slow / "rsync").chmod(0o755)
    env = {**os.environ, "PATH": f"{slow}:{os.environ['PATH']}", "HOME": str(s.model.parents[1]),
           "MODEL_DIR": str(s.model), "STATE_DIR": f"~/st-{tmp_path.name}", "WORKER": s.cfg.workers[0].target,
           "SSH_OPTS": " ".join(s.cfg.ssh_opts), "WORKER_MODEL_DIR": str(s.wmodel)}
    code = ("import sys; sys.path.insert(0, %r); from dsv41.head import copy_checkpoint as copy; from dsv41.head.core import runlock; "
            "from dsv41.settings.layers import load_config; cfg = load_config(); runlock.take(cfg.state_dir); "
            "copy.copy(cfg)" % os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
    doit = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)

    def senders():
        return [p for p in psutil.process_iter(["cmdline"])
                if "--files-from" in " ".join(p.info["cmdline"] or []) and str(s.model) in " ".join(p.info["cmdline"])]
    deadline = time.monotonic() + 60
    while not senders():
        assert doit.poll() is None and time.monotonic() < deadline, "the copy never started rsync"
        time.sleep(0.1)
    running = senders()
    doit.kill()
    doit.wait()
    gone, alive = psutil.wait_procs(running, timeout=5)
    assert not alive, [p.info["cmdline"] for p in alive]
    assert runlock.holder(s.cfg.state_dir) is None


def test_two_workers_are_copied_at_once_and_verified_each(setup, worker_sshd, tmp_path):
    """Two workers: the module's sshd and a second one with its own HOME, reached as w1 and w2 through
    an ssh config; each gets the checkpoint, verified, and later only what it lacks."""
    s = setup
    home2 = tmp_path / "worker2-home"
    home2.mkdir()
    (tmp_path / "sshd2").mkdir()
    proc, second = start_sshd(tmp_path / "sshd2", f"SetEnv HOME={home2}\n")
    (second.dir / "authorized_keys").write_text(open(worker_sshd.key + ".pub").read())   # one client key for both
    conf = tmp_path / "ssh_config"
    conf.write_text("".join(f"Host {name}\n  HostName 127.0.0.1\n  Port {port}\n" for name, port in
                            (("w1", worker_sshd.port), ("w2", second.port)))
                    + f"Host *\n  IdentityFile {worker_sshd.key}\n  StrictHostKeyChecking no\n"
                      "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
    dirs = [worker_sshd.home / f"w2-{tmp_path.name}", home2 / "m"]
    cfg = load_config({"HOME": str(s.model.parents[1]), "MODEL_DIR": str(s.model), "STATE_DIR": f"~/st-{tmp_path.name}",
                       "WORKERS": "root@w1,root@w2", "SSH_OPTS": f"-F {conf}",
                       "R1_MODEL_DIR": str(dirs[0]), "R2_MODEL_DIR": str(dirs[1])})
    try:
        assert not head_copy.fresh_on_workers(cfg)
        head_copy.copy(cfg)
        for d in dirs:
            assert sorted(p.name for p in d.glob("model-*.safetensors")) == sorted(s.facts["shards"])
        assert head_copy.fresh_on_workers(cfg)
        (dirs[1] / shard_name(2)).unlink()                      # one worker loses a shard: it gets it back
        head_copy.copy(cfg)
        assert (dirs[1] / shard_name(2)).exists() and head_copy.fresh_on_workers(cfg)
    finally:
        stop_sshd(proc)
        shutil.rmtree(dirs[0], ignore_errors=True)
