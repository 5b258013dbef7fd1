"""One health: recorded fact sets (every node's probe answer, the API's answers, the record) run through
`doit status --json`, `doit top --once --json` and the watchdog's look, and each gives the same verdict.
The nodes' answers are probe states recorded here (no node can be made to fail on cue in a unit test);
the API is a real HTTP server on 127.0.0.1 answering /health, /v1/models, /metrics and a streamed token
as recorded; the record is real files. The lab tests do the same on real nodes."""
import dataclasses
import io
import json
import threading
from contextlib import redirect_stdout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dsv41.head import status, top, watchdog
from dsv41.settings.layers import load_config
from dsv41.errors import UserError
from dsv41.head.core import observe, record, runlock, top_watch, watchdog_metrics
from dsv41.head.core.cluster import Cluster
from dsv41.head.core.health import EXIT_CODES, WORDS, Verdict
from dsv41.head.core.state import parse, unreachable

METRICS = ('vllm:num_requests_running{engine="0"} 0\nvllm:num_requests_waiting{engine="0"} 0\n'
           'vllm:prompt_tokens_total{engine="0"} 100\nvllm:generation_tokens_total{engine="0"} 50\n'
           'vllm:kv_cache_usage_perc{engine="0"} 0.0\n')


class Api(ThreadingHTTPServer):
    daemon_threads = True
    health = 200
    serving = True
    # None; "probe": a chat request is never answered (a wedged engine); "stop at the probe": neither is
    # anything from that request on (a stopped process), which it marks by setting "all"
    hang = None
    posts = 0


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def send(self, code, body, ctype="application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        srv = self.server
        if srv.hang == "all":
            srv.released.wait(30)
            return
        if self.path == "/health":
            return self.send(srv.health, "")
        if self.path == "/metrics":
            return self.send(200, getattr(srv, "metrics", METRICS), "text/plain; version=0.0.4")
        if self.path == "/v1/models" and srv.serving:
            return self.send(200, json.dumps({"object": "list", "data": [{"id": "deepseek-v4.1-flash"}]}))
        self.send(503 if srv.health >= 500 else 404, '{"error": "not serving"}')

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.posts += 1
        if self.server.hang and getattr(self.server, "metrics_meanwhile", None):   # a long step ends meanwhile
            self.server.metrics = self.server.metrics_meanwhile
        if self.server.hang:
            if self.server.hang == "stop at the probe":
                self.server.hang = "all"
            self.server.released.wait(30)
            return
        if self.server.health >= 500 or not self.server.serving:
            return self.send(500, '{"error": {"message": "EngineDeadError"}}')
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b'data: {"choices": [{"index": 0, "text": "tok"}]}\n\ndata: [DONE]\n\n')


@pytest.fixture
def api():
    srv = Api(("127.0.0.1", 0), Handler)
    srv.released = threading.Event()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.released.set()
    srv.shutdown()
    srv.server_close()


NOW = 1_900_000_000.0


def unit(active="active", result="success", since=NOW - 600, left=""):
    return {"installed": True, "ActiveState": active, "SubState": "running" if active == "active" else "dead",
            "Result": result, "ActiveEnterTimestamp": f"@{since}", "InactiveEnterTimestamp": left, "NRestarts": "0"}


def node(rank, **kw):
    mem = kw.pop("mem_gib", 100)
    return {"uid": 0, "time": NOW, "units": {f"dsv41-r{rank}.service": unit(**kw)}, "tripped": None,
            "mem_available_kib": int(mem * 2**20), "mem_baseline_bytes": 100 << 30}


SERVING = {"head": node(0), "worker1": node(1)}
FACT_SETS = {           # name: (node facts, API /health or None (no server), record set-up, verdict)
    "serving": (SERVING, 200, "ready", Verdict.HEALTHY),
    "starting": (SERVING, "up, not serving", None, Verdict.STARTING),
    "a worker rank failed": ({"head": node(0), "worker1": node(1, active="failed", result="exit-code",
                                                                   left=f"@{NOW - 30}")}, 200, None, Verdict.DEGRADED),
    "nothing installed": ({"head": {"uid": 0, "time": NOW, "units": {}}, "worker1": {"uid": 0, "time": NOW, "units": {}}},
                          None, None, Verdict.STOPPED),
    "guard tripped": ({"head": node(0), "worker1": {**node(1, active="inactive"),
                                                    "tripped": {"line": "tripped at 1.0 GiB", "time": NOW}}},
                      None, None, Verdict.TRIPPED),
    "worker unreachable": ({"head": node(0), "worker1": "ssh: connect to host w port 22: No route to host"},
                           200, None, Verdict.UNKNOWN),
    "API 503": (SERVING, 503, "ready", Verdict.SUSPECT),
    "memory not back": ({"head": node(0, active="inactive"), "worker1": node(1, active="inactive", mem_gib=70)},
                        None, "needs reboot", Verdict.NEEDS_REBOOT),
    "recovery under way": ({"head": node(0, active="inactive"), "worker1": node(1, active="inactive")},
                           None, "recovering", Verdict.RECOVERING),
}


