"""Node side: the deployment state of one node in one process, as JSON (stdlib only).

`python3 -m dsv41.node.probe '<json request>'` with {"state_dir", "units": [...], "image",
"containers": [...]} prints: installed unit files (text and sha256), systemd states, containers,
the image ID, the trip marker, MemAvailable, GPU memory, state file hashes. Launch, plan and status
read a node through this one call."""
import hashlib
import json
import os
import shutil
import sys
import time

from dsv41.names import TRIP_MARKER, UNIT_DIR, state_path
from dsv41.node.facts import memory_facts, run_quiet

SHOW = ("ActiveState", "SubState", "Result", "NRestarts", "ExecMainStatus", "LoadState",
        "ActiveEnterTimestamp", "InactiveEnterTimestamp", "ConditionResult")


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
    if names and shutil.which("systemctl"):
        code, stdout, _ = run_quiet(["systemctl", "show", "--timestamp=unix", "-p", ",".join(SHOW), "--", *names])
        for name, block in zip(names, stdout.split("\n\n")):
            props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
            out[name].update(props)
    return out


def containers(names):
    out = {}
    if not shutil.which("docker"):
        return {"error": "docker not found"}
    for name in names:
        code, stdout, _ = run_quiet(["docker", "inspect", "--type", "container", "--format",
                                "{{json .State}}|{{.Image}}", name])
        if code == 0 and "|" in stdout:
            state, image = stdout.strip().split("|", 1)
            out[name] = {"state": json.loads(state), "image": image}
        else:
            out[name] = None
    return out


def image_id(ref):
    if not shutil.which("docker"):
        return None
    code, stdout, _ = run_quiet(["docker", "image", "inspect", "--format", "{{.Id}}", ref])
    return stdout.strip() if code == 0 else None


def gpu_memory():
    if not shutil.which("nvidia-smi"):
        return None
    code, stdout, _ = run_quiet(["nvidia-smi", "--query-gpu=memory.used,memory.total",
                            "--format=csv,noheader,nounits"])
    return stdout.strip() if code == 0 else None


def trip(state_dir):
    path = state_path(state_dir, TRIP_MARKER)
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"unreadable": path}


def main():
    req = json.loads(sys.argv[1])
    state = req["state_dir"]
    files = {name: _sha(os.path.join(state, name)) for name in req.get("files", [])}
    print(json.dumps({
        "uid": os.getuid(), "home": os.path.expanduser("~"), "time": time.time(),
        "units": units(req.get("units", [])),
        "containers": containers(req.get("containers", [])),
        "image_id": image_id(req["image"]) if req.get("image") else None,
        "tripped": trip(state),
        "mem_available_kib": memory_facts()["available_bytes"] // 1024,
        "gpu_memory": gpu_memory(),
        "files": files,
    }))


if __name__ == "__main__":
    main()
