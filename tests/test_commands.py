"""commands.py: the argv builders, checked against tables copied from spec/serving-config.md."""
import json

import pytest

from dsv41.head.core import commands as c
from dsv41.vllm import argv as vllm
from dsv41.settings.layers import load_config
from dsv41.errors import UserError

# ---- spec/serving-config.md, copied as written (placeholders in angle brackets) -------------------

SPEC_ENV = """
  `CUDA_VISIBLE_DEVICES=0`, `CUTE_DSL_ARCH=sm_121a`, `HF_HUB_OFFLINE=1`, `TRANSFORMERS_OFFLINE=1`,
  `VLLM_WORKER_MULTIPROC_METHOD=spawn`, `VLLM_USE_V2_MODEL_RUNNER=1`, `VLLM_USE_BREAKABLE_CUDAGRAPH=0`,
  `VLLM_USE_FLASHINFER_SAMPLER=1`, `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1`,
  `VLLM_ALLOW_LONG_MAX_MODEL_LEN=1`, `OMP_NUM_THREADS=16`, `MALLOC_ARENA_MAX=2`,
  `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, `SAFETENSORS_FAST_GPU=1`,
  `VLLM_ENABLE_PCIE_ALLREDUCE=0`, `NCCL_IB_DISABLE=0`, `NCCL_NET_PLUGIN=none`, `NCCL_IB_GID_INDEX=3`,
  `NCCL_IB_HCA=<hcas>`, `NCCL_IB_MERGE_NICS=1`, `NCCL_SOCKET_IFNAME=<ifname>`, `GLOO_SOCKET_IFNAME=<ifname>`,
  `NCCL_DEBUG=WARN`, `VLLM_ENABLE_ROCE_ALLREDUCE=1`, `VLLM_ROCE_ALLREDUCE_MAX_SIZE=2MB`,
  `VLLM_ROCE_ALLGATHER_MAX_SIZE=16MB`, `B12X_ROCE_CACHE_DIR=/cache/b12x-roce`, `B12X_ROCE_TRAFFIC_CLASS=106`,
  `NCCL_IB_TC=106`, `B12X_COMPILE_CACHE_DIR=/cache/b12x`, `XDG_CACHE_HOME=/cache`,
  `ST_EXL3_PLAN=/plans/<plan file name>`, `ST_EXL3_PREFILL=st`, `ST_EXL3_PREFILL_MIN_ROWS=1`,
  `VLLM_HOST_IP=<node fabric ip>`.
"""

# what dsv41 adds after XDG_CACHE_HOME: each library's own cache variable, as its code reads it
# (docs/operating.md), pointing into /cache, the image's cache folder on the host
CACHE_ENV = [("VLLM_CACHE_ROOT", "/cache/vllm"), ("TORCHINDUCTOR_CACHE_DIR", "/cache/torchinductor"),
             ("TRITON_CACHE_DIR", "/cache/triton"), ("FLASHINFER_WORKSPACE_BASE", "/cache/flashinfer"),
             ("TILELANG_CACHE_DIR", "/cache/tilelang"), ("CUTE_DSL_CACHE_DIR", "/cache/cutedsl"),
             ("DG_JIT_CACHE_DIR", "/cache/deep_gemm")]

SPEC_ARGS = """/model --served-model-name deepseek-v4.1-flash --dtype bfloat16 --tensor-parallel-size 2 --nnodes 2
--master-addr <head fabric ip> --master-port <MPORT> --kv-cache-dtype fp8 --block-size 256
--swa-block-size 128 --kv-cache-memory-bytes <KV_BYTES> --gpu-memory-utilization <GPU_UTIL>
--max-model-len <MAX_LEN> --max-num-seqs <MAX_SEQS> --max-num-batched-tokens <BATCH>
--max-cudagraph-capture-size <CAP> --compilation-config <COMP> --enable-chunked-prefill
--async-scheduling --enable-prefix-caching --safetensors-load-strategy lazy --engram-config <ENGRAM>
--attention-backend B12X --linear-backend b12x --moe-backend b12x --speculative-config <SPEC>
--generation-config vllm --tokenizer-mode deepseek_v41 --limit-mm-per-prompt {"image":1}"""

