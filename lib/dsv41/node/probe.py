"""Node side: the deployment state of one node in one process, as JSON (stdlib only).

`python3 -m dsv41.node.probe '<json request>'` with {"state_dir", "model_dir", "units": [...], "image",
"containers": [...], "files": [...], "versions": bool} prints: installed unit files (text and sha256), systemd states,
containers, the image ID, the trip marker, when the model dir last changed, MemAvailable, GPU memory,
state file hashes, memory and swap from /proc/meminfo, and the memory guard's settings (memguard.json:
its floor and mode), with "versions" the kernel, driver and Docker versions, and with "caches": <image
key> the engine's caches of that image (facts.cache_report: each library's size and fingerprint). Launch, plan, status and top read a node through this one call."""
import hashlib
import json
import os
import shutil
import sys
import time

from dsv41.names import CACHE, UNIT_DIR
from dsv41.node import statefiles
from dsv41.node.facts import MEMINFO, cache_report, memory_facts, processes, run_quiet, stopped_below
from dsv41.node.memguard.marker import describe_trip, read_trip

SHOW = ("ActiveState", "SubState", "Result", "NRestarts", "ExecMainStatus", "LoadState", "UnitFileState",
        "ActiveEnterTimestamp", "InactiveEnterTimestamp", "ConditionResult")



def described(trip):
    """The trip marker with its one-line description ("line"), as launch, status and top print it."""
    return {**trip, "line": describe_trip(trip)} if trip else trip

def _sha(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def units(names):
    out = {}
    for name in names:
        path = os.path.join(UNIT_DIR, name)
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            text = None
        out[name] = {"installed": text is not None, "text": text,
                     "sha256": hashlib.sha256(text.encode()).hexdigest() if text is not None else None}
    units_only = [n for n in names if "/" not in n]          # a drop-in (x.service.d/y.conf): its text only
    if units_only and shutil.which("systemctl"):
        code, stdout, _ = run_quiet(["systemctl", "show", "--timestamp=unix", "-p", ",".join(SHOW), "--",
                                     *units_only])
        for name, block in zip(units_only, stdout.split("\n\n")):
            props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
            out[name].update(props)
    return out


def system_state():
    """systemd's `is-system-running` (running, degraded, starting, stopping, ...), None without systemctl.
    "stopping": the node is shutting down, and its units stopping say nothing about the engine."""
    code, stdout, _ = run_quiet(["systemctl", "is-system-running"], timeout=5)
    return stdout.strip() or None if code != 127 else None


def containers(names):
    """{name: {"state": docker's State, "image": its image ID, "stopped": [[pid, name]] of its processes
    stopped (facts.stopped_below)} or None (no such container)}."""
    out, procs = {}, None
    if not shutil.which("docker"):
        return {"error": "docker not found"}
    for name in names:
        code, stdout, _ = run_quiet(["docker", "inspect", "--type", "container", "--format",
                                "{{json .State}}|{{.Image}}", name])
        if code == 0 and "|" in stdout:
            state, image = stdout.strip().split("|", 1)
            state = json.loads(state)
            if state.get("Pid") and procs is None:
                procs = processes()
            out[name] = {"state": state, "image": image,
                         "stopped": stopped_below(state["Pid"], procs) if state.get("Pid") else []}
        else:
            out[name] = None
    return out


def image_id(ref):
    if not shutil.which("docker"):
        return None
    code, stdout, _ = run_quiet(["docker", "image", "inspect", "--format", "{{.Id}}", ref])
    return stdout.strip() if code == 0 else None


def versions():
    """What outside a release can change what runs: the kernel, the GPU driver and Docker's version
    (asked only by launch, which records them in the release; None where there is none)."""
    driver = None
    try:
        with open("/sys/module/nvidia/version") as f:
            driver = f.read().strip() or None
    except OSError:
        pass
    docker = None
    if shutil.which("docker"):
        code, stdout, _ = run_quiet(["docker", "version", "--format", "{{.Server.Version}}"])
        docker = stdout.strip() if code == 0 and stdout.strip() else None
    return {"kernel": os.uname().release, "driver": driver, "docker": docker}


def gpu_memory():
    if not shutil.which("nvidia-smi"):
        return None
    code, stdout, _ = run_quiet(["nvidia-smi", "--query-gpu=memory.used,memory.total",
                            "--format=csv,noheader,nounits"])
    return stdout.strip() if code == 0 else None


def meminfo(path="/proc/meminfo"):
    """facts.memory_facts, with every figure None when the file cannot be read or parsed."""
    try:
        return memory_facts(path)
    except (OSError, ValueError, IndexError):
        return dict.fromkeys(MEMINFO.values())


def guard_settings(state_dir):
    """The guard's memguard.json ({"floor_gib", "mode", ...}) as written by launch; None when absent
    or unreadable (the guard then keeps its command-line floor)."""
    try:
        return statefiles.guard_settings(state_dir)
    except statefiles.Unreadable:
        return None


def newest_change(model_dir):
    """ctime of the newest change under the model dir (it, its files and dirs; hidden ones skipped),
    or None when it does not exist. A rank started before this holds files that have been replaced."""
    try:
        newest = os.stat(model_dir).st_ctime
    except OSError:
        return None
    todo = [model_dir]
    while todo:
        try:
            with os.scandir(todo.pop()) as entries:
                for e in entries:
                    if e.name.startswith("."):
                        continue
                    newest = max(newest, e.stat(follow_symlinks=False).st_ctime)
                    if e.is_dir(follow_symlinks=False):
                        todo.append(e.path)
        except OSError:
            continue
    return newest


def boot_id():
    """This boot's id (a new one at every boot: a node's memory is as the boot left it until a rank ran)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def main():
    req = json.loads(sys.argv[1])
    state = req["state_dir"]
    files = {name: _sha(os.path.join(state, name)) for name in req.get("files", [])}
    memory = meminfo()
    baseline, baseline_boot = statefiles.mem_baseline(state)
    print(json.dumps({
        "uid": os.getuid(), "home": os.path.expanduser("~"), "time": time.time(),
        "units": units(req.get("units", [])),
        "system": system_state(),
        "containers": containers(req.get("containers", [])),
        "image_id": image_id(req["image"]) if req.get("image") else None,
        "tripped": described(read_trip(state)),
        "model_dir": req.get("model_dir"),
        "model_changed_at": newest_change(req["model_dir"]) if req.get("model_dir") else None,
        "mem_available_kib": memory["available_bytes"] // 1024,
        "gpu_memory": gpu_memory(),
        "files": files,
        "memory": memory,
        "guard_settings": guard_settings(state),
        "mem_baseline_bytes": baseline, "mem_baseline_boot": baseline_boot, "boot_id": boot_id(),
        **({"versions": versions()} if req.get("versions") else {}),
        **({"caches": cache_report(os.path.join(state, CACHE), req["caches"])} if req.get("caches") else {}),
    }))


if __name__ == "__main__":
    main()
