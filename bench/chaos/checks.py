"""The soak's checks. Reading the lab (node_snapshot, incidents, memory_baseline) is kept apart from
the pure checks on what was read, which the unit tests feed with recorded data. Each check returns a
list of problems, one line each; empty means it holds."""
import json
import os


STATE_DIR = "/root/.dsv41-two-sparks"
HUNG_GRACE_S = 5.0                 # a request may end this long after its deadline (the cut, the close)
ENGINE_WORDS = ("lab-engine", "vllm", "VLLM::")   # in a process's program or script (argv[:2]), not its arguments

NODE_SCRIPT = r"""
import json, os, subprocess
procs = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        stat = open(f"/proc/{pid}/stat").read()
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        continue
    state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
    procs.append({"pid": int(pid), "ppid": int(ppid), "state": state, "comm": stat[stat.index("(") + 1:stat.rindex(")")],
                  "argv": [a.decode(errors="replace")[:200] for a in argv if a][:4]})
def run(*argv):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    return r.stdout.split("\n") if r.returncode == 0 else []
containers = []
for line in filter(None, run("docker", "ps", "-a", "--no-trunc", "--format", "{{.ID}} {{.Names}} {{.State}}")):
    cid, name, state = line.split(" ", 2)
    pid = run("docker", "inspect", "-f", "{{.State.Pid}}", cid)
    containers.append({"id": cid, "name": name, "state": state, "pid": int(pid[0]) if pid and pid[0].isdigit() else 0})
mem = dict(line.split(":", 1) for line in open("/proc/meminfo"))
print(json.dumps({"procs": procs, "containers": containers,
                  "mem_available": int(mem["MemAvailable"].split()[0]) * 1024}))
"""


# ---- reading the lab ------------------------------------------------------------------------------

def node_snapshot(lab, node):
    """{procs, containers, mem_available} of one node, or {"error": why}."""
    try:
        r = lab.on(node, "python3 -", check=False, timeout=40, input=NODE_SCRIPT)
    except Exception as err:  # noqa: BLE001  a node that does not answer is a finding, not a crash
        return {"error": f"{type(err).__name__}: {err}"}
    if r.returncode != 0:
        return {"error": f"exit {r.returncode}: {r.stderr.strip()[-200:]}"}
    return json.loads(r.stdout)


def incidents(lab):
    return lab.incidents(STATE_DIR)


def memory_baseline(lab, nodes):
    """Each node's MemAvailable (bytes) to come back to: measured by the soak itself at its start, with
    the ranks running (the one place to switch to the baseline `doit launch` records)."""
    return {n: node_snapshot(lab, n).get("mem_available") for n in nodes}


# ---- pure checks ----------------------------------------------------------------------------------

def check_orphans(snaps, ranks):
    """Exactly one rank container per node, running, named for the node's rank; no other container;
    every engine process inside it; exactly one `docker run` client; no rsync; nothing left stopped.
    snaps: {node: node_snapshot}; ranks: {node: rank}."""
    problems = []
    for node, snap in snaps.items():
        if "error" in snap:
            problems.append(f"{node}: no answer ({snap['error']})")
            continue
        want = f"dsv41-r{ranks[node]}"
        mine = [c for c in snap["containers"] if c["name"] == want and c["state"] == "running"]
        others = [c for c in snap["containers"] if c not in mine]
        if len(mine) != 1:
            problems.append(f"{node}: {len(mine)} running {want} containers, expected 1")
        problems += [f"{node}: orphaned container {c['name']} ({c['state']})" for c in others]
        parent = {p["pid"]: p["ppid"] for p in snap["procs"]}
        inside = {c["pid"] for c in mine if c["pid"]}

        def in_container(pid):
            seen = set()
            while pid and pid not in seen:
                if pid in inside:
                    return True
                seen.add(pid)
                pid = parent.get(pid)
            return False
        clients = 0
        for p in snap["procs"]:
            argv, what = p["argv"], f"{node}: pid {p['pid']} {' '.join(p['argv'])[:80] or p['comm']}"
            if argv[:1] and os.path.basename(argv[0]) == "docker":
                clients += argv[1:2] == ["run"]
            elif any(w in " ".join(argv[:2]) for w in ENGINE_WORDS) and not in_container(p["pid"]):
                problems.append(f"{what}: an engine process outside the rank container")
            if p["comm"] == "rsync":
                problems.append(f"{what}: an rsync left running")
            if p["state"] == "T":
                problems.append(f"{what}: left stopped (state T)")
        if clients != 1:
            problems.append(f"{node}: {clients} `docker run` clients, expected 1")
    return problems