def states(facts):
    return {n: unreachable(f) if isinstance(f, str) else parse(f, n) for n, f in facts.items()}


@pytest.fixture
def cluster(tmp_path, api, monkeypatch):
    """A Config whose API is the recorded server, and Cluster.probe answering from the fact set in use."""
    port = api.server_address[1]
    (tmp_path / "key").write_text("sk-test-0123456789abcdef\n")
    (tmp_path / "engine_key").write_text("sk-test-0123456789abcdef\n")     # rank 0's key, behind the gateway
    cfg = load_config({"WORKER": "u@w", "STATE_DIR": str(tmp_path), "HEAD_IP": "127.0.0.1", "ENGINE_PORT": str(port),
                       "API_KEY_FILE": str(tmp_path / "key"), "WATCHDOG_PROBE_S": "5", "SSH_TIMEOUT_S": "2"})
    current = {}

    def probe(self, n, versions=False, caches=False):
        f = current["states"][n.name]
        if f.error:
            raise record_error(f.error)
        self.states[n.name] = f
        return f
    monkeypatch.setattr(Cluster, "probe", probe)
    monkeypatch.setattr(Cluster, "connect", lambda self: [])
    monkeypatch.setattr(Cluster, "refresh", lambda self: None, raising=False)
    monkeypatch.setattr(top_watch.Observer, "start_node", lambda self, w: seen(w, current["states"][w.node.name]))
    return cfg, current


def record_error(line):
    from dsv41.head.core.nodes import NodeError
    return NodeError(line)


def seen(w, f):
    import time
    w.seen, w.at, w.error = (None, None, f.error) if f.error else (f, time.time(), None)


def set_up(cfg, how):
    if how == "ready":                  # a readiness wait saw this start of rank 0 generate, as launch's does
        record.mark_ready(cfg.state_dir, NOW - 500)
    if how == "needs reboot":
        record.set_needs_reboot(cfg.state_dir, "worker1: MemAvailable 70.0 GiB is 30.0 GiB below its baseline")
    if how == "recovering":
        record.open_incident(cfg.state_dir, verdict="DEAD", evidence="/health does not answer", fault_at=NOW - 20,
                             node="head")
        runlock.take(cfg.state_dir, "dsv41-watchdog recovery")       # this process runs the recovery


def status_json(cfg):
    out = io.StringIO()
    code = 0
    with redirect_stdout(out):
        try:
            status.status(cfg, json=True)
        except SystemExit as e:
            code = e.code
    doc = json.loads(out.getvalue())
    assert doc["exit_code"] == code and doc["schema"] == "dsv41.status/6"
    return doc


def top_json(cfg):
    out = io.StringIO()
    with redirect_stdout(out):
        top.top(cfg, json=True, once=True, interval=0)
    doc = json.loads(out.getvalue())
    assert doc["schema"] == "dsv41.top/4"
    return doc


