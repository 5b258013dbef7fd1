"""The serving recipe is one seam: a recipe that differs from vLLM's in shape (two units per node, the
head started first and stopped last, another progress metric, a setting and series of its own) drives
launch's apply and readiness wait, doit stop, the decision, the watchdog's judgement, doit config,
doit top and the monitoring files without any of them changing.

FakeRecipe is a stand-in engine for this test only; the node commands are recorded instead of run (no
systemd here; the lab tests run the vLLM recipe against real systemd, Docker and the stand-in engine)."""
import http.server
import io
import json
import threading
from types import SimpleNamespace

import pytest

from dsv41.client import metrics
from dsv41.head import config as config_verb, launch, monitoring, plan, stop, top
from dsv41.head.core.top_watch import Observer
from dsv41.head.core import rollout
from dsv41.head.core import cluster as cluster_mod, engine, ranks
from dsv41.head.core.cluster import Cluster
from dsv41.head.core.decide import Kind, decide
from dsv41.head.core.health import BUSY, DEGRADED, HEALTHY, NO_TOKEN, TOKEN, WEDGED, Memory, Observation, judge
from dsv41.head.core.nodes import Node, Result
from dsv41.head.core.recipe import Part, Recipe
from dsv41.head.core.state import parse
from dsv41.errors import UserError
from dsv41.settings.kinds import ConfigError
from dsv41.settings.layers import load_config
from dsv41.settings.resolved import from_resolved, resolved
from dsv41.settings.setting import Setting
from test_decide import KEY, OVERRIDES, PLAN, states, want

STEPS = "fake:engine_steps_total"
QUEUE = "fake:queue_depth"
SERIES = metrics.Series(running="fake:serving", waiting=QUEUE, kv_usage="fake:cache_fraction",
                        prompt_tokens="fake:read_total", generation_tokens="fake:written_total",
                        preemptions="fake:evicted_total", ttft="fake:first_word_seconds", itl="fake:word_gap_seconds")
# the fake engine's own settings, declared as vllm/settings.py declares vLLM's
FAKE_SETTINGS = SimpleNamespace(
    SETTINGS=(Setting("FAKE_QUEUE_LIMIT", "int", 4, "requests the fake server queues", lo=1, hi=64),),
    SECRET_ENV=("FAKE_SERVER_KEY",), FLAG_SETTINGS={}, derive=lambda values: values)
RULES = """      - alert: FakeQueueLong
        expr: fake:queue_depth > {{ for_s }}

"""


class FakeRecipe(Recipe):
    """Two units per node: a store (no container) and a server; the head first, workers after it."""
    name = "fake"
    series = SERIES
    work_metrics = (QUEUE,)
    work_words = ("queued",)
    progress_metrics = (STEPS,)
    restart_together = False
    memory_settings = "FAKE_QUEUE_LIMIT"
    ready_after = 2                      # readiness probes that fail before one passes

    def parts(self, spec):
        return (Part(f"fake-store-{spec.rank}.service", ""),
                Part(f"fake-serve-{spec.rank}.service", f"fake-serve-{spec.rank}"))

    def start_order(self, specs):
        return [(s, u) for s in specs for u in self.units(s)]

    def stop_order(self, specs):
        return [(s, u) for s in reversed(specs) for u in reversed(self.units(s))]

    def render(self, render, spec, fabric, paths, master_addr=None, server_flags=()):
        return {u: f"[Service]\nExecStart=/usr/bin/fake --rank {spec.rank} --part {u}\n" for u in self.units(spec)}

    metrics_at = "http://127.0.0.1:1/fake-metrics"

    def metrics_url(self):
        return self.metrics_at

    def scrape(self, timeout):
        return metrics.scrape(self.metrics_url(), timeout=timeout)

    def ready(self, client):
        self.ready_after -= 1
        return self.ready_after < 0

    def dashboard_panels(self):
        return [{"title": "Fake queue", "type": "timeseries", "targets": [{"expr": f"sum({QUEUE})"}]}]


