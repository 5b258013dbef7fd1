"""units.py and units/*.j2: rendered units read back with systemd's own rules and compared with
spec/serving-config.md (tables in test_commands.py), checked by systemd-analyze verify, and the
container command handed to the real docker CLI."""
import json
import os
import re
import shutil
import socketserver
import subprocess
import sys
import threading
import http.server
from pathlib import Path

import pytest

from dsv41 import names
from dsv41.head.core import commands, units
from dsv41.vllm import argv as vllm
from dsv41.vllm.recipe import Vllm
from dsv41.settings.layers import load_config
from dsv41.errors import UserError
from test_commands import HEAD, WORKER, rank_env, spec_args, spec_env, values_for

KEY = "sk-dsv41-never-in-a-unit-7f3a9c"
IMAGE_KEY = "5668e35e5ee0"        # the default image's digest, first 12 hex: its caches' folder
CACHE_DIRS = ("vllm", "torchinductor", "triton", "flashinfer", "tilelang", "cutedsl", "deep_gemm", "b12x", "b12x-roce")
TWO = {"WORKER": "root@198.51.100.13"}
FOUR = {"WORKERS": "root@198.51.100.12,root@198.51.100.13,root@198.51.100.14"}
FABRICS = {0: HEAD, 1: WORKER,
           2: {"ip": "198.51.100.12", "ifname": "eth9", "hcas": ("mlx5_0",), "gid_index": 5},
           3: {"ip": "198.51.100.14", "ifname": "eth8", "hcas": ("mlx5_1", "mlx5_2"), "gid_index": 3}}


# ---- systemd's rules, implemented here from systemd.service(5) "Command lines" and
# systemd.syntax(7) "Quoting" (independently of units.py), and checked against systemd below ----------

_ESC = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
        "\\": "\\", '"': '"', "'": "'", "s": " "}


def sd_settings(text):
    """[(section, key, value)]: comments skipped, an unescaped trailing backslash joins the next line
    (comment lines inside a continuation are dropped)."""
    out, section, cont = [], None, None
    for raw in text.split("\n"):
        stripped = raw.strip()
        if stripped[:1] in ("#", ";"):
            continue
        if cont is None and not stripped:
            continue
        line = stripped if cont is None else cont + stripped
        escaped = False
        for ch in line:
            escaped = not escaped and ch == "\\"
        if escaped:
            cont = line[:-1] + " "
            continue
        cont = None
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, value = line.split("=", 1)
        out.append((section, key.strip(), value.strip()))
    return out


def sd_words(s):
    """Split and unquote: quotes may wrap (parts of) words; C escapes inside and outside quotes."""
    words, i, n = [], 0, len(s)
    while True:
        while i < n and s[i] in " \t\n\r":
            i += 1
        if i >= n:
            return words
        if s[i] == "\\" and s[i + 1:i + 2] == ";" and (i + 2 == n or s[i + 2] in " \t"):
            words.append(";")
            i += 2
            continue
        if s[i] == ";" and (i + 1 == n or s[i + 1] in " \t"):
            raise ValueError("a second command (lone ;) where one was meant")
        cur, quote = [], None
        while i < n:
            ch = s[i]
            if quote is None and ch in " \t\n\r":
                break
            if ch == quote:
                quote, i = None, i + 1
            elif quote is None and ch in "'\"":
                quote, i = ch, i + 1
            elif ch == "\\":
                nxt = s[i + 1:i + 2]
                if nxt == "x":
                    cur.append(chr(int(s[i + 2:i + 4], 16)))
                    i += 4
                elif nxt in _ESC:
                    cur.append(_ESC[nxt])
                    i += 2
                else:
                    raise ValueError(f"unknown escape \\{nxt} (systemd warns)")
            else:
                cur.append(ch)
                i += 1
        if quote:
            raise ValueError("unbalanced quoting")
        words.append("".join(cur))


def sd_specifiers(word):
    """%% is %; any other specifier would be replaced by a value (none is meant here)."""
    if re.search(r"%[^%]", word.replace("%%", "")) or word.replace("%%", "").endswith("%"):
        raise ValueError(f"specifier in {word!r}")
    return word.replace("%%", "%")


