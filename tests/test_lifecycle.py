"""Lifecycle decisions as pure functions over node facts, and `doit render` without any node."""
import hashlib
import json
import os
import subprocess
import sys

import pytest

from dsv41 import lifecycle
from dsv41.config import load_config
from dsv41.lifecycle import GUARD, Cluster, decide, guard_settings, stale_workers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OVERRIDES = {"WORKER": "bob@10.10.10.11", "HEAD_IP": "10.10.10.13", "HEAD_IFNAME": "enp1s0f1np1",
             "HEAD_HCAS": "rocep1s0f1", "HEAD_GID_INDEX": "3", "WORKER_IP": "10.10.10.11",
             "WORKER_IFNAME": "enp1s0f1np1", "WORKER_HCAS": "rocep1s0f1", "WORKER_GID_INDEX": "3"}


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def cluster(tmp_path, **env):
    model = tmp_path / "model"
    (model / "exl3/plan").mkdir(parents=True, exist_ok=True)
    (model / "exl3/plan/J268-ho-v31-K5n.json").write_text('{"qdir": "qn:q31:q31s", "k": 1}')
    (tmp_path / "key").write_text("k" * 43 + "\n")
    cfg = load_config({**OVERRIDES, "STATE_DIR": str(tmp_path / "state"), "MODEL_DIR": str(model),
                       "API_KEY_FILE": str(tmp_path / "key"), **env})
    cl = Cluster(cfg)
    for n in cl.nodes:
        n._home = "/home/bob" if not n.is_local else os.path.expanduser("~")
    return cl


def rendered(cl):
    from dsv41 import fabric, units
    fab = fabric.fabric_from_overrides(cl.cfg)
    return {n.name: units.render_units(cl.cfg, cl.spec(n), fab, cl.paths(n)) for n in cl.nodes}


def running(cl, want, since=None, image="sha256:abc", clock=None):
    """Facts of nodes where `want` is installed, active and current (stand-in for probe.py output)."""
    facts = {}
    for i, n in enumerate(cl.nodes):
        rank_unit = f"{cl.spec(n).unit}.service"
        ts = (since or {}).get(n.name, 1000) + (clock or {}).get(n.name, 0)
        facts[n.name] = {
            "uid": 0, "image_id": image, "time": 5000.0 + (clock or {}).get(n.name, 0), "tripped": None, "mem_available_kib": 1 << 20,
            "units": {name: {"installed": True, "text": text, "ActiveState": "active", "SubState": "running",
                             "ActiveEnterTimestamp": f"@{ts}"}
                      for name, text in want[n.name].items()},
            "containers": {cl.spec(n).unit: {"state": {"Status": "running"}, "image": image}},
            "files": {rel: sha(text) for rel, (text, _) in lifecycle.state_files(cl, n).items()},
        }
        assert rank_unit in facts[n.name]["units"]
    return facts


def test_nothing_changed_means_no_steps(tmp_path):
    cl = cluster(tmp_path)
    want = rendered(cl)
    assert decide(cl, want, running(cl, want)) == []


def test_a_rank_setting_change_restarts_ranks_and_leaves_guards(tmp_path):
    cl = cluster(tmp_path)
    facts = running(cl, rendered(cl))
    cl2 = cluster(tmp_path, KV_BYTES="2600000000")
    steps = decide(cl2, rendered(cl2), facts)
    kinds = [(s.node, s.what) for s in steps]
    assert ("head", "install") in kinds and ("worker1", "install") in kinds
    assert [s.what for s in steps if "guard" in s.what] == []
    assert steps[-1].what == "restart-ranks" and "dsv41-r0.service changed" in steps[-1].detail


def test_a_guard_floor_change_only_reloads_the_guards(tmp_path):
    cl = cluster(tmp_path)
    facts = running(cl, rendered(cl))
    cl2 = cluster(tmp_path, MEMGUARD_GIB="2")
    steps = decide(cl2, rendered(cl2), facts)
    assert [(s.node, s.what) for s in steps] == [("head", "reload-guard"), ("worker1", "reload-guard")]


def test_a_new_image_restarts_the_ranks(tmp_path):
    cl = cluster(tmp_path)
    want = rendered(cl)
    facts = running(cl, want)
    for f in facts.values():
        f["image_id"] = "sha256:new"
    steps = decide(cl, want, facts)
    assert [s.what for s in steps] == ["restart-ranks"] and "older image" in steps[0].detail


