"""The launch decision as a pure function: tables of node facts and desired state in, steps out. Also
the desired state itself, `doit render` without any node, and the Cluster's privilege rule."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from dsv41.errors import UserError
from dsv41.head.core import fabric, image
from dsv41.head.core.cluster import Cluster
from dsv41.settings.layers import load_config
from dsv41.head.core.decide import Kind, decide, sha, stale_workers
from dsv41.head.core.desired import desired, guard_settings
from dsv41.head.core.state import NodeState, parse
from dsv41.head.logs import _log_args

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OVERRIDES = {"WORKER": "bob@10.10.10.11", "HEAD_IP": "10.10.10.13", "HEAD_IFNAME": "enp1s0f1np1",
             "HEAD_HCAS": "rocep1s0f1", "HEAD_GID_INDEX": "3", "WORKER_IP": "10.10.10.11",
             "WORKER_IFNAME": "enp1s0f1np1", "WORKER_HCAS": "rocep1s0f1", "WORKER_GID_INDEX": "3"}
PLAN = '{"qdir": "qn:q31:q31s", "k": 1}'
KEY = "k" * 43


def cluster(tmp_path, **env):
    env = {**OVERRIDES, "STATE_DIR": str(tmp_path / "state"), "MODEL_DIR": str(tmp_path / "model"),
           "API_KEY_FILE": str(tmp_path / "key"), **env}
    cl = Cluster(load_config(env))
    cl.env = env
    for n in cl.nodes:
        n.assume_home("/home/bob" if not n.is_local else os.path.expanduser("~"))
    return cl


def want(cl, key=KEY, plan=PLAN):
    return desired(cl, fabric.from_overrides(cl.cfg), key, plan)


def running(cl, w, since=None, image_id="sha256:abc", clock=None):
    """Probe facts of nodes where the desired state `w` is installed, active and current (what
    dsv41.node.probe reports; no nodes here)."""
    facts = {}
    for n in cl.nodes:
        ts = (since or {}).get(n.name, 1000) + (clock or {}).get(n.name, 0)
        facts[n.name] = {
            "uid": 0, "image_id": image_id, "time": 5000.0 + (clock or {}).get(n.name, 0), "tripped": None,
            "mem_available_kib": 1 << 20,
            "units": {name: {"installed": True, "text": text, "ActiveState": "active", "SubState": "running",
                             "ActiveEnterTimestamp": f"@{ts}", "NRestarts": "0"}
                      for name, text in w.units[n.name].items()},
            "containers": {f"dsv41-r{cl.spec(n).rank}": {"state": {"Status": "running"}, "image": image_id}},
            "files": {rel: sha(text) for rel, (text, _) in w.files[n.name].items()},
        }
    return facts


def states(facts):
    """The probe's reports as the Cluster parses them."""
    return {name: parse(report) for name, report in facts.items()}


def steps_of(steps):
    return [(s.kind, s.node) for s in steps]


def guard_stopped(f):
    f["worker1"]["units"]["dsv41-memguard.service"]["ActiveState"] = "inactive"


def rank_failed(f):
    f["worker1"]["units"]["dsv41-r1.service"]["ActiveState"] = "failed"


def new_image(f):
    for node in f.values():
        node["image_id"] = "sha256:new"


def worker_restarted_alone(f):
    f["worker1"]["units"]["dsv41-r1.service"].update(ActiveEnterTimestamp="@1100", NRestarts="1")


def worker_clock_ahead(f):
    # the worker started 0.5 s before the head, but its clock runs 30 s ahead
    f["worker1"]["time"] += 30
    f["worker1"]["units"]["dsv41-r1.service"]["ActiveEnterTimestamp"] = "@1029.5"


def old_guard_unit(f):
    f["head"]["units"]["dsv41-memguard.service"]["text"] += "# an older version\n"


def model_replaced(f):
    f["worker1"].update(model_dir="/home/bob/models/M", model_changed_at=1200.0)


def model_older(f):
    f["worker1"].update(model_dir="/home/bob/models/M", model_changed_at=900.0)


def nothing_installed(f):
    for node in f.values():
        node["units"] = {name: {"installed": False, "text": None} for name in node["units"]}
        node["files"] = {}
        node["containers"] = {}


