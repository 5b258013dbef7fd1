"""Hostile requests at the door (dsv41-gateway, units/dsv41-gateway.cfg.j2) from a client without a valid key:
a hand-written corpus, a seeded random generator on top, a sender over raw sockets and a judge.

Standard library only: the lab pipes this file into `python3 -` on a node that has nothing else.

    python3 door_corpus.py HOST PORT [--seed N] [--count N] [--workers N] [--timeout S]

tries every corpus entry and COUNT random requests on HOST:PORT with the key in the environment's DOOR_KEY
(unset or empty: no key) and prints one JSON line: the answers counted by status, every entry judged a model
answer and every answer outside the allowed ones (names, statuses, their first 200 bytes), the corpus's size.
The key is never printed. Exit 0 when nothing got through, 1 otherwise.

The corpus is written from the code on both sides of the door:
- HAProxy matches the raw target: `path` is the target up to `?`, absolute-form targets (`http://h/p`, an
  HTTP/2 request with :authority) have a `url` not starting with `/`; it frames bodies itself (it refuses
  what it cannot frame, and never forwards both Content-Length and Transfer-Encoding).
- uvicorn (h11 or httptools) percent-decodes the path before routing (`/%761/...` is `/v1/...`); httptools
  takes the path out of an absolute-form target; Starlette matches decoded paths exactly, redirects a
  trailing slash, and mounts /metrics as a prefix.
- vLLM 0.32's server checks its own --api-key only when the decoded path starts with /v1, /v2, /inference
  or /cohere, and never for OPTIONS (vllm/entrypoints/serve/middleware/authenticate.py); every other route
  (/invocations, /tokenize, /pooling, /sleep, /collective_rpc, ...) is open to whoever reaches it.

Each entry has a name, its raw bytes (a request or several, sent as one write) holding placeholders for the
client's key, and whether it addresses the door's own routes (GET /health, GET /gateway/metrics), whose 200 is
the door's answer and no model's. The key's placeholders: KEY is the key itself, KEY_B64 the base64 of
`dsv41:<key>` (Basic auth). Without a key a header line holding a placeholder is left out, and a placeholder
elsewhere (a query string) is left empty.

What counts as a model answer (judge()): any 2xx or 3xx but the door's own answer to its two routes, or any
answer whose bytes hold what only the engine says: `"choices"`, a listing (`"object":"list"`, `"data":[`),
tokenizer output (`"tokens"`, `"count"`), its version or server info, its metrics. Allowed answers: 400, 401,
404, 405, 408, 413, 414, 431, 501, 503, HAProxy's own 422 page and a closed connection; anything else (a 403, 422 or 500 of the engine, a
502 of the door) is `unexpected`: it says a request reached, or was sent towards, the engine."""
import base64
import collections
import concurrent.futures
import json
import os
import random
import re
import socket
import sys
import time

