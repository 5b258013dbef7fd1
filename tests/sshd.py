"""A real OpenSSH server on 127.0.0.1 for tests of the Node layer, rsync copies and remote runs.

Usage: `from sshd import loopback_sshd` then use the `loopback_sshd` fixture; it yields an object
with .target ("root@127.0.0.1"), .port, .key, .dir and .ssh_opts (a string for SSH_OPTS).
`start_sshd(dir, extra_config)` starts another one (e.g. with `SetEnv HOME=...`)."""
import os
import shutil
import socket
import subprocess
import time
from types import SimpleNamespace

import pytest

SSHD = "/usr/sbin/sshd"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def need_sshd():
    if os.geteuid() != 0:
        pytest.skip("loopback sshd needs root (it logs in as root)")
    if not os.path.exists(SSHD) or not shutil.which("ssh-keygen") or not shutil.which("rsync"):
        pytest.skip("openssh-server or rsync is not installed (apt-get install openssh-server rsync)")


def start_sshd(d, extra_config=""):
    """sshd on a free loopback port with fresh keys in `d`; returns (process, connection facts)."""
    for name in ("host", "user"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True)
    (d / "authorized_keys").write_text((d / "user.pub").read_text())
    os.chmod(d / "authorized_keys", 0o600)
    port = free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host\nPidFile {d}/sshd.pid\n"
        f"AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nUsePAM no\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
        f"MaxStartups 50\nMaxSessions 50\nSubsystem sftp internal-sftp\n{extra_config}")
    os.makedirs("/run/sshd", exist_ok=True)
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")],
                            stdout=subprocess.DEVNULL, stderr=open(d / "sshd.log", "wb"))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("sshd did not start: " + (d / "sshd.log").read_text())
    opts = (f"-p {port} -i {d}/user -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
            "-o LogLevel=ERROR")
    return proc, SimpleNamespace(target="root@127.0.0.1", port=port, key=str(d / "user"),
                                 ssh_opts=opts, dir=d)


def stop_sshd(proc):
    proc.terminate()
    proc.wait(timeout=5)


@pytest.fixture(scope="session")
def loopback_sshd(tmp_path_factory):
    need_sshd()
    proc, facts = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield facts
    stop_sshd(proc)