R, W = Kind.RESTART_RANKS, Kind.WRITE
TABLE = [
    # (what happened, env for the new config, change to the facts, key, plan, expected steps, reason words)
    ("nothing changed", {}, None, KEY, PLAN, [], ""),
    # a changed setting also reaches the watchdog's settings (watchdog.json): it restarts, last
    ("a rank setting changed", {"KV_BYTES": "2600000000"}, None, KEY, PLAN,
     [(W, "head"), (Kind.INSTALL, "head"), (Kind.INSTALL, "worker1"), (R, "all"), (Kind.RESTART_WATCHDOG, "head")],
     None),
    ("the guard unit changed: the guard restarts, the ranks keep running", {}, old_guard_unit, KEY, PLAN,
     [(Kind.INSTALL, "head"), (Kind.RESTART_GUARD, "head")], "memory guard unit changed"),
    ("the guard floor changed", {"MEMGUARD_GIB": "2"}, None, KEY, PLAN,
     [(W, "head"), (W, "head"), (W, "worker1"), (Kind.RELOAD_GUARD, "head"), (Kind.RELOAD_GUARD, "worker1"),
      (Kind.RESTART_WATCHDOG, "head")], ""),
    ("a new image", {}, new_image, KEY, PLAN, [(R, "all")], "runs an older image"),
    ("a stopped guard and a failed rank", {}, lambda f: (guard_stopped(f), rank_failed(f)), KEY, PLAN,
     [(Kind.START_GUARD, "worker1"), (R, "all")], "dsv41-r1.service on worker1 is failed"),
    ("a worker restarted on its own", {}, worker_restarted_alone, KEY, PLAN, [(R, "all")],
     "dsv41-r1.service on worker1 (bob@10.10.10.11) restarted after the head's rank (NRestarts=1)"),
    ("clock skew is not a restart", {}, worker_clock_ahead, KEY, PLAN, [], ""),
    ("model files replaced under a running rank", {}, model_replaced, KEY, PLAN, [(R, "all")],
     "model files in /home/bob/models/M on worker1 changed after dsv41-r1.service started"),
    ("model files older than the rank", {}, model_older, KEY, PLAN, [], ""),
    ("the EXL3 plan changed", {}, None, KEY, '{"qdir": "qn:q31", "k": 2}',
     [(W, "head"), (W, "worker1"), (R, "all")],
     "plans/J268-ho-v31-K5n.json changed on head; plans/J268-ho-v31-K5n.json changed on worker1"),
    # the gateway reads rank 0's key at its start: it restarts with the ranks
    ("the key is not known yet (dry run)", {}, None, None, PLAN,
     [(W, "head"), (R, "all"), (Kind.RESTART_GATEWAY, "head")], "rank 0's key changed"),
    ("nothing installed", {}, nothing_installed, KEY, PLAN,
     [(W, "head"), (W, "head"), (W, "head"), (W, "head"), (W, "head"), (W, "worker1"), (W, "worker1"),
      (Kind.INSTALL, "head"), (Kind.INSTALL, "head"), (Kind.INSTALL, "head"), (Kind.INSTALL, "head"),
      (Kind.INSTALL, "head"), (Kind.INSTALL, "worker1"), (Kind.INSTALL, "worker1"), (Kind.START_GUARD, "head"),
      (Kind.START_GUARD, "worker1"),
      (R, "all"), (Kind.START_WATCHDOG, "head"), (Kind.START_GATEWAY, "head")], "the gateway is not running"),
    ("a gateway setting changed: it reloads, the ranks keep running", {"KEY_RATE_PER_MIN": "10"}, None, KEY, PLAN,
     [(W, "head"), (W, "head"), (Kind.RESTART_WATCHDOG, "head"), (Kind.RELOAD_GATEWAY, "head")],
     "its config changed (the ranks are left alone)"),
    ("GATEWAY=0 stops it and rank 0 takes PORT again", {"GATEWAY": "0"}, None, KEY, PLAN,
     [(W, "head"), (Kind.INSTALL, "head"), (R, "all"), (Kind.RESTART_WATCHDOG, "head"), (Kind.STOP_GATEWAY, "head"),
      (Kind.STOP_GATEWAY, "head")], "GATEWAY=0: rank 0 serves PORT itself"),
    ("the watchdog's settings changed: it restarts, nothing else", {"WATCHDOG_INTERVAL_S": "5"}, None, KEY, PLAN,
     [(W, "head"), (Kind.RESTART_WATCHDOG, "head")], "its unit or settings changed"),
    ("WATCHDOG=0 stops and disables it", {"WATCHDOG": "0"}, None, KEY, PLAN, [(Kind.STOP_WATCHDOG, "head")], "WATCHDOG=0"),
]


