"""Alerts in the two-node lab: `doit monitoring --install` runs dsv41-alertmanager beside dsv41-prometheus
on the head (Debian's binaries; the package's own service masked), with a webhook recorder on the head's
127.0.0.1 as the receiver. A worker rank killed while the watchdog runs is one firing and one resolved
notification naming the verdict, the node, fault_at and the incident; `doit stop` silences the cluster's
alerts and `doit launch` ends the silence; `doit alerts test` reports the webhook delivered. Timings are
shortened through the settings (the lab profile's group timings, ALERT_FOR_S, the scrape every 2 s)."""
import json
import re
import time

import pytest

import labctl
from test_lab_monitoring import MON, STATE, WATCHDOG, api, remove_monitoring

pytestmark = pytest.mark.lab

HOOK_PORT = 9099
POSTS = "/root/alerts-hook.jsonl"
HOOK = f"""import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with open("{POSTS}", "a") as f:
            f.write(json.dumps(json.loads(body)) + "\\n")
        self.send_response(200)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", {HOOK_PORT}), H).serve_forever()
"""
# What "nothing more came" waits: three of the lab profile's group intervals (alert_group_interval_s, 5 s),
# past its group wait (2 s): a notification Alertmanager had to send would have gone by then.
QUIET_S = 3 * 5
# MON's thresholds make the TTFT and decode alerts fire for the monitoring test; here only faults page. No
# wait here depends on ALERT_RECENT_MIN: it stays a minute, as the alerts were proven with.
ALERTS = {**MON, "ALERT_TTFT_P95_S": "60", "ALERT_DECODE_TOKS_MIN": "0.01", "ALERT_RECENT_MIN": "1",
          "ALERT_WEBHOOK_URL": f"http://127.0.0.1:{HOOK_PORT}/lab"}


def posts(lab):
    out = lab.on("head", f"cat {POSTS} 2>/dev/null || true").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def wait_for(what, check, timeout=180):
    return labctl.wait_for(what, check, timeout)


@pytest.fixture(scope="module")
def alerting(lab, launched):
    lab.on("head", "cat > /root/alerts-hook.py", input=HOOK)
    lab.on("head", f"rm -f {POSTS}; systemctl stop dsv41-test-hook 2>/dev/null; systemctl reset-failed dsv41-test-hook "
                   "2>/dev/null; systemd-run --unit dsv41-test-hook python3 /root/alerts-hook.py")
    wait_for("the webhook recorder", lambda: "127.0.0.1:9099" in lab.on("head", "ss -Hltn").stdout, timeout=30)
    lab.doit("clear-trip", check=False)
    lab.doit("launch", ALERTS)
    r = lab.doit("monitoring --install", ALERTS)
    assert "dsv41-alertmanager.service" in r.stdout and "to webhook" in r.stdout, r.stdout
    assert lab.on("head", "systemctl is-enabled prometheus-alertmanager", check=False).stdout.strip() == "masked"
    yield r.stdout
    lab.on("head", "systemctl stop dsv41-test-hook", check=False)
    remove_monitoring(lab)                  # the exporters too: the monitoring test starts them afresh


def test_alertmanager_listens_on_loopback_only_without_the_url_in_its_argv(lab, alerting):
    listen = lab.on("head", "ss -Hltn 'sport = :9093'").stdout
    assert "127.0.0.1:9093" in listen and "0.0.0.0:9093" not in listen and "*:9093" not in listen
    argv = lab.on("head", "cat /proc/$(systemctl show -p MainPID --value dsv41-alertmanager)/cmdline | tr '\\0' ' '")
    assert "--cluster.listen-address= " in argv.stdout and "/lab" not in argv.stdout


def test_doit_alerts_test_reports_the_webhook_delivered(lab, alerting):
    r = lab.doit("alerts test", ALERTS)
    assert "webhook  delivered" in r.stdout, r.stdout


def test_a_healed_fault_pages_once_and_resolves_once(lab, alerting):
    lab.on("head", f"rm -f {POSTS} {STATE}/watchdog.gaveup")
    lab.doit("launch", {**ALERTS, **WATCHDOG})
    wait_for("the watchdog's metrics", lambda: api(lab, "/api/v1/query", query="dsv41_watchdog_gave_up == 0")["result"])
    lab.on("worker1", "docker kill dsv41-r1")
    wait_for("a resolved notification", lambda: any(p["status"] == "resolved" and p["commonLabels"].get("alertname")
                                                    != "DSV41Test" for p in posts(lab)), timeout=300)
    time.sleep(QUIET_S)                                             # nothing more
    got = [p for p in posts(lab) if p["commonLabels"].get("alertname") != "DSV41Test"]
    assert [p["status"] for p in got] == ["firing", "resolved"], got
    (alert,) = got[0]["alerts"]
    assert alert["labels"]["alertname"] == "DSV41WatchdogRecovering" and alert["labels"]["node"] == "worker1"
    assert alert["labels"]["verdict"] and alert["labels"]["fault_at"]
    assert f"`doit incidents show {alert['labels']['incident']}`" in alert["annotations"]["description"]
    shown = lab.doit(f"incidents show {alert['labels']['incident']}", ALERTS)
    assert alert["labels"]["verdict"] in shown.stdout
    lab.doit("launch", ALERTS)