def sd_dollars(word):
    """$$ is $; ${X} anywhere and $X as a whole word would be replaced by a variable (none is meant)."""
    if re.fullmatch(r"\$[A-Za-z_]\w*", word) or re.search(r"(?<!\$)(\$\$)*\$\{", word):
        raise ValueError(f"variable in {word!r}")
    return word.replace("$$", "$")


def sd_exec(value):
    """(prefixes, argv) of an Exec*= value, as the process will receive it."""
    prefixes = re.match(r"^[-@:+!]*", value).group(0)
    words = [sd_specifiers(w) for w in sd_words(value[len(prefixes):])]
    return prefixes, [words[0]] + [sd_dollars(w) for w in words[1:]]


def settings(text, section=None):
    return [(k, v) for s, k, v in sd_settings(text) if section in (None, s)]


def one(text, key):
    vals = [v for k, v in settings(text) if k == key]
    assert len(vals) == 1, f"{key}: {vals}"
    return vals[0]


def execs(text, key):
    return [sd_exec(v) for k, v in settings(text) if k == key]


def container(text):
    """(docker options argv, {env}, env order, image, vLLM args) from the unit's ExecStart; the
    entrypoint's own words between the image and vLLM's first argument (/model) are left out."""
    [(prefix, argv)] = execs(text, "ExecStart")
    assert prefix == ""
    opts, env, order, i = [], {}, [], 2
    while argv[i].startswith("-"):
        if argv[i] == "-e":
            k, v = argv[i + 1].split("=", 1)
            env[k] = v
            order.append((k, v))
            i += 2
        elif argv[i] in ("--rm", "--init", "--privileged"):
            opts.append(argv[i])
            i += 1
        else:
            opts += argv[i:i + 2]
            i += 2
    rest = argv[i + 1:]
    return argv[:2], opts, env, order, argv[i], rest[rest.index("/model"):]


def entrypoint(text):
    """(--entrypoint value, the words between the image and /model) from the unit's ExecStart."""
    [(_, argv)] = execs(text, "ExecStart")
    _, opts, _, _, image, _ = container(text)
    rest = argv[argv.index(image) + 1:]
    return opts[opts.index("--entrypoint") + 1], rest[:rest.index("/model")]


# ---- the rules, and systemd agreeing with them ----------------------------------------------------

def test_systemd_rules_as_documented():
    unit = ("[Service]\nExecStart=/bin/echo \"a b\" 'c\"d' \"x\\\\y\" 50%% $$HOME a\"b c\"d \\; \\\n"
            "# a comment inside a continuation is dropped\n   last\n")
    assert execs(unit, "ExecStart") == [
        ("", ["/bin/echo", "a b", 'c"d', "x\\y", "50%", "$HOME", "ab cd", ";", "last"])]
    with pytest.raises(ValueError):
        sd_exec('/bin/echo "open')
    with pytest.raises(ValueError):
        sd_exec("/bin/echo $HOME")                # a variable: the argument would change
    with pytest.raises(ValueError):
        sd_exec("/bin/echo 100%")                 # a specifier


TRICKY = ["my models", "it's", 'say "hi"', "100%", "back\\slash", "semi;colon", "#hash", "tab\there",
          "ünïcode", "a'b\"c", "x%%y", "$$", "${HOME}"]


@pytest.mark.parametrize("word", TRICKY)
def test_exec_arg_round_trips(word):
    assert sd_exec("/bin/echo " + units.exec_arg(word)) == ("", ["/bin/echo", word])


@pytest.fixture(scope="session")
def analyze():
    exe = shutil.which("systemd-analyze")
    if not exe:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    return exe