def gateway_unit(f, name, **props):
    f["head"]["units"][name].update(props)


def before_the_socket(f):
    """An earlier version's gateway: HAProxy binds PORT itself, no socket unit installed."""
    f["head"]["units"]["dsv41-gateway.socket"] = {"installed": False, "text": None, "ActiveState": "inactive"}
    gateway_unit(f, "dsv41-gateway.service", text="[Unit]\nDescription=an earlier version's gateway\n")


SOCKET, SERVICE = "dsv41-gateway.socket", "dsv41-gateway.service"
TAKEN_ANEW = "the socket holding PORT changed or holds nothing: PORT taken anew, the gateway restarted with it"
# the gateway's socket: (what happened, env, change, expected (kind, target) of the gateway's steps, reason of the first)
SOCKET_TABLE = [
    ("PORT changed: the socket takes it anew, the gateway restarted with it", {"PORT": "8001"}, None,
     [(Kind.RESTART_GATEWAY, SOCKET)], TAKEN_ANEW),
    ("an earlier version's gateway: the socket takes PORT from it, the gateway restarted with it", {},
     before_the_socket, [(Kind.RESTART_GATEWAY, SOCKET)], TAKEN_ANEW),
    ("the socket holds nothing while the gateway runs", {},
     lambda f: gateway_unit(f, SOCKET, ActiveState="failed"), [(Kind.RESTART_GATEWAY, SOCKET)], TAKEN_ANEW),
    ("the gateway stopped, its socket holding PORT: only the gateway starts", {},
     lambda f: gateway_unit(f, SERVICE, ActiveState="inactive"), [(Kind.START_GATEWAY, SERVICE)],
     "the gateway is not running"),
    ("the gateway stopped and PORT changed: the socket taken anew, then the gateway started", {"PORT": "8001"},
     lambda f: gateway_unit(f, SERVICE, ActiveState="inactive"),
     [(Kind.RESTART_GATEWAY, SOCKET), (Kind.START_GATEWAY, SERVICE)], TAKEN_ANEW),
    ("both stopped (`doit stop --free-port`): the gateway starts, its socket with it", {},
     lambda f: (gateway_unit(f, SERVICE, ActiveState="inactive"), gateway_unit(f, SOCKET, ActiveState="inactive")),
     [(Kind.START_GATEWAY, SERVICE)], "the gateway is not running"),
    ("its config changed: a reload, the socket left alone", {"GATEWAY_TIMEOUT_S": "123"}, None,
     [(Kind.RELOAD_GATEWAY, SERVICE)], "its config changed (the ranks are left alone)"),
    ("rank 0's key changed: the gateway restarts, the socket holds PORT meanwhile", {}, None,
     [(Kind.RESTART_GATEWAY, SERVICE)], "its unit or rank 0's key changed"),
    ("GATEWAY=0: the socket stops first (nothing starts the gateway again), then the gateway", {"GATEWAY": "0"}, None,
     [(Kind.STOP_GATEWAY, SOCKET), (Kind.STOP_GATEWAY, SERVICE)],
     "GATEWAY=0: rank 0 serves PORT itself (dsv41-gateway.socket lets it go first)"),
    ("GATEWAY=0 after an earlier version's gateway: only the gateway stops", {"GATEWAY": "0"}, before_the_socket,
     [(Kind.STOP_GATEWAY, SERVICE)], "GATEWAY=0: rank 0 serves PORT itself"),
]


