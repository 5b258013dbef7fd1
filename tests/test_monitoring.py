"""doit monitoring: the rendered Prometheus config passes `promtool check config`, every alert rule
fires on its fault and stays quiet otherwise (`promtool test rules`, Debian's promtool: installed by
tests/setup/monitoring.sh; under CI a missing promtool fails these tests), and every dashboard query
names a series that exists: vLLM's from its recorded /metrics, dsv41's from the code that writes them,
node_exporter's from the list below (the lab test proves each returns data), the gateway's from a real
HAProxy's exporter on the rendered gateway config."""
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

import door_socket
from dsv41 import names as dsv41_names
from dsv41.head import config, monitoring
from dsv41.vllm.recipe import Vllm
from dsv41.settings import kinds, layers, resolved
from dsv41.head.core import exporter, gateway, units
from dsv41.node import gateway as node_gateway
from dsv41.node.memguard import textfile

RECORDED = Path("/work/shared/data/vllm-0.32-cpu-metrics.txt")
# node_exporter 1.5's series the dashboard and rules read (meminfo, systemd and textfile collectors)
NODE_SERIES = {"node_memory_MemAvailable_bytes", "node_systemd_unit_state", "node_systemd_service_restart_total",
               "node_textfile_scrape_error"}
# HAProxy 2.6's exporter series the dashboard and rules read (test_the_gateway_series_are_haproxys_own checks each
# against a real HAProxy on the rendered gateway config)
HAPROXY_SERIES = {"haproxy_frontend_http_responses_total", "haproxy_backend_http_responses_total",
                  "haproxy_server_status", "haproxy_backend_current_sessions", "haproxy_backend_current_queue"}
GIB = 2**30


@pytest.fixture(scope="module")
def promtool():
    path = shutil.which("promtool")
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail("promtool is missing: tests/setup/monitoring.sh installs it (Debian's prometheus)")
    pytest.skip("promtool is missing: run tests/setup/monitoring.sh (as root) to install Debian's prometheus")


def cfg_for(tmp_path, **env):
    base = {"STATE_DIR": str(tmp_path / "state"), "WORKERS": "root@10.10.10.11,root@10.10.10.12",
            "METRICS_DIR": "/var/lib/dsv41/metrics"}
    return layers.load_config({**base, **env})


