"""doit monitoring: a Prometheus configuration scraping the engine's /metrics on the head and
node_exporter on every node, dsv41's alert rules, an Alertmanager configuration delivering them (the
receivers, the grouping per cluster, the inhibition during a recovery) and a Grafana dashboard, rendered
from the Config into $STATE_DIR/monitoring/ (templates in conf/monitoring/). --install runs them as
dsv41-prometheus.service and dsv41-alertmanager.service on the head: Debian's `prometheus` and
`prometheus-alertmanager` binaries with our own config files and data dirs (the distribution's files in
/etc/prometheus/ are left alone, its alertmanager service is masked). Serving needs none of it."""
import json
import os
import pwd
import re
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import jinja2
import requests

from dsv41 import names
from dsv41.errors import UserError, one_line
from dsv41.head.core import alertmanager as am
from dsv41.head.core import commands, engine, statefiles, units
from dsv41.head.core.cluster import Cluster, engine_key_file, say
from dsv41.settings.paths import ROOT

TEMPLATES = ROOT / "conf" / "monitoring"
PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "promtool"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
AMTOOL = "amtool"
CONFIG, RULES, DASHBOARD = "prometheus.yml", "rules.yml", "dashboard.json"
AM_CONFIG, AM_TEMPLATES, AM_DATA = "alertmanager.yml", "alerts.tmpl", "alertmanager"
READY_S = 60                           # how long --install waits for Prometheus and its first scrapes


def out_dir(cfg):
    return names.state_path(cfg.state_dir, names.MONITORING)


def engine_targets(cfg):
    """Each serving group's engine, labelled with its first node (and, with GROUPS > 1, `group="g<N>"`): group
    0's rank 0 on the head's loopback, every other group's through its side door, which takes the door's key."""
    if cfg.groups == 1:
        return [{"target": urlsplit(cfg.engine_url).netloc, "labels": {"node": "head"}}]
    return [{"target": g.target, "labels": {"node": g.nodes[0], "group": f"g{g.index}"}} for g in cfg.layout.groups]


def node_targets(cfg):
    """node_exporter on every node, labelled with the node (and, with GROUPS > 1, its group)."""
    return [{"target": f"{cfg.address(s) or '127.0.0.1'}:{cfg.exporter_port}",
             "labels": {"node": s.name, **({"group": f"g{cfg.group_of(s)}"} if cfg.groups > 1 else {})}}
            for s in cfg.nodes]


def _environment(folder):
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(folder)), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, autoescape=False)


def _template(name):
    try:
        return _environment(TEMPLATES).get_template(name)
    except jinja2.TemplateNotFound:
        raise UserError(f"conf/monitoring/{name} is missing: restore it from the repository") from None


def render_config(cfg, rules_path):
    return _template(CONFIG + ".j2").render(
        interval=f"{cfg.scrape_interval_s}s", rules=rules_path, engines=engine_targets(cfg),
        key_file=engine_key_file(cfg) if cfg.metrics_with_key or cfg.groups > 1 else "", nodes=node_targets(cfg),
        cluster=cfg.cluster_name, alertmanager=f"127.0.0.1:{cfg.alertmanager_port}",
        gateway=f"127.0.0.1:{cfg.port}" if cfg.layout.door else "", gateway_path=names.GATEWAY_METRICS_PATH)


def render_rules(cfg, recipe=None):
    """dsv41's alert rules with the engine's (its recipe's rules template, same thresholds) among them."""
    recipe = recipe or engine.for_config(cfg)
    recent_s = round(60 * cfg.alert_recent_min)
    values = dict(for_s=cfg.alert_for_s, recent_min=f"{cfg.alert_recent_min:g}", recent_s=recent_s,
                  recent=f"{recent_s // 60}m" if recent_s % 60 == 0 else f"{recent_s}s",    # a PromQL range
                  ttft_p95_s=f"{cfg.alert_ttft_p95_s:g}",
                  decode_toks_min=f"{cfg.alert_decode_toks_min:g}", margin_gib=f"{cfg.alert_mem_margin_gib:g}",
                  margin_bytes=int(cfg.alert_mem_margin_gib * 2**30),
                  grace_s=cfg.alert_for_s + 2 * cfg.scrape_interval_s, gateway=cfg.layout.door)
    values.update(quiet=watchdog_quiet(values["grace_s"]), quiet_recent=watchdog_quiet(recent_s),
                  quiet_symptom=watchdog_quiet(recent_s + values["grace_s"]),
                  quiet_door=watchdog_quiet(recent_s + values["grace_s"], by=""))
    engine_rules = ""
    if recipe.rules_template:
        path = Path(recipe.rules_template)
        engine_rules = _environment(path.parent).get_template(path.name).render(**values)
    return _template(RULES + ".j2").render(engine_rules=engine_rules, **values)