KEY = b"@KEY@"
KEY_B64 = b"@KEYB64@"
ALLOWED = frozenset({400, 401, 404, 405, 408, 413, 414, 431, 501, 503})
DOOR_ROUTES = (("GET", "/health"), ("GET", "/gateway/metrics"))
LISTED = (("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("GET", "/v1/models"),
          ("POST", "/tokenize"))                       # names.GATEWAY_ROUTES (this file imports nothing of dsv41)
MODEL_MARKERS = re.compile(rb'"choices"\s*:|"object"\s*:\s*"list"|"data"\s*:\s*\[|"tokens"\s*:|"count"\s*:'
                           rb'|"version"\s*:|"vllm_config"|"model_config"|"max_model_len"|"is_sleeping"|"is_paused"'
                           rb'|"world_size"|"openapi"\s*:|\bvllm:[a-z_]+|swagger-ui|"stand_in"')
BODY = b'{"model":"deepseek-v4.1-flash","messages":[{"role":"user","content":"Say hi."}],"prompt":"Say hi.","max_tokens":1}'

Entry = collections.namedtuple("Entry", "name raw door_own")

# ---- vLLM 0.32's routes (vllm/entrypoints/**/api_router.py, serve/instrumentator, sagemaker, rl, scale_out) ----
# (method, path): the real paths, with a placeholder id where the route takes one. Older releases' names too.
VLLM_ROUTES = (
    ("GET", "/health"), ("GET", "/ping"), ("POST", "/ping"), ("GET", "/load"), ("GET", "/version"),
    ("GET", "/metrics"), ("GET", "/metrics/"), ("GET", "/metricsx"), ("GET", "/kv_event_sources"),
    ("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/docs/oauth2-redirect"), ("GET", "/redoc"),
    ("GET", "/static/swagger-ui.css"), ("GET", "/server_info"), ("GET", "/is_sleeping"), ("GET", "/is_paused"),
    ("GET", "/weight_info"), ("GET", "/get_world_size"), ("GET", "/tokenizer_info"), ("GET", "/get_tokenizer_info"),
    ("GET", "/fault_tolerance/status"), ("GET", "/v1/models"), ("GET", "/v1/models/deepseek-v4.1-flash"),
    ("GET", "/v1/responses/resp_1"), ("GET", "/v1/realtime"), ("GET", "/ready"), ("GET", "/readyz"),
    ("POST", "/invocations"), ("POST", "/v1/chat/completions"), ("POST", "/v1/chat/completions/batch"),
    ("POST", "/v1/completions"), ("POST", "/v1/responses"), ("POST", "/v1/responses/resp_1/cancel"),
    ("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens"), ("POST", "/tokenize"), ("POST", "/detokenize"),
    ("POST", "/pooling"), ("POST", "/classify"), ("POST", "/score"), ("POST", "/v1/score"), ("POST", "/rerank"),
    ("POST", "/v1/rerank"), ("POST", "/v2/rerank"), ("POST", "/v1/embeddings"), ("POST", "/v2/embed"),
    ("POST", "/v1/audio/transcriptions"), ("POST", "/v1/audio/translations"), ("POST", "/v1/load_lora_adapter"),
    ("POST", "/v1/unload_lora_adapter"), ("POST", "/scale_elastic_ep"), ("POST", "/is_scaling_elastic_ep"),
    ("POST", "/reset_prefix_cache"), ("POST", "/reset_mm_cache"), ("POST", "/reset_encoder_cache"),
    ("POST", "/collective_rpc"), ("POST", "/sleep"), ("POST", "/wake_up"), ("POST", "/release_kv_cache_memory"),
    ("POST", "/start_profile"), ("POST", "/stop_profile"), ("POST", "/pause"), ("POST", "/resume"),
    ("POST", "/abort_requests"), ("POST", "/init_weight_transfer_engine"), ("POST", "/shutdown_weight_transfer_engine"),
    ("POST", "/start_weight_update"), ("POST", "/start_draft_weight_update"), ("POST", "/update_weights"),
    ("POST", "/finish_weight_update"), ("POST", "/update_weight_version"), ("POST", "/weight_checker"),
    ("POST", "/update_weights_from_disk"), ("POST", "/fault_tolerance/apply"), ("POST", "/generative_scoring"),
    ("POST", "/v1/systemone"), ("POST", "/cohere/v2/chat"), ("POST", "/inference/v1/generate"),
    ("POST", "/inference/v1/abort_requests"), ("POST", "/v1/chat/completions/render"),
    ("POST", "/v1/chat/completions/derender"), ("POST", "/v1/completions/render"), ("POST", "/v1/completions/derender"),
    ("POST", "/v1/messages/render"), ("POST", "/v1/responses/render"), ("POST", "/generate"), ("POST", "/v1/tokenize"),
    ("POST", "/v1/detokenize"), ("POST", "/v1/invocations"), ("POST", "/v1/pooling"), ("POST", "/v1/classify"),
)


# ---- building raw requests ------------------------------------------------------------------------------

def b(text):
    return text if isinstance(text, bytes) else text.encode("utf-8")


def request(method, target, headers=(), body=None, version=b"HTTP/1.1", host=b"door", auth=b"Bearer " + KEY,
            length=True, eol=b"\r\n"):
    """One raw request: its request line, Host (None: none), Authorization (None: none), the headers given,
    Content-Length for a body (unless length is False), the body. POST, PUT and PATCH get BODY unless told."""
    method = b(method)
    if body is None:
        body = BODY if method in (b"POST", b"PUT", b"PATCH") else b""
    lines = [b" ".join(x for x in (method, b(target), b(version)) if x)]
    if host is not None:
        lines.append(b"Host: " + b(host))
    if auth is not None:
        lines.append(b"Authorization: " + b(auth))
    lines += [b(h) for h in headers]
    if body and length:
        lines.append(b"Content-Length: %d" % len(body))
    if method in (b"POST", b"PUT", b"PATCH") and body == BODY:
        lines.append(b"Content-Type: application/json")
    return eol.join(lines) + eol + eol + b(body)


def render(raw, key):
    """The raw bytes with the key in place of its placeholders; without a key (None or empty) a header line
    holding one is left out and any other is left empty."""
    if key:
        key = b(key)
        return raw.replace(KEY_B64, base64.b64encode(b"dsv41:" + key)).replace(KEY, key)
    out = []
    for line in raw.split(b"\n"):
        if (KEY in line or KEY_B64 in line) and b":" in line.split(b" ", 1)[0]:
            continue                                      # a header line: left out
        out.append(line.replace(KEY_B64, b"").replace(KEY, b""))
    return b"\n".join(out)


def chunked(data, size=7, ext=b""):
    out = b""
    for i in range(0, len(data), size):
        piece = data[i:i + size]
        out += b"%x%s\r\n%s\r\n" % (len(piece), ext, piece)
    return out + b"0\r\n\r\n"


def h2_prior_knowledge(headers):
    """An HTTP/2 connection without TLS (prior knowledge): the preface, SETTINGS, one HEADERS frame (HPACK
    literals, no Huffman) ending the stream."""
    def literal(name, value):
        name, value = b(name), b(value)
        return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value

    def frame(kind, flags, stream, payload):
        return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload
    block = b"".join(literal(n, v) for n, v in headers)
    return b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b"") + frame(1, 0x5, 1, block)


def invocations_request(auth=None):
    """A whole second request to /invocations (SageMaker's route: no key checked by vLLM), to be smuggled."""
    return request("POST", "/invocations", host=b"127.0.0.1", auth=auth)


