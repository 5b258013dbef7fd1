#!/usr/bin/env python3
"""STAND-IN for the real dsv41 serving image (vLLM on GB10 GPUs), used only by the two-node lab.

It has no GPU and no model. It accepts the argv and environment the rank units pass to real vLLM,
checks what real vLLM would fail on (/model mounted, ST_EXL3_PLAN readable), keeps the rank contract
and answers a few prompt kinds by rule so smoke tests can pass: arithmetic, a call of the first tool,
the colours of a PNG's halves, "count to N". Standard library only. Everything marked "stand-in
behaviour" below copies what real vLLM does, as measured here with vLLM 0.32 (CPU build, two ranks;
tests/lab/vllm/FINDINGS.md) or, where not measured, as vLLM 0.32's source says.

Rank contract (any --nnodes N): rank 0 listens on --master-addr:--master-port and serves nothing until
all N-1 headless ranks (--node-rank 1..N-1, or --headless) have joined. Then:
- A headless rank that dies: rank 0 remembers it. While idle nothing happens and GET /health stays
  200 (measured). The next inference request (POST /v1/chat/completions or /v1/completions) makes the
  engine step, which fails: a plain request gets HTTP 500
    {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root
     cause.", "type": "InternalServerError", "param": null, "code": 500}}
  and the log shows EngineDeadError; requests in flight when a rank dies fail the same way at the
  engine's next step. A stream gets HTTP 200, then `data: {"error": {...same object...}}` and
  `data: [DONE]` (vLLM source; not measured). Once the engine is dead /health answers 503 and every
  inference request 500 (vLLM source); the API server stops listening about 0.1 s after a failed plain
  request and the process EXITS WITH CODE 0 about 1 s after it (measured: 0.6-0.7 s), so
  Restart=on-failure does not restart it. After a failed stream the shutdown comes from vLLM's
  watchdog, which looks every 5 s. VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 keeps the server up instead
  (vLLM's own variable: /health 503, inference 500, no exit).
- Rank 0 going away: each headless rank logs "rank 0 went away" and then does what
  LAB_ENGINE_WORKER_ON_HEAD_LOSS says: `hang` (default; measured: a real headless worker neither
  exits nor logs, one was still running 240 s later) keeps running until it is signalled; `exit`
  exits 0 (the stand-in's old behaviour).
- SIGTERM/SIGINT: exit 0 at once, on every rank.

Wedge (a reported GB10 failure: NCCL deadlock, HTTP alive, no tokens): SIGUSR1 to rank 0's engine
process (`docker kill --signal USR1 <rank 0 container>`) switches it on, the next SIGUSR1 off; each
switch is logged ("wedge ON"/"wedge OFF"). SIGUSR1 to a headless rank forwards the same switch to rank
0 (a stuck worker stalls the collectives too); the engine is wedged while any rank's switch is on. While
wedged, /health, /version, /v1/models and /metrics answer, the engine takes no step: no token is
produced, plain requests hang, streams get their response headers and nothing else, and the engine's
metrics (vllm:*, gauges included) keep their last values, as vLLM publishes them from engine steps.

/metrics (no key, like vLLM): vLLM 0.32's Prometheus text format, same families, types, HELP texts,
labels (engine="0", model_name="<served name>") and histogram buckets as real vLLM (recorded in
/work/shared/data/vllm-0.32-cpu-metrics.txt; request-token buckets are 1-2-5 up to --max-model-len as
in vLLM). Values are the stand-in's own work: running/waiting (--max-num-seqs, default 256),
KV-cache usage (blocks of --block-size held by running requests out of --kv-cache-memory-bytes at
2.7e9 B per 2,023,717 tokens), prompt/generation token totals, finished requests by reason (stop,
length, abort), TTFT, inter-token latency, e2e/queue/prefill/decode times; no preemptions, no prefix
cache hits. Also python_*, process_* and the http_* series of vLLM's HTTP instrumentation.

Token pacing: while there is work, one engine step every LAB_ENGINE_TOKEN_S seconds (default 0.01);
each step admits waiting requests (prefill) and gives every running request its next token, streamed
or not (a plain request answers when its last token is made). An idle engine takes no step.
Long busy request on demand: a prompt "count to N" (or "count from A to B", at most 100000 numbers)
answers with one token per number; any prompt with "max_tokens": N, "ignore_eos": true gets exactly N
completion tokens (with --reasoning-parser a few reasoning tokens come first and count). With
LAB_ENGINE_TOKEN_S=0.1, "count to 600" streams steadily for a minute:
  curl -N http://HEAD:8000/v1/chat/completions -H "Authorization: Bearer $KEY" \
    -d '{"model": "<served name>", "stream": true, "messages": [{"role": "user", "content": "count to 600"}]}'
A wedged engine takes no step, so it notices a lost rank only once unwedged.

Chunked prefill: each step has a token budget, --max-num-batched-tokens (default 2048). Running
requests take it first (one token each in decode, the next chunk of a prompt still in prefill), then
waiting requests are admitted with what is left, so a prompt longer than the budget is prefilled over
several steps. As measured on vLLM 0.32 (docs/faults.md, "Hangs: what moves during a long prefill"), only
the KV-cache usage moves while a prompt is prefilled: vLLM records iteration stats from a step's outputs,
so vllm:prompt_tokens_total, vllm:generation_tokens_total and vllm:iteration_tokens_total (its _count)
move only when the prefill is done and the first token comes out (one observation: the whole prompt
plus that token). The KV-cache usage counts blocks of --block-size computed so far. Prompt tokens
are counted as words and punctuation: a prompt of a few thousand words with --max-num-batched-tokens 64
and LAB_ENGINE_TOKEN_S=0.1 is a slow prefill that keeps the engine stepping and moves no token total
and no step count for seconds.

Stopped worker: every step is a collective over all ranks (tensor parallel all-reduces in every step):
rank 0 waits for each headless rank's part of it. A headless rank stopped with SIGSTOP does nothing,
so rank 0's step never ends: no token comes out, the engine's metrics keep their values, /health and
/metrics keep answering, and after 5 s rank 0 logs "step N waits for rank(s) 1"; SIGCONT lets the step
finish. An idle engine takes no step, so a stopped worker is noticed at the next request. (This is a
collective stuck in NCCL; the lab's real engine over gloo instead exits rank 0 about 30 s after its
worker's Worker_TP1 was stopped.)

Env: VLLM_API_KEY (bearer key for /v1), LAB_ENGINE_DELAY_S (start-up delay, default 2),
LAB_ENGINE_TOKEN_S (seconds per engine step = per token, default 0.01),
LAB_ENGINE_WORKER_ON_HEAD_LOSS (hang|exit, default hang), VLLM_KEEP_ALIVE_ON_ENGINE_DEATH (0|1),
LAB_ENGINE_SKIP_MOUNT_CHECK=1 (tests running the engine as a local process: the model directory must
exist but need not be a mount point; the ST_EXL3_PLAN check stays).
"""
import ast
import base64
import gc
import json
import math
import operator
import os
import platform
import queue
import re
import resource
import select
import signal
import socket
import struct
import sys
import threading
import time
import uuid
import zlib
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def log(msg):
    print(f"{time.strftime('%H:%M:%S')} lab-engine: {msg}", flush=True)


