"""Pure argv builders for the commands dsv41 runs on nodes (docker, systemctl, journalctl, its own
services), as lists of strings. Nothing here executes anything; nodes.Node.run() does. The engine's
container command is the recipe's (dsv41.vllm.argv).

`paths` is one node's paths: an object or dict with model_dir, state_dir."""
from collections.abc import Mapping

from dsv41 import names

DOCKER = "docker"
SYSTEMCTL = "systemctl"
JOURNALCTL = "journalctl"
STOP_GRACE_S = 30                  # docker stop -t; the unit's TimeoutStopSec is above it


def fact(obj, name, default=None):
    """A field of a fabric/paths object or dict."""
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


# ---- per-node state paths --------------------------------------------------------------------------

def cidfile(state_dir, rank):
    return names.state_path(state_dir, names.cidfile(rank))


def secret_key_file(state_dir):
    """Root-only (0600) file holding the API key, mounted read-only into rank 0's container."""
    return names.state_path(state_dir, names.SECRET_KEY)


def tripped_marker(state_dir):
    return names.state_path(state_dir, names.TRIP_MARKER)


def node_python(state_dir):
    """argv prefix running a module of the code shipped into a node's state dir with its python3."""
    return ["/usr/bin/env", f"PYTHONPATH={names.state_path(state_dir, names.LIB)}", "python3", "-m"]


def watchdog_argv(state_dir, python, lib_dir):
    """The head's watchdog, run by the python and from the checkout that ran `doit launch`."""
    return ["/usr/bin/env", f"PYTHONPATH={lib_dir}", python, "-m", "dsv41.head.watchdog", "--state-dir", state_dir]


# HAProxy started with the engine key in its environment, read from rank 0's key file ($1); $2 its config
GATEWAY_WRAPPER = 'DSV41_ENGINE_KEY=$(cat "$1") && export DSV41_ENGINE_KEY && exec haproxy -Ws -f "$2"'


def gateway_argv(state_dir):
    """The head's gateway: HAProxy in master-worker mode (systemd notify), no key in its argv."""
    return ["/bin/sh", "-c", GATEWAY_WRAPPER, "dsv41-gateway", names.state_path(state_dir, names.SECRET_KEY),
            names.state_path(state_dir, names.GATEWAY_CONFIG)]


def side_door_argv(state_dir):
    """A group's side door (its first node off the head): HAProxy as the gateway runs it (GATEWAY_WRAPPER), with
    this node's engine key (its rank 0's key file) in its environment, no key in its argv."""
    return ["/bin/sh", "-c", GATEWAY_WRAPPER, "dsv41-sidedoor", names.state_path(state_dir, names.SECRET_KEY),
            names.state_path(state_dir, names.SIDE_DOOR_CONFIG)]


def memguard_argv(state_dir):
    return node_python(state_dir) + ["dsv41.node.memguard", "--settings",
                                     names.state_path(state_dir, names.GUARD_SETTINGS), "--state-dir", state_dir]


# ---- docker's --mount ------------------------------------------------------------------------------

def _csv_field(s):
    """One field of docker's --mount value (Go encoding/csv): quoted when it holds , " or newlines."""
    if any(c in s for c in ',"\r\n') or s[:1].isspace():
        return '"' + s.replace('"', '""') + '"'
    return s


def mount(source, target, readonly=False):
    """--mount value; unlike -v it takes any path (colons, commas, quotes, spaces)."""
    fields = ["type=bind", f"source={source}", f"target={target}"] + (["readonly"] if readonly else [])
    return ",".join(_csv_field(f) for f in fields)


# ---- docker, systemctl, journalctl ---------------------------------------------------------------

def docker_rm(name):
    return [DOCKER, "rm", "-f", name]


def docker_kill(name):
    return [DOCKER, "kill", name]


def docker_stop(name, grace_s=STOP_GRACE_S):
    return [DOCKER, "stop", "-t", str(grace_s), name]


def docker_pull(image):
    return [DOCKER, "pull", image]


def docker_ask(image, entrypoint, args, timeout_s=300):
    """A throw-away container of the image, no network, running entrypoint with args (a server's help)."""
    return ["timeout", str(timeout_s), DOCKER, "run", "--rm", "--pull", "never", "--network", "none",
            "--entrypoint", entrypoint, image, *args]


def docker_image_id(image):
    """Prints the local image ID (sha256:...); non-zero exit when the image is not there."""
    return [DOCKER, "image", "inspect", "--format", "{{.Id}}", image]


def systemctl(*args):
    return [SYSTEMCTL, *map(str, args)]


def journalctl(unit, follow=False, lines=None, since_s=None):
    """since_s: the last seconds of it, each line with its time (for core/startup.py's phases)."""
    argv = [JOURNALCTL, "-u", unit, "--no-pager", "-o", "cat" if since_s is None else "short-iso-precise"]
    if since_s is not None:
        argv += [f"--since=-{max(1, int(since_s))}s"]
    if lines is not None:
        argv += ["-n", str(lines)]
    return argv + (["-f"] if follow else [])


def mkdir(*paths, mode=None):
    return ["mkdir", "-p", *(["-m", mode] if mode else []), *paths]


def rm_f(*paths):
    return ["rm", "-f", *paths]


def uid():
    return ["id", "-u"]


def chmod(mode, *paths):
    return ["chmod", mode, *paths]


def can_read_dir(user, path):
    """Whether `user` can list and enter path (exit 0)."""
    return ["runuser", "-u", user, "--", "test", "-r", path, "-a", "-x", path]


def is_executable(path):
    return ["test", "-x", path]


def install_unit_file(tmp, path):
    """A unit file (or a drop-in, -D: its dir) put in place through sudo -n by a user that is not root."""
    return ["sudo", "-n", "install", "-D", "-m", "0644", tmp, path]


def rsync_code(lib_dsv41, includes, ssh, target):
    """The node code (lib/dsv41, only what `includes` names) mirrored to target, over ssh when given."""
    return ["rsync", "-a", "--delete", "--delete-excluded", "--exclude=__pycache__/", "--include=dsv41/", *includes,
            "--exclude=*", *ssh, "--", lib_dsv41, target]


GATEWAY_BIND = f"fd@{names.GATEWAY_LISTEN_FD}"     # the gateway's PORT, as dsv41-gateway.socket hands it over
CHECK_BIND = "127.0.0.1:{port}"                   # what the copy `haproxy -c` checks binds instead


def check_copy(config_text, port):
    """The copy of a gateway config that haproxy_check is given: HAProxy refuses to check a bind on a descriptor
    it was not given (`fd@3`: "Socket operation on non-socket"), so the copy binds 127.0.0.1:PORT instead, its
    one difference (HAProxy 2.6 refuses port 0; a check binds nothing, so PORT in use does not matter). A
    config of an earlier version, which binds PORT itself, is its own copy."""
    return config_text.replace(f"    bind {GATEWAY_BIND}\n", f"    bind {CHECK_BIND.format(port=int(port))}\n")


def haproxy_check(config):
    """`haproxy -c` of a gateway config (its check_copy); its engine key is a placeholder (the config reads it
    from the environment)."""
    return ["env", "DSV41_ENGINE_KEY=check", "haproxy", "-c", "-q", "-f", config]


def ib_write_bw(seconds, hca, gid_index, peer=None):
    """ib_write_bw, the server side without a peer; the client side connects to peer."""
    return ["ib_write_bw", "-F", "--report_gbits", "-D", str(seconds), "-d", hca, "-x", str(gid_index),
            *([peer] if peer else [])]
