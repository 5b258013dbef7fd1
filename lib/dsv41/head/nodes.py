"""Node: run an argv on the head (locally) or on a worker over ssh, read and write files there, and ship
the node code. Commands on nodes go through Node.run (copy's rsync and fabric-bench's server start
their processes from Node's argv). ssh is always BatchMode with a connect timeout and one multiplexed master per node
(ControlMaster/ControlPersist, socket under the state dir); remote commands are one shlex.join'ed
string, so spaces, quotes, `$` and backticks arrive literally."""
import dataclasses
import hashlib
import os
import shlex
import tempfile

import sh

from dsv41 import names
from dsv41.head import commands
from dsv41.errors import UserError, one_line
from dsv41.files import write_atomic

CONNECT_TIMEOUT = 10
PERSIST_S = 120
FACTS_TIMEOUT_S = 180

# Atomic write on a node: temp file in the same dir, fsync, chmod, rename. Data comes on stdin.
_WRITE_PY = (
    "import os,sys,tempfile;p=sys.argv[1];m=int(sys.argv[2],8);d=os.path.dirname(p) or '.';"
    "os.makedirs(d,exist_ok=True);fd,t=tempfile.mkstemp(dir=d,prefix='.'+os.path.basename(p)+'.');"
    "f=os.fdopen(fd,'wb');f.write(sys.stdin.buffer.read());f.flush();os.fsync(fd);os.fchmod(fd,m);"
    "f.close();os.replace(t,p)"
)
_READ_PY = (
    "import sys\ntry: sys.stdout.buffer.write(open(sys.argv[1],'rb').read())\n"
    "except FileNotFoundError: sys.exit(3)"
)


class NodeError(UserError):
    def __init__(self, message, node=None, argv=None, code=None, stderr=""):
        super().__init__(message)
        self.node, self.argv, self.code, self.stderr = node, argv, code, stderr


@dataclasses.dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def ok(self):
        return self.code == 0