@pytest.mark.parametrize("word", [w for w in TRICKY if "$" not in w and "\t" not in w])
def test_systemd_parses_quoted_words_like_the_rules(analyze, tmp_path, word):
    # systemd names the executable it parsed when it cannot run it: a real check of the quoting.
    path = f"/nonexistent-dsv41/{word}"
    unit = tmp_path / "probe.service"
    unit.write_text(f"[Service]\nExecStart={units.exec_arg(path)} arg\n")
    r = subprocess.run([analyze, "verify", "--man=no", str(unit)], capture_output=True, text=True)
    m = re.search(r"(?:special characters: |Command )(.*?)(?: is not executable|\n|$)", r.stderr)
    assert m, r.stderr
    assert m.group(1) == path == sd_exec(units.exec_arg(path))[1][0]


# ---- rendering ------------------------------------------------------------------------------------

def node_paths(root, rank):
    return {"model_dir": f"{root}/node{rank}/my models/it's \"DSv4.1\" 100% $HOME ${{USER}}",
            "state_dir": f"{root}/node{rank}/state dir 5%", "python": "/usr/bin/python3",
            "pythonpath": f"{root}/node{rank}/state dir 5%/lib"}


def render_all(env, root, fabrics=FABRICS):
    cfg = load_config(dict(env, STATE_DIR=f"{root}/node0/state dir 5%"))
    return cfg, {s.rank: units.render_units(cfg, Vllm(cfg), s, {0: fabrics[0], s.rank: fabrics[s.rank]},
                                            node_paths(root, s.rank)) for s in cfg.nodes}


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    root = tmp_path_factory.mktemp("two")
    return render_all(TWO, root) + (root,)


def test_one_memguard_and_one_rank_unit_per_node_and_the_watchdog_and_gateway_on_the_head(tmp_path):
    cfg, by_rank = render_all(FOUR, tmp_path)
    assert sorted(by_rank) == [0, 1, 2, 3]
    for rank, files in by_rank.items():
        assert sorted(files) == sorted(["dsv41-memguard.service", f"dsv41-r{rank}.service"]
                                       + (["dsv41-watchdog.service", "dsv41-gateway.socket", "dsv41-gateway.service"]
                                          if rank == 0 else []))
    cfg, by_rank = render_all({**FOUR, "WATCHDOG": "0", "GATEWAY": "0"}, tmp_path)
    assert sorted(by_rank[0]) == ["dsv41-memguard.service", "dsv41-r0.service"]


def test_the_gateway_reads_rank_0s_key_file_into_its_environment_and_holds_no_key(tmp_path):
    _, by_rank = render_all(TWO, tmp_path)
    text = by_rank[0]["dsv41-gateway.service"]
    [(_, argv)] = execs(text, "ExecStart")
    state = node_paths(tmp_path, 0)["state_dir"]
    assert argv == ["/bin/sh", "-c", commands.GATEWAY_WRAPPER, "dsv41-gateway", f"{state}/secrets/api_key",
                    f"{state}/gateway/haproxy.cfg"]
    assert "RuntimeDirectory=dsv41-gateway" in text and "Type=notify" in text


def test_the_gateways_port_is_held_by_its_socket_unit_and_haproxy_takes_it_as_descriptor_3(tmp_path):
    """dsv41-gateway.socket holds PORT on every address (as HAProxy's `bind :PORT` did) for the gateway; the
    gateway Requires= it and starts after it (its stop stops the gateway; the gateway's stop or restart leaves
    it); enabling or disabling the gateway takes the socket along (Also=); HAProxy's one listener is the
    descriptor systemd hands over, and its reload keeps it (USR2 to the master)."""
    cfg, by_rank = render_all({**TWO, "PORT": "8123"}, tmp_path)
    sock, service = by_rank[0]["dsv41-gateway.socket"], by_rank[0]["dsv41-gateway.service"]
    assert settings(sock, "Socket") == [("ListenStream", "0.0.0.0:8123"), ("Service", "dsv41-gateway.service")]
    assert settings(sock, "Install") == [("WantedBy", "sockets.target")]
    unit = dict(settings(service, "Unit"))
    assert unit["Requires"] == "dsv41-gateway.socket" and "dsv41-gateway.socket" in unit["After"].split()
    assert settings(service, "Install") == [("WantedBy", "multi-user.target"), ("Also", "dsv41-gateway.socket")]
    assert one(service, "ExecReload") == "/bin/kill -USR2 $MAINPID"
    config = units.gateway_config(cfg)
    assert [line.strip() for line in config.splitlines() if line.strip().startswith("bind")] == ["bind fd@3"]
    assert names.GATEWAY_LISTEN_FD == 3                   # SD_LISTEN_FDS_START: the socket unit's one socket


