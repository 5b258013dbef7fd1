"""Node: run an argv on the head (locally) or on a worker over ssh, read and write files there, and ship
the node code. Commands on nodes go through Node.run; what must run beside it (copy's rsyncs and
verifiers, fabric-bench's server, top's background probes) starts from Node.argv_for or
Node.ssh_command, with spawn() where it must end with doit (core.cluster ships the node code). ssh is always BatchMode with one
multiplexed master per node (ControlMaster/ControlPersist, socket under the state dir); remote commands
are one shlex.join'ed string after `--` and the target, so spaces, quotes, `$` and backticks arrive
literally and nothing becomes an option.

A dead, frozen or cut-off node costs about SSH_TIMEOUT_S once per run: ssh's connect timeout and
keep-alives are derived from it, the first contact is bounded by it, every remote command has a
timeout, and a node that did not answer is not asked again in the same run."""
import dataclasses
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import sh

from dsv41 import names
from dsv41.head.core import runlock
from dsv41.settings import schema
from dsv41.errors import UserError, one_line
from dsv41.files import write_atomic

SSH_TIMEOUT_S = schema.BY_NAME["SSH_TIMEOUT_S"].default   # the setting's default, declared once
COMMAND_TIMEOUT_S = 120      # default bound on one remote command; longer ones pass their own
PERSIST_S = 120
_UNREACHABLE = {}            # (ssh target, ssh options) -> NodeError: who did not answer in this run

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


def _finish(proc, timeout):
    """Wait for a command Node.run or Node.close started in the background; -> True when `timeout` passed
    and it was killed. The timer is a daemon thread of ours: sh's own (`_timeout`) is not, and when the
    wait was interrupted (Ctrl-C; the SIGTERM `doit stop` sends the watchdog) it held the process's exit
    for the command's whole timeout (the watchdog's stop took 30 s, until systemd killed it).
    Interrupted, the command is killed as well."""
    expired = threading.Event()

    def expire():
        expired.set()
        _kill(proc)
    timer = threading.Timer(timeout, expire) if timeout else None
    if timer:
        timer.daemon = True
        timer.start()
    try:
        proc.wait()
    except sh.ErrorReturnCode:          # ended by a signal: ours at the timeout, or someone else's
        if not expired.is_set():
            raise
    except (KeyboardInterrupt, SystemExit):
        _kill(proc)
        raise
    finally:
        if timer:
            timer.cancel()
    return expired.is_set()


def _kill(proc):
    try:
        proc.kill()
    except ProcessLookupError:          # it ended just now
        pass


class Node:
    def __init__(self, name, target=None, ssh_opts=(), control_dir=None, timeout_s=SSH_TIMEOUT_S):
        self.name, self.target = name, target
        self.ssh_opts = tuple(ssh_opts)
        self.timeout_s = timeout_s
        self.control_dir = _socket_dir(control_dir or os.path.join(tempfile.gettempdir(), "dsv41-ssh"))
        self._home = None

    @classmethod
    def from_spec(cls, spec, cfg):
        return cls(spec.name, spec.target, cfg.ssh_opts, control_dir(cfg.state_dir), timeout_s=cfg.ssh_timeout_s)

    def __repr__(self):
        return f"Node({self.label})"

    @property
    def is_local(self):
        return self.target is None

    @property
    def label(self):
        return self.name if self.is_local else f"{self.name} ({self.target})"

    @property
    def host(self):
        """The ssh target's host (localhost for the node doit runs on)."""
        return self.target.split("@")[-1] if self.target else "localhost"

    def silent(self, within):
        """The one line for a node that did not answer `within` (e.g. "within 10 s")."""
        return (f"{self.label} did not answer {within}: the node is frozen or the link to it is down; "
                f"check it (ping {self.host})")

    def ssh_command(self):
        """ssh argv prefix without the target (rsync -e, scp-like uses)."""
        os.makedirs(self.control_dir, mode=0o700, exist_ok=True)
        alive = max(1, self.timeout_s // 3)     # the master gives up on a silent peer after ~timeout_s
        return ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.timeout_s}",
                "-o", f"ServerAliveInterval={alive}", "-o", "ServerAliveCountMax=3",
                "-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_dir}/%C",
                "-o", f"ControlPersist={PERSIST_S}", *self.ssh_opts]

    def argv_for(self, argv):
        argv = [str(a) for a in argv]
        if self.is_local:
            return argv
        return self.ssh_command() + ["--", self.target, shlex.join(argv)]

    def rsync_target(self, path):
        return path if self.is_local else f"{self.target}:{path}"

    def run(self, argv, check=True, timeout=COMMAND_TIMEOUT_S, input=None, fg=False, env=None):
        """Run argv on this node. fg=True passes the terminal through (progress, -f) and returns
        only the exit code in Result. env adds variables for local commands only. timeout bounds a
        remote command (None: unbounded, for long transfers); local commands run unbounded."""
        if self.unreachable:
            raise self.unreachable
        timeout = None if self.is_local else timeout
        full = self.argv_for(argv)
        kwargs = {"_ok_code": list(range(256)), "_return_cmd": True}
        if env:
            kwargs["_env"] = {**os.environ, **env}
        if fg:
            kwargs = {"_fg": True, **({"_env": kwargs["_env"]} if env else {})}
        else:
            kwargs.update(_tty_out=False, _in=input, _bg=True, _bg_exc=False)
        timed_out = False
        try:
            proc = sh.Command(full[0])(*full[1:], **kwargs)
            timed_out = not fg and _finish(proc, timeout)
        except sh.CommandNotFound:
            what = "ssh (install openssh-client)" if not self.is_local else f"{full[0]}"
            raise NodeError(f"{self.label}: command not found: {what}", self, argv, 127) from None
        except sh.ErrorReturnCode as err:  # fg mode, or killed by a signal: the exit code is all there is
            proc = err
        if timed_out:
            raise self._gone(NodeError(self.silent(f"`{_short(argv)}` within {timeout:g} s")
                                       + ", then run the command again", self, argv, None))
        if fg:
            result = Result(proc.exit_code if proc is not None else 0, "", "")
        else:
            result = Result(proc.exit_code, _text(proc.stdout), _text(proc.stderr))
        if not self.is_local and result.code == 255:
            raise self._gone(self._unreachable(result.stderr, argv))
        if check and result.code != 0:
            raise NodeError(
                f"{self.label}: `{_short(argv)}` failed (exit {result.code}): "
                f"{one_line(result.stderr[-400:]) or one_line(result.stdout[-400:]) or 'no output'}",
                self, argv, result.code, result.stderr)
        return result

    def _unreachable(self, stderr, argv):
        tail = one_line(stderr.strip().splitlines()[-1] if stderr.strip() else "ssh failed")
        host = self.host
        if "Permission denied" in stderr:
            fix = f"set up key auth: ssh-copy-id {self.target}"
        elif "Host key verification failed" in stderr:
            fix = f"accept the host key once: ssh {self.target} true"
        elif "Could not resolve" in stderr:
            fix = "check the name or use the fabric address in WORKER/WORKERS"
        else:
            fix = f"check that {host} is up and sshd listens (ip -br a; ping {host})"
        return NodeError(f"cannot reach {self.label}: {tail}; {fix}", self, argv, 255, stderr)

    def _gone(self, err):
        """Remember that this node did not answer (later commands fail at once) and drop its ssh
        master, which may be stuck on the dead link."""
        _UNREACHABLE[(self.target, self.ssh_opts)] = err
        self.close()
        return err

    @property
    def unreachable(self):
        """The error this node gave when it stopped answering in this run, else None."""
        return None if self.is_local else _UNREACHABLE.get((self.target, self.ssh_opts))

    # ---- facts and files -------------------------------------------------------------------

    def home(self):
        """The node user's home; the first contact with a node, bounded by SSH_TIMEOUT_S."""
        if self._home is None:
            self._home = (os.path.expanduser("~") if self.is_local
                          else self.run(["printenv", "HOME"], timeout=self.timeout_s + 1).stdout.strip())
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
            _finish(sh.Command("ssh")(*self.ssh_command(), "-O", "exit", "--", self.target,
                                      _ok_code=list(range(256)), _tty_out=False, _bg=True, _bg_exc=False), 5)


