#!/usr/bin/env python3
"""STAND-IN for the real dsv41 serving image (vLLM on GB10 GPUs), used only by the two-node lab.

It has no GPU and no model. It accepts the argv and environment the rank units pass to real vLLM,
checks what real vLLM would fail on (/model mounted, ST_EXL3_PLAN readable), keeps the rank contract
(rank 0 waits for --nnodes ranks on --master-addr:--master-port, then serves the OpenAI API; headless
ranks exit 0 when rank 0 goes away) and answers a few prompt kinds by rule so smoke tests can pass:
arithmetic, a call of the first tool, the colours of a PNG's halves. Standard library only.
Env: VLLM_API_KEY (bearer key), LAB_ENGINE_DELAY_S (start-up delay, default 2),
LAB_ENGINE_TOKEN_S (seconds per streamed token, default 0.01).
"""
import ast
import base64
import json
import operator
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def log(msg):
    print(f"{time.strftime('%H:%M:%S')} lab-engine: {msg}", flush=True)


def fail(msg):
    print(f"lab-engine: error: {msg}", flush=True)
    sys.exit(1)


def parse_args(argv):
    """vLLM-style argv: optional positional model, then --flag [value] / --flag=value. Unknown flags
    are kept, never rejected; a flag followed by another flag (or nothing) is a boolean."""
    model, opts, i = "/model", {}, 0
    if argv and not argv[0].startswith("-"):
        model, i = argv[0], 1
    while i < len(argv):
        a = argv[i]
        i += 1
        if not a.startswith("--"):
            continue
        key = a[2:]
        if "=" in key:
            key, val = key.split("=", 1)
        elif i < len(argv) and not argv[i].startswith("--"):
            val, i = argv[i], i + 1
        else:
            val = True
        opts[key.replace("_", "-")] = val
    for key in ("compilation-config", "speculative-config", "engram-config", "limit-mm-per-prompt"):
        if isinstance(opts.get(key), str):
            try:
                json.loads(opts[key])
            except ValueError:
                fail(f"--{key} is not valid JSON: {opts[key]!r}")
    return model, opts


def check_inputs(model):
    mounts = set()
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = {line.split()[4] for line in f}
    except OSError:
        pass
    if not os.path.isdir(model) or (model not in mounts and not os.path.ismount(model)):
        fail(f"{model} is not mounted: run the container with -v <model dir>:{model}:ro")
    plan = os.environ.get("ST_EXL3_PLAN")
    if not plan:
        fail("ST_EXL3_PLAN is not set: pass -e ST_EXL3_PLAN=/plans/<plan file>")
    try:
        with open(plan, "rb") as f:
            f.read(1)
    except OSError as e:
        fail(f"ST_EXL3_PLAN={plan} is not readable ({e.strerror}): mount the plans dir at /plans")


# ---- rank contract -------------------------------------------------------------------------------

def run_headless(rank, addr, port):
    """Join rank 0, then wait until it goes away; exit 0 then (as vLLM's headless workers do)."""
    waited = 0.0
    while True:
        try:
            s = socket.create_connection((addr, port), timeout=5)
            break
        except OSError as e:
            if waited % 10 < 1:
                log(f"rank {rank}: waiting for rank 0 at {addr}:{port} ({e.strerror or e})")
            time.sleep(1)
            waited += 1
    s.settimeout(None)
    s.sendall(f"rank {rank}\n".encode())
    log(f"rank {rank}: joined rank 0 at {addr}:{port}; headless, no API")
    while True:
        try:
            data = s.recv(4096)
        except OSError:
            data = b""
        if not data:
            log(f"rank {rank}: rank 0 went away; exiting")
            sys.exit(0)