def test_the_watchdog_runs_the_deploying_python_from_this_checkout(tmp_path):
    _, by_rank = render_all(TWO, tmp_path)
    text = by_rank[0]["dsv41-watchdog.service"]
    [(_, argv)] = execs(text, "ExecStart")
    state = node_paths(tmp_path, 0)["state_dir"]
    assert argv == ["/usr/bin/env", f"PYTHONPATH={units.LIB_DIR}", sys.executable, "-m", "dsv41.head.watchdog",
                    "--state-dir", state]
    svc = dict(settings(text, "Service"))
    assert svc["Restart"] == "on-failure" and ("User" in svc) == (os.getuid() != 0)


ENV_CASES = [(rank, k) for rank in (0, 1) for k, _ in spec_env({})]


@pytest.mark.parametrize("rank,var", ENV_CASES, ids=[f"r{r}-{k}" for r, k in ENV_CASES])
def test_each_measured_variable_is_in_the_container(two, rank, var):
    cfg, by_rank, _ = two
    _, _, env, _, _, _ = container(by_rank[rank][f"dsv41-r{rank}.service"])
    fabric = FABRICS[rank]
    want = dict(spec_env(values_for(fabric)))
    want["NCCL_IB_GID_INDEX"] = str(fabric["gid_index"])          # detected per node
    assert env.get(var) == want[var]


def test_container_environment_is_exactly_the_measured_one(two):
    cfg, by_rank, _ = two
    for rank in (0, 1):
        _, _, _, order, _, _ = container(by_rank[rank][f"dsv41-r{rank}.service"])
        want = [(k, str(FABRICS[rank]["gid_index"]) if k == "NCCL_IB_GID_INDEX" else v)
                for k, v in rank_env(values_for(FABRICS[rank]))]
        assert order == [("DSV41_RANK", str(rank))] + want


ARG_CASES = [(rank, i) for rank in (0, 1) for i in range(len(spec_args(values_for(HEAD), rank)))]


@pytest.mark.parametrize("rank,i", ARG_CASES,
                         ids=[f"r{r}-{spec_args(values_for(HEAD), r)[i][:40]}" for r, i in ARG_CASES])
def test_each_measured_argument_is_passed(two, rank, i):
    _, by_rank, _ = two
    _, _, _, _, image, args = container(by_rank[rank][f"dsv41-r{rank}.service"])
    want = spec_args(values_for(FABRICS[rank]), rank)
    assert args[i] == want[i]
    assert len(args) == len(want)


def test_four_nodes(tmp_path):
    cfg, by_rank = render_all(FOUR, tmp_path)
    for rank in range(4):
        _, opts, env, _, image, args = container(by_rank[rank][f"dsv41-r{rank}.service"])
        assert args == spec_args(values_for(FABRICS[rank]), rank, tp=4, nnodes=4)
        assert args[args.index("--master-addr") + 1] == HEAD["ip"]
        f = FABRICS[rank]
        assert (env["VLLM_HOST_IP"], env["NCCL_SOCKET_IFNAME"], env["GLOO_SOCKET_IFNAME"],
                env["NCCL_IB_HCA"], env["NCCL_IB_GID_INDEX"]) == (
            f["ip"], f["ifname"], f["ifname"], ",".join(f["hcas"]), str(f["gid_index"]))
        assert opts[opts.index("--name") + 1] == f"dsv41-r{rank}"


