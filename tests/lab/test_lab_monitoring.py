"""Monitoring in the two-node lab with the stand-in engine: `doit launch` with METRICS_DIR enables every
node's Debian prometheus-node-exporter, `doit monitoring --install` runs dsv41-prometheus on the head
(Debian's binary), and the real Prometheus scrapes the real exporters and evaluates the real rules.
Every target is up; after a short load and one incident every dashboard query returns data; each alert
is inactive before its fault, fires on it and resolves after recovery. The alerts' `for:` and windows
are shortened through their settings (ALERT_FOR_S, ALERT_RECENT_MIN), the scrape to every 2 s."""
import json
import shlex
import time
from pathlib import Path

import pytest

import labctl

pytestmark = pytest.mark.lab

STATE = "/root/.dsv41-two-sparks"
MON = {"METRICS_DIR": "/var/lib/dsv41/metrics", "SCRAPE_INTERVAL_S": "2", "ALERT_FOR_S": "4",
       "ALERT_RECENT_MIN": "0.25", "ALERT_TTFT_P95_S": "0.0001", "ALERT_DECODE_TOKS_MIN": "10000"}
WATCHDOG = {"WATCHDOG": "1", "WATCHDOG_INTERVAL_S": "2", "WATCHDOG_PROBE_S": "4", "WATCHDOG_STALL_S": "12",
            "SSH_TIMEOUT_S": "5"}
PROM = "http://127.0.0.1:9090"
DASHBOARD = Path(__file__).resolve().parents[2] / "conf" / "monitoring" / "dashboard.json"


def api(lab, path, **params):
    args = " ".join(f"--data-urlencode {shlex.quote(f'{k}={v}')}" for k, v in params.items())
    r = lab.on("head", f"curl -sfG {PROM}{path} {args}", timeout=30)
    return json.loads(r.stdout)["data"]


def firing(lab, name):
    """The labels of each firing instance of an alert."""
    return [a["labels"] for a in api(lab, "/api/v1/alerts")["alerts"]
            if a["labels"]["alertname"] == name and a["state"] == "firing"]


def wait_for(what, check, timeout=150):
    return labctl.wait_for(what, check, timeout)


def fires(lab, name, node=None, timeout=150):
    return wait_for(f"{name} firing" + (f" on {node}" if node else ""),
                    lambda: [a for a in firing(lab, name) if node in (None, a.get("node"))], timeout)


def resolves(lab, name, timeout=150):
    wait_for(f"{name} resolved", lambda: not firing(lab, name), timeout)


def quiet(lab, *alerts):
    for name in alerts:
        assert not firing(lab, name), f"{name} fires before its fault"


def load(lab, n=6):
    """A few short completions against the API (with the key), one at a time."""
    body = json.dumps({"model": "deepseek-v4.1-flash", "prompt": "Count to ten:", "max_tokens": 24})
    for _ in range(n):
        lab.on("head", f"curl -sf -o /dev/null -H \"Authorization: Bearer $(cat {STATE}/api_key)\" "
                       f"-H 'Content-Type: application/json' -d {shlex.quote(body)} "
                       "http://127.0.0.1:8000/v1/completions")


@pytest.fixture(scope="module")
def monitored(lab, launched):
    lab.doit("clear-trip", check=False)
    out = lab.doit("launch", MON).stdout
    assert "started prometheus-node-exporter.service" in out, out
    r = lab.doit("monitoring --install", MON)
    assert "dsv41-prometheus.service" in r.stdout
    wait_for("every target scraped",
             lambda: all(t["health"] != "unknown" for t in api(lab, "/api/v1/targets")["activeTargets"]))
    yield r.stdout
    remove_monitoring(lab)


def remove_monitoring(lab):
    """Prometheus, Alertmanager and every node's exporter gone, the cluster launched on the defaults: the
    next module's launch with METRICS_DIR starts the exporters afresh."""
    lab.on("head", "systemctl disable --now dsv41-prometheus dsv41-alertmanager; rm -f "
                   "/etc/systemd/system/dsv41-prometheus.service /etc/systemd/system/dsv41-alertmanager.service; "
                   "systemctl daemon-reload", check=False)
    for node in lab.ip:
        lab.on(node, "systemctl disable --now prometheus-node-exporter; "
                     "rm -rf /etc/systemd/system/prometheus-node-exporter.service.d", check=False)
    lab.doit("clear-trip", check=False)
    lab.doit("launch")


def test_every_target_is_up(lab, monitored):
    targets = api(lab, "/api/v1/targets")["activeTargets"]
    seen = sorted((t["labels"]["job"], t["labels"]["node"], t["health"]) for t in targets)
    assert seen == [("dsv41-engine", "head", "up"), ("dsv41-gateway", "head", "up")] + [
        ("dsv41-node", n, "up") for n in sorted(lab.ip)], targets
    assert "dsv41-engine  head" in monitored and "up" in monitored        # --install printed the targets
    active = api(lab, "/api/v1/query", query='node_systemd_unit_state{state="active"}')["result"]
    units = {r["metric"]["name"] for r in active}
    assert {"dsv41-r0.service", "dsv41-r1.service", "dsv41-memguard.service", "dsv41-gateway.service"} <= units
    metrics = {r["metric"]["__name__"] for r in api(lab, "/api/v1/query", query='{__name__=~"dsv41_.+"}')["result"]}
    assert {"dsv41_memguard_floor_bytes", "dsv41_memguard_tripped"} <= metrics


