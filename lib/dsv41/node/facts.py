"""Everything the head needs to know about one node, gathered in one process and printed as JSON.

Runs on a node with the standard library only:
    python3 -m dsv41.node.facts [--sysfs DIR] [--model-dir D] [--peer IP] [--ports 8000,29655]
                           [--ping IP,...] [--ifname IF] [--ip IP] [--ping-only]
Nothing is changed; each section that cannot be read carries an "error" instead of stopping the rest.
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

from dsv41.errors import UserError, cli, one_line
from dsv41.names import ENGINE_CACHES, MEMGUARD_UNIT, RANK_NAME_RE, RANK_PREFIX, UNIT_DIR
from dsv41.node import fabric

TOOLS = ("python3", "rsync", "curl", "docker", "ethtool", "ping", "nvidia-smi", "ib_write_bw", "systemctl", "haproxy")


def run_quiet(argv, timeout=20):
    """(code, stdout, stderr); 127 when missing, 124 on timeout."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout, r.stderr
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]}: no answer within {timeout} s"


def processes():
    """{pid: (ppid, comm, rss kB, uid, state)} of every process this node shows in /proc (state: R, S, D,
    T stopped, t stopped by a tracer, Z, ...)."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        rss = status.get("VmRSS", "0 kB").split()[0]
        out[int(name)] = (int(status.get("PPid", "0").strip() or 0), status.get("Name", "?").strip(),
                          int(rss) if rss.isdigit() else 0, int(status.get("Uid", "0").split()[0]),
                          (status.get("State", "?").split() or ["?"])[0])
    return out


def descendants(root, procs):
    """root and every process below it, in order of discovery."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        if pid in procs and pid not in found:
            found.append(pid)
            todo += sorted(p for p, info in procs.items() if info[0] == pid)
    return found


def stopped_below(root, procs):
    """[[pid, name]] of root and the processes below it that are stopped (SIGSTOP, or held by a tracer): a
    rank's process that can make no progress however long it is given, whatever its peers' CPU shows."""
    return [[p, _title(p) or procs[p][1]] for p in descendants(root, procs) if procs[p][4] in ("T", "t")]


