"""End to end in the two-node lab: the real doit tasks, run on the head node, against real ssh,
rsync, systemd, journald, Docker and a registry. The engine image is the lab's stand-in for the
real serving image (tests/lab/engine/engine.py); everything else is the real thing."""
import json
import re
import time

import pytest
from labctl import MODEL

pytestmark = pytest.mark.lab

UNITS = ["dsv41-memguard.service", "dsv41-r0.service"]
WUNITS = ["dsv41-memguard.service", "dsv41-r1.service"]


def mtimes(lab, node, units):
    paths = [f"/etc/systemd/system/{u}" for u in units]
    return lab.on(node, ["stat", "-c", "%n %Y.%y", *paths]).stdout


def key(lab):
    return lab.on("head", "cat /root/.dsv41-two-sparks/api_key").stdout.strip()


def api(lab, path, k=None):
    auth = f"-H 'Authorization: Bearer {k}'" if k else ""
    r = lab.on("head", f"curl -s -o /dev/null -w '%{{http_code}}' {auth} http://127.0.0.1:8000{path}")
    return r.stdout.strip()


def test_launch_from_nothing_serves_the_api(lab, launched):
    out = launched.stdout + launched.stderr
    assert "ready: base URL http://198.51.100.11:8000/v1" in out
    assert "model deepseek-v4.1-flash" in out and "/root/.dsv41-two-sparks/api_key" in out
    for node, units in (("head", UNITS), ("worker1", WUNITS)):
        props = lab.units(node, units)
        assert all(p["ActiveState"] == "active" for p in props.values()), props
    assert api(lab, "/v1/models", key(lab)) == "200"
    assert api(lab, "/v1/models", "wrong") == "401"
    # the checkpoint was copied over the fabric and verified on the worker
    assert lab.on("worker1", f"test -s {MODEL}/model-00005-of-00006.safetensors").returncode == 0
    assert lab.on("worker1", f"ls {MODEL} | grep -c part", check=False).stdout.strip() == "0"


def test_second_launch_changes_nothing(lab, launched):
    lab.doit("launch")                 # whatever an earlier test left, this launch converges it
    before = {n: (mtimes(lab, n, u), lab.units(n, u)) for n, u in (("head", UNITS), ("worker1", WUNITS))}
    t0 = time.monotonic()
    r = lab.doit("launch")
    took = time.monotonic() - t0
    after = {n: (mtimes(lab, n, u), lab.units(n, u)) for n, u in (("head", UNITS), ("worker1", WUNITS))}
    assert before == after
    assert "nothing changed" in r.stdout
    assert "installed" not in r.stdout and "started" not in r.stdout
    print(f"second launch took {took:.2f} s")


def test_key_never_in_units_argv_or_systemctl_show(lab, launched):
    engine = lab.on("head", "cat /root/.dsv41-two-sparks/engine_key").stdout.strip()     # rank 0's, behind the gateway
    for k in (key(lab), engine):
        for node, units in (("head", UNITS + ["dsv41-gateway.service"]), ("worker1", WUNITS)):
            assert k not in lab.on(node, "cat /etc/systemd/system/dsv41-*.service").stdout
            assert k not in lab.on(node, ["systemctl", "show", *units]).stdout
            assert k not in lab.on(node, "ps -eo args").stdout
            assert k not in lab.on(node, "journalctl --no-pager -u 'dsv41-*'").stdout
        assert k not in lab.on("head", "find /root/.dsv41-two-sparks/units /root/.dsv41-two-sparks/releases "
                                       "/root/.dsv41-two-sparks/gateway -type f -exec cat {} +").stdout
        db = lab.on("head", "cat /root/.dsv41-two-sparks/doit.db | strings", check=False).stdout
        assert k not in db
        inspect = lab.on("head", "docker inspect dsv41-r0").stdout          # Config.Env, Cmd, Entrypoint
        assert k not in inspect and '"Source": "/root/.dsv41-two-sparks/secrets/api_key"' in inspect
    assert engine != key(lab) and engine == lab.on("head", "cat /root/.dsv41-two-sparks/secrets/api_key").stdout.strip()
    mode = lab.on("head", "stat -c %a /root/.dsv41-two-sparks/secrets/api_key /root/.dsv41-two-sparks/api_key")
    assert mode.stdout.split() == ["600", "600"]