def gather_ranks(addr, port, nnodes):
    """Rank 0: accept nnodes-1 ranks; keep their sockets, log when one disappears, keep serving."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        srv.bind((addr, port))
    except OSError as e:
        fail(f"cannot listen on master {addr}:{port}: {e.strerror}")
    srv.listen(16)
    joined = {}
    while len(joined) < nnodes - 1:
        log(f"rank 0: waiting for ranks ({len(joined) + 1}/{nnodes} present) on {addr}:{port}")
        conn, peer = srv.accept()
        hello = conn.recv(64).decode(errors="replace").split()
        if len(hello) == 2 and hello[0] == "rank" and hello[1].isdigit():
            joined[int(hello[1])] = conn
            log(f"rank 0: rank {hello[1]} joined from {peer[0]}")
            threading.Thread(target=watch_rank, args=(int(hello[1]), conn), daemon=True).start()
        else:
            conn.close()
    srv.close()
    return joined


def watch_rank(rank, conn):
    try:
        while conn.recv(4096):
            pass
    except OSError:
        pass
    log(f"rank 0: rank {rank} disconnected; still serving")


# ---- answers by rule --------------------------------------------------------------------------------

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
       ast.Pow: operator.pow, ast.Mod: operator.mod, ast.FloorDiv: operator.floordiv}
WORDS = [(r"\bmultiplied by\b", "*"), (r"\btimes\b", "*"), (r"\bplus\b", "+"), (r"\bminus\b", "-"),
         (r"\bdivided by\b", "/"), ("×", "*"), ("÷", "/"), (r"(?<=\d)\s*x\s*(?=\d)", "*")]


def evaluate(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        right = evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("too big")
        return OPS[type(node.op)](evaluate(node.left), right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = evaluate(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    raise ValueError("not arithmetic")


def arithmetic(text):
    t = text
    for pat, rep in WORDS:
        t = re.sub(pat, rep, t, flags=re.I)
    t = t.replace("^", "**")
    for m in sorted(re.findall(r"[\d\s.+\-*/%()]+", t), key=len, reverse=True):
        expr = m.strip().rstrip("+-*/%.( ")
        if not re.search(r"\d\s*(\*\*|[+\-*/%])\s*[-(]*\d", expr):
            continue
        try:
            val = evaluate(ast.parse(expr, mode="eval").body)
        except (SyntaxError, ValueError, ZeroDivisionError, TypeError):
            continue
        if isinstance(val, float) and val.is_integer():
            val = int(val)
        elif isinstance(val, float):
            val = round(val, 6)
        return expr, val
    return None


def png_pixels(data):
    """Decode a non-interlaced 8/16-bit PNG to (width, height, rows of (r, g, b))."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, palette = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"PLTE":
            palette = [tuple(body[i:i + 3]) for i in range(0, len(body), 3)]
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    if depth not in (8, 16) or interlace:
        raise ValueError("only 8/16-bit non-interlaced PNGs")
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[ctype]
    bpp = channels * depth // 8
    raw, stride, prev, rows, i = zlib.decompress(idat), w * bpp, bytearray(w * bpp), [], 0
    for _ in range(h):
        ftype, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if ftype == 1:
                line[x] = (line[x] + a) & 255
            elif ftype == 2:
                line[x] = (line[x] + b) & 255
            elif ftype == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        prev = line
        step = depth // 8
        px = []
        for x in range(w):
            s = [line[x * bpp + k * step] for k in range(channels)]
            px.append(palette[s[0]] if ctype == 3 else tuple(s[:3]) if ctype in (2, 6) else (s[0],) * 3)
        rows.append(px)
    return w, h, rows


COLOURS = {"red": (220, 30, 30), "green": (30, 170, 50), "blue": (30, 60, 220), "yellow": (240, 220, 30),
           "cyan": (30, 210, 220), "magenta": (220, 40, 200), "orange": (250, 140, 20),
           "purple": (128, 40, 160), "white": (255, 255, 255), "black": (0, 0, 0), "grey": (128, 128, 128)}


def colour_name(rgb):
    return min(COLOURS, key=lambda n: sum((a - b) ** 2 for a, b in zip(rgb, COLOURS[n])))