def config(tmp_path, engine=None, **env):
    return load_config({**OVERRIDES, "STATE_DIR": str(tmp_path / "state"), "MODEL_DIR": str(tmp_path / "model"),
                        "API_KEY_FILE": str(tmp_path / "key"), **env}, **({"engine": engine} if engine else {}))


def fake_cluster(tmp_path, **env):
    cfg = config(tmp_path, **env)
    cl = Cluster(cfg, recipe=FakeRecipe(cfg))
    cl.env = {**OVERRIDES, "STATE_DIR": str(tmp_path / "state"), "MODEL_DIR": str(tmp_path / "model"),
              "API_KEY_FILE": str(tmp_path / "key"), **env}
    for n in cl.nodes:
        n.assume_home("/home/bob")
    return cl


def facts_of(cl, w):
    """Probe facts of nodes where the desired state is installed and every unit active."""
    return {n.name: {
        "uid": 0, "image_id": "sha256:abc", "time": 5000.0, "tripped": None, "mem_available_kib": 1 << 20,
        "units": {u: {"installed": True, "text": text, "ActiveState": "active", "SubState": "running",
                      "Result": "success", "ActiveEnterTimestamp": "@1000", "NRestarts": "0"}
                  for u, text in w.units[n.name].items()},
        "containers": {f"fake-serve-{cl.spec(n).rank}": {"state": {"Status": "running"}, "image": "sha256:abc"}},
        "files": {rel: __import__("hashlib").sha256(text.encode()).hexdigest()
                  for rel, (text, _) in w.files[n.name].items()}} for n in cl.nodes}


@pytest.fixture
def recorded(monkeypatch):
    """Every command a Node would run, recorded as (node, argv) and answered as a healthy node would."""
    calls = []

    def run(self, argv, check=True, **kw):
        argv = [str(a) for a in argv]
        calls.append((self.name, argv))
        out = "0\n" if argv == ["id", "-u"] else "ActiveState=active\nSubState=running\nResult=success\n"
        if "dsv41.node.probe" in argv:            # the probe: every unit asked about installed and running
            out = json.dumps({"uid": 0, "time": 1.0, "units": {u: {
                "installed": True, "text": "", "ActiveState": "active", "SubState": "running", "Result": "success"}
                for u in json.loads(argv[-1])["units"]}})
        return Result(0, out, "")
    monkeypatch.setattr(Node, "run", run)
    monkeypatch.setattr(cluster_mod, "connect", lambda nodes: [])
    return calls


def systemctl(calls, verb):
    return [(node, argv[-1]) for node, argv in calls if argv[:2] == ["systemctl", verb]]


