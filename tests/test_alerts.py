"""Alerts reach a person: the rendered alertmanager.yml passes `amtool check-config` with each set of
receivers, and a real Alertmanager (Debian's 0.25, installed by tests/setup/monitoring.sh, started here on
127.0.0.1 with our own argv, clustering off) delivers to a real webhook recorder and a real SMTP server
(aiosmtpd, with a login whose password Alertmanager reads from its file): a healed fault is one firing
and one resolved notification, the rank alert inhibited under the recovery's; a silence set by
silences.silence() stops notifications and unsilence() ends it; `doit alerts test` reports delivery per
integration. No secret reaches an argv, a unit or a world-readable file; no Alertmanager is left running."""
import dataclasses
import email
import email.policy
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import yaml

from dsv41.head import config, monitoring
from dsv41.settings import kinds, layers, resolved
from dsv41.head.core import alertmanager as am
from dsv41.head.core import silences

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS")
PASSWORD = "smtp-pass-Zq81"
HOOK_TOKEN = "hook-token-7Hc2"
INCIDENT = {"verdict": "DEAD", "node": "worker1", "fault_at": "2026-12-01T20:01:02Z",
            "incident": "20261201T200102Z-DEAD"}


def need(tool):
    path = shutil.which(tool)
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{tool} is missing: tests/setup/monitoring.sh installs it (Debian's prometheus-alertmanager)")
    pytest.skip(f"{tool} is missing: run tests/setup/monitoring.sh (as root) to install Debian's prometheus-alertmanager")


@pytest.fixture(scope="module")
def amtool():
    return need("amtool")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cfg_for(tmp_path, **env):
    base = {"STATE_DIR": str(tmp_path / "state"), "WORKER": "root@10.10.10.11", "CLUSTER_NAME": "sparks"}
    return layers.load_config({**base, **env})


def password_file(tmp_path):
    p = tmp_path / "smtp-password"
    p.write_text(PASSWORD)                      # no newline: Alertmanager would send it
    p.chmod(0o600)
    return str(p)


def email_env(tmp_path, port=2525):
    return {"ALERT_EMAIL_TO": "oncall@example.org", "ALERT_EMAIL_FROM": "dsv41@example.org",
            "ALERT_SMTP_SMARTHOST": f"127.0.0.1:{port}", "ALERT_SMTP_USER": "alerts",
            "ALERT_SMTP_PASSWORD_FILE": password_file(tmp_path), "ALERT_SMTP_REQUIRE_TLS": "0"}


# ---- rendering --------------------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["both", "none", "webhook", "email"])
def test_the_config_passes_amtool_with_each_set_of_receivers(tmp_path, amtool, which):
    env = {}
    if which in ("both", "webhook"):
        env["ALERT_WEBHOOK_URL"] = f"https://ntfy.example.org/{HOOK_TOKEN}"
    if which in ("both", "email"):
        env.update(email_env(tmp_path))
    cfg = cfg_for(tmp_path, **env)
    paths = monitoring.render(cfg)
    r = subprocess.run([amtool, "check-config", paths["alertmanager.yml"]], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert stat.S_IMODE(os.stat(paths["alertmanager.yml"]).st_mode) == 0o600
    conf = yaml.safe_load(Path(paths["alertmanager.yml"]).read_text())
    receivers = {r["name"]: r for r in conf["receivers"]}
    assert conf["route"]["group_by"] == ["cluster", "group"]
    assert conf["route"]["receiver"] == ("nowhere" if which == "none" else "dsv41")
    dsv41 = receivers.get("dsv41", {})
    assert bool(dsv41.get("webhook_configs")) == (which in ("both", "webhook"))
    assert bool(dsv41.get("email_configs")) == (which in ("both", "email"))
    for e in dsv41.get("email_configs", []):
        assert e["send_resolved"] is True and e["auth_password_file"] == env["ALERT_SMTP_PASSWORD_FILE"]
    for w in dsv41.get("webhook_configs", []):
        assert w["send_resolved"] is True
    assert {tuple(i["source_matchers"]) for i in conf["inhibit_rules"]} == {('alertname="DSV41WatchdogRecovering"',)}
    rendered = "".join(Path(p).read_text() for p in paths.values())
    assert PASSWORD not in rendered
    world = "".join(Path(p).read_text() for p in paths.values() if os.stat(p).st_mode & 0o004)
    assert HOOK_TOKEN not in world


def test_prometheus_sends_to_it_with_the_cluster_label(tmp_path):
    promtool = need("promtool")
    cfg = cfg_for(tmp_path, ALERTMANAGER_PORT="9193")
    paths = monitoring.render(cfg)
    r = subprocess.run([promtool, "check", "config", paths["prometheus.yml"]], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    conf = yaml.safe_load(Path(paths["prometheus.yml"]).read_text())
    assert conf["global"]["external_labels"] == {"cluster": "sparks"}
    assert conf["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9193"]
    unit = Path(paths["dsv41-alertmanager.service"]).read_text()
    assert "--web.listen-address=127.0.0.1:9193 --cluster.listen-address=\n" in unit
    assert "/etc/prometheus" not in unit


@pytest.mark.parametrize("env, word", [({"ALERT_EMAIL_TO": "oncall@example.org"}, "ALERT_SMTP_SMARTHOST"),
                                        ({"ALERT_SMTP_USER": "alerts"}, "ALERT_SMTP_PASSWORD_FILE"),
                                        ({"ALERT_WEBHOOK_URL": "ntfy.sh/x"}, "ALERT_WEBHOOK_URL"),
                                        ({"ALERTMANAGER_PORT": "9090"}, "ALERTMANAGER_PORT"),
                                        ({"ALERT_GROUP_WAIT_S": "-1"}, "ALERT_GROUP_WAIT_S")])
def test_bad_alert_settings_are_one_line_and_exit_2(tmp_path, env, word):
    run = [str(ROOT / ".venv" / "bin" / "doit"), "-f", str(ROOT / "dodo.py"), "monitoring"]
    r = subprocess.run(run, env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "STATE_DIR": str(tmp_path / "s"),
                                 **env}, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and word in r.stderr, r.stderr
    assert "ntfy.sh/x" not in r.stderr
    assert not (tmp_path / "s" / "monitoring").exists()


def test_a_world_readable_or_newline_ended_password_file_is_refused(tmp_path):
    env = email_env(tmp_path)
    os.chmod(env["ALERT_SMTP_PASSWORD_FILE"], 0o644)
    with pytest.raises(monitoring.UserError, match="readable by every user: chmod 0600"):
        monitoring.render(cfg_for(tmp_path, **env))
    os.chmod(env["ALERT_SMTP_PASSWORD_FILE"], 0o600)
    Path(env["ALERT_SMTP_PASSWORD_FILE"]).write_text(PASSWORD + "\n")
    with pytest.raises(monitoring.UserError, match="ends with a newline") as e:
        monitoring.render(cfg_for(tmp_path, **env))
    assert PASSWORD not in str(e.value)
    assert not (tmp_path / "state" / "monitoring" / "alertmanager.yml").exists()


# ---- the silence lifecycle, on a fake clock ---------------------------------------------------------

T0 = 1_796_155_262.0                     # 2026-12-01T20:01:02Z


def listed(body, sid, state="active"):
    """A silence as the API lists it, from the body that created it."""
    return {**body, "id": sid, "status": {"state": state}, "updatedAt": body["startsAt"]}


def test_silence_lifecycle_on_a_fake_clock():
    first = silences.plan_silence([], "sparks", "doit stop", T0, None, 6)
    assert first["matchers"] == [{"name": "cluster", "value": "sparks", "isRegex": False, "isEqual": True}]
    assert first["createdBy"] == "dsv41 doit stop" and "id" not in first and "doit stop" in first["comment"]
    assert am.ts(first["startsAt"]) == T0 and am.ts(first["endsAt"]) == T0 + 6 * 3600
    have = [listed(first, "s1")]
    assert silences.plan_silence(have, "sparks", "doit stop", T0 + 30, None, 6) is None      # already lasts
    later = silences.plan_silence(have, "sparks", "doit stop", T0 + 3600, None, 6)           # extended, same id
    assert later["id"] == "s1" and am.ts(later["startsAt"]) == T0 and am.ts(later["endsAt"]) == T0 + 7 * 3600
    capped = silences.plan_silence([], "sparks", "doit launch", T0, 48, 6)                    # never past max
    assert am.ts(capped["endsAt"]) == T0 + 6 * 3600
    short = silences.plan_silence(have, "sparks", "doit launch", T0, 0.25, 6)                 # another creator
    assert "id" not in short and am.ts(short["endsAt"]) == T0 + 900
    others = [listed(first, "s1"), listed(short, "s2"), listed(first, "s3", "expired"),
              {**listed(first, "s4"), "createdBy": "alice"},
              {**listed(first, "s5"), "matchers": silences.matchers("other")}]
    assert silences.to_expire(others, "sparks") == ["s1", "s2"]
    assert silences.to_expire(others, "sparks", "doit launch") == ["s2"]
    line = silences.describe(others, "sparks")
    assert line == f"alerts silenced since {silences.clock(T0)} by doit stop (ends {silences.clock(T0 + 6 * 3600)})"
    assert silences.describe([listed(first, "s3", "expired")], "sparks") is None


def test_without_alertmanager_every_call_is_a_line_at_once(tmp_path):
    cfg = cfg_for(tmp_path, ALERTMANAGER_PORT=str(free_port()))
    t = time.monotonic()
    assert silences.silence(cfg, "doit stop").startswith("alerts not silenced: no answer from Alertmanager at ")
    assert silences.unsilence(cfg).startswith("silence not ended: no answer from Alertmanager")
    assert silences.silences(cfg) == [] and silences.silence_line(cfg) is None
    assert time.monotonic() - t < 5


# ---- a real Alertmanager, a real webhook recorder, a real SMTP server -------------------------------

class Recorder(ThreadingHTTPServer):
    """Records each POST's JSON body."""

    def __init__(self):
        self.posts = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(h):
                body = h.rfile.read(int(h.headers.get("Content-Length", 0)))
                self.posts.append({"path": h.path, "body": json.loads(body)})
                h.send_response(200)
                h.end_headers()

            def log_message(h, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


class Mailbox:
    def __init__(self):
        self.messages = []
        self.logins = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(email.message_from_bytes(envelope.content, policy=email.policy.default))
        return "250 OK"

    def auth(self, server, session, envelope, mechanism, auth_data):
        from aiosmtpd.smtp import AuthResult
        self.logins.append(auth_data.login)
        return AuthResult(success=(auth_data.login, auth_data.password) == (b"alerts", PASSWORD.encode()))


def smtp_server(box, port):
    pytest.importorskip("aiosmtpd")
    from aiosmtpd.controller import Controller
    # on 127.0.0.1 without TLS, as a local relay; PLAIN only: aiosmtpd's LOGIN prompts are not the ones
    # Alertmanager's client answers ("Username:")
    c = Controller(box, hostname="127.0.0.1", port=port, authenticator=box.auth, auth_required=True,
                   auth_require_tls=False, auth_exclude_mechanism=["LOGIN"])
    c.start()
    return c


@pytest.fixture
def running(tmp_path):
    """A real Alertmanager with both receivers and short group timings, started with our own argv."""
    need("amtool")
    hook, box = Recorder(), Mailbox()
    smtp_port = free_port()
    smtp = smtp_server(box, smtp_port)
    env = {"ALERTMANAGER_PORT": str(free_port()), "ALERT_GROUP_WAIT_S": "1", "ALERT_GROUP_INTERVAL_S": "2",
           "ALERT_WEBHOOK_URL": f"http://127.0.0.1:{hook.server_address[1]}/{HOOK_TOKEN}",
           **email_env(tmp_path, smtp_port)}
    cfg = cfg_for(tmp_path, **env)
    paths = monitoring.render(cfg)
    argv = monitoring.alertmanager_argv(cfg)
    os.makedirs(os.path.join(monitoring.out_dir(cfg), monitoring.AM_DATA), exist_ok=True)
    log = open(tmp_path / "alertmanager.log", "w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if requests.get(f"{am.url(cfg)}/-/ready", timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "alertmanager.log").read_text()
            time.sleep(0.2)
        yield {"cfg": cfg, "env": env, "hook": hook, "box": box, "smtp": smtp, "proc": proc, "paths": paths,
               "tmp": tmp_path}
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()
        hook.shutdown()
        try:
            smtp.stop()
        except Exception:           # noqa: BLE001 - a test stopped it already
            pass
    assert not [p for p in pgrep_alertmanagers() if str(tmp_path) in p], "an Alertmanager of this test still runs"


def pgrep_alertmanagers():
    r = subprocess.run(["pgrep", "-af", "prometheus-alertmanager"], capture_output=True, text=True)
    return r.stdout.splitlines()


def rules(cfg):
    text = monitoring.render_rules(cfg)
    return {r["alert"]: r for g in yaml.safe_load(text)["groups"] for r in g["rules"]}


def test_a_killed_launch_the_watchdog_carries_on_is_one_page_naming_it_and_one_resolve(running, monkeypatch):
    """A release a killed launch left rolling out: while the watchdog carries it on, one alert of its own
    names the release and what the watchdog does (the subject says so), and resolves once it is done; the
    rank alert of the restart under it pages nothing."""
    from dsv41.head import watchdog
    from dsv41.head.core import releases as rel
    from dsv41.settings.resolved import resolved
    cfg, hook, box = running["cfg"], running["hook"], running["box"]
    cfg = dataclasses.replace(cfg, metrics_dir=str(running["tmp"] / "prom"), scrape_interval_s=2)
    monkeypatch.setattr(watchdog.rollout, "carry_on", lambda *a: (am.post_alerts(am.url(cfg), rank_down(cfg)),
                                                                 time.sleep(3)))
    fields = {"image": "i", "image_ids": {}, "checkpoint": {}, "settings": resolved(cfg), "node_versions": {},
              "units": {"head": {"dsv41-r0.service": "x\n"}}, "files": {}, "secret_files": {}}
    rel.begin(cfg.state_dir, fields, 10, carrier={"by": "doit launch", "pid": 1, "since": time.time()})
    w = watchdog.Watchdog(cfg, log=lambda line: None)
    assert w.carry_on() is True
    wait(running, "the page", lambda: box.messages)
    am.post_alerts(am.url(cfg), rank_down(cfg, resolved=True))
    wait(running, "the resolved notification", lambda: len(box.messages) == 2, timeout=60)
    time.sleep(5)                                      # group intervals more: nothing else
    subjects = [m["Subject"] for m in box.messages]
    assert subjects == ["[FIRING] sparks: incident release-1: release 1 was left rolling out by doit launch, which "
                        "ended: the watchdog carries it on ",
                        "[RESOLVED] sparks: incident release-1: release 1 was left rolling out by doit launch, which "
                        "ended: the watchdog carries it on "], subjects

def as_prometheus_sends(cfg, name, labels, resolved=False, ago=60):
    """One alert as Prometheus 2.42 POSTs it: the series' labels, the rule's, the external cluster label,
    annotations expanded; startsAt when it became active (`ago`), a firing one ends 4 resend delays ahead,
    a resolved one now."""
    rule = rules(cfg)[name]
    now = time.time()
    ann = {k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), v)
           for k, v in rule["annotations"].items()}
    return {"labels": {**labels, **rule["labels"], "alertname": name, "cluster": cfg.cluster_name},
            "annotations": ann, "startsAt": am.iso(now - ago), "endsAt": am.iso(now if resolved else now + 240),
            "generatorURL": f"http://head:9090/graph?g0.expr={name}"}


def rank_down(cfg, resolved=False):
    return [as_prometheus_sends(cfg, "DSV41RankDown", {"job": "dsv41-node", "instance": "10.10.10.11:9100",
                                                       "node": "worker1"}, resolved)]


def incident(started):
    """The watchdog's incident record (core/record.py) of INCIDENT."""
    return {"id": INCIDENT["incident"], "verdict": INCIDENT["verdict"], "node": INCIDENT["node"], "started": started,
            "fault_at": am.ts(INCIDENT["fault_at"])}


def wait(running, what, check, timeout=30):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} within {timeout} s; Alertmanager's log: " + \
            (running["tmp"] / "alertmanager.log").read_text()[-3000:]
        time.sleep(0.2)


def text_of(msg):
    return msg.get_body(preferencelist=("plain",)).get_content()


def names_the_incident(text):
    return all(f"{k}={v}" in text for k, v in INCIDENT.items()) and \
        "`doit incidents show 20261201T200102Z-DEAD`" in text


def test_a_healed_fault_is_one_firing_and_one_resolved_notification(running):
    """The watchdog posts its incident when the recovery begins (no scrape needed); the rank alert, pending
    since the fault (its startsAt a minute back) and resent by Prometheus, is inhibited under it. The
    recovery ends 2 s later, well inside a scrape interval: the incident still pages once and resolves once,
    since its alert lasts a group wait and a scrape past its start."""
    from dsv41.head import watchdog
    cfg, hook, box = running["cfg"], running["hook"], running["box"]
    cfg = dataclasses.replace(cfg, metrics_dir=str(running["tmp"] / "prom"))     # monitoring is on
    base = am.url(cfg)
    lines = []
    w = watchdog.Watchdog(cfg, log=lines.append)
    healed = w.paging(incident(time.time()))           # what the watchdog does when a recovery begins
    assert lines and lines[0].startswith("paged DSV41WatchdogRecovering"), lines
    wait(running, "the recovery's alert stored", lambda: am.alerts(base))
    time.sleep(0.5)
    am.post_alerts(base, rank_down(cfg))
    time.sleep(2)
    healed.set()                                       # healed 2 s after it began, well inside one scrape (15 s)
    wait(running, "the firing notification", lambda: hook.posts and box.messages)
    for _ in range(3):                                 # Prometheus resends the rank alert; nothing new pages
        time.sleep(2)
        am.post_alerts(base, rank_down(cfg))
    assert len(hook.posts) == 1 and len(box.messages) == 1, [p["body"]["status"] for p in hook.posts]
    firing = hook.posts[0]
    assert firing["path"] == f"/{HOOK_TOKEN}" and firing["body"]["status"] == "firing"
    (alert,) = firing["body"]["alerts"]                 # the rank alert is inhibited under the recovery's
    assert alert["labels"]["alertname"] == "DSV41WatchdogRecovering"
    assert {k: alert["labels"][k] for k in INCIDENT} == INCIDENT
    assert "`doit incidents show 20261201T200102Z-DEAD`" in alert["annotations"]["description"]
    assert alert["annotations"]["summary"] == "DEAD on worker1: the watchdog restarts the ranks (fault at 2026-12-01T20:01:02Z)"
    mail = box.messages[0]
    assert mail["Subject"].startswith("[FIRING] sparks: incident 20261201T200102Z-DEAD: DEAD on worker1: the watchdog "
                                      "restarts the ranks") and names_the_incident(text_of(mail)), mail["Subject"]
    assert "DSV41RankDown" not in mail["Subject"]
    assert box.logins and set(box.logins) == {b"alerts"}

    am.post_alerts(base, rank_down(cfg, resolved=True))
    wait(running, "the resolved notification", lambda: len(hook.posts) == 2 and len(box.messages) == 2, timeout=60)
    time.sleep(6)                                      # three group intervals: nothing more
    assert len(hook.posts) == 2 and len(box.messages) == 2
    resolved = hook.posts[1]["body"]
    assert resolved["status"] == "resolved" and {a["status"] for a in resolved["alerts"]} == {"resolved"}
    assert "DSV41WatchdogRecovering" in {a["labels"]["alertname"] for a in resolved["alerts"]}
    mail = box.messages[1]
    assert mail["Subject"].startswith("[RESOLVED] sparks: incident 20261201T200102Z-DEAD: DEAD on worker1") \
        and names_the_incident(text_of(mail)), mail["Subject"]


def test_a_groups_incident_pages_once_naming_its_group(running):
    """With several serving groups (GROUPS=2: here the head and worker1, one node each), group 1's watchdog pages
    its incident with the group among the labels, and says the other groups serve."""
    from dsv41.head import watchdog
    cfg, hook = running["cfg"], running["hook"]
    whole = dataclasses.replace(cfg, metrics_dir=str(running["tmp"] / "prom"), groups=2)
    w = watchdog.Watchdog(whole.group_config(1), log=lambda line: None, whole=whole)
    healed = w.paging(incident(time.time()))
    wait(running, "the firing notification", lambda: hook.posts)
    healed.set()
    (alert,) = hook.posts[0]["body"]["alerts"]
    assert alert["labels"]["group"] == "g1" and {k: alert["labels"][k] for k in INCIDENT} == INCIDENT
    assert alert["annotations"]["summary"] == ("DEAD on group 1 (worker1): the watchdog restarts group 1's ranks while "
                                               "the other groups serve (fault at 2026-12-01T20:01:02Z)")


def test_one_groups_recovery_quiets_its_own_alerts_and_the_doors_but_not_another_groups(running):
    """GROUPS=2: while group 1's watchdog recovers, its rank and API alerts are inhibited, and the door's 5xx
    alert (any group's fault shows there); group 0's API down at the same time is not: it is a fault of its own,
    and it pages in a notification of its own group, beside group 1's incident."""
    cfg, hook = running["cfg"], running["hook"]
    g0, g1 = ({"job": "dsv41-engine", "instance": i, "node": n, "group": g}
              for i, n, g in (("127.0.0.1:8000", "head", "g0"), ("10.10.10.12:8000", "worker2", "g1")))
    am.post_alerts(am.url(cfg), [       # first, as the watchdog posts it when its recovery begins
        {"labels": {"alertname": "DSV41WatchdogRecovering", "cluster": cfg.cluster_name, "severity": "critical",
                    "group": "g1", **INCIDENT}, "annotations": {"summary": "DEAD on group 1"},
         "startsAt": am.iso(time.time() - 60), "endsAt": am.iso(time.time() + 240)}])

    def states():
        return {(a["labels"]["alertname"], a["labels"].get("group")): a["status"]["state"]
                for a in am.alerts(am.url(cfg))}
    wait(running, "the recovery's alert", lambda: states() == {("DSV41WatchdogRecovering", "g1"): "active"})
    am.post_alerts(am.url(cfg), [
        as_prometheus_sends(cfg, "DSV41ApiDown", g0), as_prometheus_sends(cfg, "DSV41ApiDown", g1),
        as_prometheus_sends(cfg, "DSV41RankDown", {**g1, "job": "dsv41-node", "instance": "10.10.10.13:9100",
                                                   "node": "worker3"}),
        as_prometheus_sends(cfg, "DSV41GatewayErrors", {"job": "dsv41-gateway", "instance": "127.0.0.1:8000",
                                                        "node": "head"})])
    want = {("DSV41WatchdogRecovering", "g1"): "active", ("DSV41ApiDown", "g0"): "active",
            ("DSV41ApiDown", "g1"): "suppressed", ("DSV41RankDown", "g1"): "suppressed",
            ("DSV41GatewayErrors", None): "suppressed"}
    wait(running, "group 1's alerts inhibited by its recovery, group 0's not", lambda: states() == want)
    wait(running, "a notification for each group", lambda: len(hook.posts) >= 2)
    time.sleep(3)
    paged = {}
    for post in hook.posts:
        for a in post["body"]["alerts"]:
            paged.setdefault(post["body"]["groupLabels"].get("group", ""), set()).add(a["labels"]["alertname"])
    assert paged == {"g0": {"DSV41ApiDown"}, "g1": {"DSV41WatchdogRecovering"}}, paged


def test_a_release_the_watchdog_cannot_read_pages_a_person_once_and_touches_nothing(running, monkeypatch):
    """A release a killed launch left rolling out, whose recorded settings this version cannot read (PORT
    "abc"): the watchdog never carries it on with today's settings. It pages DSV41NeedsAPerson naming the
    record once, however many looks it lasts, and leaves the record as it was; the alert resolves once the
    release is final."""
    from dsv41.head import watchdog
    from dsv41.head.core import releases as rel
    from dsv41.settings.resolved import resolved
    cfg, hook = running["cfg"], running["hook"]
    cfg = dataclasses.replace(cfg, metrics_dir=str(running["tmp"] / "prom"), scrape_interval_s=2)
    carried = []
    monkeypatch.setattr(watchdog.rollout, "carry_on", lambda *a: carried.append(a))
    fields = {"image": "i", "image_ids": {}, "checkpoint": {}, "settings": {**resolved(cfg), "port": "abc"},
              "node_versions": {}, "units": {"head": {"dsv41-r0.service": "x\n"}}, "files": {}, "secret_files": {}}
    rel.begin(cfg.state_dir, fields, 10, carrier={"by": "doit launch", "pid": 1, "since": time.time()})
    record = os.path.join(rel.folder(cfg.state_dir, 1), rel.RECORD)
    before = open(record, "rb").read()
    lines = []
    w = watchdog.Watchdog(cfg, log=lines.append)
    for _ in range(3):
        assert w.carry_on() is False
        time.sleep(1)
    wait(running, "the page", lambda: hook.posts)
    time.sleep(5)                                      # two group intervals more: still one page
    assert carried == [] and open(record, "rb").read() == before
    assert [p["body"]["status"] for p in hook.posts] == ["firing"], hook.posts
    (alert,) = hook.posts[0]["body"]["alerts"]
    assert alert["labels"]["alertname"] == "DSV41NeedsAPerson" and alert["labels"]["release"] == "release 1"
    assert alert["annotations"]["description"].startswith(f"{record}: release 1's settings cannot be read")
    assert sum("NEEDS A PERSON: release 1 cannot be carried on" in ln for ln in lines) == 1, lines
    rel.finish(cfg.state_dir, 1, rel.INTERRUPTED, "interrupted")        # a person settled it
    assert w.carry_on() is False
    wait(running, "the resolved notification", lambda: len(hook.posts) == 2, timeout=60)
    assert hook.posts[1]["body"]["status"] == "resolved"


def test_a_silence_stops_notifications_and_unsilence_ends_it(running):
    cfg, hook, box = running["cfg"], running["hook"], running["box"]
    base = am.url(cfg)
    line = silences.silence(cfg, "doit stop")
    assert line.startswith("alerts of cluster sparks silenced by doit stop until "), line
    assert silences.silence(cfg, "doit stop") == "alerts of cluster sparks were already silenced by doit stop"
    (sil,) = silences.silences(cfg)
    assert sil["createdBy"] == "dsv41 doit stop" and am.ts(sil["endsAt"]) <= time.time() + 6 * 3600 + 5
    assert silences.silence_line(cfg).startswith("alerts silenced since ") and "by doit stop (ends " in \
        silences.silence_line(cfg)
    api_down = [as_prometheus_sends(cfg, "DSV41ApiDown", {"job": "dsv41-engine", "instance": "127.0.0.1:8000",
                                                          "node": "head"})]
    am.post_alerts(base, api_down)
    time.sleep(5)
    assert hook.posts == [] and box.messages == []
    listing = doit(running, "alerts")
    assert listing.returncode == 0 and "DSV41ApiDown" in listing.stdout and "silenced" in listing.stdout
    assert "by dsv41 doit stop" in listing.stdout
    assert silences.unsilence(cfg, "doit launch") == "no silence set by doit launch of cluster sparks's alerts to end"
    assert silences.unsilence(cfg) == "alerts of cluster sparks are no longer silenced"
    assert silences.silences(cfg) == [] and silences.silence_line(cfg) is None
    am.post_alerts(base, api_down)
    wait(running, "the notification after the silence ended", lambda: hook.posts and box.messages)
    assert hook.posts[0]["body"]["alerts"][0]["labels"]["alertname"] == "DSV41ApiDown"


def test_a_silence_ends_soon_after_planned_work_so_its_alerts_resolve_first(running):
    cfg = running["cfg"]
    silences.silence(cfg, "doit stop")
    silences.silence(cfg, "doit launch")
    line = silences.end_soon(cfg, 3)
    assert line.startswith("alerts of cluster sparks stay silenced until "), line
    assert all(am.ts(s["endsAt"]) <= time.time() + 3.5 for s in silences.silences(cfg))
    assert len(silences.silences(cfg)) == 2                        # still there, for the resolving alerts
    wait(running, "the silences to end", lambda: silences.silences(cfg) == [], timeout=15)
    assert silences.end_soon(cfg, 3) == "no silence of cluster sparks's alerts to end"


def test_a_silence_ends_once_its_work_is_over_and_no_other(running):
    """Each silence names its owner: the watchdog ends those of releases that are final and of a repair whose
    process is gone (a launch that died before it ended its own), two scrapes from now; a release still
    rolling out, a living launch and `doit stop` keep theirs."""
    cfg = running["cfg"]
    dead = subprocess.Popen(["true"])
    dead.wait()                                                     # a repair's launch that died: its pid is gone
    owners = ("doit launch, release 4", "dsv41-watchdog, release 5", "doit stop", f"doit launch, pid {dead.pid}",
              f"doit launch, pid {os.getpid()}")
    for owner in owners:
        silences.silence(cfg, owner)
    assert sorted(str(silences.owner(s)) for s in silences.silences(cfg)) == sorted(
        ["('release', 4)", "('release', 5)", "None", f"('pid', {dead.pid})", f"('pid', {os.getpid()})"])
    line = silences.end_owned(cfg, {3, 4}, 3)
    assert line == (f"ended the silence of doit launch, pid {dead.pid}, doit launch, release 4: its work is over "
                    f"(it ends at {silences.clock(time.time() + 3)}, once the restart's alerts resolved)"), line
    ends = {s["createdBy"][len("dsv41 "):]: am.ts(s["endsAt"]) for s in silences.silences(cfg)}
    assert max(ends["doit launch, release 4"], ends[f"doit launch, pid {dead.pid}"]) <= time.time() + 3.5
    assert min(ends[o] for o in owners if "4" not in o and str(dead.pid) not in o) > time.time() + 3600
    assert silences.end_owned(cfg, {3, 4}, 3) is None                  # already ending: nothing more to do
    wait(running, "those silences to end", lambda: len(silences.silences(cfg)) == 3, timeout=15)


def test_a_release_that_failed_pages_once_on_every_receiver(running):
    cfg, hook, box = running["cfg"], running["hook"], running["box"]
    line = silences.page(cfg, "DSV41ReleaseFailed", "release 4 failed (dsv41-r0.service failed); rolled back to "
                         "release 3", "`doit releases show 4` has what changed", {"release": "4"})
    assert line.startswith("paged DSV41ReleaseFailed: release 4 failed"), line
    wait(running, "the release's page", lambda: hook.posts and box.messages)
    time.sleep(3)                                                   # a few group intervals: nothing more
    (post,) = hook.posts
    (alert,) = post["body"]["alerts"]
    assert post["body"]["status"] == "firing" and alert["labels"]["release"] == "4"
    assert alert["labels"]["cluster"] == "sparks" and "rolled back to release 3" in alert["annotations"]["summary"]
    assert len(box.messages) == 1 and "DSV41ReleaseFailed" in text_of(box.messages[0])
    assert box.messages[0]["Subject"] == ("[FIRING] sparks: release 4 failed (dsv41-r0.service failed); rolled back "
                                          "to release 3 "), box.messages[0]["Subject"]


def test_a_release_page_outlives_the_restarts_silence_however_short_the_alert_window(running):
    """ALERT_RECENT_MIN=0.12 (about 7 s) and the restart's silence ending in 8 s: the page still fires once
    the silence is over (an alert that ended silenced would page no one)."""
    cfg, hook = running["cfg"], running["hook"]
    short = dataclasses.replace(cfg, alert_recent_min=0.12)
    silences.silence(short, "doit launch")
    silences.end_soon(short, 8)
    t0 = time.time()
    silences.page(short, "DSV41ReleaseFailed", "release 5 failed; rolled back to release 4", "-", {"release": "5"},
                  silenced_s=8)
    wait(running, "the release's page after the silence", lambda: hook.posts, timeout=30)
    (post,) = hook.posts
    assert post["body"]["status"] == "firing" and time.time() - t0 >= 8


def doit(running, *words):
    env = {"PATH": os.environ["PATH"], "HOME": str(running["tmp"]), "STATE_DIR": str(running["tmp"] / "state"),
           "WORKER": "root@10.10.10.11", "CLUSTER_NAME": "sparks", **running["env"]}
    return subprocess.run([str(ROOT / ".venv" / "bin" / "doit"), "-f", str(ROOT / "dodo.py"), *words],
                          env=env, capture_output=True, text=True, cwd=running["tmp"], timeout=120)


def test_doit_alerts_test_reports_delivery_per_integration(running):
    r = doit(running, "alerts", "test")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^  webhook +delivered$", r.stdout, re.M) and re.search(r"^  email +delivered$", r.stdout, re.M)
    wait(running, "the test alert, firing and resolved", lambda: len(running["hook"].posts) == 2
         and len(running["box"].messages) == 2)
    assert [p["body"]["status"] for p in running["hook"].posts] == ["firing", "resolved"]
    assert running["hook"].posts[0]["body"]["alerts"][0]["labels"]["alertname"] == "DSV41Test"
    running["smtp"].stop()
    r = doit(running, "alerts", "test")
    assert r.returncode == 3, r.stdout + r.stderr
    assert re.search(r"^  webhook +delivered$", r.stdout, re.M)
    assert re.search(r"^  email +not delivered", r.stdout, re.M), r.stdout
    bad = doit(running, "alerts", "tset")
    errors = [line for line in bad.stderr.splitlines() if not line.startswith(".  ")]   # doit's progress line
    assert bad.returncode == 2 and len(errors) == 1 and "`doit alerts test`" in errors[0], bad.stderr


def test_no_secret_in_argv_unit_or_world_readable_file(running):
    pid, tmp = running["proc"].pid, running["tmp"]
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
    assert "--cluster.listen-address=" in cmdline.split("\0")
    for secret in (PASSWORD, HOOK_TOKEN):
        assert secret not in cmdline
        assert secret not in Path(running["paths"]["dsv41-alertmanager.service"]).read_text()
        for p in (tmp / "state").rglob("*"):
            if p.is_file() and p.stat().st_mode & 0o004:
                assert secret.encode() not in p.read_bytes(), p
    assert HOOK_TOKEN in Path(running["paths"]["alertmanager.yml"]).read_text()
    assert stat.S_IMODE(os.stat(running["paths"]["alertmanager.yml"]).st_mode) == 0o600
    assert f"--web.listen-address=127.0.0.1:{running['cfg'].alertmanager_port}" in cmdline.split("\0")


def test_the_webhook_url_is_hidden_and_never_resolved_for_the_watchdog(tmp_path):
    cfg = cfg_for(tmp_path, ALERT_WEBHOOK_URL=f"https://ntfy.example.org/{HOOK_TOKEN}")
    rows = {k: (v, src) for k, v, src in config.describe(cfg)}
    assert rows["ALERT_WEBHOOK_URL"] == ("(set)", "environment")
    data = resolved.resolved(cfg)
    assert HOOK_TOKEN not in json.dumps(data) and resolved.from_resolved(data).alert_webhook_url == ""
    prof = tmp_path / "conf"
    with pytest.raises(kinds.ConfigError, match="may be set only in the environment"):
        layers._profile_layer("x", {"alert_webhook_url": "https://ntfy.example.org/t"}, {"args": {}, "env": {}},
                              layers.schema.SETTINGS, layers.schema.ENGINE)
    assert not prof.exists()


def test_the_monitoring_units_pass_systemd_analyze_verify(tmp_path):
    from test_units import verify_root
    analyze = shutil.which("systemd-analyze")
    if not analyze or not Path("/lib/systemd/system/sysinit.target").exists():
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    cfg = cfg_for(tmp_path, ALERT_WEBHOOK_URL=f"https://ntfy.example.org/{HOOK_TOKEN}")
    root = verify_root(tmp_path)
    for exe in ("prometheus", "prometheus-alertmanager"):
        (root / "usr/bin" / exe).write_text("#!/bin/sh\n")
        (root / "usr/bin" / exe).chmod(0o755)
    units = []
    for unit in ("dsv41-prometheus.service", "dsv41-alertmanager.service"):
        units.append(root / "etc/systemd/system" / unit)
        units[-1].write_text(monitoring.render_unit(cfg, unit))
        assert HOOK_TOKEN not in units[-1].read_text()
    r = subprocess.run([analyze, "verify", "--man=no", f"--root={root}", *map(str, units)],
                       capture_output=True, text=True)
    assert (r.returncode, r.stderr, r.stdout) == (0, "", "")