def test_config_passes_promtool_and_keeps_the_key_in_its_file(tmp_path, promtool):
    (tmp_path / "state").mkdir()
    key = tmp_path / "state" / "engine_key"          # rank 0's own key behind the gateway
    key.write_text("sekrit-key-value\n")
    cfg = cfg_for(tmp_path, METRICS_WITH_KEY="1", R0_IP="10.10.10.10")
    paths = monitoring.render(cfg)
    r = subprocess.run([promtool, "check", "config", paths["prometheus.yml"]], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    text = Path(paths["prometheus.yml"]).read_text()
    conf = yaml.safe_load(text)
    engine, gw, node = conf["scrape_configs"]
    assert engine["authorization"] == {"type": "Bearer", "credentials_file": str(key)}
    assert "sekrit" not in "".join(Path(p).read_text() for p in paths.values())
    assert engine["static_configs"][0]["targets"] == ["127.0.0.1:18000"]
    assert (gw["job_name"], gw["metrics_path"], gw["static_configs"]) == (
        "dsv41-gateway", "/gateway/metrics", [{"targets": ["127.0.0.1:8000"], "labels": {"node": "head"}}])
    assert [(s["labels"]["node"], s["targets"]) for s in node["static_configs"]] == [
        ("head", ["10.10.10.10:9100"]), ("worker1", ["10.10.10.11:9100"]), ("worker2", ["10.10.10.12:9100"])]
    r = subprocess.run([promtool, "check", "rules", paths["rules.yml"]], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_with_several_groups_each_groups_engine_is_scraped_through_its_door_and_every_target_names_its_group(
        tmp_path, promtool):
    """GROUPS=2 on four nodes: group 0's engine on the head's loopback, group 1's through its side door on worker2
    (which lets only the door's key in: sent even without METRICS_WITH_KEY, from its file), and every node's
    exporter, each labelled with its group; the config passes promtool."""
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "engine_key").write_text("sekrit-key-value\n")
    cfg = cfg_for(tmp_path, WORKERS="root@10.10.10.11,root@10.10.10.12,root@10.10.10.13", GROUPS="2",
                  R0_IP="10.10.10.10")
    paths = monitoring.render(cfg)
    r = subprocess.run([promtool, "check", "config", paths["prometheus.yml"]], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    engine, _, node = yaml.safe_load(Path(paths["prometheus.yml"]).read_text())["scrape_configs"]
    assert engine["authorization"]["credentials_file"] == str(tmp_path / "state" / "engine_key")
    assert [(s["targets"], s["labels"]) for s in engine["static_configs"]] == [
        (["127.0.0.1:18000"], {"node": "head", "group": "g0"}),
        (["10.10.10.12:18000"], {"node": "worker2", "group": "g1"})]
    assert [(s["labels"]["node"], s["labels"]["group"]) for s in node["static_configs"]] == [
        ("head", "g0"), ("worker1", "g0"), ("worker2", "g1"), ("worker3", "g1")]


def test_without_the_key_setting_no_authorization(tmp_path):
    conf = yaml.safe_load(Path(monitoring.render(cfg_for(tmp_path))["prometheus.yml"]).read_text())
    assert "authorization" not in conf["scrape_configs"][0]


def test_without_the_gateway_neither_its_scrape_job_nor_its_alerts(tmp_path):
    paths = monitoring.render(cfg_for(tmp_path, GATEWAY="0", R0_IP="10.10.10.10"))
    conf = yaml.safe_load(Path(paths["prometheus.yml"]).read_text())
    assert [c["job_name"] for c in conf["scrape_configs"]] == ["dsv41-engine", "dsv41-node"]
    assert conf["scrape_configs"][0]["static_configs"][0]["targets"] == ["10.10.10.10:8000"]   # rank 0 on PORT
    rules = {r["alert"] for g in yaml.safe_load(Path(paths["rules.yml"]).read_text())["groups"] for r in g["rules"]}
    assert "DSV41ApiDown" in rules and not {"DSV41GatewayErrors", "DSV41GatewayDown"} & rules


def test_the_unit_runs_debians_binary_on_our_own_files(tmp_path):
    cfg = cfg_for(tmp_path, PROMETHEUS_PORT="9191")
    unit = monitoring.render_unit(cfg)
    d = f"{cfg.state_dir}/monitoring"
    assert f"ExecStart=/usr/bin/prometheus --config.file={d}/prometheus.yml --storage.tsdb.path={d}/data " \
           "--web.listen-address=:9191" in unit
    assert "/etc/prometheus" not in unit


def test_exporter_dropin_only_with_metrics_dir(tmp_path):
    assert exporter.dropin(cfg_for(tmp_path, METRICS_DIR="")) == {}
    (name, text), = exporter.dropin(cfg_for(tmp_path)).items()
    assert name == "prometheus-node-exporter.service.d/dsv41.conf"
    assert "ExecStart=\nExecStart=/usr/bin/prometheus-node-exporter --web.listen-address=:9100 " \
           "--collector.textfile.directory=/var/lib/dsv41/metrics --collector.systemd " in text


@pytest.mark.parametrize("env, word", [({"PROMETHEUS_PORT": "8000"}, "PROMETHEUS_PORT"),
                                        ({"ALERT_TTFT_P95_S": "0"}, "ALERT_TTFT_P95_S"),
                                        ({"ALERT_DECODE_TOKS_MIN": "fast"}, "ALERT_DECODE_TOKS_MIN"),
                                        ({"ALERT_FOR_S": "-1"}, "ALERT_FOR_S")])
def test_bad_monitoring_settings_are_one_line(tmp_path, env, word):
    with pytest.raises(kinds.ConfigError) as e:
        cfg_for(tmp_path, **env)
    assert word in str(e.value) and "\n" not in str(e.value)


# ---- the alert rules under promtool test rules -----------------------------------------------------

ENGINE = {"job": "dsv41-engine", "instance": "127.0.0.1:8000", "node": "head"}
W1 = {"job": "dsv41-node", "instance": "10.10.10.11:9100", "node": "worker1"}
HEAD = {"job": "dsv41-node", "instance": "127.0.0.1:9100", "node": "head"}
GW = {"job": "dsv41-gateway", "instance": "127.0.0.1:8000", "node": "head"}


def series(name, labels, values):
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def buckets(name, labels, per_le):
    """A histogram's _bucket series: per_le {le: values}."""
    return [series(f"{name}_bucket", {**labels, "le": le}, v) for le, v in per_le.items()]


# (alert, input series, [(eval time, [labels of each firing alert])]); defaults: ALERT_FOR_S 60,
# ALERT_RECENT_MIN 15, ALERT_TTFT_P95_S 30, ALERT_DECODE_TOKS_MIN 15, ALERT_MEM_MARGIN_GIB 4; one sample per 15 s
R1 = {**W1, "name": "dsv41-r1.service", "type": "simple"}
GUARD = {**W1, "name": "dsv41-memguard.service", "type": "exec"}
R0 = {**HEAD, "name": "dsv41-r0.service", "type": "exec"}
RECOVERING = {**HEAD, "node": "worker1", "verdict": "DEAD", "fault_at": "2026-12-01T20:01:02Z",
              "incident": "20261201T200102Z-DEAD"}
ENGINE_G0 = {**ENGINE, "group": "g0"}
ENGINE_G1 = {"job": "dsv41-engine", "instance": "10.10.10.12:8000", "node": "worker2", "group": "g1"}
W3 = {"job": "dsv41-node", "instance": "10.10.10.13:9100", "node": "worker3", "group": "g1"}
R3 = {**W3, "name": "dsv41-r3.service", "type": "simple"}
ENDED_180S = series("dsv41_watchdog_last_recovery_end_timestamp_seconds", HEAD, "0x11 180x100")


def gateway_5xx(frontend, engine):
    """The gateway's 5xx counters: every 5xx it answered (frontend api, the door's 503s among them) and
    those of the engine backend (the engine's own answers, or HAProxy's when it could not reach it)."""
    return [series("haproxy_frontend_http_responses_total", {**GW, "proxy": "api", "code": "5xx"}, frontend),
            series("haproxy_backend_http_responses_total", {**GW, "proxy": "engine", "code": "5xx"}, engine)]


CASES = [
    ("DSV41ApiDown", [series("up", ENGINE, "1x8 0x12 1x8")],
     [("1m", []), ("4m", [ENGINE]), ("6m", [])]),
    # a failed rank unit stays loaded (state active 0); a stopped one is unloaded: its series vanishes
    ("DSV41RankDown", [series("up", W1, "1x28"), series("up", HEAD, "1x28"),
                       series("node_systemd_unit_state", {**R1, "state": "active"}, "1x8 0x12 1x8"),
                       series("node_systemd_unit_state", {**R1, "state": "failed"}, "0x8 1x12 0x8"),
                       series("node_systemd_unit_state", {**R0, "state": "active"}, "1x28"),
                       series("node_systemd_unit_state", {**GUARD, "state": "active"}, "1x8 0x12 1x8")],
     [("1m", []), ("4m", [W1]), ("6m", [])]),
    ("DSV41RankDown", [series("up", W1, "1x28"), series("up", HEAD, "1x28"),     # stale: the scrape lost it
                       series("node_systemd_unit_state", {**R1, "state": "active"}, "1x8 stale _x11 1x8"),
                       series("node_systemd_unit_state", {**R0, "state": "active"}, "1x28")],
     [("1m", []), ("4m", [W1]), ("6m", [])]),
    ("DSV41RankRestarted", [series("node_systemd_service_restart_total", R1, "0x8 1x100"),
                            series("node_systemd_service_restart_total", R0, "0x108"),
                            series("node_systemd_service_restart_total", GUARD, "0x8 1x100")],
     [("1m", []), ("3m", [R1]), ("20m", [])]),
    ("DSV41MemoryGuardTripped", [series("dsv41_memguard_tripped", W1, "0x4 1x4 0x4"),
                                 series("dsv41_memguard_tripped", HEAD, "0x12")],
     [("30s", []), ("1m30s", [W1]), ("2m45s", [])]),
    ("DSV41MemoryNearFloor", [series("dsv41_memguard_mem_available_bytes", W1,
                                     f"{20 * GIB}x4 {4 * GIB}x12 {20 * GIB}x4"),
                              series("dsv41_memguard_floor_bytes", W1, f"{GIB // 2}x20"),
                              series("dsv41_memguard_mem_available_bytes", HEAD, f"{int(4.6 * GIB)}x20"),
                              series("dsv41_memguard_floor_bytes", HEAD, f"{GIB // 2}x20")],
     [("30s", []), ("3m", [W1]), ("4m45s", [])]),
    ("DSV41WatchdogGaveUp", [series("dsv41_watchdog_gave_up", HEAD, "0x4 1x4 0x4")],
     [("30s", []), ("1m30s", [HEAD]), ("2m45s", [])]),
    ("DSV41WatchdogRecovered", [series("dsv41_watchdog_recoveries_total", HEAD, "0x8 1x100")],
     [("1m", []), ("3m", [HEAD]), ("20m", [])]),
    ("DSV41WatchdogNeedsReboot", [series("dsv41_watchdog_verdict", {**HEAD, "verdict": "NEEDS_REBOOT"}, "0x4 1x8"),
                                  series("dsv41_watchdog_verdict", {**HEAD, "verdict": "HEALTHY"}, "1x4 0x8")],
     [("30s", []), ("1m30s", [{**HEAD, "verdict": "NEEDS_REBOOT"}])]),
    # a recovery stopped worker1's rank at 150 s and ended at 180 s: the rank alert stays quiet for
    # ALERT_FOR_S + 2 scrapes (90 s) after the end, then one still down fires ALERT_FOR_S later
    ("DSV41RankDown", [series("up", W1, "1x40"), ENDED_180S,
                       series("node_systemd_unit_state", {**R1, "state": "active"}, "1x9 0x4 1x30")],
     [("3m30s", []), ("6m", [])]),
    ("DSV41RankDown", [series("up", W1, "1x40"), ENDED_180S,
                       series("node_systemd_unit_state", {**R1, "state": "active"}, "1x9 0x30")],
     [("3m30s", []), ("6m", [W1])]),
    ("DSV41ApiDown", [series("up", ENGINE, "1x9 0x3 1x30"), ENDED_180S], [("3m30s", []), ("6m", [])]),
    # while the recovery's series is there, the rank and API alerts are not raised at all
    ("DSV41RankDown", [series("up", W1, "1x40"), series("node_systemd_unit_state", {**R1, "state": "active"}, "0x40"),
                       series("dsv41_watchdog_recovering", RECOVERING, "1x40")], [("4m", [])]),
    ("DSV41ApiDown", [series("up", ENGINE, "0x40"), series("dsv41_watchdog_recovering", RECOVERING, "1x40")],
     [("4m", [])]),
    ("DSV41RankRestarted", [series("node_systemd_service_restart_total", R1, "0x8 1x100"),
                            series("dsv41_watchdog_recovering", RECOVERING, "1x40")], [("3m", [])]),
    ("DSV41RankRestarted", [series("node_systemd_service_restart_total", R1, "0x8 1x100"), ENDED_180S],
     [("3m", []), ("10m", [])]),
    # TTFT: 5 min of 45 s first tokens (p95 58.5 s), then 25 min of 0.5 s ones; a second engine idle
    ("DSV41TtftHigh", buckets("vllm:time_to_first_token_seconds", ENGINE,
                              {"1": "0x20 1+1x99", "10": "0x20 1+1x99", "30": "0x20 1+1x99",
                               "60": "0+1x20 21+1x99", "+Inf": "0+1x20 21+1x99"}),
     [("3m", [{}]), ("25m", [])]),
    ("DSV41TtftHigh", buckets("vllm:time_to_first_token_seconds", ENGINE,          # fast only: quiet
                              {"1": "0+1x40", "10": "0+1x40", "30": "0+1x40", "60": "0+1x40", "+Inf": "0+1x40"}),
     [("3m", []), ("9m", [])]),
    ("DSV41TtftHigh", buckets("vllm:time_to_first_token_seconds", ENGINE,          # idle: quiet
                              {"1": "0x40", "10": "0x40", "30": "0x40", "60": "0x40", "+Inf": "0x40"}),
     [("3m", []), ("9m", [])]),
    # decode: 0.1 s per output token (10 tok/s per stream) for 5 min, then 0.025 s (40 tok/s)
    ("DSV41DecodeSlow", [series("vllm:request_time_per_output_token_seconds_count", ENGINE, "0+1x120"),
                         series("vllm:request_time_per_output_token_seconds_sum", ENGINE, "0+0.1x20 2.025+0.025x99")],
     [("3m", [{}]), ("25m", [])]),
    ("DSV41DecodeSlow", [series("vllm:request_time_per_output_token_seconds_count", ENGINE, "0x40"),   # idle
                         series("vllm:request_time_per_output_token_seconds_sum", ENGINE, "0x40")],
     [("3m", []), ("9m", [])]),
    # a symptom of a fault the watchdog handles pages under its incident, not before it and not again: quiet
    # while the watchdog has a sign it has not ruled on (judging), and for the symptom's window (15 min here)
    # plus ALERT_FOR_S and two scrapes after the recovery ended; the same slow decode without either fires
    ("DSV41DecodeSlow", [series("vllm:request_time_per_output_token_seconds_count", ENGINE, "0+1x120"),
                         series("vllm:request_time_per_output_token_seconds_sum", ENGINE, "0+0.1x120"),
                         series("dsv41_watchdog_judging", HEAD, "1x120")], [("3m", []), ("20m", [])]),
    ("DSV41DecodeSlow", [series("vllm:request_time_per_output_token_seconds_count", ENGINE, "0+1x120"),
                         series("vllm:request_time_per_output_token_seconds_sum", ENGINE, "0+0.1x120"),
                         series("dsv41_watchdog_judging", HEAD, "0x120"), ENDED_180S],
     [("3m", []), ("19m", []), ("21m", [{}])]),
    ("DSV41TtftHigh", buckets("vllm:time_to_first_token_seconds", ENGINE,
                              {"1": "0x20 1+1x99", "10": "0x20 1+1x99", "30": "0x20 1+1x99",
                               "60": "0+1x20 21+1x99", "+Inf": "0+1x20 21+1x99"}) + [ENDED_180S],
     [("3m", []), ("10m", [])]),
    ("DSV41ApiDown", [series("up", ENGINE, "0x40"), series("dsv41_watchdog_judging", HEAD, "1x40")], [("4m", [])]),
    # several serving groups (GROUPS=2, the `group` label): a group's alerts are kept quiet by its own watchdog
    # alone, the door's by any group's
    ("DSV41DecodeSlow", [series("vllm:request_time_per_output_token_seconds_count", ENGINE_G0, "0+1x120"),
                         series("vllm:request_time_per_output_token_seconds_sum", ENGINE_G0, "0+0.1x120"),
                         series("dsv41_watchdog_judging", {**HEAD, "group": "g1"}, "1x120"),
                         series("dsv41_watchdog_judging", {**HEAD, "group": "g0"}, "0x120")],
     [("3m", [{"group": "g0"}])]),
    ("DSV41DecodeSlow", [series("vllm:request_time_per_output_token_seconds_count", ENGINE_G0, "0+1x120"),
                         series("vllm:request_time_per_output_token_seconds_sum", ENGINE_G0, "0+0.1x120"),
                         series("dsv41_watchdog_judging", {**HEAD, "group": "g0"}, "1x120")], [("3m", [])]),
    ("DSV41ApiDown", [series("up", ENGINE_G0, "0x40"), series("up", ENGINE_G1, "0x40"),
                      series("dsv41_watchdog_recovering", {**RECOVERING, "group": "g1"}, "1x40")],
     [("4m", [ENGINE_G0])]),
    ("DSV41RankDown", [series("up", W3, "1x40"), series("node_systemd_unit_state", {**R3, "state": "active"}, "0x40"),
                       series("dsv41_watchdog_last_recovery_end_timestamp_seconds", {**HEAD, "group": "g0"},
                              "0x11 180x100")],
     [("4m", [W3])]),
    ("DSV41GatewayErrors", gateway_5xx("0x8 1+1x20 21x100", "0x8 1+1x20 21x100")
     + [series("dsv41_watchdog_judging", {**HEAD, "group": "g1"}, "1x120")], [("4m", []), ("10m", [])]),
    ("DSV41ExporterDown", [series("up", W1, "1x8 0x12 1x8"), series("up", HEAD, "1x28")],
     [("1m", []), ("4m", [W1]), ("6m", [])]),
    ("DSV41MetricsFileUnreadable", [series("node_textfile_scrape_error", W1, "0x8 1x12 0x8"),
                                    series("node_textfile_scrape_error", HEAD, "0x28")],
     [("1m", []), ("4m", [W1]), ("6m", [])]),
    # the engine answers a 5xx every 15 s for 5 min: it fires, and is quiet once they are out of the window
    ("DSV41GatewayErrors", gateway_5xx("0x8 1+1x20 21x100", "0x8 1+1x20 21x100"),
     [("1m", []), ("4m", [{}]), ("25m", [])]),
    # the door answers 503 for 5 min (closed while a command restarts the ranks): only the frontend counts them
    ("DSV41GatewayErrors", gateway_5xx("0x8 1+1x20 21x40", "0x70"), [("4m", []), ("9m", [])]),
    # the engine's own 5xx while the watchdog judges a fault, and after the recovery that ended at 180 s: quiet
    # for the window plus ALERT_FOR_S and two scrapes (the incident pages on its own)
    ("DSV41GatewayErrors", gateway_5xx("0x8 1+1x20 21x100", "0x8 1+1x20 21x100")
     + [series("dsv41_watchdog_judging", HEAD, "1x120")], [("4m", []), ("10m", [])]),
    ("DSV41GatewayErrors", gateway_5xx("0x8 1+1x4 5x100", "0x8 1+1x4 5x100") + [ENDED_180S],
     [("3m", []), ("10m", [])]),
    ("DSV41GatewayDown", [series("up", GW, "1x8 0x12 1x8"), series("up", ENGINE, "1x28")],
     [("1m", []), ("4m", [GW]), ("6m", [])]),
]


def expected(rule, labels):
    """An alert as promtool reports it: the series' labels, the rule's, its annotations expanded."""
    out = {**labels, **rule.get("labels", {})}
    ann = {k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), v)
           for k, v in rule.get("annotations", {}).items()}
    return {"exp_labels": out, "exp_annotations": ann}