# behind the gateway (GATEWAY=1, the default) rank 0 serves 127.0.0.1:ENGINE_PORT; the spec's `--host 0.0.0.0
# --port <PORT>` is GATEWAY=0's
SPEC_HEAD_ARGS = ("--node-rank 0 --host <HOST> --port <ENGINE_PORT> --reasoning-parser deepseek_v41 "
                  "--tool-call-parser deepseek_v41 --enable-auto-tool-choice "
                  "--enable-prompt-tokens-details --enable-force-include-usage")

COMP = ('{"cudagraph_mode": "<GRAPH_MODE>", "custom_ops": ["all"], '
        '"cudagraph_capture_sizes": [<sizes>]}')
SPEC = ('{"method": "dspark", "num_speculative_tokens": <NSPEC>, "draft_tensor_parallel_size": 2, '
        '"attention_backend": "B12X", "draft_sample_method": "greedy", '
        '"rejection_sample_method": "standard", "enable_adaptive_verification": true}')
ENGRAM = ('{"cpu_offload": false, "table_memory": "disk", "disk_resident_scales": false, '
          '"disk_prefetch_max_tokens": 0, "projection_tp": false}')

DEFAULTS = {"<MPORT>": "29655", "<KV_BYTES>": "2700000000", "<GPU_UTIL>": "0.88",
            "<MAX_LEN>": "262144", "<MAX_SEQS>": "2", "<BATCH>": "2048", "<CAP>": "16",
            "<GRAPH_MODE>": "FULL_DECODE_ONLY", "<sizes>": "1, 2, 3, 4, 5, 6, 7, 8, 12, 16",
            "<NSPEC>": "7", "<HOST>": "127.0.0.1", "<ENGINE_PORT>": "18000",
            "<plan file name>": "J268-ho-v31-K5n.json"}

HEAD = {"ip": "198.51.100.11", "ifname": "enp1s0f1np1", "hcas": ("rocep1s0f1", "roceP2p1s0f1"),
        "gid_index": 3}
WORKER = {"ip": "198.51.100.13", "ifname": "enP2p1s0f1np1", "hcas": ("roceP2p1s0f1",), "gid_index": 4}


def spec_env(values):
    """[(name, value)] from SPEC_ENV with the placeholders filled in."""
    out = []
    for item in SPEC_ENV.split("`")[1::2]:
        k, v = item.split("=", 1)
        for ph, real in values.items():
            v = v.replace(ph, real)
        out.append((k, v))
    return out


def rank_env(values):
    """The container's environment: the measured one with CACHE_ENV after XDG_CACHE_HOME."""
    env = spec_env(values)
    at = [k for k, _ in env].index("XDG_CACHE_HOME") + 1
    return env[:at] + CACHE_ENV + env[at:]


def spec_args(values, rank, tp=2, nnodes=2, extra=()):
    """vLLM's argv from SPEC_ARGS (+ the rank's additions) with the placeholders filled in."""
    fill = dict(values)
    fill["<COMP>"] = sub(COMP, values)
    fill["<SPEC>"] = sub(SPEC, values)
    fill["<ENGRAM>"] = ENGRAM
    words = [fill.get(w, w) for w in SPEC_ARGS.replace("<head fabric ip>", values["<head ip>"]).split()]
    words = [w.replace("<MPORT>", fill["<MPORT>"]) for w in words]
    words[words.index("--tensor-parallel-size") + 1] = str(tp)
    words[words.index("--nnodes") + 1] = str(nnodes)
    if rank:
        return words + ["--node-rank", str(rank), "--headless"]
    return words + [fill.get(w, w) for w in SPEC_HEAD_ARGS.split()] + list(extra)


def sub(text, values):
    for ph, real in values.items():
        text = text.replace(ph, real)
    return text


def values_for(fabric, head=HEAD, **over):
    v = dict(DEFAULTS, **over)
    v.update({"<hcas>": ",".join(fabric["hcas"]), "<ifname>": fabric["ifname"],
              "<node fabric ip>": fabric["ip"], "<head ip>": head["ip"]})
    return v


@pytest.fixture
def cfg(tmp_path):
    return load_config({"WORKER": "root@198.51.100.13", "STATE_DIR": str(tmp_path / "state")})


# ---- the tables themselves ------------------------------------------------------------------------

def test_spec_tables_are_complete():
    assert len(spec_env(DEFAULTS)) == 35
    assert spec_args(values_for(HEAD), 0)[:3] == ["/model", "--served-model-name", "deepseek-v4.1-flash"]