def test_the_decision_follows_the_recipes_units(tmp_path):
    cl = fake_cluster(tmp_path)
    w = want(cl, KEY, PLAN)
    assert list(w.units["worker1"]) == ["dsv41-memguard.service", "fake-store-1.service", "fake-serve-1.service"]
    facts = facts_of(cl, w)
    assert decide(cl.cfg.nodes, w, states(facts), cl.recipe) == []
    facts["worker1"]["units"]["fake-store-1.service"]["ActiveState"] = "failed"
    [step] = decide(cl.cfg.nodes, w, states(facts), cl.recipe)
    assert step.kind is Kind.RESTART_RANKS and step.reason == "fake-store-1.service on worker1 is failed"
    facts["worker1"]["units"]["fake-store-1.service"]["ActiveState"] = "active"
    facts["head"]["containers"]["fake-serve-0"]["image"] = "sha256:old"
    assert decide(cl.cfg.nodes, w, states(facts), cl.recipe)[0].reason == "fake-serve-0.service runs an older image"
    # a worker unit younger than the head's is no restart for a recipe whose ranks need not restart together
    facts["head"]["containers"]["fake-serve-0"]["image"] = "sha256:abc"
    facts["worker1"]["units"]["fake-serve-1.service"]["ActiveEnterTimestamp"] = "@4000"
    assert decide(cl.cfg.nodes, w, states(facts), cl.recipe) == []
    # a changed unit text of the recipe is installed and restarts the engine
    cl2 = fake_cluster(tmp_path)
    cl2.recipe.render = lambda render, spec, *a, **k: {u: "[Service]\nExecStart=/usr/bin/fake2\n"
                                                       for u in cl2.recipe.units(spec)}
    steps = decide(cl2.cfg.nodes, want(cl2, KEY, PLAN), states(facts_of(cl, w)), cl2.recipe)
    assert [(s.kind, s.node, s.target) for s in steps if s.kind is Kind.INSTALL] == [
        (Kind.INSTALL, "head", "fake-serve-0.service"), (Kind.INSTALL, "head", "fake-store-0.service"),
        (Kind.INSTALL, "worker1", "fake-serve-1.service"), (Kind.INSTALL, "worker1", "fake-store-1.service")]
    [restart] = [s for s in steps if s.kind is Kind.RESTART_RANKS]
    assert restart.reason == ("fake-store-0.service changed; fake-serve-0.service changed; "
                              "fake-store-1.service changed; fake-serve-1.service changed")


def test_launch_restarts_in_the_recipes_order_and_waits_on_its_readiness_probe(tmp_path, recorded, monkeypatch):
    monkeypatch.setattr(ranks.time, "sleep", lambda s: None)
    cl = fake_cluster(tmp_path)
    w = want(cl, KEY, PLAN)
    now = states({**facts_of(cl, w), "worker1": {**facts_of(cl, w)["worker1"], "units": {}}})
    step = decide(cl.cfg.nodes, w, now, cl.recipe)
    rollout.apply(cl, w, [s for s in step if s.kind is Kind.RESTART_RANKS], now)
    assert systemctl(recorded, "stop") == [("worker1", "fake-serve-1.service"), ("worker1", "fake-store-1.service"),
                                           ("head", "fake-serve-0.service"), ("head", "fake-store-0.service")]
    assert systemctl(recorded, "start") == [("head", "fake-store-0.service"), ("head", "fake-serve-0.service"),
                                            ("worker1", "fake-store-1.service"), ("worker1", "fake-serve-1.service")]
    assert not [a for _, a in recorded if "dsv41-r0.service" in a or "dsv41-r1.service" in a]
    recorded.clear()
    ranks.wait_ready(cl)
    assert cl.recipe.ready_after < 0                        # returned once the recipe's probe passed
    shown = {a[-1] for _, a in recorded if a[:2] == ["systemctl", "show"]}
    assert shown == {"fake-store-0.service", "fake-serve-0.service", "fake-store-1.service", "fake-serve-1.service"}


def test_apply_runs_the_heads_services_in_their_order_the_gateway_after_the_ranks(tmp_path, recorded, monkeypatch):
    """core.decide.HEAD_SERVICES is what apply follows: the watchdog before the ranks restart (never by the
    watchdog itself), a gateway that was not running after them (rank 0 may hold PORT until it stops),
    Debian's haproxy masked first; without a restart the gateway starts at once."""
    from dsv41 import names
    from dsv41.head.core.decide import Step
    monkeypatch.setattr(rollout.recovery, "restart", lambda cl, **kw: recorded.append(("all", ["systemctl", "ranks", "all"])))
    monkeypatch.setattr(rollout.silences, "silence", lambda cfg, owned: "silenced")
    cl = fake_cluster(tmp_path)
    w = want(cl, KEY, PLAN)
    steps = [Step(Kind.START_WATCHDOG, "head", names.WATCHDOG_UNIT, ""), Step(Kind.START_GATEWAY, "head",
             names.GATEWAY_UNIT, ""), Step(Kind.RESTART_RANKS, "all", "", "a change")]

    def order():
        out = [(a[1], a[-1]) for _, a in recorded if a[0] == "systemctl" and a[1] in ("start", "mask", "ranks")]
        recorded.clear()
        return out
    rollout.apply(cl, w, steps, {})
    assert order() == [("start", names.WATCHDOG_UNIT), ("ranks", "all"),
                       ("mask", names.DEBIAN_HAPROXY_UNIT), ("start", names.GATEWAY_UNIT)]
    rollout.apply(cl, w, steps, {}, by=names.WATCHDOG_BY)
    assert order() == [("ranks", "all"), ("mask", names.DEBIAN_HAPROXY_UNIT), ("start", names.GATEWAY_UNIT)]
    rollout.apply(cl, w, steps[:2], {})
    assert order() == [("start", names.WATCHDOG_UNIT), ("mask", names.DEBIAN_HAPROXY_UNIT),
                       ("start", names.GATEWAY_UNIT)]