def watchdog_quiet(after_s, by="group"):
    """What keeps an alert quiet while the watchdog handles a fault: a sign it has not ruled on yet, its
    recovery, and after_s seconds after one ended (no series, as with the watchdog off: nothing kept quiet).
    By serving group: an alert is kept quiet by its own group's watchdog (the `group` label, which only
    GROUPS > 1 sets; with one group neither side has it); by="" is the whole door's, kept quiet by any group's."""
    top = f"max by ({by})" if by else "max"
    return (f"unless on ({by}) ({top} (dsv41_watchdog_judging) == 1 or {top} (dsv41_watchdog_recovering) == 1 or "
            f"time() - {top} (dsv41_watchdog_last_recovery_end_timestamp_seconds) < {after_s})")


def render_alertmanager(cfg, templates_path):
    email = cfg.alert_email_to and {
        "to": cfg.alert_email_to, "sender": cfg.alert_email_from, "smarthost": cfg.alert_smtp_smarthost,
        "user": cfg.alert_smtp_user, "password_file": cfg.alert_smtp_password_file,
        "require_tls": cfg.alert_smtp_require_tls}
    return _template(AM_CONFIG + ".j2").render(
        templates=templates_path, receiver="dsv41" if am.receivers(cfg) else "nowhere", webhook=cfg.alert_webhook_url,
        email=email, group_wait=f"{cfg.alert_group_wait_s}s", group_interval=f"{cfg.alert_group_interval_s}s",
        repeat_interval=f"{cfg.alert_repeat_interval_min}m")


def check_password_file(cfg):
    """Alertmanager reads the mail server's password itself: the file must be there, and ours alone."""
    path = cfg.alert_smtp_password_file
    if not path:
        return
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        raise UserError(f"ALERT_SMTP_PASSWORD_FILE={path} cannot be read ({err.strerror}): write the mail "
                        "server's password there (chmod 0600)") from None
    if mode & 0o004:
        raise UserError(f"ALERT_SMTP_PASSWORD_FILE={path} is readable by every user: chmod 0600 it")
    with open(path, "rb") as f:                  # Alertmanager 0.25 sends the file's bytes as they are
        f.seek(max(0, os.fstat(f.fileno()).st_size - 1))
        if f.read(1) in (b"\n", b"\r"):
            raise UserError(f"ALERT_SMTP_PASSWORD_FILE={path} ends with a newline, which Alertmanager would send "
                            "as part of the password: write it with printf '%s' PASSWORD > FILE")


# the selectors of a serving group's series (its engine's, its nodes'): the dashboard's `group` selector narrows
# them (All is ".*", which a series without the label, GROUPS=1, also matches); the door's (HAProxy's own, and
# its keys' use that the head's exporter serves) show every group
GROUP_SCOPED = re.compile(r'\b(?!dsv41_gateway_)([A-Za-z_:][A-Za-z0-9_:]*\{job="dsv41-(?:engine|node)")')


def dashboard(recipe):
    """The Grafana dashboard: the engine's panels (its recipe's), then dsv41's own, tagged with both; every
    query of a group's series narrowed by the `group` selector."""
    path = TEMPLATES / DASHBOARD
    try:
        board = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"conf/monitoring/{DASHBOARD} cannot be read ({err}): restore it from the repository") from None
    board["panels"] = recipe.dashboard_panels() + board["panels"]
    board["tags"] = board["tags"] + [recipe.name]
    for query in [t for p in board["panels"] for t in p.get("targets", ())] + board["annotations"]["list"]:
        query["expr"] = GROUP_SCOPED.sub(r'\1, group=~"$group"', query["expr"])
    return json.dumps(board, indent=1) + "\n"


