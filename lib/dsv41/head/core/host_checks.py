"""Preflight's checks of each node's own system, in the order they print: Docker and its NVIDIA runtime,
the model disk's free space, available memory, the head's ports, leftover rank containers, the kernel,
the clock, the tools, logind's RemoveIPC. Pure: they read each node's facts (and ctx.cfg)."""
from dsv41.head.core import engine
from dsv41.head.core.checks import FAIL, PASS, WARN, registry
from dsv41.names import GATEWAY_SOCKET_UNIT, GATEWAY_UNIT, RANK_PREFIX, rank_name

GIB = 1024 ** 3
MAX_SKEW_S = 2.0
# (kernel release prefix, boot option that avoids the problem, the problem)
KNOWN_BAD_KERNELS = (("7.0.0-1019", "kho=off", "NCCL memory registration (ibv_reg_mr) fails with ENOMEM"),)

CHECKS, check = registry()


def _gib(n):
    return f"{n / GIB:.0f} GiB" if n >= 10 * GIB else f"{n / GIB:.1f} GiB"


def _running_ranks(f):
    active = (f.get("units") or {}).get("active") or {}
    return sorted(u[:-8] for u, st in active.items()
                  if u.startswith(RANK_PREFIX) and st in ("active", "activating", "reloading"))


DOCKER_FIXES = {
    "missing": "install Docker (DGX OS ships it): sudo apt-get install docker.io",
    "permission": "add the user to the docker group: sudo usermod -aG docker $USER, then log in again",
    "daemon": "start Docker: sudo systemctl enable --now docker",
    "timeout": "dockerd does not answer: sudo systemctl restart docker",
}


@check("docker", per_node=True)
def docker(ctx, s, f):
    dk = f.get("docker") or {}
    if dk.get("ok"):
        yield PASS, "answering"
    else:
        yield (FAIL, dk.get("error") or "docker facts missing",
               DOCKER_FIXES.get(dk.get("kind"), "check `docker info` on this node"))


@check("nvidia-runtime", per_node=True)
def nvidia_runtime(ctx, s, f):
    dk = f.get("docker") or {}
    if not dk.get("ok"):
        return
    runtimes = dk.get("runtimes", [])
    gpu = (f.get("tools") or {}).get("nvidia-smi")
    if "nvidia" in runtimes and gpu:
        yield PASS, f"runtimes {','.join(runtimes)}; nvidia-smi present"
        return
    missing = [] if "nvidia" in runtimes else [f"no nvidia runtime (runtimes: {','.join(runtimes) or 'none'})"]
    missing += [] if gpu else ["nvidia-smi not found"]
    yield (FAIL, "; ".join(missing), "install nvidia-container-toolkit, then sudo nvidia-ctk runtime "
           "configure --runtime=docker && sudo systemctl restart docker")


@check("disk", per_node=True)
def disk(ctx, s, f):
    dsk = f.get("disk")
    if not dsk:
        return
    if "error" in dsk:
        yield FAIL, dsk["error"], "check the model dir path"
        return
    want = (ctx.cfg.free_gib_head if s.rank == 0 else ctx.cfg.free_gib_worker) * GIB
    need = max(0, want - dsk["model_bytes"])
    desc = (f"{_gib(dsk['free_bytes'])} free at {dsk['checked']} for {dsk['model_dir']} "
            f"(needs {_gib(need)}; {_gib(dsk['model_bytes'])} of the model present)")
    if dsk["free_bytes"] < need:
        var = "MODEL_DIR" if s.rank == 0 else f"R{s.rank}_MODEL_DIR"
        yield FAIL, desc, f"free space there or point {var} at a bigger disk"
    else:
        yield PASS, desc


@check("memory", per_node=True)
def memory(ctx, s, f):
    mem = f.get("memory") or {}
    running = _running_ranks(f)
    if running:
        yield PASS, f"{','.join(running)} running here; available memory not checked"
    elif mem.get("available_bytes") is None or not mem.get("total_bytes"):
        yield WARN, f"MemAvailable unknown ({mem.get('error', 'no /proc/meminfo')})", ""
    else:
        need, setting = engine.for_config(ctx.cfg).gpu_memory_wanted(mem["total_bytes"])
        desc = (f"{_gib(mem['available_bytes'])} available of {_gib(mem['total_bytes'])}, "
                f"needs {_gib(need)} ({setting} {ctx.cfg.engine_value(setting):g})")
        if mem["available_bytes"] < need:
            yield (FAIL, desc, "stop other GPU processes and containers (docker ps), drop the page cache "
                   f"(sync; echo 3 | sudo tee /proc/sys/vm/drop_caches) or lower {setting}")
        else:
            yield PASS, desc


@check("ports", per_node=True)
def ports(ctx, s, f):
    """The head's API, engine and rendezvous ports are free, or held by our own running rank 0 or gateway: PORT
    by the socket unit that holds it for the gateway (whether HAProxy runs or restarts), or by the gateway
    itself (an earlier version's, which binds it)."""
    if s.rank != 0:
        return
    used = f.get("ports") or {}
    active = (f.get("units") or {}).get("active") or {}
    gateway = next((u for u in (GATEWAY_SOCKET_UNIT, GATEWAY_UNIT) if active.get(u) in ("active", "reloading")), None)
    cfg = ctx.cfg
    public, *behind = cfg.layout.ports
    for port, var in (public, (cfg.mport, "MPORT"), *behind):
        if used.get(str(port)) is None:
            yield WARN, f"{var} {port}: not checked", ""
        elif not used[str(port)]:
            yield PASS, f"{var} {port} free"
        elif var == "PORT" and gateway == GATEWAY_SOCKET_UNIT:
            yield PASS, f"{var} {port} held for the gateway by {GATEWAY_SOCKET_UNIT}"
        elif var == "PORT" and gateway:
            yield PASS, f"{var} {port} in use by the running dsv41-gateway"
        elif rank_name(0) in _running_ranks(f):
            yield PASS, f"{var} {port} in use by the running {rank_name(0)}"
        else:
            yield (FAIL, f"{var} {port} is in use", f"stop what listens there (sudo ss -ltnp 'sport = "
                   f":{port}') or set {var} to a free port")