def test_overrides(tmp_path):
    env = dict(TWO, KV_BYTES="1500000000", NSPEC="3", GRAPH_MODE="FULL_AND_PIECEWISE", ENGINE_PORT="8123",
               EXTRA="--chat-template '/t/my \"tpl\".jinja' --x=100%")
    cfg, by_rank = render_all(env, tmp_path)
    over = {"<KV_BYTES>": "1500000000", "<NSPEC>": "3", "<CAP>": "8", "<sizes>": "1, 2, 3, 4, 8",
            "<GRAPH_MODE>": "FULL_AND_PIECEWISE", "<ENGINE_PORT>": "8123"}
    extra = ["--chat-template", '/t/my "tpl".jinja', "--x=100%"]
    for rank in (0, 1):
        args = container(by_rank[rank][f"dsv41-r{rank}.service"])[5]
        assert args == spec_args(values_for(FABRICS[rank], **over), rank, extra=extra)
    assert json.loads(args[args.index("--compilation-config") + 1])["cudagraph_capture_sizes"] == [
        1, 2, 3, 4, 8]


def test_rank0_and_worker_differ_only_where_the_spec_says(two):
    _, by_rank, root = two
    r0, r1 = by_rank[0]["dsv41-r0.service"], by_rank[1]["dsv41-r1.service"]
    _, o0, e0, _, i0, a0 = container(r0)
    _, o1, e1, _, i1, a1 = container(r1)
    assert i0 == i1
    assert a0[a0.index("--node-rank"):] == ["--node-rank", "0", "--host", "127.0.0.1", "--port", "18000",
                                            "--reasoning-parser", "deepseek_v41", "--tool-call-parser",
                                            "deepseek_v41", "--enable-auto-tool-choice",
                                            "--enable-prompt-tokens-details",
                                            "--enable-force-include-usage"]
    assert a1[a1.index("--node-rank"):] == ["--node-rank", "1", "--headless"]
    assert a0[:a0.index("--node-rank")] == a1[:a1.index("--node-rank")]
    # rank 0 reads the key from a mounted file into the server's environment; workers get no key
    assert f"type=bind,source={root}/node0/state dir 5%/secrets/api_key,target=/run/secrets/dsv41_api_key,readonly" \
        in [o0[i + 1] for i, o in enumerate(o0) if o == "--mount"]
    assert entrypoint(r0) == ("/bin/sh", ["-c", vllm.KEY_WRAPPER, "dsv41-r0", "vllm", "serve"])
    assert entrypoint(r1) == ("vllm", ["serve"])
    assert "secrets" not in r1 and "--env-file" not in o0 + o1
    assert {k for k in e0 if e0[k] != e1[k]} == {
        "DSV41_RANK", "VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA",
        "NCCL_IB_GID_INDEX"}


def test_container_options(two):
    _, by_rank, root = two
    for rank in (0, 1):
        text = by_rank[rank][f"dsv41-r{rank}.service"]
        head, opts, env, _, image, _ = container(text)
        st, md = f"{root}/node{rank}/state dir 5%", node_paths(root, rank)["model_dir"]
        assert head == ["docker", "run"]
        pairs = dict(zip(opts[::1], opts[1:]))
        for flag in ("--rm", "--init", "--privileged"):
            assert flag in opts
        assert (pairs["--name"], pairs["--cidfile"], pairs["--pull"], pairs["--gpus"],
                pairs["--network"], pairs["--ipc"], pairs["--ulimit"], pairs["--shm-size"]) == (
            f"dsv41-r{rank}", f"{st}/run/dsv41-r{rank}.cid", "never", "all", "host", "host",
            "memlock=-1", "32g")
        mounts = [opts[i + 1] for i, o in enumerate(opts) if o == "--mount"]
        quoted = md.replace('"', '""')
        assert mounts == [f'type=bind,"source={quoted}",target=/model,readonly',
                          f"type=bind,source={st}/plans,target=/plans,readonly",
                          f"type=bind,source={st}/cache/{IMAGE_KEY},target=/cache"] + (
            [f"type=bind,source={st}/secrets/api_key,target=/run/secrets/dsv41_api_key,readonly"] if rank == 0 else [])
        assert env["DSV41_RANK"] == str(rank)
        assert image == "ghcr.io/0xsero/deepseek-v4.1-flash-spark@sha256:" \
                        "5668e35e5ee021da4b9ce88a1964caf0e082e8ca01d81d1d64b6213a55c6add5"


