"""Node side: what a hang leaves behind on one node, gathered before anything is restarted (stdlib only).

`python3 -m dsv41.node.evidence '<json request>'` with {"containers": ["dsv41-r0"], "units":
["dsv41-r0.service"], "pids": [...], "journal_lines": 200, "kernel_lines": 100, "top": 15,
"timeout_s": 10, "deadline_s": 60, "cap_bytes": 4000000} prints one JSON object (schema
dsv41.evidence/1) whose "files" maps a file name to its text:

    containers.txt    each rank container's state, image, restart count, command and process table
                      (named fields of `docker inspect`, never its Config.Env or anything holding the
                      environment: the API server's environment holds the key)
    journal-<unit>.txt  the unit's last journal lines
    meminfo.txt       /proc/meminfo
    processes.txt     the biggest processes by resident memory
    kernel.txt        the kernel log's tail, where it is readable
    pyspy-<pid>.txt   `py-spy dump --nonblocking --pid P` of every Python process of a rank (the
                      container's main process and its descendants) and of the pids asked for, where
                      py-spy is on PATH; never --locals

Every command has a timeout, the whole run a deadline, and the files together at most cap_bytes (the
most useful first; a log keeps its newest lines). Nothing is changed on the node; a section that cannot
be read says why in its file or in "notes".
"""
import json
import os
import pwd
import shutil
import socket
import sys
import time

from dsv41.node.facts import descendants, processes, run_quiet  # noqa: F401 (the tests read them here)

SCHEMA = "dsv41.evidence/1"
DEFAULTS = {"containers": [], "units": [], "pids": [], "journal_lines": 200, "kernel_lines": 100, "top": 15,
            "timeout_s": 10, "deadline_s": 60, "cap_bytes": 4_000_000, "max_pyspy": 16}
# The fields of `docker inspect` worth keeping; nothing from Config.Env, nothing that holds environment.
INSPECT = ("{{.Name}} id={{.Id}} image={{.Image}} created={{.Created}} restarts={{.RestartCount}}\n"
           "state={{json .State}}\npath={{json .Path}} args={{json .Args}}")


def cmdline(pid, limit=200):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            text = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
    return text if len(text) <= limit else text[:limit] + "..."


def is_python(pid):
    """Whether the process runs a Python interpreter (unknown counts as yes: py-spy says if not)."""
    try:
        return "python" in os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return True


def container_section(names, timeout):
    """(text of containers.txt, {container: its main pid or None})."""
    if not names:
        return None, {}
    if not shutil.which("docker"):
        return "docker not found on this node\n", {}
    parts, pids = [], {}
    for name in names:
        code, out, err = run_quiet(["docker", "inspect", "--type", "container", "--format", INSPECT, name],
                                   timeout=timeout)
        parts.append(f"== {name}\n" + (out.strip() if code == 0 else f"(docker inspect: {err.strip() or code})"))
        code, pid, _ = run_quiet(["docker", "inspect", "--type", "container", "--format", "{{.State.Pid}}", name],
                                 timeout=timeout)
        pids[name] = int(pid) if code == 0 and pid.strip().isdigit() and int(pid) > 0 else None
        if pids[name]:
            code, out, err = run_quiet(["docker", "top", name, "-o", "pid,ppid,stat,rss,etime,comm"],
                                       timeout=timeout)
            parts.append("-- docker top\n" + (out.strip() if code == 0 else f"(docker top: {err.strip() or code})"))
    return "\n".join(parts) + "\n", pids


def top_processes(procs, n):
    rows = sorted(procs.items(), key=lambda kv: -kv[1][2])[:n]
    lines = [f"{'PID':>8} {'PPID':>8} {'RSS MiB':>9} {'USER':<10} S {'COMM':<16} COMMAND"]
    for pid, (ppid, comm, rss, uid, state) in rows:
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
        lines.append(f"{pid:>8} {ppid:>8} {rss / 1024:>9.1f} {user:<10} {state} {comm:<16} {cmdline(pid)}")
    return "\n".join(lines) + "\n"


