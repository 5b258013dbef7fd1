"""vLLM's /metrics as top reads it (dsv41.client.metrics): real recorded vLLM 0.32 text, known counter and
bucket deltas, the stand-in engine run as local processes; and the watchdog's textfile metrics, parsed
with prometheus_client's parser as node_exporter's textfile collector would read them (each client key's use
from a real gateway among them)."""
import functools
import http.server
import re
import shutil
import threading
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from dsv41 import names
from dsv41.client import metrics
from dsv41.vllm.recipe import SERIES
from dsv41.errors import UserError
from dsv41.settings.layers import load_config
from dsv41.head.core import record
from dsv41.head.core.health import Health, Verdict
from dsv41.head.core.health import VERDICTS
from dsv41.head.core.watchdog_metrics import remove_metrics
from dsv41.head.watchdog import Watchdog
from dsv41.node import gateway as node_gateway
from test_monitoring import gateway_running
from test_standin_engine import REAL_METRICS, Ranks, events, free_port

TTFT_B, ITL_B = SERIES.ttft + "_bucket", SERIES.itl + "_bucket"


def shifted(text, changes):
    """The exposition text with sample values changed: {sample name: f(le or None, value) -> value}."""
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            name = series.split("{")[0]
            if name in changes:
                le = re.search(r'le="([^"]+)"', series)
                line = f"{series} {changes[name](float(le.group(1)) if le else None, float(value))}"
        out.append(line)
    return "\n".join(out) + "\n"


def test_recorded_vllm_metrics_give_the_gauges_and_no_rates_from_one_scrape():
    snap = metrics.parse(REAL_METRICS.read_text(), at=100.0)
    e = metrics.engine(None, snap, SERIES)
    assert (e["running"], e["waiting"], e["kv_cache_usage_pct"], e["preemptions_total"]) == (0, 0, 0, 0)
    assert e["prompt_tokens_per_s"] is e["generation_tokens_per_s"] is e["ttft_p50_s"] is e["interval_s"] is None
    assert snap.value(SERIES.prompt_tokens) == 6458 and snap.value(SERIES.generation_tokens) == 1446
    assert list(snap.buckets(SERIES.ttft).values())[-1] == 14          # +Inf: every request so far


def test_rates_and_percentiles_come_from_the_deltas_of_the_interval():
    # two scrapes 2 s apart of the recorded server: in between, 300 prompt and 100 generated tokens,
    # 4 first tokens all in (0.1, 0.25] s, 100 inter-token gaps (90 in (10, 25] ms, 10 in (50, 75] ms),
    # 2 preemptions; and now 2 running, 1 waiting, KV cache 40 % full
    text = REAL_METRICS.read_text()
    later = shifted(text, {
        SERIES.prompt_tokens: lambda le, v: v + 300, SERIES.generation_tokens: lambda le, v: v + 100,
        TTFT_B: lambda le, v: v + (4 if le >= 0.25 else 0),
        ITL_B: lambda le, v: v + (100 if le >= 0.075 else 90 if le >= 0.025 else 0),
        SERIES.preemptions: lambda le, v: v + 2,
        SERIES.running: lambda le, v: 2, SERIES.waiting: lambda le, v: 1, SERIES.kv_usage: lambda le, v: 0.4})
    a, b = metrics.parse(text, at=1000.0), metrics.parse(later, at=1002.0)
    e = metrics.engine(a, b, SERIES)
    assert (e["interval_s"], e["prompt_tokens_per_s"], e["generation_tokens_per_s"]) == (2.0, 150.0, 50.0)
    assert (e["running"], e["waiting"], e["kv_cache_usage_pct"]) == (2, 1, 40.0)
    assert (e["preemptions_total"], e["preemptions_in_interval"]) == (2, 2)
    assert e["ttft_p50_s"] == pytest.approx(0.1 + 0.15 * 2 / 4)          # within the bucket, as histogram_quantile
    assert e["ttft_p95_s"] == pytest.approx(0.1 + 0.15 * 3.8 / 4)
    assert e["itl_p50_s"] == pytest.approx(0.01 + 0.015 * 50 / 90)
    assert e["itl_p95_s"] == pytest.approx(0.05 + 0.025 * 5 / 10)
    # since the server started the median is another one (0.5 s); the interval's is what top shows
    assert metrics.quantile(metrics.Snapshot(0.0), b, SERIES.ttft, 0.5) == pytest.approx(0.5)
    # an interval without requests has no percentiles, and a restarted server (counters back to 0) no rates
    assert metrics.engine(b, metrics.parse(later, at=1004.0), SERIES)["ttft_p50_s"] is None
    e = metrics.engine(b, metrics.parse(shifted(text, {SERIES.prompt_tokens: lambda le, v: 3.0,
                                                        TTFT_B: lambda le, v: 0.0}), at=1004.0), SERIES)
    assert e["prompt_tokens_per_s"] is None and e["ttft_p50_s"] is None


