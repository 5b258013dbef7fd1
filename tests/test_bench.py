"""dsv41.client.bench: timing accuracy against a stand-in of known timing, failures, and real servers."""
import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from PIL import Image

from dsv41.client.bench import run_bench
from dsv41.client.bench_report import fmt_rate
from servers import free_port, llama, run_cli, standin, tfserve  # noqa: F401  (fixtures)


def near(got, want, tol=0.10):
    return abs(got - want) <= tol * want


def test_timing_within_10_percent(standin, tmp_path):
    srv, url = standin
    out = tmp_path / "b.json"
    assert run_bench(["--url", url, "--out", str(out), "--prefill", "64", "--reps", "3",
                      "--conc", "1", "2", "--kinds", "code", "--dec-reps", "2"]) == 0
    r = json.loads(out.read_text())
    ttft, itl, n = srv.ttft * 1000, srv.itl * 1000, srv.tokens
    for run in r["prefill"][0]["runs"]:
        assert near(run["ttft_ms"], ttft), run
        assert run["tok_s"] == pytest.approx(run["prompt_tokens"] / run["ttft_ms"] * 1000, rel=1e-3)
    for d in r["decode"]:
        c = d["concurrency"]
        assert len(d["requests"]) == 2 * c and all(q["output_tokens"] == n for q in d["requests"])
        assert near(d["ttft_ms"]["mean"], ttft), d["ttft_ms"]
        assert near(d["tpot_ms"]["mean"], itl) and near(d["tpot_ms"]["p99"], itl), d["tpot_ms"]
        assert near(d["itl_ms"]["mean"], itl), d["itl_ms"]
        assert near(d["e2el_ms"]["median"], ttft + (n - 1) * itl), d["e2el_ms"]
        assert near(d["per_stream_tok_s_median"], 1000 / itl)
        assert near(d["aggregate_tok_s"], c * n / ((ttft + (n - 1) * itl) / 1000))
    md = out.with_suffix(".md").read_text()
    assert "| decode code c1 per stream |" in md and "| 40 |" in md  # published two-Spark column


def test_server_500_mid_run_keeps_partial_results(standin, tmp_path):
    srv, url = standin
    srv.fail_after = 2  # prefill and decode c1 succeed; decode c2 gets HTTP 500
    srv.ttft, srv.itl, srv.tokens = 0.01, 0.001, 5
    out = tmp_path / "b.json"
    r = run_cli("bench", "--url", url, "--out", str(out), "--prefill", "32", "--reps", "1",
                "--conc", "1", "2", "--kinds", "code")
    assert r.returncode == 3
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("dsv41:")]
    assert len(errors) == 1 and "decode code c2" in errors[0] and "HTTP 500" in errors[0], r.stderr
    data = json.loads(out.read_text())
    assert [p["tokens"] for p in data["prefill"]] == [32]
    assert [(d["kind"], d["concurrency"]) for d in data["decode"]] == [("code", 1)]
    assert "HTTP 500" in data["error"] and "Stopped early" in out.with_suffix(".md").read_text()


def test_422_on_optional_field_is_retried_without_it(standin, tmp_path):
    srv, url = standin
    srv.strict, srv.reasoning, srv.ttft, srv.itl, srv.tokens = True, 3, 0.01, 0.001, 8
    out = tmp_path / "b.json"
    assert run_bench(["--url", url, "--out", str(out), "--prefill", "32", "--reps", "1", "--conc", "1",
                      "--kinds", "prose"]) == 0
    assert srv.rejected == 2  # once per streamed request, each then retried without stream_options
    req = json.loads(out.read_text())["decode"][0]["requests"][0]
    # reasoning deltas (in `reasoning`) are tokens too; usage came on the final chunk
    assert req["output_tokens"] == 8 and req["reasoning_chars"] == len("think ") * 3


def test_unreachable_url_is_one_line(tmp_path):
    r = run_cli("bench", "--url", f"127.0.0.1:{free_port()}", "--out", str(tmp_path / "b.json"))
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and "cannot reach" in r.stderr, r.stderr