def test_smoke_passes_against_the_stand_in_engine(lab, launched):
    r = lab.doit("smoke", check=False)
    lines = r.stdout.splitlines()
    for name in ("text", "tools", "vision", "stream"):
        assert any(line.startswith(name) and "PASS" in line for line in lines), r.stdout
    assert r.returncode == 0


def test_status_shows_every_node(lab, launched):
    r = lab.doit("status --json")
    report = json.loads(r.stdout)
    assert (report["schema"], report["state"], report["exit_code"]) == ("dsv41.status/6", "READY", 0)
    for name in ("head", "worker1"):
        e = report["nodes"][name]
        assert e["memguard"] == "active" and e["container"] == "running"
        assert e["mem_available_gib"] > 0


def test_rank_setting_change_restarts_ranks_only_worker_first(lab, launched):
    guards = {n: lab.units(n, ["dsv41-memguard.service"]) for n in ("head", "worker1")}
    r = lab.doit("launch", env={"KV_BYTES": "2600000000"})
    assert "--kv-cache-memory-bytes 2600000000" in lab.on("head", "cat /etc/systemd/system/dsv41-r0.service").stdout
    assert guards == {n: lab.units(n, ["dsv41-memguard.service"]) for n in ("head", "worker1")}
    r0 = lab.units("head", ["dsv41-r0.service"])["dsv41-r0.service"]
    r1 = lab.units("worker1", ["dsv41-r1.service"])["dsv41-r1.service"]
    assert r1["ActiveEnterTimestamp"] <= r0["ActiveEnterTimestamp"], (r0, r1)
    assert r.stdout.index("[worker1] started") < r.stdout.index("[head] started")
    lab.doit("launch")  # back to the defaults


def test_plan_shows_the_diff_and_changes_nothing(lab, launched):
    before = {n: (mtimes(lab, n, u), lab.units(n, u)) for n, u in (("head", UNITS), ("worker1", WUNITS))}
    r = lab.doit("plan", env={"KV_BYTES": "2500000000"})
    assert "nothing:" not in r.stdout
    assert re.search(r"^-.*--kv-cache-memory-bytes 2700000000", r.stdout, re.M)
    assert re.search(r"^\+.*--kv-cache-memory-bytes 2500000000", r.stdout, re.M)
    assert "restart-ranks on all: dsv41-r0.service changed; dsv41-r1.service changed" in r.stdout
    after = {n: (mtimes(lab, n, u), lab.units(n, u)) for n, u in (("head", UNITS), ("worker1", WUNITS))}
    assert before == after
    assert "nothing: everything is installed, running and unchanged" in lab.doit("plan").stdout


def test_memguard_setting_change_restarts_only_the_guards(lab, launched):
    ranks = {n: lab.units(n, [u]) for n, u in (("head", "dsv41-r0.service"), ("worker1", "dsv41-r1.service"))}
    lab.doit("launch", env={"MEMGUARD_GIB": "0.6"})
    assert ranks == {n: lab.units(n, [u]) for n, u in (("head", "dsv41-r0.service"), ("worker1", "dsv41-r1.service"))}
    assert '"floor_gib": 0.6' in lab.on("worker1", "cat /root/.dsv41-two-sparks/memguard.json").stdout
    for node in ("head", "worker1"):  # the same guard process took the new floor
        assert "floor 0.60 GiB" in lab.on(node, "journalctl --no-pager -u dsv41-memguard").stdout
    lab.doit("launch")


def test_killed_worker_container_is_degraded_and_reported(lab, launched):
    lab.on("worker1", "docker kill dsv41-r1")
    time.sleep(1)
    r = lab.doit("status --json", check=False)
    assert json.loads(r.stdout)["state"] == "DEGRADED" and r.returncode == 1
    r = lab.doit("launch")
    assert "dsv41-r1" in r.stdout and "ready:" in r.stdout
    assert json.loads(lab.doit("status --json").stdout)["state"] == "READY"