class Node:
    def __init__(self, name, target=None, ssh_opts=(), control_dir=None, rank=None):
        self.name, self.target, self.rank = name, target, rank
        self.ssh_opts = tuple(ssh_opts)
        self.control_dir = _socket_dir(control_dir or os.path.join(tempfile.gettempdir(), "dsv41-ssh"))
        self._home = None

    @classmethod
    def from_spec(cls, spec, cfg):
        return cls(spec.name, spec.target, cfg.ssh_opts, control_dir(cfg.state_dir), rank=spec.rank)

    def __repr__(self):
        return f"Node({self.label})"

    @property
    def is_local(self):
        return self.target is None

    @property
    def label(self):
        return self.name if self.is_local else f"{self.name} ({self.target})"

    def ssh_command(self):
        """ssh argv prefix without the target (rsync -e, scp-like uses)."""
        os.makedirs(self.control_dir, mode=0o700, exist_ok=True)
        return ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT}",
                "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4",
                "-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_dir}/%C",
                "-o", f"ControlPersist={PERSIST_S}", *self.ssh_opts]

    def argv_for(self, argv):
        argv = [str(a) for a in argv]
        if self.is_local:
            return argv
        return self.ssh_command() + [self.target, "--", shlex.join(argv)]

    def rsync_target(self, path):
        return path if self.is_local else f"{self.target}:{path}"

    def run(self, argv, check=True, timeout=None, input=None, fg=False, env=None):
        """Run argv on this node. fg=True passes the terminal through (progress, -f) and returns
        only the exit code in Result. env adds variables for local commands only."""
        full = self.argv_for(argv)
        kwargs = {"_ok_code": list(range(256)), "_return_cmd": True}
        if env:
            kwargs["_env"] = {**os.environ, **env}
        if fg:
            kwargs = {"_fg": True, **({"_env": kwargs["_env"]} if env else {})}
        else:
            kwargs.update(_tty_out=False, _in=input, _timeout=timeout)
        try:
            proc = sh.Command(full[0])(*full[1:], **kwargs)
        except sh.CommandNotFound:
            what = "ssh (install openssh-client)" if not self.is_local else f"{full[0]}"
            raise NodeError(f"{self.label}: command not found: {what}", self, argv, 127) from None
        except sh.ErrorReturnCode as err:  # only in fg mode: the exit code is all there is
            proc = err
        except sh.TimeoutException:
            raise NodeError(f"{self.label}: `{_short(argv)}` timed out after {timeout:g} s",
                            self, argv, None) from None
        if fg:
            result = Result(proc.exit_code if proc is not None else 0, "", "")
        else:
            result = Result(proc.exit_code, _text(proc.stdout), _text(proc.stderr))
        if not self.is_local and result.code == 255:
            raise self._unreachable(result.stderr, argv)
        if check and result.code != 0:
            raise NodeError(
                f"{self.label}: `{_short(argv)}` failed (exit {result.code}): "
                f"{one_line(result.stderr[-400:]) or one_line(result.stdout[-400:]) or 'no output'}",
                self, argv, result.code, result.stderr)
        return result

    def _unreachable(self, stderr, argv):
        tail = one_line(stderr.strip().splitlines()[-1] if stderr.strip() else "ssh failed")
        host = self.target.split("@")[-1]
        if "Permission denied" in stderr:
            fix = f"set up key auth: ssh-copy-id {self.target}"
        elif "Host key verification failed" in stderr:
            fix = f"accept the host key once: ssh {self.target} true"
        elif "Could not resolve" in stderr:
            fix = "check the name or use the fabric address in WORKER/WORKERS"
        else:
            fix = f"check that {host} is up and sshd listens (ip -br a; ping {host})"
        return NodeError(f"cannot reach {self.label}: {tail}; {fix}", self, argv, 255, stderr)

    # ---- facts and files -------------------------------------------------------------------

    def home(self):
        if self._home is None:
            self._home = (os.path.expanduser("~") if self.is_local
                          else self.run(["printenv", "HOME"]).stdout.strip())
        return self._home

    def assume_home(self, home):
        """Use this home without asking the node (rendering with every value given)."""
        self._home = home

    def write_file(self, path, data, mode=0o644):
        if isinstance(data, str):
            data = data.encode()
        if self.is_local:
            write_atomic(path, data, mode)
        else:
            self.run(["python3", "-c", _WRITE_PY, path, oct(mode)[2:]], input=data)

    def read_file(self, path):
        if self.is_local:
            try:
                with open(path, "rb") as f:
                    return f.read()
            except FileNotFoundError:
                return None
        r = self.run(["python3", "-c", _READ_PY, path], check=False)
        if r.code == 3:
            return None
        if r.code:
            raise NodeError(f"{self.label}: cannot read {path}: {one_line(r.stderr[-300:])}", self)
        return r.stdout.encode("utf-8", "surrogateescape")

    def close(self):
        """End this node's ssh master (normally it persists briefly for the next run)."""
        if not self.is_local:
            sh.Command("ssh")(*self.ssh_command(), "-O", "exit", self.target,
                              _ok_code=list(range(256)), _tty_out=False)


def control_dir(state_dir):
    return os.path.join(state_dir, "ssh")


def _socket_dir(d):
    """ssh's socket is <dir>/<40 hex>.<17 random>; a unix socket path must stay under 108 bytes."""
    if len(os.fsencode(d)) + 60 <= 107:
        return d
    h = hashlib.sha1(os.fsencode(d)).hexdigest()[:10]
    return os.path.join(tempfile.gettempdir(), f"dsv41-ssh-{os.getuid()}-{h}")


def nodes(cfg):
    return [Node.from_spec(s, cfg) for s in cfg.nodes]


def _text(b):
    return b.decode("utf-8", "surrogateescape") if isinstance(b, bytes) else (b or "")


def _short(argv, limit=120):
    s = shlex.join(str(a) for a in argv)
    return s if len(s) <= limit else s[: limit - 3] + "..."


LIB_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What a node gets: the node package and the shared standard-library modules it imports.
SHIPPED = ("dsv41/__init__.py", "dsv41/errors.py", "dsv41/files.py", "dsv41/names.py", "dsv41/node/")


def ship_code(node, state_dir):
    """Copy the node code to <state_dir>/lib on a node, the head included (services run it from there:
    workers may have no internet or venv, and the checkout may move); returns node_python's prefix."""
    dest = f"{state_dir}/{names.LIB}/"
    node.run(["mkdir", "-p", dest])
    ssh = [] if node.is_local else ["-e", shlex.join(node.ssh_command())]
    includes = [f"--include={p}" if not p.endswith("/") else f"--include={p}***" for p in SHIPPED]
    Node("head").run(["rsync", "-a", "--delete", "--delete-excluded", "--exclude=__pycache__/",
                      "--include=dsv41/", *includes, "--exclude=*", *ssh, f"{LIB_DIR}/dsv41", node.rsync_target(dest)])
    return commands.node_python(state_dir)