@pytest.mark.parametrize("what,env,change,expected,why", SOCKET_TABLE, ids=[t[0] for t in SOCKET_TABLE])
def test_the_gateways_socket(tmp_path, what, env, change, expected, why):
    cl = cluster(tmp_path)
    facts = running(cl, want(cl))
    (change or (lambda f: None))(facts)
    new = cluster(tmp_path, **env)
    key = "n" * 43 if what.startswith("rank 0's key") else KEY
    gw = [s for s in decide(new.cfg.nodes, want(new, key), states(facts), new.recipe)
          if s.kind.value.endswith("-gateway")]
    assert [(s.kind, s.target) for s in gw] == expected
    assert gw[0].reason == why


def test_a_release_recorded_before_the_socket_stops_it_and_restarts_the_gateway_binding_port_itself(tmp_path):
    """A rollback to a release of an earlier version (its gateway binds PORT, no socket unit): the socket stops
    and is disabled first, then the gateway restarts on the recorded unit (its Requires= of the socket gone)."""
    cl = cluster(tmp_path)
    w = want(cl)
    facts = running(cl, w)
    old = dict(w.units["head"])
    del old[SOCKET]
    old[SERVICE] = "[Unit]\nDescription=an earlier version's gateway\n"
    recorded = w._replace(units={**w.units, "head": old})
    gw = [(s.kind, s.target, s.reason) for s in decide(cl.cfg.nodes, recorded, states(facts), cl.recipe)
          if s.kind.value.endswith("-gateway")]
    assert gw == [(Kind.STOP_GATEWAY, SOCKET, "the release runs a gateway that binds PORT itself"),
                  (Kind.RESTART_GATEWAY, SERVICE, "its unit or rank 0's key changed")]
    gateway_unit(facts, SOCKET, ActiveState="inactive", UnitFileState="disabled")     # stopped: nothing more to do
    gateway_unit(facts, SERVICE, text=old[SERVICE])
    assert [s for s in decide(cl.cfg.nodes, recorded, states(facts), cl.recipe) if s.kind.value.endswith("-gateway")] == []


@pytest.mark.parametrize("what,env,change,key,plan,expected,why", TABLE, ids=[t[0] for t in TABLE])
def test_decide(tmp_path, what, env, change, key, plan, expected, why):
    cl = cluster(tmp_path)
    facts = running(cl, want(cl))
    if change:
        change(facts)
    new = cluster(tmp_path, **env)
    steps = decide(new.cfg.nodes, want(new, key, plan), states(facts), new.recipe)
    assert steps_of(steps) == expected
    if why:
        assert why in steps[-1].reason
    if what == "a rank setting changed":
        assert steps[-2].reason == "dsv41-r0.service changed; dsv41-r1.service changed"
    assert all(s.reason for s in steps)        # every step says why


def test_stale_workers_name_each_worker(tmp_path):
    cl = cluster(tmp_path, WORKER="", WORKERS="bob@10.10.10.11,bob@10.10.10.12", R2_IP="10.10.10.12",
                 R2_IFNAME="enp1s0f1np1", R2_HCAS="rocep1s0f1", R2_GID_INDEX="3")
    facts = running(cl, want(cl))
    worker_restarted_alone(facts)
    [line] = stale_workers(cl.cfg.nodes, states(facts), cl.recipe)
    assert line.startswith("dsv41-r1.service on worker1 (bob@10.10.10.11) restarted after the head's rank")


def test_plan_lines_name_kind_node_and_reason(tmp_path):
    cl = cluster(tmp_path)
    facts = running(cl, want(cl))
    new = cluster(tmp_path, KV_BYTES="2500000000")
    steps = decide(new.cfg.nodes, want(new), states(facts), new.recipe)
    assert steps[-2].line() == "restart-ranks on all: dsv41-r0.service changed; dsv41-r1.service changed"
    assert steps[1].line() == "install on head: dsv41-r0.service differs from the rendered unit"


def test_desired_state_files(tmp_path):
    cl = cluster(tmp_path, MEMGUARD_GIB="1.5", MEMGUARD_MODE="observe")
    w = want(cl)
    assert json.loads(guard_settings(cl.cfg)) == {"floor_gib": 1.5, "mode": "observe"}
    head, worker = w.files["head"], w.files["worker1"]
    assert head["secrets/api_key"] == (f"{KEY}\n", 0o600) and "secrets/api_key" not in worker
    plan = json.loads(head["plans/J268-ho-v31-K5n.json"][0])
    assert plan["qdir"] == "/model/exl3/qn:/model/exl3/q31:/model/exl3/q31s" and plan["k"] == 1
    assert f"source={tmp_path}/model,target=/model,readonly" in w.units["worker1"]["dsv41-r1.service"]