def test_out_is_required(tmp_path):
    r = run_cli("bench", "--url", "127.0.0.1:1")
    assert r.returncode == 2 and "--out" in r.stderr


@pytest.mark.servers
def test_wrong_key_is_one_line(llama, tmp_path):
    r = run_cli("bench", "--url", llama["url"], "--out", str(tmp_path / "b.json"), env={"DSV41_API_KEY": "bad"})
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "rejected the API key" in r.stderr


def check_consistent(r, prefill, concs):
    """Numbers that must agree with each other whatever the server's speed."""
    assert [p["tokens"] for p in r["prefill"]] == prefill
    for p in r["prefill"]:
        for run in p["runs"]:
            assert run["tok_s"] == pytest.approx(run["prompt_tokens"] / run["ttft_ms"] * 1000, rel=1e-3)
    assert [d["concurrency"] for d in r["decode"]] == concs
    for d in r["decode"]:
        reqs = d["requests"]
        assert len(reqs) == d["concurrency"]
        assert d["output_tokens"] == sum(q["output_tokens"] for q in reqs) > d["concurrency"]
        assert d["aggregate_tok_s"] == pytest.approx(d["output_tokens"] / d["wall_s"], rel=1e-2)
        for q in reqs:
            assert q["ttft_ms"] <= q["e2el_ms"]
            if q["output_tokens"] < 2:  # a one-token answer has no TPOT
                continue
            assert q["tok_s"] == pytest.approx(1000 / q["tpot_ms"], rel=1e-2)
            assert q["tpot_ms"] == pytest.approx((q["e2el_ms"] - q["ttft_ms"]) / (q["output_tokens"] - 1), rel=0.05)
        assert d["ttft_ms"]["mean"] <= d["ttft_ms"]["p99"] + 1e-6


@pytest.mark.servers
def test_bench_llama_cpp(llama, tmp_path):
    out = tmp_path / "llama.json"
    r = run_cli("bench", "--url", llama["url"] + "/v1", "--out", str(out), "--label", "llama-cpp smollm2",
                "--prefill", "256", "512", "--reps", "2", "--conc", "1", "2", "--kinds", "short", "--ctx", "1024",
                "--chart", "--request-timeout-s", "30", env={"DSV41_API_KEY": llama["key"]})
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    print(out.with_suffix(".md").read_text())
    check_consistent(data, [256, 512], [1, 2])
    # llama-cpp streams carry no usage: tokens counted from chunks; prompt sizes from its tokenize endpoint
    assert all(q["tokens_from"] == "count" for d in data["decode"] for q in d["requests"])
    assert {run["prompt_tokens_from"] for p in data["prefill"] for run in p["runs"]} == {"tokenize"}
    assert all(near(run["prompt_tokens"], p["tokens"], 0.03) for p in data["prefill"] for run in p["runs"])
    assert near(data["ctx"][0]["prompt_tokens"], 1024, 0.05)
    # why each answer ended is recorded, and shown in the table and the log
    # (a 135M model now and then repeats itself without end: such an answer is cut at --request-timeout-s)
    assert data["ctx"][0]["finish_reason"] in ("stop", "length", "timeout")
    assert all(sum(d["finish"].values()) == d["concurrency"] for d in data["decode"])
    assert "| decode short c2 per stream |" in out.with_suffix(".md").read_text()
    assert "decode short c2: round 1/1:" in r.stderr and "; finish " in r.stderr
    assert data["max_model_len"] is None  # llama-cpp's /v1/models does not give it
    assert Image.open(out.with_suffix(".png")).format == "PNG" and out.with_suffix(".svg").exists()


@pytest.mark.servers
def test_bench_transformers_serve(tfserve, tmp_path):
    out = tmp_path / "tf.json"
    r = run_cli("bench", "--url", tfserve["url"], "--out", str(out), "--label", "transformers serve tiny",
                "--prefill", "256", "512", "--reps", "2", "--conc", "1", "2", "--kinds", "prose", "--greedy")
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    print(out.with_suffix(".md").read_text())
    check_consistent(data, [256, 512], [1, 2])
    # no tokenize endpoint and no usage before the end: prompt sizes are estimates, labelled so
    assert {run["prompt_tokens_from"] for p in data["prefill"] for run in p["runs"]} == {"estimate"}
    # usage arrives on the final chunk: tokens come from it
    assert all(q["tokens_from"] == "usage" for d in data["decode"] for q in d["requests"])


