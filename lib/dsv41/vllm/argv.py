"""A vLLM rank's unit values and its container: docker run's options, vLLM's argv and environment as
measured on two Sparks (serving-config.md), with an engine profile's [args]/[env] changes and vLLM's
own settings (vllm/settings.py).

`fabric` is one node's resolved fabric facts: an object or dict with ip, ifname, hcas, gid_index."""
import json
from collections.abc import Mapping

from dsv41 import names
from dsv41.errors import UserError
from dsv41.head.core.commands import (DOCKER, STOP_GRACE_S, cidfile, docker_rm, docker_stop, fact, mkdir, mount, rm_f,
                                      secret_key_file, systemctl, tripped_marker)

RANK_TEMPLATE = "dsv41-rank.service.j2"
# rank 0's entrypoint: read the key from the mounted secret, then exec the server (ENGINE_CMD and its
# arguments follow as "$@"); a missing key file stops the container before the server starts
KEY_WRAPPER = f'VLLM_API_KEY=$(cat {names.CONTAINER_SECRET}) && export VLLM_API_KEY && exec "$@"'
RANK_DIRS = (names.RUN,)                    # made before a rank starts, with its image's cache folders
DEFAULT_GID_INDEX = 3              # the measured value, used only when neither detected nor set
LIMIT_MM = '{"image":1}'
ENGRAM = {"cpu_offload": False, "table_memory": "disk", "disk_resident_scales": False,
          "disk_prefetch_max_tokens": 0, "projection_tp": False}


def rank_vars(cfg, spec, fabric, paths, master_addr=None, server_flags=()):
    """The rank unit template's values. server_flags: those of the recipe's optional flags the image's
    server lists; with --shutdown-timeout a group's rank 0 drains for DRAIN_S when stopped, and its stop waits
    for that."""
    state, rank, lead = fact(paths, "state_dir"), spec.rank, cfg.leads(spec)
    name = names.rank_name(rank)
    drain_s = cfg.drain_s if lead and "--shutdown-timeout" in server_flags else 0
    return {
        "rank": group_rank(cfg, spec), "role": "head" if lead else "worker", "nnodes": cfg.nnodes, "name": name,
        "memguard": names.MEMGUARD_UNIT, "tripped": tripped_marker(state),
        "guard_active": systemctl("is-active", "--quiet", names.MEMGUARD_UNIT),
        "docker_rm": docker_rm(name), "rm_cidfile": rm_f(cidfile(state, rank)),
        "mkdir_state": mkdir(*(names.state_path(state, d) for d in RANK_DIRS + cache_dirs(cfg.image))),
        "docker_run": docker_run_groups(cfg, spec, fabric, paths, master_addr)
        + ([["--shutdown-timeout", str(drain_s)]] if drain_s else []),
        "docker_stop": docker_stop(name, STOP_GRACE_S + drain_s), "stop_timeout_s": STOP_GRACE_S + drain_s + 30,
    }


def group_rank(cfg, spec):
    """A node's rank inside its serving group (vLLM's --node-rank): 0 on the group's first node."""
    return [s.name for s in cfg.group_specs(cfg.group_of(spec))].index(spec.name)


# ---- the container: argv and environment ---------------------------------------------------------------------------------

def cache_dirs(image):
    """The image's cache folders under the state dir (names.ENGINE_CACHES), made before a rank starts."""
    key = names.cache_key(image)
    return tuple(f"{names.CACHE}/{key}/{folder}" for _, _, folder in names.ENGINE_CACHES)


def cache_env(env):
    """env with every library's cache variable (names.ENGINE_CACHES) that it does not set yet, after
    XDG_CACHE_HOME: each points into /cache, the image's own folder on the host."""
    have = dict(env)
    mine = [(var, f"{names.CONTAINER_CACHE}/{folder}") for _, var, folder in names.ENGINE_CACHES if var not in have]
    at = [k for k, _ in env].index("XDG_CACHE_HOME") + 1
    return env[:at] + mine + env[at:]


def cap(e):
    """The largest CUDA-graph capture size: MAX_SEQS x (NSPEC + 1)."""
    return e.max_seqs * (e.nspec + 1)


def compilation_config(cfg):
    e = cfg.engine_settings()
    return json.dumps({"cudagraph_mode": e.graph_mode, "custom_ops": ["all"],
                       "cudagraph_capture_sizes": list(e.caps)})


def speculative_config(cfg):
    return json.dumps({"method": "dspark", "num_speculative_tokens": cfg.engine_settings().nspec,
                       "draft_tensor_parallel_size": 2, "attention_backend": "B12X",
                       "draft_sample_method": "greedy", "rejection_sample_method": "standard",
                       "enable_adaptive_verification": True})


def engram_config():
    return json.dumps(ENGRAM)


