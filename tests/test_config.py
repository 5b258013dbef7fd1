"""One Config: defaults, profile, environment; every bad value is one line through `doit`."""
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from dsv41.settings.kinds import ConfigError
from dsv41.vllm import argv
from dsv41.vllm.settings import capture_sizes
from dsv41.settings.layers import load_config
from dsv41.settings.setting import number

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOIT = [sys.executable, "-m", "doit", "-f", os.path.join(ROOT, "dodo.py")]


def doit(args, tmp_path, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("WORKER", "WORKERS", "DSV41_PROFILE")}
    e.update(STATE_DIR=str(tmp_path / "state"), **env)
    return subprocess.run(DOIT + args, env=e, capture_output=True, text=True, cwd=ROOT)


def test_defaults_are_the_measured_configuration():
    cfg = load_config({})
    assert cfg.image.endswith("@sha256:5668e35e5ee021da4b9ce88a1964caf0e082e8ca01d81d1d64b6213a55c6add5")
    e = cfg.engine_settings()
    assert (e.kv_bytes, e.max_len, e.max_seqs, e.nspec, e.batch) == (2700000000, 262144, 2, 7, 2048)
    assert (e.gpu_util, e.graph_mode, cfg.port, cfg.mport) == (0.88, "FULL_DECODE_ONLY", 8000, 29655)
    assert cfg.memguard_gib == 1.0 and cfg.plan_name == "J268-ho-v31-K5n.json"
    assert cfg.served_model_name == "deepseek-v4.1-flash"
    assert argv.cap(e) == 16 and e.caps == (1, 2, 3, 4, 5, 6, 7, 8, 12, 16)
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
    assert cfg.tp_size == 4 and cfg.nnodes == 4 and cfg.engine_value("KV_BYTES") == 1000
    assert cfg.engine_value("EXTRA") == ("--foo", "a b")
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
    ({"SSH_OPTS": "127.0.0.1"}, "SSH_OPTS"),
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


SCATTERING = [("STATE_DIR", "/"), ("STATE_DIR", "~"), ("STATE_DIR", "$HOME/"), ("STATE_DIR", "/tmp/.."),
              ("MODEL_DIR", "~/"), ("API_KEY_FILE", "api_key"), ("METRICS_DIR", "//"), ("IMAGE_FILE", "image"),
              ("WORKER_MODEL_DIR", "$HOME"), ("R1_MODEL_DIR", "/"), ("R1_MODEL_DIR", "models")]