def encodings(path):
    """Percent-encoded and other spellings of a path that uvicorn decodes (or a router may fold) to it."""
    out = {}
    first = path[1]
    out["first letter %xx"] = "/%" + f"{ord(first):02x}" + path[2:]
    out["first letter %XX"] = "/%" + f"{ord(first):02X}" + path[2:]
    out["double-encoded first letter"] = "/%25" + f"{ord(first):02x}" + path[2:]
    out["last letter %xx"] = path[:-1] + "%" + f"{ord(path[-1]):02x}"
    if path.count("/") > 1:
        out["slashes %2f"] = "/" + path[1:].replace("/", "%2f")
        out["slashes %2F"] = "/" + path[1:].replace("/", "%2F")
    out["leading %2f"] = "%2f" + path[1:]
    out["upper case"] = path.upper()
    out["trailing slash"] = path + "/"
    out["doubled slash"] = "/" + path
    out["dot segment"] = "/." + path
    out["dot-dot segment"] = "/x/.." + path
    out["%2e%2e segment"] = "/x/%2e%2e" + path
    out["backslashes"] = path.replace("/", "\\")
    out[";params"] = path + ";x=1"
    return out


# ---- the hand-written corpus ------------------------------------------------------------------------------

def corpus():
    """[Entry]: every hand-written input, each name distinct."""
    out = []

    def add(name, raw, door_own=False):
        out.append(Entry(name, raw, door_own))

    # every route vLLM 0.32 serves, as it is, with /v1 put on or taken off, and spelt so that uvicorn decodes it
    for method, path in VLLM_ROUTES:
        add(f"{method} {path}", request(method, path), (method, path) in DOOR_ROUTES)
        other = path[3:] if path.startswith("/v1/") else "/v1" + path
        add(f"{method} {other} (/v1 toggled)", request(method, other))
        for how, spelt in encodings(path).items():
            add(f"{method} {path} as {spelt} ({how})", request(method, spelt))
    for method, path in LISTED + (("POST", "/invocations"),):
        for other in ("GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "TRACE", "OPTIONS", "PROPFIND", "get", "post",
                      "Post", "M-SEARCH", "FOO", "A" * 300):
            if other != method:
                add(f"{other[:20]} {path}", request(other, path))
        add(f"CONNECT {path}", request("CONNECT", path))

    # /v1 and the listed routes spelt every way the brief of the door names, by hand
    spellings = {
        "/%761/chat/completions": "%76 for v", "/%561/chat/completions": "%56 for V", "/v%31/chat/completions": "%31 for 1",
        "/%76%31/chat/completions": "both letters", "/%2576%31/chat/completions": "double-encoded v",
        "/%25761/chat/completions": "double-encoded v, 1 plain", "/%2f%76%31%2fchat%2fcompletions": "all slashes and v1",
        "/v1%2fchat%2fcompletions": "%2f slashes", "/v1%2Fchat%2Fcompletions": "%2F slashes",
        "/v1/chat%2fcompletions": "one %2f", "%2fv1/chat/completions": "leading %2f", "/v1/ch%61t/completions": "%61 a",
        "/v1/chat/completion%73": "%73 s", "/v1/chat/completions%00": "%00 after", "/v1/chat/completions%20": "%20 after",
        "/v1/chat/completions%2f": "%2f after", "/v1/chat/completions%3f": "%3f after", "/v1/chat/completions%23": "%23 after",
        "/v1/./chat/completions": "dot segment", "/./v1/chat/completions": "leading dot segment",
        "/x/../v1/chat/completions": "dot-dot", "/v1/x/../chat/completions": "inner dot-dot",
        "/%2e%2e/v1/chat/completions": "%2e%2e", "/%2E/v1/chat/completions": "%2E", "/v1/chat/completions/.": "trailing dot",
        "/v1/chat/completions/..": "trailing dot-dot", "/v1/chat/completions/": "trailing slash",
        "//v1/chat/completions": "doubled leading slash", "/v1//chat/completions": "doubled slash",
        "/v1/chat//completions": "doubled inner slash", "\\v1\\chat\\completions": "backslashes",
        "/v1\\chat/completions": "one backslash", "/v1/chat/completions\\": "trailing backslash",
        "/V1/chat/completions": "V1", "/v1/Chat/Completions": "capitals", "/V1/CHAT/COMPLETIONS": "upper case",
        "/v1/chat/completions;x=1": ";params", "/v1;x/chat/completions": ";params in a segment",
        "/v1/chat/completions?": "empty query", "/v1/chat/completions#": "fragment",
        "/v1/chat/completions#/../../invocations": "fragment hiding a dot-dot", "/v1/chat/compl\u0435tions": "cyrillic e",
        "/v1/chat/completions\uff0f": "fullwidth slash", "/v1/chat/completions%ef%bc%8f": "fullwidth slash encoded",
        "/v1/chat/completions%": "lone %", "/v1/chat/completions%zz": "bad %zz", "/v1/chat/completions%c0%af": "overlong slash",
        "/v1/chat/completions\x00": "NUL byte", "/v1/chat/completions\t": "tab", "/v1/chat/completions\x7f": "DEL byte",
        "/%69nvocations": "%69 i", "/%49nvocations": "%49 I", "/invocation%73": "%73 s", "/./invocations": "dot",
        "/v1/../invocations": "dot-dot from /v1", "/v1/%2e%2e/invocations": "encoded dot-dot from /v1",
        "/v1/models/../../invocations": "dot-dot from a listed route", "/tokenize/../invocations": "dot-dot from /tokenize",
        "/v1/models%2f..%2f..%2finvocations": "encoded dot-dot from a listed route", "//invocations": "doubled slash",
        "/invocations/": "trailing slash", "/INVOCATIONS": "upper case", "/invocations;x": ";params",
        "/v1/models?../../invocations": "query holding a dot-dot", "/%76%31/models": "v1 encoded (models)",
        "/v1/model%73": "models encoded", "/v1/models/": "models, trailing slash", "/v1//models": "models, doubled slash",
        "/v1/./models": "models, dot", "/x/../v1/models": "models, dot-dot", "/V1/models": "models, V1",
        "/v1/Models": "Models", "/%74okenize": "tokenize encoded", "/tokenize/": "tokenize, trailing slash",
        "/Tokenize": "Tokenize", "/v1/tokenize": "tokenize under /v1", "/tokenize;x": "tokenize ;params",
    }
    for method in ("POST", "GET"):
        for target, how in spellings.items():
            add(f"{method} {target!r} ({how})", request(method, target))

    # targets that are not a path
    for target, host in (("http://evil/v1/models", "evil"), ("http://evil/v1/models", "door"),
                         ("http://door/v1/models", "door"), ("http://127.0.0.1:8000/invocations", "127.0.0.1:8000"),
                         ("http://127.0.0.1:8000/invocations", "evil"), ("http://127.0.0.1:18000/invocations", "127.0.0.1:18000"),
                         ("https://door/v1/chat/completions", "door"), ("HTTP://door/invocations", "door"),
                         ("http://door/%761/chat/completions", "door"), ("http://door", "door"), ("http://door?x", "door"),
                         ("//evil/v1/models", "evil"), ("door/v1/models", "door"), ("v1/models", "door"),
                         ("invocations", "door"), ("*", "door"), ("http://door/health", "door")):
        for method in ("GET", "POST"):
            add(f"{method} {target} Host {host}", request(method, target, host=host))
    add("OPTIONS *", request("OPTIONS", "*"))
    add("OPTIONS * no Host", request("OPTIONS", "*", host=None))
    add("CONNECT to the engine's port", request("CONNECT", "127.0.0.1:18000", host=b"127.0.0.1:18000"))
    add("CONNECT to the door", request("CONNECT", "door:8000", host=b"door:8000"))
    add("CONNECT absolute", request("CONNECT", "http://127.0.0.1:18000/invocations"))

    # Host
    for name, hosts in (("no Host", None), ("empty Host", [b""]), ("Host with port", [b"door:8000"]),
                        ("Host of the engine", [b"127.0.0.1:18000"]), ("evil Host", [b"evil.example"]),
                        ("two Hosts", [b"door", b"evil"]), ("two equal Hosts", [b"door", b"door"]),
                        ("Host with a path", [b"door/invocations"]), ("Host with a space", [b"door x"]),
                        ("Host with userinfo", [b"user@door"])):
        for method, path in (("POST", "/invocations"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions")):
            extra = [b"Host: " + h for h in hosts[1:]] if hosts else []
            add(f"{method} {path} {name}", request(method, path, host=hosts[0] if hosts else None, headers=extra))
    add("HTTP/1.0 no Host /invocations", request("POST", "/invocations", host=None, version=b"HTTP/1.0"))

    # versions and request lines
    for version in (b"HTTP/1.0", b"HTTP/1.2", b"HTTP/2.0", b"HTTP/9.9", b"http/1.1", b"HTTP/1.1 x", b"HTTP/01.1",
                    b"HTTP/1.1\x00", b""):
        for method, path in (("POST", "/invocations"), ("GET", "/v1/models")):
            add(f"{method} {path} {version!r}", request(method, path, version=version))
    for path in ("/invocations", "/v1/models", "/health"):
        add(f"HTTP/0.9 GET {path}", b"GET " + b(path) + b"\r\n")
        add(f"HTTP/0.9 GET {path} LF", b"GET " + b(path) + b"\n\n")
    add("LF line ends", request("POST", "/invocations", eol=b"\n"))
    add("bare CR line ends", request("POST", "/invocations", eol=b"\r"))
    add("two spaces in the request line", b"POST  /invocations  HTTP/1.1\r\nHost: door\r\n\r\n")
    add("tab in the request line", b"POST\t/invocations\tHTTP/1.1\r\nHost: door\r\n\r\n")
    add("leading CRLF", b"\r\n\r\n" + request("POST", "/invocations"))
    add("space in the target", request("GET", "/v1/models /invocations"))
    add("HTTP/1.0 keep-alive pipelined", request("GET", "/health", version=b"HTTP/1.0", headers=[b"Connection: keep-alive"])
        + request("POST", "/invocations", version=b"HTTP/1.0"), door_own=True)

    # Content-Length with Transfer-Encoding, obfuscated chunked, smuggled second requests
    smuggled = invocations_request()
    for path in ("/invocations", "/v1/chat/completions", "/v1/models", "/health"):
        body = chunked(BODY)
        for name, headers, data in (
                ("CL then TE", [b"Content-Length: 4", b"Transfer-Encoding: chunked"], body + smuggled),
                ("TE then CL", [b"Transfer-Encoding: chunked", b"Content-Length: 4"], body + smuggled),
                ("CL covers a smuggled request, TE chunked", [b"Content-Length: %d" % len(b"0\r\n\r\n" + smuggled),
                                                             b"Transfer-Encoding: chunked"], b"0\r\n\r\n" + smuggled),
                ("xchunked", [b"Transfer-Encoding: xchunked", b"Content-Length: 4"], body + smuggled),
                ("leading space chunked", [b"Transfer-Encoding:  chunked", b"Content-Length: 4"], body + smuggled),
                ("tab chunked", [b"Transfer-Encoding:\tchunked", b"Content-Length: 4"], body + smuggled),
                ("chunked trailing space", [b"Transfer-Encoding: chunked ", b"Content-Length: 4"], body + smuggled),
                ("Chunked", [b"Transfer-Encoding: Chunked"], body + smuggled),
                ("chunked, identity", [b"Transfer-Encoding: chunked, identity"], body + smuggled),
                ("identity, chunked", [b"Transfer-Encoding: identity, chunked", b"Content-Length: 4"], body + smuggled),
                ("gzip, chunked", [b"Transfer-Encoding: gzip, chunked"], body + smuggled),
                ("two TE", [b"Transfer-Encoding: chunked", b"Transfer-Encoding: identity"], body + smuggled),
                ("space before colon", [b"Transfer-Encoding : chunked", b"Content-Length: 4"], body + smuggled),
                ("folded TE", [b"Transfer-Encoding:", b" chunked", b"Content-Length: 4"], body + smuggled),
                ("vertical tab TE", [b"Transfer-Encoding:\x0bchunked", b"Content-Length: 4"], body + smuggled),
                ("TE underscore", [b"Transfer_Encoding: chunked", b"Content-Length: 4"], body + smuggled),
                ("TE with NUL", [b"Transfer-Encoding: chunked\x00", b"Content-Length: 4"], body + smuggled),
                ("two CL different", [b"Content-Length: 4", b"Content-Length: %d" % (4 + len(smuggled))],
                 b"abcd" + smuggled),
                ("two CL different reversed", [b"Content-Length: %d" % (4 + len(smuggled)), b"Content-Length: 4"],
                 b"abcd" + smuggled),
                ("CL list", [b"Content-Length: 4, %d" % (4 + len(smuggled))], b"abcd" + smuggled),
                ("CL +4", [b"Content-Length: +4"], b"abcd" + smuggled),
                ("CL -1", [b"Content-Length: -1"], b"abcd" + smuggled),
                ("CL hex", [b"Content-Length: 0x4"], b"abcd" + smuggled),
                ("CL spaces", [b"Content-Length:  4 "], b"abcd" + smuggled),
                ("CL huge", [b"Content-Length: 99999999999999999999999"], b"abcd" + smuggled),
                ("CL 0 then a request", [b"Content-Length: 0"], smuggled),
                ("CL covers a request", [b"Content-Length: %d" % len(smuggled)], smuggled),
                ("chunk extension", [b"Transfer-Encoding: chunked"], chunked(BODY, ext=b";x=\"a\r\nb\"") + smuggled),
                ("chunk size overflow", [b"Transfer-Encoding: chunked"], b"ffffffffffffffff5\r\nabcde\r\n0\r\n\r\n" + smuggled),
                ("chunk size with spaces", [b"Transfer-Encoding: chunked"], b"5 \r\nabcde\r\n0\r\n\r\n" + smuggled),
                ("chunk LF only", [b"Transfer-Encoding: chunked"], b"5\nabcde\n0\n\n" + smuggled),
                ("chunked trailer with a key", [b"Transfer-Encoding: chunked"],
                 b"5\r\nabcde\r\n0\r\nAuthorization: Bearer x\r\n\r\n" + smuggled),
                ("Expect 100-continue", [b"Expect: 100-continue", b"Content-Length: %d" % len(smuggled)], smuggled),
        ):
            add(f"POST {path} {name}", request("POST", path, headers=headers, body=data, length=False), path == "/health")
    for first, own in ((request("GET", "/health"), True), (request("POST", "/v1/models"), False),
                       (request("GET", "/v1/models"), False), (request("POST", "/v1/chat/completions"), False),
                       (request("GET", "/gateway/metrics"), True), (request("GET", "/nowhere"), False)):
        name = first.split(b" HTTP")[0].decode()
        add(f"pipelined {name} then /invocations", first + smuggled, own)
        add(f"pipelined {name} then /%761/chat/completions", first + request("POST", "/%761/chat/completions"), own)
        add(f"pipelined {name} then GET /v1/models", first + request("GET", "/v1/models"), own)
    add("GET /health with a body holding /invocations", request("GET", "/health", body=smuggled), True)
    add("GET /health CL covering /invocations", request("GET", "/health", headers=[b"Content-Length: %d" % len(smuggled)],
                                                        body=smuggled, length=False), True)
    add("a refused request's body holds a keyed request",          # no placeholder in a body: its length is fixed
        request("POST", "/v1/models", body=request("POST", "/invocations", auth=b"Bearer a-guessed-key")))
    add("upgrade websocket /v1/realtime", request("GET", "/v1/realtime", headers=[
        b"Connection: Upgrade", b"Upgrade: websocket", b"Sec-WebSocket-Version: 13",
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="]))
    add("upgrade websocket /v1/models", request("GET", "/v1/models", headers=[
        b"Connection: Upgrade", b"Upgrade: websocket", b"Sec-WebSocket-Version: 13",
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="]))
    add("upgrade h2c /v1/models", request("GET", "/v1/models", headers=[
        b"Connection: Upgrade, HTTP2-Settings", b"Upgrade: h2c", b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA"]))
    add("upgrade h2c /invocations", request("POST", "/invocations", headers=[
        b"Connection: Upgrade, HTTP2-Settings", b"Upgrade: h2c", b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA"]))
    for path in ("/v1/models", "/invocations", "/%761/models", "/health"):
        for method in ("GET", "POST"):
            add(f"h2 prior knowledge {method} {path}",
                h2_prior_knowledge([(":method", method), (":scheme", "http"), (":path", path)]), path == "/health")
            add(f"h2 prior knowledge {method} {path} with :authority",
                h2_prior_knowledge([(":method", method), (":scheme", "http"), (":path", path), (":authority", "door")]),
                path == "/health")
    add("h2 prior knowledge * path", h2_prior_knowledge([(":method", "OPTIONS"), (":scheme", "http"), (":path", "*")]))
    add("h2 prior knowledge CONNECT", h2_prior_knowledge([(":method", "CONNECT"), (":authority", "127.0.0.1:18000")]))

    # oversized
    add("header of 20 kB", request("POST", "/invocations", headers=[b"X-Pad: " + b"a" * 20000]))
    add("header of 70 kB", request("POST", "/v1/chat/completions", headers=[b"X-Pad: " + b"a" * 70000]))
    add("300 headers", request("POST", "/invocations", headers=[b"X-H%d: v" % i for i in range(300)]))
    add("target of 20 kB", request("POST", "/invocations?" + "a" * 20000))
    add("target of 70 kB", request("GET", "/v1/models/" + "a" * 70000))
    add("body of 2 MB to /invocations", request("POST", "/invocations", body=b"{" + b" " * (2 << 20) + b"}"))
    add("body of 2 MB to /v1/chat/completions",
        request("POST", "/v1/chat/completions", body=b"{" + b" " * (2 << 20) + b"}"))
    add("Content-Length of 10 GB, 1 kB sent", request("POST", "/invocations", headers=[b"Content-Length: 10000000000"],
                                                      body=b"a" * 1024, length=False))

    # the key where the door does not look for it, or spelt otherwise
    for method, path in LISTED + (("POST", "/invocations"),):
        for name, auth, headers, target in (
                ("lower-case bearer", b"bearer " + KEY, [], path), ("upper-case BEARER", b"BEARER " + KEY, [], path),
                ("two spaces", b"Bearer  " + KEY, [], path), ("tab", b"Bearer\t" + KEY, [], path),
                ("trailing space", b"Bearer " + KEY + b" ", [], path), ("no scheme", KEY, [], path),
                ("Token", b"Token " + KEY, [], path), ("Basic", b"Basic " + KEY_B64, [], path),
                ("Bearer quoted", b'Bearer "' + KEY + b'"', [], path), ("Bearer, comma", b"Bearer " + KEY + b",", [], path),
                ("Bearer then another key", b"Bearer " + KEY + b" Bearer x", [], path),
                ("two Authorization, key last", b"Bearer wrong", [b"Authorization: Bearer " + KEY], path),
                ("two Authorization, key first", b"Bearer " + KEY, [b"Authorization: Bearer wrong"], path),
                ("X-Api-Key", None, [b"X-Api-Key: " + KEY], path), ("Api-Key", None, [b"Api-Key: " + KEY], path),
                ("Proxy-Authorization", None, [b"Proxy-Authorization: Bearer " + KEY], path),
                ("?api_key=", None, [], path + "?api_key=@KEY@"), ("?key=", None, [], path + "?key=@KEY@"),
                ("?access_token=", None, [], path + "?access_token=@KEY@"), ("cookie", None, [b"Cookie: key=" + KEY], path),
                ("no Authorization", None, [], path), ("empty Bearer", b"Bearer ", [], path),
                ("empty Authorization", b"", [], path)):
            add(f"{method} {path} key: {name}", request(method, target, auth=auth, headers=headers))

    # the door's own routes and their neighbours
    for method, target in (("GET", "/health"), ("HEAD", "/health"), ("GET", "/gateway/metrics"),
                           ("HEAD", "/gateway/metrics"), ("GET", "/health?x=1"), ("GET", "/gateway/metrics?scope=*")):
        add(f"door {method} {target}", request(method, target), True)
        add(f"door {method} {target} no key", request(method, target, auth=None), True)
    for method, target in (("POST", "/health"), ("PUT", "/health"), ("DELETE", "/health"), ("OPTIONS", "/health"),
                           ("GET", "/health/"), ("GET", "/Health"), ("GET", "/healthz"), ("POST", "/gateway/metrics"),
                           ("GET", "/gateway/metrics/"), ("GET", "/gateway"), ("GET", "/gateway/"), ("GET", "/stats"),
                           ("GET", "/haproxy?stats"), ("GET", "/"), ("GET", ""), ("POST", "/"), ("GET", "/favicon.ico")):
        add(f"door neighbour {method} {target!r}", request(method, target))
    names = [e.name for e in out]
    assert len(names) == len(set(names)), [n for n, c in collections.Counter(names).items() if c > 1]
    return out


# ---- the random part --------------------------------------------------------------------------------------

PIECES = ("/", "/", "/", "v1", "V1", "v2", "%76", "%56", "%31", "%2f", "%2F", "%5c", ".", "..", "%2e", "\\", "chat",
          "completions", "invocations", "models", "tokenize", "detokenize", "health", "gateway", "metrics", "sleep",
          "collective_rpc", "pooling", "score", "version", ";", ";x=1", "?", "?api_key=@KEY@", "#", "//", "%00", "%25",
          "%", "~", "\u0435", "\uff0f", "\u00e9", "%c0%af", "Chat", "Models", " ", "\t", "*", "http://", "door", ":8000")
METHODS = ("GET", "POST", "POST", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT", "get",
           "PRI", "FOO", "")
AUTHS = (b"Bearer " + KEY, b"bearer " + KEY, b"Bearer  " + KEY, b"Basic " + KEY_B64, KEY, b"Bearer ", b"Bearer x",
         None, None)
HOSTS = (b"door", b"door:8000", b"127.0.0.1:18000", b"evil", b"", None)


def random_path(rng):
    path = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 8)))
    return path if rng.random() < 0.15 else "/" + path.lstrip("/") if rng.random() < 0.5 else path


def random_entries(seed, count):
    """count Entries from random.Random(seed): random paths, methods, Authorization, Host, Content-Length and
    Transfer-Encoding, sometimes a second request (to /invocations or a random one) after the first."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        method = rng.choice(METHODS)
        headers = []
        if rng.random() < 0.3:
            headers.append(rng.choice([b"X-Api-Key: " + KEY, b"Authorization: Bearer x", b"Connection: close",
                                       b"Connection: keep-alive", b"Expect: 100-continue", b"Upgrade: websocket",
                                       b"X-Forwarded-For: 127.0.0.1", b"X-Original-URL: /invocations",
                                       b"X-Rewrite-URL: /invocations", b"X-HTTP-Method-Override: POST"]))
        body, length = None, True
        framing = rng.random()
        if framing < 0.15:
            headers += [b"Transfer-Encoding: " + rng.choice([b"chunked", b"xchunked", b" chunked", b"chunked, identity"])]
            body, length = chunked(BODY), rng.random() < 0.5
        elif framing < 0.25:
            body, length = BODY, False
            headers.append(b"Content-Length: %d" % rng.choice([0, 4, len(BODY), len(BODY) + 5]))
        raw = request(method, random_path(rng), headers=headers, body=body, length=length,
                      host=rng.choice(HOSTS), auth=rng.choice(AUTHS),
                      version=rng.choice([b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0", b""]))
        if rng.random() < 0.15:
            raw += invocations_request() if rng.random() < 0.5 else request(rng.choice(METHODS), random_path(rng))
        out.append(Entry(f"random {seed}/{i}", raw, True))
    return out


# ---- sending and judging ----------------------------------------------------------------------------------

def send(host, port, raw, timeout=5.0):
    """raw on a new connection (one write, then our side closed for writing), the whole answer read until the
    other side closes or timeout -> (bytes received, None or what went wrong)."""
    data, err = b"", None
    try:
        s = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        return b"", f"connect: {e}"
    deadline = time.monotonic() + timeout
    with s:
        try:
            s.sendall(raw)
            s.shutdown(socket.SHUT_WR)
        except OSError as e:
            err = f"send: {type(e).__name__}"
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                err = err or "timeout"
                break
            s.settimeout(left)
            try:
                got = s.recv(65536)
            except socket.timeout:
                err = err or "timeout"
                break
            except OSError as e:
                err = err or f"recv: {type(e).__name__}"
                break
            if not got:
                break
            data += got
    return data, err


Answer = collections.namedtuple("Answer", "status headers body")


def parse_h1(data):
    """[Answer] of HTTP/1.x answers one after another (interim 1xx included); a body without its length runs to
    the end; a header-only answer (to HEAD) is noticed when the next answer's status line comes where its body
    would."""
    out, pos = [], 0
    while pos < len(data):
        m = re.compile(rb"HTTP/\d\.\d (\d{3})[^\r\n]*\r?\n").match(data, pos)
        if not m:
            break
        end = data.find(b"\r\n\r\n", m.end() - 2)
        if end < 0:
            out.append(Answer(int(m.group(1)), {}, b""))
            break
        headers = {}
        for line in data[m.end():end].split(b"\r\n"):
            k, _, v = line.partition(b":")
            headers[k.strip().lower().decode("latin-1")] = v.strip().decode("latin-1")
        pos = end + 4
        status = int(m.group(1))
        if 100 <= status < 200 or status in (204, 304):
            body = b""
        elif "content-length" in headers and headers["content-length"].isdigit():
            n = int(headers["content-length"])
            if re.compile(rb"HTTP/\d\.\d \d{3} ").match(data, pos) and data[pos:pos + n].count(b"\r\n\r\n"):
                n = 0                                     # an answer to HEAD: no body
            body = data[pos:pos + n]
            pos += n
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            body = b""
            while True:
                line_end = data.find(b"\r\n", pos)
                if line_end < 0:
                    pos = len(data)
                    break
                try:
                    n = int(data[pos:line_end].split(b";")[0], 16)
                except ValueError:
                    pos = len(data)
                    break
                body += data[line_end + 2:line_end + 2 + n]
                pos = line_end + 2 + n + 2
                if n == 0:
                    break
        else:
            body, pos = data[pos:], len(data)
        out.append(Answer(status, headers, body))
    return out


H2_STATIC_STATUS = {8: 200, 9: 204, 10: 206, 11: 304, 12: 400, 13: 404, 14: 500}


def parse_h2(data):
    """[Answer] of an HTTP/2 connection's HEADERS frames (the :status of each; no Huffman-coded literal is
    expected from HAProxy: one would be status 0), DATA frames' payload as the body of the last."""
    out, pos = [], 0
    while pos + 9 <= len(data):
        n, kind = int.from_bytes(data[pos:pos + 3], "big"), data[pos + 3]
        payload = data[pos + 9:pos + 9 + n]
        pos += 9 + n
        if kind == 1 and payload:
            if data[pos - 9 - n + 4] & 0x8:                   # PADDED
                payload = payload[1:len(payload) - payload[0]]
            if data[pos - 9 - n + 4] & 0x20:                  # PRIORITY
                payload = payload[5:]
            first, status = payload[0], 0
            if first & 0x80:
                status = H2_STATIC_STATUS.get(first & 0x7F, 0)
            elif (first & 0xC0 == 0x40 and first & 0x3F == 8) or (first & 0xE0 in (0x00, 0x10) and first & 0x0F == 8):
                size = payload[1]
                if not size & 0x80 and payload[2:2 + size].isdigit():
                    status = int(payload[2:2 + size])
            out.append(Answer(status, {}, b""))
        elif kind == 0 and out:
            out[-1] = out[-1]._replace(body=out[-1].body + payload)
    return out


def parse(raw, data):
    return parse_h2(data) if raw.startswith(b"PRI * HTTP/2.0") else parse_h1(data)


def door_answer(answer):
    """The door's own 200: its /health JSON (or its head alone, to HEAD) or HAProxy's Prometheus exporter."""
    ctype = answer.headers.get("content-type", "")
    if answer.body == b'{"status":"ok"}' or (not answer.body and answer.headers.get("content-length") == "15"
                                            and ctype == "application/json"):
        return True
    return answer.body.startswith(b"# HELP haproxy_") or (not answer.body and ctype.startswith("text/plain; version=0.0.4")
                                                         and "content-length" not in answer.headers)


def haproxy_page(answer):
    """HAProxy's own 422 page: it refuses a Transfer-Encoding list it cannot frame (`identity, chunked`) so."""
    return answer.status == 422 and answer.body.startswith(b"<html><body><h1>422 ")


def judge(entry, data, err=None):
    """-> (verdict, [statuses]): "model" (an answer only the engine gives, or a 2xx/3xx that is not the door's
    own on an entry addressing it), "unexpected" (a status outside ALLOWED), "door" (the door's own 200),
    "refused" (allowed statuses only) or "closed" (no answer at all)."""
    answers = [a for a in parse(entry.raw, data) if not 100 <= a.status < 200]
    statuses = [a.status for a in answers]
    if MODEL_MARKERS.search(data) or any(200 <= a.status < 400 and not (entry.door_own and door_answer(a))
                                         for a in answers):
        return "model", statuses
    if any(a.status not in ALLOWED and not 200 <= a.status < 300 and not haproxy_page(a) for a in answers):
        return "unexpected", statuses
    if not answers:
        return ("closed" if not data or err else "unexpected"), statuses
    return ("door" if any(200 <= s < 300 for s in statuses) else "refused"), statuses


def run(host, port, entries, key=None, workers=8, timeout=5.0):
    """Every entry sent with key (None: without one) and judged -> [(entry, verdict, statuses, data, err)]."""
    def one(entry):
        data, err = send(host, port, render(entry.raw, key), timeout)
        return (entry, *judge(entry, data, err), data, err)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, entries))


def redact(data, key):
    text = data[:200]
    if key:
        text = text.replace(b(key), b"<key>")
    return text.decode("latin-1")


def summary(results, key=None, corpus_size=None):
    """What main() prints: the answers counted by status (a closed connection as "closed", HTTP/2 answers as
    "h2 <status>"), the verdicts counted, the entries judged a model answer and the unexpected ones."""
    by_status, verdicts, model, unexpected = collections.Counter(), collections.Counter(), [], []
    for entry, verdict, statuses, data, err in results:
        verdicts[verdict] += 1
        h2 = "h2 " if entry.raw.startswith(b"PRI * HTTP/2.0") else ""
        for s in statuses or ["closed"]:
            by_status[f"{h2}{s}"] += 1
        item = {"name": entry.name, "statuses": statuses, "error": err, "head": redact(data, key)}
        if verdict == "model":
            model.append(item)
        elif verdict == "unexpected":
            unexpected.append(item)
    return {"corpus": corpus_size, "sent": len(results), "statuses": dict(sorted(by_status.items())),
            "verdicts": dict(sorted(verdicts.items())), "model_answers": model, "unexpected": unexpected}


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("--seed", type=int, default=41)
    p.add_argument("--count", type=int, default=300, help="random requests after the corpus")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--timeout", type=float, default=5.0)
    args = p.parse_args(argv)
    key = os.environ.get("DOOR_KEY") or None
    hand = corpus()
    t0 = time.monotonic()
    results = run(args.host, args.port, hand + random_entries(args.seed, args.count), key, args.workers, args.timeout)
    out = {"target": f"{args.host}:{args.port}", "key": "given" if key else "none", "seed": args.seed,
           "random": args.count, **summary(results, key, len(hand)), "took_s": round(time.monotonic() - t0, 1)}
    print(json.dumps(out))
    return 1 if out["model_answers"] or out["unexpected"] else 0


if __name__ == "__main__":
    sys.exit(main())
