"""The door (dsv41-gateway: a real HAProxy on the config units.gateway_config renders) as a security boundary,
in front of a logging STAND-IN for vLLM's API server that decodes and routes as uvicorn and vLLM do.

tests/door_corpus.py's hand-written corpus and its seeded random requests, sent over raw sockets with no key,
a wrong key, a key revoked before the gateway started and a key revoked while it runs: no model answer comes
back, and the stand-in receives no request at all but HAProxy's own health checks (each with the engine's
key). With a valid key, chat, a stream, completions, the models and tokenize get through, and the corpus with
that key reaches the stand-in only on the listed routes, spelt exactly, with the engine's key. The rendered
config itself has one way to the engine: a listed (method, path) and a matched client key."""
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse

import pytest

import door_corpus
import door_socket
from dsv41 import names
from dsv41.head.core import commands, gateway, units
from dsv41.node import gateway as node_gateway
from dsv41.settings.layers import load_config

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None,
                                reason="haproxy is not installed (tests/setup/monitoring.sh installs it)")
ENGINE_KEY = "engine-key-of-rank-0"
KEYS = {"default": "client-key-default", "mallory": "client-key-revoked-while-running",
        "trudy": "client-key-revoked-before-start"}
WRONG = "sk-not-a-key-of-this-door-0123456789abcdef"
SEED, COUNT = 4141, 300
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")       # vllm/entrypoints/serve/middleware/authenticate.py
HEALTH_CHECK = ("GET", "/health", f"Bearer {ENGINE_KEY}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def decoded_path(target):
    """The path uvicorn hands the app: httptools takes it out of an absolute-form target, the query and a
    fragment go, then %XX is decoded (urllib.parse.unquote)."""
    m = re.match(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*", target)
    if m:
        target = target[m.end():] or "/"
    return urllib.parse.unquote(re.split(r"[?#]", target, maxsplit=1)[0])


class StandIn(http.server.BaseHTTPRequestHandler):
    """STAND-IN for vLLM 0.32's OpenAI API server (uvicorn + FastAPI), not vLLM: it logs every request it
    receives (method, raw target, decoded path, Authorization, the test's phase) and answers as the real one
    would on what matters here. The path is percent-decoded before routing (uvicorn); the engine's key is
    checked only under /v1, /v2, /inference and /cohere and never for OPTIONS (vLLM's AuthenticationMiddleware);
    every route of door_corpus.VLLM_ROUTES answers 200 with what only an engine says (choices, a model list,
    tokens, its version), /metrics as a prefix, a trailing slash is redirected (Starlette), anything else 404."""
    protocol_version = "HTTP/1.1"
    log, phase = [], "start"
    ROUTES = {(m, p) for m, p in door_corpus.VLLM_ROUTES}

    def log_message(self, *args):
        pass

    def handle_one_request(self):
        self.raw_requestline = self.rfile.readline(65537)
        if not self.raw_requestline:
            self.close_connection = True
            return
        if not self.parse_request():                      # logged too: it reached the engine all the same
            StandIn.log.append({"method": None, "target": self.raw_requestline.decode("latin-1"), "path": None,
                                "auth": None, "phase": StandIn.phase})
            return
        target = self.raw_requestline.split(b" ")[1].decode("latin-1") if b" " in self.raw_requestline else ""
        path = decoded_path(target)
        auth = self.headers.get("Authorization")
        StandIn.log.append({"method": self.command, "target": target, "path": path, "auth": auth, "phase": StandIn.phase})
        body = self.read_body()
        self.serve(self.command, path, auth, body)
        self.wfile.flush()

    def read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            data = b""
            while True:
                n = int(self.rfile.readline().split(b";")[0], 16)
                if n == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass                              # trailers (uvicorn reads and drops them)
                    return data
                data += self.rfile.read(n)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def reply(self, code, body, headers=()):
        data = json.dumps(body).encode() if not isinstance(body, bytes) else body
        self.send_response(code)
        for k, v in (("Content-Type", "application/json"), *headers):
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def serve(self, method, path, auth, body):
        if method != "OPTIONS" and path.startswith(GUARDED_PREFIX):
            scheme, _, param = (auth or "").partition(" ")
            if scheme.lower() != "bearer" or param != ENGINE_KEY:
                return self.reply(401, {"error": "Unauthorized"})
        known = {p for _, p in self.ROUTES}
        if path.startswith("/metrics"):
            return self.reply(200, b"vllm:num_requests_running 0\n", [("Content-Type", "text/plain")])
        if path not in known and path.startswith("/v1/responses/"):
            path = "/v1/responses/resp_1"
        if path not in known:
            other = path[:-1] if path.endswith("/") else path + "/"
            if other in known:
                return self.reply(307, b"", [("Location", other)])
            return self.reply(404, {"detail": "Not Found"})
        if (method, path) not in self.ROUTES and not (method == "HEAD" and ("GET", path) in self.ROUTES):
            return self.reply(405, {"detail": "Method Not Allowed"})
        if path in ("/health", "/ping"):
            return self.reply(200, b"", [("Content-Type", "text/plain")])
        try:
            stream = bool(json.loads(body or b"{}").get("stream"))
        except (ValueError, AttributeError):
            stream = False
        if path == "/v1/models":
            return self.reply(200, {"object": "list", "data": [{"id": "deepseek-v4.1-flash", "object": "model"}]})
        if path == "/tokenize":
            return self.reply(200, {"count": 3, "max_model_len": 8192, "tokens": [1, 2, 3]})
        if path == "/version":
            return self.reply(200, {"version": "0.32.0"})
        if stream:
            return self.stream(path)
        chat = {"message": {"role": "assistant", "content": "stand-in answer"}} if "chat" in path else {"text": "stand-in"}
        self.reply(200, {"id": "x", "object": "stand_in", "choices": [{"index": 0, **chat, "finish_reason": "stop"}]})

    def stream(self, path):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(3):
            piece = {"delta": {"content": f"{i} "}} if "chat" in path else {"text": f"{i} "}
            self.chunk(f"data: {json.dumps({'choices': [{'index': 0, **piece}]})}\n\n".encode())
        self.chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))