def test_a_gateway_step_acts_on_its_target_the_service_or_the_socket_holding_port(tmp_path, recorded, monkeypatch):
    """The gateway's steps as apply takes them (core.decide.HeadService.socket): PORT taken anew is a restart of
    the socket (systemd restarts the gateway with it: it Requires= it), both kept enabled; a stop stops and
    disables the unit it names, the socket first; a restart of the gateway alone leaves the socket."""
    from dsv41 import names
    from dsv41.head.core.decide import Step
    cl = fake_cluster(tmp_path)
    w = want(cl, KEY, PLAN)
    sock, gw = names.GATEWAY_SOCKET_UNIT, names.GATEWAY_UNIT

    def done(*steps):
        rollout.apply(cl, w, list(steps), {})
        out = [a[1:] for _, a in recorded if a[0] == "systemctl" and a[1] != "mask"]
        recorded.clear()
        return out
    assert done(Step(Kind.RESTART_GATEWAY, "head", sock, "PORT changed")) == [
        ["restart", sock], ["enable", "--quiet", sock, gw]]
    assert done(Step(Kind.RESTART_GATEWAY, "head", gw, "rank 0's key changed")) == [
        ["restart", gw], ["enable", "--quiet", gw]]
    assert done(Step(Kind.STOP_GATEWAY, "head", sock, "GATEWAY=0"), Step(Kind.STOP_GATEWAY, "head", gw, "GATEWAY=0")) == [
        ["stop", sock], ["disable", "--quiet", sock], ["stop", gw], ["disable", "--quiet", gw]]


def stoppable(tmp_path, monkeypatch):
    """A config whose cluster runs the fake recipe and whose nodes need no ssh to know their home."""
    cfg = config(tmp_path)
    monkeypatch.setattr(engine, "for_config", lambda c: FakeRecipe(c))
    for n in Cluster(cfg).nodes:
        n.assume_home("/home/bob")
    monkeypatch.setattr(Node, "home", lambda self: "/home/bob")
    return cfg


def test_doit_stop_stops_the_recipes_units_in_its_order(tmp_path, recorded, monkeypatch):
    cfg = stoppable(tmp_path, monkeypatch)
    stop.stop(cfg)
    assert systemctl(recorded, "stop") == [
        ("head", "dsv41-watchdog.service"),
        ("worker1", "fake-serve-1.service"), ("worker1", "fake-store-1.service"),
        ("head", "fake-serve-0.service"), ("head", "fake-store-0.service"),
        ("head", "dsv41-memguard.service"), ("worker1", "dsv41-memguard.service")]