def _need(fabric, name, rank):
    v = fact(fabric, name)
    if v in (None, "", ()):
        var = {"ip": "IP", "ifname": "IFNAME", "hcas": "HCAS"}[name]
        raise UserError(f"rank {rank}: no fabric {name} known; check `ip -br a` and `rdma link` on "
                        f"that node and set R{rank}_{var}")
    return v


def container_env(cfg, fabric, rank=None):
    """The container's environment, in the measured order, with the engine profile's changes. The API
    key is not here."""
    return engine_env(cfg, cache_env(measured_env(cfg, fabric, rank)), rank)


def measured_env(cfg, fabric, rank=None):
    r = "?" if rank is None else rank
    ifname = _need(fabric, "ifname", r)
    hcas = _need(fabric, "hcas", r)
    hcas = hcas if isinstance(hcas, str) else ",".join(hcas)
    gid = fact(fabric, "gid_index")
    if gid is None:
        gid = cfg.nccl_ib_gid_index if cfg.nccl_ib_gid_index is not None else DEFAULT_GID_INDEX
    return [
        ("CUDA_VISIBLE_DEVICES", "0"), ("CUTE_DSL_ARCH", "sm_121a"), ("HF_HUB_OFFLINE", "1"),
        ("TRANSFORMERS_OFFLINE", "1"), ("VLLM_WORKER_MULTIPROC_METHOD", "spawn"),
        ("VLLM_USE_V2_MODEL_RUNNER", "1"), ("VLLM_USE_BREAKABLE_CUDAGRAPH", "0"),
        ("VLLM_USE_FLASHINFER_SAMPLER", "1"), ("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "1"),
        ("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1"), ("OMP_NUM_THREADS", "16"), ("MALLOC_ARENA_MAX", "2"),
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"), ("SAFETENSORS_FAST_GPU", "1"),
        ("VLLM_ENABLE_PCIE_ALLREDUCE", "0"), ("NCCL_IB_DISABLE", "0"), ("NCCL_NET_PLUGIN", "none"),
        ("NCCL_IB_GID_INDEX", str(gid)), ("NCCL_IB_HCA", hcas), ("NCCL_IB_MERGE_NICS", "1"),
        ("NCCL_SOCKET_IFNAME", ifname), ("GLOO_SOCKET_IFNAME", ifname), ("NCCL_DEBUG", "WARN"),
        ("VLLM_ENABLE_ROCE_ALLREDUCE", "1"), ("VLLM_ROCE_ALLREDUCE_MAX_SIZE", "2MB"),
        ("VLLM_ROCE_ALLGATHER_MAX_SIZE", "16MB"), ("B12X_ROCE_CACHE_DIR", "/cache/b12x-roce"),
        ("B12X_ROCE_TRAFFIC_CLASS", "106"), ("NCCL_IB_TC", "106"),
        ("B12X_COMPILE_CACHE_DIR", "/cache/b12x"), ("XDG_CACHE_HOME", "/cache"),
        ("ST_EXL3_PLAN", f"/plans/{cfg.plan_name}"), ("ST_EXL3_PREFILL", "st"),
        ("ST_EXL3_PREFILL_MIN_ROWS", "1"), ("VLLM_HOST_IP", _need(fabric, "ip", r)),
    ]


def engine_env(cfg, env, rank):
    """env [(name, value)] with the engine profile's [env] changes: replaced, dropped or added."""
    changes = {k: v for k, v, _ in cfg.engine_env}
    out = [(k, changes.get(k, v)) for k, v in env]
    out += [(k, v) for k, v in changes.items() if k not in dict(env)]
    return [(k, v.replace("{rank}", str(rank))) for k, v in out if v is not None]


def engine_args(cfg, args):
    """vLLM's argv with the engine profile's [args] changes to the flags it has: a value replaced, or
    the flag dropped with its value (new flags come from EXTRA)."""
    changes = {k: v for k, v, _ in cfg.engine_args}
    out, i = [], 0
    while i < len(args):
        word, has_value = args[i], i + 1 < len(args) and not args[i + 1].startswith("--")
        if word in changes:
            out += [word, changes[word]] if changes[word] is not None else []
            i += 2 if has_value else 1
        else:
            out.append(word)
            i += 1
    return out


def vllm_args(cfg, rank, fabric_by_rank):
    """vLLM's arguments after the image, with the engine profile's changes; rank: the node's rank in its group;
    fabric_by_rank[0] gives the rendezvous address (its group's first node)."""
    return engine_args(cfg, measured_args(cfg, rank, fabric_by_rank))


def measured_args(cfg, rank, fabric_by_rank):
    """vLLM's arguments as measured on two Sparks (serving-config.md)."""
    master, e = _need(fabric_by_rank[0], "ip", 0), cfg.engine_settings()
    args = [
        "/model", "--served-model-name", cfg.served_model_name, "--dtype", "bfloat16",
        "--tensor-parallel-size", str(cfg.tp_size), "--nnodes", str(cfg.nnodes),
        "--master-addr", master, "--master-port", str(cfg.mport),
        "--kv-cache-dtype", "fp8", "--block-size", "256", "--swa-block-size", "128",
        "--kv-cache-memory-bytes", str(e.kv_bytes), "--gpu-memory-utilization", str(e.gpu_util),
        "--max-model-len", str(e.max_len), "--max-num-seqs", str(e.max_seqs),
        "--max-num-batched-tokens", str(e.batch), "--max-cudagraph-capture-size", str(cap(e)),
        "--compilation-config", compilation_config(cfg), "--enable-chunked-prefill",
        "--async-scheduling", "--enable-prefix-caching", "--safetensors-load-strategy", "lazy",
        "--engram-config", engram_config(), "--attention-backend", "B12X",
        "--linear-backend", "b12x", "--moe-backend", "b12x",
        "--speculative-config", speculative_config(cfg), "--generation-config", "vllm",
        "--tokenizer-mode", "deepseek_v41", "--limit-mm-per-prompt", LIMIT_MM,
    ]
    if rank:
        return args + ["--node-rank", str(rank), "--headless"]
    host, port = cfg.layout.engine_listen            # 127.0.0.1:ENGINE_PORT behind a door (or a side door)
    return args + ["--node-rank", "0", "--host", host, "--port", str(port),
                   "--reasoning-parser", "deepseek_v41", "--tool-call-parser", "deepseek_v41",
                   "--enable-auto-tool-choice", "--enable-prompt-tokens-details",
                   "--enable-force-include-usage", *e.extra]


def fabric_for(cfg, spec, fabric, master_addr=None):
    """(this node's fabric, {0: its group's first node's fabric}) from one node's fabric or a {rank: fabric}
    mapping (ranks counted across every node)."""
    lead = cfg.leader(spec)
    if isinstance(fabric, Mapping) and all(isinstance(k, int) for k in fabric):
        if spec.rank not in fabric or lead.rank not in fabric:
            raise UserError(f"no fabric facts for rank {spec.rank} or its group's first node; run the fabric check")
        return fabric[spec.rank], {0: fabric[lead.rank]}
    if master_addr is None:
        master_addr = fact(fabric, "ip") if lead.name == spec.name else lead.ip
    if not master_addr:
        raise UserError(f"rank {spec.rank}: the rendezvous address (rank {lead.rank}'s fabric address) is unknown: "
                        f"render with every node's fabric facts ({{rank: fabric}}) or set R{lead.rank}_IP")
    return fabric, {0: {"ip": master_addr}}


def docker_run_groups(cfg, spec, fabric, paths, master_addr=None):
    """docker run's argv in groups (one option with its value each), for readable unit files."""
    own, heads = fabric_for(cfg, spec, fabric, master_addr)
    state, rank, name, lead = fact(paths, "state_dir"), spec.rank, names.rank_name(spec.rank), cfg.leads(spec)
    command = cfg.engine_settings().engine_cmd
    groups = [
        [DOCKER, "run"], ["--rm"], ["--name", name], ["--cidfile", cidfile(state, rank)],
        ["--pull", "never"], ["--init"], *([["--gpus", cfg.gpus]] if cfg.gpus else []), ["--network", "host"],
        ["--ipc", "host"], *([["--privileged"]] if cfg.privileged else []), ["--ulimit", f"memlock={cfg.memlock}"], ["--shm-size", "32g"],
        ["--mount", mount(fact(paths, "model_dir"), "/model", readonly=True)],
        ["--mount", mount(names.state_path(state, names.PLANS), "/plans", readonly=True)],
        ["--mount", mount(names.state_path(state, names.CACHE, names.cache_key(cfg.image)), names.CONTAINER_CACHE)],
    ]
    if lead:
        groups.append(["--mount", mount(secret_key_file(state), names.CONTAINER_SECRET, readonly=True)])
        groups.append(["--entrypoint", "/bin/sh"])
    else:
        groups.append(["--entrypoint", command[0]])
    groups.append(["-e", f"{names.RANK_ENV}={rank}"])
    groups += [["-e", f"{k}={v}"] for k, v in container_env(cfg, own, rank)]
    groups.append([cfg.image])
    if lead:        # the key goes from the mounted file into the server's environment, nowhere else
        groups.append(["-c", KEY_WRAPPER, name, *command])
    elif command[1:]:
        groups.append(list(command[1:]))
    for word in vllm_args(cfg, group_rank(cfg, spec), heads):
        if word.startswith("-") or len(groups[-1]) != 1 or groups[-1] == [cfg.image]:
            groups.append([word])
        else:
            groups[-1].append(word)
    return groups


def docker_run_argv(cfg, spec, fabric, paths, master_addr=None):
    """The full foreground container command: docker options, the image, then vLLM's arguments."""
    return [w for g in docker_run_groups(cfg, spec, fabric, paths, master_addr) for w in g]