def test_every_alert_fires_on_its_fault_and_only_then(tmp_path, promtool):
    rules_path = Path(monitoring.render(cfg_for(tmp_path))["rules.yml"])
    rules = {r["alert"]: r for g in yaml.safe_load(rules_path.read_text())["groups"] for r in g["rules"]}
    assert {c[0] for c in CASES} == set(rules), "every rule has its cases, every case its rule"
    tests = [{"interval": "15s", "input_series": inputs,
              "alert_rule_test": [{"eval_time": t, "alertname": alert,
                                   "exp_alerts": [expected(rules[alert], lab) for lab in firing]}
                                  for t, firing in evals]}
             for alert, inputs, evals in CASES]
    for alert in rules:                              # each fires in some case and is quiet in some
        evals = [e for a, _, es in CASES if a == alert for e in es]
        assert any(f for _, f in evals) and any(not f for _, f in evals), alert
    test_file = rules_path.parent / "rules_test.yml"
    test_file.write_text(yaml.safe_dump({"rule_files": [rules_path.name], "evaluation_interval": "15s",
                                         "tests": tests}, sort_keys=False))
    r = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_thresholds_follow_the_settings(tmp_path):
    text = monitoring.render_rules(cfg_for(tmp_path, ALERT_TTFT_P95_S="7.5", ALERT_DECODE_TOKS_MIN="22",
                                           ALERT_MEM_MARGIN_GIB="2", ALERT_FOR_S="5", ALERT_RECENT_MIN="2"))
    rules = {r["alert"]: r for g in yaml.safe_load(text)["groups"] for r in g["rules"]}
    assert "[2m]))) > 7.5 unless" in rules["DSV41TtftHigh"]["expr"]
    assert " < 22 unless" in rules["DSV41DecodeSlow"]["expr"]
    assert rules["DSV41MemoryNearFloor"]["expr"].endswith(f"< {2 * GIB}")
    assert rules["DSV41ApiDown"]["for"] == "5s"