def test_doit_stop_free_port_stops_the_socket_holding_port_first_then_the_gateway(tmp_path, recorded, monkeypatch):
    """`doit stop --free-port`: the socket unit that holds PORT stops first (a connection would start the gateway
    again), then the gateway; both are disabled. Without --free-port both stay (503 "stopped by `doit stop`")."""
    from dsv41 import names
    cfg = stoppable(tmp_path, monkeypatch)
    stop.stop(cfg)
    assert not [a for _, a in recorded if a[0] == "systemctl" and "dsv41-gateway" in " ".join(a)]
    recorded.clear()
    stop.stop(cfg, free_port=True)
    assert systemctl(recorded, "stop")[-2:] == [("head", names.GATEWAY_SOCKET_UNIT), ("head", names.GATEWAY_UNIT)]
    assert [a for _, a in recorded if a[:2] == ["systemctl", "disable"]] == [
        ["systemctl", "disable", "--quiet", names.GATEWAY_SOCKET_UNIT, names.GATEWAY_UNIT]]


def look(cl, t, steps=100.0, queue=0.0, worker_store="active", probe=TOKEN):
    units = {n.name: {u: {"installed": True, "ActiveState": "active", "SubState": "running", "Result": "success",
                          "ActiveEnterTimestamp": "@1000", "NRestarts": "0"} for u in cl.engine_units(n)}
             for n in cl.nodes}
    units["worker1"]["fake-store-1.service"]["ActiveState"] = worker_store
    nodes = {name: parse({"units": u, "tripped": None, "time": 1000.0 + t}) for name, u in units.items()}
    # vLLM's token counters move in every look: the fake recipe must not read them
    snap = metrics.parse(f"{STEPS} {steps}\n{QUEUE} {queue}\n"
                         f"vllm:prompt_tokens_total {t}\nvllm:num_requests_running 0\n", at=1000.0 + t)
    return Observation(1000.0 + t, nodes, 200, snap, probe)


def test_the_watchdog_judges_by_the_recipes_units_and_progress_metric(tmp_path):
    cl = fake_cluster(tmp_path, WATCHDOG_STALL_S="60")
    mem = Memory()
    assert judge(cl.cfg, look(cl, 600), mem, cl.recipe)[0] == HEALTHY
    verdict, why = judge(cl.cfg, look(cl, 615, steps=150, queue=3, probe=None), mem, cl.recipe)
    assert (verdict, why.split(",")[0]) == (BUSY, "3 queued")
    verdicts = [judge(cl.cfg, look(cl, 615 + 15 * i, steps=150, queue=3, probe=NO_TOKEN), mem, cl.recipe)[0]
                for i in range(1, 6)]
    assert verdicts == [BUSY, BUSY, BUSY, WEDGED, WEDGED]        # steps flat for 60 s with work queued, no token
    verdict, why = judge(cl.cfg, look(cl, 700, worker_store="failed"), Memory(), cl.recipe)
    assert verdict == DEGRADED and why == "fake-store-1.service on worker1 is failed"


def test_the_recipes_own_setting_is_checked_shown_and_kept_for_the_watchdog(tmp_path, capsys):
    cfg = config(tmp_path, engine=FAKE_SETTINGS, FAKE_QUEUE_LIMIT="9", KV_BYTES="5")
    assert cfg.engine == (("FAKE_QUEUE_LIMIT", 9),)                 # vLLM's KV_BYTES is no setting of this engine
    config_verb.show(cfg, setting=("fake_queue_limit",))
    assert capsys.readouterr().out.split() == ["FAKE_QUEUE_LIMIT", "9", "(environment)"]
    with pytest.raises(ConfigError, match=r"^FAKE_QUEUE_LIMIT='65' is not valid: expected a whole number from 1 to 64$"):
        config(tmp_path, engine=FAKE_SETTINGS, FAKE_QUEUE_LIMIT="65")
    data = resolved(cfg)
    assert data["fake_queue_limit"] == 9 and "kv_bytes" not in data
    assert from_resolved(json.loads(json.dumps(data)), engine=FAKE_SETTINGS).engine == cfg.engine