@pytest.mark.parametrize("name", list(FACT_SETS))
def test_status_top_and_the_watchdog_give_one_verdict_for_each_fact_set(name, cluster, api, monkeypatch):
    cfg, current = cluster
    # No fact set here hangs: a /health starved past 5 s (this suite runs beside the lab's engine on two
    # cores) is a missed look, SUSPECT by design, and not what this test is about
    from dsv41.client import api as client_api
    monkeypatch.setattr(client_api, "HEALTH_TIMEOUT", 60)
    monkeypatch.setattr(top_watch, "SCRAPE_TIMEOUT_S", 60.0)
    cfg = dataclasses.replace(cfg, watchdog_probe_s=60)
    facts, health, how, want = FACT_SETS[name]
    current["states"] = states(facts)
    if health is None:
        api.shutdown()
        api.server_close()
    else:
        api.health, api.serving = (200, False) if health == "up, not serving" else (health, True)
    set_up(cfg, how)
    try:
        st = status_json(cfg)
        tp = top_json(cfg)
        w = watchdog.Watchdog(cfg, log=lambda m: None)
        w.cl.observe = lambda: current["states"]
        _, h = w.look()
    finally:
        runlock.release()
    assert (st["health"]["verdict"], tp["health"]["verdict"], h.verdict) == (want,) * 3, \
        (name, st["health"]["conditions"], tp["health"].get("conditions"), h.conditions)
    word, code = WORDS[want]
    assert st["state"] == word and st["exit_code"] == code and tp["health"]["word"] == word
    if want == Verdict.RECOVERING:      # the step it is on, for a person who would otherwise interfere
        assert "saving the evidence" in st["health"]["conditions"][0] and st["exit_code"] == 8
    if want == Verdict.NEEDS_REBOOT:
        assert st["health"]["node"] == "worker1" and "30.0 GiB below" in st["health"]["conditions"][0]


def test_status_words_and_exit_codes_are_one_table():
    assert EXIT_CODES == {"READY": 0, "DEGRADED": 1, "NOT RUNNING": 3, "UNREACHABLE": 4, "TRIPPED": 5, "DOWN": 6,
                          "NEEDS_REBOOT": 7, "RECOVERING": 8}
    assert set(WORDS) == set(Verdict)


@pytest.mark.parametrize("hang, want", [("probe", [Verdict.WEDGED]),
                                        ("stop at the probe", [Verdict.SUSPECT, Verdict.DEAD])])
def test_a_probe_without_a_token_is_wedged_only_while_health_still_answers(hang, want, cluster, api):
    """The engine wedged (the probe gets no token, /health still answers) is WEDGED; the API server stopped
    just after it answered /health (the probe gets no token and /health then does not answer either) is
    the API down: SUSPECT, then DEAD at the next look, as when /health never answered."""
    cfg, current = cluster
    cfg = dataclasses.replace(cfg, watchdog_probe_s=1)
    current["states"] = states(SERVING)
    set_up(cfg, "ready")
    api.hang = hang
    w = watchdog.Watchdog(cfg, log=lambda m: None)
    w.cl.observe = lambda: current["states"]
    seen = [w.look()[1] for _ in want]
    assert [h.verdict for h in seen] == want, [h.evidence for h in seen]
    assert ("does not answer" in seen[-1].evidence) == (want[-1] == Verdict.DEAD)


def test_a_sign_of_a_fault_keeps_the_symptom_alerts_waiting_until_the_watchdog_rules(cluster, api):
    """dsv41_watchdog_judging (Health.judging): work running and no progress since the look before, no probe
    sent yet, is a sign the watchdog has not ruled on; a token generated, or its probe's token (a long step),
    ends it and the symptoms may page; a wedged engine it will recover keeps them waiting; an idle one never."""
    cfg, current = cluster
    current["states"] = states(SERVING)
    set_up(cfg, "ready")
    w = watchdog.Watchdog(dataclasses.replace(cfg, watchdog_probe_s=1, watchdog_stall_s=3600), log=lambda m: None)
    w.cl.observe = lambda: current["states"]
    assert not w.look()[1].judging                                    # idle
    api.metrics = METRICS.replace('running{engine="0"} 0', 'running{engine="0"} 1')
    flat = w.look()[1]                                               # no signal moved since the idle look
    assert (flat.verdict, flat.judging) == (Verdict.BUSY, True), flat.evidence
    api.metrics = api.metrics.replace("generation_tokens_total{engine=\"0\"} 50", "generation_tokens_total{engine=\"0\"} 51")
    moved = w.look()[1]
    assert (moved.verdict, moved.judging) == (Verdict.BUSY, False), moved.evidence
    w = watchdog.Watchdog(dataclasses.replace(cfg, watchdog_probe_s=1, watchdog_stall_s=0), log=lambda m: None)
    w.cl.observe = lambda: current["states"]
    w.look()
    long_step = w.look()[1]                                          # flat, and the probe got a token
    assert (long_step.verdict, long_step.judging) == (Verdict.BUSY, False), long_step.evidence
    api.hang = "probe"
    wedged = w.look()[1]
    assert (wedged.verdict, wedged.action, wedged.judging) == (Verdict.WEDGED, "restart", True)