def service_user():
    """The unit runs as the user who deploys (it reads the key file and keeps its data in STATE_DIR)."""
    return None if os.getuid() == 0 else pwd.getpwuid(os.getuid()).pw_name


def prometheus_argv(cfg):
    d = out_dir(cfg)
    return [PROMETHEUS, f"--config.file={d}/{CONFIG}", f"--storage.tsdb.path={d}/data",
            f"--web.listen-address=:{cfg.prometheus_port}"]   # no lifecycle API: nobody on the network stops it


def alertmanager_argv(cfg):
    """On 127.0.0.1 only, clustering off; no secret here: those are in its mode-0600 config file."""
    d = out_dir(cfg)
    return [ALERTMANAGER, f"--config.file={d}/{AM_CONFIG}", f"--storage.path={d}/{AM_DATA}",
            f"--web.listen-address=127.0.0.1:{cfg.alertmanager_port}", "--cluster.listen-address="]


def render_unit(cfg, unit=names.PROMETHEUS_UNIT):
    argv = {names.PROMETHEUS_UNIT: {"prometheus": prometheus_argv(cfg)},
            names.ALERTMANAGER_UNIT: {"alertmanager": alertmanager_argv(cfg)}}[unit]
    return units.environment().get_template(unit + ".j2").render(user=service_user(), **argv)


def render(cfg, recipe=None):
    """Write the configs, rules, dashboard and units into $STATE_DIR/monitoring/; returns {name: path}.
    alertmanager.yml is mode 0600 (it may hold the webhook URL). The engine's rules and panels are its
    recipe's (the configured one unless given)."""
    check_password_file(cfg)
    d, recipe = out_dir(cfg), recipe or engine.for_config(cfg)
    files = {CONFIG: render_config(cfg, os.path.join(d, RULES)), RULES: render_rules(cfg, recipe),
             DASHBOARD: dashboard(recipe),
             AM_CONFIG: render_alertmanager(cfg, os.path.join(d, AM_TEMPLATES)),
             AM_TEMPLATES: (TEMPLATES / AM_TEMPLATES).read_text(),
             names.PROMETHEUS_UNIT: render_unit(cfg), names.ALERTMANAGER_UNIT: render_unit(cfg, names.ALERTMANAGER_UNIT)}
    paths = {}
    for name, text in files.items():
        paths[name] = os.path.join(d, name)
        statefiles.write_file(paths[name], text, 0o600 if name == AM_CONFIG else 0o644)
    return paths


def check(paths):
    """promtool check config (the rules with it) and amtool check-config; one line naming the problem
    when one fails. Skipped with a note when a tool is missing (monitoring only renders then)."""
    for tool, argv, package in ((PROMTOOL, ["check", "config", paths[CONFIG]], "prometheus"),
                                (AMTOOL, ["check-config", paths[AM_CONFIG]], "prometheus-alertmanager")):
        if not shutil.which(tool):
            print(f"note: {tool} is missing, {os.path.basename(argv[-1])} was not checked (apt install {package})")
            continue
        r = subprocess.run([tool, *argv], capture_output=True, text=True)
        if r.returncode:
            last = (r.stderr.strip() or r.stdout.strip()).splitlines()[-1:] or ["?"]
            raise UserError(f"{tool} {' '.join(argv)} failed: {last[0]}")


def monitoring(cfg, install=False):
    """doit monitoring [--install]."""
    paths = render(cfg)
    check(paths)
    print(f"rendered into {out_dir(cfg)}:")
    print(f"  {CONFIG:<24} Prometheus: the engine at " + ", ".join(e["target"] for e in engine_targets(cfg))
          + ", node_exporter on " + ", ".join(f"{n['labels']['node']} {n['target']}" for n in node_targets(cfg)))
    print(f"  {RULES:<24} alert rules (docs/monitoring.md)")
    print(f"  {AM_CONFIG:<24} Alertmanager: alerts of cluster {cfg.cluster_name} to "
          + (", ".join(am.receivers(cfg)) or "nowhere") + " (mode 0600)")
    print(f"  {DASHBOARD:<24} Grafana dashboard: import it with a Prometheus data source")
    print(f"  {names.PROMETHEUS_UNIT:<24} and {names.ALERTMANAGER_UNIT}: the units --install runs")
    if not am.receivers(cfg):
        print("note: no alert receiver is set, alerts go nowhere (set ALERT_WEBHOOK_URL or ALERT_EMAIL_TO: "
              "docs/monitoring.md)")
    if not cfg.metrics_dir:
        print("note: METRICS_DIR is not set: no node_exporter is enabled, and the guard and watchdog write no "
              "metrics (set it, e.g. METRICS_DIR=/var/lib/dsv41/metrics, and run `doit launch`)")
    if install:
        run_installed(cfg, paths)