def vlog(proc, where, msg):
    """A line worded and shaped as vLLM 0.32 logs its start-up (stand-in behaviour: the lines
    dsv41/vllm/startup.py reads a start-up's phases from, at the moments vLLM logs them)."""
    print(f"({proc} pid={os.getpid()}) INFO {time.strftime('%m-%d %H:%M:%S')} [{where}] {msg}", flush=True)


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
    if os.environ.get("LAB_ENGINE_SKIP_MOUNT_CHECK") == "1":
        if not os.path.isdir(model):
            fail(f"{model} is not a directory")
        log(f"LAB_ENGINE_SKIP_MOUNT_CHECK=1: not checking that {model} is a mount point")
    else:
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
# The wire between ranks is the stand-in's own: a headless rank connects to rank 0 and says
# "rank N\n"; later lines "wedge 1"/"wedge 0" carry its SIGUSR1 switch; EOF means the peer is gone.
# Every engine step is a collective (stand-in behaviour: tensor parallel all-reduces in every step):
# rank 0 sends "step N", each headless rank answers "ok N"; a stopped rank answers nothing, so rank 0's
# step waits for it.

def run_headless(rank, addr, port, on_head_loss):
    """Join rank 0, then wait until it goes away; then hang (stand-in behaviour, as measured with real
    headless vLLM workers) or exit 0 (LAB_ENGINE_WORKER_ON_HEAD_LOSS=exit)."""
    wedge = {"on": False, "sock": None}

    def usr1(*_):  # stand-in behaviour: a stuck worker stalls the whole engine; rank 0 does the wedging
        wedge["on"] = not wedge["on"]
        log(f"rank {rank}: SIGUSR1: wedge {'ON' if wedge['on'] else 'OFF'} (forwarded to rank 0)")
        try:
            wedge["sock"].sendall(f"wedge {int(wedge['on'])}\n".encode())
        except (OSError, AttributeError):
            pass
    signal.signal(signal.SIGUSR1, usr1)
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
    s.sendall(f"rank {rank}\n".encode() + (b"wedge 1\n" if wedge["on"] else b""))
    wedge["sock"] = s
    log(f"rank {rank}: joined rank 0 at {addr}:{port}; headless, no API")
    buf = b""
    while True:
        try:
            data = s.recv(4096)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if not data:
            break
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.startswith(b"step "):   # this rank's part of the step's collective
                try:
                    s.sendall(b"ok " + line[5:] + b"\n")
                except OSError:
                    pass
    if on_head_loss == "exit":
        log(f"rank {rank}: rank 0 went away; exiting 0 (LAB_ENGINE_WORKER_ON_HEAD_LOSS=exit)")
        sys.exit(0)
    log(f"rank {rank}: rank 0 went away; hanging like a real headless vLLM worker until signalled "
        f"(LAB_ENGINE_WORKER_ON_HEAD_LOSS=hang)")
    while True:
        signal.pause()


def gather_ranks(addr, port, nnodes, engine):
    """Rank 0: accept nnodes-1 ranks; keep their sockets; a rank whose socket closes is lost."""
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
        try:
            conn, peer = srv.accept()
        except InterruptedError:
            continue
        conn.settimeout(5)
        buf = b""
        try:
            while b"\n" not in buf and len(buf) < 64:
                data = conn.recv(64)
                if not data:
                    break
                buf += data
        except OSError:
            pass
        conn.settimeout(None)
        line, _, rest = buf.partition(b"\n")
        line = line.decode(errors="replace")
        hello = line.split()
        if (len(hello) == 2 and hello[0] == "rank" and hello[1].isdigit()
                and 0 < int(hello[1]) < nnodes and int(hello[1]) not in joined):
            joined[int(hello[1])] = conn
            log(f"rank 0: rank {hello[1]} joined from {peer[0]}")
            threading.Thread(target=watch_rank, args=(int(hello[1]), conn, engine, rest), daemon=True).start()
        else:
            log(f"rank 0: refused {peer[0]}: {line.strip()!r}")
            conn.close()
    srv.close()
    return joined


def watch_rank(rank, conn, engine, buf=b""):
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.startswith(b"wedge "):
                engine.set_wedge(f"rank {rank}", line.endswith(b"1"))
            elif line.startswith(b"ok ") and line[3:].isdigit():
                engine.ack(rank, int(line[3:]))
        try:
            data = conn.recv(4096)
        except OSError:
            data = b""
        if not data:
            break
        buf += data
    engine.rank_lost(rank)


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
    m = re.search(r"\bcount\s+(?:from\s+(\d+)\s+)?(?:up\s+)?to\s+(\d+)", text, re.I)
    if m:  # the long-request rule: one token per number
        lo, hi = int(m.group(1) or 1), int(m.group(2))
        if hi - lo < 100000:
            return (f"The user asks me to count from {lo} to {hi}.", " ".join(map(str, range(lo, hi + 1))), None)
    calc = arithmetic(text)
    if calc:
        return (f"The prompt contains arithmetic: {calc[0]}.", f"{calc[0]} = {calc[1]}", None)
    m = re.search(r"\b(?:reply|respond|answer|say)\b(?:\s+with)?(?:\s+(?:exactly|only|just))?\s*:?\s*(.+)",
                  text, re.I | re.S)
    if m:
        return ("The user asks for a fixed reply.", m.group(1).strip().strip("\"'").rstrip("."), None)
    return ("No rule applies; I say what I am.",
            "This is the dsv41 lab stand-in engine: no model is loaded, so I can only do arithmetic, "
            "call the first tool, name the colours of an image's halves and count to N.", None)


def pieces(text):
    return re.findall(r"\s*\S+", text) or ([text] if text else [])


def count_tokens(text):
    return max(1, len(re.findall(r"\w+|[^\w\s]", text)))


