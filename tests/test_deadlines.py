"""Every network call of smoke and bench ends within --request-timeout-s of wall time: against real
servers on loopback that accept a connection and never answer, that trickle one byte every 2 s (which
resets any per-read timeout), and that answer /v1/models but never /tokenize."""
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from oddserver import OddServer
from servers import standin  # noqa: F401  (a fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEADLINE = 3
MARGIN = 3          # python's start-up, imports and the exit


class Silent:
    """Accepts connections and reads requests; never sends a byte (or, trickle=True, sends an endless
    response one byte every 2 s)."""

    def __init__(self, trickle=False):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.trickle, self.stop, self.conns = trickle, threading.Event(), []
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn):
        data = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Slow: " + b"x" * 10_000
        for i in range(len(data)):
            if self.stop.wait(2):
                return
            if self.trickle:
                try:
                    conn.sendall(data[i:i + 1])
                except OSError:
                    return

    def close(self):
        self.stop.set()
        self.sock.close()
        for c in self.conns:
            c.close()


class NoTokenize(BaseHTTPRequestHandler):
    """Lists a model at once; /tokenize and /extras/tokenize/count hold the request unanswered."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = json.dumps({"data": [{"id": "m", "max_model_len": 100_000}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(60)


@pytest.fixture(params=["silent", "trickle", "no-tokenize"])
def server(request):
    if request.param == "no-tokenize":
        srv = ThreadingHTTPServer(("127.0.0.1", 0), NoTokenize)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        yield request.param, srv.server_address[1]
        srv.shutdown()
        srv.server_close()
        return
    srv = Silent(trickle=request.param == "trickle")
    yield request.param, srv.port
    srv.close()


def timed(module, *args, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "lib"), "DSV41_API_KEY": "k"}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", module, *args], env=env, capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    return r, time.monotonic() - t0


def test_bench_ends_within_its_deadline(server, tmp_path):
    kind, port = server
    r, took = timed("dsv41.client.bench", "--url", f"http://127.0.0.1:{port}/v1", "--out", "b.json",
                    "--prefill", "64", "--conc", "1", "--request-timeout-s", str(DEADLINE), tmp_path=tmp_path)
    assert r.returncode == 3 and took < DEADLINE + MARGIN, (kind, took, r.stderr)
    assert "within 3 s" in r.stderr and "Traceback" not in r.stderr
    assert ("/tokenize" in r.stderr) == (kind == "no-tokenize"), r.stderr


def test_smoke_ends_within_its_deadline(server, tmp_path):
    kind, port = server
    r, took = timed("dsv41.client.smoke", f"http://127.0.0.1:{port}/v1", "--request-timeout-s", str(DEADLINE),
                    tmp_path=tmp_path)
    assert took < (DEADLINE + MARGIN) * (1 if kind != "no-tokenize" else 6), (kind, took, r.stderr)
    assert r.returncode in (1, 3) and "Traceback" not in r.stderr, r.stderr
    if kind != "no-tokenize":                # the model check itself is bounded
        assert r.returncode == 3 and "timed out: no complete answer within 3 s" in r.stderr, r.stderr


def test_smoke_ends_within_its_whole_run_deadline_against_a_trickling_chat(tmp_path):
    """/v1/models answers at once, every chat request trickles a byte every 0.5 s: each check alone
    would take its whole --request-timeout-s."""
    with OddServer({"data": [{"id": "m"}]}, trickle=0.5) as srv:
        r, took = timed("dsv41.client.smoke", srv.url, "--request-timeout-s", "2", "--deadline-s", str(DEADLINE),
                        "--json", tmp_path=tmp_path)
    out = json.loads(r.stdout)
    checks = {c["check"]: c for c in out["checks"]}
    assert r.returncode == 1 and took < DEADLINE + MARGIN, (took, r.stderr)
    assert list(checks) == ["text", "tools", "vision", "reasoning", "stream"]
    assert checks["text"]["evidence"] == "no answer within 2 s (--request-timeout-s)"
    assert checks["stream"]["evidence"] == "the run's 3 s deadline passed (--deadline-s)", checks


def test_bench_ends_within_its_whole_run_deadline_with_results_so_far(standin, tmp_path):
    srv, url = standin
    srv.ttft, srv.itl, srv.tokens = 1.2, 0.001, 3     # each prefill run well within its own deadline
    r, took = timed("dsv41.client.bench", "--url", url, "--out", "b.json", "--prefill", "32", "--reps", "5",
                    "--conc", "1", "--request-timeout-s", "2", "--deadline-s", str(DEADLINE), tmp_path=tmp_path)
    assert r.returncode == 3 and took < DEADLINE + MARGIN, (took, r.stderr)
    [line] = [ln for ln in r.stderr.splitlines() if ln.startswith("dsv41:")]
    assert "bench stopped at prefill 32: the run's deadline of 3 s passed (--deadline-s)" in line, line
    assert "the run's deadline" in json.loads((tmp_path / "b.json").read_text())["error"]


@pytest.mark.parametrize("tool", ["smoke", "bench"])
def test_an_error_answer_whose_body_trickles_is_cut_at_the_deadline(tool, tmp_path):
    """A streamed request is answered HTTP 500 at once, then its body a byte every 0.2 s (each read well
    within any read timeout): the error's body is read within the run's deadline too (in-process: the
    tools' run functions)."""
    from dsv41.client.bench import run_bench
    from dsv41.client.smoke import run_smoke
    chat = {"choices": [{"message": {"content": "391"}, "finish_reason": "stop"}], "tokens": [1, 2], "count": 2}
    with OddServer({"data": [{"id": "m", "max_model_len": 100_000}]}, chat=chat, trickle=0.2, stream_error=True) as srv:
        t0 = time.monotonic()
        if tool == "smoke":
            code = run_smoke(srv.url, "k", deadline_s=DEADLINE, out=open(os.devnull, "w"))
        else:
            code = run_bench(["--url", srv.url, "--out", str(tmp_path / "b.json"), "--prefill", "64", "--conc", "1",
                              "--deadline-s", str(DEADLINE)])
        took = time.monotonic() - t0
    assert took < DEADLINE + 1.5, took
    assert code == (1 if tool == "smoke" else 3)


class TrickledMetrics(BaseHTTPRequestHandler):
    """/metrics answered at once, its body a byte every 0.2 s: each read well within a read timeout."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "10000")
        self.end_headers()
        for _ in range(10000):
            time.sleep(0.2)
            try:
                self.wfile.write(b"#")
                self.wfile.flush()
            except OSError:
                return


def test_a_metrics_scrape_ends_within_its_timeout_against_a_trickle():
    from dsv41.client import metrics
    from dsv41.errors import UserError
    srv = ThreadingHTTPServer(("127.0.0.1", 0), TrickledMetrics)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(UserError, match="timed out: no complete answer within 1 s"):
            metrics.scrape(f"http://127.0.0.1:{srv.server_address[1]}/metrics", timeout=1)
    finally:
        srv.shutdown()
        srv.server_close()
    assert time.monotonic() - t0 < 2