def test_metrics_url_sits_beside_the_api():
    assert metrics.metrics_url("http://10.0.0.1:8000/v1") == "http://10.0.0.1:8000/metrics"
    assert metrics.metrics_url("http://10.0.0.1:8000/v1/") == "http://10.0.0.1:8000/metrics"
    assert metrics.metrics_url("http://h:8000") == "http://h:8000/metrics"


def test_the_stand_in_engine_counts_what_it_served(tmp_path):
    r = Ranks(tmp_path).up()
    try:
        url = f"http://127.0.0.1:{r.port}/metrics"
        a = metrics.scrape(url)
        code, _ = r.chat("count to 40", max_tokens=30)
        resp = r.stream("count to 20")
        list(events(resp))
        resp.close()
        b = metrics.scrape(url)
    finally:
        r.stop()
    assert code == 200
    e = metrics.engine(a, b, SERIES)
    assert e["generation_tokens_per_s"] * (b.time - a.time) == pytest.approx(30 + 20)
    assert e["prompt_tokens_per_s"] > 0 and (e["running"], e["waiting"]) == (0, 0)
    assert 0 < e["ttft_p50_s"] <= e["ttft_p95_s"] and 0 < e["itl_p50_s"] <= e["itl_p95_s"]


class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        code, body = (404, b"no such page") if self.path == "/missing" else (200, b"<html><body>hello</body></html>")
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def web():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_scrape_failures_are_one_line(web):
    port = free_port()
    cases = [(f"http://127.0.0.1:{port}/metrics",
              f"no answer from http://127.0.0.1:{port}/metrics (connection refused)"),
             (web + "/missing", f"{web}/missing answered HTTP 404: no such page"),
             (web + "/metrics", f"{web}/metrics did not answer Prometheus text (")]
    for url, message in cases:
        with pytest.raises(UserError) as err:
            metrics.scrape(url, timeout=5)
        assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_watchdog_textfile_parses_as_prometheus_text(tmp_path):
    cfg = load_config({"STATE_DIR": str(tmp_path / "state"), "METRICS_DIR": str(tmp_path / "textfile")})
    (tmp_path / "state").mkdir()
    w = Watchdog(cfg, log=lambda msg: None)
    state = str(tmp_path / "state")
    done = record.open_incident(state, verdict="DEGRADED", evidence="dsv41-r1.service on worker1 is failed",
                                fault_at=0.5, node="worker1", now=1.0)
    record.close_incident(state, done, "READY", ended=14.0)
    w.publish(Health(Verdict.HEALTHY, ("every rank is up and a token came back",)))
    text = (tmp_path / "textfile" / "dsv41_watchdog.prom").read_text()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert {n: f.type for n, f in fams.items()} == {
        "dsv41_watchdog_verdict": "gauge", "dsv41_watchdog_recoveries": "counter", "dsv41_watchdog_gave_up": "gauge",
        "dsv41_watchdog_last_check_timestamp_seconds": "gauge", "dsv41_watchdog_recovering": "gauge",
        "dsv41_watchdog_last_recovery_end_timestamp_seconds": "gauge", "dsv41_watchdog_judging": "gauge"}
    assert fams["dsv41_watchdog_recovering"].samples == []          # no recovery runs
    assert fams["dsv41_watchdog_judging"].samples[0].value == 0     # healthy: nothing to judge
    assert fams["dsv41_watchdog_last_recovery_end_timestamp_seconds"].samples[0].value == 14.0
    verdicts = {s.labels["verdict"]: s.value for s in fams["dsv41_watchdog_verdict"].samples}
    assert set(verdicts) == set(VERDICTS) and [v for v, x in verdicts.items() if x == 1] == ["HEALTHY"]
    [recoveries] = fams["dsv41_watchdog_recoveries"].samples
    assert (recoveries.name, recoveries.value) == ("dsv41_watchdog_recoveries_total", 1)
    assert fams["dsv41_watchdog_gave_up"].samples[0].value == 0
    assert all(f.documentation for f in fams.values())
    assert sorted(p.name for p in Path(tmp_path / "textfile").iterdir()) == [
        "dsv41_gateway.prom", "dsv41_watchdog.prom"]          # GATEWAY=1, the default: the keys' file too
    running = record.open_incident(state, verdict="DEAD", evidence="/health does not answer", fault_at=1_900_000_000,
                                   node="worker1", now=1_900_000_010)
    w.publish(Health(Verdict.RECOVERING, ("recovering",), "worker1", recovering=running))
    fams = {f.name: f for f in text_string_to_metric_families((tmp_path / "textfile" / "dsv41_watchdog.prom").read_text())}
    [rec] = fams["dsv41_watchdog_recovering"].samples
    assert rec.value == 1 and rec.labels == {"verdict": "DEAD", "node": "worker1", "fault_at": "2030-03-17T17:46:40Z",
                                             "incident": running["id"]}


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed (tests/setup/monitoring.sh "
                                                             "installs it)")