# ---- /metrics: Prometheus text format by hand (the image has no prometheus_client) ----------------
# Stand-in behaviour: the layout is what prometheus_client's generate_latest writes for vLLM 0.32:
# HELP/TYPE per family, labels sorted by name, counters as <name>_total, histograms as _bucket (le),
# _count, _sum, and every counter/histogram/summary followed by a <name>_created gauge family.

def gostr(v):
    """A float as prometheus_client writes it (Go's formatting)."""
    v = float(v)
    if v == math.inf:
        return "+Inf"
    if v == -math.inf:
        return "-Inf"
    if v != v:
        return "NaN"
    s = repr(v)
    dot = s.find(".")
    if v > 0 and dot > 6:
        return f"{(s[0] + '.' + s[1:dot] + s[dot + 1:]).rstrip('0.')}e+{dot - 1:02d}"
    return s


def sample(name, labels, value):
    if not labels:
        return f"{name} {gostr(value)}"
    esc = lambda v: str(v).replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return name + "{" + ",".join(f'{k}="{esc(v)}"' for k, v in sorted(labels.items())) + "} " + gostr(value)


class Series:
    def __init__(self, nbuckets):
        self.value, self.created = 0.0, time.time()
        self.counts, self.sum, self.count = [0] * nbuckets, 0.0, 0

    def inc(self, n=1):
        self.value += n

    def set(self, v):
        self.value = v


class Family:
    """One metric family; kind is counter, gauge, histogram or summary; name as vLLM exposes it."""

    def __init__(self, registry, name, kind, doc, labelnames=(), buckets=(), created=True, fixed=None):
        self.name, self.kind, self.doc, self.labelnames = name, kind, doc, tuple(labelnames)
        self.buckets, self.created, self.series = list(buckets), created and kind != "gauge", {}
        self.fixed = fixed or {}
        registry.append(self)

    def labels(self, *values):
        if values not in self.series:
            self.series[values] = Series(len(self.buckets))
        return self.series[values]

    def observe(self, v, *values):
        s = self.labels(*values)
        s.sum += v
        s.count += 1
        for i, b in enumerate(self.buckets):
            if v <= b:
                s.counts[i] += 1

    def render(self, out):
        doc = self.doc.replace("\\", r"\\").replace("\n", r"\n")
        out += [f"# HELP {self.name} {doc}", f"# TYPE {self.name} {self.kind}"]
        created = []
        base = self.name[:-6] if self.kind == "counter" and self.name.endswith("_total") else self.name
        for values, s in self.series.items():
            lab = dict(self.fixed, **dict(zip(self.labelnames, values)))
            if self.kind in ("counter", "gauge"):
                out.append(sample(self.name, lab, s.value))
            else:
                if self.kind == "histogram":
                    for b, n in zip(self.buckets + [math.inf], s.counts + [s.count]):
                        out.append(sample(self.name + "_bucket", dict(lab, le=gostr(b)), n))
                out.append(sample(self.name + "_count", lab, s.count))
                out.append(sample(self.name + "_sum", lab, s.sum))
            created.append(sample(base + "_created", lab, s.created))
        if self.created and created:
            out += [f"# HELP {base}_created {doc}", f"# TYPE {base}_created gauge"] + created


