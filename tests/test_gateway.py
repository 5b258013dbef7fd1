"""dsv41-gateway against a real HAProxy (Debian's, tests/setup/monitoring.sh installs it) on loopback, in front
of a small HTTP engine stand-in (STAND-IN: rank 0's API server; it checks the engine key and streams), with the
official `openai` SDK as the client where a client's view is asserted.

What a client notices: a known key gets through and the engine only ever sees its own key; a wrong key is a
401 in OpenAI's shape; while the door is closed or the engine is gone every request is answered 503 with
Retry-After (never a refused connection); a revoked key is refused at once while another works; a key past
KEY_RATE_PER_MIN gets 429; a stream passes whole and unbuffered; a drain waits for the stream in flight."""
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import door_socket
from dsv41 import names
from dsv41.head.core import commands, gateway, units
from dsv41.node import gateway as node_gateway
from dsv41.settings.layers import load_config

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None,
                                reason="haproxy is not installed (tests/setup/monitoring.sh installs it)")
ENGINE_KEY = "engine-key-of-rank-0"
KEYS = {"default": "client-key-default", "alice": "client-key-alice"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Engine(http.server.BaseHTTPRequestHandler):
    """STAND-IN for rank 0's API server: /health, /v1/models and a streamed completion (STREAM_S apart)."""
    protocol_version = "HTTP/1.1"
    seen = []
    CHUNKS, STREAM_S = 5, 0.3
    drop = 0                                        # requests to close unanswered, as a kept-alive close race does

    def log_message(self, *args):
        pass

    def reply(self, code, body, ctype="application/json"):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self.reply(200, {})
        Engine.seen.append(self.headers.get("Authorization"))
        if self.headers.get("Authorization") != f"Bearer {ENGINE_KEY}":
            return self.reply(401, {"error": "Unauthorized"})
        self.reply(200, {"object": "list", "data": [{"id": "deepseek-v4.1-flash", "object": "model",
                                                     "created": 0, "owned_by": "dsv41"}]})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Engine.seen.append(self.headers.get("Authorization"))
        if Engine.drop:
            Engine.drop -= 1
            self.close_connection = True
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(self.CHUNKS):
            chunk = {"id": "c", "object": "text_completion", "created": 0, "model": "deepseek-v4.1-flash",
                     "choices": [{"index": 0, "text": f"{i} ", "finish_reason": None, "logprobs": None}]}
            self.chunk(f"data: {json.dumps(chunk)}\n\n".encode())
            time.sleep(self.STREAM_S)
        self.chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


@pytest.fixture
def door(tmp_path, monkeypatch):
    """A real HAProxy on the rendered config, the engine stand-in behind it, its port held by the test as
    dsv41-gateway.socket holds it (descriptor 3); yields a namespace."""
    sock = str(tmp_path / "admin.sock")
    monkeypatch.setattr(names, "GATEWAY_SOCKET", sock)
    state_dir = tmp_path / "st ate'\"#,)$x"              # any STATE_DIR the settings accept works with the gateway
    held = door_socket.hold()
    port, engine_port = held.getsockname()[1], free_port()

    def start(rate=0, state=None, master=False):
        cfg = load_config({"WORKER": "root@198.51.100.13", "STATE_DIR": str(state or state_dir), "PORT": str(port),
                           "ENGINE_PORT": str(engine_port), "KEY_RATE_PER_MIN": str(rate)})
        sd = cfg.state_dir
        node_gateway.ensure(sd, {"name": "default", "hash": gateway.key_hash(KEYS["default"])})
        node_gateway.keys(sd, {"add": {"name": "alice", "hash": gateway.key_hash(KEYS["alice"])}}, sock)
        path = names.state_path(sd, names.GATEWAY_CONFIG)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(units.gateway_config(cfg))
        return run(cfg, master)

    def restart(cfg):
        """The gateway read anew from its files, as its reload does: its process replaced."""
        proc = procs.pop()
        proc.terminate()
        proc.wait(10)
        return run(cfg)

    def run(cfg, master=False):
        """A HAProxy on cfg's config, given the held port; master: in master-worker mode, as the unit runs it."""
        path = names.state_path(cfg.state_dir, names.GATEWAY_CONFIG)
        proc = door_socket.haproxy(["-Ws" if master else "-db", "-f", path], held, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, env={**os.environ, "DSV41_ENGINE_KEY": ENGINE_KEY})
        procs.append(proc)
        for _ in range(100):
            if node_gateway.in_flight(sock) is not None and health(port) is not None:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(proc.stdout.read1().decode() if proc.poll() is not None else "haproxy did not start")
        return cfg

    procs = []
    engine = http.server.ThreadingHTTPServer(("127.0.0.1", engine_port), Engine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    Engine.seen, Engine.drop = [], 0
    yield type("Door", (), {"start": start, "restart": restart, "again": run, "procs": procs, "port": port,
                            "held": held, "sock": sock,
                            "state_dir": str(state_dir), "engine": engine,
                            "url": f"http://127.0.0.1:{port}/v1"})
    for p in procs:
        p.terminate()
        p.wait(10)
        print(p.stdout.read().decode())
    held.close()
    engine.shutdown()
    engine.server_close()


def health(port):
    """The door's /health status; None while no HAProxy answers (the held port queues the request meanwhile)."""
    import requests
    try:
        return requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code
    except requests.RequestException:
        return None


def client(door, key="default"):
    import openai
    return openai.OpenAI(base_url=door.url, api_key=KEYS.get(key, key), max_retries=0, timeout=10)


def status_of(fn):
    """(HTTP status, Retry-After, message) of the SDK's error for fn(), or (200, None, None)."""
    import openai
    try:
        fn()
    except openai.APIStatusError as err:
        return err.status_code, err.response.headers.get("retry-after"), err.body.get("message") if isinstance(
            err.body, dict) else str(err.body)
    return 200, None, None


def test_the_config_passes_haproxy_check_as_its_copy_with_and_without_a_rate(tmp_path):
    """The config binds PORT as systemd hands it over (`fd@3`): `haproxy -c` refuses it without that descriptor
    and passes it with one; the copy launch checks (commands.check_copy) binds 127.0.0.1:PORT instead, its only
    difference, and passes without. HAProxy 2.6 refuses 127.0.0.1:0. A config that binds PORT itself (an
    earlier version's) is checked as it is."""
    env = {**os.environ, "DSV41_ENGINE_KEY": "x"}
    for rate in (0, 30):
        cfg = load_config({"WORKER": "root@198.51.100.13", "STATE_DIR": str(tmp_path), "KEY_RATE_PER_MIN": str(rate),
                           "PORT": "8123"})
        node_gateway.ensure(cfg.state_dir, {"name": "default", "hash": gateway.key_hash("k")})
        path, copy = (tmp_path / "gateway" / f"haproxy-{rate}{x}.cfg" for x in ("", ".check"))   # beside its maps
        text = units.gateway_config(cfg)
        path.write_text(text)
        copy.write_text(commands.check_copy(text, cfg.port))
        r = subprocess.run(["haproxy", "-c", "-f", str(path)], env=env, capture_output=True, text=True)
        assert r.returncode != 0 and "cannot use file descriptor '3'" in r.stderr, r.stdout + r.stderr
        held = door_socket.hold()
        try:
            proc = door_socket.haproxy(["-c", "-f", str(path)], held, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True)
            assert proc.wait(30) == 0, proc.stdout.read()
        finally:
            held.close()
        r = subprocess.run(["haproxy", "-c", "-f", str(copy)], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        lines, copied = text.splitlines(), copy.read_text().splitlines()
        assert len(lines) == len(copied) and [(a, b) for a, b in zip(lines, copied) if a != b] == [
            ("    bind fd@3", "    bind 127.0.0.1:8123")]
        assert ("429" in path.read_text()) == bool(rate)
    older = text.replace("    bind fd@3\n", "    bind :8123\n")
    assert commands.check_copy(older, 8123) == older
    copy.write_text(commands.check_copy(text, 0))
    r = subprocess.run(["haproxy", "-c", "-f", str(copy)], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "invalid port '0'" in r.stderr           # why the copy binds PORT, not port 0


KNOCK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lab", "door_knock.py")


def test_haproxys_master_killed_then_a_reload_refuse_no_connection_the_port_being_held(door):
    """What dsv41-gateway.socket buys, with the real HAProxy run as the unit runs it (-Ws) on the port the test
    holds as systemd does: its master killed -9 (its worker ends with it), a new one a second later (as
    Restart= does), then that one reloaded (USR2: the unit's ExecReload), while a client opens a connection
    every 50 ms: none is refused; those opened meanwhile wait in the kernel. A request the dead process had
    taken may be cut: counted apart. (tests/lab/test_lab_gateway.py proves it under systemd.)"""
    cfg = door.start(master=True)
    knocks = subprocess.Popen([sys.executable, KNOCK, "127.0.0.1", str(door.port), "5", "0.05"],
                              stdout=subprocess.PIPE, text=True)
    time.sleep(1)
    dead = door.procs[-1]
    os.kill(dead.pid, signal.SIGKILL)
    dead.wait(5)
    time.sleep(1)                                         # RestartSec (2 s), shortened
    door.again(cfg, master=True)
    time.sleep(1)
    master = door.procs[-1].pid
    os.kill(master, signal.SIGUSR2)                       # the master runs itself again, keeping descriptor 3
    out = json.loads(knocks.communicate(timeout=60)[0])
    answers = out["answers"]
    cut = {k: n for k, n in answers.items() if k.startswith("cut: ")}
    print(f"HAProxy's master killed -9, started again 1 s later, then reloaded: {out['opened']} connections opened "
          f"every 50 ms: {answers}; the slowest answered after {out['slowest_s']} s")
    assert "refused" not in answers and set(answers) - set(cut) <= {"200", "503"}, answers
    assert sum(cut.values()) <= 3, answers               # only what the dead process had taken
    assert out["slowest_s"] >= 0.5                       # some waited in the kernel for the next HAProxy
    assert os.stat(f"/proc/{master}/fd/3").st_ino == os.fstat(door.held.fileno()).st_ino      # reloaded: still held
    assert health(door.port) == 200


def test_a_known_key_gets_through_and_the_engine_sees_only_its_own_key(door):
    door.start()
    assert [m.id for m in client(door).models.list()] == ["deepseek-v4.1-flash"]
    assert [m.id for m in client(door, "alice").models.list()] == ["deepseek-v4.1-flash"]
    assert set(Engine.seen) == {f"Bearer {ENGINE_KEY}"}
    code, _, message = status_of(lambda: client(door, "nobody's key").models.list())
    assert code == 401 and "doit keys add" in message
    assert len(Engine.seen) == 2                            # the refused request never reached the engine


def test_the_key_map_holds_hashes_only_and_is_private(door):
    cfg = door.start()
    path = names.state_path(cfg.state_dir, names.GATEWAY_KEYS)
    text = open(path).read() + open(names.state_path(cfg.state_dir, names.GATEWAY_CONFIG)).read()
    assert not any(k in text for k in (*KEYS.values(), ENGINE_KEY))
    assert gateway.key_hash(KEYS["alice"]) in text and os.stat(path).st_mode & 0o777 == 0o600


def test_a_closed_door_answers_503_naming_why_with_the_seconds_to_ready(door):
    cfg = door.start()
    node_gateway.set_door(cfg.state_dir, "closed", "release 7 rolling out", time.time() + 30, door.sock)
    code, retry, message = status_of(lambda: client(door).models.list())
    assert code == 503 and message.startswith("release 7 rolling out: ready in about ") and 25 <= int(retry) <= 30
    node_gateway.set_door(cfg.state_dir, "closed", "recovering from DEAD", time.time() + 600, door.sock)
    code, retry, message = status_of(lambda: client(door).models.list())
    assert (code, retry) == (503, "60") and message in (f"recovering from DEAD: ready in about {s} s" for s in (599, 600))
    node_gateway.set_door(cfg.state_dir, "closed", "recovering from DEAD", time.time() + 1, door.sock)
    assert status_of(lambda: client(door).models.list())[:2] == (503, "5")
    node_gateway.set_door(cfg.state_dir, "closed", gateway.STOPPED, 0, door.sock)
    assert status_of(lambda: client(door).models.list()) == (503, "60", gateway.STOPPED)
    node_gateway.set_door(cfg.state_dir, "open", "", 0, door.sock)
    assert status_of(lambda: client(door).models.list())[0] == 200


def test_a_gateway_started_later_reads_the_door_from_its_file(door, tmp_path):
    assert node_gateway.set_door(door.state_dir, "closed", gateway.STOPPED, 0, door.sock) == {
        "door": "closed", "told": False}                    # none runs yet: the file only
    door.start()
    assert status_of(lambda: client(door).models.list()) == (503, "60", gateway.STOPPED)


def test_an_engine_gone_is_503_with_retry_after_never_a_refused_connection(door):
    door.start()
    door.engine.shutdown()
    door.engine.server_close()
    answers = []
    t_end = time.monotonic() + 6                         # through the health check's detection (2 x 2 s)
    while time.monotonic() < t_end:
        answers.append(status_of(lambda: client(door).models.list())[:2])
        time.sleep(0.2)
    assert set(answers) == {(503, "5")}, answers


def test_a_request_the_engine_closes_unanswered_is_sent_again_not_answered_502(door):
    door.start()
    Engine.drop = 1
    text = "".join(c.choices[0].text for c in client(door).completions.create(
        model="deepseek-v4.1-flash", prompt="hi", stream=True))
    assert text == "0 1 2 3 4 " and len(Engine.seen) == 2          # the engine saw it twice, the client once


def test_a_revoked_key_is_refused_within_a_second_while_another_works(door):
    cfg = door.start()
    assert status_of(lambda: client(door, "alice").models.list())[0] == 200
    t0 = time.monotonic()
    out = node_gateway.keys(cfg.state_dir, {"revoke": "alice"}, door.sock)
    assert status_of(lambda: client(door, "alice").models.list())[0] == 401
    assert time.monotonic() - t0 < 1.0
    assert [k["name"] for k in out["keys"]] == ["default"] and out["running"]
    assert gateway.key_hash(KEYS["alice"]) not in open(names.state_path(cfg.state_dir, names.GATEWAY_KEYS)).read()
    assert status_of(lambda: client(door).models.list())[0] == 200


def test_a_key_past_its_rate_gets_429_and_the_others_do_not(door):
    door.start(rate=3)
    codes = [status_of(lambda: client(door, "alice").models.list())[:2] for _ in range(5)]
    assert codes[:3] == [(200, None)] * 3 and codes[3:] == [(429, "60")] * 2
    assert status_of(lambda: client(door).models.list())[0] == 200


def test_per_key_use_counts_requests_503s_and_429s_by_name(door):
    cfg = door.start(rate=2)
    for _ in range(3):
        status_of(lambda: client(door, "alice").models.list())
    node_gateway.set_door(cfg.state_dir, "closed", "recovering from DEAD", 0, door.sock)
    status_of(lambda: client(door).models.list())
    use = node_gateway.usage(door.sock)
    assert (use["alice"]["requests"], use["alice"]["limited"]) == (3, 1)
    assert (use["default"]["requests"], use["default"]["unavailable"]) == (1, 1)
    assert use["alice"]["idle_s"] < 5 and not any(k in json.dumps(use) for k in KEYS.values())


def test_a_stream_passes_whole_and_unbuffered(door):
    door.start()
    t0, arrivals, text = time.monotonic(), [], ""
    for chunk in client(door).completions.create(model="deepseek-v4.1-flash", prompt="count", stream=True):
        arrivals.append(time.monotonic() - t0)
        text += chunk.choices[0].text
    assert text == "0 1 2 3 4 "
    assert arrivals[0] < 0.25 < Engine.STREAM_S * (Engine.CHUNKS - 1) <= arrivals[-1] + 0.1   # not held back


def test_a_drain_waits_for_the_stream_in_flight_and_answers_new_requests_503(door):
    cfg = door.start()
    got = []

    def stream():
        got.append("".join(c.choices[0].text for c in client(door).completions.create(
            model="deepseek-v4.1-flash", prompt="count", stream=True)))
    t = threading.Thread(target=stream)
    t.start()
    time.sleep(0.3)
    node_gateway.set_door(cfg.state_dir, "closed", "release 8 rolling out", time.time() + 60, door.sock)
    assert status_of(lambda: client(door).models.list())[0] == 503
    out = node_gateway.drain(10, door.sock, log=lambda m: None)
    t.join(5)
    assert got == ["0 1 2 3 4 "] and out["left"] == 0 and 0.5 < out["waited_s"] < 5