def check_memory(baseline, snaps, tolerance_gib):
    """Every node's MemAvailable within tolerance_gib of its baseline."""
    problems = []
    for node, base in baseline.items():
        now = snaps.get(node, {}).get("mem_available")
        if base is None or now is None:
            continue
        missing = (base - now) / 2**30
        if missing > tolerance_gib:
            problems.append(f"{node}: MemAvailable {now / 2**30:.1f} GiB, {missing:.1f} GiB below its baseline "
                            f"{base / 2**30:.1f} GiB (MEM_RETURN_GIB {tolerance_gib})")
    return problems


def attribute(faults, incidents, slack_s=20.0):
    """{fault index: [incidents]}: each incident belongs to the last fault injected before the fault it
    names began (its fault_at: the last progress seen or the first failed look, give or take one watchdog
    interval, slack_s; when it started, for records without one) that had not healed when it started (a
    killed guard that healed at once, or an sshd stopped while the stall was being confirmed, does not take
    the recovery of the stopped engine before it); when every such fault had healed, to the last one."""
    out = {i: [] for i in range(len(faults))}
    for inc in incidents:
        began = inc.get("fault_at") or inc["started"]
        before = [i for i, f in enumerate(faults) if f["injected_at"] <= min(began + slack_s, inc["started"])]
        open_ = [i for i in before if faults[i]["healed_at"] is None or faults[i]["healed_at"] > inc["started"]]
        if before:
            out[(open_ or before)[-1]].append(inc)
    return out


def check_recoveries(faults, incidents):
    """At most one recovery (a restart incident) per fault."""
    problems = []
    for i, incs in attribute(faults, incidents).items():
        restarts = [x for x in incs if x.get("action") == "restart"]
        if len(restarts) > 1:
            f = faults[i]
            problems.append(f"fault {i + 1} ({f['kind']} on {f['node']} at +{f['at']:.0f} s): {len(restarts)} "
                            f"recoveries ({', '.join(x['verdict'] + ' ' + x['result'][:40] for x in restarts)})")
    return problems


def heal_deadlines(faults, slo_s):
    """The time by which each fault must be healed: slo_s after the fault was done (proved_at: after the
    hold of a fault that lasts a while, the node back after a reboot), or, when the next fault came
    before it healed, the next fault's deadline (a burst heals as one). Pure."""
    out = [None] * len(faults)
    for i in reversed(range(len(faults))):
        f, own = faults[i], faults[i]["proved_at"] + slo_s
        nxt = faults[i + 1] if i + 1 < len(faults) else None
        healed = f.get("healed_at")
        overlapped = nxt is not None and (healed is None or healed > nxt["injected_at"])
        out[i] = max(own, out[i + 1]) if overlapped else own
    return out


def check_healed(faults, slo_s):
    """Each fault healed (a token back from a request started after it took effect) by its deadline."""
    problems = []
    for f, deadline in zip(faults, heal_deadlines(faults, slo_s)):
        where = f"{f['kind']} on {f['node']} at +{f['at']:.0f} s"
        if f.get("healed_at") is None:
            problems.append(f"{where}: never healed (SLO {slo_s:.0f} s); left: {f.get('left') or 'unknown'}")
        elif f["healed_at"] > deadline:
            problems.append(f"{where}: healed {f['healed_at'] - f['proved_at']:.0f} s after the fault was done, "
                            f"past its SLO ({deadline - f['proved_at']:.0f} s)")
    return problems


def check_requests(records, deadline_s):
    """Every request ended, by its deadline at worst."""
    problems = []
    for r in records:
        if r["ended"] is None:
            problems.append(f"a request started at {r['started']:.0f} never ended")
        elif r["ended"] - r["started"] > deadline_s + HUNG_GRACE_S:
            problems.append(f"a request started at {r['started']:.0f} ran {r['ended'] - r['started']:.0f} s, "
                            f"past its {deadline_s:.0f} s deadline")
    return problems