def test_unit_lifecycle_settings(two):
    _, by_rank, root = two
    for rank in (0, 1):
        text = by_rank[rank][f"dsv41-r{rank}.service"]
        st = f"{root}/node{rank}/state dir 5%"
        unit = dict(settings(text, "Unit"))
        # no guard, no rank: starting a rank starts the guard first and checks it runs; but a guard
        # restart or crash must not stop a healthy rank, so nothing binds the rank to the guard
        assert "Requires" not in unit and "BindsTo" not in unit and "PartOf" not in unit
        after = unit["After"].split()
        assert "dsv41-memguard.service" in after and "network-online.target" in after
        assert set(unit["Wants"].split()) == {"dsv41-memguard.service", "network-online.target"}
        assert sd_specifiers(unit["ConditionPathExists"]) == f"!{st}/memguard.tripped"
        assert int(unit["StartLimitBurst"]) <= 5 and int(unit["StartLimitIntervalSec"]) >= 300
        svc = dict(settings(text, "Service"))
        assert svc["Type"] == "exec" and svc["Restart"] == "on-failure"
        assert execs(text, "ExecStartPre") == [
            ("", ["systemctl", "is-active", "--quiet", "dsv41-memguard.service"]),
            ("-", ["docker", "rm", "-f", f"dsv41-r{rank}"]),
            ("-", ["rm", "-f", f"{st}/run/dsv41-r{rank}.cid"]),
            ("", ["mkdir", "-p", f"{st}/run", *(f"{st}/cache/{IMAGE_KEY}/{d}" for d in CACHE_DIRS)])]
        [(prefix, stop)] = execs(text, "ExecStop")
        assert stop[:3] == ["docker", "stop", "-t"] and stop[4] == f"dsv41-r{rank}"
        assert int(svc["TimeoutStopSec"]) > int(stop[3])
        assert "Install" not in {s for s, _, _ in sd_settings(text)}   # only the launcher starts ranks


def test_the_key_is_never_in_a_unit(tmp_path):
    for env in (TWO, FOUR):
        cfg, by_rank = render_all(env, tmp_path)
        for files in by_rank.values():
            for name, text in files.items():
                assert KEY not in text
                assert "--api-key" not in text and "VLLM_API_KEY=" + KEY[:4] not in text, name
                assert "--env-file" not in text and "Environment=" not in text, name


def test_model_dir_with_spaces_quote_percent_reaches_the_argv_exactly(two):
    _, by_rank, root = two
    [(_, argv)] = execs(by_rank[0]["dsv41-r0.service"], "ExecStart")
    model = node_paths(root, 0)["model_dir"]
    assert " " in model and '"' in model and "%" in model and "$" in model
    cfg = load_config(dict(TWO, STATE_DIR="/s"))
    want = vllm.docker_run_argv(cfg, cfg.head, HEAD, node_paths(root, 0))
    assert argv == want


# ---- systemd-analyze verify ------------------------------------------------------------------------

