"""GROUPS: the nodes split into serving groups behind the one door. What each node's units and files hold
(its group's rendezvous, its group's rank 0 with the key and the API, a side door on a group's first node
off the head), the settings refused in one line, the decision restarting only the groups that must, the
group run locks, and one group's watchdog metrics and records kept apart."""
import json
import os
import subprocess
import sys

import pytest

from dsv41 import names
from dsv41.head.core import decide as dec, desired, runlock, units, watchdog_metrics
from dsv41.head.core.health import Health, Verdict
from dsv41.errors import UserError
from dsv41.settings.kinds import ConfigError
from dsv41.settings.layers import load_config
from dsv41.vllm.recipe import Vllm
from test_commands import spec_args, values_for
from test_units import FABRICS, FOUR, container, node_paths

GROUPS2 = {**FOUR, "GROUPS": "2"}


def render(env, root):
    cfg = load_config(dict(env, STATE_DIR=f"{root}/node0/state dir 5%"))
    return cfg, {s.rank: units.render_units(cfg, Vllm(cfg), s, FABRICS, node_paths(root, s.rank)) for s in cfg.nodes}


@pytest.mark.parametrize("env, says", [
    ({**FOUR, "GROUPS": "3"}, "GROUPS=3 with 4 node(s): the nodes must split into groups of equal size"),
    ({**GROUPS2, "GATEWAY": "0"}, "GROUPS=2 with GATEWAY=0: several groups are served only behind the door"),
    ({**GROUPS2, "NNODES": "4"}, "NNODES=4 with 2 node(s) a group: expected 2"),
    ({**GROUPS2, "TP_SIZE": "3"}, "TP_SIZE=3 with 2 node(s) a group: expected a multiple of 2"),
    ({**FOUR, "GROUPS": "0"}, "GROUPS"),
])
def test_groups_that_cannot_be_are_refused_in_one_line(tmp_path, env, says):
    with pytest.raises(ConfigError) as err:
        load_config(dict(env, STATE_DIR=str(tmp_path)))
    assert says in str(err.value) and "\n" not in str(err.value)


def test_each_group_is_its_own_engine_its_first_node_rank_0_with_the_key(tmp_path):
    cfg, by_rank = render(GROUPS2, tmp_path)
    assert [[s.name for s in cfg.group_specs(i)] for i in (0, 1)] == [["head", "worker1"], ["worker2", "worker3"]]
    first = {0: FABRICS[0], 1: FABRICS[0], 2: FABRICS[2], 3: FABRICS[2]}     # each group's rendezvous
    for rank in range(4):
        _, opts, env, _, _, args = container(by_rank[rank][f"dsv41-r{rank}.service"])
        assert args == spec_args(values_for(FABRICS[rank], head=first[rank]), rank % 2, tp=2, nnodes=2)
        lead = rank % 2 == 0
        mounts = [opts[i + 1] for i, o in enumerate(opts) if o == "--mount"]
        assert any(names.CONTAINER_SECRET in m for m in mounts) == lead, rank      # only a group's rank 0 has a key
        assert args[args.index("--node-rank") + 1] == str(rank % 2)
        assert ("--host" in args) == lead and ("--headless" in args) == (not lead)
        if lead:        # its API server on its own node's loopback, never on the fabric
            assert args[args.index("--host") + 1] == "127.0.0.1" and args[args.index("--port") + 1] == "18000"
        assert env[names.RANK_ENV] == str(rank)          # the unit's name and the profile's {rank}: the node's
    assert names.SIDE_DOOR_UNIT in by_rank[2]
    assert all(names.SIDE_DOOR_UNIT not in by_rank[r] for r in (0, 1, 3))
    assert names.GATEWAY_UNIT in by_rank[0] and all(names.GATEWAY_UNIT not in by_rank[r] for r in (1, 2, 3))


def test_one_group_renders_exactly_what_it_did(tmp_path):
    one_group, _ = render(FOUR, tmp_path / "a")
    also, _ = render({**FOUR, "GROUPS": "1"}, tmp_path / "a")
    assert one_group == also and one_group.layout.groups[0].server == "r0"
    assert units.gateway_config(one_group) == units.gateway_config(also)