class Quiet(http.server.ThreadingHTTPServer):
    """The stand-in's server: HAProxy's health check resets its connection once answered; no traceback."""
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass


def door_config(cfg):
    """The config the door runs (a function of its own, so that another config can be put in its place)."""
    return units.gateway_config(cfg)


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    """A real HAProxy on the rendered config in front of the stand-in, started once for the module. Keys:
    `default` valid; `trudy` revoked before the gateway starts (the map alone); `mallory` valid at start and
    revoked through the running gateway (node.gateway's `keys`, as `doit keys revoke` does)."""
    tmp = tmp_path_factory.mktemp("door")
    sock = str(tmp / "admin.sock")
    held = door_socket.hold()                           # PORT, held as dsv41-gateway.socket holds it
    port, engine_port = held.getsockname()[1], free_port()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(names, "GATEWAY_SOCKET", sock)
        cfg = load_config({"WORKER": "root@198.51.100.13", "STATE_DIR": str(tmp / "state"), "PORT": str(port),
                           "ENGINE_PORT": str(engine_port)})
        sd = cfg.state_dir
        node_gateway.ensure(sd, {"name": "default", "hash": gateway.key_hash(KEYS["default"])})
        for name in ("mallory", "trudy"):
            node_gateway.keys(sd, {"add": {"name": name, "hash": gateway.key_hash(KEYS[name])}}, sock)
        node_gateway.keys(sd, {"revoke": "trudy"}, sock)
        path = names.state_path(sd, names.GATEWAY_CONFIG)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(door_config(cfg))
        StandIn.log, StandIn.phase = [], "start"
        engine = Quiet(("127.0.0.1", engine_port), StandIn)
        threading.Thread(target=engine.serve_forever, daemon=True).start()
        proc = door_socket.haproxy(["-db", "-f", path], held, env={**os.environ, "DSV41_ENGINE_KEY": ENGINE_KEY},
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 10
            while door_corpus.send("127.0.0.1", port, b"GET /health HTTP/1.1\r\nHost: door\r\n\r\n", 1)[0][9:12] != b"200":
                assert proc.poll() is None, proc.stdout.read().decode()
                assert time.monotonic() < deadline, "the door did not open: its health check of the stand-in failed"
                time.sleep(0.1)
            assert get(port, "/v1/models", KEYS["mallory"])[0] == 200
            node_gateway.keys(sd, {"revoke": "mallory"}, sock)
            yield type("Door", (), {"port": port, "cfg": cfg, "config": open(path).read()})
        finally:
            proc.terminate()
            proc.wait(10)
            held.close()
            engine.shutdown()
            engine.server_close()


def get(port, path, key=None, body=None):
    """(status, body) of one request through the door over a raw socket."""
    method = "POST" if body is not None else "GET"
    data = json.dumps(body).encode() if body is not None else b""
    raw = door_corpus.request(method, path, body=data, auth=f"Bearer {key}".encode() if key else None,
                              headers=[b"Content-Type: application/json"] if body is not None else [])
    answers = door_corpus.parse_h1(door_corpus.send("127.0.0.1", port, raw)[0])
    return (answers[0].status, answers[0].body) if answers else (None, b"")


def attack(door, phase, key):
    """The corpus and COUNT random requests with key, in a phase of the stand-in's log -> (summary, the
    requests the stand-in received in that phase)."""
    StandIn.phase = phase
    hand = door_corpus.corpus()
    results = door_corpus.run("127.0.0.1", door.port, hand + door_corpus.random_entries(SEED, COUNT), key)
    StandIn.phase = "between"
    return door_corpus.summary(results, key, len(hand)), [r for r in StandIn.log if r["phase"] == phase]


@pytest.mark.parametrize("phase,key", [("no key", None), ("a wrong key", WRONG),
                                       ("a key revoked before the gateway started", KEYS["trudy"]),
                                       ("a key revoked while the gateway runs", KEYS["mallory"])])
def test_no_model_answer_and_nothing_reaches_the_engine_without_a_valid_key(door, phase, key):
    out, received = attack(door, phase, key)
    print(f"{phase}: {out['sent']} requests ({out['corpus']} hand-written), answers {out['statuses']}")
    assert out["model_answers"] == [], out["model_answers"][:20]
    assert out["unexpected"] == [], out["unexpected"][:20]
    assert [(r["method"], r["path"], r["auth"]) for r in received if
            (r["method"], r["path"], r["auth"]) != HEALTH_CHECK] == []      # only HAProxy's own checks
    assert out["sent"] == out["corpus"] + COUNT and out["corpus"] > 1500


def test_the_corpus_with_a_valid_key_reaches_the_engine_only_on_the_listed_routes_spelt_exactly(door):
    out, received = attack(door, "the valid key's corpus", KEYS["default"])
    got = {(r["method"], r["target"].split("?")[0], r["path"], r["auth"]) for r in received}
    listed = {(m, p, p, f"Bearer {ENGINE_KEY}") for m, p in names.GATEWAY_ROUTES + (HEALTH_CHECK[:2],)}
    assert got <= listed, got - listed
    assert {(m, p) for m, p, _, _ in got} >= set(names.GATEWAY_ROUTES)       # they were there to be reached
    assert out["unexpected"] == [], out["unexpected"][:20]


def test_a_valid_key_gets_chat_a_stream_completions_models_and_tokenize(door):
    StandIn.phase = "valid key"
    key = KEYS["default"]
    code, body = get(door.port, "/v1/chat/completions", key, {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert code == 200 and json.loads(body)["choices"][0]["message"]["content"] == "stand-in answer"
    code, body = get(door.port, "/v1/chat/completions", key, {"model": "m", "stream": True,
                                                              "messages": [{"role": "user", "content": "hi"}]})
    assert code == 200 and body.count(b"data: {") == 3 and body.rstrip().endswith(b"data: [DONE]")
    code, body = get(door.port, "/v1/completions", key, {"model": "m", "prompt": "hi"})
    assert code == 200 and json.loads(body)["choices"][0]["text"] == "stand-in"
    code, body = get(door.port, "/v1/completions", key, {"model": "m", "prompt": "hi", "stream": True})
    assert code == 200 and b'"text": "2 "' in body and body.rstrip().endswith(b"data: [DONE]")
    code, body = get(door.port, "/v1/models", key)
    assert code == 200 and json.loads(body)["data"][0]["id"] == "deepseek-v4.1-flash"
    code, body = get(door.port, "/tokenize", key, {"model": "m", "prompt": "hi"})
    assert code == 200 and json.loads(body)["count"] == 3
    assert get(door.port, "/health")[0] == 200
    received = [r for r in StandIn.log if r["phase"] == "valid key"]
    assert {r["auth"] for r in received} == {f"Bearer {ENGINE_KEY}"}
    assert {(r["method"], r["path"]) for r in received} - {HEALTH_CHECK[:2]} == set(names.GATEWAY_ROUTES)
    StandIn.phase = "between"


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_http2_without_tls_is_served_with_a_key_and_refused_without_as_http1_is(door):
    """HAProxy takes HTTP/2 with prior knowledge on the door's port and gives such a request the absolute form
    of its target: the door matches its path all the same."""
    def h2(path, key=None):
        cmd = ["curl", "-s", "--http2-prior-knowledge", "-o", "/dev/null", "-w", "%{http_version} %{http_code}",
               "--path-as-is", f"http://127.0.0.1:{door.port}{path}"] + (["-H", f"Authorization: Bearer {key}"] if key else [])
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
    StandIn.phase = "http2"
    assert h2("/v1/models", KEYS["default"]) == "2 200"
    assert [h2("/v1/models"), h2("/v1/models", WRONG), h2("/%761/models", KEYS["default"]), h2("/invocations")] == [
        "2 401", "2 401", "2 400", "2 404"]
    received = [r for r in StandIn.log if r["phase"] == "http2"]
    StandIn.phase = "between"
    assert {(r["method"], r["path"], r["auth"]) for r in received} - {HEALTH_CHECK} == {
        ("GET", "/v1/models", f"Bearer {ENGINE_KEY}")}


def test_the_judge_sees_what_an_unguarded_engine_gives(door):
    """The judge is not blind: the corpus sent straight to the stand-in gets model answers where vLLM checks no
    key (/invocations, /tokenize, /sleep, /collective_rpc: outside /v1), and with the engine's key attached to
    everything (as the door before did) also where a percent-encoding hides /v1 from a raw-path rule."""
    StandIn.phase = "no door"
    hand = door_corpus.corpus()
    through = {e.name for e, verdict, *_ in door_corpus.run("127.0.0.1", door.cfg.engine_port, hand, timeout=2)
               if verdict == "model"}
    hidden = [e for e in hand if "%76" in e.name]
    keyed = {e.name for e, verdict, *_ in door_corpus.run("127.0.0.1", door.cfg.engine_port, hidden, ENGINE_KEY, timeout=2)
             if verdict == "model"}
    StandIn.phase = "between"
    assert {"POST /invocations", "POST /tokenize", "POST /sleep", "POST /collective_rpc", "POST /pooling",
            "GET /version"} <= through, sorted(through)
    assert "POST '/%761/chat/completions' (%76 for v)" not in through               # vLLM guards the decoded /v1
    assert {"POST '/%761/chat/completions' (%76 for v)", "GET '/%76%31/models' (v1 encoded (models))"} <= keyed


def test_the_config_has_one_way_to_the_engine_a_listed_route_with_a_matched_key(door):
    text = door.config
    lines = [line.split("#")[0].strip() if not line.strip().startswith("http-request return") else line.strip()
             for line in text.splitlines()]
    sections, current = {}, None
    for line in lines:
        if re.match(r"(global|defaults|frontend|backend|listen)\b", line):
            current = line
            sections[current] = []
        elif line and current:
            sections[current].append(line)
    assert set(sections) == {"global", "defaults", "frontend api", "backend engine", "backend per_key"}
    front, engine = sections["frontend api"], sections["backend engine"]
    assert [line for line in lines if line.startswith("bind ")] == ["bind fd@3"]     # one listener: PORT, as systemd holds it
    assert [line for line in lines if line.startswith(("use_backend", "default_backend", "use-server"))] == [
        "use_backend engine if { var(txn.route) -m found } { var(txn.who) -m found }"]
    routes = [line for line in front if "txn.route" in line.split(" if ")[0]]
    assert routes == [f"http-request set-var(txn.route) str({p}) if {{ method {m} }} {{ path -m str {p} }}"
                      for m, p in names.GATEWAY_ROUTES]
    assert [line for line in front if "set-var(txn.who)" in line] == [
        f"http-request set-var(txn.who) http_auth_bearer,sha2(256),hex,lower,map({names.gateway_map(names.GATEWAY_KEYS)}) "
        "if !door_health"]
    assert not [line for line in lines if "unset-var" in line or "set-var(txn.route)" in line and line not in routes]
    # the engine's key only in backend engine: its health check and the header set on what reaches it
    keyed = [line for line in lines if "DSV41_ENGINE_KEY" in line]
    assert keyed and set(keyed) <= set(engine) and len(keyed) == 2
    assert [line for line in lines if "set-header Authorization" in line or "add-header Authorization" in line] == [
        'http-request set-header Authorization "Bearer ${DSV41_ENGINE_KEY}"']
    assert [line for line in lines if line.startswith("server ")] == [
        f"server r0 127.0.0.1:{door.cfg.engine_port} check inter 2s fall 2 rise 1"]
    assert not [line for line in sections["backend per_key"] if not line.startswith("stick-table")]
    services = [line for line in front if "use-service" in line]
    assert services == [f"http-request use-service prometheus-exporter if METH_GET {{ path {names.GATEWAY_METRICS_PATH} }}"]
    # what is refused before any backend is chosen: odd targets (400), unlisted routes (404), no matched key (401)
    assert "acl odd_path path_sub % // /. \\\\" in front and "acl path_target url_beg /" in front
    refusals = {line.split()[3]: line.split(" if ")[-1] for line in front if line.startswith("http-request return status 4")}
    assert refusals == {"400": "!path_target || odd_path || METH_OPTIONS",
                        "404": "!{ var(txn.route) -m found } !door_health || door_health !METH_GET",
                        "401": "!door_health !{ var(txn.who) -m found }"}
    copy = names.state_path(door.cfg.state_dir, names.GATEWAY_CONFIG + ".check")      # as launch checks it
    with open(copy, "w") as f:
        f.write(commands.check_copy(text, door.cfg.port))
    r = subprocess.run(["haproxy", "-c", "-f", copy], env={**os.environ, "DSV41_ENGINE_KEY": "x"}, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr
