"""doit monitoring: a Prometheus configuration scraping the engine's /metrics on the head and
node_exporter on every node, dsv41's alert rules and a Grafana dashboard, rendered from the Config
into $STATE_DIR/monitoring/ (templates in conf/monitoring/). --install runs them as dsv41-prometheus.service
on the head: Debian's `prometheus` binary with our own config file and data dir (the distribution's
/etc/prometheus/prometheus.yml and its service are left alone). Serving needs none of it."""
import json
import os
import pwd
import shutil
import subprocess
import time
from urllib.parse import urlsplit

import jinja2
import requests

from dsv41 import names
from dsv41.errors import UserError
from dsv41.files import write_atomic
from dsv41.head.core import commands, units
from dsv41.head.core.cluster import Cluster, say
from dsv41.head.config import ROOT

TEMPLATES = ROOT / "conf" / "monitoring"
PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "promtool"
UNIT_TEMPLATE = "dsv41-prometheus.service.j2"
CONFIG, RULES, DASHBOARD = "prometheus.yml", "rules.yml", "dashboard.json"
READY_S = 60                           # how long --install waits for Prometheus and its first scrapes


def out_dir(cfg):
    return names.state_path(cfg.state_dir, names.MONITORING)


def _host(spec):
    """Where the head reaches a node: its fabric address when set, else its ssh target's host."""
    if spec.rank == 0:
        return spec.ip or "127.0.0.1"
    return spec.ip or spec.target.split("@")[-1]


def engine_target(cfg):
    return urlsplit(cfg.api_url).netloc


def node_targets(cfg):
    return [{"name": s.name, "target": f"{_host(s)}:{cfg.exporter_port}"} for s in cfg.nodes]


def _template(name):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False)
    try:
        return env.get_template(name)
    except jinja2.TemplateNotFound:
        raise UserError(f"conf/monitoring/{name} is missing: restore it from the repository") from None


def render_config(cfg, rules_path):
    return _template(CONFIG + ".j2").render(
        interval=f"{cfg.scrape_interval_s}s", rules=rules_path, engine=engine_target(cfg),
        key_file=cfg.api_key_file if cfg.metrics_with_key else "", nodes=node_targets(cfg))


def render_rules(cfg):
    return _template(RULES + ".j2").render(
        for_s=cfg.alert_for_s, recent_min=cfg.alert_recent_min, ttft_p95_s=f"{cfg.alert_ttft_p95_s:g}",
        decode_toks_min=f"{cfg.alert_decode_toks_min:g}", margin_gib=f"{cfg.alert_mem_margin_gib:g}",
        margin_bytes=int(cfg.alert_mem_margin_gib * 2**30))


def dashboard():
    path = TEMPLATES / DASHBOARD
    try:
        return json.dumps(json.loads(path.read_text()), indent=1) + "\n"
    except (OSError, ValueError) as err:
        raise UserError(f"conf/monitoring/{DASHBOARD} cannot be read ({err}): restore it from the repository") from None


def service_user():
    """The unit runs as the user who deploys (it reads the key file and keeps its data in STATE_DIR)."""
    return None if os.getuid() == 0 else pwd.getpwuid(os.getuid()).pw_name


def prometheus_argv(cfg):
    d = out_dir(cfg)
    return [PROMETHEUS, f"--config.file={d}/{CONFIG}", f"--storage.tsdb.path={d}/data",
            f"--web.listen-address=:{cfg.prometheus_port}", "--web.enable-lifecycle"]


def render_unit(cfg):
    return (units.environment().get_template(UNIT_TEMPLATE)
            .render(user=service_user(), prometheus=prometheus_argv(cfg)))


def render(cfg):
    """Write the config, rules, dashboard and unit into $STATE_DIR/monitoring/; returns {name: path}."""
    d = out_dir(cfg)
    rules = os.path.join(d, RULES)
    files = {CONFIG: render_config(cfg, rules), RULES: render_rules(cfg), DASHBOARD: dashboard(),
             names.PROMETHEUS_UNIT: render_unit(cfg)}
    paths = {}
    for name, text in files.items():
        paths[name] = os.path.join(d, name)
        write_atomic(paths[name], text, 0o644)
    return paths


def check(paths):
    """promtool check config (the rules with it); one line naming the problem when it fails. Skipped
    with a note when promtool is missing (monitoring only renders then)."""
    if not shutil.which(PROMTOOL):
        print(f"note: {PROMTOOL} is missing, the files were not checked (apt install prometheus)")
        return
    r = subprocess.run([PROMTOOL, "check", "config", paths[CONFIG]], capture_output=True, text=True)
    if r.returncode:
        last = (r.stderr.strip() or r.stdout.strip()).splitlines()[-1:] or ["?"]
        raise UserError(f"promtool check config {paths[CONFIG]} failed: {last[0]}")


def monitoring(cfg, install=False):
    """doit monitoring [--install]."""
    paths = render(cfg)
    check(paths)
    print(f"rendered into {out_dir(cfg)}:")
    print(f"  {CONFIG:<24} Prometheus: the engine at {engine_target(cfg)}, node_exporter on "
          + ", ".join(f"{n['name']} {n['target']}" for n in node_targets(cfg)))
    print(f"  {RULES:<24} alert rules (README \"Monitoring\")")
    print(f"  {DASHBOARD:<24} Grafana dashboard: import it with a Prometheus data source")
    print(f"  {names.PROMETHEUS_UNIT:<24} the unit --install runs")
    if not cfg.metrics_dir:
        print("note: METRICS_DIR is not set: no node_exporter is enabled, and the guard and watchdog write no "
              "metrics (set it, e.g. METRICS_DIR=/var/lib/dsv41/metrics, and run `doit launch`)")
    if install:
        run_installed(cfg, paths)


def run_installed(cfg, paths):
    """dsv41-prometheus.service on the head: installed, enabled, (re)loaded; waits until it is ready and
    every target was scraped once, then prints the targets' health."""
    if not os.access(PROMETHEUS, os.X_OK):
        raise UserError(f"{PROMETHEUS} is missing on the head: apt install prometheus (its own service "
                        "is not needed; dsv41 runs dsv41-prometheus.service)")
    cl = Cluster(cfg)
    head = cl.head
    os.makedirs(os.path.join(out_dir(cfg), "data"), exist_ok=True)
    unit = names.PROMETHEUS_UNIT
    path = f"{names.UNIT_DIR}/{unit}"
    text = open(paths[unit]).read()
    have = head.read_file(path)
    if have is None or have.decode() != text:
        head.run(cl.priv(head, ["install", "-m", "0644", paths[unit], path]))
        head.run(cl.priv(head, commands.systemctl("daemon-reload")))
        head.run(cl.priv(head, commands.systemctl("enable", "--quiet", unit)))
        head.run(cl.priv(head, commands.systemctl("restart", unit)))
        say(head, f"installed and started {path}")
    else:
        head.run(cl.priv(head, commands.systemctl("enable", "--quiet", unit)))
        head.run(cl.priv(head, commands.systemctl("reload-or-restart", unit)))
        say(head, f"{unit} re-read its configuration")
    url = f"http://127.0.0.1:{cfg.prometheus_port}"
    targets = wait_targets(url, unit)
    for t in targets:
        state = t["health"] + (f" ({t['lastError']})" if t.get("lastError") else "")
        print(f"  {t['labels'].get('job', '?'):<13} {t['labels'].get('node', '?'):<9} {t['scrapeUrl']:<40} {state}")
    print(f"Prometheus: {url} (alerts: {url}/alerts); dashboard: {paths[DASHBOARD]}")


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