def verify_root(base):
    """A root for `systemd-analyze verify --root`: the host's unit dir plus stand-in executables
    (docker, rm, mkdir, env, kill, systemctl, sh: only their presence is checked)."""
    root = base / "root"
    (root / "usr/lib/systemd").mkdir(parents=True)
    shutil.copytree("/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    (root / "usr/bin").mkdir()
    (root / "bin").symlink_to("usr/bin")  # merged /usr, as on Debian 12 and DGX OS
    for exe in ("docker", "rm", "mkdir", "env", "kill", "systemctl", "sh"):
        p = root / "usr/bin" / exe
        p.write_text("#!/bin/sh\n")
        p.chmod(0o755)
    (root / "etc/systemd/system").mkdir(parents=True)
    return root


@pytest.mark.parametrize("env", [TWO, FOUR, dict(TWO, NSPEC="3", EXTRA="--x 'a b' --y=1%", PORT="8123")],
                         ids=["two", "four", "overrides"])
def test_systemd_analyze_verify_is_clean(analyze, tmp_path, env):
    if not Path("/lib/systemd/system/sysinit.target").exists():
        pytest.skip("no systemd unit dir on this machine (apt-get install systemd)")
    cfg, by_rank = render_all(env, tmp_path)
    for rank, files in by_rank.items():
        root = verify_root(tmp_path / f"r{rank}")
        unit_dir = root / "etc/systemd/system"
        for name, text in files.items():
            (unit_dir / name).write_text(text)
        r = subprocess.run([analyze, "verify", "--man=no", f"--root={root}",
                            *[str(unit_dir / n) for n in sorted(files)]],
                           capture_output=True, text=True)
        assert (r.returncode, r.stderr, r.stdout) == (0, "", ""), f"rank {rank}"


# ---- the real docker CLI turns the unit's argv into the container -------------------------------

def docker_cli():
    return shutil.which("docker") or next(
        (p for p in ["/var/cache/dsv41-tests/docker-cli/usr/bin/docker"] if os.access(p, os.X_OK)), None)


class _Daemon(http.server.BaseHTTPRequestHandler):
    """Stand-in for dockerd (no engine can run here): answers the ping and records container
    creation requests, then refuses them so nothing runs."""
    created = []

    def log_message(self, *a):
        pass

    def _reply(self, code, body=b"OK", ctype="text/plain"):
        self.send_response(code)
        self.send_header("API-Version", "1.41")
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_HEAD = do_GET = lambda self: self._reply(200)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if "/containers/create" in self.path:
            self.created.append((self.path, json.loads(body)))
        self._reply(500, b'{"message":"stand-in daemon: not running containers"}', "application/json")


def test_docker_cli_receives_exactly_the_configured_container(tmp_path):
    exe = docker_cli()
    if not exe:
        pytest.skip("no docker CLI (run tests/setup/docker-cli.sh)")
    cfg, by_rank = render_all(TWO, tmp_path)
    sock = tmp_path / "d.sock"

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    server = Server(str(sock), _Daemon)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Daemon.created = []
    try:
        for rank in (0, 1):
            paths = node_paths(tmp_path, rank)
            os.makedirs(f"{paths['state_dir']}/run", exist_ok=True)
            [(_, argv)] = execs(by_rank[rank][f"dsv41-r{rank}.service"], "ExecStart")
            r = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=60,
                               env={"PATH": os.environ["PATH"], "DOCKER_HOST": f"unix://{sock}",
                                    "DOCKER_CONFIG": str(tmp_path / "dockercfg")})
            assert "stand-in daemon" in r.stderr, r.stderr
    finally:
        server.shutdown()
        server.server_close()
    assert len(_Daemon.created) == 2
    for rank, (path, req) in enumerate(_Daemon.created):
        paths = node_paths(tmp_path, rank)
        st = paths["state_dir"]
        assert path.endswith(f"/containers/create?name=dsv41-r{rank}")
        assert req["Image"] == cfg.image
        args = spec_args(values_for(FABRICS[rank]), rank)
        if rank == 0:      # the key: read from the mounted file by the wrapper, never in the container's config
            assert (req["Entrypoint"], req["Cmd"]) == (["/bin/sh"], ["-c", vllm.KEY_WRAPPER, "dsv41-r0", "vllm", "serve", *args])
        else:
            assert (req["Entrypoint"], req["Cmd"]) == (["vllm"], ["serve", *args])
        want_env = [f"{k}={str(FABRICS[rank]['gid_index']) if k == 'NCCL_IB_GID_INDEX' else v}"
                    for k, v in rank_env(values_for(FABRICS[rank]))]
        assert sorted(req["Env"]) == sorted([f"DSV41_RANK={rank}"] + want_env)  # the CLI merges env in its own order
        hc = req["HostConfig"]
        assert [(m["Source"], m["Target"], m.get("ReadOnly", False)) for m in hc["Mounts"]] == [
            (paths["model_dir"], "/model", True), (f"{st}/plans", "/plans", True),
            (f"{st}/cache/{IMAGE_KEY}", "/cache", False)] + ([(f"{st}/secrets/api_key", "/run/secrets/dsv41_api_key", True)]
                                                 if rank == 0 else [])
        assert (hc["AutoRemove"], hc["Init"], hc["Privileged"], hc["NetworkMode"], hc["IpcMode"],
                hc["ShmSize"], hc["ContainerIDFile"]) == (
            True, True, True, "host", "host", 32 << 30, f"{st}/run/dsv41-r{rank}.cid")
        assert [(u["Name"], u["Soft"], u["Hard"]) for u in hc["Ulimits"]] == [("memlock", -1, -1)]
        assert hc["DeviceRequests"][0]["Count"] == -1 and hc["DeviceRequests"][0]["Capabilities"] == [["gpu"]]