def run_installed(cfg, paths):
    """dsv41-alertmanager.service and dsv41-prometheus.service on the head: installed, enabled, (re)loaded
    (Debian's prometheus-alertmanager.service masked: it would take the same port); waits until both are
    ready and every target was scraped once, then prints the targets' health."""
    for binary, package in ((PROMETHEUS, "prometheus"), (ALERTMANAGER, "prometheus-alertmanager")):
        if not os.access(binary, os.X_OK):
            raise UserError(f"{binary} is missing on the head: apt install {package} (its own service is not "
                            "needed; dsv41 runs its own unit)")
    cl = Cluster(cfg)
    head = cl.head
    for d in ("data", AM_DATA):
        os.makedirs(os.path.join(out_dir(cfg), d), exist_ok=True)
    head.run(cl.priv(head, commands.systemctl("mask", "--now", "--quiet", names.DEBIAN_ALERTMANAGER_UNIT)))
    for unit in (names.ALERTMANAGER_UNIT, names.PROMETHEUS_UNIT):
        install_unit(cl, head, unit, paths[unit])
    wait_ready(f"{am.url(cfg)}/-/ready", names.ALERTMANAGER_UNIT, "ALERTMANAGER_PORT")
    url = f"http://127.0.0.1:{cfg.prometheus_port}"
    targets = wait_targets(url, names.PROMETHEUS_UNIT)
    for t in targets:
        state = t["health"] + (f" ({t['lastError']})" if t.get("lastError") else "")
        print(f"  {t['labels'].get('job', '?'):<13} {t['labels'].get('node', '?'):<9} {t['scrapeUrl']:<40} {state}")
    print(f"Prometheus: {url} (alerts: {url}/alerts); Alertmanager: {am.url(cfg)} (`doit alerts`); "
          f"dashboard: {paths[DASHBOARD]}")


def install_unit(cl, head, unit, rendered):
    path = f"{names.UNIT_DIR}/{unit}"
    text = statefiles.read_text(rendered)
    have = head.read_file(path)
    if have is None or have.decode(errors="replace") != text:
        head.run(cl.priv(head, ["install", "-m", "0644", rendered, path]))
        head.run(cl.priv(head, commands.systemctl("daemon-reload")))
        head.run(cl.priv(head, commands.systemctl("enable", "--quiet", unit)))
        head.run(cl.priv(head, commands.systemctl("restart", unit)))
        say(head, f"installed and started {path}")
    else:
        head.run(cl.priv(head, commands.systemctl("enable", "--quiet", unit)))
        head.run(cl.priv(head, commands.systemctl("reload-or-restart", unit)))
        say(head, f"{unit} re-read its configuration")


def wait_ready(url, unit, port_setting):
    deadline = time.monotonic() + READY_S
    err = None
    while time.monotonic() < deadline:
        try:
            requests.get(url, timeout=5).raise_for_status()
            return
        except requests.RequestException as e:
            err = e
        time.sleep(1)
    raise UserError(f"{unit} did not become ready at {url} within {READY_S} s ({one_line(err, 200)}): "
                    f"journalctl -u {unit}; is {port_setting} taken?")


def wait_targets(url, unit):
    """Prometheus's active targets once it is ready and has scraped each (or READY_S passed)."""
    deadline = time.monotonic() + READY_S
    targets, err = [], None
    while time.monotonic() < deadline:
        try:
            requests.get(f"{url}/-/ready", timeout=5).raise_for_status()
            targets = requests.get(f"{url}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
            if targets and all(t["health"] != "unknown" for t in targets):
                return targets
        except (requests.RequestException, ValueError, KeyError) as e:
            err = e
        time.sleep(1)
    if targets:
        return targets
    raise UserError(f"{unit} did not become ready at {url} within {READY_S} s ({err}): "
                    f"journalctl -u {unit}; is PROMETHEUS_PORT taken?")
