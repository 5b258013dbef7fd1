"""One Config: defaults, profile, environment; every bad value is one line through `doit`."""
import os
import subprocess
import sys

import pytest

from dsv41.head.config import ConfigError, capture_sizes, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOIT = [sys.executable, "-m", "doit", "-f", os.path.join(ROOT, "dodo.py")]


def doit(args, tmp_path, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("WORKER", "WORKERS", "DSV41_PROFILE")}
    e.update(STATE_DIR=str(tmp_path / "state"), **env)
    return subprocess.run(DOIT + args, env=e, capture_output=True, text=True, cwd=ROOT)


def test_defaults_are_the_measured_configuration():
    cfg = load_config({})
    assert cfg.image.endswith("@sha256:5668e35e5ee021da4b9ce88a1964caf0e082e8ca01d81d1d64b6213a55c6add5")
    assert (cfg.kv_bytes, cfg.max_len, cfg.max_seqs, cfg.nspec, cfg.batch) == (2700000000, 262144, 2, 7, 2048)
    assert (cfg.gpu_util, cfg.graph_mode, cfg.port, cfg.mport) == (0.88, "FULL_DECODE_ONLY", 8000, 29655)
    assert cfg.memguard_gib == 1.0 and cfg.plan_name == "J268-ho-v31-K5n.json"
    assert cfg.served_model_name == "deepseek-v4.1-flash"
    assert cfg.cap == 16 and cfg.caps == (1, 2, 3, 4, 5, 6, 7, 8, 12, 16)
    assert cfg.model_dir == os.path.expanduser("~/models/DeepSeek-V4.1-Flash-Spark")
    assert cfg.api_key_file == os.path.expanduser("~/.dsv41-two-sparks/api_key")


def test_capture_sizes_follow_the_rule():
    assert capture_sizes(2, 7) == (1, 2, 3, 4, 5, 6, 7, 8, 12, 16)
    assert capture_sizes(1, 3) == (1, 2, 3, 4)
    assert capture_sizes(4, 3) == (1, 2, 3, 4, 8, 12, 16)


def test_environment_overrides_and_node_count():
    cfg = load_config({"WORKERS": "u@10.0.0.2,u@10.0.0.3,u@10.0.0.4", "KV_BYTES": "1000",
                       "EXTRA": "--foo 'a b'", "R3_IP": "10.0.0.4", "WORKER_IFNAME": "enp1s0f1np1"})
    assert [n.rank for n in cfg.nodes] == [0, 1, 2, 3]
    assert cfg.tp_size == 4 and cfg.nnodes == 4 and cfg.kv_bytes == 1000
    assert cfg.extra == ("--foo", "a b")
    assert cfg.nodes[3].ip == "10.0.0.4" and cfg.nodes[1].ifname == "enp1s0f1np1"
    assert cfg.sources["kv_bytes"] == "environment"


def test_worker_model_dir_swaps_home():
    cfg = load_config({"WORKER": "bob@w", "MODEL_DIR": os.path.expanduser("~/m/x y")})
    assert cfg.model_dir_on(cfg.nodes[1], "/home/bob") == "/home/bob/m/x y"
    cfg = load_config({"WORKER": "bob@w", "WORKER_MODEL_DIR": "/data/m"})
    assert cfg.model_dir_on(cfg.nodes[1], "/home/bob") == "/data/m"
    assert cfg.state_dir_on(cfg.nodes[1], "/home/bob") == "/home/bob/.dsv41-two-sparks"


def test_lab_profile_is_read_over_defaults():
    cfg = load_config({"DSV41_PROFILE": "lab", "IMG": "198.51.100.11:5000/lab/engine@sha256:" + "a" * 64})
    assert cfg.profile == "lab" and cfg.workers and cfg.sources["worker"] == "profile lab"


def test_worker_required_only_when_needed():
    cfg = load_config({"WORKER": ""})
    with pytest.raises(ConfigError, match="WORKER is empty"):
        cfg.require_workers()


