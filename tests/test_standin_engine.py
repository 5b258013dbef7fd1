"""The lab's stand-in engine (tests/lab/engine/engine.py) run as local processes on 127.0.0.1, no docker:
what it copies from real vLLM 0.32 (rank loss, head loss, wedge, chunked prefill, a stopped worker, /metrics)
behaves as its docstring says."""
import http.client
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

ENGINE = Path(__file__).resolve().parent / "lab" / "engine" / "engine.py"
REAL_METRICS = Path("/work/shared/data/vllm-0.32-cpu-metrics.txt")
KEY = "test-key-123"
NAME = "deepseek-v4.1-flash"
DEAD = {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                  "type": "InternalServerError", "param": None, "code": 500}}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Ranks:
    """Rank processes of one engine, started like the rank units start them (minus docker)."""

    def __init__(self, tmp, nnodes=2, env=None, args=()):
        (tmp / "model").mkdir(exist_ok=True)
        (tmp / "plan.json").write_text("{}")
        self.tmp, self.nnodes, self.args = tmp, nnodes, list(args)
        self.port, self.mport = free_port(), free_port()
        self.env = dict(os.environ, ST_EXL3_PLAN=str(tmp / "plan.json"), LAB_ENGINE_SKIP_MOUNT_CHECK="1",
                        LAB_ENGINE_DELAY_S="0", LAB_ENGINE_TOKEN_S="0.01")
        self.env.update(env or {})
        self.procs, self.logs = {}, {}

    def argv(self, rank):
        a = [sys.executable, str(ENGINE), str(self.tmp / "model"), "--served-model-name", NAME,
             "--tensor-parallel-size", str(self.nnodes), "--nnodes", str(self.nnodes), "--node-rank", str(rank),
             "--master-addr", "127.0.0.1", "--master-port", str(self.mport), "--max-model-len", "4096"]
        if rank:
            return a + ["--headless"]
        return a + ["--host", "127.0.0.1", "--port", str(self.port), "--tool-call-parser", "hermes",
                    "--enable-auto-tool-choice"] + self.args

    def start(self, *ranks, env=None):
        for rank in ranks:
            self.logs[rank] = open(self.tmp / f"rank{rank}.log", "w+")
            e = dict(self.env, **(env or {}))
            if rank == 0:
                e["VLLM_API_KEY"] = KEY
            self.procs[rank] = subprocess.Popen(self.argv(rank), env=e, stdout=self.logs[rank],
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return self

    def up(self, timeout=20):
        self.start(*range(1, self.nnodes), 0)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout=20):
        end = time.time() + timeout
        while time.time() < end:
            assert self.procs[0].poll() is None, self.log(0)
            if self.get("/health")[0] == 200:
                return
            time.sleep(0.1)
        raise AssertionError(f"rank 0 not ready after {timeout} s: {self.log(0)}")

    def log(self, rank):
        self.logs[rank].flush()
        return (self.tmp / f"rank{rank}.log").read_text()

    def kill(self, rank, sig=signal.SIGKILL):
        self.procs[rank].send_signal(sig)

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
        for f in self.logs.values():
            f.close()

    def conn(self, timeout=10):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, key=KEY, timeout=10):
        """-> (status, body text); status 0 when nothing listens."""
        c = self.conn(timeout)
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        try:
            c.request(method, path, json.dumps(body) if body is not None else None, headers)
            r = c.getresponse()
            return r.status, r.read().decode()
        except (ConnectionRefusedError, ConnectionResetError, http.client.RemoteDisconnected):
            return 0, ""
        finally:
            c.close()

    def get(self, path, key=None):
        return self.request("GET", path, key=key)

    def chat(self, content, **extra):
        return self.request("POST", "/v1/chat/completions",
                            dict({"model": NAME, "messages": [{"role": "user", "content": content}]}, **extra))

    def stream(self, content, timeout=10, **extra):
        """Open a chat stream; -> the response, its headers read (it owns the socket: close() it)."""
        c = self.conn(timeout)
        c.request("POST", "/v1/chat/completions", json.dumps(dict(
            {"model": NAME, "stream": True, "messages": [{"role": "user", "content": content}]}, **extra)),
            {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        return c.getresponse()

    def metrics(self):
        code, text = self.get("/metrics")
        assert code == 200
        return text


def events(resp):
    """SSE data payloads of a stream, as they come (a socket timeout propagates)."""
    while True:
        line = resp.fp.readline()
        if not line:
            return
        if line.startswith(b"data: "):
            data = line[6:].strip().decode()
            yield data if data == "[DONE]" else json.loads(data)


def token_text(ev):
    return "".join((ch.get("delta") or {}).get("content") or "" for ch in ev.get("choices", [])) \
        if isinstance(ev, dict) else ""


class Reader:
    """Reads a stream's events on a thread, so a test can wait for the next one with a deadline."""

    def __init__(self, resp):
        self.q = queue.Queue()
        threading.Thread(target=self.run, args=(resp,), daemon=True).start()

    def run(self, resp):
        try:
            for e in events(resp):
                self.q.put(e)
        except (OSError, ValueError):   # closed under us
            pass
        self.q.put(None)

    def next_token(self, timeout):
        """The next event carrying content, or None at the end; raises queue.Empty on the deadline."""
        end = time.monotonic() + timeout
        while True:
            e = self.q.get(timeout=max(0.001, end - time.monotonic()))
            if e is None or token_text(e):
                return e

    def rest(self, timeout):
        out, end = [], time.monotonic() + timeout
        while True:
            e = self.q.get(timeout=max(0.001, end - time.monotonic()))
            if e is None:
                return out
            out.append(e)


def values(text):
    """{(sample name, sorted labels): value} of every sample in a /metrics text."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def val(text, name, **labels):
    want = dict({"engine": "0", "model_name": NAME}, **labels)
    hits = [v for (n, lab), v in values(text).items() if n == name and dict(lab) == want]
    assert len(hits) == 1, (name, labels)
    return hits[0]


def engine_series(text):
    """The vllm:* samples (what the engine publishes from its steps), without creation times."""
    return {k: v for k, v in values(text).items()
            if k[0].startswith("vllm:") and not k[0].endswith("_created") and "tool_call_parser" not in k[0]}


def wait_exit(proc, timeout):
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


@pytest.fixture
def ranks(tmp_path):
    made = []

    def make(**kw):
        r = Ranks(tmp_path, **kw)
        made.append(r)
        return r
    yield make
    for r in made:
        r.stop()


def test_serves_with_the_key_and_keeps_health_and_metrics_open(ranks):
    r = ranks().up()
    assert r.get("/v1/models")[0] == 401
    code, body = r.get("/v1/models", key=KEY)
    assert code == 200 and json.loads(body)["data"][0]["id"] == NAME
    assert r.get("/health")[0] == 200 and r.get("/metrics")[0] == 200
    code, body = r.chat("What is 17 * 23?")
    assert code == 200 and "391" in json.loads(body)["choices"][0]["message"]["content"]
    assert r.request("POST", "/v1/completions", {"model": NAME, "prompt": "2+2="}, key="wrong")[0] == 401


def test_metrics_parse_have_vllm_shape_and_count_own_work(ranks):
    r = ranks().up()
    before = r.metrics()
    real_vals = values(REAL_METRICS.read_text())
    for hist in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                 "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds"):
        les = lambda vals: [dict(lab)["le"] for (n, lab) in vals if n == hist + "_bucket"]
        assert les(values(before)) == les(real_vals), hist
    assert val(before, "vllm:generation_tokens_total") == 0 and val(before, "vllm:num_requests_running") == 0

    code, body = r.chat("count to 40", max_tokens=30)
    usage = json.loads(body)["usage"]
    assert code == 200 and usage["completion_tokens"] == 30
    resp = r.stream("count to 20", stream_options={"include_usage": True})
    evs = list(events(resp))
    resp.close()
    assert [token_text(e) for e in evs if e != "[DONE]" and token_text(e)] == [("" if i == 1 else " ") + str(i)
                                                                              for i in range(1, 21)]
    after = r.metrics()
    real = {(f.name, f.type) for f in text_string_to_metric_families(REAL_METRICS.read_text())}
    assert {(f.name, f.type) for f in text_string_to_metric_families(after)} == real
    assert val(after, "vllm:generation_tokens_total") == 30 + 20
    assert val(after, "vllm:prompt_tokens_total") == usage["prompt_tokens"] + evs[-2]["usage"]["prompt_tokens"]
    assert val(after, "vllm:request_success_total", finished_reason="length") == 1
    assert val(after, "vllm:request_success_total", finished_reason="stop") == 1
    assert val(after, "vllm:time_to_first_token_seconds_count") == 2
    assert val(after, "vllm:inter_token_latency_seconds_count") == 29 + 19
    assert 0.005 < val(after, "vllm:inter_token_latency_seconds_sum") / 48 < 0.2
    assert val(after, "vllm:e2e_request_latency_seconds_count") == 2
    assert val(after, "vllm:request_params_max_tokens_sum") == 30 + 4096 - evs[-2]["usage"]["prompt_tokens"]
    assert val(after, "vllm:num_requests_running") == 0 and val(after, "vllm:kv_cache_usage_perc") == 0
    assert values(after)[("http_requests_total", (("handler", "/v1/chat/completions"), ("method", "POST"),
                                                  ("status", "2xx")))] == 2


def test_running_waiting_and_kv_usage_are_true_while_busy(ranks):
    r = ranks(args=["--max-num-seqs", "1"]).up()
    s1 = r.stream("count to 300")
    s2 = r.stream("count to 300")
    try:
        next(e for e in events(s1) if token_text(e))
        time.sleep(0.2)
        m = r.metrics()
        assert val(m, "vllm:num_requests_running") == 1 and val(m, "vllm:num_requests_waiting") == 1
        assert val(m, "vllm:num_requests_waiting_by_reason", reason="capacity") == 1
        assert 0 < val(m, "vllm:kv_cache_usage_perc") < 1
    finally:
        s1.close()
        s2.close()
    end = time.time() + 10   # both clients went away: their requests are aborted
    while time.time() < end:
        m = r.metrics()
        if val(m, "vllm:num_requests_running") == val(m, "vllm:num_requests_waiting") == 0:
            break
        time.sleep(0.2)
    assert val(m, "vllm:request_success_total", finished_reason="abort") == 2


def test_long_request_streams_steadily_on_demand(ranks):
    r = ranks(env={"LAB_ENGINE_TOKEN_S": "0.02"}).up()
    resp = r.stream("count from 1 to 150")
    times, text = [], []
    for e in events(resp):
        if e != "[DONE]" and token_text(e):
            times.append(time.monotonic())
            text.append(token_text(e))
    resp.close()
    assert "".join(text).split() == [str(i) for i in range(1, 151)]
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    assert 0.01 < gaps[len(gaps) // 2] < 0.06 and gaps[-1] < 0.5   # steady: median near 0.02 s, no stall
    code, body = r.chat("hello", max_tokens=77, ignore_eos=True)
    assert json.loads(body)["usage"]["completion_tokens"] == 77


def test_long_prompt_is_prefilled_in_chunks_and_only_kv_use_moves_until_its_first_token(ranks):
    r = ranks(env={"LAB_ENGINE_TOKEN_S": "0.1"}, args=["--max-num-batched-tokens", "100"]).up()
    done = {}
    t = threading.Thread(target=lambda: done.update(answer=r.request(
        "POST", "/v1/completions", {"model": NAME, "prompt": "hello " * 2000, "max_tokens": 3})))
    t0 = time.monotonic()
    t.start()
    during = []   # samples while the prompt is prefilled: no token counted yet
    while t.is_alive():
        m = r.metrics()
        if val(m, "vllm:num_requests_running") == 1 and val(m, "vllm:prompt_tokens_total") == 0:
            during.append(m)
    code, body = done["answer"]
    assert code == 200 and json.loads(body)["usage"] == {"prompt_tokens": 2000, "completion_tokens": 3,
                                                          "total_tokens": 2003, "prompt_tokens_details": {
                                                              "cached_tokens": 0}}
    assert time.monotonic() - t0 >= 20 * 0.1    # 20 chunks of 100 tokens, one step each
    kv = [val(m, "vllm:kv_cache_usage_perc") for m in during]
    # KV use grows chunk by chunk: seen at three chunks at least (however slow each look is on a busy machine,
    # the 2 s prefill holds more looks than that), never going back
    assert len(set(kv)) >= 3 and kv[0] > 0 and sorted(kv) == kv, kv
    for name in ("vllm:generation_tokens_total", "vllm:iteration_tokens_total_count"):
        assert {val(m, name) for m in during} == {0}, name   # as vLLM: no output, no iteration stats
    after = r.metrics()
    assert val(after, "vllm:prompt_tokens_total") == 2000 and val(after, "vllm:generation_tokens_total") == 3
    assert val(after, "vllm:iteration_tokens_total_count") == 3   # the first token's step, then two more
    assert val(after, "vllm:iteration_tokens_total_sum") == 2003
    assert val(after, "vllm:iteration_tokens_total_bucket", le="2048.0") - val(
        after, "vllm:iteration_tokens_total_bucket", le="1024.0") == 1   # the whole prompt and its first token


def stream_then(r, prompt, rank, sig):
    """A stream that has begun, then `sig` to a rank: (response, reader, tokens so far, /metrics right after)."""
    resp = r.stream(prompt)
    reader = Reader(resp)
    got = [token_text(reader.next_token(5))]
    r.kill(rank, sig)
    time.sleep(0.3)   # the step in progress may still finish
    while not reader.q.empty():
        got.append(token_text(reader.q.get()))
    return resp, reader, got, r.metrics()


def test_stopped_worker_freezes_progress_while_health_and_metrics_answer(ranks):
    r = ranks(env={"LAB_ENGINE_TOKEN_S": "0.02"}).up()
    resp, reader, got, frozen = stream_then(r, "count to 300", rank=1, sig=signal.SIGSTOP)
    queued = r.stream("2+2")   # waits behind the stuck step; its client gives up: the abort waits too
    queued.close()
    with pytest.raises(queue.Empty):
        reader.next_token(6)
    assert r.procs[0].poll() is None and r.get("/health")[0] == 200
    assert r.get("/v1/models", key=KEY)[0] == 200 and engine_series(r.metrics()) == engine_series(frozen)
    assert 0 < len(got) < 300 and "waits for rank(s) 1" in r.log(0)
    r.kill(1, signal.SIGCONT)
    got += [token_text(e) for e in reader.rest(20)]
    resp.close()
    assert "".join(got).split() == [str(i) for i in range(1, 301)]


def test_lost_worker_is_seen_only_by_the_next_request_then_rank0_exits_0(ranks):
    r = ranks().up()
    r.kill(1)
    r.procs[1].wait()
    time.sleep(1.5)   # idle: nothing happens
    assert r.procs[0].poll() is None and r.get("/health")[0] == 200
    t0 = time.monotonic()
    code, body = r.request("POST", "/v1/completions", {"model": NAME, "prompt": "Hi", "max_tokens": 2})
    assert code == 500 and json.loads(body) == DEAD
    assert wait_exit(r.procs[0], 5) == 0
    assert 0.5 < time.monotonic() - t0 < 3
    assert r.get("/health")[0] == 0
    out = r.log(0)
    assert "rank 1 disconnected" in out and "EngineDeadError" in out


def test_worker_lost_during_a_stream_errors_the_stream_and_watchdog_stops_rank0(ranks):
    r = ranks().up()
    resp = r.stream("count to 2000")
    assert resp.status == 200
    reader = Reader(resp)
    reader.next_token(5)
    r.kill(1)
    rest = reader.rest(5)
    resp.close()
    assert rest[-2:] == [DEAD, "[DONE]"]
    assert r.get("/health")[0] in (503, 0)
    assert r.chat("2+2")[0] in (500, 0)
    assert wait_exit(r.procs[0], 8) == 0   # vLLM's watchdog looks every 5 s


def test_keep_alive_on_engine_death_keeps_rank0_up(ranks):
    r = ranks(env={"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"}).up()
    r.kill(1)
    r.procs[1].wait()
    assert r.chat("2+2")[0] == 500
    time.sleep(1.5)
    assert r.procs[0].poll() is None and r.get("/health")[0] == 503 and r.chat("2+2") == (500, json.dumps(DEAD))


def test_usr1_wedges_and_unwedges(ranks):
    r = ranks(env={"LAB_ENGINE_TOKEN_S": "0.02"}).up()
    resp, reader, got, frozen = stream_then(r, "count to 400", rank=0, sig=signal.SIGUSR1)
    assert val(frozen, "vllm:num_requests_running") == 1
    resp2 = r.stream("count to 3")   # a new stream while wedged: headers, then nothing
    assert resp2.status == 200
    reader2 = Reader(resp2)
    with pytest.raises(queue.Empty):
        reader.next_token(1.5)
    with pytest.raises(queue.Empty):
        reader2.q.get(timeout=0.1)
    assert r.get("/health")[0] == 200 and r.get("/v1/models", key=KEY)[0] == 200
    r.stream("count to 5").close()   # a client that gives up while wedged changes nothing either
    time.sleep(1)
    assert engine_series(r.metrics()) == engine_series(frozen)

    r.kill(0, signal.SIGUSR1)
    got += [token_text(e) for e in reader.rest(20)]
    assert "".join(got).split() == [str(i) for i in range(1, 401)]
    assert "".join(token_text(e) for e in reader2.rest(5)).split() == ["1", "2", "3"]
    resp.close()
    resp2.close()
    after = r.metrics()
    assert val(after, "vllm:generation_tokens_total") == 403
    assert val(after, "vllm:request_success_total", finished_reason="abort") == 1
    out = r.log(0)
    assert "wedge ON" in out and "wedge OFF" in out


def test_usr1_on_a_worker_wedges_the_engine_too(ranks):
    r = ranks().up()
    r.kill(1, signal.SIGUSR1)
    time.sleep(0.3)
    assert r.procs[1].poll() is None
    c = r.conn(timeout=1.5)
    c.request("POST", "/v1/completions", json.dumps({"model": NAME, "prompt": "2+2="}),
              {"Authorization": f"Bearer {KEY}"})
    with pytest.raises((socket.timeout, TimeoutError)):
        c.getresponse()
    c.close()
    r.kill(1, signal.SIGUSR1)
    code, body = r.request("POST", "/v1/completions", {"model": NAME, "prompt": "2+2="})
    assert code == 200 and "4" in json.loads(body)["choices"][0]["text"]
    assert "wedge ON (rank 1)" in r.log(0) and "wedge OFF (rank 1)" in r.log(0)


def test_three_ranks_gather_before_serving_and_any_lost_rank_kills_rank0(ranks):
    r = ranks(nnodes=3)
    r.start(1, 0)
    time.sleep(1.5)
    assert r.procs[0].poll() is None and r.get("/health")[0] == 0   # waits for rank 2
    r.start(2)
    r.wait_ready()
    assert r.chat("What is 2 + 3?")[0] == 200
    r.kill(2)
    r.procs[2].wait()
    assert r.chat("What is 2 + 3?") == (500, json.dumps(DEAD))
    assert wait_exit(r.procs[0], 5) == 0
    time.sleep(1)
    assert r.procs[1].poll() is None   # the other headless rank hangs (default), as real workers did
    assert "rank 0 went away; hanging" in r.log(1)


@pytest.mark.parametrize("mode", ["hang", "exit"])
def test_headless_ranks_on_head_loss_follow_the_switch(ranks, mode):
    r = ranks(nnodes=3, env={"LAB_ENGINE_WORKER_ON_HEAD_LOSS": mode}).up()
    r.kill(0)
    r.procs[0].wait()
    if mode == "exit":
        assert wait_exit(r.procs[1], 5) == 0 and wait_exit(r.procs[2], 5) == 0
    else:
        time.sleep(2)
        assert r.procs[1].poll() is None and r.procs[2].poll() is None
        r.kill(1, signal.SIGTERM)
        assert wait_exit(r.procs[1], 5) == 0
    for rank in (1, 2):
        assert f"rank {rank}: rank 0 went away" in r.log(rank)
        assert f"LAB_ENGINE_WORKER_ON_HEAD_LOSS={mode}" in r.log(rank)


def test_mount_check_only_skipped_by_the_switch(tmp_path):
    (tmp_path / "model").mkdir()
    env = dict(os.environ, ST_EXL3_PLAN=str(tmp_path / "missing.json"), LAB_ENGINE_DELAY_S="0")
    env.pop("LAB_ENGINE_SKIP_MOUNT_CHECK", None)
    p = subprocess.run([sys.executable, str(ENGINE), str(tmp_path / "model")], env=env, capture_output=True,
                       text=True, timeout=20)
    assert p.returncode == 1 and "is not mounted" in p.stdout
    p = subprocess.run([sys.executable, str(ENGINE), str(tmp_path / "model")], env=dict(
        env, LAB_ENGINE_SKIP_MOUNT_CHECK="1"), capture_output=True, text=True, timeout=20)
    assert p.returncode == 1 and "ST_EXL3_PLAN" in p.stdout and "not mounted" not in p.stdout
    p = subprocess.run([sys.executable, str(ENGINE), str(tmp_path / "model")], env=dict(
        env, LAB_ENGINE_WORKER_ON_HEAD_LOSS="sometimes"), capture_output=True, text=True, timeout=20)
    assert p.returncode == 1 and "LAB_ENGINE_WORKER_ON_HEAD_LOSS" in p.stdout


def test_its_start_up_reads_as_phases_as_real_vllms_does(ranks):
    """The stand-in logs vLLM 0.32's start-up lines as it passes each stage, so a lab on the stand-in shows
    phases too: rank 0's output, stamped on arrival as journald stamps it, after systemd's Starting line,
    reads as the container, the weights (its simulated loading), the KV cache and the API."""
    from datetime import datetime, timezone
    from dsv41.vllm.startup import startup
    r = ranks(env={"LAB_ENGINE_DELAY_S": "0.6"})
    stamp = lambda t: datetime.fromtimestamp(t, timezone.utc).isoformat()      # noqa: E731
    stamped, seen = [f"{stamp(time.time())} head systemd[1]: Starting dsv41-r0.service"], 0
    r.start(1, 0)
    deadline = time.time() + 20
    while not stamped[-1].endswith("Application startup complete.") and time.time() < deadline:
        lines = r.log(0).splitlines()
        stamped += [f"{stamp(time.time())} head docker[9]: {line}" for line in lines[seen:]]
        seen = len(lines)
        time.sleep(0.05)
    s = startup("\n".join(stamped))
    got = {p.name: p.seconds for p in s.phases}
    assert set(got) == {"container", "weights", "kv_cache", "api"} and s.total is not None, s
    assert got["weights"] == pytest.approx(0.6, abs=0.2) and None not in got.values(), s