@pytest.mark.parametrize("rank,fabric", [(0, HEAD), (1, WORKER)])
def test_container_env_is_the_measured_one(cfg, rank, fabric):
    env = vllm.container_env(cfg, fabric)
    want = rank_env(values_for(fabric))
    want = [(k, str(fabric["gid_index"]) if k == "NCCL_IB_GID_INDEX" else v) for k, v in want]
    for item in want:
        assert item in env, f"{item[0]} missing or different: {dict(env).get(item[0])!r}"
    assert env == want                                                  # same order, nothing else
    assert not any("KEY" in k for k, _ in env)


def test_gid_index_detected_then_override_then_measured_default(tmp_path):
    base = {"WORKER": "root@198.51.100.13", "STATE_DIR": str(tmp_path)}
    undetected = dict(HEAD, gid_index=None)
    assert dict(vllm.container_env(load_config(base), undetected))["NCCL_IB_GID_INDEX"] == "3"
    cfg4 = load_config(dict(base, NCCL_IB_GID_INDEX="4"))
    assert dict(vllm.container_env(cfg4, undetected))["NCCL_IB_GID_INDEX"] == "4"
    assert dict(vllm.container_env(cfg4, dict(HEAD, gid_index=5)))["NCCL_IB_GID_INDEX"] == "5"


@pytest.mark.parametrize("how", ["R1_GID_INDEX", "WORKER_GID_INDEX", "HEAD_GID_INDEX", "profile"])
def test_gid_index_0_is_kept(how, tmp_path, monkeypatch, capsys):
    """GID index 0 is an index like any other: `doit config` shows it and the units use it, rather
    than NCCL_IB_GID_INDEX's or the detected one."""
    from dsv41.head import config as head_config
    from dsv41.head.core import fabric
    from dsv41.settings import layers
    rank = 0 if how == "HEAD_GID_INDEX" else 1
    env = {"WORKER": "root@198.51.100.13", "STATE_DIR": str(tmp_path), "NCCL_IB_GID_INDEX": "3",
           "R0_IP": "198.51.100.11", "R1_IP": "198.51.100.13", "R0_IFNAME": "fab0", "R1_IFNAME": "fab0",
           "R0_HCAS": "a", "R1_HCAS": "b"}
    if how == "profile":
        (tmp_path / "gid.toml").write_text('[overrides]\nR1_GID_INDEX = 0\n')
        monkeypatch.setattr(layers, "CONF_DIR", tmp_path)
        env["DSV41_PROFILE"] = "gid"
    else:
        env[how] = "0"
    cfg = load_config(env)
    assert cfg.nodes[rank].gid_index == 0 and cfg.nodes[1 - rank].gid_index is None
    head_config.show(cfg, setting=(f"r{rank}.gid_index",))
    assert capsys.readouterr().out.split()[:2] == [f"r{rank}.gid_index", "0"]
    facts = fabric.from_overrides(cfg)
    assert dict(vllm.container_env(cfg, facts[rank], rank))["NCCL_IB_GID_INDEX"] == "0"
    assert dict(vllm.container_env(cfg, facts[1 - rank], 1 - rank))["NCCL_IB_GID_INDEX"] == "3"


def test_missing_fabric_fact_is_a_user_error(cfg):
    with pytest.raises(UserError, match="R1_IFNAME"):
        vllm.container_env(cfg, dict(WORKER, ifname=None), rank=1)


@pytest.mark.parametrize("rank", [0, 1])
def test_vllm_args_default(cfg, rank):
    got = vllm.vllm_args(cfg, rank, {0: HEAD, 1: WORKER})
    assert got == spec_args(values_for(WORKER if rank else HEAD), rank)


def test_vllm_args_json_values_are_exact(cfg):
    got = vllm.vllm_args(cfg, 0, {0: HEAD})
    assert got[got.index("--compilation-config") + 1] == (
        '{"cudagraph_mode": "FULL_DECODE_ONLY", "custom_ops": ["all"], '
        '"cudagraph_capture_sizes": [1, 2, 3, 4, 5, 6, 7, 8, 12, 16]}')
    assert json.loads(got[got.index("--speculative-config") + 1])["enable_adaptive_verification"] is True
    assert got[got.index("--engram-config") + 1] == ENGRAM
    assert got[got.index("--limit-mm-per-prompt") + 1] == '{"image":1}'