def _title(pid):
    """The process's first argument (its title: VLLM::EngineCore, which /proc's 15-character name cuts)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return os.path.basename(f.read().split(b"\0")[0].decode(errors="replace"))[:60]
    except OSError:
        return ""


def _safe(fn, *args):
    try:
        return fn(*args)
    except (UserError, OSError, ValueError) as err:
        return {"error": one_line(err)}


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


# ---- sections ----------------------------------------------------------------------------------

def link_speed(ifname):
    """Mb/s from `ethtool IF` (None when unknown, e.g. a veth or a down link)."""
    code, out, err = run_quiet(["ethtool", ifname], timeout=10)
    if code != 127:
        m = re.search(r"Speed:\s*(.*)", out)
        raw = m.group(1).strip() if m else one_line(err) or f"exit {code}"
        n = re.match(r"(\d+)\s*Mb/s", raw)
        return {"mbps": int(n.group(1)) if n else None, "source": "ethtool", "raw": raw}
    raw = _read(f"/sys/class/net/{ifname}/speed")
    mbps = int(raw) if raw and raw.lstrip("-").isdigit() and int(raw) > 0 else None
    return {"mbps": mbps, "source": "sysfs (ethtool missing)", "raw": raw}


def docker_facts():
    if not shutil.which("docker"):
        return {"ok": False, "kind": "missing", "error": "docker is not installed", "runtimes": [],
                "containers": []}
    code, out, err = run_quiet(["docker", "info", "--format", "{{json .Runtimes}}"])
    if code == 0:
        try:
            runtimes = sorted(json.loads(out or "{}") or {})
        except ValueError:
            runtimes = []
        res = {"ok": True, "kind": "ok", "error": None, "runtimes": runtimes}
    else:
        low = err.lower()
        kind = ("permission" if "permission denied" in low else
                "timeout" if code == 124 else
                "daemon" if "cannot connect" in low or "daemon running" in low else "other")
        return {"ok": False, "kind": kind, "error": one_line(err[-400:]) or f"exit {code}",
                "runtimes": [], "containers": []}
    code, out, err = run_quiet(["docker", "ps", "-a", "--filter", f"name={RANK_PREFIX}",
                           "--format", "{{.Names}}\t{{.State}}\t{{.ID}}"])
    res["containers"] = [dict(zip(("name", "state", "id"), line.split("\t")))
                         for line in out.splitlines() if RANK_NAME_RE.match(line.split("\t")[0])]
    return res


def disk_facts(model_dir):
    path = os.path.abspath(os.path.expanduser(model_dir))
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    st = os.statvfs(probe)
    present = 0
    if os.path.isdir(path):
        for root, _dirs, files in os.walk(path):
            for name in files:
                try:
                    s = os.lstat(os.path.join(root, name))
                except OSError:
                    continue
                present += s.st_size if not os.path.islink(os.path.join(root, name)) else 0
    return {"model_dir": path, "checked": probe, "free_bytes": st.f_bavail * st.f_frsize,
            "model_bytes": present}


CACHE_FILES_MAX = 200000        # a cache report walks at most this many files and CACHE_WALK_S seconds,
CACHE_WALK_S = 10.0             # then says "partial" and gives no fingerprint
RANK_PART_RE = re.compile(r"rank_\d+")          # vLLM keeps a folder per rank (rank_0_0): the same on each


def _volatile(name, is_dir):
    """A file or folder a library writes while it compiles and removes or renames after: never compared
    (a dot folder is kept: FlashInfer's cache is .cache/flashinfer)."""
    if is_dir:
        return name == "tmp" or name.startswith("tmp.")
    return name.startswith((".", "tmp.")) or name.endswith((".lock", ".tmp"))


def cache_tree(path, deadline, budget):
    """(bytes, files, fingerprint or None when the walk was cut short) of one library's cache folder. The
    fingerprint hashes each file's path (rank folders named alike) and size, sorted: the same on two ranks
    that hold the same kernels."""
    total, entries, todo = 0, [], [path]
    while todo:
        try:
            with os.scandir(todo.pop()) as it:
                for e in it:
                    if e.is_symlink() or _volatile(e.name, e.is_dir()):
                        continue
                    if e.is_dir():
                        todo.append(e.path)
                        continue
                    if len(entries) >= budget or time.monotonic() > deadline:
                        return total, len(entries), None
                    size = e.stat().st_size
                    total += size
                    entries.append(f"{RANK_PART_RE.sub('rank_N', os.path.relpath(e.path, path))}\t{size}")
        except OSError:
            continue
    return total, len(entries), hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()


def cache_report(cache_dir, key, walk_s=CACHE_WALK_S, files_max=CACHE_FILES_MAX):
    """The caches of the image `key` under the state dir's cache/ folder: {"key", "libraries": {folder:
    {"bytes", "files", "fingerprint"}}, "others": what else cache/ holds (other images' folders)}."""
    deadline, libraries = time.monotonic() + walk_s, {}
    for _, _, folder in ENGINE_CACHES:
        size, files, fp = cache_tree(os.path.join(cache_dir, key, folder), deadline, files_max)
        libraries[folder] = {"bytes": size, "files": files, "fingerprint": fp}
        files_max -= files
    try:
        keys = sorted(n for n in os.listdir(cache_dir) if n != key)
    except OSError:
        keys = []
    return {"key": key, "libraries": libraries, "others": keys}


MEMINFO = {"MemTotal": "total_bytes", "MemAvailable": "available_bytes", "SwapTotal": "swap_total_bytes",
           "SwapFree": "swap_free_bytes"}


def memory_facts(path="/proc/meminfo"):
    """Memory and swap in bytes ({"total_bytes", "available_bytes", "swap_total_bytes", "swap_free_bytes"},
    None for a line that is missing); raises OSError when the file cannot be read."""
    out = dict.fromkeys(MEMINFO.values())
    with open(path) as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in MEMINFO:
                out[MEMINFO[key]] = int(value.split()[0]) * 1024
    return out


def listening_ports():
    """Local TCP ports in LISTEN state (/proc/net/tcp and tcp6)."""
    ports = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                next(f, None)
                for line in f:
                    cols = line.split()
                    if len(cols) > 3 and cols[3] == "0A":
                        ports.add(int(cols[1].rsplit(":", 1)[1], 16))
        except OSError:
            continue
    return ports


def unit_facts(unit_dir, names):
    files = sorted(n for n in os.listdir(unit_dir) if n.startswith("dsv41-") and n.endswith((".service", ".socket"))) \
        if os.path.isdir(unit_dir) else []
    units = sorted(set(files) | {n + ".service" for n in names} | {MEMGUARD_UNIT})
    active = {}
    if shutil.which("systemctl"):
        code, out, _ = run_quiet(["systemctl", "is-active", *units], timeout=10)
        states = out.split()
        if len(states) == len(units):
            active = dict(zip(units, states))
    return {"dir": unit_dir, "files": files, "active": active}


def mtu_of(ifname, addrs):
    m = next((a["mtu"] for a in addrs if a["ifname"] == ifname and a.get("mtu")), None)
    if m is None:
        raw = _read(f"/sys/class/net/{ifname}/mtu")
        m = int(raw) if raw and raw.isdigit() else None
    return m


def ping(peer, ifname, mtu):
    """Don't-fragment ping of MTU-28 bytes (the largest that fits one frame) from ifname to peer."""
    if not ifname or not mtu:
        return {"peer": peer, "ifname": ifname, "size": None, "ok": False,
                "error": "no fabric interface or MTU known"}
    size = mtu - 28
    argv = ["ping", "-M", "do", "-s", str(size), "-c", "1", "-W", "2", "-I", ifname, peer]
    code, out, err = run_quiet(argv, timeout=10)
    lines = [x for x in (out + "\n" + err).splitlines() if x.strip() and "statistics" not in x]
    return {"peer": peer, "ifname": ifname, "size": size, "ok": code == 0, "command": " ".join(argv),
            "error": None if code == 0 else one_line("; ".join(lines[-2:])) or f"exit {code}"}


# systemd-logind's RemoveIPC: with yes, logind deletes a user's shared memory and semaphores when that
# user's last session ends (root and system users are spared). The main file is the first found in
# LOGIND_DIRS, then every logind.conf.d/*.conf drop-in in file-name order, a name in an earlier dir hiding
# the same name in a later one; the last setting wins; compiled-in default yes.
LOGIND_DIRS = ("etc/systemd", "run/systemd", "usr/local/lib/systemd", "usr/lib/systemd")
TRUE, FALSE = ("1", "yes", "true", "on"), ("0", "no", "false", "off")


def remove_ipc(root="/"):
    """(RemoveIPC as a bool, the file that set it or "default")."""
    files = [os.path.join(root, d, "logind.conf") for d in LOGIND_DIRS]
    main = next((f for f in files if os.path.isfile(f)), None)
    drop = {}
    for d in reversed(LOGIND_DIRS):
        conf_d = os.path.join(root, d, "logind.conf.d")
        if os.path.isdir(conf_d):
            drop.update({n: os.path.join(conf_d, n) for n in os.listdir(conf_d) if n.endswith(".conf")})
    value, source = True, "default"
    for path in ([main] if main else []) + [drop[n] for n in sorted(drop)]:
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        section = None
        for line in lines:
            line = line.strip()
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1].strip()
            elif section == "Login" and "=" in line and not line.startswith(("#", ";")):
                key, _, val = line.partition("=")
                if key.strip() == "RemoveIPC" and val.strip().lower() in TRUE + FALSE:
                    value, source = val.strip().lower() in TRUE, path
    return value, source