def test_the_watchdog_writes_each_keys_use_at_the_gateway_by_name_never_the_key(tmp_path, monkeypatch):
    """A real HAProxy on the rendered gateway config, its door closed: alice past her rate (2 a minute), the
    default key refused; the watchdog's dsv41_gateway.prom counts both by the key's name. A gateway that
    cannot be read is said once and its file goes, the watchdog's own file still written; a stopped watchdog
    leaves neither."""
    sock = str(tmp_path / "admin.sock")
    monkeypatch.setattr(names, "GATEWAY_SOCKET", sock)
    keys = {"default": "client-key-default", "alice": "client-key-alice"}
    gw = load_config({"STATE_DIR": str(tmp_path / "gw"), "PORT": str(free_port()), "ENGINE_PORT": str(free_port()),
                      "KEY_RATE_PER_MIN": "2"})
    cfg = load_config({"STATE_DIR": str(tmp_path / "wd"), "METRICS_DIR": str(tmp_path / "textfile")})
    (tmp_path / "wd").mkdir()
    said = []
    w = Watchdog(cfg, log=said.append)
    read = functools.partial(node_gateway.usage, sock)                 # the test gateway's admin socket
    with gateway_running(gw, keys) as url:
        monkeypatch.setattr(node_gateway, "usage", read)
        node_gateway.set_door(gw.state_dir, "closed", "recovering from DEAD", 0, sock)
        codes = [requests.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {keys[k]}"},
                              timeout=5).status_code for k in ("alice", "alice", "alice", "default")]
        assert codes == [503, 503, 429, 503]
        w.publish(Health(Verdict.HEALTHY, ("every rank is up and a token came back",)))
    prom = tmp_path / "textfile" / "dsv41_gateway.prom"
    text = prom.read_text()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert {n: f.type for n, f in fams.items()} == {
        "dsv41_gateway_key_requests": "counter", "dsv41_gateway_key_errors": "counter",
        "dsv41_gateway_key_unavailable": "counter", "dsv41_gateway_key_limited": "counter",
        "dsv41_gateway_key_idle_seconds": "gauge"}
    value = {(s.name.removeprefix("dsv41_gateway_key_"), s.labels["key"]): s.value
             for f in fams.values() for s in f.samples}
    fields = ("requests", "unavailable", "limited", "errors")
    assert [value[f"{field}_total", "alice"] for field in fields] == [3, 2, 1, 0]
    assert [value[f"{field}_total", "default"] for field in fields] == [1, 1, 0, 0]
    assert 0 <= value["idle_seconds", "alice"] < 5 and said == []
    assert not any(key in text for key in keys.values())

    def unreadable(*_):
        raise node_gateway.GatewayError("the admin socket answered nothing")
    monkeypatch.setattr(node_gateway, "usage", unreadable)
    for _ in range(2):
        w.publish(Health(Verdict.HEALTHY, ("every rank is up and a token came back",)))
    assert said == ["the gateway's per-key use cannot be read: GatewayError: the admin socket answered nothing"]
    assert not prom.exists() and (tmp_path / "textfile" / "dsv41_watchdog.prom").exists()
    monkeypatch.setattr(node_gateway, "usage", read)
    w.publish(Health(Verdict.HEALTHY, ("every rank is up and a token came back",)))
    assert said[1:] == ["the gateway's per-key use is read again"] and prom.exists()
    remove_metrics(cfg.metrics_dir)                       # what the service does when it stops
    assert list((tmp_path / "textfile").iterdir()) == []