def test_the_door_routes_to_the_head_and_to_the_side_door_and_each_side_door_binds_its_fabric_address(tmp_path):
    cfg = load_config(dict(GROUPS2, STATE_DIR=str(tmp_path / "state"), R2_IP="198.51.100.12"))
    g = cfg.layout.groups
    assert [(x.server, x.host, x.port, x.nodes) for x in g] == [
        ("g0", "127.0.0.1", 18000, ("head", "worker1")), ("g1", "198.51.100.12", 18000, ("worker2", "worker3"))]
    text = units.gateway_config(cfg)
    assert "server g0 127.0.0.1:18000" in text and "server g1 198.51.100.12:18000" in text
    side = units.side_door_node_config(cfg, cfg.nodes[2])
    assert "bind 198.51.100.12:18000" in side and "127.0.0.1:18000" in side
    assert cfg.group_config(1).layout.engine_url == "http://198.51.100.12:18000/v1"
    assert cfg.group_config(0).layout.engine_url == "http://127.0.0.1:18000/v1"


def test_a_side_door_needs_a_fabric_address_said_in_one_line(tmp_path):
    cfg = load_config({"WORKERS": "root@w1,root@w2,root@w3", "GROUPS": "2", "STATE_DIR": str(tmp_path)})
    with pytest.raises(UserError, match="set R2_IP to worker2's fabric address"):
        units.side_door_node_config(cfg, cfg.nodes[2])


def test_a_groups_first_node_holds_its_own_key_and_the_door_keys_hash_and_a_release_records_neither(tmp_path):
    from dsv41.head.core import releases as rel
    cfg = load_config(dict(GROUPS2, STATE_DIR=str(tmp_path / "state")))
    door_key = "sk-door-key-never-written-but-as-its-hash"
    files = {s.name: desired.state_files(cfg, s, door_key, '{"qdir": "a/q1"}') for s in cfg.nodes}
    group_key = files["worker2"][names.SECRET_KEY][0].strip()
    assert group_key and group_key != door_key and files["head"][names.SECRET_KEY][0].strip() == door_key
    assert oct(os.stat(f"{cfg.state_dir}/engine_key.g1").st_mode & 0o777) == "0o600"
    key_map = files["worker2"][names.SIDE_DOOR_KEYS][0]
    assert names.key_hash(door_key) in key_map and door_key not in key_map and group_key not in key_map
    assert names.SECRET_KEY not in files["worker1"] and names.SECRET_KEY not in files["worker3"]
    again = desired.state_files(cfg, cfg.nodes[2], door_key, '{"qdir": "a/q1"}')
    assert again[names.SECRET_KEY][0].strip() == group_key               # created once, kept
    want = dec.Desired(units={s.name: {} for s in cfg.nodes}, files=files)
    fields = rel.record_fields(cfg, want, {}, {}, {})
    text = json.dumps(fields)
    assert door_key not in text and group_key not in text
    assert fields["secret_files"] == {"head": [names.SECRET_KEY], "worker2": [names.SECRET_KEY]}


class Unit:
    def __init__(self, active="active"):
        self.active, self.enabled, self.load, self.text, self.installed = active, "enabled", "loaded", None, True
        self.since, self.restarts = 0.0, 0


class NodeState:
    """What a node's probe says, as decide() reads it (its units all as wanted, every file as wanted)."""
    def __init__(self, units_text, files, down=()):
        self.units_text, self.down = units_text, down
        self.files = {rel: dec.sha(text) for rel, (text, _) in files.items() if text is not None}
        self.image_id, self.model_changed_at, self.model_dir = None, 0, "/m"

    def unit(self, name):
        u = Unit("failed" if name in self.down else "active")
        u.text = self.units_text.get(name)
        return u

    def age(self, unit):
        return 100.0

    def container(self, name):
        return None


def test_a_group_down_restarts_that_group_alone_and_every_group_down_restarts_them_as_one(tmp_path):
    cfg, by_rank = render(GROUPS2, tmp_path)
    recipe = Vllm(cfg)
    want = dec.Desired(units={s.name: by_rank[s.rank] for s in cfg.nodes}, files={s.name: {} for s in cfg.nodes})

    def steps(*down):
        states = {s.name: NodeState(by_rank[s.rank], {}, down=[f"dsv41-r{s.rank}.service"] if s.name in down else [])
                  for s in cfg.nodes}
        return [(s.node, s.target) for s in dec.decide(cfg.nodes, want, states, recipe, cfg.groups)
                if s.kind is dec.Kind.RESTART_RANKS]
    assert steps() == []
    assert steps("worker3") == [("group 1", "g1")]
    assert steps("head") == [("group 0", "g0")]
    assert steps("worker1", "worker2") == [("all", "")]          # none serves: they start together, as at first