def describe_image(url):
    m = re.match(r"data:image/png;base64,(.*)", url, re.S)
    if not m:
        return "I can only read PNG images sent as data: URLs."
    try:
        w, h, rows = png_pixels(base64.b64decode(m.group(1)))
    except (ValueError, KeyError, IndexError, struct.error, zlib.error, UnboundLocalError) as e:
        return f"I could not decode the image ({e})."
    halves = []
    for lo, hi in ((0, max(1, w // 2)), (w // 2, w)):
        px = [p for r in rows for p in r[lo:hi]] or [(0, 0, 0)]
        halves.append(colour_name(tuple(sum(c[k] for c in px) / len(px) for k in range(3))))
    if halves[0] == halves[1]:
        return f"The image is {halves[0]} all over ({w}x{h})."
    return f"The image shows {halves[0]} on the left, {halves[1]} on the right."


STOP = {"What", "What's", "Whats", "How", "Is", "Are", "The", "Please", "Can", "Could", "Tell", "Get", "Show",
        "Find", "Weather", "Use", "Call", "Check", "Look", "Give", "Which", "Where", "When", "Who", "Do", "Does"}


def tool_arguments(tool, text):
    params = (tool.get("function") or {}).get("parameters") or {}
    props = params.get("properties") or {}
    names = params.get("required") or list(props)
    proper = re.findall(r"\b(?:in|for|at|of|from|to|near)\s+([A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)*)", text)
    proper += [w for w in re.findall(r"\b[A-Z][a-z][\w'-]*", text) if w not in STOP]
    numbers = re.findall(r"-?\d+(?:\.\d+)?", text)
    args = {}
    for name in names:
        spec = props.get(name, {})
        kind = spec.get("type", "string")
        if "enum" in spec:
            args[name] = next((v for v in spec["enum"] if str(v).lower() in text.lower()), spec["enum"][0])
        elif kind in ("integer", "number"):
            v = float(numbers.pop(0)) if numbers else 0
            args[name] = int(v) if kind == "integer" else v
        elif kind == "boolean":
            args[name] = True
        elif kind == "array":
            args[name] = proper[:1] or [text.strip()]
        elif kind == "object":
            args[name] = {}
        else:
            args[name] = proper.pop(0) if proper else text.strip()[:200]
    return args


def message_text(content):
    if isinstance(content, str):
        return content, []
    texts, images = [], []
    for part in content or []:
        if isinstance(part, dict) and part.get("type") == "text":
            texts.append(part.get("text", ""))
        elif isinstance(part, dict) and part.get("type") == "image_url":
            iu = part.get("image_url")
            images.append(iu.get("url", "") if isinstance(iu, dict) else str(iu))
    return "\n".join(texts), images


def answer(text, images=(), tools=None, tool_result=None):
    """-> (reasoning, content, tool_call or None)"""
    if tool_result is not None:
        return ("A tool returned a result; I report it.", f"The tool returned: {tool_result}", None)
    if tools:
        fn = tools[0].get("function") or {}
        args = tool_arguments(tools[0], text)
        call = {"name": fn.get("name", "tool"), "arguments": json.dumps(args)}
        return (f"The user's request needs the tool {call['name']}; calling it with {call['arguments']}.",
                "", call)
    if images:
        return ("The user sent an image; I look at its left and right halves.", describe_image(images[0]), None)
    calc = arithmetic(text)
    if calc:
        return (f"The prompt contains arithmetic: {calc[0]}.", f"{calc[0]} = {calc[1]}", None)
    m = re.search(r"\b(?:reply|respond|answer|say)\b(?:\s+with)?(?:\s+(?:exactly|only|just))?\s*:?\s*(.+)",
                  text, re.I | re.S)
    if m:
        return ("The user asks for a fixed reply.", m.group(1).strip().strip("\"'").rstrip("."), None)
    return ("No rule applies; I say what I am.",
            "This is the dsv41 lab stand-in engine: no model is loaded, so I can only do arithmetic, "
            "call the first tool, and name the colours of an image's halves.", None)


def pieces(text):
    return re.findall(r"\s*\S+", text) or ([text] if text else [])


def count_tokens(text):
    return max(1, len(re.findall(r"\w+|[^\w\s]", text)))


# ---- HTTP API -----------------------------------------------------------------------------------------

class Api(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "lab-engine"
    cfg = {}

    def log_message(self, fmt, *a):
        log(f'{self.client_address[0]} "{self.requestline}" {a[1] if len(a) > 1 else ""}')

    def send_json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def authorised(self):
        key = self.cfg["api_key"]
        if not key or not self.path.startswith("/v1"):
            return True
        if self.headers.get("Authorization", "") == f"Bearer {key}":
            return True
        self.send_json(401, {"error": "Unauthorized"})
        return False

    def do_GET(self):
        path = self.path.split("?")[0]
        if path == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/version":
            self.send_json(200, {"version": "lab-stand-in"})
        elif not self.authorised():
            return
        elif path == "/v1/models":
            c = self.cfg
            self.send_json(200, {"object": "list", "data": [{
                "id": c["name"], "object": "model", "created": c["started"], "owned_by": "vllm",
                "root": c["model"], "parent": None, "max_model_len": c["max_len"]}]})
        else:
            self.send_json(404, {"detail": "Not Found"})

    def do_POST(self):
        path = self.path.split("?")[0]
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if path not in ("/v1/chat/completions", "/v1/completions"):
            self.send_json(404, {"detail": "Not Found"})
            return
        if not self.authorised():
            return
        try:
            req = json.loads(raw or b"{}")
            assert isinstance(req, dict)
        except (ValueError, AssertionError):
            self.send_json(400, error(400, "request body is not a JSON object"))
            return
        if req.get("model", self.cfg["name"]) != self.cfg["name"]:
            self.send_json(404, error(404, f"The model `{req.get('model')}` does not exist.", "NotFoundError"))
            return
        chat = path == "/v1/chat/completions"
        try:
            reasoning, content, call, prompt_tokens = self.respond(req, chat)
        except ValueError as e:
            self.send_json(400, error(400, str(e)))
            return
        if not self.cfg["reasoning"]:
            reasoning = ""
        max_tokens = req.get("max_completion_tokens") or req.get("max_tokens")
        rtoks, toks = pieces(reasoning), pieces(content)
        budget = max(0, max_tokens - len(rtoks)) if max_tokens else None  # reasoning counts as output
        if req.get("ignore_eos") and budget:
            filler = pieces(" The stand-in engine keeps writing because ignore_eos is set.")
            while len(toks) < budget:
                toks += filler
        finish = "tool_calls" if call else "stop"
        if budget is not None and len(toks) > budget:
            toks, finish = toks[:budget], "length"
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(rtoks) + len(toks) + (1 if call else 0),
                 "prompt_tokens_details": {"cached_tokens": 0}}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        if req.get("stream"):
            self.stream(req, chat, rid, rtoks, toks, call, finish, usage)
        else:
            self.whole(chat, rid, reasoning, "".join(toks), call, finish, usage)

    def respond(self, req, chat):
        if not chat:
            prompt = req.get("prompt", "")
            prompt = "\n".join(map(str, prompt)) if isinstance(prompt, list) else str(prompt)
            r, c, _ = answer(prompt)
            return r, c, None, count_tokens(prompt)
        msgs = req.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ValueError("messages must be a non-empty list")
        tools = req.get("tools") or None
        choice = req.get("tool_choice", "auto" if tools else "none")
        if tools and choice == "auto" and not self.cfg["auto_tools"]:
            raise ValueError('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
        if choice == "none":
            tools = None
        elif isinstance(choice, dict) and tools:
            named = (choice.get("function") or {}).get("name")
            tools = [t for t in tools if (t.get("function") or {}).get("name") == named] or tools
        last = msgs[-1] if isinstance(msgs[-1], dict) else {}
        all_text = " ".join(message_text(m.get("content"))[0] for m in msgs if isinstance(m, dict))
        user = next((m for m in reversed(msgs) if isinstance(m, dict) and m.get("role") == "user"), {})
        text, images = message_text(user.get("content"))
        result = message_text(last.get("content"))[0] if last.get("role") == "tool" else None
        if len(images) > self.cfg["max_images"]:
            raise ValueError(f"At most {self.cfg['max_images']} image(s) may be provided in one prompt.")
        r, c, call = answer(text, images, tools, result)
        return r, c, call, count_tokens(all_text) + 256 * len(images)

    def whole(self, chat, rid, reasoning, content, call, finish, usage):
        base = {"id": rid, "created": int(time.time()), "model": self.cfg["name"], "usage": usage}
        if chat:
            msg = {"role": "assistant", "content": content if not call else None,
                   "reasoning_content": reasoning or None, "tool_calls": []}
            if call:
                msg["tool_calls"] = [{"id": "chatcmpl-tool-" + uuid.uuid4().hex[:24], "type": "function",
                                      "function": call}]
            choice = {"index": 0, "message": msg, "finish_reason": finish, "logprobs": None}
            self.send_json(200, dict(base, object="chat.completion", choices=[choice]))
        else:
            choice = {"index": 0, "text": content, "finish_reason": finish, "logprobs": None}
            self.send_json(200, dict(base, object="text_completion", choices=[choice]))

    def stream(self, req, chat, rid, rtoks, toks, call, finish, usage):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        obj = "chat.completion.chunk" if chat else "text_completion"
        created = int(time.time())

        def send(choices, extra=None):
            chunk = {"id": rid, "object": obj, "created": created, "model": self.cfg["name"], "choices": choices}
            self.wfile.write(b"data: " + json.dumps(dict(chunk, **(extra or {}))).encode() + b"\n\n")
            self.wfile.flush()

        def delta(d, fin=None):
            if chat:
                send([{"index": 0, "delta": d, "logprobs": None, "finish_reason": fin}])
            else:
                send([{"index": 0, "text": d.get("content", ""), "logprobs": None, "finish_reason": fin}])

        pause = self.cfg["token_s"]
        try:
            if chat:
                delta({"role": "assistant", "content": ""})
                for t in rtoks:
                    time.sleep(pause)
                    delta({"reasoning_content": t})
            for t in toks:
                time.sleep(pause)
                delta({"content": t})
            if call:
                delta({"tool_calls": [{"index": 0, "id": "chatcmpl-tool-" + uuid.uuid4().hex[:24],
                                       "type": "function", "function": call}]})
            delta({"content": ""} if chat else {}, finish)
            if self.cfg["force_usage"] or (req.get("stream_options") or {}).get("include_usage"):
                send([], {"usage": usage})
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            log(f"client went away during {rid}")


def error(code, msg, kind="BadRequestError"):
    return {"object": "error", "message": msg, "type": kind, "param": None, "code": code}


def main():
    signal.signal(signal.SIGTERM, lambda *_: (log("SIGTERM; exiting"), os._exit(0)))
    signal.signal(signal.SIGINT, lambda *_: (log("SIGINT; exiting"), os._exit(0)))
    model, o = parse_args(sys.argv[1:])
    rank, nnodes = int(o.get("node-rank", 0)), int(o.get("nnodes", 1))
    addr, mport = str(o.get("master-addr", "127.0.0.1")), int(o.get("master-port", 29500))
    log(f"STAND-IN for the dsv41 serving image (no GPU, no model): rank {rank} of {nnodes}, "
        f"model {model}, served as {o.get('served-model-name', model)}")
    check_inputs(model)
    log(f"plan {os.environ['ST_EXL3_PLAN']} readable; VLLM_HOST_IP={os.environ.get('VLLM_HOST_IP', '-')}")
    delay = float(os.environ.get("LAB_ENGINE_DELAY_S", "2"))
    log(f"loading (simulated, {delay:g} s)")
    time.sleep(delay)
    if rank > 0 or o.get("headless"):
        run_headless(rank, addr, mport)
    ranks = gather_ranks(addr, mport, nnodes) if nnodes > 1 else {}
    try:
        mm = json.loads(o.get("limit-mm-per-prompt", "{}")).get("image", 1)
    except (ValueError, AttributeError):
        mm = 1
    Api.cfg = {"name": str(o.get("served-model-name", model)), "model": model, "started": int(time.time()),
               "max_len": int(o.get("max-model-len", 4096)), "max_images": int(mm),
               "api_key": os.environ.get("VLLM_API_KEY") or (o.get("api-key") if isinstance(o.get("api-key"), str) else ""),
               "reasoning": "reasoning-parser" in o, "force_usage": "enable-force-include-usage" in o,
               "auto_tools": "enable-auto-tool-choice" in o and "tool-call-parser" in o,
               "token_s": float(os.environ.get("LAB_ENGINE_TOKEN_S", "0.01"))}
    host, port = str(o.get("host", "0.0.0.0")), int(o.get("port", 8000))
    try:
        httpd = ThreadingHTTPServer((host, port), Api)
    except OSError as e:
        fail(f"cannot listen on {host}:{port}: {e.strerror}")
    httpd.daemon_threads = True
    log(f"all {len(ranks) + 1} ranks present; API on http://{host}:{port} "
        f"(auth {'on' if Api.cfg['api_key'] else 'off'})")
    log("Application startup complete.")
    httpd.serve_forever()


if __name__ == "__main__":
    main()