def test_stop_silences_and_launch_ends_it(lab, alerting):
    lab.on("head", f"rm -f {POSTS}")
    out = lab.doit("stop", ALERTS).stdout
    assert "silenced by doit stop until" in out, out
    listing = lab.doit("alerts", ALERTS).stdout
    assert "by dsv41 doit stop" in listing
    wait_for("the rank alerts firing, silenced", lambda: "DSV41RankDown" in lab.doit("alerts", ALERTS).stdout)
    time.sleep(QUIET_S)
    assert posts(lab) == []                                          # planned work pages no one
    r = lab.doit("launch", ALERTS)
    assert "stay silenced until" in r.stdout, r.stdout                # two scrapes more, then no silence
    wait_for("the stop's silence to end", lambda: "no silence" in lab.doit("alerts", ALERTS).stdout, timeout=60)


@pytest.mark.soak           # per landing: the same launch killed while it goes back (below) pages the same way
def test_a_launch_that_fails_is_quiet_during_its_restart_and_its_release_pages_once(lab, alerting):
    lab.doit("launch", ALERTS)
    lab.on("head", f"rm -f {POSTS}")
    r = lab.doit("launch", {**ALERTS, "EXTRA": "--compilation-config not-json"}, check=False)
    assert r.returncode == 10 and "rolled back to release" in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    assert re.search(r"silenced by doit launch, release \d+ until", r.stdout) and "paged DSV41ReleaseFailed" in r.stdout
    wait_for("the release's page", lambda: [p for p in posts(lab) if p["status"] == "firing"], timeout=90)
    time.sleep(QUIET_S)                                             # nothing more
    # nothing of the restart pages: the one alert that fires is the release's, as one alert (a later
    # notification of the cluster's group, when an earlier incident's alert resolves in it, carries it again)
    firing = [a for p in posts(lab) for a in p["alerts"] if a["status"] == "firing"]
    assert {(a["labels"]["alertname"], a["startsAt"]) for a in firing} == {("DSV41ReleaseFailed", firing[0]["startsAt"])}
    assert "rolled back to release" in firing[0]["annotations"]["summary"]
    assert "no silence" in lab.doit("alerts", ALERTS).stdout


def test_a_launch_killed_while_it_goes_back_is_finished_by_the_watchdog_and_pages_once(lab, alerting):
    """The failing change's launch dies (SIGKILL) once it recorded its way back: with nobody touching
    anything the watchdog finishes going back, the release pages once, and the dead launch's silence ends."""
    fast = {**ALERTS, "WATCHDOG": "1", "WATCHDOG_INTERVAL_S": "5"}
    lab.doit("launch", fast)
    lab.on("head", f"rm -f {POSTS}")
    t0 = time.monotonic()
    out = lab.doit_killed("launch", {**fast, "EXTRA": "--compilation-config not-json"}, "going back to release")
    failed, back = map(int, re.search(r"release (\d+) failed .*: going back to release (\d+)", out).groups())
    wait_for(f"release {failed} rolled back by the watchdog",
             lambda: f"failed, rolled back to {back}" in lab.doit("releases", fast).stdout)
    status = json.loads(lab.doit("status --json", fast).stdout)
    took = time.monotonic() - t0
    assert status["state"] == "READY" and status["release"]["serving"]["number"] == back, status["release"]
    assert status["watchdog"]["unit"] == "active" and status["release"]["rolling_out"] is None
    wait_for("the release's page", lambda: [p for p in posts(lab) if p["status"] == "firing"], timeout=90)
    time.sleep(QUIET_S)                                             # nothing more
    # one alert fires, the release's (a later notification of the cluster's group, when the restart's
    # silenced rank alert resolves in it, carries it again)
    firing = [a for p in posts(lab) for a in p["alerts"] if a["status"] == "firing"]
    assert {(a["labels"]["alertname"], a["startsAt"]) for a in firing} == {("DSV41ReleaseFailed", firing[0]["startsAt"])}
    assert firing[0]["labels"]["release"] == str(failed) and f"rolled back to release {back}" in \
        firing[0]["annotations"]["summary"]
    wait_for("no silence of ours", lambda: "no silence" in lab.doit("alerts", fast).stdout, timeout=60)
    print(f"a launch killed while going back: release {back} serving again {took:.0f} s after the launch began")
    lab.doit("launch", ALERTS)