@check("door")
def door(ctx):
    """Who reaches the model on PORT: with GATEWAY=0 vLLM's own key check covers only paths under /v1."""
    if ctx.cfg.layout.door:
        yield PASS, f"PORT {ctx.cfg.port}: the gateway admits only listed routes with a client key"
    else:
        yield (WARN, f"GATEWAY=0: rank 0 serves PORT {ctx.cfg.port} itself, and vLLM checks its key only under /v1: "
               "/invocations and its other routes answer anyone who reaches the port", "set GATEWAY=1 (the default)")


@check("stale-containers", per_node=True)
def stale_containers(ctx, s, f):
    """A dsv41-r* container outside its running unit races the next rendezvous."""
    dk = f.get("docker") or {}
    if not dk.get("ok"):
        return
    active = (f.get("units") or {}).get("active") or {}
    stale = [c for c in dk.get("containers", [])
             if not (c.get("state") == "running" and active.get(c["name"] + ".service") == "active")]
    if not stale:
        yield PASS, f"no {RANK_PREFIX}* container outside its unit"
        return
    desc = ", ".join(f"{c['name']} ({c['state']}, unit {active.get(c['name'] + '.service', 'unknown')})"
                     for c in stale)
    fix = "docker rm -f " + " ".join(c["name"] for c in stale)
    if any(c.get("state") == "running" for c in stale):
        yield FAIL, f"running outside their units: {desc}", fix
    else:
        yield WARN, f"left over (removed at start): {desc}", fix


@check("kernel", per_node=True)
def kernel(ctx, s, f):
    k = f.get("kernel") or {}
    rel, cmdline = k.get("release", ""), (k.get("cmdline") or "").split()
    hit = next((b for b in KNOWN_BAD_KERNELS if rel.startswith(b[0]) and b[1] not in cmdline), None)
    if hit:
        yield (FAIL, f"{rel} without {hit[1]}: {hit[2]}", f"add {hit[1]} to GRUB_CMDLINE_LINUX in "
               "/etc/default/grub, sudo update-grub, reboot (or boot another kernel)")
    else:
        yield PASS, f"{rel or 'unknown'} not on the known-bad list"


@check("clock", per_node=True)
def clock(ctx, s, f):
    """Workers against the head's clock, read just before and after their facts call."""
    if s.rank == 0 or not all(isinstance(f.get(x), (int, float)) for x in ("time", "_t0", "_t1")):
        return
    t, t0, t1 = f["time"], f["_t0"], f["_t1"]
    skew = 0.0 if t0 <= t <= t1 else min(abs(t - t0), abs(t - t1))
    if skew > MAX_SKEW_S:
        yield WARN, f"{skew:.1f} s off the head's clock", "enable time sync on every node: sudo timedatectl set-ntp true"
    else:
        yield PASS, f"within {MAX_SKEW_S:g} s of the head ({skew:.1f} s)"


@check("tools", per_node=True)
def tools(ctx, s, f):
    have = f.get("tools") or {}
    side = ctx.cfg.side_door_node(s)              # the gateway runs it on the head, a side door on a group's first
    need = ("rsync", "curl") + (("haproxy",) if s.rank == 0 and ctx.cfg.layout.door or side else ())
    miss = [t for t in need if have.get(t) is False]
    if miss:
        yield FAIL, f"missing: {', '.join(miss)}", f"sudo apt-get install {' '.join(miss)}" + (
            " (its side door runs it), or GROUPS=1" if side and "haproxy" in miss else
            " (or GATEWAY=0)" if "haproxy" in miss else "")
    else:
        yield PASS, f"python3, {', '.join(need)} present"


@check("remove-ipc", per_node=True)
def remove_ipc(ctx, s, f):
    """systemd-logind's RemoveIPC=yes deletes a user's shared memory when their last session ends; ranks
    of that user then block forever in a collective. Root and system users are spared."""
    ipc = f.get("ipc") or {"error": "no facts"}
    if "error" in ipc:
        yield WARN, f"RemoveIPC unknown ({ipc['error']})", "check RemoveIPC in /etc/systemd/logind.conf"
        return
    if not ipc["remove_ipc"]:
        yield PASS, f"RemoveIPC=no ({ipc['source']})"
        return
    users = {name: uid for name, uid in ipc["rank_uids"].items() if uid is not None}
    exposed = {name: uid for name, uid in users.items() if uid > ipc["system_uid_max"]}
    if exposed:
        who = ", ".join(f"{name} as uid {uid}" for name, uid in sorted(exposed.items()))
        yield (WARN, f"RemoveIPC=yes ({ipc['source']}) and {who}: logind deletes that user's shared memory "
               "when their last session ends, and the head then blocks forever in a collective",
               "sudo mkdir -p /etc/systemd/logind.conf.d && printf '[Login]\\nRemoveIPC=no\\n' | sudo tee "
               "/etc/systemd/logind.conf.d/dsv41.conf && sudo systemctl restart systemd-logind (or run the ranks "
               "as root or a system user)")
    else:
        as_ = (", ".join(f"{name} as uid {uid}" for name, uid in sorted(users.items())) if users
               else "the rank units run as root")
        yield PASS, f"RemoveIPC=yes ({ipc['source']}), but {as_}: logind spares root and system users"