TRIPPED_WORKER = {"head": node(0), "worker1": {**node(1), "tripped": {"line": "tripped at 1.0 GiB", "time": NOW}}}


@pytest.mark.parametrize("facts, token, want", [
    (SERVING, True, None),
    ({"head": node(0), "worker1": node(1, active="activating")}, True, "dsv41-r1.service on worker1 is activating"),
    ({"head": node(0), "worker1": node(1, since=NOW - 100)}, True, "restarted after the head's rank"),
    ({"head": node(0), "worker1": "ssh: connect to host w port 22: Connection timed out"}, True,
     "UNKNOWN: no fresh facts from worker1"),
    (TRIPPED_WORKER, True, "TRIPPED: the memory guard is tripped on worker1"),
    (SERVING, False, "WEDGED: the idle probe got no token"),
], ids=["serving", "activating", "stale", "unreachable", "tripped", "wedged"])
def test_the_hold_counts_a_rank_up_only_when_the_health_says_ready(facts, token, want, cluster, monkeypatch):
    """The rollout's hold asks the same Health as status: a rank still activating, a worker restarted after
    the head's rank, a node that does not answer, a tripped guard or no token at the end fails it."""
    from dsv41.head.core import ranks, rollout
    cfg, current = cluster
    current["states"] = states(facts)
    set_up(cfg, "ready")
    cl = Cluster(cfg)
    monkeypatch.setattr(type(cl.recipe), "ready", lambda self, client: token)
    monkeypatch.setattr(ranks, "show_rank_logs", lambda cl: None)
    if want is None:
        rollout.hold(cl, 0)
    else:
        with pytest.raises(UserError, match="the hold") as e:
            rollout.hold(cl, 0)
        assert want in str(e.value)


def test_every_caller_builds_its_observation_in_core_observe(cluster, monkeypatch):
    """status, top, launch, the watchdog and the hold each build their observation through
    core.observe.observation, and no other module makes one."""
    import ast
    from pathlib import Path
    from dsv41.head import launch
    from dsv41.head.core import ranks, rollout
    lib = Path(__file__).resolve().parents[1] / "lib" / "dsv41"
    makers = {str(p.relative_to(lib)) for p in lib.rglob("*.py")
              for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Call)
              and getattr(n.func, "id", getattr(n.func, "attr", None)) == "Observation"}
    assert makers == {"head/core/observe.py"}
    cfg, current = cluster
    current["states"] = states(SERVING)
    set_up(cfg, "ready")
    built = []
    real = observe.observation
    monkeypatch.setattr(observe, "observation", lambda *a, **kw: built.append(1) or real(*a, **kw))
    monkeypatch.setattr(ranks, "show_rank_logs", lambda cl: None)
    cl = Cluster(cfg)
    monkeypatch.setattr(type(cl.recipe), "ready", lambda self, client: True)
    callers = {"status": lambda: status_json(cfg), "top": lambda: top_json(cfg),
               "watchdog": lambda: watchdog.Watchdog(cfg, log=lambda m: None).look(),
               "launch": lambda: launch.health_now(cl, current["states"], probe=True),
               "hold": lambda: rollout.hold(cl, 0)}
    for name, call in callers.items():
        before = len(built)
        call()
        assert len(built) > before, f"{name} built its observation elsewhere"


def with_stopped(facts, node_name, rank, stopped):
    """facts with the node's rank container running and these (pid, name) of its processes stopped."""
    from dsv41 import names
    c = {names.rank_name(rank): {"state": {"Status": "running", "Pid": 100}, "image": "sha256:x",
                                 "stopped": [list(p) for p in stopped]}}
    return {**facts, node_name: {**facts[node_name], "containers": c}}