@pytest.mark.parametrize("env,want", [
    ({"NSPEC": "3"}, {"<NSPEC>": "3", "<CAP>": "8", "<sizes>": "1, 2, 3, 4, 8"}),
    ({"NSPEC": "3", "MAX_SEQS": "4"},
     {"<NSPEC>": "3", "<MAX_SEQS>": "4", "<CAP>": "16", "<sizes>": "1, 2, 3, 4, 8, 12, 16"}),
    ({"KV_BYTES": "1234567890", "GPU_UTIL": "0.8", "MAX_LEN": "131072", "BATCH": "4096",
      "MPORT": "29999", "ENGINE_PORT": "8123", "GRAPH_MODE": "PIECEWISE"},
     {"<KV_BYTES>": "1234567890", "<GPU_UTIL>": "0.8", "<MAX_LEN>": "131072", "<BATCH>": "4096",
      "<MPORT>": "29999", "<ENGINE_PORT>": "8123", "<GRAPH_MODE>": "PIECEWISE"}),
    ({"GATEWAY": "0", "PORT": "8123"}, {"<HOST>": "0.0.0.0", "<ENGINE_PORT>": "8123"}),
    ({"CAPS": "8,1,4"}, {"<sizes>": "1, 4, 8"}),
])
def test_vllm_args_overrides(tmp_path, env, want):
    cfg = load_config(dict(env, WORKER="root@198.51.100.13", STATE_DIR=str(tmp_path)))
    for rank in (0, 1):
        got = vllm.vllm_args(cfg, rank, {0: HEAD})
        assert got == spec_args(values_for(HEAD, **want), rank)


def test_extra_is_appended_to_the_head_only(tmp_path):
    cfg = load_config({"WORKER": "root@198.51.100.13", "STATE_DIR": str(tmp_path),
                       "EXTRA": "--chat-template '/t/my template.jinja' --x=\"a b\""})
    head = vllm.vllm_args(cfg, 0, {0: HEAD})
    assert head[-3:] == ["--chat-template", "/t/my template.jinja", "--x=a b"]
    assert head == spec_args(values_for(HEAD), 0, extra=head[-3:])
    assert "--chat-template" not in vllm.vllm_args(cfg, 1, {0: HEAD})


def test_four_nodes_use_tp4_and_the_head_as_master(tmp_path):
    cfg = load_config({"WORKERS": "root@198.51.100.12,root@198.51.100.13,root@198.51.100.14",
                       "STATE_DIR": str(tmp_path)})
    for rank in range(4):
        got = vllm.vllm_args(cfg, rank, {0: HEAD})
        assert got == spec_args(values_for(HEAD), rank, tp=4, nnodes=4)
        assert got[got.index("--master-addr") + 1] == HEAD["ip"]


def test_mount_values_quote_like_go_csv():
    assert c.mount("/m/a b", "/model", readonly=True) == "type=bind,source=/m/a b,target=/model,readonly"
    assert c.mount('/m/x,"y"', "/cache") == 'type=bind,"source=/m/x,""y""",target=/cache'


def test_docker_run_argv_layout(cfg):
    spec = cfg.nodes[1]
    paths = {"model_dir": "/m", "state_dir": "/s"}
    argv = vllm.docker_run_argv(cfg, spec, WORKER, paths, master_addr=HEAD["ip"])
    i = argv.index(cfg.image)
    assert argv[:2] == ["docker", "run"]
    assert argv[argv.index("--entrypoint") + 1] == "vllm"
    assert argv[i + 1:] == ["serve", *spec_args(values_for(WORKER), 1)]
    assert not any("secrets" in a for a in argv)                    # the key is for the head only
    assert argv[argv.index("--cidfile") + 1] == "/s/run/dsv41-r1.cid"
    with pytest.raises(UserError, match="R0_IP"):
        vllm.docker_run_argv(cfg, spec, WORKER, paths)                   # worker without the head's ip


