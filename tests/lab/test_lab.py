"""The two-node lab works: nodes boot real systemd, ssh between them, one image by digest on both,
and the stand-in engine keeps the rank contract the rank units rely on."""
import base64
import json
import shlex
import struct
import time
import zlib

import pytest

pytestmark = pytest.mark.lab

KEY = "lab-test-key-9f3c"
MODEL = "deepseek-v4.1-flash"
COMP = {"cudagraph_mode": "FULL_DECODE_ONLY", "custom_ops": ["all"],
        "cudagraph_capture_sizes": [1, 2, 3, 4, 5, 6, 7, 8, 12, 16]}
SPEC = {"method": "dspark", "num_speculative_tokens": 7, "draft_tensor_parallel_size": 2,
        "attention_backend": "B12X", "draft_sample_method": "greedy", "rejection_sample_method": "standard",
        "enable_adaptive_verification": True}
ENGRAM = {"cpu_offload": False, "table_memory": "disk", "disk_resident_scales": False,
          "disk_prefetch_max_tokens": 0, "projection_tp": False}


def vllm_argv(rank, head_ip, port=8100, mport=29700):  # not the deployment's ports: it may be running
    """The serving-config argv (spec/serving-config.md) the rank units pass."""
    argv = ["/model", "--served-model-name", MODEL, "--dtype", "bfloat16", "--tensor-parallel-size", "2",
            "--nnodes", "2", "--master-addr", head_ip, "--master-port", str(mport), "--kv-cache-dtype", "fp8",
            "--block-size", "256", "--swa-block-size", "128", "--kv-cache-memory-bytes", "2700000000",
            "--gpu-memory-utilization", "0.88", "--max-model-len", "262144", "--max-num-seqs", "2",
            "--max-num-batched-tokens", "2048", "--max-cudagraph-capture-size", "16",
            "--compilation-config", json.dumps(COMP), "--enable-chunked-prefill", "--async-scheduling",
            "--enable-prefix-caching", "--safetensors-load-strategy", "lazy", "--engram-config", json.dumps(ENGRAM),
            "--attention-backend", "B12X", "--linear-backend", "b12x", "--moe-backend", "b12x",
            "--speculative-config", json.dumps(SPEC), "--generation-config", "vllm",
            "--tokenizer-mode", "deepseek_v41", "--limit-mm-per-prompt", '{"image":1}']
    if rank:
        return argv + ["--node-rank", str(rank), "--headless"]
    return argv + ["--node-rank", "0", "--host", "0.0.0.0", "--port", str(port), "--reasoning-parser",
                   "deepseek_v41", "--tool-call-parser", "deepseek_v41", "--enable-auto-tool-choice",
                   "--enable-prompt-tokens-details", "--enable-force-include-usage"]


def rank_cmd(lab, node, rank):
    """`docker run` as a rank unit runs it: foreground, host network, model and plans mounted read-only,
    the key from a mode-600 env file (never in argv)."""
    return ("docker run --rm --init --network host --name lab-r%d -v /tmp/lab/model:/model:ro "
            "-v /tmp/lab/plans:/plans:ro -e ST_EXL3_PLAN=/plans/plan.json -e LAB_ENGINE_DELAY_S=0.5 "
            "-e VLLM_HOST_IP=%s --env-file /tmp/lab/key.env %s %s"
            % (rank, lab.ip[node], lab.engine_ref, shlex.join(vllm_argv(rank, lab.ip["head"]))))


@pytest.fixture(scope="module")
def ranks_ready(lab):
    prep = ("set -e; rm -rf /tmp/lab; mkdir -p /tmp/lab/model /tmp/lab/plans; echo '{}' > /tmp/lab/model/config.json; "
            "echo '{\"qdir\": \"/model/exl3/qn\"}' > /tmp/lab/plans/plan.json; "
            f"umask 077; echo VLLM_API_KEY={KEY} > /tmp/lab/key.env; docker pull -q {lab.engine_ref} >/dev/null")
    for node in ("head", "worker1"):
        lab.on(node, prep)
    return lab


def curl(lab, path, key=KEY, body=None, check=True):
    cmd = ["curl", "-sS", "-N", "-w", "\n%{http_code}", f"http://{lab.ip['head']}:8100{path}"]
    if key:
        cmd += ["-H", f"Authorization: Bearer {key}"]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    r = lab.on("head", cmd, input=json.dumps(body) if body is not None else None, check=check)
    text, _, code = r.stdout.rpartition("\n")
    return int(code or 0), text


def remove_ranks(lab):
    lab.on("head", "docker rm -f lab-r0 >/dev/null 2>&1", check=False)
    lab.on("worker1", "docker rm -f lab-r1 >/dev/null 2>&1", check=False)


def start_ranks(lab):
    remove_ranks(lab)
    r1 = lab.popen("worker1", rank_cmd(lab, "worker1", 1))
    r0 = lab.popen("head", rank_cmd(lab, "head", 0))
    end = time.time() + 60
    while curl(lab, "/v1/models", check=False)[0] != 200:
        assert r0.poll() is None and r1.poll() is None, (r0.stdout.read() if r0.poll() is not None else r1.stdout.read())
        assert time.time() < end, "rank 0 did not serve /v1/models within 60 s"
        time.sleep(0.5)
    return r0, r1


def stop(lab, *procs):
    remove_ranks(lab)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_nodes_boot_real_systemd_on_their_own_addresses(lab):
    for node, ip in lab.ip.items():
        out = lab.on(node, "hostname; systemctl is-system-running; ip -br -4 addr show scope global").stdout.split("\n")
        assert out[0] == node
        assert out[1] == "running"
        lab_addrs = [w.split("/")[0] for line in out[2:] for w in line.split()[2:] if w.startswith("198.51.100.")]
        assert lab_addrs == [ip]