def test_the_monitoring_files_carry_the_recipes_series_rules_and_panels(tmp_path):
    cfg = config(tmp_path, engine=FAKE_SETTINGS)
    recipe = FakeRecipe(cfg)
    (tmp_path / "fake-rules.yml.j2").write_text(RULES)
    recipe.rules_template = tmp_path / "fake-rules.yml.j2"
    paths = monitoring.render(cfg, recipe)
    rules = open(paths["rules.yml"]).read()
    assert f"      - alert: FakeQueueLong\n        expr: fake:queue_depth > {cfg.alert_for_s}\n" in rules
    assert "vllm:" not in rules and "DSV41ApiDown" in rules
    board = json.load(open(paths["dashboard.json"]))
    assert board["panels"][0]["targets"] == [{"expr": "sum(fake:queue_depth)"}] and board["tags"] == ["dsv41", "fake"]
    assert "vllm:" not in json.dumps(board)


class FakeMetrics(http.server.BaseHTTPRequestHandler):
    """The fake engine's /metrics: its own series only (vLLM's absent)."""
    def do_GET(self):
        body = (f"{SERIES.running} 3\n{QUEUE} 1\n{SERIES.kv_usage} 0.25\n{SERIES.generation_tokens} 40\n"
                f"{STEPS} 7\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_doit_top_once_reads_the_recipes_series(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeMetrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cfg = config(tmp_path, engine=FAKE_SETTINGS, SSH_TIMEOUT_S="1", WORKER="nobody@127.0.0.1",
                 SSH_OPTS="-p 1 -o BatchMode=yes")        # the worker refuses at once: top shows it unreachable
    recipe = FakeRecipe(cfg)
    recipe.metrics_at = f"http://127.0.0.1:{server.server_port}/metrics"
    o = Observer(cfg, 0, recipe=recipe)
    try:
        o.once()
        shot = top.snapshot(o)
    finally:
        o.close()
        server.shutdown()
    e = shot["engine"]
    assert (e["state"], e["series"], e["running"], e["waiting"], e["kv_cache_usage_pct"]) == (
        "ok", "fake:serving", 3, 1, 25.0)
    out = io.StringIO()
    top.Console(file=out, width=120, highlight=False).print(top.render(shot))
    assert "3 running, 1 waiting" in out.getvalue() and "25.0 %" in out.getvalue()


def test_doit_plan_shows_the_recipes_own_settings(tmp_path):
    from dsv41.vllm.recipe import Vllm
    cfg = config(tmp_path, KV_BYTES="2500000000")
    assert plan.settings_lines(cfg, Vllm(cfg)) == [           # as plan printed them before the engine had a package
        "settings:", f"  IMAGE          {cfg.image}", f"  MODEL_DIR      {cfg.model_dir}",
        f"  STATE_DIR      {cfg.state_dir}", "  KV_BYTES       2500000000", "  MAX_LEN        262144",
        "  MAX_SEQS       2", "  NSPEC          7", "  GPU_UTIL       0.88", "  PORT           8000",
        f"  MEMGUARD_GIB   {cfg.memguard_gib}"]
    fake = config(tmp_path, engine=FAKE_SETTINGS, FAKE_QUEUE_LIMIT="9")
    recipe = FakeRecipe(fake)
    recipe.plan_settings = ("FAKE_QUEUE_LIMIT",)
    assert "  FAKE_QUEUE_LIMIT 9" in plan.settings_lines(fake, recipe)


def test_a_tripped_guard_names_the_recipes_memory_settings(tmp_path):
    """The advice when the memory guard tripped names what the recipe in use sizes its memory by."""
    cl = fake_cluster(tmp_path)
    tripped = {n.name: parse({"units": {}, "tripped": {"line": "tripped at 1.0 GiB", "time": 1.0}, "time": 2.0})
               for n in cl.nodes}
    with pytest.raises(UserError) as e:
        launch.refuse_if_tripped(cl, tripped)
    assert "lower FAKE_QUEUE_LIMIT first" in str(e.value) and "KV_BYTES" not in str(e.value)
