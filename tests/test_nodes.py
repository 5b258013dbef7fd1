"""The Node layer: local and ssh runs, quoting, errors, connection reuse, atomic writes."""
import os
import stat
import subprocess

import pytest

from dsv41.head.core.nodes import Node, NodeError
from sshd import loopback_sshd  # noqa: F401  (fixture)

NASTY = ["a b", "it's", 'say "hi"', "$HOME", "x;rm -rf /nonexistent", "`id`", "back\\slash", "*", ""]
PRINT_ARGS = ["python3", "-c", "import sys, json; print(json.dumps(sys.argv[1:]))"]


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    """A stand-in `ssh` first on PATH: records its argv, then runs the remote command string with
    /bin/sh as sshd would (the part this test needs; the real sshd test is below)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "ssh.log"
    (bindir / "ssh").write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "args = sys.argv[1:]\ni = args.index('--')\nos.execv('/bin/sh', ['sh', '-c', args[i + 2]])\n")
    (bindir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    return log


def test_local_run_passes_arguments_literally():
    out = Node("head").run(PRINT_ARGS + NASTY).stdout
    assert __import__("json").loads(out) == NASTY


def test_remote_command_is_quoted_so_arguments_arrive_literally(fake_ssh, tmp_path):
    node = Node("worker1", "user@10.10.10.11", ssh_opts=["-p", "2222"], control_dir=str(tmp_path / "c"))
    out = node.run(PRINT_ARGS + NASTY).stdout
    assert __import__("json").loads(out) == NASTY
    argv = __import__("json").loads(fake_ssh.read_text().splitlines()[0])
    assert "BatchMode=yes" in argv and any(a.startswith("ConnectTimeout=") for a in argv)
    assert "ControlMaster=auto" in argv and any(a.startswith("ControlPersist=") for a in argv)
    # `--` ends ssh's options before the target: nothing in a target or command can become an option
    assert argv[argv.index("--") + 1] == "user@10.10.10.11" and "2222" in argv
    assert argv.index("-p") < argv.index("--")


def test_failure_names_node_command_status_and_stderr(fake_ssh, tmp_path):
    node = Node("worker1", "user@h", control_dir=str(tmp_path / "c"))
    with pytest.raises(NodeError) as e:
        node.run(["sh", "-c", "echo boom >&2; exit 3"])
    msg = str(e.value)
    assert "worker1" in msg and "exit 3" in msg and "boom" in msg and "\n" not in msg


def test_missing_local_command_is_one_line():
    with pytest.raises(NodeError, match="command not found: no-such-tool"):
        Node("head").run(["no-such-tool", "x"])


def test_atomic_write_and_read_with_awkward_path(tmp_path):
    p = str(tmp_path / "dir with 'quote'" / "key $x")
    node = Node("head")
    node.write_file(p, b"secret\n", mode=0o600)
    assert node.read_file(p) == b"secret\n"
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    assert node.read_file(p + ".missing") is None
    assert sorted(os.listdir(os.path.dirname(p))) == ["key $x"]  # no temp file left behind


def test_unreachable_host_is_one_clear_line(tmp_path):
    node = Node("worker1", "root@127.0.0.1", ssh_opts=["-p", "1", "-o", "ConnectTimeout=2"],
                control_dir=str(tmp_path / "c"))
    with pytest.raises(NodeError) as e:
        node.run(["true"])
    assert str(e.value).startswith("cannot reach worker1 (root@127.0.0.1):")
    assert "\n" not in str(e.value)


def _real(loopback_sshd, tmp_path):
    return Node("worker1", loopback_sshd.target, ssh_opts=loopback_sshd.ssh_opts.split(),
                control_dir=str(tmp_path / "ctl"))


def test_real_sshd_quoting_and_files(loopback_sshd, tmp_path):
    node = _real(loopback_sshd, tmp_path)
    assert __import__("json").loads(node.run(PRINT_ARGS + NASTY).stdout) == NASTY
    p = str(tmp_path / "a dir" / "it's $HOME")
    node.write_file(p, b"\x00\xffdata", mode=0o600)
    assert open(p, "rb").read() == b"\x00\xffdata"
    assert node.read_file(p) == b"\x00\xffdata"
    assert node.read_file(p + "nope") is None
    assert node.home() == "/root"
    node.close()


def test_real_sshd_one_master_connection_per_node(loopback_sshd, tmp_path):
    node = _real(loopback_sshd, tmp_path)
    log = loopback_sshd.dir / "sshd.log"
    before = log.read_text().count("Accepted publickey")
    for _ in range(5):
        node.run(["true"])
    assert log.read_text().count("Accepted publickey") == before + 1
    check = subprocess.run(node.ssh_command() + ["-O", "check", node.target], capture_output=True)
    assert check.returncode == 0
    node.close()


def test_real_sshd_wrong_key_says_how_to_fix(loopback_sshd, tmp_path):
    opts = loopback_sshd.ssh_opts.replace(loopback_sshd.key, str(tmp_path / "nokey")).split()
    node = Node("worker1", loopback_sshd.target, ssh_opts=opts + ["-o", "IdentitiesOnly=yes"],
                control_dir=str(tmp_path / "ctl"))
    with pytest.raises(NodeError) as e:
        node.run(["true"])
    assert "Permission denied" in str(e.value) and "ssh-copy-id root@127.0.0.1" in str(e.value)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_process_stopped_during_a_remote_command_exits_at_once(loopback_sshd, tmp_path, sig):
    """`doit stop` sends the watchdog SIGTERM (a handler raising SystemExit), a person presses Ctrl-C:
    whatever remote command was running, the process ends within seconds, not at the command's timeout."""
    import signal
    import sys
    import time
    child = tmp_path / "child.py"
    child.write_text(
        "import signal, sys\n"
        "from dsv41.head.core.nodes import Node\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        f"node = Node('worker1', {loopback_sshd.target!r}, ssh_opts={loopback_sshd.ssh_opts.split()!r}, "
        f"control_dir={str(tmp_path / 'ctl')!r})\n"
        "node.run(['true'])\n"
        "print('running', flush=True)\n"
        "node.run(['sleep', '90'], timeout=120)\n")
    p = subprocess.Popen([sys.executable, str(child)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert p.stdout.readline() == "running\n"
        time.sleep(1)                                   # the remote sleep runs
        t0 = time.monotonic()
        p.send_signal(getattr(signal, sig))
        p.wait(timeout=30)
        took = time.monotonic() - t0
    finally:
        p.kill()
        p.wait()
        subprocess.run(_real(loopback_sshd, tmp_path).ssh_command() + ["-O", "exit", loopback_sshd.target],
                       capture_output=True)
    assert took < 5, f"exited {took:.1f} s after {sig}"


def test_a_remote_command_past_its_timeout_is_killed_and_named_in_one_line(loopback_sshd, tmp_path):
    import time
    from dsv41.head.core.nodes import forget_unreachable
    node = _real(loopback_sshd, tmp_path)
    node.run(["true"])
    t0 = time.monotonic()
    try:
        with pytest.raises(NodeError, match=r"^worker1 \(root@127.0.0.1\) did not answer `sleep 30` within 1 s: "):
            node.run(["sleep", "30"], timeout=1)
        assert time.monotonic() - t0 < 5
    finally:
        forget_unreachable()
        node.close()
