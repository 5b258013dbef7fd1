"""A serving group's side door (dsv41-sidedoor: units/dsv41-sidedoor.cfg.j2 and .service.j2) against a real
HAProxy, started as its rendered unit starts it (ExecStart read back with systemd's rules: the wrapper reads the
group's engine key from its 0600 file), bound on 127.0.0.2 (a loopback alias standing for the node's fabric
address) in front of test_door_security's logging STAND-IN for vLLM's API server, which checks its own key.

What the head's door (the side door's one client) notices: with the door key chat, completions, models, tokenize
and /health pass, and the engine only ever sees its own key, never the door's. What anyone else notices:
door_corpus's hand-written and seeded random requests with no key, a wrong key, or a client key of the head's
door get no model answer, and nothing reaches the engine. An engine that does not answer is a 503 in OpenAI's
shape. Neither the config nor the unit holds a key."""
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

import door_corpus
from dsv41 import names
from dsv41.errors import UserError
from dsv41.head.core import commands, gateway, units
from dsv41.settings.layers import load_config
from test_door_security import ENGINE_KEY as GROUP_KEY, Quiet, StandIn
from test_units import analyze, execs, settings, verify_root   # analyze: its fixture, by name

needs_haproxy = pytest.mark.skipif(shutil.which("haproxy") is None,
                                   reason="haproxy is not installed (tests/setup/monitoring.sh installs it)")
DOOR_KEY = "engine-key-of-the-heads-door"        # what the head's gateway sends to every engine
CLIENT_KEY = "client-key-default"                # a client key of the head's door: not for the side door
WRONG = "sk-not-a-key-of-this-door-0123456789abcdef"
NODE = "127.0.0.2"                               # a loopback alias: the node's fabric address
SEED, COUNT = 4242, 300
STATE = "state dir 5% it's $HOME"                 # any state dir works: the unit quotes it, the config names none


def free_port(host):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def config_for(tmp, bind, engine_port):
    """The settings, the side door's config and the door key's map written where the unit reads them, and the
    group's engine key in its 0600 file -> (cfg, state_dir, config text)."""
    state = tmp / STATE
    cfg = load_config({"WORKER": "root@198.51.100.13", "STATE_DIR": str(tmp / "head"),
                       "ENGINE_PORT": str(engine_port)})
    text = units.side_door_config(cfg, bind)
    for rel, data, mode in ((names.SIDE_DOOR_CONFIG, text, 0o644),
                            (names.SIDE_DOOR_KEYS, units.side_door_key_map(gateway.key_hash(DOOR_KEY)), 0o600),
                            (names.SECRET_KEY, GROUP_KEY, 0o600)):
        path = names.state_path(str(state), rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "w") as f:
            f.write(data)
    return cfg, str(state), text


def start(tmp, engine_port, log):
    """HAProxy as dsv41-sidedoor.service runs it (its ExecStart, no key in the environment), on NODE:<free port>;
    returns (process, port, config text) once it answers."""
    port = free_port(NODE)
    cfg, state, text = config_for(tmp, f"{NODE}:{port}", engine_port)
    [(_, argv)] = execs(units.side_door_unit({"state_dir": state}), "ExecStart")
    env = {k: v for k, v in os.environ.items() if k != "DSV41_ENGINE_KEY"}
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while not door_corpus.send(NODE, port, b"GET /nowhere HTTP/1.1\r\nHost: d\r\n\r\n", 1)[0].startswith(b"HTTP/1.1 "):
        assert proc.poll() is None, f"the side door did not start: {log.name}"
        assert time.monotonic() < deadline, f"the side door did not answer: {log.name}"
        time.sleep(0.05)
    return proc, port, text


def stop(proc):
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def side(tmp_path_factory):
    """A side door in front of the stand-in, started once for the module."""
    tmp = tmp_path_factory.mktemp("side")
    engine_port = free_port("127.0.0.1")
    StandIn.log, StandIn.phase = [], "start"
    engine = Quiet(("127.0.0.1", engine_port), StandIn)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    with pytest.MonkeyPatch.context() as mp, open(tmp / "haproxy.log", "w") as log:
        mp.setattr(names, "SIDE_DOOR_SOCKET", str(tmp / "admin.sock"))
        proc, port, text = start(tmp, engine_port, log)
        try:
            yield type("Side", (), {"port": port, "config": text, "tmp": tmp})
        finally:
            stop(proc)
            engine.shutdown()
            engine.server_close()


