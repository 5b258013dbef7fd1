"""`doit status` for real on this machine as a one-node cluster (nothing deployed here): the verdict, the
exit code a monitor reads, and the --json shape, which is versioned."""
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from dsv41.head.core import record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def doit(args, tmp_path, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("WORKER", "WORKERS", "DSV41_PROFILE")}
    e.update({"STATE_DIR": str(tmp_path / "state"), "PORT": "18999", "MPORT": "18998", **env})
    return subprocess.run([sys.executable, "-m", "doit", "-f", os.path.join(ROOT, "dodo.py"), *args],
                          capture_output=True, text=True, env=e, cwd=ROOT, timeout=120)


def test_nothing_deployed_is_not_running_exit_3_with_the_versioned_json(tmp_path):
    r = doit(["status", "--json"], tmp_path)
    doc = json.loads(r.stdout)
    assert r.returncode == 3 and doc["state"] == "NOT RUNNING" and doc["exit_code"] == 3
    assert set(doc) == {"schema", "state", "exit_code", "health", "nodes", "api", "gateway", "stale", "watchdog",
                        "release", "silenced", "startup", "groups"}
    assert doc["groups"] == []                          # one serving group: no per-group rows
    assert doc["gateway"]["unit"] == "not installed" and doc["gateway"]["health"] is None
    assert doc["release"] == {"serving": None, "failed": None, "rolling_out": None} and doc["silenced"] is None
    assert doc["startup"] is None                       # set only while the ranks start
    plain = doit(["status"], tmp_path)
    assert "release: none in service yet (`doit launch` records one)" in plain.stdout
    assert doc["schema"] == "dsv41.status/6" and list(doc["nodes"]) == ["head"]
    assert doc["health"]["verdict"] == "STOPPED" and doc["health"]["word"] == "NOT RUNNING"
    head = doc["nodes"]["head"]
    assert set(head) == {"memguard", "rank_unit", "rank_state", "since", "container", "mem_available_gib",
                         "gpu_memory", "tripped", "caches"}
    assert head["rank_unit"] == "dsv41-r0.service" and head["mem_available_gib"] > 0
    assert set(doc["api"]) == {"url", "health", "models", "error"} and doc["api"]["health"] is None
    assert doc["watchdog"]["enabled"] is True and doc["watchdog"]["unit"] in ("not installed", "inactive")
    r = doit(["status"], tmp_path)
    assert r.returncode == 3 and "NOT RUNNING: nothing is running: start it with `doit launch`" in r.stdout


def test_status_shows_each_librarys_cache_of_the_image_on_each_node(tmp_path):
    key = "5668e35e5ee0"                                      # the default image's digest, first 12 hex
    r = doit(["status"], tmp_path)
    assert f"caches of image {key}: empty (its first start compiles every kernel)" in r.stdout
    for rel, size in (("triton/ab/k.cubin", 123456), ("flashinfer/.cache/flashinfer/op.so", 2_500_000),
                      ("vllm/torch_compile_cache/f/rank_0_0/a.py", 900)):
        path = tmp_path / "state/cache" / key / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"k" * size)
    r = doit(["status"], tmp_path)
    assert (f"caches of image {key}: vLLM 900 B, Triton 123 KB, FlashInfer 2.5 MB; 2.6 MB in all (6 empty)"
            in r.stdout), r.stdout
    doc = json.loads(doit(["status", "--json"], tmp_path).stdout)
    assert doc["nodes"]["head"]["caches"] == {"image": key, "bytes": {
        "vLLM": 900, "torch inductor": 0, "Triton": 123456, "FlashInfer": 2_500_000, "TileLang": 0, "CuTeDSL": 0,
        "DeepGEMM": 0, "b12x": 0, "b12x RoCE": 0}}


def test_something_else_on_the_port_is_not_our_deployment(tmp_path):
    """No unit installed and another server answering on PORT: NOT RUNNING, saying so, not DEGRADED."""
    class Other(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            body = b'{"data": [{"id": "someone-elses-model"}]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        r = doit(["status"], tmp_path, PORT=str(srv.server_address[1]))
    finally:
        srv.shutdown()
        srv.server_close()
    assert r.returncode == 3, r.stdout + r.stderr
    assert "something that is not dsv41 answers on port" in r.stdout and "NOT RUNNING" in r.stdout


def test_the_watchdog_line_reports_what_runs_whatever_the_setting_says():
    from dsv41.head.core.record import watchdog_line
    seen = {"verdict": "HEALTHY", "time": 0, "evidence": "every rank is up"}
    last = {"started": 0, "verdict": "DEGRADED", "action": "restart", "result": "READY", "took_s": 13}
    assert watchdog_line({"enabled": False, "unit": "inactive"}) == "watchdog: off (WATCHDOG=0)"
    line = watchdog_line({"enabled": False, "unit": "active", **seen, "last_incident": last})
    assert line.startswith("watchdog: active, saw HEALTHY") and "(WATCHDOG=0: the next launch stops it)" in line
    assert "last incident" in line and "DEGRADED, restart, READY (13 s)" in line
    line = watchdog_line({"enabled": True, "unit": "active", **seen, "gave_up": {"reason": "DEAD again"}})
    assert "GAVE UP (DEAD again): hands off until `doit launch`" in line
    assert watchdog_line({"enabled": True, "unit": "inactive", **seen}) == "watchdog: inactive"