def forget_unreachable():
    """Ask every node afresh (a long-running process: the watchdog, top)."""
    _UNREACHABLE.clear()


def spawn(argv, **popen_kwargs):
    """Start a helper process (a copy's rsync, a remote verify) that ends with doit: it gets SIGTERM
    when doit dies, even by kill -9 (PR_SET_PDEATHSIG, set by setpriv), runs in its own process group
    (end() stops it with its children), and holds the run lock too, so no second run races it."""
    prefix = ["setpriv", "--pdeathsig", "TERM", "--"] if shutil.which("setpriv") else []
    return subprocess.Popen(prefix + list(argv), process_group=0, pass_fds=runlock.held_fds(), **popen_kwargs)


def end(proc):
    """Stop a spawned process and its children (SIGTERM to its group)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def connect(nodes):
    """First contact with every remote node at once (their homes): a dead node costs SSH_TIMEOUT_S
    in parallel with the others instead of one after another. Returns the nodes that did not answer;
    their errors are in .unreachable."""
    pending = {}
    for n in nodes:
        if not n.is_local and n._home is None and n.unreachable is None:
            pending[n] = subprocess.Popen(n.argv_for(["printenv", "HOME"]), stdin=subprocess.DEVNULL,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + max((n.timeout_s for n in pending), default=0) + 1
    for n, p in pending.items():
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            n._gone(NodeError(n.silent(f"within {n.timeout_s} s (SSH_TIMEOUT_S)"), n, ["printenv", "HOME"], None))
            continue
        if p.returncode == 0 and out.strip():
            n._home = out.decode().strip()
        else:
            n._gone(n._unreachable(err.decode(errors="replace"), ["printenv", "HOME"]))
    return [n for n in nodes if n.unreachable is not None]


def control_dir(state_dir):
    return names.state_path(state_dir, names.SSH)


def _socket_dir(d):
    """ssh's socket is <dir>/<40 hex>.<17 random>; a unix socket path must stay under 108 bytes."""
    if len(os.fsencode(d)) + 60 <= 107:
        return d
    h = hashlib.sha1(os.fsencode(d)).hexdigest()[:10]
    return os.path.join(tempfile.gettempdir(), f"dsv41-ssh-{os.getuid()}-{h}")


def _text(b):
    return b.decode("utf-8", "surrogateescape") if isinstance(b, bytes) else (b or "")


def _short(argv, limit=120):
    s = shlex.join(str(a) for a in argv)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def say(node, text):
    """One line of what was done on a node, as `[node] text`."""
    print(f"[{node.name}] {text}", flush=True)