def test_a_stopped_guard_is_started_and_a_dead_rank_restarts_all_ranks(tmp_path):
    cl = cluster(tmp_path)
    want = rendered(cl)
    facts = running(cl, want)
    facts["worker1"]["units"][GUARD]["ActiveState"] = "inactive"
    facts["worker1"]["units"]["dsv41-r1.service"].update(ActiveState="failed")
    steps = decide(cl, want, facts)
    assert [(s.node, s.what) for s in steps] == [("worker1", "start-guard"), ("all", "restart-ranks")]


def test_a_worker_restarted_after_the_head_is_stale(tmp_path):
    cl = cluster(tmp_path)
    want = rendered(cl)
    facts = running(cl, want, since={"head": 1000, "worker1": 1100})
    cl.facts = facts
    assert "dsv41-r1 on worker1" in stale_workers(cl)[0]
    steps = decide(cl, want, facts)
    assert [s.what for s in steps] == ["restart-ranks"] and "restarted after the head" in steps[0].detail


def test_clock_skew_between_nodes_is_not_a_restart(tmp_path):
    cl = cluster(tmp_path)
    want = rendered(cl)
    # the worker started 0.5 s before the head, but its clock runs 30 s ahead
    facts = running(cl, want, since={"head": 1000, "worker1": 999.5}, clock={"worker1": 30})
    cl.facts = facts
    assert stale_workers(cl) == [] and decide(cl, want, facts) == []


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


def test_a_changed_plan_or_key_restarts_the_ranks(tmp_path):
    cl = cluster(tmp_path)
    want = rendered(cl)
    facts = running(cl, want)
    (tmp_path / "model/exl3/plan/J268-ho-v31-K5n.json").write_text('{"qdir": "qn:q31", "k": 2}')
    steps = decide(cl, want, facts)
    assert [s.what for s in steps] == ["restart-ranks"]
    assert "plans/J268-ho-v31-K5n.json changed on head" in steps[0].detail
    assert "changed on worker1" in steps[0].detail
    (tmp_path / "key").unlink()  # a dry run never creates the key; launch would, then restart
    steps = decide(cl, want, facts)
    assert "api_key.env" in steps[0].detail and not (tmp_path / "key").exists()


def test_log_arguments_after_the_unit_name_are_options():
    assert lifecycle._log_args(["r1", "-n", "20", "-f"], False, 100, "") == (["r1"], True, 20, "")
    with pytest.raises(lifecycle.UserError, match="not a number"):
        lifecycle._log_args(["r1", "-n", "x"], False, 100, "")


def test_guard_settings_are_the_configured_floor_and_mode(tmp_path):
    cl = cluster(tmp_path, MEMGUARD_GIB="1.5", MEMGUARD_MODE="observe")
    assert json.loads(guard_settings(cl.cfg)) == {"floor_gib": 1.5, "mode": "observe"}


def test_nodes_holding_different_images_stop_the_launch(tmp_path):
    from dsv41 import image
    cl = cluster(tmp_path)
    facts = {"head": {"image_id": "sha256:" + "a" * 64}, "worker1": {"image_id": "sha256:" + "b" * 64}}
    with pytest.raises(lifecycle.UserError, match="nodes hold different images") as e:
        image.ensure(cl, facts)
    assert "head sha256:aaaaaaaaaaaa" in str(e.value) and "docker rmi" in str(e.value)
    assert not (tmp_path / "state" / "image.stamp").exists()
    facts["worker1"]["image_id"] = facts["head"]["image_id"]
    assert image.ensure(cl, facts) == {"head": "sha256:" + "a" * 64, "worker1": "sha256:" + "a" * 64}
    stamp = json.loads((tmp_path / "state" / "image.stamp").read_text())
    assert stamp["image"] == cl.cfg.image and set(stamp["ids"]) == {"head", "worker1"}


def test_privileged_commands_use_sudo_only_for_a_non_root_user(tmp_path):
    cl = cluster(tmp_path)
    cl.facts = {"head": {"uid": 0}, "worker1": {"uid": 1000}}
    assert cl.priv(cl.head, ["systemctl", "start", "x"]) == ["systemctl", "start", "x"]
    assert cl.priv(cl.workers[0], ["systemctl", "start", "x"]) == ["sudo", "-n", "systemctl", "start", "x"]
