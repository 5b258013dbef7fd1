"""The door in front of several serving groups, against a real HAProxy (Debian's) on the rendered config, with
two STAND-IN engines on loopback (each a group's rank 0: it checks its engine key, answers /health and a short
completion) and clients that never retry.

What a client notices: requests go to the group with the fewest in flight; a group killed under load costs no
request begun after it and refuses no connection, and takes requests again once it answers, reached directly
or through its side door (a real one, as its unit runs it: test_side_door); a group whose
worker died (its /health still 200, every request an engine error) fails none: each request it errs on is
answered by the other group, up to the size the door holds whole; one group drained while the other serves;
503 with Retry-After only when no group is ready."""
import dataclasses
import http.server
import json
import os
import shutil
import subprocess
import threading
import time

import pytest
import requests

import door_socket
from dsv41 import names
from dsv41.head.core import commands, gateway, units
from dsv41.node import gateway as node_gateway
from dsv41.settings.layers import load_config
from dsv41.settings.layout import Group

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None,
                                reason="haproxy is not installed (tests/setup/monitoring.sh installs it)")
# the side door as its unit runs it, and its keys
from test_side_door import DOOR_KEY, GROUP_KEY, free_port, start as start_side_door
CLIENT_KEY = "client-key-default"
MODEL = "deepseek-v4.1-flash"