def test_a_change_to_every_group_while_they_serve_rolls_group_by_group_the_one_not_serving_first(tmp_path):
    cfg, by_rank = render(GROUPS2, tmp_path)
    recipe = Vllm(cfg)
    changed = {s.name: {u: text + "# changed\n" for u, text in by_rank[s.rank].items()} for s in cfg.nodes}
    want = dec.Desired(units=changed, files={s.name: {} for s in cfg.nodes})

    def steps(*down):
        states = {s.name: NodeState(by_rank[s.rank], {}, down=[f"dsv41-r{s.rank}.service"] if s.name in down else [])
                  for s in cfg.nodes}
        return [(s.node, s.target) for s in dec.decide(cfg.nodes, want, states, recipe, cfg.groups)
                if s.kind is dec.Kind.RESTART_RANKS]
    assert steps() == [("group 0", "g0"), ("group 1", "g1")]
    assert steps("worker3") == [("group 1", "g1"), ("group 0", "g0")]
    one = load_config(dict(FOUR, STATE_DIR=str(tmp_path / "one")))
    _, single = render(FOUR, tmp_path / "one")
    states = {s.name: NodeState(single[s.rank], {}) for s in one.nodes}
    want_one = dec.Desired(units={s.name: {u: t + "#\n" for u, t in single[s.rank].items()} for s in one.nodes},
                           files={s.name: {} for s in one.nodes})
    assert [(s.node, s.target) for s in dec.decide(one.nodes, want_one, states, Vllm(one), 1)
            if s.kind is dec.Kind.RESTART_RANKS] == [("all", "")]     # one group: as before


def test_a_change_of_the_groups_themselves_restarts_every_group_at_once_and_says_so(tmp_path):
    """GROUPS=1 to 2 on four serving nodes: group 0's rank 0 and group 1's worker were one engine, so neither group
    can serve while the other restarts; the ranks restart as one, the step saying why before it is taken. A
    change within the same groups still rolls."""
    one, by_rank_one = render(FOUR, tmp_path / "one")
    cfg, by_rank = render(GROUPS2, tmp_path / "two")
    want = dec.Desired(units={s.name: by_rank[s.rank] for s in cfg.nodes}, files={s.name: {} for s in cfg.nodes})
    states = {s.name: NodeState(by_rank_one[s.rank], {}) for s in cfg.nodes}
    [restart] = [s for s in dec.decide(cfg.nodes, want, states, Vllm(cfg), cfg.groups)
                 if s.kind is dec.Kind.RESTART_RANKS]
    assert (restart.node, restart.target) == ("all", "")
    assert restart.reason.startswith("the serving groups change (head, worker1, worker2, worker3 now): every group "
                                     "restarts at once, and the door answers 503 until they serve"), restart.reason
    back = dec.Desired(units={s.name: by_rank_one[s.rank] for s in one.nodes}, files={s.name: {} for s in one.nodes})
    states = {s.name: NodeState(by_rank[s.rank], {}) for s in cfg.nodes}
    assert [(s.target, s.reason[:24]) for s in dec.decide(one.nodes, back, states, Vllm(one), 1)
            if s.kind is dec.Kind.RESTART_RANKS] == [("", "the serving groups chang")]


