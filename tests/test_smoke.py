"""dsv41.client.smoke against real OpenAI-compatible servers (llama-cpp-python, transformers serve)."""
import json
import re
import struct
import zlib

import pytest
import requests

from dsv41.client.api import load_key, normalize_base
from dsv41.errors import UserError
from dsv41.client.smoke import CHECKS, TEXT_PROMPT, red_blue_png
from dsv41.client.smoke import run_smoke
from oddserver import OddServer
from servers import free_port, llama, run_cli, standin, tfserve  # noqa: F401  (fixtures)

LINE = re.compile(r"^(text|tools|vision|reasoning|stream)\s+(PASS|FAIL|SKIP) (.+)$")


def parse_lines(stdout):
    found = {}
    for line in stdout.splitlines():
        m = LINE.match(line)
        if m:
            found[m.group(1)] = (m.group(2), m.group(3))
    assert set(found) == {"text", "tools", "vision", "reasoning", "stream"}, stdout
    return found


def direct_answer(server):
    """What the server answers to the text check's question, asked directly."""
    headers = {"Authorization": f"Bearer {server['key']}"} if server["key"] else {}
    r = requests.post(server["url"] + "/v1/chat/completions", headers=headers, timeout=300, json={
        "model": server["model"], "temperature": 0, "messages": [{"role": "user", "content": TEXT_PROMPT}]})
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