def svg_texts(path):
    """Every piece of text drawn in an SVG (the chart keeps its text as text)."""
    return [t.text for t in ET.parse(path).iter("{http://www.w3.org/2000/svg}text") if t.text]


def test_chart_png_and_svg_show_measured_and_published(standin, tmp_path):
    srv, url = standin
    srv.ttft, srv.itl, srv.tokens = 0.01, 0.001, 8
    out = tmp_path / "run.json"
    assert run_bench(["--url", url, "--out", str(out), "--prefill", "64", "8192", "--reps", "1", "--conc", "1", "2",
                      "--kinds", "code", "--ctx", "256", "--chart"]) == 0
    data = json.loads(out.read_text())
    with Image.open(out.with_suffix(".png")) as im:
        assert im.format == "PNG" and im.width >= 800 and im.height >= 600
        im.load()  # the whole image decodes
    texts = svg_texts(out.with_suffix(".svg"))
    for label in ("prompt length (tokens)", "prefill tok/s", "concurrent streams (prompt kind)",
                  "decode tok/s per stream", "aggregate decode tok/s", "context length (tokens)",
                  "measured", "two-Spark published"):
        assert label in texts, label
    measured = [p["median_tok_s"] for p in data["prefill"]] + [x["prefill_tok_s"] for x in data["ctx"]]
    measured += [d[k] for d in data["decode"] for k in ("per_stream_tok_s_median", "aggregate_tok_s")]
    for value in measured:
        assert fmt_rate(value) in texts, value
    for published in ("2,050", "40", "60"):  # prefill 8192, code c1 per stream, code c2 aggregate
        assert published in texts


def test_commands_that_do_not_chart_do_not_load_matplotlib():
    code = "import sys, dsv41.client.bench, dsv41.client.smoke; print('matplotlib' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_endless_answers_are_cut_at_the_deadline(standin, tmp_path):
    srv, url = standin
    srv.endless, srv.ttft, srv.itl = True, 0.01, 0.005  # a looping model: tokens keep coming
    out = tmp_path / "b.json"
    r = run_cli("bench", "--url", url, "--out", str(out), "--prefill", "32", "--reps", "1", "--conc", "2",
                "--kinds", "code", "--ctx", "64", "--request-timeout-s", "1")
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["request_timeout_s"] == 1
    (d,) = data["decode"]
    assert d["finish"] == {"timeout": 2} and all(q["output_tokens"] > 10 for q in d["requests"])
    assert d["per_stream_tok_s_median"] and data["ctx"][0]["finish_reason"] == "timeout"
    assert "finish timeout 2 (2 cut at the 1 s --request-timeout-s deadline)" in r.stderr
    assert "finish timeout, recall no (1 cut at the 1 s" in r.stderr
    md = out.with_suffix(".md").read_text()
    assert "**Cut at the 1 s deadline**" in md and "decode code c2 (2 of 2 requests), ctx 64" in md
    assert "| decode code c2 per stream |" in md and "| timeout 2 |" in md


def test_a_silent_server_is_cut_at_the_deadline(standin, tmp_path):
    srv, url = standin
    srv.ttft = 60  # no first token for a minute
    out = tmp_path / "b.json"
    r = run_cli("bench", "--url", url, "--out", str(out), "--prefill", "32", "--request-timeout-s", "1")
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("dsv41:")]
    assert r.returncode == 3 and len(errors) == 1, r.stderr
    assert "prefill 32: no token within 1 s" in errors[0] and "raise --request-timeout-s" in errors[0]
    assert "no token within 1 s" in json.loads(out.read_text())["error"]