def test_logs_through_journalctl(lab, launched):
    r = lab.doit("logs r1 -n 20")
    assert "dsv41-r1.service on worker1" in r.stdout
    assert re.search(r"rank 1|node-rank|stand-in", r.stdout, re.I), r.stdout
    r = lab.doit("logs memguard -n 5")
    assert "dsv41-memguard.service on head" in r.stdout and "dsv41-memguard.service on worker1" in r.stdout
    r = lab.doit("logs r9", check=False)
    assert r.returncode != 0 and "no unit 'r9'" in r.stderr


def test_memguard_trip_stops_ranks_for_good_until_cleared(lab, launched):
    lab.doit("launch", env={"MEMGUARD_GIB": "1000"}, check=False)
    deadline = time.time() + 30
    while time.time() < deadline:
        if lab.on("worker1", "test -e /root/.dsv41-two-sparks/memguard.tripped", check=False).returncode == 0:
            break
        time.sleep(0.5)
    time.sleep(3)
    props = lab.units("worker1", ["dsv41-r1.service"])["dsv41-r1.service"]
    assert props["ActiveState"] in ("inactive", "failed"), props
    time.sleep(5)  # no restart after a guard stop
    assert lab.units("worker1", ["dsv41-r1.service"])["dsv41-r1.service"]["ActiveState"] != "active"
    r = lab.doit("status", check=False)
    assert r.returncode == 5 and "TRIPPED" in r.stdout and "`doit clear-trip`" in r.stdout
    assert re.search(r"MemAvailable \d+\.\d{3} GiB < floor 1000\.000 GiB", r.stdout), r.stdout
    r = lab.doit("launch", check=False)
    assert r.returncode != 0 and "clear-trip" in r.stderr and "KV_BYTES" in r.stderr
    lab.doit("clear-trip")
    r = lab.doit("launch")
    assert "ready:" in r.stdout


def test_preflight_passes_while_running_and_refuses_a_stale_container(lab, launched):
    r = lab.doit("preflight --json")
    report = json.loads(r.stdout)
    assert not [c for c in report["checks"] if c["status"] == "FAIL"], report
    lab.on("worker1", f"docker run -d --rm --name dsv41-r5 --entrypoint sleep {lab.engine_ref} 300")
    try:
        r = lab.doit("preflight", check=False)
        assert r.returncode != 0
        fail = [line for line in r.stdout.splitlines() if line.startswith("FAIL")]
        assert len(fail) == 1 and "stale-containers" in fail[0] and "dsv41-r5" in fail[0]
        assert fail[0].rstrip().endswith("-- fix: docker rm -f dsv41-r5"), fail[0]      # the fix names the container
        units_before = mtimes(lab, "worker1", WUNITS)
        r = lab.doit("launch", check=False)
        assert r.returncode != 0 and "preflight" in r.stderr
        assert mtimes(lab, "worker1", WUNITS) == units_before
    finally:
        lab.on("worker1", "docker rm -f dsv41-r5", check=False)


def test_copy_is_verified_on_the_worker_and_resumes(lab, launched):
    receipt = lab.on("worker1", "cat /root/.dsv41-two-sparks/checkpoint-receipt.json").stdout
    assert "model-00005-of-00006.safetensors" in receipt
    lab.on("worker1", f"rm {MODEL}/model-00002-of-00006.safetensors")
    r = lab.doit("copy")
    out = r.stdout + r.stderr
    assert "copy: 1 file(s)" in out and "verified (6 shards" in out  # only the missing file went
    assert lab.on("worker1", f"test -s {MODEL}/model-00002-of-00006.safetensors").returncode == 0
    r = lab.doit("copy")
    assert "-- copy" in r.stderr  # up to date: nothing copied again


def test_stop_then_status_says_nothing_runs(lab, launched):
    lab.doit("stop")
    lab.doit("stop")  # idempotent
    for node, units in (("head", UNITS), ("worker1", WUNITS)):
        assert all(p["ActiveState"] != "active" for p in lab.units(node, units).values())
    r = lab.doit("status", check=False)
    assert r.returncode == 3 and "NOT RUNNING: nothing is running" in r.stdout