def call(port, method, path, key=None, body=None):
    """(status, parsed JSON body or raw bytes) of one request to the side door over a raw socket."""
    data = json.dumps(body).encode() if body is not None else b""
    raw = door_corpus.request(method, path, body=data, auth=f"Bearer {key}".encode() if key else None,
                              headers=[b"Content-Type: application/json"] if body is not None else [])
    answers = door_corpus.parse_h1(door_corpus.send(NODE, port, raw)[0])
    if not answers:
        return None, b""
    try:
        return answers[0].status, json.loads(answers[0].body)
    except ValueError:
        return answers[0].status, answers[0].body


def seen(phase):
    return [(r["method"], r["path"], r["auth"]) for r in StandIn.log if r["phase"] == phase]


@needs_haproxy
def test_the_rendered_config_passes_haproxy_check_on_a_nodes_fabric_address(tmp_path, monkeypatch):
    """As launch would check it on the head: `haproxy -c` binds nothing, so a worker's address is checked too."""
    monkeypatch.setattr(names, "SIDE_DOOR_SOCKET", str(tmp_path / "admin.sock"))
    _, state, _ = config_for(tmp_path, "10.0.0.2:8000", 18000)
    r = subprocess.run(commands.haproxy_check(names.state_path(state, names.SIDE_DOOR_CONFIG)), capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_haproxy
def test_the_door_key_gets_chat_completions_models_tokenize_health_and_metrics_and_the_engine_sees_only_its_own_key(
        side):
    StandIn.phase = "door key"
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    code, body = call(side.port, "POST", "/v1/chat/completions", DOOR_KEY, chat)
    assert code == 200 and body["choices"][0]["message"]["content"] == "stand-in answer"
    code, body = call(side.port, "POST", "/v1/chat/completions", DOOR_KEY, {**chat, "stream": True})
    assert code == 200 and body.count(b"data: {") == 3 and body.rstrip().endswith(b"data: [DONE]")
    code, body = call(side.port, "POST", "/v1/completions", DOOR_KEY, {"model": "m", "prompt": "hi"})
    assert code == 200 and body["choices"][0]["text"] == "stand-in"
    code, body = call(side.port, "GET", "/v1/models", DOOR_KEY)
    assert code == 200 and body["data"][0]["id"] == "deepseek-v4.1-flash"
    code, body = call(side.port, "POST", "/tokenize", DOOR_KEY, {"model": "m", "prompt": "hi"})
    assert code == 200 and body["count"] == 3
    assert call(side.port, "GET", "/health", DOOR_KEY)[0] == 200
    assert call(side.port, "GET", "/metrics", DOOR_KEY)[0] == 200      # for the head's watchdog
    # the door key opens only the listed routes, spelt exactly
    assert call(side.port, "POST", "/invocations", DOOR_KEY, chat)[0] == 404
    assert call(side.port, "GET", "/%761/models", DOOR_KEY)[0] == 400
    StandIn.phase = "between"
    got = seen("door key")
    assert {auth for _, _, auth in got} == {f"Bearer {GROUP_KEY}"}
    assert {(m, p) for m, p, _ in got} == set(names.SIDE_DOOR_ROUTES)


@needs_haproxy
@pytest.mark.parametrize("phase,key", [("no key", None), ("a wrong key", WRONG),
                                       ("a client key of the head's door", CLIENT_KEY),
                                       ("the group's own engine key", GROUP_KEY)])
def test_no_model_answer_and_nothing_reaches_the_engine_without_the_door_key(side, phase, key):
    StandIn.phase = phase
    hand = door_corpus.corpus()
    results = door_corpus.run(NODE, side.port, hand + door_corpus.random_entries(SEED, COUNT), key)
    StandIn.phase = "between"
    out = door_corpus.summary(results, key, len(hand))
    print(f"{phase}: {out['sent']} requests ({out['corpus']} hand-written), answers {out['statuses']}")
    assert out["model_answers"] == [], out["model_answers"][:20]
    assert out["unexpected"] == [], out["unexpected"][:20]
    assert seen(phase) == []
    assert out["sent"] == out["corpus"] + COUNT and out["corpus"] > 1500
    assert out["statuses"].get("401", 0) > 100                      # the listed routes were asked for a key


@needs_haproxy
def test_a_missing_key_is_a_401_in_openais_shape_health_included(side):
    for path in ("/health", "/v1/models"):
        code, body = call(side.port, "GET", path, CLIENT_KEY)
        assert code == 401 and body["error"]["code"] == "invalid_api_key", body


@needs_haproxy
def test_an_engine_that_does_not_answer_is_a_503_in_openais_shape(tmp_path, monkeypatch):
    monkeypatch.setattr(names, "SIDE_DOOR_SOCKET", str(tmp_path / "admin.sock"))
    with open(tmp_path / "haproxy.log", "w") as log:
        proc, port, _ = start(tmp_path, free_port("127.0.0.1"), log)     # nothing listens there
        try:
            code, body = call(port, "GET", "/v1/models", DOOR_KEY)
        finally:
            stop(proc)
    assert code == 503 and body["error"]["type"] == "service_unavailable", body


def test_neither_the_config_nor_the_unit_holds_a_key(tmp_path):
    cfg, state, text = config_for(tmp_path, "10.0.0.2:8000", 18000)
    unit = units.side_door_unit({"state_dir": state})
    with open(names.state_path(state, names.SIDE_DOOR_KEYS)) as f:
        key_map = f.read()
    for key in (DOOR_KEY, GROUP_KEY, CLIENT_KEY):
        assert key not in text and key not in unit and key not in key_map
    assert [line.split() for line in key_map.splitlines() if not line.startswith("#")] == [
        [gateway.key_hash(DOOR_KEY), "door"]]
    assert oct(os.stat(names.state_path(state, names.SIDE_DOOR_KEYS)).st_mode & 0o777) == "0o600"
    [(_, argv)] = execs(unit, "ExecStart")
    assert argv == ["/bin/sh", "-c", commands.GATEWAY_WRAPPER, "dsv41-sidedoor", f"{state}/secrets/api_key",
                    f"{state}/sidedoor/haproxy.cfg"]
    assert ("RuntimeDirectory", "dsv41-sidedoor") in settings(unit, "Service")
    assert not [k for k, _ in settings(unit, "Unit") if k == "Requires"]      # it binds its address itself
    assert [line.strip() for line in text.splitlines() if line.strip().startswith("bind")] == ["bind 10.0.0.2:8000"]
    assert 'set-header Authorization "Bearer ${DSV41_ENGINE_KEY}"' in text


def test_systemd_analyze_verify_is_clean(analyze, tmp_path):
    if not Path("/lib/systemd/system/sysinit.target").exists():
        pytest.skip("no systemd unit dir on this machine (apt-get install systemd)")
    cfg, state, _ = config_for(tmp_path, "10.0.0.2:8000", 18000)
    root = verify_root(tmp_path)
    unit = root / "etc/systemd/system" / names.SIDE_DOOR_UNIT
    unit.write_text(units.side_door_unit({"state_dir": state}))
    r = subprocess.run([analyze, "verify", "--man=no", f"--root={root}", str(unit)], capture_output=True, text=True)
    assert (r.returncode, r.stderr, r.stdout) == (0, "", "")


def test_a_side_door_binds_only_an_address_and_a_port():
    assert units.side_door_bind("10.0.0.2:8000") == "10.0.0.2:8000"
    assert units.side_door_bind("fd00::2:8000") == "fd00::2:8000"
    for bad in ("10.0.0.2", "node1:8000", "10.0.0.2:0", "10.0.0.2:8000\n    bind :80", "10.0.0.2:80 # x",
                "fe80::1%eth0:8000"):
        with pytest.raises(UserError):
            units.side_door_bind(bad)
    with pytest.raises(UserError):
        units.side_door_key_map(DOOR_KEY)                                # a key is never written, only its hash