def buckets_1_2_5(max_value):
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to max_value."""
    out, exp = [], 0
    while True:
        for m in (1, 2, 5):
            if m * 10 ** exp > max_value:
                return out
            out.append(m * 10 ** exp)
        exp += 1


# vLLM 0.32's bucket families (vllm/v1/metrics/buckets.py)
REQUEST_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
        80.0, 160.0, 640.0, 2560.0)
ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITERATION_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
HTTP_HIGHR = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 7.5,
              10.0, 30.0, 60.0)
HTTP_EXCLUDED = ("/metrics", "/health", "/load", "/ping", "/version", "/server_info")
HTTP_ROUTES = ("/v1/models", "/v1/completions", "/v1/chat/completions")
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
KV_BYTES_PER_TOKEN = 2.7e9 / 2023717   # the measured configuration: KV_BYTES 2.7e9 holds 2,023,717 tokens
MFU = "(for Model Flops Utilization calculations)."


class Metrics:
    """The families of vLLM 0.32's /metrics, in its order. Engine series are updated by the engine
    loop (under its lock), http_* by the API handler."""

    def __init__(self, name, max_len, block_size, kv_blocks, kv_bytes, opts):
        self.start = time.time()
        self.reg, E = [], ("engine", "model_name")
        r = self.reg
        self.gc_collected = Family(r, "python_gc_objects_collected_total", "counter", "Objects collected during gc",
                                   ("generation",), created=False)
        self.gc_uncollectable = Family(r, "python_gc_objects_uncollectable_total", "counter",
                                       "Uncollectable objects found during GC", ("generation",), created=False)
        self.gc_collections = Family(r, "python_gc_collections_total", "counter",
                                     "Number of times this generation was collected", ("generation",), created=False)
        v = sys.version_info
        Family(r, "python_info", "gauge", "Python platform information",
               ("implementation", "major", "minor", "patchlevel", "version")).labels(
            platform.python_implementation(), str(v.major), str(v.minor), str(v.micro),
            platform.python_version()).set(1)
        self.vmem = Family(r, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.")
        self.rss = Family(r, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.")
        self.pstart = Family(r, "process_start_time_seconds", "gauge",
                             "Start time of the process since unix epoch in seconds.")
        self.cpu = Family(r, "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.",
                          created=False)
        self.fds = Family(r, "process_open_fds", "gauge", "Number of open file descriptors.")
        self.maxfds = Family(r, "process_max_fds", "gauge", "Maximum number of open file descriptors.")
        lv = ("0", name)
        for what in ("floating point operations", "bytes read from memory", "bytes written to memory"):
            key = {"floating point operations": "flops", "bytes read from memory": "read_bytes",
                   "bytes written to memory": "write_bytes"}[what]
            Family(r, f"vllm:estimated_{key}_per_gpu_total", "counter",
                   f"Estimated number of {what} per GPU {MFU}", E).labels(*lv)
        self.running = Family(r, "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", E)
        self.waiting = Family(r, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", E)
        self.waiting_by = Family(r, "vllm:num_requests_waiting_by_reason", "gauge",
                                 "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
                                 "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
                                 "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
                                 E + ("reason",))
        sleep = Family(r, "vllm:engine_sleep_state", "gauge",
                       "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
                       "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
                       E + ("sleep_state",))
        for state, val in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            sleep.labels(*lv, state).set(val)
        self.kv = Family(r, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", E)
        self.pc_queries = Family(r, "vllm:prefix_cache_queries_total", "counter",
                                 "Prefix cache queries, in terms of number of queried tokens.", E)
        self.pc_hits = Family(r, "vllm:prefix_cache_hits_total", "counter",
                              "Prefix cache hits, in terms of number of cached tokens.", E)
        for kind, unit in (("queries", "queried"), ("hits", "cached")):
            Family(r, f"vllm:external_prefix_cache_{kind}_total", "counter",
                   f"External prefix cache {kind} from KV connector cross-instance cache sharing, in terms of "
                   f"number of {unit} tokens.", E).labels(*lv)
        self.mm_queries = Family(r, "vllm:mm_cache_queries_total", "counter",
                                 "Multi-modal cache queries, in terms of number of queried items.", E)
        self.mm_hits = Family(r, "vllm:mm_cache_hits_total", "counter",
                              "Multi-modal cache hits, in terms of number of cached items.", E)
        self.preemptions = Family(r, "vllm:num_preemptions_total", "counter",
                                  "Cumulative number of preemption from the engine.", E)
        self.prompt_tokens = Family(r, "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", E)
        self.prompt_by_source = Family(r, "vllm:prompt_tokens_by_source_total", "counter",
                                       "Number of prompt tokens by source.", E + ("source",))
        for src in ("local_compute", "local_cache_hit", "external_kv_transfer"):
            self.prompt_by_source.labels(*lv, src)
        Family(r, "vllm:prompt_tokens_cached_total", "counter", "Number of cached prompt tokens (local + external).",
               E).labels(*lv)
        cached_by = Family(r, "vllm:prompt_tokens_cached_by_source_total", "counter",
                           "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host "
                           "(offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
                           "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
                           "vllm:external_prefix_cache_hits.", E + ("source",))
        for src in ("device", "host", "p2p", "disk", "external_unspecified"):
            cached_by.labels(*lv, src)
        self.gen_tokens = Family(r, "vllm:generation_tokens_total", "counter",
                                 "Number of generation tokens processed.", E)
        self.success = Family(r, "vllm:request_success_total", "counter", "Count of successfully processed requests.",
                              ("engine", "finished_reason", "model_name"))
        for reason in FINISH_REASONS:
            self.success.labels("0", reason, name)
        rej = Family(r, "vllm:admission_rejections_total", "counter",
                     "Number of admission attempts rejected by a queue limit, by reason.", ("model_name", "reason"))
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            rej.labels(name, reason)
        tok = buckets_1_2_5(max_len)
        H = lambda n, doc, b: Family(r, n, "histogram", doc, E, b)
        self.h_prompt = H("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok)
        self.h_gen = H("vllm:request_generation_tokens", "Number of generation tokens processed.", tok)
        self.h_iter = H("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                        ITERATION_TOKENS)
        self.h_max_gen = H("vllm:request_max_num_generation_tokens",
                           "Histogram of maximum number of requested generation tokens.", tok)
        self.h_n = H("vllm:request_params_n", "Histogram of the n request parameter.", (1, 2, 5, 10, 20))
        self.h_max_tokens = H("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tok)
        self.h_ttft = H("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT)
        self.h_itl = H("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL)
        self.h_tpot = H("vllm:request_time_per_output_token_seconds",
                        "Histogram of time_per_output_token_seconds per request.", ITL)
        self.h_e2e = H("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                       REQUEST_LATENCY)
        self.h_queue = H("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                         REQUEST_LATENCY)
        self.h_inference = H("vllm:request_inference_time_seconds",
                             "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY)
        self.h_prefill = H("vllm:request_prefill_time_seconds",
                           "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY)
        self.h_decode = H("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
                          REQUEST_LATENCY)
        self.h_preempt = H("vllm:request_num_preemptions",
                           "Histogram of the number of times a request was preempted.", (1, 2, 3, 4, 5, 10, 20))
        self.h_kv_computed = H("vllm:request_prefill_kv_computed_tokens",
                               "Histogram of new KV tokens computed during prefill (excluding cached tokens).", tok)
        for fam in [f for f in self.reg if f.labelnames == E]:
            fam.labels(*lv)
        info = {"_block_size_resolved": "True", "block_size": str(block_size),
                "cache_dtype": str(opts.get("kv-cache-dtype", "auto")), "cache_hit_alignment_tokens": "None",
                "effective_attention_block_size": str(block_size), "enable_mamba_shared_prefix_checkpoint": "False",
                "enable_prefix_caching": str("no-enable-prefix-caching" not in opts), "engine": "0",
                "gpu_memory_utilization": str(float(opts.get("gpu-memory-utilization", 0.92))),
                "hash_block_size": "None", "is_attention_free": "False", "kv_cache_dtype_skip_layers": "[]",
                "kv_cache_layout": "None", "kv_cache_max_concurrency": str(kv_blocks * block_size / max_len),
                "kv_cache_memory_bytes": str(kv_bytes), "kv_cache_size_tokens": str(kv_blocks * block_size),
                "kv_offloading_backend": "native", "kv_offloading_size": "None", "kv_sharing_fast_prefill": "False",
                "mamba_block_size": "None", "mamba_cache_dtype": "auto", "mamba_cache_mode": "none",
                "mamba_page_size_padded": "None", "mamba_ssm_cache_dtype": "auto", "num_cpu_blocks": "None",
                "num_gpu_blocks": str(kv_blocks), "num_gpu_blocks_override": "None",
                "prefix_cache_retention_interval": "0", "prefix_caching_hash_algo": "sha256",
                "prefix_match_unit": "None", "replayssm_buffer_len": "16", "skip_page_size_padded": "None",
                "sliding_window": "None", "swa_bounded_replay": "True", "use_kda_recoverssm": "False",
                "use_replayssm": "False", "user_specified_block_size": str("block-size" in opts)}
        Family(r, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig",
               tuple(info)).labels(*info.values()).set(1)
        # prometheus-fastapi-instrumentator's defaults, as vLLM installs them
        self.http_requests = Family(r, "http_requests_total", "counter",
                                    "Total number of requests by method, status and handler.",
                                    ("handler", "method", "status"))
        size = "Only value of header is respected. Otherwise ignored. No percentile calculated. "
        self.http_req_size = Family(r, "http_request_size_bytes", "summary",
                                    f"Content length of incoming requests by handler. {size}", ("handler",))
        self.http_resp_size = Family(r, "http_response_size_bytes", "summary",
                                     f"Content length of outgoing responses by handler. {size}", ("handler",))
        self.http_highr = Family(r, "http_request_duration_highr_seconds", "histogram",
                                 "Latency with many buckets but no API specific labels. Made for more accurate "
                                 "percentile calculations. ", (), HTTP_HIGHR)
        self.http_highr.labels()
        self.http_lowr = Family(r, "http_request_duration_seconds", "histogram",
                                "Latency with only few buckets by handler. Made to be only used if aggregation by "
                                "handler is important. ", ("handler", "method"), (0.1, 0.5, 1))
        self.tool_parser = Family(r, "vllm:tool_call_parser_invocations_total", "counter",
                                  "Total number of ToolParser invocations. Non-streaming increments once per choice; "
                                  "streaming increments once per delta.", ("mode", "model_name", "outcome",
                                                                           "request_type"))
        for mode in ("streaming", "non_streaming"):
            for outcome in ("tool_call", "no_tool_call"):
                for rt in ("chat_completions", "responses", "other"):
                    self.tool_parser.labels(mode, name, outcome, rt)
        self.lv = lv

    def process(self):
        for i, st in enumerate(gc.get_stats()):
            self.gc_collected.labels(str(i)).set(st["collected"])
            self.gc_uncollectable.labels(str(i)).set(st["uncollectable"])
            self.gc_collections.labels(str(i)).set(st["collections"])
        try:
            with open("/proc/self/stat", "rb") as f:
                parts = f.read().split(b")")[-1].split()
            with open("/proc/stat", "rb") as f:
                btime = next(float(l.split()[1]) for l in f if l.startswith(b"btime"))
            ticks = os.sysconf("SC_CLK_TCK")
            self.vmem.labels().set(float(parts[20]))
            self.rss.labels().set(float(parts[21]) * resource.getpagesize())
            self.pstart.labels().set(float(parts[19]) / ticks + btime)
            self.cpu.labels().set((float(parts[11]) + float(parts[12])) / ticks)
            self.fds.labels().set(len(os.listdir("/proc/self/fd")))
            self.maxfds.labels().set(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        except (OSError, IndexError, StopIteration, ValueError):
            pass

    def http(self, path, method, code, req_size, resp_size, seconds):
        if path in HTTP_EXCLUDED:
            return
        handler = path if path in HTTP_ROUTES else "none"
        self.http_requests.labels(handler, method, f"{code // 100}xx").inc()
        for fam, n in ((self.http_req_size, req_size), (self.http_resp_size, resp_size)):
            s = fam.labels(handler)
            s.sum, s.count = s.sum + n, s.count + 1
        self.http_highr.observe(seconds)
        self.http_lowr.observe(seconds, handler, method)

    def render(self):
        self.process()
        out = []
        for fam in self.reg:
            fam.render(out)
        return "\n".join(out) + "\n"


# ---- the engine: a scheduler loop that takes one step per LAB_ENGINE_TOKEN_S -----------------------

ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."
DEAD_ERROR = {"error": {"message": ENGINE_DEAD, "type": "InternalServerError", "param": None, "code": 500}}


class Request:
    def __init__(self, rid, prompt_tokens, out, finish, max_tokens, images):
        self.rid, self.prompt_tokens, self.out, self.finish = rid, prompt_tokens, out, finish
        self.max_tokens, self.images = max_tokens, images
        self.events = queue.Queue()
        self.arrival, self.scheduled, self.first, self.last = time.time(), None, None, None
        self.done, self.aborted, self.computed = 0, False, 0   # computed: prompt tokens prefilled so far


class Engine:
    """Stand-in behaviour: like vLLM's EngineCore, it does nothing while idle, so a lost rank is only
    noticed at the next step; a wedge stops the steps and with them every engine metric."""

    def __init__(self, name, token_s, max_seqs, batch, block_size, kv_blocks, metrics):
        self.name, self.token_s, self.max_seqs, self.batch = name, token_s, max_seqs, batch
        self.block_size, self.kv_blocks, self.m = block_size, kv_blocks, metrics
        self.cv = threading.Condition()
        self.waiting, self.running = deque(), []
        self.lost, self.wedges, self.dead = set(), set(), False
        self.peers, self.acks, self.step_no = {}, {}, 0   # headless ranks' sockets; the last step each acked
        self.stepping = False   # a step is in progress: aborts wait for its end, as in vLLM's EngineCore
        self.publish()

    # -- switches, from signal handlers and rank watchers
    def set_wedge(self, who, on):
        with self.cv:
            was = bool(self.wedges)
            (self.wedges.add if on else self.wedges.discard)(who)
            now = bool(self.wedges)
            self.cv.notify_all()
        if now != was:
            log(f"wedge {'ON' if now else 'OFF'} ({who}): " + (
                "/health and /v1/models answer, no token is produced, engine metrics frozen" if now else
                "the engine steps again"))
        else:
            log(f"{who}: wedge switch {'on' if on else 'off'}; engine still {'wedged' if now else 'not wedged'}")

    def toggle_wedge(self, who):
        with self.cv:
            on = who not in self.wedges
        self.set_wedge(who, on)

    def rank_lost(self, rank):
        with self.cv:
            self.lost.add(rank)
            busy = bool(self.running or self.waiting)
            self.cv.notify_all()
        log(f"rank 0: rank {rank} disconnected; " + (
            "the engine is busy: its next step fails" if busy else
            "idle, so nothing happens until the next inference request (as real vLLM: /health stays 200)"))

    # -- requests
    def submit(self, req):
        with self.cv:
            if self.dead:
                return False
            self.waiting.append(req)
            self.cv.notify_all()
        return True

    def abort(self, req):
        """The client went away. As in vLLM, the abort goes to the engine, which takes it between steps: a
        wedged one, or one whose step waits for a stopped rank, changes nothing (its metrics stay frozen)."""
        with self.cv:
            req.aborted = True
            if req in self.waiting and not self.wedges and not self.stepping:
                self.waiting.remove(req)
                self.finished(req, "abort", time.time())
                self.publish()

    # -- the loop
    def loop(self):
        while True:
            with self.cv:
                while not self.dead and (self.wedges or not (self.waiting or self.running)):
                    if not self.wedges:
                        self.publish()
                    self.cv.wait()
                if self.dead:
                    return
                if self.lost:
                    return self.die()
                plan = self.schedule()
                self.step_no += 1
                step, step_start, self.stepping = self.step_no, time.monotonic(), True
            self.collective_start(step)
            time.sleep(max(0.0, self.token_s - (time.monotonic() - step_start)))   # the step's compute
            with self.cv:
                self.collective_wait(step)
                self.stepping = False
                if self.wedges:   # stuck inside the step: nothing comes out until unwedged
                    continue
                if self.lost:
                    return self.die()
                self.step_done(plan)

    def schedule(self):
        """vLLM's scheduler, reduced: the step's token budget (--max-num-batched-tokens) goes to the
        running requests first (one token for each in decode, the next chunk of a prompt still in
        prefill), then to waiting requests admitted while --max-num-seqs allows; a prompt longer than
        the budget left is prefilled in chunks, one per step. -> {request: tokens this step}."""
        budget, plan = self.batch, {}
        for r in self.running:
            if budget <= 0:
                break
            plan[r] = min(budget, r.prompt_tokens - r.computed) if r.computed < r.prompt_tokens else 1
            budget -= plan[r]
        while self.waiting and len(self.running) < self.max_seqs and budget > 0:
            r = self.waiting.popleft()
            if r.aborted:   # given up while the engine was wedged
                self.finished(r, "abort", time.time())
                continue
            r.scheduled = time.time()
            self.running.append(r)
            self.m.pc_queries.labels(*self.m.lv).inc(r.prompt_tokens)   # vLLM: counted at scheduling
            if r.images:
                self.m.mm_queries.labels(*self.m.lv).inc(r.images)
            plan[r] = min(budget, r.prompt_tokens)
            budget -= plan[r]
        return plan

    def step_done(self, plan):
        """The step's outputs: prefill chunks computed; a request whose prefill completed counts its
        prompt tokens now and, like every request in decode, gets its next token. Stand-in behaviour
        (measured, vLLM 0.32 CPU): iteration stats come only from a step's outputs, so a step that only
        computed a prefill chunk records nothing: the token totals and vllm:iteration_tokens_total stay
        as they were (its one observation comes with the first token: the whole prompt plus that
        token); only the KV-cache use grows."""
        m, lv = self.m, self.m.lv
        now, generated, prefill = time.time(), 0, 0
        for r in list(self.running):
            if r.aborted:
                self.finished(r, "abort", now)
                continue
            if r not in plan:
                continue
            if r.computed < r.prompt_tokens:
                r.computed += plan[r]
                if r.computed < r.prompt_tokens:
                    continue
                prefill += r.prompt_tokens
                m.prompt_tokens.labels(*lv).inc(r.prompt_tokens)
                m.prompt_by_source.labels(*lv, "local_compute").inc(r.prompt_tokens)
                m.h_max_gen.observe(r.max_tokens, *lv)
                m.h_n.observe(1, *lv)
            if r.done < len(r.out):
                kind, text = r.out[r.done]
                r.done += 1
                generated += 1
                if r.first is None:
                    r.first = now
                    m.h_ttft.observe(now - r.arrival, *lv)
                else:
                    m.h_itl.observe(now - r.last, *lv)
                r.last = now
                r.events.put(("token", kind, text))
            if r.done >= len(r.out):
                self.finished(r, r.finish, now)
        m.gen_tokens.labels(*lv).inc(generated)
        if generated:
            m.h_iter.observe(prefill + generated, *lv)
        self.publish()

    # -- the collective every step is (stand-in behaviour: tensor parallel all-reduces in each step)
    def collective_start(self, step):
        for rank, conn in list(self.peers.items()):
            try:
                conn.sendall(f"step {step}\n".encode())
            except OSError:
                pass   # its watcher sees the socket close and marks the rank lost

    def ack(self, rank, step):
        with self.cv:
            self.acks[rank] = step
            self.cv.notify_all()

    def collective_wait(self, step):
        """Wait (the lock released) until every headless rank did its part of the step. A stopped rank
        (SIGSTOP) never does: the step never ends, no token comes out, the engine's metrics stay as
        they were, and /health and /metrics keep answering, as with a collective stuck in NCCL."""
        def done():
            return self.dead or self.lost or all(self.acks.get(k, 0) >= step for k in self.peers)
        if not self.cv.wait_for(done, timeout=5):
            late = sorted(k for k in self.peers if self.acks.get(k, 0) < step)
            log(f"rank 0: step {step} waits for rank(s) {', '.join(map(str, late))} (5 s and counting)")
            self.cv.wait_for(done)
            log(f"rank 0: step {step} ended after the late rank(s) answered")

    def finished(self, r, reason, now):
        if r in self.running:
            self.running.remove(r)
        m, lv = self.m, self.m.lv
        m.success.labels("0", reason, self.name).inc()
        scheduled = r.scheduled or now
        first, last = r.first or now, r.last or now
        m.h_e2e.observe(now - r.arrival, *lv)
        m.h_queue.observe(scheduled - r.arrival, *lv)
        m.h_prefill.observe(first - scheduled, *lv)
        m.h_inference.observe(now - scheduled, *lv)
        m.h_decode.observe(last - first, *lv)
        m.h_preempt.observe(0, *lv)
        m.h_kv_computed.observe(r.prompt_tokens, *lv)
        m.h_prompt.observe(r.prompt_tokens, *lv)
        m.h_gen.observe(r.done, *lv)
        m.h_tpot.observe((last - first) / (r.done - 1) if r.done > 1 else 0.0, *lv)
        m.h_max_tokens.observe(r.max_tokens, *lv)
        r.events.put(("done", reason))

    def publish(self):
        """The scheduler stats vLLM publishes after each step (gauges)."""
        m, lv = self.m, self.m.lv
        m.running.labels(*lv).set(len(self.running))
        m.waiting.labels(*lv).set(len(self.waiting))
        m.waiting_by.labels(*lv, "capacity").set(len(self.waiting))
        m.waiting_by.labels(*lv, "deferred").set(0)
        used = sum(-(-(r.computed + r.done) // self.block_size) for r in self.running)
        m.kv.labels(*lv).set(min(1.0, used / self.kv_blocks) if self.kv_blocks else 0.0)

    def die(self):
        """Stand-in behaviour: what real vLLM logs and does when a collective fails because a rank is gone."""
        self.dead = True
        ranks = ", ".join(map(str, sorted(self.lost)))
        log(f"ERROR EngineCore encountered a fatal error: rank(s) {ranks} gone "
            f"(stand-in for gloo/NCCL 'Connection closed by peer')")
        log("ERROR AsyncLLM output_handler failed.")
        log(f"vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEAD}")
        for r in list(self.running) + list(self.waiting):
            r.events.put(("error",))
        self.running, self.waiting = [], deque()
        self.cv.notify_all()


# ---- HTTP API -----------------------------------------------------------------------------------------

class Server(ThreadingHTTPServer):
    daemon_threads = True
    engine = None
    stopping = False

    def terminate_if_errored(self):
        """vLLM's terminate_if_errored: stop the API server when the engine is dead, unless
        VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1. Stand-in behaviour: listener closed after ~0.1 s (uvicorn's
        tick), process exits 0 about 1 s after the failure (measured 0.6-0.7 s)."""
        if not self.engine.dead or self.stopping or os.environ.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "0") != "0":
            return
        self.stopping = True

        def stop():
            t0 = time.monotonic()
            time.sleep(0.1)
            log("Shutting down (the engine is dead; as real vLLM, exiting 0)")
            self.shutdown()
            self.server_close()
            log("Waiting for application shutdown.")
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
            log("Application shutdown complete. Finished server process; exit code 0")
            os._exit(0)
        threading.Thread(target=stop, daemon=True).start()

    def watchdog(self):
        """vLLM's watchdog_loop: every 5 s; catches a death seen only by streams."""
        while True:
            time.sleep(5.0)
            self.terminate_if_errored()