def system_uid_max(login_defs="/etc/login.defs"):
    """The highest system uid (SYS_UID_MAX in login.defs; 999 as systemd's compiled default)."""
    try:
        with open(login_defs) as f:
            for line in f:
                words = line.split()
                if len(words) == 2 and words[0] == "SYS_UID_MAX" and words[1].isdigit():
                    return int(words[1])
    except OSError:
        pass
    return 999


def rank_uids(containers):
    """{container: uid its main process runs as} for the running rank containers (None: unknown)."""
    out = {}
    for c in containers:
        if c.get("state") != "running":
            continue
        code, pid, _ = run_quiet(["docker", "inspect", "--format", "{{.State.Pid}}", c["name"]], timeout=10)
        uid = None
        if code == 0 and pid.strip().isdigit():
            try:
                with open(f"/proc/{pid.strip()}/status") as f:
                    uid = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
            except (OSError, StopIteration, ValueError):
                pass
        out[c["name"]] = uid
    return out


def ipc_facts(containers, root="/"):
    value, source = remove_ipc(root)
    return {"remove_ipc": value, "source": source, "rank_uids": rank_uids(containers),
            "system_uid_max": system_uid_max(os.path.join(root, "etc/login.defs"))}


# ---- all of it ---------------------------------------------------------------------------------