def test_doit_render_contacts_no_node_when_all_values_are_overrides(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ssh").write_text("#!/bin/sh\necho ssh must not run >&2\nexit 99\n")
    (bindir / "ssh").chmod(0o755)
    env = {**os.environ, **OVERRIDES, "STATE_DIR": str(tmp_path / "state"),
           "PATH": f"{bindir}:{os.environ['PATH']}"}
    r = subprocess.run([sys.executable, "-m", "doit", "-f", os.path.join(ROOT, "dodo.py"), "render"],
                       env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "no node contacted" in r.stdout
    r1 = (tmp_path / "state/units/r1/dsv41-r1.service").read_text()
    assert "--headless" in r1 and "/home/bob/models/DeepSeek-V4.1-Flash-Spark" in r1
    assert (tmp_path / "state/units/r0/dsv41-memguard.service").exists()
    assert "--master-addr 10.10.10.13" in (tmp_path / "state/units/r0/dsv41-r0.service").read_text()
    assert "ListenStream=0.0.0.0:8000" in (tmp_path / "state/units/r0/dsv41-gateway.socket").read_text()
    if shutil.which("haproxy"):                     # the gateway's config, checked offline as its copy (fd@3 aside)
        check = subprocess.run(["haproxy", "-c", "-f", str(tmp_path / "state/units/r0/haproxy.check.cfg")],
                               env={**env, "DSV41_ENGINE_KEY": "x"}, capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
    r = subprocess.run([sys.executable, "-m", "doit", "-f", os.path.join(ROOT, "dodo.py"), "render"],
                       env={**env, "GATEWAY": "0"}, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert not [p.name for p in (tmp_path / "state/units/r0").iterdir() if p.name.startswith(("haproxy", "dsv41-gateway"))]


def test_log_arguments_after_the_unit_name_are_options():
    assert _log_args(["r1", "-n", "20", "-f"], False, 100, "") == (["r1"], True, 20, "")
    with pytest.raises(UserError, match="not a number"):
        _log_args(["r1", "-n", "x"], False, 100, "")


def test_nodes_holding_different_images_stop_the_launch(tmp_path, monkeypatch):
    docker_stand_in(tmp_path, monkeypatch, False)
    cl = cluster(tmp_path)
    facts = {"head": NodeState(image_id="sha256:" + "a" * 64), "worker1": NodeState(image_id="sha256:" + "b" * 64)}
    with pytest.raises(UserError, match="nodes hold different images") as e:
        image.ensure(cl, facts)
    assert "head sha256:aaaaaaaaaaaa" in str(e.value) and "docker rmi" in str(e.value)
    assert not (tmp_path / "state" / "image.stamp").exists()
    facts["worker1"] = facts["head"]
    assert image.ensure(cl, facts) == {"head": "sha256:" + "a" * 64, "worker1": "sha256:" + "a" * 64}
    stamp = json.loads((tmp_path / "state" / "image.stamp").read_text())
    assert stamp["image"] == cl.cfg.image and set(stamp["ids"]) == {"head", "worker1"}


def docker_stand_in(tmp_path, monkeypatch, lists_flag):
    """STAND-IN for docker holding the serving image (which cannot exist here): `run` answers vLLM's
    `serve --help=shutdown-timeout` as a vLLM that has the flag does, or as an older one; each call is logged."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    answer = ("Arguments matching 'shutdown-timeout':\n  --shutdown-timeout SHUTDOWN_TIMEOUT" if lists_flag
              else "No group or arguments matching 'shutdown-timeout'.")
    (bindir / "docker").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/docker.log\n'
                                   f'case "$*" in *--help=shutdown-timeout*) echo "{answer}";; *) exit 1;; esac\n')
    (bindir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    return tmp_path / "docker.log"


@pytest.mark.parametrize("lists_flag", [True, False])
def test_rank_0_drains_itself_only_when_the_images_server_takes_shutdown_timeout(tmp_path, monkeypatch, lists_flag):
    log = docker_stand_in(tmp_path, monkeypatch, lists_flag)
    cl = cluster(tmp_path, DRAIN_S="90")
    same = NodeState(image_id="sha256:" + "a" * 64)
    image.ensure(cl, {"head": same, "worker1": same})
    asked = log.read_text().splitlines()
    assert len(asked) == 1 and "--network none" in asked[0] and asked[0].endswith("serve --help=shutdown-timeout")
    image.ensure(cl, {"head": same, "worker1": same})             # the same image is not asked again
    assert len(log.read_text().splitlines()) == 1
    units = want(cl).units
    r0, r1 = units["head"]["dsv41-r0.service"], units["worker1"]["dsv41-r1.service"]
    assert ("--shutdown-timeout 90" in r0) == lists_flag and "--shutdown-timeout" not in r1
    # its stop waits for the drain: docker stop's grace and the unit's stop timeout grow by DRAIN_S
    assert ("-t 120 dsv41-r0" in r0 and "TimeoutStopSec=150" in r0) == lists_flag
    assert "-t 30 dsv41-r1" in r1 and "TimeoutStopSec=60" in r1
    other = NodeState(image_id="sha256:" + "b" * 64)
    image.ensure(cl, {"head": other, "worker1": other})           # a new build of the image: asked again
    assert len(log.read_text().splitlines()) == 2
    newer = cluster(tmp_path, IMG="registry.example/serving@sha256:" + "c" * 64)
    image.ensure(newer, {"head": same, "worker1": same})          # another image is asked once, and a
    image.ensure(cl, {"head": other, "worker1": other})           # way back to the first asks nothing
    assert len(log.read_text().splitlines()) == 3 and ("--shutdown-timeout 90" in want(cl).units["head"][
        "dsv41-r0.service"]) == lists_flag


def test_privileged_commands_use_sudo_only_for_a_non_root_user(tmp_path):
    cl = cluster(tmp_path)
    cl._uid = {"head": 0, "worker1": 1000}
    assert cl.priv(cl.head, ["systemctl", "start", "x"]) == ["systemctl", "start", "x"]
    assert cl.priv(cl.workers[0], ["systemctl", "start", "x"]) == ["sudo", "-n", "systemctl", "start", "x"]


def test_privileged_commands_never_assume_root(tmp_path):
    cl = cluster(tmp_path)
    asked = []
    cl.workers[0].run = lambda argv, **kw: (asked.append(argv), type("R", (), {"stdout": "1000\n"}))[1]
    assert cl.priv(cl.workers[0], ["systemctl", "stop", "x"]) == ["sudo", "-n", "systemctl", "stop", "x"]
    assert asked == [["id", "-u"]]


def test_words_doit_would_misread_are_refused_in_one_line_before_anything_runs(tmp_path):
    """doit takes NAME=VALUE words as its own variables (`doit rollback 2=` ran the default rollback), an empty
    word was a traceback (`doit keys add ""`) and a prefix of an option was taken as the option (`doit stop
    --free` for --free-port): dsv41's loader refuses them, exit 2, before the task runs."""
    env = {**os.environ, "WORKER": "root@198.51.100.13", "STATE_DIR": str(tmp_path / "state")}
    for args, said in ((["keys", "add", ""], "an empty word"), (["rollback", "2="], "'2=': doit takes NAME=VALUE"),
                       (["releases", "show", "x=1"], "'x=1'"), (["stop", "free-port=1"], "'free-port=1'")):
        r = subprocess.run([sys.executable, "-m", "doit", *args], env=env, capture_output=True, text=True, cwd=ROOT)
        assert (r.returncode, r.stdout) == (2, "") and r.stderr.startswith(f"dsv41: {said}"), (args, r.stderr)
        assert len(r.stderr.splitlines()) == 1 and not (tmp_path / "state").exists()
    for args, said in ((["stop", "--free"], "stop: `--free` is not an option: say it whole (`--free-port`)"),
                       (["status", "--js"], "status: `--js` is not an option: say it whole (`--json`)")):
        r = subprocess.run([sys.executable, "-m", "doit", *args], env=env, capture_output=True, text=True, cwd=ROOT)
        assert (r.returncode, r.stdout) == (2, "") and r.stderr.startswith(f"dsv41: {said}"), (args, r.stderr)