@pytest.mark.parametrize("gpus,want", [("0,1", ["--gpus", '"device=0,1"']), ("", []), ("all", ["--gpus", "all"])])
def test_gpus_reach_docker_run_as_a_device_list(gpus, want, tmp_path):
    cfg = load_config({"WORKER": "root@198.51.100.13", "STATE_DIR": str(tmp_path), "GPUS": gpus})
    argv = vllm.docker_run_argv(cfg, cfg.nodes[1], WORKER, {"model_dir": "/m", "state_dir": "/s"},
                                master_addr=HEAD["ip"])
    at = argv.index("--gpus") if "--gpus" in argv else None
    assert (argv[at:at + 2] if at is not None else []) == want


def test_small_builders():
    assert c.docker_pull("img@sha256:" + "a" * 64) == ["docker", "pull", "img@sha256:" + "a" * 64]
    assert c.docker_image_id("x") == ["docker", "image", "inspect", "--format", "{{.Id}}", "x"]
    assert c.docker_rm("dsv41-r1") == ["docker", "rm", "-f", "dsv41-r1"]
    assert c.docker_stop("dsv41-r0") == ["docker", "stop", "-t", str(c.STOP_GRACE_S), "dsv41-r0"]
    assert c.systemctl("is-active", "dsv41-r1.service") == ["systemctl", "is-active", "dsv41-r1.service"]
    assert c.journalctl("dsv41-r0.service", lines=40) == [
        "journalctl", "-u", "dsv41-r0.service", "--no-pager", "-o", "cat", "-n", "40"]
    assert c.journalctl("u", follow=True)[-1] == "-f"


def test_the_lab_engine_profile_changes_only_what_it_lists(tmp_path):
    """conf/lab-vllm.toml: the Spark argv and environment, minus what vLLM's CPU build cannot take;
    nothing else differs (the fabric, rendezvous, --headless and the key handling stay)."""
    img = "198.51.100.11:5000/lab/vllm@sha256:" + "a" * 64
    spark = load_config({"WORKER": "u@h", "IMG": img})
    lab = load_config({"WORKER": "u@h", "IMG": img, "DSV41_PROFILE": "lab-vllm"})
    heads = {0: HEAD}
    for rank, fab in ((0, HEAD), (1, WORKER)):
        want = vllm.measured_args(spark, rank, heads)
        got = vllm.vllm_args(lab, rank, heads)
        dropped = {"--swa-block-size", "--engram-config", "--speculative-config", "--reasoning-parser"}
        assert not dropped & set(got)
        for flag, value in (("--dtype", "float32"), ("--kv-cache-dtype", "auto"), ("--max-model-len", "8192"),
                            ("--kv-cache-memory-bytes", "1073741824"), ("--tokenizer-mode", "auto")):
            assert got[got.index(flag) + 1] == value
        assert (got[got.index("--tool-call-parser") + 1] == "hermes") if rank == 0 else "--tool-call-parser" not in got
        same = [w for w in want if w.startswith("--") and w not in dropped]
        assert [w for w in got if w.startswith("--")] == same                # order and the rest unchanged
        for flag in ("--master-addr", "--master-port", "--node-rank", "--tensor-parallel-size", "--nnodes"):
            assert got[got.index(flag) + 1] == want[want.index(flag) + 1]
        env = dict(vllm.container_env(lab, fab, rank))
        spark_env = dict(vllm.container_env(spark, fab, rank))
        assert "VLLM_USE_V2_MODEL_RUNNER" not in env and "OMP_NUM_THREADS" not in env
        assert env["VLLM_CPU_OMP_THREADS_BIND"] == str(rank) and env["VLLM_NO_USAGE_STATS"] == "1"
        assert env["VLLM_USE_AOT_COMPILE"] == "0"                        # its warm compile cache loads
        assert {k: v for k, v in env.items() if k in spark_env} == {
            k: v for k, v in spark_env.items() if k not in ("VLLM_USE_V2_MODEL_RUNNER", "OMP_NUM_THREADS")}
    assert lab.engine_value("ENGINE_CMD") == ("/opt/vllm/bin/vllm", "serve") and lab.gpus == "" and not lab.privileged


def test_a_bad_engine_change_is_one_line(tmp_path, monkeypatch):
    from dsv41.settings import layers
    (tmp_path / "bad.toml").write_text('[args]\n"--dtype" = 3\n')
    monkeypatch.setattr(layers, "CONF_DIR", tmp_path)
    with pytest.raises(UserError, match=r'conf/bad.toml \[args\] --dtype = 3: expected a --flag = "value" or false'):
        load_config({"DSV41_PROFILE": "bad"})