def test_sizes_beyond_max_model_len_are_skipped_and_the_rest_measured(standin, tmp_path):
    srv, url = standin
    srv.max_model_len, srv.ttft, srv.itl, srv.tokens = 4096, 0.01, 0.001, 5  # refuses longer prompts, as vLLM
    out = tmp_path / "b.json"
    r = run_cli("bench", "--url", url, "--out", str(out), "--reps", "1", "--conc", "1", "--kinds", "short",
                "--ctx", "1000", "100000")  # the default --prefill 8192 32768
    assert r.returncode == 0, r.stderr
    skipped = [ln for ln in r.stderr.splitlines() if "skipped" in ln]
    assert [ln.split(":")[0] for ln in skipped] == ["prefill 8192", "prefill 32768", "ctx 100000"], r.stderr
    assert all("max_model_len of 4096" in ln for ln in skipped)
    data = json.loads(out.read_text())
    assert data["max_model_len"] == 4096 and [x["step"] for x in data["skipped"]] == ["prefill 8192", "prefill 32768",
                                                                                       "ctx 100000"]
    assert data["prefill"] == [] and len(data["decode"]) == 1 and [x["tokens"] for x in data["ctx"]] == [1000]
    assert "**Skipped** prefill 8192:" in out.with_suffix(".md").read_text()


def test_bad_request_timeout_is_one_line(tmp_path):
    r = run_cli("bench", "--url", "127.0.0.1:1", "--out", str(tmp_path / "b.json"), "--request-timeout-s", "0")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--request-timeout-s 0" in r.stderr, r.stderr


@pytest.mark.servers
def test_wrong_model_is_one_line(llama, tmp_path):
    out = tmp_path / "b.json"
    r = run_cli("bench", "--url", llama["url"], "--out", str(out), "--model", "nope",
                env={"DSV41_API_KEY": llama["key"]})
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "model 'nope' is not served" in r.stderr and "'smollm2'" in r.stderr and not out.exists()


STATS = {"mean": float, "median": float, "std": float, "p99": float}


def shape(value):
    """The shape of a JSON value: dict keys to shapes, a list to its first item's shape, else the type."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value)


def test_json_shape_is_pinned(standin, tmp_path):
    """dsv41.bench/1: a reader of the file may rely on these keys and types; changing them needs /2."""
    srv, url = standin
    srv.max_model_len, srv.ttft, srv.itl, srv.tokens = 4096, 0.01, 0.02, 5  # tokens far enough apart for a TPOT
    out = tmp_path / "b.json"
    assert run_bench(["--url", url, "--out", str(out), "--label", "pin", "--prefill", "32", "8192", "--reps", "1",
                      "--conc", "1", "--kinds", "code", "--ctx", "64"]) == 0
    data = json.loads(out.read_text())
    assert shape(data) == {
        "schema": str, "label": str, "model": str, "url": str, "ts": str, "definitions": str,
        "request_timeout_s": float, "max_model_len": int, "prefill_endpoint": str,
        "skipped": [{"step": str, "reason": str}],
        "prefill": [{"tokens": int, "prompt_tokens": int, "median_tok_s": float, "ttft_ms": STATS,
                     "runs": [{"prompt_tokens": int, "prompt_tokens_from": str, "ttft_ms": float, "tok_s": float}]}],
        "decode": [{"kind": str, "concurrency": int, "per_stream_tok_s_median": float, "aggregate_tok_s": float,
                    "output_tokens": int, "wall_s": float, "finish": {"stop": int}, "ttft_ms": STATS,
                    "tpot_ms": STATS, "itl_ms": STATS, "e2el_ms": STATS,
                    "requests": [{"output_tokens": int, "tokens_from": str, "prompt_tokens": int, "ttft_ms": float,
                                  "e2el_ms": float, "tpot_ms": float, "tok_s": float, "finish_reason": str,
                                  "ended_by_done": bool, "reasoning_chars": int, "text_tail": str}]}],
        "ctx": [{"tokens": int, "prompt_tokens": int, "ttft_ms": float, "prefill_tok_s": float, "output_tokens": int,
                 "decode_tok_s": float, "e2el_ms": float, "finish_reason": str, "recall": bool, "answer_tail": str}]}
    assert data["schema"] == "dsv41.bench/1"