def test_head_reaches_worker_by_ssh_and_rsync(lab):
    assert lab.on("head", "ssh -o BatchMode=yes worker1 hostname").stdout.strip() == "worker1"
    lab.on("head", "head -c 1000000 /dev/urandom > /tmp/blob && rsync -a /tmp/blob worker1:/tmp/blob")
    sums = {n: lab.on(n, "sha256sum < /tmp/blob").stdout for n in lab.ip}
    assert sums["head"] == sums["worker1"]


def test_password_login_is_refused(lab):
    r = lab.on("head", "ssh -o BatchMode=yes -o PubkeyAuthentication=no -o PreferredAuthentications=password "
               "worker1 true", check=False)
    assert r.returncode == 255 and "Permission denied" in r.stderr


def test_repo_and_venv_usable_inside_head(lab):
    r = lab.on("head", f"cd {shlex.quote(lab.repo)} && PYTHONPATH=lib {lab.venv}/bin/python -c "
               "'import dsv41, doit, sh, requests, huggingface_hub, psutil, jinja2, importlib.metadata as m; "
               "print(m.version(\"doit\"))'")
    assert r.stdout.split()[-1] == "0.37.0"


def test_both_nodes_pull_the_engine_by_digest_to_the_same_image(lab):
    assert "@sha256:" in lab.engine_ref
    ids = {}
    for node in lab.ip:
        lab.on(node, f"docker pull -q {lab.engine_ref}")
        ids[node] = lab.on(node, f"docker image inspect --format '{{{{.Id}}}}' {lab.engine_ref}").stdout.strip()
    assert ids["head"] == ids["worker1"] and ids["head"].startswith("sha256:")


def test_engine_refuses_to_start_without_model_or_plan(lab):
    r = lab.on("worker1", f"docker run --rm {lab.engine_ref} /model --nnodes 2", check=False)
    assert r.returncode == 1 and "/model is not mounted" in r.stdout + r.stderr
    r = lab.on("worker1", f"mkdir -p /tmp/m && docker run --rm -v /tmp/m:/model:ro {lab.engine_ref} /model", check=False)
    assert r.returncode == 1 and "ST_EXL3_PLAN" in r.stdout + r.stderr


def test_rank0_serves_with_auth_and_rank1_hangs_when_rank0_goes(ranks_ready):
    lab = ranks_ready
    r0, r1 = start_ranks(lab)
    try:
        code, body = curl(lab, "/v1/models")
        assert code == 200 and json.loads(body)["data"][0]["id"] == MODEL
        code, body = curl(lab, "/v1/models", key=None)
        assert code == 401 and "error" in json.loads(body)
        assert curl(lab, "/health", key=None)[0] == 200
        lab.on("head", "docker kill lab-r0")
        time.sleep(3)
        assert r1.poll() is None          # as measured with real vLLM: a headless rank outlives its head
    finally:
        stop(lab, r0, r1)
    out = r0.stdout.read() + r1.stdout.read()
    assert "rank 0 went away" in out and KEY not in out


def png(width, height, left, right):
    raw = b"".join(b"\0" + bytes(left) * (width // 2) + bytes(right) * (width - width // 2) for _ in range(height))
    chunk = lambda k, d: struct.pack(">I", len(d)) + k + d + struct.pack(">I", zlib.crc32(k + d))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def sse(body):
    return [json.loads(l[6:]) for l in body.splitlines() if l.startswith("data: {")]


def test_rank0_answers_smoke_prompts_and_dies_after_losing_the_worker(ranks_ready):
    lab = ranks_ready
    r0, r1 = start_ranks(lab)
    try:
        code, body = curl(lab, "/v1/chat/completions", body={
            "model": MODEL, "stream": True, "messages": [{"role": "user", "content": "What is 17 * 23?"}]})
        chunks = sse(body)
        kinds = [k for c in chunks for ch in c["choices"] for k in ch["delta"] if ch["delta"][k]]
        assert code == 200 and kinds.index("reasoning_content") < kinds.index("content")
        assert "391" in "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
        assert chunks[-1]["usage"]["completion_tokens"] > 0 and body.rstrip().endswith("data: [DONE]")

        tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
        code, body = curl(lab, "/v1/chat/completions", body={
            "model": MODEL, "tools": [tool], "messages": [{"role": "user", "content": "Weather in Warsaw now?"}]})
        call = json.loads(body)["choices"][0]["message"]["tool_calls"][0]["function"]
        assert (call["name"], json.loads(call["arguments"])) == ("get_weather", {"city": "Warsaw"})

        url = "data:image/png;base64," + base64.b64encode(png(32, 16, (250, 0, 0), (0, 0, 250))).decode()
        code, body = curl(lab, "/v1/chat/completions", body={"model": MODEL, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Describe the colours."}, {"type": "image_url", "image_url": {"url": url}}]}]})
        assert "red on the left, blue on the right" in json.loads(body)["choices"][0]["message"]["content"]

        lab.on("worker1", "docker kill lab-r1")
        r1.wait(timeout=30)
        time.sleep(0.5)
        assert curl(lab, "/health", key=None)[0] == 200      # real vLLM: nothing shows while idle
        code, body = curl(lab, "/v1/completions", body={"model": MODEL, "prompt": "2+2="})
        assert code == 500 and "EngineCore encountered an issue" in body
        assert r0.wait(timeout=30) == 0                       # ... then rank 0 exits 0
    finally:
        stop(lab, r0, r1)