def test_normalize_base_accepts_with_or_without_v1():
    assert normalize_base("127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert normalize_base("http://h:8000/v1/") == "http://h:8000/v1"
    assert normalize_base("http://h:8000/") == "http://h:8000/v1"
    with pytest.raises(UserError):
        normalize_base("ftp://h/")


def test_key_from_env_then_file(tmp_path):
    f = tmp_path / "api_key"
    f.write_text("from-file\n")
    assert load_key(str(f), env={"DSV41_API_KEY": "from-env"}) == "from-env"
    assert load_key(str(f), env={}) == "from-file"
    with pytest.raises(UserError, match="not found"):
        load_key(str(tmp_path / "missing"), env={})


def test_vision_image_is_red_left_blue_right():
    data = red_blue_png(64, 8)
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    w, h = struct.unpack(">II", data[16:24])
    idat = data.index(b"IDAT")
    size = struct.unpack(">I", data[idat - 4:idat])[0]
    rows = zlib.decompress(data[idat + 4: idat + 4 + size])
    row = rows[1: 1 + w * 3]
    r_left, g_left, b_left = row[0:3]
    r_right, g_right, b_right = row[-3:]
    assert (w, h) == (64, 8) and r_left > 200 > b_left and b_right > 200 > r_right


@pytest.mark.servers
def test_smoke_llama_reports_what_the_model_answers(llama):
    r = run_cli("smoke", llama["url"] + "/v1", env={"DSV41_API_KEY": llama["key"]})
    lines = parse_lines(r.stdout)
    status, evidence = lines["text"]
    answer = direct_answer(llama)
    tail = " ".join(answer.split())[-40:]
    assert tail in evidence and "usage: prompt" in evidence, (evidence, answer)
    assert (status == "PASS") == ("391" in answer)
    # llama-cpp streams end with [DONE] and carry no usage: tokens are counted
    assert "ended by [DONE]" in lines["stream"][1] and "(count)" in lines["stream"][1]
    assert lines["reasoning"][0] == "SKIP"
    assert r.returncode == (1 if any(s == "FAIL" for s, _ in lines.values()) else 0)
    assert r.stdout.strip().splitlines()[-1].startswith("smoke ")


@pytest.mark.servers
def test_smoke_named_tool_choice_gets_a_real_tool_call(llama):
    r = run_cli("smoke", llama["url"], "--tool-choice", "named", "--json", env={"DSV41_API_KEY": llama["key"]})
    out = json.loads(r.stdout)
    tools = next(c for c in out["checks"] if c["check"] == "tools")
    assert "call get_weather(" in tools["evidence"], tools
    assert out["model"] == "smollm2" and r.returncode == (0 if out["ok"] else 1)


@pytest.mark.servers
def test_smoke_wrong_key_is_one_line(llama):
    r = run_cli("smoke", llama["url"], env={"DSV41_API_KEY": "wrong"})
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "rejected the API key (HTTP 401)" in r.stderr, r.stderr
    assert "wrong" not in r.stderr


@pytest.mark.servers
def test_smoke_key_file(llama, tmp_path):
    key = tmp_path / "api_key"
    key.write_text(llama["key"] + "\n")
    r = run_cli("smoke", llama["url"], "--key-file", str(key), "--json")
    assert json.loads(r.stdout)["model"] == "smollm2", r.stderr
    r = run_cli("smoke", llama["url"], "--key-file", str(tmp_path / "nope"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not found" in r.stderr


def test_smoke_unreachable_is_one_line():
    url = f"http://127.0.0.1:{free_port()}"
    r = run_cli("smoke", url)
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and "cannot reach" in r.stderr, r.stderr


@pytest.mark.servers
def test_smoke_transformers_serve(tfserve):
    r = run_cli("smoke", tfserve["url"], "--json")
    out = json.loads(r.stdout)
    checks = {c["check"]: c for c in out["checks"]}
    assert out["model"] == tfserve["model"]
    # the tiny random model cannot do arithmetic: the FAIL shows its real answer
    assert checks["text"]["status"] == "FAIL"
    assert " ".join(direct_answer(tfserve).split())[-40:] in checks["text"]["evidence"]
    # a text-only model drops the image with HTTP 200: judged by the answer, not the status
    assert checks["vision"]["status"] == "FAIL" and "want red before blue" in checks["vision"]["evidence"]
    # no [DONE]; usage on the final chunk
    assert "finish_reason=" in checks["stream"]["evidence"] and "(usage)" in checks["stream"]["evidence"]
    assert checks["reasoning"]["status"] == "SKIP" and r.returncode == 1



def test_smoke_reasoning_pass_and_skip(standin, capsys):
    srv, url = standin
    srv.ttft, srv.itl, srv.tokens = 0.01, 0.001, 6
    assert run_smoke(url, None) == 1  # a stand-in cannot do sums
    assert re.search(r"^reasoning SKIP ", capsys.readouterr().out, re.M)
    srv.reasoning = 2
    run_smoke(url, None)
    out = capsys.readouterr().out
    assert re.search(r"^reasoning PASS reasoning 12 chars", out, re.M), out


@pytest.mark.servers
def test_smoke_wrong_model_is_one_line_naming_the_served_ones(llama):
    # llama-cpp answers any model name; the check against /v1/models is what catches it
    r = run_cli("smoke", llama["url"], "--model", "nope", env={"DSV41_API_KEY": llama["key"]})
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert r.stderr.count("\n") == 1 and "model 'nope' is not served" in r.stderr and "'smollm2'" in r.stderr


def test_smoke_answers_that_never_end_fail_at_the_deadline(standin):
    srv, url = standin
    srv.endless, srv.ttft, srv.itl = True, 0.01, 0.01  # a looping model: no answer ever completes
    r = run_cli("smoke", url, "--request-timeout-s", "1")
    lines = parse_lines(r.stdout)
    for name in ("text", "tools", "vision"):
        assert lines[name] == ("FAIL", "no answer within 1 s (--request-timeout-s)")
    assert lines["stream"][0] == "FAIL" and "ended by the 1 s deadline" in lines["stream"][1]
    assert r.returncode == 1


def test_smoke_json_shape_is_pinned(standin):
    """dsv41.smoke/1: a reader may rely on these keys and types; changing them needs /2."""
    srv, url = standin
    srv.ttft, srv.itl, srv.tokens = 0.01, 0.001, 6
    out = json.loads(run_cli("smoke", url, "--json").stdout)
    assert {k: type(v) for k, v in out.items()} == {"schema": str, "url": str, "model": str, "ok": bool,
                                                   "error": type(None), "checks": list}
    assert out["schema"] == "dsv41.smoke/1" and [c["check"] for c in out["checks"]] == list(CHECKS)
    for c in out["checks"]:
        assert {k: type(v) for k, v in c.items()} == {"check": str, "status": str, "evidence": str}
        assert c["status"] in ("PASS", "FAIL", "SKIP")
    r = run_cli("smoke", url, "--json", "--model", "nope")
    out = json.loads(r.stdout)
    assert r.returncode == 2 and out["schema"] == "dsv41.smoke/1" and out["checks"] == [] and out["ok"] is False
    assert set(out) == {"schema", "url", "model", "ok", "error", "checks"} and "'standin'" in out["error"]


MODELS = {"object": "list", "data": [{"id": "m", "max_model_len": 4096}]}
ANSWER = {"choices": [{"message": {"role": "assistant", "content": "391"}, "finish_reason": "stop"}]}


@pytest.mark.parametrize("models", [[{"id": "m"}], 7, {"data": 5}, {"data": "m"}],
                         ids=["array", "number", "data number", "data string"])
def test_a_models_answer_of_another_shape_is_one_line_and_a_server_fault(models, tmp_path):
    with OddServer(models) as srv:
        smoke = run_cli("smoke", srv.url)
        bench = run_cli("bench", "--url", srv.url, "--out", str(tmp_path / "b.json"))
    for r in (smoke, bench):
        assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
        [line] = [ln for ln in r.stderr.splitlines() if ln.startswith("dsv41:")]
        assert "is this an OpenAI-compatible API?" in line or "lists no model" in line, line


ODD_STREAM = (b'data: {"choices": 5, "usage": "x"}\n\ndata: [1, 2]\n\ndata: "text"\n\n'
              b'data: {"choices": [{"delta": {"tool_calls": [5, {"function": "f"}]}, "finish_reason": {"a": 1}}]}\n\n'
              b'data: {"choices": [{"delta": [1], "text": 5}], "usage": {"completion_tokens": "many"}}\n\n'
              b"data: [DONE]\n\n")


@pytest.mark.parametrize("chat", [{"choices": "nope", "usage": [1]}, {"choices": [5]},
                                  {"choices": [{"message": {"content": {"x": 1}, "tool_calls": [5]}}], "usage": "x"},
                                  {"choices": [{"message": {"tool_calls": [{"function": {"name": 5}}]}}]}])
def test_answers_of_another_shape_fail_their_checks_without_a_traceback(chat, tmp_path):
    with OddServer(MODELS, chat=chat, stream=ODD_STREAM) as srv:
        smoke = run_cli("smoke", srv.url, "--json")
        bench = run_cli("bench", "--url", srv.url, "--out", str(tmp_path / "b.json"), "--prefill", "32",
                        "--reps", "1", "--conc", "1")
    out = json.loads(smoke.stdout)
    assert smoke.returncode == 1 and "Traceback" not in smoke.stderr, smoke.stderr
    assert [c["check"] for c in out["checks"]] == list(CHECKS) and out["checks"][0]["status"] == "FAIL"
    assert bench.returncode == 3 and "Traceback" not in bench.stderr, bench.stderr
    assert "prefill 32: the stream ended without a token" in bench.stderr


def test_a_stream_cut_mid_message_fails_that_check_and_keeps_every_other(tmp_path):
    with OddServer(MODELS, chat=ANSWER, stream=b'data: {"choices": [{"delta": {"content": "39', cut=True) as srv:
        r = run_cli("smoke", srv.url, "--json")
    out = json.loads(r.stdout)
    checks = {c["check"]: c for c in out["checks"]}
    assert r.returncode == 1 and list(checks) == list(CHECKS) and out["error"] is None, r.stderr
    assert checks["text"]["status"] == "PASS" and checks["tools"]["status"] == "FAIL"
    assert checks["stream"]["status"] == "FAIL" and "broke" in checks["stream"]["evidence"], checks["stream"]