def test_a_rollout_taken_up_again_rolls_only_the_groups_not_yet_on_the_change(tmp_path):
    """Where a rollout stopped, whoever takes it up (the watchdog carrying a killed launch on, `doit launch
    --retry-failed` after group 1 failed and went back alone, `doit rollback`): the groups already on the target
    units have nothing left to do, and the others roll on one at a time."""
    cfg, by_rank = render(GROUPS2, tmp_path)
    changed = {s.name: {u: text + "# changed\n" for u, text in by_rank[s.rank].items()} for s in cfg.nodes}
    want = dec.Desired(units=changed, files={s.name: {} for s in cfg.nodes})
    group0 = {s.name for s in cfg.group_specs(0)}
    states = {s.name: NodeState(changed[s.name] if s.name in group0 else by_rank[s.rank], {}) for s in cfg.nodes}
    steps = [(s.node, s.target, s.kind) for s in dec.decide(cfg.nodes, want, states, Vllm(cfg), cfg.groups)
             if s.kind in (dec.Kind.RESTART_RANKS, dec.Kind.INSTALL)]
    assert [(n, t) for n, t, k in steps if k is dec.Kind.RESTART_RANKS] == [("group 1", "g1")]
    assert {n for n, _, k in steps if k is dec.Kind.INSTALL} == {"worker2", "worker3"}


def test_a_rollout_whose_process_died_mid_group_restarts_that_group_first_and_alone(tmp_path):
    """The process rolling a release out died between a group's new units and its ranks' restart: the units
    are the release's, so decide() sees nothing to do there. Whoever carries it on still restarts that group
    (its ranks did not start since the rollout began), alone and first, and no group that did."""
    cfg, by_rank = render(GROUPS2, tmp_path)
    recipe = Vllm(cfg)
    changed = {s.name: {u: text + "# changed\n" for u, text in by_rank[s.rank].items()} for s in cfg.nodes}
    want = dec.Desired(units=changed, files={s.name: {} for s in cfg.nodes})
    ages = {}

    class Aged(NodeState):
        def __init__(self, spec, units_text):
            super().__init__(units_text, {})
            self.name = spec.name

        def age(self, unit):
            return ages[self.name]

    def owed(on_change, since=1000.0, **age):
        ages.update(age)
        states = {s.name: Aged(s, changed[s.name] if s.name in on_change else by_rank[s.rank]) for s in cfg.nodes}
        steps = dec.decide(cfg.nodes, want, states, recipe, cfg.groups)
        return [s.target for s in dec.owed_restarts(cfg.nodes, steps, states, recipe, cfg.groups, since, 1100.0,
                                                    "release 4 as recorded") if s.kind is dec.Kind.RESTART_RANKS]
    every = ("head", "worker1", "worker2", "worker3")
    # group 0 done (started 60 s ago, after the rollout began 100 s ago), group 1 given its units, then the kill
    assert owed(every, head=60.0, worker1=60.0, worker2=500.0, worker3=500.0) == ["g1"]
    # killed in group 0's turn, after its units: group 0 first, then group 1, which decide() rolls
    assert owed(("head", "worker1"), head=500.0, worker1=500.0, worker2=500.0, worker3=500.0) == ["g0", "g1"]
    assert owed(every, head=60.0, worker1=60.0, worker2=50.0, worker3=50.0) == []     # both restarted: none owed
    # a way back (no restart begun for it): only the groups whose units differ, or all when none does
    assert owed(("worker2", "worker3"), since=None) == ["g0"]
    assert owed(every, since=None) == [""]