# ---- write_rendered, rewrite_plan, errors ---------------------------------------------------------

def test_write_rendered_writes_changes_only_and_drops_stale_ranks(tmp_path):
    cfg, four = render_all(FOUR, tmp_path)
    out = tmp_path / "units"
    written = units.write_rendered(cfg, four, str(out))
    assert len(written) == 11                     # 4 guards, 4 ranks, the watchdog, the gateway and its socket
    assert (out / "r3" / "dsv41-r3.service").read_text() == four[3]["dsv41-r3.service"]
    assert units.write_rendered(cfg, four, str(out)) == []                 # unchanged: nothing written
    cfg2, two = render_all(TWO, tmp_path)
    written = units.write_rendered(cfg2, two, str(out))
    assert sorted(os.listdir(out)) == ["r0", "r1"]
    assert str(out / "r0" / "dsv41-r0.service") in written                  # --nnodes changed
    cfg3, without = render_all({**TWO, "GATEWAY": "0"}, tmp_path)
    units.write_rendered(cfg3, {0: {**without[0], **units.gateway_config_files(cfg2)}, 1: without[1]}, str(out))
    units.write_rendered(cfg3, without, str(out))                          # the gateway's files go, its socket too
    assert sorted(os.listdir(out / "r0")) == ["dsv41-memguard.service", "dsv41-r0.service", "dsv41-watchdog.service"]


def test_write_rendered_defaults_to_the_state_dir(tmp_path):
    cfg, two = render_all(TWO, tmp_path)
    units.write_rendered(cfg, two)
    assert (Path(cfg.state_dir) / "units" / "r1" / "dsv41-memguard.service").exists()


def test_rewrite_plan():
    plan = {"name": "J268", "qdir": "qn:q31:q31s", "layers": {"0": {"bank": "q31", "bits": 2.77}}}
    out = json.loads(units.rewrite_plan(json.dumps(plan)))
    assert out == dict(plan, qdir="/model/exl3/qn:/model/exl3/q31:/model/exl3/q31s")
    assert list(out) == list(plan)
    again = units.rewrite_plan(json.dumps(out))                              # idempotent
    assert json.loads(again)["qdir"] == out["qdir"]
    nested = units.rewrite_plan('{"qdir": "exl3/qn/:../old/q31"}')
    assert json.loads(nested)["qdir"] == "/model/exl3/qn:/model/exl3/q31"


@pytest.mark.parametrize("text,match", [("{not json", "not valid JSON"), ('{"a": 1}', "no `qdir`"),
                                        ('{"qdir": 5}', "colon-separated"),
                                        ('{"qdir": "qn::q31"}', "empty")])
def test_rewrite_plan_errors(text, match):
    with pytest.raises(UserError, match=match):
        units.rewrite_plan(text)


def test_bad_values_are_user_errors(tmp_path):
    cfg = load_config(dict(TWO, STATE_DIR=str(tmp_path)))
    with pytest.raises(UserError, match="R1_IP"):
        units.render_units(cfg, Vllm(cfg), cfg.nodes[1], {0: HEAD, 1: dict(WORKER, ip=None)},
                           node_paths(tmp_path, 1))
    with pytest.raises(UserError, match="control characters"):
        units.render_units(cfg, Vllm(cfg), cfg.head, HEAD, dict(node_paths(tmp_path, 0), state_dir="/s/x\x01y"))
    with pytest.raises(UserError, match="is missing: restore it"):
        units.render_units(cfg, Vllm(cfg), cfg.head, HEAD, node_paths(tmp_path, 0), templates_dir=tmp_path)