BAD = [
    ({"PORT": "99999"}, "PORT"),
    ({"PORT": "http"}, "PORT"),
    ({"KV_BYTES": "abc"}, "KV_BYTES"),
    ({"MAX_SEQS": "0"}, "MAX_SEQS"),
    ({"GPU_UTIL": "1.5"}, "GPU_UTIL"),
    ({"GPU_UTIL": "0"}, "GPU_UTIL"),
    ({"IMG": "ghcr.io/0xsero/deepseek-v4.1-flash-spark:latest"}, "IMG"),
    ({"GRAPH_MODE": "FAST"}, "GRAPH_MODE"),
    ({"MPORT": "8000"}, "MPORT"),
    ({"MEMGUARD_GIB": "-1"}, "MEMGUARD_GIB"),
    ({"MEMGUARD_GIB": "0"}, "MEMGUARD_GIB"),
    ({"MEMGUARD_MODE": "kill"}, "MEMGUARD_MODE"),
    ({"WORKER": "-V"}, "WORKER"),
    ({"WORKER": "root@-oProxyCommand=x"}, "WORKER"),
    ({"WORKERS": "u@a,-V"}, "WORKERS"),
    ({"SSH_TIMEOUT_S": "0"}, "SSH_TIMEOUT_S"),
    ({"NSPEC": "x"}, "NSPEC"),
    ({"CAPS": "1,two"}, "CAPS"),
    ({"EXTRA": "--x 'unbalanced"}, "EXTRA"),
    ({"MODEL_DIR": "relative/path"}, "MODEL_DIR"),
    ({"WORKER": "user@host name"}, "WORKER"),
    ({"WORKERS": "a@b,a@b"}, "WORKERS"),
    ({"HEAD_IP": "10.10.10"}, "HEAD_IP"),
    ({"WORKER": "u@w", "WORKER_HCAS": "mlx5_0;rm"}, "WORKER_HCAS"),
    ({"R7_IP": "10.0.0.7"}, "R7_IP"),
    ({"KEEP_PARTS": "maybe"}, "KEEP_PARTS"),
    ({"DSV41_PROFILE": "nope"}, "DSV41_PROFILE"),
]


@pytest.mark.parametrize("env,var", BAD, ids=[v for _, v in BAD])
def test_bad_value_is_one_line_naming_the_variable(env, var, tmp_path):
    r = doit(["config"], tmp_path, **env)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("dsv41: ") and var in lines[0]
    assert "Traceback" not in r.stderr + r.stdout
    assert not (tmp_path / "state").exists()  # nothing touched


def test_empty_worker_when_launch_needs_one(tmp_path):
    r = doit(["copy"], tmp_path, WORKER="")
    assert r.returncode != 0 and "WORKER is empty" in r.stderr and "Traceback" not in r.stderr


def test_doit_config_shows_values_and_sources(tmp_path):
    r = doit(["config"], tmp_path, KV_BYTES="2700000000", PORT="8001")
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines()}
    assert "2700000000" in rows["KV_BYTES"] and "(environment)" in rows["KV_BYTES"]
    assert "@sha256:5668e35e5ee021da4b9ce88a1964caf0e082e8ca01d81d1d64b6213a55c6add5" in rows["IMG"]
    assert "(default)" in rows["IMG"] and "8001" in rows["PORT"]


def test_doit_list_reads_like_a_command_reference(tmp_path):
    r = doit(["list"], tmp_path)
    names = {line.split()[0] for line in r.stdout.splitlines()}
    assert {"launch", "download", "verify", "copy", "status", "logs", "stop", "smoke", "bench",
            "pi", "preflight", "plan", "config", "clear-trip"} <= names
    assert all(len(line.split(None, 1)) == 2 for line in r.stdout.splitlines())


def test_hf_token_is_never_shown(tmp_path):
    r = doit(["config"], tmp_path, HF_TOKEN="hf_secret_value")
    assert "hf_secret_value" not in r.stdout + r.stderr and "(set)" in r.stdout


def test_second_concurrent_run_fails_at_once(tmp_path):
    from dsv41.head.core import runlock
    state = tmp_path / "state"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys,time; sys.path.insert(0, %r);"
         "from dsv41.head.core import runlock; runlock.take(%r); print('held', flush=True);"
         "time.sleep(30)" % (os.path.join(ROOT, "lib"), str(state))],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert runlock.holder(str(state)).startswith(f"pid {holder.pid}: ")
        r = doit(["clear-trip"], tmp_path)
        assert r.returncode != 0
        assert "another doit run holds" in r.stderr and f"pid {holder.pid}" in r.stderr
        assert "Traceback" not in r.stderr
    finally:
        holder.kill()
        holder.wait()
    assert runlock.holder(str(state)) is None


def test_the_guard_floor_has_one_rule():
    """Config and the guard accept and reject the same floors, and say the range."""
    from dsv41.node import memguard
    for value in ("0", "0.05", "-1", "2000", "abc"):
        with pytest.raises(ConfigError, match=r"MEMGUARD_GIB=.* expected the memory guard's floor in GiB, a number "
                                              r"from 0\.1 to 1024"):
            load_config({"MEMGUARD_GIB": value})
        with pytest.raises(memguard.UserError):
            memguard.parse_args(["--floor-gib", value], env={})
    for value in ("0.1", "1", "1024"):
        assert load_config({"MEMGUARD_GIB": value}).memguard_gib == float(value)
        assert memguard.parse_args(["--floor-gib", value], env={}).floor == int(float(value) * memguard.GIB)


def test_a_target_starting_with_a_dash_never_reaches_ssh():
    with pytest.raises(ConfigError, match=r"WORKER='-V' is not valid: .*do not start with '-'"):
        load_config({"WORKER": "-V"})