def test_a_groups_run_lock_and_the_whole_one_exclude_each_other(tmp_path):
    state = str(tmp_path)
    g1 = os.path.join(state, names.GROUP_RECORDS, "g1")
    g2 = os.path.join(state, names.GROUP_RECORDS, "g2")
    hold = ("import sys, time; from dsv41.head.core import runlock; runlock.take(sys.argv[1], 'holder'); "
            "print('held', flush=True); time.sleep(60)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen([sys.executable, "-c", hold, g1], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout.readline().strip() == "held"
        runlock.take(g2, "another group's recovery")          # another group: never waits on this one
        runlock.release()
        with pytest.raises(UserError, match=r"groups/g1/doit.lock \(pid \d+: holder\)"):
            runlock.take(state, "doit launch")                # a doit run: not while a group recovers
        assert runlock.holder(state).endswith("holder")
    finally:
        p.kill()
        p.wait()
    p = subprocess.Popen([sys.executable, "-c", hold, state], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match="holder"):
            runlock.take(g1, "dsv41-watchdog recovery")       # a group's recovery: not while a doit run runs
        assert runlock.holder(g1).endswith("holder")
    finally:
        p.kill()
        p.wait()
        runlock.release()


def test_a_groups_watchdog_writes_its_own_file_every_series_labelled_with_its_group(tmp_path):
    h = Health(Verdict.HEALTHY, ("serving",))
    watchdog_metrics.write_metrics(str(tmp_path), h, 1, False, 1_900_000_000.0)
    watchdog_metrics.write_metrics(str(tmp_path), h, 2, False, 1_900_000_000.0, scope=1)
    whole = (tmp_path / watchdog_metrics.METRICS_FILE).read_text()
    group = (tmp_path / "dsv41_watchdog.g1.prom").read_text()
    samples = [line for line in group.splitlines() if line and not line.startswith("#")]
    assert samples and all('group="g1"' in line for line in samples)
    assert 'dsv41_watchdog_verdict{group="g1",verdict="HEALTHY"} 1.0' in samples, samples
    assert "group=" not in whole and 'dsv41_watchdog_recoveries_total 1.0' in whole


def test_a_groups_records_are_its_own_folder_and_the_whole_keeps_the_state_dir(tmp_path):
    cfg = load_config(dict(GROUPS2, STATE_DIR=str(tmp_path)))
    assert cfg.records == str(tmp_path)
    assert cfg.group_config(1).records == os.path.join(str(tmp_path), "groups", "g1")
    assert cfg.group_config(1).state_dir == str(tmp_path)          # the keys, the releases, the door: the head's
    single = load_config(dict(FOUR, STATE_DIR=str(tmp_path)))
    assert single.group_config(0) is single and single.records == str(tmp_path)


def test_doit_incidents_lists_each_groups_incidents_naming_the_group(tmp_path):
    from dsv41.head.core import incidents, record
    cfg = load_config(dict(GROUPS2, STATE_DIR=str(tmp_path)))
    g1 = cfg.group_config(1).records
    inc = record.open_incident(g1, verdict="DEAD", evidence="dsv41-r3.service on worker3 is failed", fault_at=100.0,
                               node="worker3", now=1_900_000_000.0)
    record.close_incident(g1, inc, "READY", ended=1_900_000_060.0)
    lines = incidents.list_lines(str(tmp_path))
    assert len(lines) == 2 and "DEAD g1" in lines[1] and "worker3 is failed" in lines[1], lines
    assert incidents.show(str(tmp_path), inc["id"]).startswith(f"incident {inc['id']} of group 1:")
    assert record.incidents(str(tmp_path)) == []          # the whole's record holds none of a group's


def test_top_shows_each_groups_state_and_requests_in_flight_at_the_door():
    from dsv41.head import top
    view = {"time": 100.0, "gateway": {"error": None, "door": "open", "reason": "", "ready_at": 0, "in_flight": 5,
                                       "groups": {"g0": {"status": "UP", "in_flight": 5},
                                                  "g1": {"status": "MAINT", "in_flight": 0}}}}
    line = top.gateway_text(view)
    assert line.plain == "gateway: door open, 5 requests in flight; g0 UP 5, g1 MAINT 0" and line.style == "yellow"
    view["gateway"]["groups"]["g1"]["status"] = "UP 2/2"
    assert top.gateway_text(view).style == "green"
    view["gateway"]["groups"] = {"r0": {"status": "UP", "in_flight": 5}}          # one group: the line as it was
    assert top.gateway_text(view).plain == "gateway: door open, 5 requests in flight"


def test_the_watchdog_service_runs_one_process_a_group_and_stops_them_all(tmp_path):
    """The real service process with GROUPS=2: one watchdog per group, each publishing its own status and textfile
    and marking its journal lines with its group; a group's process killed is started again; SIGTERM (systemctl
    stop) ends them all and removes their textfiles."""
    import signal
    import time
    from dsv41.head.core.desired import watchdog_settings
    cfg = load_config({"WORKERS": "u@127.0.0.1", "GROUPS": "2", "SSH_OPTS": "-p 1", "SSH_TIMEOUT_S": "2",
                       "PORT": "18996", "STATE_DIR": str(tmp_path), "METRICS_DIR": str(tmp_path / "prom"),
                       "WATCHDOG_PROBE_S": "2", "R1_IP": "127.0.0.1"})
    (tmp_path / "watchdog.json").write_text(watchdog_settings(cfg))
    prom = [tmp_path / "prom" / f"dsv41_watchdog.g{i}.prom" for i in (0, 1)]
    status = [tmp_path / "groups" / f"g{i}" / names.WATCHDOG_STATUS for i in (0, 1)]
    p = subprocess.Popen([sys.executable, "-m", "dsv41.head.watchdog", "--state-dir", str(tmp_path)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})

    def children():
        r = subprocess.run(["pgrep", "-f", f"dsv41.head.watchdog --state-dir {tmp_path} --group"],
                           capture_output=True, text=True)
        return r.stdout.split()
    try:
        end = time.monotonic() + 60
        while not all(f.exists() for f in prom + status) and time.monotonic() < end and p.poll() is None:
            time.sleep(0.2)
        assert all(f.exists() for f in prom + status), os.listdir(tmp_path)
        assert 'group="g1"' in prom[1].read_text() and 'group="g0"' in prom[0].read_text()
        assert not (tmp_path / "prom" / watchdog_metrics.METRICS_FILE).exists()
        first = children()
        assert len(first) == 2, first
        os.kill(int(first[1]), signal.SIGKILL)
        end = time.monotonic() + 30
        while (len(children()) != 2 or first[1] in children()) and time.monotonic() < end:
            time.sleep(0.2)
        assert len(children()) == 2 and first[1] not in children()
    finally:
        p.send_signal(signal.SIGTERM)
        out = p.communicate(timeout=60)[0]
    assert p.returncode == 0 and children() == [] and not any(f.exists() for f in prom), out
    assert "[group 0] watchdog started" in out and "[group 1] watchdog started" in out
    assert "watchdog ended (exit" in out and "started again" in out


def test_a_release_keeps_how_far_it_got_with_each_group_and_shows_it(tmp_path):
    from dsv41.head.core import release_status, releases as rel
    cfg = load_config(dict(GROUPS2, STATE_DIR=str(tmp_path)))
    fields = {"image": cfg.image, "image_ids": {}, "checkpoint": {}, "settings": {}, "node_versions": {},
              "units": {}, "files": {}, "secret_files": {}}
    r = rel.begin(str(tmp_path), fields, 10)
    rel.group_step(str(tmp_path), r.number, "g0", "restarting")
    rel.group_step(str(tmp_path), r.number, "g0", "good")
    rel.group_step(str(tmp_path), r.number, "g1", "restarting")
    assert rel.load_one(str(tmp_path), r.number).groups == {"g0": "good", "g1": "restarting"}
    history = release_status.history_of(str(tmp_path))
    assert "  groups      g0 good, g1 restarting" in release_status.show_lines(history[0], None, r.number)
    entry = release_status.service_entry(str(tmp_path), history=history)
    assert release_status.service_line(entry).endswith("[g0 good, g1 restarting]")
    # group 1's step left unrecorded by a process that died, then carried on: good on every group it restarted
    assert rel.finish(str(tmp_path), r.number, rel.GOOD, "ready").groups == {"g0": "good", "g1": "good"}


def test_a_worker_is_judged_against_its_own_groups_first_node_not_the_head(tmp_path):
    """A group restarted alone (a rolling release) started after the head's rank: its worker rejoined its own
    group's rendezvous, so nothing must restart together; against its own first node it is judged as before."""
    cfg, by_rank = render(GROUPS2, tmp_path)
    ages = {"head": 500.0, "worker1": 499.0, "worker2": 60.0, "worker3": 59.0}

    class Aged(NodeState):
        def __init__(self, name):
            super().__init__(by_rank[cfg.nodes[[s.name for s in cfg.nodes].index(name)].rank], {})
            self.name = name

        def age(self, unit):
            return ages[self.name]
    states = {s.name: Aged(s.name) for s in cfg.nodes}
    assert dec.stale_workers(cfg.nodes, states, Vllm(cfg), 2) == []
    assert len(dec.stale_workers(cfg.nodes, states, Vllm(cfg), 1)) == 2       # as one group: both "restarted after"
    ages["worker3"] = 10.0                      # restarted on its own after its group's rank 0: it cannot rejoin
    [line] = dec.stale_workers(cfg.nodes, states, Vllm(cfg), 2)
    assert line.startswith("dsv41-r3.service on worker3") and "the ranks must restart together" in line