def kernel_tail(n, timeout):
    code, out, err = run_quiet(["dmesg", "--ctime"], timeout=timeout)
    if code == 0 and out.strip():
        return "\n".join(out.splitlines()[-n:]) + "\n"
    code2, out2, err2 = run_quiet(["journalctl", "-k", "-n", str(n), "--no-pager", "-o", "short-iso"],
                                  timeout=timeout)
    if code2 == 0 and out2.strip() and "No entries" not in out2:
        return out2
    return f"kernel log not readable here (dmesg: {err.strip() or code}; journalctl -k: {err2.strip() or code2})\n"


def pyspy(pid, timeout):
    code, out, err = run_quiet(["py-spy", "dump", "--nonblocking", "--pid", str(pid)], timeout=timeout)
    head = f"$ py-spy dump --nonblocking --pid {pid}   (exit {code})\n"
    return head + out + (("\n-- stderr\n" + err.strip()[:2000] + "\n") if err.strip() else "")


class Budget:
    """Files in the order they are added, together at most cap bytes; a log keeps its newest lines."""

    def __init__(self, cap):
        self.cap, self.used, self.files, self.capped = cap, 0, {}, False

    def add(self, name, text, keep="tail"):
        data = text.encode(errors="replace")
        room = self.cap - self.used
        if len(data) > room:
            self.capped = True
            note = f"[{len(data) - max(room, 0)} bytes left out: the evidence size cap]\n".encode()
            room = max(0, room - len(note))
            data = (note + data[len(data) - room:]) if keep == "tail" else (data[:room] + b"\n" + note)
            if room == 0:
                data = note
        self.files[name] = data.decode(errors="replace")
        self.used += len(data)


def gather(req):
    r = dict(DEFAULTS, **req)
    start, notes, t = time.monotonic(), [], r["timeout_s"]
    out = Budget(int(r["cap_bytes"]))

    def late(what):
        if time.monotonic() - start > r["deadline_s"]:
            notes.append(f"{what} left out: the {r['deadline_s']} s deadline passed")
            return True
        return False

    text, main_pids = container_section(r["containers"], t)
    if text is not None:
        out.add("containers.txt", text, keep="head")
    try:
        with open("/proc/meminfo") as f:
            out.add("meminfo.txt", f.read(), keep="head")
    except OSError as err:
        notes.append(f"/proc/meminfo: {err.strerror}")
    procs = processes()
    ranks = []
    for name, pid in main_pids.items():
        if pid is None:
            notes.append(f"{name}: no running main process")
        ranks += [p for p in descendants(pid, procs) if p not in ranks] if pid else []
    wanted, dumped = [p for p in ranks if is_python(p)] + [int(p) for p in r["pids"] if int(p) not in ranks], []
    if not shutil.which("py-spy"):
        notes.append("py-spy is not on PATH here: no Python stacks")
    else:
        for pid in wanted[: r["max_pyspy"]]:
            if late(f"py-spy dump of pid {pid}"):
                break
            out.add(f"pyspy-{pid}.txt", pyspy(pid, t), keep="head")
            dumped.append(pid)
        if len(wanted) > r["max_pyspy"]:
            notes.append(f"{len(wanted) - r['max_pyspy']} more Python processes not dumped (max_pyspy)")
    for unit in r["units"]:
        if late(f"journal of {unit}"):
            break
        code, log, err = run_quiet(["journalctl", "-u", unit, "-n", str(r["journal_lines"]), "--no-pager",
                                    "-o", "short-iso"], timeout=t)
        out.add(f"journal-{unit.removesuffix('.service')}.txt", log if code == 0 else f"journalctl: {err.strip()}\n")
    out.add("processes.txt", top_processes(procs, int(r["top"])), keep="head")
    if not late("kernel log"):
        out.add("kernel.txt", kernel_tail(int(r["kernel_lines"]), t))
    return {"schema": SCHEMA, "node": socket.gethostname(), "time": time.time(),
            "took_s": round(time.monotonic() - start, 2), "rank_pids": ranks, "dumped_pids": dumped,
            "capped": out.capped, "bytes": out.used, "notes": notes, "files": out.files}


def main():
    req = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    print(json.dumps(gather(req)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