def test_a_window_of_a_fraction_of_a_minute_is_written_in_seconds(tmp_path):
    """ALERT_RECENT_MIN=0.25 (how the lab's alert tests wait 15 s, not a minute): every window it sets, in
    the rules and the recipe's, is 15s, and the summaries say 0.25 min."""
    text = monitoring.render_rules(cfg_for(tmp_path, ALERT_RECENT_MIN="0.25"))
    rules = {r["alert"]: r for g in yaml.safe_load(text)["groups"] for r in g["rules"]}
    for name in ("DSV41RankRestarted", "DSV41WatchdogRecovered", "DSV41TtftHigh", "DSV41DecodeSlow"):
        assert "[15s]" in rules[name]["expr"] and "m]" not in rules[name]["expr"], rules[name]["expr"]
    assert "< 15)" in rules["DSV41RankRestarted"]["expr"]
    assert rules["DSV41TtftHigh"]["annotations"]["summary"].startswith("TTFT p95 over the last 0.25 min")


# ---- the dashboard's queries ----------------------------------------------------------------------

def dashboard_queries():
    dash = json.loads(monitoring.dashboard(Vllm(None)))
    out = [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]
    return out + [(a["name"], a["expr"]) for a in dash["annotations"]["list"]]


def selectors(expr):
    """Every series an expression selects: the names before `{` (each query spells its selectors so)."""
    bare = re.sub(r'\{[^}]*\}|\[[^\]]*\]|"[^"]*"', " ", expr)
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare))
    promql = {"sum", "max", "by", "rate", "increase", "changes", "histogram_quantile", "le", "verdict", "code",
              "state", "key", "server"}
    assert words - promql <= set(re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\{", expr)), \
        f"{expr}: a series without a selector, or a function the test does not know"
    return re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\{", expr)


def project_series(tmp_path):
    """dsv41_ series as the guard and the watchdog write them (their own code, run here)."""
    lines = textfile.metrics_lines(10 * GIB, GIB, "enforce", 1, 1.0, True)
    from dsv41.head import watchdog
    from dsv41.head.core import watchdog_metrics
    cfg = cfg_for(tmp_path, METRICS_DIR=str(tmp_path / "metrics"), WORKERS="")
    os.makedirs(cfg.state_dir, exist_ok=True)
    from dsv41.head.core.health import Health, Verdict
    from dsv41.head.core import record
    record.set_startup(cfg.state_dir, {"time": 1_900_000_000, "kind": "recovery", "of": "20300317T174650Z-DEAD",
                                       "total": 98.2, "phases": [{"phase": "weights", "seconds": 2.8, "cache": None}]})
    watchdog.Watchdog(cfg, log=lambda m: None).publish(Health(Verdict.RECOVERING, ("test",), recovering={
        "id": "20300317T174650Z-DEAD", "verdict": "DEAD", "node": "worker1", "fault_at": 1_900_000_000}))
    lines += (tmp_path / "metrics" / "dsv41_watchdog.prom").read_text().splitlines()
    watchdog_metrics.write_gateway_metrics(str(tmp_path / "metrics"), {"alice": {
        "requests": 3, "errors": 0, "unavailable": 1, "limited": 1, "idle_s": 5}})     # usage()'s shape
    lines += (tmp_path / "metrics" / "dsv41_gateway.prom").read_text().splitlines()
    return {re.split(r"[{ ]", line)[0] for line in lines if line and not line.startswith("#")}


def recorded_vllm():
    lines = RECORDED.read_text().splitlines()
    return {re.split(r"[{ ]", line)[0] for line in lines if line and not line.startswith("#")}


def test_every_dashboard_query_names_a_series_that_exists(tmp_path):
    queries = dashboard_queries()
    assert len(queries) >= 12
    vllm, ours = recorded_vllm(), project_series(tmp_path)
    seen = set()
    for title, expr in queries:
        names = selectors(expr)
        assert names, f"{title}: {expr} names no series"
        for name in names:
            assert name.startswith(("vllm:", "dsv41_", "node_", "haproxy_")), f"{title}: {name}"
            known = (vllm if name.startswith("vllm:") else ours if name.startswith("dsv41_")
                     else HAPROXY_SERIES if name.startswith("haproxy_") else NODE_SERIES)
            assert name in known, f"{title}: {name} is not a series that exists"
            seen.add(name)
    for want in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
                 "vllm:kv_cache_usage_perc", "node_memory_MemAvailable_bytes", "dsv41_memguard_floor_bytes",
                 "dsv41_memguard_tripped", "dsv41_watchdog_verdict", "dsv41_watchdog_recoveries_total",
                 "haproxy_frontend_http_responses_total", "haproxy_server_status", "haproxy_backend_current_sessions",
                 "dsv41_gateway_key_requests_total", "dsv41_gateway_key_unavailable_total",
                 "dsv41_gateway_key_limited_total"):
        assert want in seen, f"the dashboard shows no {want}"


def test_the_dashboards_group_selector_narrows_each_groups_series_and_all_keeps_every_one(tmp_path, promtool):
    """GROUPS > 1: the `group` selector shows one group's engine and nodes, All shows them together; with one
    group (no `group` label at all) All shows everything as before. The door's panels (HAProxy's series, the
    keys' use) are the whole door's and ignore it. Evaluated by Prometheus's own engine (promtool)."""
    dash = json.loads(monitoring.dashboard(Vllm(None)))
    assert [v["name"] for v in dash["templating"]["list"]] == ["group"]
    queries = [e for _, e in dashboard_queries()]
    for expr in queries:
        door = "haproxy_" in expr or "dsv41_gateway_" in expr
        assert ('group=~"$group"' in expr) != door, expr
    running = next(e for e in queries if "vllm:num_requests_running" in e)
    memory = next(e for e in queries if "node_memory_MemAvailable_bytes" in e)

    def picked(expr, group):
        return expr.replace("$group", group).replace("$__rate_interval", "1m")
    mem = {g: {"job": "dsv41-node", "instance": f"10.10.10.{i}:9100", "node": n, "group": g}
           for i, n, g in ((10, "head", "g0"), (13, "worker3", "g1"))}
    two_groups = [series("vllm:num_requests_running", {**ENGINE_G0}, "3x4"),
                  series("vllm:num_requests_running", ENGINE_G1, "5x4")] + \
                 [series("node_memory_MemAvailable_bytes", labels, "7x4") for labels in mem.values()]
    one_group = [series("vllm:num_requests_running", ENGINE, "4x4")]

    def sample(labels, value):
        inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
        return {"labels": f"node_memory_MemAvailable_bytes{{{inner}}}" if labels else "{}", "value": value}
    tests = [{"interval": "15s", "input_series": two_groups, "promql_expr_test": [
                {"expr": picked(running, "g1"), "eval_time": "30s", "exp_samples": [sample({}, 5)]},
                {"expr": picked(running, ".*"), "eval_time": "30s", "exp_samples": [sample({}, 8)]},
                {"expr": picked(memory, "g1"), "eval_time": "30s", "exp_samples": [sample(mem["g1"], 7)]},
                {"expr": picked(memory, ".*"), "eval_time": "30s",
                 "exp_samples": [sample(m, 7) for m in mem.values()]}]},
             {"interval": "15s", "input_series": one_group, "promql_expr_test": [
                {"expr": picked(running, ".*"), "eval_time": "30s", "exp_samples": [sample({}, 4)]}]}]
    rules_path = Path(monitoring.render(cfg_for(tmp_path))["rules.yml"])
    test_file = rules_path.parent / "dashboard_test.yml"
    test_file.write_text(yaml.safe_dump({"rule_files": [rules_path.name], "evaluation_interval": "15s",
                                         "tests": tests}, sort_keys=False))
    r = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def gateway_running(cfg, keys):
    """A real HAProxy on cfg's rendered gateway config (its admin socket: names.GATEWAY_SOCKET), with the
    client keys {name: key} in its map and no engine behind it; yields its URL once it answers."""
    sd = cfg.state_dir
    node_gateway.ensure(sd, {"name": "default", "hash": gateway.key_hash(keys["default"])})
    for name, key in keys.items():
        if name != "default":
            node_gateway.keys(sd, {"add": {"name": name, "hash": gateway.key_hash(key)}}, dsv41_names.GATEWAY_SOCKET)
    conf = Path(dsv41_names.state_path(sd, dsv41_names.GATEWAY_CONFIG))      # beside its maps
    conf.write_text(units.gateway_config(cfg))
    held = door_socket.hold(cfg.port)                   # PORT, as dsv41-gateway.socket holds it
    proc = door_socket.haproxy(["-db", "-f", str(conf)], held, env={**os.environ, "DSV41_ENGINE_KEY": "k"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{cfg.port}"
    try:
        for _ in range(100):
            try:
                requests.get(url + dsv41_names.GATEWAY_METRICS_PATH, timeout=2)
                break
            except requests.RequestException:
                time.sleep(0.1)
        else:
            raise AssertionError(f"HAProxy did not answer on {url}")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        held.close()


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed (tests/setup/monitoring.sh "
                                                             "installs it)")
def test_the_gateway_series_are_haproxys_own(tmp_path, monkeypatch):
    """Every haproxy_ selector of the rules and the dashboard (its name and its proxy, server and code) matches
    a series of a real HAProxy's exporter, run on the rendered gateway config."""
    monkeypatch.setattr(dsv41_names, "GATEWAY_SOCKET", str(tmp_path / "admin.sock"))
    cfg = cfg_for(tmp_path, PORT=str(free_port()), ENGINE_PORT=str(free_port()))
    with gateway_running(cfg, {"default": "a-client-key"}) as url:
        text = requests.get(url + dsv41_names.GATEWAY_METRICS_PATH, timeout=5).text
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    rules = yaml.safe_load(monitoring.render_rules(cfg))["groups"][0]["rules"]
    exprs = [e for _, e in dashboard_queries()] + [r["expr"] for r in rules]
    wanted = [(m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2))))
              for e in exprs for m in re.finditer(r"(haproxy_\w+)\{([^}]*)\}", e)]
    assert {name for name, _ in wanted} == HAPROXY_SERIES
    for name, labels in wanted:
        labels.pop("job")                                  # Prometheus's, from the scrape
        assert any(s.name == name and labels.items() <= s.labels.items() for s in samples), (name, labels)


def test_a_misspelt_series_is_caught(tmp_path):
    assert "vllm:num_requests_runing" not in recorded_vllm()
    with pytest.raises(AssertionError):
        selectors("sum(rate(vllm:prompt_tokens_total[5m]))")       # no selector braces: not checkable


# ---- launch: the node exporter's drop-in in the desired state and the decision --------------------

def test_launch_installs_the_dropin_and_starts_the_exporter_without_touching_the_ranks(tmp_path):
    from test_decide import cluster, running, states, steps_of, want

    from dsv41.head.core.decide import Kind, decide
    dropin, unit = "prometheus-node-exporter.service.d/dsv41.conf", "prometheus-node-exporter.service"
    cl = cluster(tmp_path, METRICS_DIR="/var/lib/dsv41/metrics")
    w = want(cl)
    assert all(dropin in w.units[n.name] for n in cl.nodes)
    assert dropin in cl.unit_names(cl.head) and unit in cl.unit_names(cl.head)
    facts = running(cl, w)
    for n in cl.nodes:
        facts[n.name]["units"][unit] = {"ActiveState": "active", "LoadState": "loaded"}
    assert decide(cl.cfg.nodes, w, states(facts), cl.recipe) == []
    facts["worker1"]["units"][dropin] = {"installed": False, "text": None}
    facts["head"]["units"][unit] = {"ActiveState": "inactive", "LoadState": "masked"}
    assert steps_of(decide(cl.cfg.nodes, w, states(facts), cl.recipe)) == [
        (Kind.INSTALL, "worker1"), (Kind.START_EXPORTER, "head"), (Kind.START_EXPORTER, "worker1")]
    facts["head"]["units"][unit] = {"ActiveState": "inactive", "LoadState": "not-found"}   # no package: once only
    facts["worker1"]["units"][dropin] = {"installed": True, "text": w.units["worker1"][dropin]}
    assert decide(cl.cfg.nodes, w, states(facts), cl.recipe) == []

    off = cluster(tmp_path, METRICS_DIR="")
    w_off = want(off)
    assert all(dropin not in w_off.units[n.name] for n in off.nodes) and unit not in off.unit_names(off.head)
    assert decide(off.cfg.nodes, w_off, states(running(off, w_off)), off.recipe) == []


def test_doit_monitoring_renders_and_says_where(tmp_path, promtool):
    root = Path(__file__).resolve().parents[1]
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "STATE_DIR": str(tmp_path / "state"),
           "WORKER": "root@10.10.10.11"}
    run = [str(root / ".venv" / "bin" / "doit"), "-f", str(root / "dodo.py"), "monitoring"]
    r = subprocess.run(run, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    d = tmp_path / "state" / "monitoring"
    assert f"rendered into {d}:" in r.stdout
    assert "node_exporter on head 127.0.0.1:9100, worker1 10.10.10.11:9100" in r.stdout
    assert sorted(p.name for p in d.iterdir()) == ["alertmanager.yml", "alerts.tmpl", "dashboard.json",
                                                  "dsv41-alertmanager.service", "dsv41-prometheus.service",
                                                  "prometheus.yml", "rules.yml"]
    assert "note: no alert receiver is set, alerts go nowhere" in r.stdout
    r = subprocess.run(run, env={**env, "PROMETHEUS_PORT": "8000"}, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "dsv41: PROMETHEUS_PORT=8000 is not valid: expected a port other than PORT and EXPORTER_PORT"]