@pytest.mark.parametrize("var,value", SCATTERING, ids=[f"{k}={v}" for k, v in SCATTERING])
def test_a_path_that_would_scatter_state_is_refused_before_anything_is_written(var, value, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), var: value.replace("$HOME", str(home)), "WORKER": "u@w"}
    r = subprocess.run(DOIT + ["config"], env={**os.environ, "STATE_DIR": str(home / "state"), **env},
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith(f"dsv41: {var}=") and "is not valid: expected" in line, line
    assert "/ or the home directory itself" in line or "an absolute path" in line, line
    assert list(home.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["home"]


BAD_OPTIONS = [(["status", "--bogus"], "dsv41: status: option --bogus not recognized: `doit help status` lists"),
               (["top", "--interval", "abc"], "dsv41: top: Error parsing parameter 'interval'"),
               (["logs", "-n"], "dsv41: logs: option -n requires argument"),
               (["statsu"], 'dsv41: Invalid parameter: "statsu". Must be a command, task, or a target.')]


@pytest.mark.parametrize("args,says", BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_a_bad_task_option_is_bad_input_not_a_cluster_state(args, says, tmp_path):
    """doit returns 3 for these, which `doit status` means as NOT RUNNING."""
    r = doit(args, tmp_path)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith(says), line


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
    assert all(line.rstrip().endswith((".", ")")) for line in r.stdout.splitlines()), r.stdout  # whole sentences


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
    from dsv41.node.memguard import guard
    for value in ("0", "0.05", "-1", "2000", "abc"):
        with pytest.raises(ConfigError, match=r"MEMGUARD_GIB=.* expected the memory guard's floor in GiB, a number "
                                              r"from 0\.1 to 1024"):
            load_config({"MEMGUARD_GIB": value})
        with pytest.raises(guard.UserError):
            guard.parse_args(["--floor-gib", value], env={})
    for value in ("0.1", "1", "1024"):
        assert load_config({"MEMGUARD_GIB": value}).memguard_gib == float(value)
        assert guard.parse_args(["--floor-gib", value], env={}).floor == int(float(value) * guard.GIB)


HUGE = "99999999999999999999"
OUT_OF_RANGE = [("KV_BYTES", HUGE, "a whole number from 1 to 137438953472"),
                ("FREE_GIB_HEAD", HUGE, "a whole number from 0 to 65536"),
                ("FREE_GIB_WORKER", HUGE, "a whole number from 0 to 65536"),
                ("CAPS", HUGE, "a comma list of whole numbers from 1 to 8192"),
                ("PORT", "\u0663", "a whole number from 1 to 65535"),          # an Arabic-Indic three
                ("GPUS", "abc", "device numbers from 0 to 255"), ("GPUS", "-5", "device numbers"),
                ("GPUS", "nan", "device numbers"), ("GPUS", "0,,1", "device numbers"),
                ("GPUS", "256", "device numbers")]


@pytest.mark.parametrize("var,value,says", OUT_OF_RANGE, ids=[f"{k}={v}" for k, v, _ in OUT_OF_RANGE])
def test_every_number_has_a_range_and_says_it(var, value, says):
    from dsv41.settings import schema
    with pytest.raises(ConfigError, match=rf"^{var}='{value}' is not valid: expected .*{says}"):
        load_config({var: value})
    s = schema.BY_NAME[var]
    row = schema.docs_table().split(f"| `{var}` |")[1].split("\n")[0]
    assert f"{number(s.lo)} to {number(s.hi)}" in row


@pytest.mark.parametrize("var", ["SERVED_MODEL_NAME", "MEMLOCK", "HF_REPO", "PLAN_NAME", "WATCHDOG", "PRIVILEGED"])
def test_an_empty_value_that_means_nothing_is_one_line(var, tmp_path):
    r = doit(["config"], tmp_path, **{var: ""})
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith(f"dsv41: {var}='' is not valid: expected "), line
    assert not (tmp_path / "state").exists()


def test_an_empty_value_with_a_documented_meaning_is_kept():
    cfg = load_config({k: "" for k in ("GPUS", "EXTRA", "CAPS", "REVISION", "SSH_OPTS")})
    assert (cfg.gpus, cfg.engine_value("EXTRA"), cfg.revision, cfg.ssh_opts) == ("", (), "", ())
    e = cfg.engine_settings()
    assert e.caps == capture_sizes(e.max_seqs, e.nspec)


def test_gpus_is_all_none_or_a_device_list_as_docker_takes_it():
    assert [load_config({"GPUS": v}).gpus for v in ("all", "", "0", "1,0", "device=0,1", '"device=3"')] == [
        "all", "", "device=0", '"device=0,1"', '"device=0,1"', "device=3"]


def test_a_target_starting_with_a_dash_never_reaches_ssh():
    with pytest.raises(ConfigError, match=r"WORKER='-V' is not valid: .*do not start with '-'"):
        load_config({"WORKER": "-V"})


# ---- every malformed input is one line: profiles and settings, through `doit config` ---------------

@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A copy of the checkout whose conf/ the cases write their profiles into."""
    import shutil
    root = tmp_path_factory.mktemp("checkout")
    shutil.copytree(os.path.join(ROOT, "lib"), root / "lib", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(os.path.join(ROOT, "conf"), root / "conf")
    shutil.copy(os.path.join(ROOT, "dodo.py"), root / "dodo.py")
    return root


PIN = "r/x@sha256:" + "a" * 64      # a pinned image for the lab profile (its IMAGE_FILE exists only in the lab)
INPUTS = [   # (id, profile files {name: bytes}, environment, what the one line must say)
    ("overrides = 5", {"p": b"overrides = 5\n"}, {}, "conf/p.toml: overrides = 5 is not valid: expected a table"),
    ('args = "x"', {"p": b'args = "x"\n'}, {}, "conf/p.toml: args = 'x' is not valid: expected a table"),
    ("env = [1]", {"p": b"env = [1]\n"}, {}, "conf/p.toml: env = [1] is not valid: expected a table"),
    ("non-UTF-8", {"p": b'extra = "\xff\xfe"\n'}, {}, "is not UTF-8 text (byte 0xff"),
    ("unknown override R1_IPP", {"p": b'[overrides]\nR1_IPP = "10.0.0.2"\n'}, {},
     "[overrides]: unknown variable 'R1_IPP' (did you mean R1_IP?)"),
    ("override LD_PRELOAD", {"p": b'[overrides]\nLD_PRELOAD = "/x.so"\n'}, {}, "unknown variable 'LD_PRELOAD'"),
    ("bad override value", {"p": b'[overrides]\nR0_IP = "10.0.0"\n'}, {}, "[overrides] R0_IP = '10.0.0' is not valid"),
    ("worker = 5", {"p": b"worker = 5\n"}, {}, "conf/p.toml worker = 5 is not valid: expected a string"),
    ("extra = 5", {"p": b"extra = 5\n"}, {}, "conf/p.toml extra = 5 is not valid: expected a string"),
    ("port = true", {"p": b"port = true\n"}, {}, "conf/p.toml port = True is not valid: expected a whole number"),
    ('skip_checks = ["a"]', {"p": b'skip_checks = ["a"]\n'}, {}, "conf/p.toml skip_checks = ['a'] is not valid"),
    ("skip_checks unknown", {"p": b'skip_checks = "rdma,nosuch"\n'}, {}, "unknown name 'nosuch'"),
    ("unknown top-level key", {"p": b"kv_byte = 5\n"}, {}, "unknown setting 'kv_byte' (did you mean kv_bytes?)"),
    ("secret in a profile", {"p": b'hf_token = "hf_x"\n'}, {}, "hf_token may be set only in the environment"),
    ("empty file", {"p": b""}, {}, "conf/p.toml is empty"),
    ("missing base", {"p": b'base = "nope"\nport = 8001\n'}, {}, "conf/p.toml base = 'nope' is not valid: expected one of"),
    ("base cycle", {"p": b'base = "q"\nport = 8001\n', "q": b'base = "p"\nport = 8002\n'}, {},
     "its `base` chain comes back to itself (p -> q -> p)"),
    ("not TOML", {"p": b"port = \n"}, {}, "conf/p.toml is not valid TOML"),
    ("api key flag in [args]", {"p": b'[args]\n"--api-key" = "k"\n'}, {}, "a secret never goes into a unit file"),
    ("api key in [env]", {"p": b'[env]\nVLLM_API_KEY = "k"\n'}, {}, "a secret never goes into a unit file"),
    ("profile WORKER and WORKERS", {"p": b'worker = "u@a"\nworkers = "u@b,u@c"\n'}, {},
     "WORKER and WORKERS are both set in the profile p"),
    ("TP_SIZE=3 with two nodes", {}, {"WORKER": "u@w", "TP_SIZE": "3"}, "TP_SIZE=3 with 2 node(s): expected a multiple of 2"),
    ("NNODES=3 with two nodes", {}, {"WORKER": "u@w", "NNODES": "3"}, "NNODES=3 with 2 node(s)"),
    ("WORKER and WORKERS", {}, {"WORKER": "u@a", "WORKERS": "u@b,u@c"}, "WORKER and WORKERS are both set in the environment"),
    ("SKIP_CHECKS=nosuch", {}, {"SKIP_CHECKS": "nosuch"}, "SKIP_CHECKS: unknown name 'nosuch'"),
    ("100,000-character WORKER", {}, {"WORKER": "u@" + "w" * 100_000}, "(100002 characters)' is not valid: expected at most 4096"),
    ("long ssh target", {}, {"WORKER": "u@" + "w" * 300}, "an ssh target of at most 255 characters"),
    ("EXTRA --api-key", {}, {"EXTRA": "--api-key sk-123"}, "EXTRA carries --api-key: a secret never goes into a unit file"),
    ("EXTRA --api-key=", {}, {"EXTRA": "--max-num-seqs 2 --api-key=sk-123"}, "EXTRA carries --api-key"),
    ("profile name", {}, {"DSV41_PROFILE": "../etc"}, "DSV41_PROFILE='../etc' is not valid"),
    ("profile value the environment overrides", {"p": b"port = 99999\n"}, {"PORT": "8001"},
     "conf/p.toml port = '99999' is not valid: expected a whole number from 1 to 65535"),
    ("base profile value overridden", {"p": b'base = "q"\nplan_name = "x.json"\n', "q": b'plan_name = "x y"\n'}, {},
     "conf/q.toml plan_name = 'x y' is not valid"),
    ("profile worker the environment overrides", {"p": b'worker = "-V"\n'}, {"WORKER": "u@w"},
     "conf/p.toml worker = '-V' is not valid"),
    ("HEAD_IP beside R0_IP", {}, {"R0_IP": "10.0.0.1", "HEAD_IP": "10.0.0"}, "HEAD_IP='10.0.0' is not valid"),
]


@pytest.mark.parametrize("profiles,env,says", [c[1:] for c in INPUTS], ids=[c[0] for c in INPUTS])
def test_every_bad_input_is_one_line(profiles, env, says, checkout, tmp_path):
    for name, data in profiles.items():
        (checkout / "conf" / f"{name}.toml").write_bytes(data)
    try:
        e = {**os.environ, "STATE_DIR": str(tmp_path / "state"), **env}
        if profiles:
            e["DSV41_PROFILE"] = "p"
        r = subprocess.run([sys.executable, "-m", "doit", "-f", str(checkout / "dodo.py"), "config"], env=e,
                           capture_output=True, text=True, cwd=checkout)
    finally:
        for name in profiles:
            (checkout / "conf" / f"{name}.toml").unlink()
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert "Traceback" not in r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith("dsv41: ") and says in line, line
    assert "sk-123" not in line and len(line) < 700
    assert not (tmp_path / "state").exists()


def test_an_override_in_the_environment_is_not_a_conflict():
    """A profile's worker overridden by WORKERS in the environment is a normal override, and the
    environment's WORKER wins over a profile's workers."""
    cfg = load_config({"DSV41_PROFILE": "lab", "IMG": PIN, "WORKERS": "u@a,u@b"})
    assert [n.target for n in cfg.workers] == ["u@a", "u@b"] and cfg.sources["workers"] == "environment"
    cfg = load_config({"DSV41_PROFILE": "lab", "IMG": PIN, "WORKER": "u@z"})
    assert [n.target for n in cfg.workers] == ["u@z"]
    assert load_config({"WORKERS": "u@a,u@b", "TP_SIZE": "6"}).tp_size == 6


def test_doit_config_names_the_profile_a_worker_came_from(tmp_path):
    r = doit(["config"], tmp_path, DSV41_PROFILE="lab", IMG=PIN)
    rows = {line.split()[0]: line for line in r.stdout.splitlines()}
    assert "(profile lab)" in rows["WORKER"] and "(profile lab)" in rows["r1.target"], r.stdout
    assert "(profile lab (R1_IP))" in rows["r1.ip"] and "(environment)" in rows["IMG"]
    r = doit(["config", "PORT", "r1.ip"], tmp_path, DSV41_PROFILE="lab", IMG=PIN, PORT="8001")
    assert r.stdout.split() == ["PORT", "8001", "(environment)", "r1.ip", "198.51.100.13", "(profile", "lab", "(R1_IP))"]


def test_the_settings_page_holds_exactly_the_schemas_table():
    """docs/settings.md's table is made from the schema (`python -m dsv41.settings.schema` prints it): the
    page holds that table whole and no other row, every setting with its type and accepted values."""
    from dsv41.settings import schema
    page = open(os.path.join(ROOT, "docs", "settings.md")).read().splitlines()
    start = page.index("| name | type | range or choices | default | where | meaning |")
    end = next((i for i in range(start, len(page)) if not page[i].startswith("|")), len(page))
    assert "\n".join(page[start:end]) == schema.docs_table(), "run: python -m dsv41.settings.schema"
    assert sum(line.startswith("| name | type |") for line in page) == 1
    rows = {line.split(" | ")[0][3:-1]: line.split(" | ") for line in page[start + 2:end]}
    for s in schema.SETTINGS:
        assert rows[s.name][1] == schema.KIND_TYPES[s.kind] and rows[s.name][2], s.name
    assert rows["PORT"][2] == "1 to 65535" and rows["MEMGUARD_MODE"][2] == "`enforce`, `observe`"


def test_the_watchdog_settings_are_the_resolved_config_without_secrets(tmp_path):
    import dataclasses
    import json

    from dsv41.settings.resolved import from_resolved, resolved
    cfg = load_config({"DSV41_PROFILE": "lab-vllm", "IMG": PIN, "HF_TOKEN": "hf_secret", "PORT": "8001"})
    text = json.dumps(resolved(cfg))
    assert "hf_secret" not in text
    again = from_resolved(json.loads(text))
    assert again == dataclasses.replace(cfg, hf_token="") and again.port == 8001
    assert again.engine_args == cfg.engine_args and again.nodes == cfg.nodes and again.hf_token == ""
    older = from_resolved({k: v for k, v in json.loads(text).items() if k not in ("port", "kv_bytes")})
    assert older.port == 8000 and older.engine_value("KV_BYTES") == 2700000000, "missing: the default"
    with pytest.raises(ConfigError, match="^the resolved settings hold 'bogus', which this version does not know"):
        from_resolved({**json.loads(text), "bogus": 1})


def test_a_record_written_by_an_older_version_is_read_as_it_was_written():
    """tests/records/watchdog-e8d141c.json is the watchdog.json of an earlier version (lab-vllm, PORT=8001,
    WATCHDOG_WINDOW_MIN=7, R1_GID_INDEX=2): read back, it is what that version resolved; the settings
    declared since take their defaults."""
    import json

    from dsv41.settings.resolved import from_resolved
    with open(os.path.join(ROOT, "tests", "records", "watchdog-e8d141c.json")) as f:
        cfg = from_resolved(json.load(f)["config"])
    assert (cfg.port, cfg.watchdog_window_s, cfg.nodes[1].gid_index, cfg.profile) == (8001, 420, 2, "lab-vllm")
    assert cfg.engine_value("KV_BYTES") == 1073741824 and cfg.engine_args and cfg.hf_token == ""
    assert cfg.hf_endpoint == "" and cfg.dsv41_base_url == ""      # declared after that record was written


def test_a_setting_is_declared_in_one_place(tmp_path, capsys):
    """One S(...) makes the setting: checked, in `doit config`, in docs/settings.md's table, a field of
    Config (its derived value declared with it) and in the resolved settings."""
    from dsv41.head import config as head_config
    from dsv41.settings import schema
    from dsv41.settings.resolved import from_resolved, resolved
    own = schema.OWN + (schema.S("NAP_MIN", "int", 2, "a nap", lo=1, hi=9, field="nap_s", to=schema.seconds),)
    cfg = load_config({"NAP_MIN": "3"}, own=own)
    assert cfg.nap_s == 180 and cfg.values["NAP_MIN"] == 3
    head_config.show(cfg, setting=("nap_min",))
    assert capsys.readouterr().out.split() == ["NAP_MIN", "3", "(environment)"]
    assert "| `NAP_MIN` | integer | 1 to 9 | 2 | environment, profile | a nap |" in schema.docs_table(own=own)
    assert resolved(cfg, own)["nap_s"] == 180 and from_resolved(resolved(cfg, own), own=own).nap_s == 180
    assert from_resolved(resolved(load_config({})), own=own).nap_s == 120, "an older record: the default"
    with pytest.raises(ConfigError, match="^NAP_MIN='0' is not valid: expected a whole number from 1 to 9$"):
        load_config({"NAP_MIN": "0"}, own=own)


# what a new user may type: each refused with one line naming the setting, what is wrong and what to write
HOSTILE = [
    ({"SSH_OPTS": "127.0.0.1"}, "SSH_OPTS='127.0.0.1' is not valid: expected ssh options, each word an option or the "
                                "value of the one before ('127.0.0.1' would be ssh's destination), e.g. -p 2222"),
    ({"SSH_OPTS": "-p 2222 -o"}, "SSH_OPTS='-p 2222 -o' is not valid: expected ssh options, each with its value "
                                 "(-o has none)"),
    ({"SSH_OPTS": "-Z"}, "SSH_OPTS='-Z' is not valid: expected ssh options ('-Z': ssh has no option -Z)"),
    ({"MEMLOCK": "\u0661\u0662"}, "MEMLOCK='\u0661\u0662' is not valid: expected -1 (unlimited) or a byte count"),
    ({"PORT": "\u0661\u0662"}, "PORT='\u0661\u0662' is not valid: expected a whole number from 1 to 65535"),
    ({"PORT": "1_"}, "PORT='1_' is not valid: expected a whole number from 1 to 65535"),
    ({"PORT": "1__0"}, "PORT='1__0' is not valid: expected a whole number from 1 to 65535"),
    ({"GPU_UTIL": "0_5"}, "GPU_UTIL='0_5' is not valid: expected a number more than 0 and at most 1"),
    ({"CAPS": "1,\u0662"}, "CAPS='1,\u0662' is not valid: expected a comma list of whole numbers from 1 to 8192"),
    ({"MEMGUARD_GIB": "\u0661"}, "MEMGUARD_GIB='\u0661' is not valid: expected the memory guard's floor in GiB"),
    ({"ALERT_SMTP_SMARTHOST": "mail.example.org:99999"}, "ALERT_SMTP_SMARTHOST='mail.example.org:99999' is not "
                                                         "valid: expected host:port with a port from 1 to 65535"),
    ({"HF_REPO": "../x"}, "HF_REPO='../x' is not valid: expected a Hugging Face repo id, owner/name"),
    ({"HF_REPO": "a/.."}, "HF_REPO='a/..' is not valid: expected a Hugging Face repo id, owner/name"),
    ({"REVISION": "../x"}, "REVISION='../x' is not valid: expected a commit hash, branch or tag (no ..)"),
]


@pytest.mark.parametrize("env,line", HOSTILE, ids=[str(e) for e, _ in HOSTILE])
def test_a_hostile_value_is_refused_in_one_line(env, line):
    with pytest.raises(ConfigError) as err:
        load_config(env)
    assert str(err.value).startswith(line) and "\n" not in str(err.value) and err.value.exit_code == 2


def test_what_a_hostile_value_looks_like_is_still_taken():
    cfg = load_config({"SSH_OPTS": "-vvp 2222 -o A=b -oX=y -F '/a b' -4 -p2200", "PORT": "8_001",
                       "ALERT_SMTP_SMARTHOST": "mail.example.org:65535", "HF_REPO": "a_b/c.d-e_", "MEMLOCK": "64:128",
                       "GPU_UTIL": ".5", "REVISION": "v1.2/x"})
    assert cfg.ssh_opts == ("-vvp", "2222", "-o", "A=b", "-oX=y", "-F", "/a b", "-4", "-p2200") and cfg.port == 8001
    assert (cfg.alert_smtp_smarthost, cfg.hf_repo, cfg.memlock) == ("mail.example.org:65535", "a_b/c.d-e_", "64:128")


@pytest.mark.parametrize("entry,line", [
    ('"--port" = "9000"', 'conf/flags.toml [args] --port = "9000" contradicts PORT=8000: remove it from [args] and '
                          'set PORT (`port` in a profile) instead'),
    ('"--port" = false', "conf/flags.toml [args] --port = false contradicts PORT=8000"),
    ('"--served-model-name" = "other"', 'conf/flags.toml [args] --served-model-name = "other" contradicts '
                                        'SERVED_MODEL_NAME=deepseek-v4.1-flash'),
])
def test_a_profile_flag_that_contradicts_its_setting_is_refused(entry, line, tmp_path, monkeypatch):
    from dsv41.settings import layers
    (tmp_path / "flags.toml").write_text(f"[args]\n{entry}\n")
    monkeypatch.setattr(layers, "CONF_DIR", tmp_path)
    with pytest.raises(ConfigError) as err:
        load_config({"DSV41_PROFILE": "flags"})
    assert str(err.value).startswith(line) and "\n" not in str(err.value) and err.value.exit_code == 2
    (tmp_path / "same.toml").write_text('port = 9000\n[args]\n"--port" = "9000"\n')
    assert load_config({"DSV41_PROFILE": "same"}).port == 9000          # the same value contradicts nothing


def test_the_endpoints_read_from_the_environment_are_settings(monkeypatch):
    """HF_ENDPOINT (doit download) and DSV41_BASE_URL (doit pi) are checked and reach the code through
    Config, like every other setting."""
    from dsv41.head import pi
    cfg = load_config({"HF_ENDPOINT": "http://127.0.0.1:9", "DSV41_BASE_URL": "http://head:8001/v1"})
    assert (cfg.hf_endpoint, cfg.dsv41_base_url) == ("http://127.0.0.1:9", "http://head:8001/v1")
    ran = []
    monkeypatch.setattr(pi.subprocess, "run", lambda argv, env: ran.append(argv) or SimpleNamespace(returncode=0))
    assert pi.install(cfg) and ran[0][-1] == "http://head:8001/v1"
    assert pi.install(load_config({})) and ran[1][-1] == "http://127.0.0.1:8000/v1"
    with pytest.raises(ConfigError, match=r"^HF_ENDPOINT='127.0.0.1:9' is not valid: expected an http:// or https://"):
        load_config({"HF_ENDPOINT": "127.0.0.1:9"})


def test_the_configs_fields_carry_the_types_of_their_values():
    """Config's fields are typed (the package ships py.typed): each field's declared type holds its value at
    the defaults and under a profile and the environment."""
    import dataclasses
    from dsv41.settings.config import Config
    cfg = load_config({"WORKER": "u@10.0.0.2", "NCCL_IB_GID_INDEX": "3", "ALERT_EMAIL_TO": "a@b.c",
                       "ALERT_SMTP_SMARTHOST": "mail.example:25", "ALERT_EMAIL_FROM": "d@b.c"})
    types = {f.name: f.type for f in dataclasses.fields(Config)}
    assert object not in types.values() and types["nccl_ib_gid_index"] == int | None and types["port"] is int
    for default in (load_config({"WORKER": "u@10.0.0.2"}), cfg):
        assert [name for name, t in types.items() if not isinstance(getattr(default, name), t)] == []