def test_a_killed_worker_rank_alerts_down_then_restarted_and_both_resolve(lab, monitored):
    quiet(lab, "DSV41RankDown", "DSV41RankRestarted")
    lab.on("worker1", "docker kill dsv41-r1")                        # the watchdog is off: systemd restarts it
    fires(lab, "DSV41RankDown", "worker1")
    fires(lab, "DSV41RankRestarted", "worker1")                      # RestartSec=30, then NRestarts=1
    resolves(lab, "DSV41RankDown")
    lab.doit("launch", MON)                                           # the stale worker: ranks restart together
    resolves(lab, "DSV41RankRestarted")                               # ALERT_RECENT_MIN (15 s here) after the restart


def test_a_stopped_head_rank_alerts_api_down_and_resolves_after_launch(lab, monitored):
    resolves(lab, "DSV41ApiDown")               # the test before restarted both ranks: on a busy machine it may still fire
    lab.on("head", "systemctl stop dsv41-r0")
    fires(lab, "DSV41ApiDown")
    assert fires(lab, "DSV41RankDown", "head")
    lab.doit("launch", MON)
    resolves(lab, "DSV41ApiDown")
    resolves(lab, "DSV41RankDown")


def test_a_tripped_guard_alerts_and_resolves_after_clear_trip(lab, monitored):
    quiet(lab, "DSV41MemoryGuardTripped", "DSV41MemoryNearFloor")
    lab.doit("launch", {**MON, "MEMGUARD_GIB": "1000"}, check=False)   # every guard trips
    fires(lab, "DSV41MemoryGuardTripped", "worker1")
    fires(lab, "DSV41MemoryNearFloor", "worker1")
    lab.doit("clear-trip")
    lab.doit("launch", MON)
    resolves(lab, "DSV41MemoryGuardTripped")
    resolves(lab, "DSV41MemoryNearFloor")


def test_a_stopped_exporter_alerts_and_resolves(lab, monitored):
    quiet(lab, "DSV41ExporterDown")
    lab.on("worker1", "systemctl stop prometheus-node-exporter")
    fires(lab, "DSV41ExporterDown", "worker1")
    lab.doit("launch", MON)                                           # launch starts it again
    resolves(lab, "DSV41ExporterDown")


def test_the_watchdog_giving_up_alerts_until_launch(lab, monitored):
    lab.on("head", f"rm -f {STATE}/watchdog.gaveup")
    lab.doit("launch", {**MON, **WATCHDOG, "WATCHDOG_MAX_RECOVERIES": "0"})   # gives up at the first fault
    wait_for("the watchdog's metrics", lambda: api(lab, "/api/v1/query", query="dsv41_watchdog_gave_up == 0")["result"])
    quiet(lab, "DSV41WatchdogGaveUp")
    lab.on("worker1", "docker kill dsv41-r1")
    fires(lab, "DSV41WatchdogGaveUp")
    lab.doit("launch", {**MON, **WATCHDOG})                           # clears it; the watchdog acts again
    resolves(lab, "DSV41WatchdogGaveUp")
    lab.doit("launch", MON)


def test_after_load_and_an_incident_every_dashboard_query_returns_data(lab, monitored):
    """A short load with the TTFT and decode thresholds set so that any load breaks them (quiet before,
    firing on it); the watchdog recovers a killed rank (its recovery counter: the incident, an alert and
    the dashboard's annotation); another load; then every panel's query has data."""
    lab.doit("launch", MON)                         # no watchdog: its idle probes are requests too
    resolves(lab, "DSV41TtftHigh")                  # launch's own one-token check ages out of the window
    quiet(lab, "DSV41TtftHigh", "DSV41DecodeSlow")
    load(lab)
    fires(lab, "DSV41TtftHigh")
    fires(lab, "DSV41DecodeSlow")

    lab.on("head", f"rm -f {STATE}/incidents.jsonl {STATE}/watchdog.gaveup")
    lab.doit("launch", {**MON, **WATCHDOG})
    wait_for("the watchdog's metrics",
             lambda: api(lab, "/api/v1/query", query="dsv41_watchdog_recoveries_total")["result"])
    quiet(lab, "DSV41WatchdogRecovered")
    lab.on("worker1", "docker kill dsv41-r1")
    fires(lab, "DSV41WatchdogRecovered")
    wait_for("the recovery", lambda: any(i["result"] == "READY" for i in lab.incidents(STATE)))
    load(lab)
    dash = json.loads(DASHBOARD.read_text())
    queries = [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]
    queries += [(a["name"], a["expr"]) for a in dash["annotations"]["list"]]
    time.sleep(4)                                   # two scrapes after the load
    empty = []
    for title, expr in queries:
        q = expr.replace("$__rate_interval", "1m")
        if not api(lab, "/api/v1/query", query=q)["result"]:
            empty.append(f"{title}: {q}")
    assert not empty, "queries without data:\n" + "\n".join(empty)

    lab.doit("launch", MON)                         # the watchdog off: no requests from now on
    for name in ("DSV41TtftHigh", "DSV41DecodeSlow", "DSV41WatchdogRecovered"):
        resolves(lab, name, timeout=200)