def test_a_rank_process_stopped_at_two_looks_while_work_stands_still_is_wedged_on_its_node_without_a_probe(
        cluster, api):
    """A worker's process stopped (SIGSTOP): the head's /metrics cannot say which rank holds the step up, the
    worker's probe can. Work running, nothing moved since the look before and the same process stopped at
    both looks: WEDGED naming worker1 at the second look, long before WATCHDOG_STALL_S, with no probe sent.
    Seen at one look only, or while the engine still moves, it is not acted on."""
    cfg, current = cluster
    cfg = dataclasses.replace(cfg, watchdog_probe_s=1, watchdog_stall_s=3600)
    set_up(cfg, "ready")
    api.metrics = METRICS.replace('running{engine="0"} 0', 'running{engine="0"} 1')
    current["states"] = states(with_stopped(SERVING, "worker1", 1, [(4242, "VLLM::Worker_TP1")]))
    w = watchdog.Watchdog(cfg, log=lambda m: None)
    w.cl.observe = lambda: current["states"]
    first, second = w.look()[1], w.look()[1]
    assert first.verdict == Verdict.BUSY, first.evidence
    assert (second.verdict, second.node, second.action) == (Verdict.WEDGED, "worker1", "restart"), second.evidence
    assert "VLLM::Worker_TP1 (pid 4242) on worker1 is stopped" in second.evidence and api.posts == 0
    w = watchdog.Watchdog(cfg, log=lambda m: None)          # the engine moves: not acted on
    w.cl.observe = lambda: current["states"]
    w.look()
    api.metrics = api.metrics.replace('generation_tokens_total{engine="0"} 50', 'generation_tokens_total{engine="0"} 51')
    assert w.look()[1].verdict == Verdict.BUSY
    current["states"] = states(SERVING)                    # stopped at one look only (a debugger's pause)
    assert w.look()[1].verdict == Verdict.BUSY


def test_a_long_step_that_ends_while_the_stalls_probe_waits_in_the_queue_is_progress(cluster, api):
    """Work flat for WATCHDOG_STALL_S, then the probe waits in the engine's queue and gets no token in time,
    but the step that held everything up ends meanwhile and the token totals move: BUSY, not WEDGED (the
    look reads /metrics again after a stall's probe). The same probe with nothing moving is WEDGED."""
    import time
    cfg, current = cluster
    cfg = dataclasses.replace(cfg, watchdog_probe_s=1, watchdog_stall_s=1)
    set_up(cfg, "ready")
    current["states"] = states(SERVING)
    api.metrics = METRICS.replace('running{engine="0"} 0', 'running{engine="0"} 2')
    w = watchdog.Watchdog(cfg, log=lambda m: None)
    w.cl.observe = lambda: current["states"]
    assert w.look()[1].verdict == Verdict.BUSY
    time.sleep(1.2)
    api.hang = "probe"
    api.metrics_meanwhile = api.metrics.replace('generation_tokens_total{engine="0"} 50',
                                                'generation_tokens_total{engine="0"} 90')
    moved = w.look()[1]
    assert (moved.verdict, moved.action) == (Verdict.BUSY, None) and "generation_tokens_total" in moved.evidence, \
        moved.evidence
    time.sleep(1.2)
    api.metrics_meanwhile = None
    wedged = w.look()[1]
    assert wedged.verdict == Verdict.WEDGED and "the probe got no token" in wedged.evidence, wedged.evidence


def test_a_look_still_waiting_on_its_probe_publishes_the_sign_before_the_verdict(cluster, api, tmp_path):
    """An idle engine stopped: the probe waits out WATCHDOG_PROBE_S. Within a few seconds of the look's
    start, while it still waits, dsv41_watchdog_judging is 1 in METRICS_DIR (the symptom alerts wait), not
    left at the idle look's 0 until the verdict."""
    import time
    cfg, current = cluster
    cfg = dataclasses.replace(cfg, watchdog_probe_s=watchdog.LOOK_SLOW_S + 4, metrics_dir=str(tmp_path / "prom"))
    set_up(cfg, "ready")
    current["states"] = states(SERVING)
    w = watchdog.Watchdog(cfg, log=lambda m: None)
    w.cl.observe = lambda: current["states"]
    prom = tmp_path / "prom" / watchdog_metrics.METRICS_FILE

    def judging():
        return [line for line in prom.read_text().splitlines() if line.startswith("dsv41_watchdog_judging ")]
    w.publish(w.look()[1])                                  # idle and healthy: the probe got its token
    assert judging() == ["dsv41_watchdog_judging 0.0"]
    api.hang = "probe"
    looking = threading.Thread(target=lambda: w.publish(w.look()[1]))
    looking.start()
    time.sleep(watchdog.LOOK_SLOW_S + 1.5)
    assert looking.is_alive() and judging() == ["dsv41_watchdog_judging 1.0"]
    looking.join()
    assert w.published[0].verdict == Verdict.WEDGED and judging() == ["dsv41_watchdog_judging 1.0"]