class Engine:
    """STAND-IN for one group's rank 0 API server on 127.0.0.1: `mode` ok, "worker died" (/health 200, every
    request 500 as vLLM's EngineDeadError) or "hold" (a request waits for `release`); `posts` counts the
    requests that reached it; stop() and start() take it off the port and back."""

    def __init__(self, port, key=DOOR_KEY):
        self.port, self.mode, self.posts, self.release, self.srv = port, "ok", 0, threading.Event(), None
        self.key = key                     # the one it takes: the door's, or its group's behind a side door
        self.dead = False                  # stopped: a kept-alive connection still open is closed unanswered
        self.start()

    def start(self):
        engine = self
        self.dead = False

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def reply(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def gone(self):
                self.close_connection = engine.dead
                return engine.dead

            def do_GET(self):
                if self.gone():
                    return
                if self.headers.get("Authorization") != f"Bearer {engine.key}":
                    return self.reply(401, {"error": "Unauthorized"})
                self.reply(200, {} if self.path == "/health" else {"object": "list", "data": [{"id": MODEL}]})

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.gone():
                    return
                if self.headers.get("Authorization") != f"Bearer {engine.key}":
                    return self.reply(401, {"error": "Unauthorized"})
                engine.posts += 1
                if engine.mode == "worker died":
                    return self.reply(500, {"error": {"message": "EngineDeadError: EngineCore encountered an "
                                                                 "issue", "code": 500}})
                if engine.mode == "hold":
                    engine.release.wait(20)
                self.reply(200, {"object": "text_completion", "model": MODEL, "port": engine.port,
                                 "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}]})

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.srv.daemon_threads = True
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def stop(self):
        self.dead = True
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def door(tmp_path, monkeypatch):
    """A real HAProxy on the door's config for two groups (g0, g1: an Engine each), its port held as
    dsv41-gateway.socket holds it; yields a namespace with the engines, the port and the admin socket."""
    yield from open_door(tmp_path, monkeypatch)


@pytest.fixture
def door_and_side_door(tmp_path, monkeypatch):
    """As door, with g1's engine behind a real side door on 127.0.0.2 (test_side_door.start: as its unit runs
    it), which passes the door's key and gives the engine its group's own."""
    yield from open_door(tmp_path, monkeypatch, side_door=True)


@pytest.fixture
def door_by_key(tmp_path, monkeypatch):
    """As door, with ROUTING=key."""
    yield from open_door(tmp_path, monkeypatch, routing="key")


def open_door(tmp_path, monkeypatch, side_door=False, routing="least"):
    sock = str(tmp_path / "admin.sock")
    monkeypatch.setattr(names, "GATEWAY_SOCKET", sock)
    monkeypatch.setattr(names, "SIDE_DOOR_SOCKET", str(tmp_path / "side.sock"))
    held = door_socket.hold()
    port = held.getsockname()[1]
    engines = [Engine(free_port("127.0.0.1")), Engine(free_port("127.0.0.1"), GROUP_KEY if side_door else DOOR_KEY)]
    cfg = load_config({"WORKER": "root@198.51.100.13", "STATE_DIR": str(tmp_path / "st"), "PORT": str(port),
                       "ROUTING": routing})
    side = None
    if side_door:
        side, side_port, _ = start_side_door(tmp_path, engines[1].port, open(tmp_path / "side.log", "w"))
        layout = two_groups(cfg, [engines[0].port, side_port], host="127.0.0.2")
    else:
        layout = two_groups(cfg, [e.port for e in engines])
    sd = cfg.state_dir
    node_gateway.ensure(sd, {"name": "default", "hash": gateway.key_hash(CLIENT_KEY)})
    path = names.state_path(sd, names.GATEWAY_CONFIG)
    with open(path, "w") as f:
        f.write(units.gateway_config(cfg, layout=layout))
    proc = door_socket.haproxy(["-db", "-f", path], held, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env={**os.environ, "DSV41_ENGINE_KEY": DOOR_KEY})
    for _ in range(100):
        if node_gateway.in_flight(sock) is not None:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(proc.stdout.read1().decode() if proc.poll() is not None else "haproxy did not start")
    yield type("Door", (), {"port": port, "sock": sock, "engines": engines, "state_dir": sd})
    for p in (proc, side) if side else (proc,):
        p.terminate()
        p.wait(10)
    print(proc.stdout.read().decode())
    held.close()
    for e in engines:
        e.release.set()
        if e.srv.socket.fileno() != -1:
            e.stop()


def two_groups(cfg, ports, host="127.0.0.1"):
    """cfg's layout with two groups of one node each behind the door (the second's engine at host)."""
    return dataclasses.replace(cfg.layout, groups=(
        Group(0, ("head",), "127.0.0.1", ports[0], names.door_server(0, 2)),
        Group(1, ("worker1",), host, ports[1], names.door_server(1, 2))))


def ask(door, body=None, timeout=10, key=CLIENT_KEY):
    """One completion through the door with a client key, never sent again: (status or the error's class
    name, the engine port that answered, the Retry-After header)."""
    try:
        r = requests.post(f"http://127.0.0.1:{door.port}/v1/completions", timeout=timeout,
                          headers={"Authorization": f"Bearer {key}"},
                          json=body or {"model": MODEL, "prompt": "hi", "max_tokens": 1})
    except requests.RequestException as err:
        return type(err).__name__, None, None
    port = r.json().get("port") if r.status_code == 200 else None
    return r.status_code, port, r.headers.get("Retry-After")


class Load:
    """`clients` threads asking one short completion after another, each answer kept with when it was asked."""

    def __init__(self, door, clients=4):
        self.door, self.answers, self.stop = door, [], threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(clients)]
        for t in self.threads:
            t.start()

    def run(self):
        while not self.stop.is_set():
            t = time.monotonic()
            self.answers.append((t, ask(self.door)))
            time.sleep(0.02)

    def end(self):
        self.stop.set()
        for t in self.threads:
            t.join(15)
        return self.answers

    @staticmethod
    def failed(answers, since=0.0):
        return [a for t, a in answers if t >= since and a[0] != 200]


def wait_for(what, timeout=15):
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        if what():
            return True
        time.sleep(0.1)
    return False


def test_the_config_for_several_groups_passes_haproxy_check(tmp_path):
    cfg = load_config({"WORKER": "root@198.51.100.13", "STATE_DIR": str(tmp_path), "PORT": "8000"})
    text = units.gateway_config(cfg, layout=two_groups(cfg, [8001, 8000], host="10.0.0.2"))
    assert "server g1 10.0.0.2:8000" in text and "balance leastconn" in text and DOOR_KEY not in text
    node_gateway.ensure(str(tmp_path), {"name": "default", "hash": gateway.key_hash(CLIENT_KEY)})
    check = names.state_path(str(tmp_path), names.GATEWAY_CONFIG + ".check")
    with open(check, "w") as f:
        f.write(commands.check_copy(text, 8000))
    r = subprocess.run(commands.haproxy_check(check), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_requests_go_to_the_group_with_the_fewest_in_flight(door):
    g0, g1 = door.engines
    g0.mode = "hold"
    held = threading.Thread(target=ask, args=(door,))
    held.start()
    assert wait_for(lambda: g0.posts + g1.posts == 1)
    holder = g0 if g0.posts else g1
    holder.mode, other = "hold", g1 if holder is g0 else g0
    assert wait_for(lambda: (node_gateway.groups(door.sock) or {}).get(
        names.door_server(door.engines.index(holder), 2), {}).get("in_flight") == 1)
    answers = [ask(door) for _ in range(6)]
    assert [a[:2] for a in answers] == [(200, other.port)] * 6       # none waits behind the held one
    holder.release.set()
    held.join(10)


def test_a_group_killed_under_load_costs_no_request_begun_after_and_refuses_none_then_heals(door):
    g0, g1 = door.engines
    load = Load(door)
    time.sleep(2)
    killed_at = time.monotonic()
    g1.stop()                                          # its engine gone: connections to it refused
    time.sleep(6)                                      # through the health check's detection (2 x 2 s)
    g1.start()
    back = wait_for(lambda: (node_gateway.groups(door.sock) or {}).get("g1", {}).get("status") == "UP")
    posts = g1.posts
    time.sleep(3)
    answers = load.end()
    after = [a for t, a in answers if t >= killed_at]
    print(f"a group killed under load: {len(answers)} requests, {len(after)} begun after the kill, "
          f"{len(Load.failed(answers))} failed")
    assert Load.failed(answers) == [] and len(after) > 50, Load.failed(answers)[:5]
    assert back and g1.posts > posts                   # healed: it takes requests again


def test_a_group_whose_worker_died_errs_and_each_of_its_requests_is_answered_by_the_other(door):
    g0, g1 = door.engines
    load = Load(door)
    time.sleep(1)
    g1.mode, posts = "worker died", g1.posts           # its rank 0 still answers /health 200, every request 500
    time.sleep(4)
    answers = load.end()
    print(f"a group whose worker died: {len(answers)} requests, {g1.posts - posts} tried there first, "
          f"{len(Load.failed(answers))} failed")
    assert Load.failed(answers) == [], Load.failed(answers)[:5]
    assert g1.posts > posts and {a[1] for t, a in answers[-20:]} == {g0.port}   # tried there, answered here


def test_a_request_up_to_the_retry_size_is_sent_again_when_its_group_fails(door):
    g0, g1 = door.engines
    g1.mode = "worker died"
    prompt = "x" * (units.DOOR_RETRY_BYTES - 8192)    # the whole request (headers, JSON) within the buffer
    for _ in range(4):                                 # whichever group it goes to first
        node_gateway.set_group("g1", "ready", door.sock)
        assert ask(door, {"model": MODEL, "prompt": prompt, "max_tokens": 1})[:2] == (200, g0.port)
    assert g1.posts >= 1


def test_one_group_drained_while_the_other_serves(door):
    g0, g1 = door.engines
    g0.mode = g1.mode = "hold"
    first = threading.Thread(target=ask, args=(door,))
    first.start()
    assert wait_for(lambda: g0.posts + g1.posts == 1)
    holder = "g0" if g0.posts else "g1"
    engine, other = (g0, g1) if holder == "g0" else (g1, g0)
    other.mode = "ok"
    assert node_gateway.set_group(holder, "drain", door.sock) is True
    answers = [ask(door) for _ in range(5)]
    assert [a[:2] for a in answers] == [(200, other.port)] * 5        # no new request for the drained group
    threading.Timer(1.0, engine.release.set).start()
    out = node_gateway.drain(10, door.sock, log=lambda m: None, group=holder)
    first.join(10)
    assert out["left"] == 0 and 0.5 <= out["waited_s"] < 5            # it waited for the one in flight
    assert node_gateway.groups(door.sock)[holder]["status"] == "DRAIN"
    engine.mode = "ok"
    node_gateway.set_group(holder, "ready", door.sock)
    assert {ask(door)[1] for _ in range(8)} == {g0.port, g1.port}


def test_503_with_retry_after_only_when_no_group_is_ready(door):
    g0, g1 = door.engines
    node_gateway.set_group("g0", "maint", door.sock)
    assert {ask(door)[:2] for _ in range(4)} == {(200, g1.port)}
    g1.stop()
    assert wait_for(lambda: ask(door)[0] == 503, 8)
    status, _, retry = ask(door)
    assert (status, retry) == (503, "5")
    node_gateway.set_group("g0", "ready", door.sock)
    assert ask(door)[:2] == (200, g0.port)
    with pytest.raises(node_gateway.GatewayError, match="ready, drain, maint"):
        node_gateway.set_group("g0", "down", door.sock)


def test_a_request_past_the_retry_size_fails_with_its_group_which_its_error_takes_out(door):
    g0, g1 = door.engines
    g1.mode = "worker died"
    node_gateway.set_group("g0", "maint", door.sock)   # the long one goes to g1
    long = {"model": MODEL, "prompt": "x" * (units.DOOR_RETRY_BYTES + 10000), "max_tokens": 1}
    assert ask(door, long)[0] == 500                    # not held whole: not sent again
    assert node_gateway.groups(door.sock)["g1"]["status"] == "DOWN"
    node_gateway.set_group("g0", "ready", door.sock)
    assert ask(door)[:2] == (200, g0.port)


def test_a_group_behind_its_side_door_killed_under_load_costs_no_request_and_heals(door_and_side_door):
    door = door_and_side_door
    g0, g1 = door.engines
    load = Load(door)
    assert wait_for(lambda: g1.posts > 5, 5)           # through the side door, with its group's key
    g1.stop()                                          # the side door stays and answers 503: the engine is gone
    assert wait_for(lambda: (node_gateway.groups(door.sock) or {}).get("g1", {}).get("status") == "DOWN", 8)
    g1.start()
    back = wait_for(lambda: (node_gateway.groups(door.sock) or {}).get("g1", {}).get("status") == "UP")
    posts = g1.posts
    time.sleep(2)
    answers = load.end()
    print(f"a group behind its side door killed under load: {len(answers)} requests, "
          f"{len(Load.failed(answers))} failed")
    assert Load.failed(answers) == [] and len(answers) > 50, Load.failed(answers)[:5]
    assert back and g1.posts > posts


def test_a_long_request_passes_the_side_door_whole(door_and_side_door):
    door = door_and_side_door
    g0, g1 = door.engines
    node_gateway.set_group("g0", "maint", door.sock)   # to g1, through its side door
    long = {"model": MODEL, "prompt": "x" * (units.DOOR_RETRY_BYTES - 8192), "max_tokens": 1}
    assert [ask(door, long)[:2] for _ in range(2)] == [(200, g1.port)] * 2


def test_routing_by_key_sends_each_keys_requests_to_one_group_and_moves_them_only_when_it_is_out(door_by_key):
    """ROUTING=key: each client key's requests go to one group (its chats find their prefix in that group's
    cache), the keys spread over both; that group stopped, its keys' requests go to the other with none failed,
    and come back once it answers again."""
    keys = {f"user{i}": f"key-of-user{i}-{i * 7919}" for i in range(8)}
    for name, key in keys.items():
        node_gateway.keys(door_by_key.state_dir, {"add": {"name": name, "hash": gateway.key_hash(key)}},
                          door_by_key.sock)
    where = {}
    for name, key in keys.items():
        answers = [ask(door_by_key, key=key) for _ in range(6)]
        assert {a[0] for a in answers} == {200}, answers
        ports = {a[1] for a in answers}
        assert len(ports) == 1, (name, ports)                  # one group a key
        where[name] = ports.pop()
    engines = door_by_key.engines
    assert set(where.values()) == {e.port for e in engines}, where     # the keys spread over both groups
    moved = next(n for n, p in where.items() if p == engines[1].port)
    engines[1].stop()
    answers = [ask(door_by_key, key=keys[moved]) for _ in range(6)]
    assert [a[:2] for a in answers] == [(200, engines[0].port)] * 6, answers     # none failed: the other group
    engines[1].start()
    deadline = time.monotonic() + 15
    while ask(door_by_key, key=keys[moved])[1] != engines[1].port:     # back at its next good check (2 s)
        assert time.monotonic() < deadline, "the key never came back to its group"
        time.sleep(0.5)