def gather(sysfs="/sys", model_dir=None, peer=None, ports=(), pings=(), ifname=None, ip=None,
           unit_dir=UNIT_DIR, ping_only=False):
    out = {"hostname": socket.gethostname()}
    fab = fabric.scan_rdma(sysfs)
    try:
        fab["addrs"] = fabric.ip_addrs()
    except (UserError, OSError, subprocess.SubprocessError) as err:
        fab["addrs"], fab["addrs_error"] = [], one_line(err)
    addrs = fab["addrs"]
    decided = fabric.choose(fab, peer=peer, ip=ip, ifname=ifname)
    fab_if = ifname or decided.get("ifname")
    if not ping_only:
        out["fabric"] = fab
        out["detected"] = decided
        out["mtus"] = {a["ifname"]: a["mtu"] for a in addrs}
        if fab_if and fab_if not in out["mtus"]:
            out["mtus"][fab_if] = mtu_of(fab_if, addrs)
        netdevs = {n for d in fab.get("devices", []) if d.get("state") == "ACTIVE" for n in d["netdevs"]}
        out["speeds"] = {n: _safe(link_speed, n) for n in sorted(netdevs | ({fab_if} if fab_if else set()))}
        out["docker"] = _safe(docker_facts)
        if model_dir:
            out["disk"] = _safe(disk_facts, model_dir)
        out["memory"] = _safe(memory_facts)
        listening = _safe(listening_ports)
        out["ports"] = ({str(p): p in listening for p in ports} if isinstance(listening, set)
                        else listening)
        out["kernel"] = {"release": os.uname().release, "cmdline": _read("/proc/cmdline") or ""}
        out["tools"] = {t: shutil.which(t) is not None for t in TOOLS}
        names = [c["name"] for c in out["docker"].get("containers", [])] if "containers" in out["docker"] else []
        out["units"] = _safe(unit_facts, unit_dir, names)
        out["ipc"] = _safe(ipc_facts, out["docker"].get("containers", []))
    out["pings"] = [ping(p, fab_if, mtu_of(fab_if, addrs) if fab_if else None) for p in pings]
    out["time"] = time.time()
    return out


def _csv(text):
    return [x.strip() for x in (text or "").split(",") if x.strip()]


@cli
def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m dsv41.node.facts", description=__doc__.splitlines()[0])
    p.add_argument("--sysfs", default="/sys")
    p.add_argument("--model-dir")
    p.add_argument("--peer", help="peer fabric address: detect the port on its subnet")
    p.add_argument("--ports", default="", help="comma list of TCP ports to report as in use or free")
    p.add_argument("--ping", default="", help="comma list of peers to ping (don't-fragment, MTU-28)")
    p.add_argument("--ifname", help="fabric interface override")
    p.add_argument("--ip", help="fabric address override")
    p.add_argument("--unit-dir", default=UNIT_DIR)
    p.add_argument("--ping-only", action="store_true", help="only the pings (and the time)")
    p.add_argument("--json", action="store_true", help="(always JSON)")
    a = p.parse_args(argv)
    try:
        ports = [int(x) for x in _csv(a.ports)]
    except ValueError:
        raise UserError(f"--ports {a.ports!r}: expected a comma list of port numbers") from None
    facts = gather(a.sysfs, a.model_dir, a.peer, ports, _csv(a.ping), a.ifname, a.ip, a.unit_dir,
                   a.ping_only)
    print(json.dumps(facts, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