class Api(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "lab-engine"
    cfg = {}

    def log_message(self, fmt, *a):
        log(f'{self.client_address[0]} "{self.requestline}" {a[1] if len(a) > 1 else ""}')

    def send_response(self, code, message=None):
        self._code = code
        super().send_response(code, message)

    def send_header(self, key, value):
        if key.lower() == "content-length":
            self._resp_len = int(value)
        super().send_header(key, value)

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

    def instrumented(self, method, fn):
        self._code, self._resp_len, t0 = 0, 0, time.monotonic()
        try:
            fn()
        finally:
            if self._code:
                try:
                    req_len = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    req_len = 0
                with self.server.engine.cv:
                    self.cfg["metrics"].http(self.path.split("?")[0], method, self._code, req_len,
                                             self._resp_len, time.monotonic() - t0)

    def do_GET(self):
        self.instrumented("GET", self.get)

    def do_POST(self):
        self.instrumented("POST", self.post)

    def get(self):
        path = self.path.split("?")[0]
        engine = self.server.engine
        if path == "/health":   # vLLM: 503 once the engine is known dead; a lost rank alone is not seen
            self.send_response(503 if engine.dead else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/metrics":
            with engine.cv:
                body = self.cfg["metrics"].render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=1.0.0; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
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

    def post(self):
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
            reasoning, content, call, prompt_tokens, images, tools = self.respond(req, chat)
        except ValueError as e:
            self.send_json(400, error(400, str(e)))
            return
        engine = self.server.engine
        if engine.dead:   # vLLM: "if self.engine_client.errored: raise dead_error", stream or not
            return self.engine_dead()
        if not self.cfg["reasoning"] or not chat:
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
        out = [("reasoning", t) for t in rtoks] + [("content", t) for t in toks] + ([("tool", call)] if call else [])
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        r = Request(rid, prompt_tokens, out, "length" if finish == "length" else "stop",
                    max_tokens or max(1, self.cfg["max_len"] - prompt_tokens), images)
        if not engine.submit(r):
            return self.engine_dead()
        tool_mode = chat and tools is not None and self.cfg["auto_tools"]
        if req.get("stream"):
            self.stream(req, chat, r, finish, call, tool_mode)
        else:
            self.whole(chat, r, finish, call, tool_mode)

    def engine_dead(self):
        self.send_json(500, DEAD_ERROR)
        self.server.terminate_if_errored()

    def next_event(self, r):
        """The engine's next event for r; None (and the request aborted) when the client went away."""
        while True:
            try:
                return r.events.get(timeout=0.5)
            except queue.Empty:
                pass
            try:
                gone = (select.select([self.connection], [], [], 0)[0]
                        and self.connection.recv(1, socket.MSG_PEEK) == b"")
            except OSError:
                gone = True
            if gone:
                log(f"client went away during {r.rid}")
                self.server.engine.abort(r)
                return None

    def usage(self, r):
        usage = {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.done,
                 "prompt_tokens_details": {"cached_tokens": 0}}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return usage

    def count_tool_parse(self, mode, called):
        with self.server.engine.cv:
            self.cfg["metrics"].tool_parser.labels(mode, self.cfg["name"], "tool_call" if called else "no_tool_call",
                                                   "chat_completions").inc()

    def respond(self, req, chat):
        if not chat:
            prompt = req.get("prompt", "")
            prompt = "\n".join(map(str, prompt)) if isinstance(prompt, list) else str(prompt)
            r, c, _ = answer(prompt)
            return r, c, None, count_tokens(prompt), 0, None
        msgs = req.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ValueError("messages must be a non-empty list")
        tools = req.get("tools") or None
        choice = req.get("tool_choice", "auto" if tools else "none")
        if tools and choice == "auto" and not self.cfg["auto_tools"]:
            raise ValueError('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
        parsed = tools if tools and choice == "auto" else None
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
        return r, c, call, count_tokens(all_text) + 256 * len(images), len(images), parsed

    def whole(self, chat, r, finish, call, tool_mode):
        parts = {"reasoning": [], "content": []}
        while True:
            ev = self.next_event(r)
            if ev is None:
                return
            if ev[0] == "error":
                return self.engine_dead()
            if ev[0] == "done":
                break
            if ev[1] in parts:
                parts[ev[1]].append(ev[2])
        if ev[1] == "abort":
            return
        reasoning, content = "".join(parts["reasoning"]), "".join(parts["content"])
        base = {"id": r.rid, "created": int(time.time()), "model": self.cfg["name"], "usage": self.usage(r)}
        if tool_mode:
            self.count_tool_parse("non_streaming", bool(call))
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

    def stream(self, req, chat, r, finish, call, tool_mode):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        obj = "chat.completion.chunk" if chat else "text_completion"
        created = int(time.time())

        def write(data):
            self.wfile.write(b"data: " + data.encode() + b"\n\n")
            self.wfile.flush()

        def send(choices, extra=None):
            chunk = {"id": r.rid, "object": obj, "created": created, "model": self.cfg["name"], "choices": choices}
            write(json.dumps(dict(chunk, **(extra or {}))))

        def delta(d, fin=None):
            if chat:
                send([{"index": 0, "delta": d, "logprobs": None, "finish_reason": fin}])
            else:
                send([{"index": 0, "text": d.get("content", ""), "logprobs": None, "finish_reason": fin}])

        first = True
        try:
            while True:
                ev = self.next_event(r)
                if ev is None:
                    return
                if ev[0] == "error":   # vLLM: the error as the next chunk, then [DONE]
                    write(json.dumps(DEAD_ERROR))
                    write("[DONE]")
                    return
                if ev[0] == "done":
                    break
                if first and chat:   # vLLM sends the role chunk with the first output
                    delta({"role": "assistant", "content": ""})
                first = False
                kind, text = ev[1], ev[2]
                if tool_mode:
                    self.count_tool_parse("streaming", kind == "tool")
                if kind == "reasoning" and chat:
                    delta({"reasoning_content": text})
                elif kind == "content":
                    delta({"content": text})
                elif kind == "tool":
                    delta({"tool_calls": [{"index": 0, "id": "chatcmpl-tool-" + uuid.uuid4().hex[:24],
                                           "type": "function", "function": text}]})
            if ev[1] == "abort":
                return
            if first and chat:
                delta({"role": "assistant", "content": ""})
            delta({"content": ""} if chat else {}, finish)
            if self.cfg["force_usage"] or (req.get("stream_options") or {}).get("include_usage"):
                send([], {"usage": self.usage(r)})
            write("[DONE]")
        except (BrokenPipeError, ConnectionResetError):
            log(f"client went away during {r.rid}")
            self.server.engine.abort(r)


def error(code, msg, kind="BadRequestError"):
    return {"object": "error", "message": msg, "type": kind, "param": None, "code": code}


def main():
    signal.signal(signal.SIGTERM, lambda *_: (log("SIGTERM; exiting"), os._exit(0)))
    signal.signal(signal.SIGINT, lambda *_: (log("SIGINT; exiting"), os._exit(0)))
    model, o = parse_args(sys.argv[1:])
    rank, nnodes = int(o.get("node-rank", 0)), int(o.get("nnodes", 1))
    addr, mport = str(o.get("master-addr", "127.0.0.1")), int(o.get("master-port", 29500))
    name = str(o.get("served-model-name", model))
    log(f"STAND-IN for the dsv41 serving image (no GPU, no model): rank {rank} of {nnodes}, "
        f"model {model}, served as {name}")
    vlog("APIServer", "api_utils.py:286", f"non-default args: {{'model_tag': {model!r}}}")
    on_head_loss = os.environ.get("LAB_ENGINE_WORKER_ON_HEAD_LOSS", "hang")
    if on_head_loss not in ("hang", "exit"):
        fail(f"LAB_ENGINE_WORKER_ON_HEAD_LOSS={on_head_loss!r}: use hang or exit")
    check_inputs(model)
    log(f"plan {os.environ['ST_EXL3_PLAN']} readable; VLLM_HOST_IP={os.environ.get('VLLM_HOST_IP', '-')}")
    delay = float(os.environ.get("LAB_ENGINE_DELAY_S", "2"))
    log(f"loading (simulated, {delay:g} s)")
    vlog(f"Worker_TP{rank}", "cpu_model_runner.py:68", f"Starting to load model {model}...")
    time.sleep(delay)
    vlog(f"Worker_TP{rank}", "default_loader.py:501", f"Loading weights took {delay:.2f} seconds")
    if rank > 0 or o.get("headless"):
        log(f"rank {rank}: when rank 0 goes away: {on_head_loss} (LAB_ENGINE_WORKER_ON_HEAD_LOSS)")
        run_headless(rank, addr, mport, on_head_loss)
    max_len = int(o.get("max-model-len", 4096))
    block_size = int(o.get("block-size", 16))
    kv_bytes = int(float(o.get("kv-cache-memory-bytes", 2.7e9)))
    kv_blocks = max(1, int(kv_bytes / KV_BYTES_PER_TOKEN) // block_size)
    vlog("Worker_TP0", "gpu_worker.py:436", f"Available KV cache memory: {kv_bytes / 2**30:.2f} GiB")
    vlog("EngineCore", "kv_cache_utils.py:2327", f"GPU KV cache size: {kv_blocks * block_size:,} tokens, "
         f"Maximum concurrency for {max_len:,} tokens per request: {kv_blocks * block_size / max_len:.2f}x")
    metrics = Metrics(name, max_len, block_size, kv_blocks, kv_bytes if "kv-cache-memory-bytes" in o else "None", o)
    engine = Engine(name, float(os.environ.get("LAB_ENGINE_TOKEN_S", "0.01")), int(o.get("max-num-seqs", 256)),
                    int(o.get("max-num-batched-tokens", 2048)), block_size, kv_blocks, metrics)
    signal.signal(signal.SIGUSR1, lambda *_: threading.Thread(
        target=engine.toggle_wedge, args=("SIGUSR1 on rank 0",), daemon=True).start())
    t = time.monotonic()
    ranks = gather_ranks(addr, mport, nnodes, engine) if nnodes > 1 else {}
    engine.peers = ranks
    vlog("EngineCore", "core.py:402", f"init engine (profile, create kv cache, warmup model) took "
         f"{time.monotonic() - t:.2f} s")
    try:
        mm = json.loads(o.get("limit-mm-per-prompt", "{}")).get("image", 1)
    except (ValueError, AttributeError):
        mm = 1
    Api.cfg = {"name": name, "model": model, "started": int(time.time()), "max_len": max_len, "max_images": int(mm),
               "api_key": os.environ.get("VLLM_API_KEY") or (o.get("api-key") if isinstance(o.get("api-key"), str) else ""),
               "reasoning": "reasoning-parser" in o, "force_usage": "enable-force-include-usage" in o,
               "auto_tools": "enable-auto-tool-choice" in o and "tool-call-parser" in o, "metrics": metrics}
    host, port = str(o.get("host", "0.0.0.0")), int(o.get("port", 8000))
    try:
        httpd = Server((host, port), Api)
    except OSError as e:
        fail(f"cannot listen on {host}:{port}: {e.strerror}")
    httpd.engine = engine
    threading.Thread(target=engine.loop, daemon=True).start()
    threading.Thread(target=httpd.watchdog, daemon=True).start()
    log(f"all {len(ranks) + 1} ranks present; API on http://{host}:{port} "
        f"(auth {'on' if Api.cfg['api_key'] else 'off'}; one engine step per {engine.token_s:g} s, "
        f"max {engine.max_seqs} running)")
    log("Application startup complete.")
    httpd.serve_forever(poll_interval=0.1)
    while True:   # shut down after the engine died: terminate_if_errored's thread exits the process
        time.sleep(1)


if __name__ == "__main__":
    main()
