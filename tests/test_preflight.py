"""Preflight checks as pure functions over node facts (PASS, WARN and FAIL for every check), the
skip setting, the report, and facts gathered for real (locally, and from a worker over a real sshd)."""
import copy
import json
import os
import shutil
import time

import pytest

from dsv41.head import fabric_bench
from dsv41.head.core import fabric as head_fabric, preflight
from dsv41.head.core.cluster import Cluster
from dsv41.settings.layers import load_config
from dsv41.errors import UserError
from sshd import loopback_sshd  # noqa: F401  (fixture)
from test_fabric import V1, facts as fabric_facts, mapped, roce_gids

GIB = 1024 ** 3


def node_facts(ip, gids=None, mtu=9000):
    """What `dsv41.node.facts` reports for a healthy Spark (a stand-in: no Spark here)."""
    f = fabric_facts([("enp1s0f1np1", f"{ip}/24")],
                     [("rocep1s0f1", "ACTIVE", ["enp1s0f1np1"], gids or roce_gids(ip))])
    now = time.time()
    f.update({
        "hostname": "spark", "mtus": {"enp1s0f1np1": mtu},
        "speeds": {"enp1s0f1np1": {"mbps": 200000, "source": "ethtool", "raw": "200000Mb/s"}},
        "docker": {"ok": True, "kind": "ok", "error": None, "runtimes": ["nvidia", "runc"], "containers": []},
        "disk": {"model_dir": "/home/u/models/M", "checked": "/home/u", "free_bytes": 900 * GIB,
                 "model_bytes": 0},
        "memory": {"total_bytes": 128 * GIB, "available_bytes": 120 * GIB},
        "ports": {"8000": False, "29655": False, "18000": False},
        "kernel": {"release": "6.11.0-1016-nvidia", "cmdline": "ro quiet"},
        "tools": {t: True for t in ("python3", "rsync", "curl", "docker", "ethtool", "ping", "nvidia-smi")},
        "units": {"files": [], "active": {}},
        "ipc": {"remove_ipc": True, "source": "default", "system_uid_max": 999, "rank_uids": {}},
        "pings": [], "time": now, "_t0": now - 0.5, "_t1": now + 0.5})
    return f


def good():
    h, w = node_facts("198.51.100.11"), node_facts("198.51.100.13")
    h["pings"] = [{"peer": "198.51.100.13", "ok": True, "size": 8972, "ifname": "enp1s0f1np1"}]
    w["pings"] = [{"peer": "198.51.100.11", "ok": True, "size": 8972, "ifname": "enp1s0f1np1"}]
    return {0: h, 1: w}


@pytest.fixture
def cfg():
    return load_config({"WORKER": "u@198.51.100.13"})


def run(cfg, facts, skip=()):
    return preflight.checks(cfg, facts, set(skip))


def get(results, name, node=None):
    found = [c for c in results if c.name == name and (node is None or c.node == node)]
    assert found, f"no {name} check in {[c.name for c in results]}"
    return found


def status(results, name, node=None):
    return {c.status for c in get(results, name, node)}


def test_all_good_is_all_pass(cfg):
    res = run(cfg, good())
    assert [c for c in res if c.status != "PASS"] == []
    names = {c.name for c in res}
    assert names == set(preflight.CHECKS)
    assert len(get(res, "ping")) == 2 and len(get(res, "ports")) == 3


def test_unreachable_node_fails_with_its_message(cfg):
    f = good()
    f[1] = {"error": "cannot reach worker1 (u@198.51.100.13): Connection refused; check that it is up"}
    res = run(cfg, f)
    [c] = get(res, "reachable", "worker1")
    assert c.status == "FAIL" and "Connection refused" in c.detail
    assert not [c for c in res if c.node == "worker1" and c.name != "reachable"]


def test_fabric_not_detected_or_override_not_on_node(cfg):
    f = good()
    f[1]["fabric"]["devices"] = []
    f[1]["fabric"]["present"] = False
    [c] = get(run(cfg, f), "fabric", "worker1")
    assert c.status == "FAIL" and "no RDMA devices" in c.detail and "WORKER_IP" in c.fix
    res = run(load_config({"WORKER": "u@w", "HEAD_IP": "198.51.100.99"}), good())
    [c] = get(res, "fabric", "head")
    assert c.status == "FAIL" and "198.51.100.99 is not on this node" in c.detail and "R0_IP" in c.fix


def test_subnet(cfg):
    f = good()
    f[1] = node_facts("198.51.100.13")
    f[1]["fabric"]["addrs"][0].update(ip="203.0.113.13")
    f[1]["fabric"]["devices"][0]["gids"] = [{"index": 3, "gid": mapped("203.0.113.13"), "type": "RoCE v2"}]
    over = load_config({"WORKER": "u@w", "WORKER_IP": "203.0.113.13", "WORKER_HCAS": "rocep1s0f1",
                        "HEAD_IP": "198.51.100.11", "HEAD_HCAS": "rocep1s0f1"})
    [c] = get(run(over, f), "subnet")
    assert c.status == "FAIL" and "203.0.113.13/24" in c.detail and "one subnet" in c.fix


def test_gid_type(cfg):
    assert status(run(cfg, good()), "gid-type") == {"PASS"}
    over = load_config({"WORKER": "u@198.51.100.13", "WORKER_GID_INDEX": "2"})  # a RoCE v1 entry
    [c] = get(run(over, good()), "gid-type")
    assert c.status == "FAIL" and V1 in c.detail and "RoCE v2" in c.detail
    both_v1 = load_config({"WORKER": "u@198.51.100.13", "NCCL_IB_GID_INDEX": "2"})
    assert status(run(both_v1, good()), "gid-type") == {"WARN"}


def test_mtu_and_pings(cfg):
    f = good()
    f[1]["mtus"]["enp1s0f1np1"] = 1500
    f[0]["pings"][0].update(ok=False, error="1 packets transmitted, 0 received",
                            command="ping -M do -s 8972 -c 1 -W 2 -I enp1s0f1np1 198.51.100.13")
    res = run(cfg, f)
    [m] = get(res, "mtu")
    assert m.status == "FAIL" and "1500" in m.detail and "ip link set dev enp1s0f1np1 mtu 9000" in m.fix
    assert [c.status for c in get(res, "ping")] == ["FAIL", "PASS"]
    assert "ping -M do -s 8972" in get(res, "ping")[0].fix
    f[1]["pings"] = []
    assert [c.status for c in get(run(cfg, f), "ping")] == ["FAIL", "WARN"]


def test_link_speed_only_warns(cfg):
    f = good()
    f[1]["speeds"]["enp1s0f1np1"] = {"mbps": 13000, "source": "ethtool", "raw": "13000Mb/s"}
    f[0]["speeds"]["enp1s0f1np1"] = {"mbps": None, "source": "ethtool", "raw": "Unknown!"}
    res = run(cfg, f)
    assert status(res, "link-speed", "worker1") == {"WARN"} and status(res, "link-speed", "head") == {"WARN"}
    assert "13000 Mb/s" in get(res, "link-speed", "worker1")[0].detail


@pytest.mark.parametrize("kind,fix", [("permission", "usermod -aG docker"), ("daemon", "systemctl enable --now"),
                                      ("missing", "apt-get install docker.io")])
def test_docker(cfg, kind, fix):
    f = good()
    f[1]["docker"] = {"ok": False, "kind": kind, "error": "docker says no", "runtimes": [], "containers": []}
    res = run(cfg, f)
    [c] = get(res, "docker", "worker1")
    assert c.status == "FAIL" and fix in c.fix
    assert not [c for c in res if c.node == "worker1" and c.name in ("nvidia-runtime", "stale-containers")]


def test_nvidia_runtime_and_skip(cfg):
    f = good()
    f[0]["docker"]["runtimes"] = ["io.containerd.runc.v2", "runc"]
    f[1]["tools"]["nvidia-smi"] = False
    res = run(cfg, f)
    assert "nvidia-ctk runtime configure" in get(res, "nvidia-runtime", "head")[0].fix
    assert status(res, "nvidia-runtime") == {"FAIL"}
    assert "nvidia-smi not found" in get(res, "nvidia-runtime", "worker1")[0].detail
    skipped = run(cfg, f, skip={"nvidia-runtime"})
    assert status(skipped, "nvidia-runtime") == {"WARN"}
    assert all(c.detail.startswith("skipped on request (FAIL: ") for c in get(skipped, "nvidia-runtime"))


def test_disk(cfg):
    f = good()
    f[0]["disk"]["free_bytes"] = 300 * GIB
    [c] = get(run(cfg, f), "disk", "head")
    assert c.status == "FAIL" and "needs 700 GiB" in c.detail and "MODEL_DIR" in c.fix
    f[0]["disk"]["model_bytes"] = 462 * GIB       # the model is already there
    assert status(run(cfg, f), "disk", "head") == {"PASS"}
    f[1]["disk"]["free_bytes"] = 100 * GIB
    assert "R1_MODEL_DIR" in get(run(cfg, f), "disk", "worker1")[0].fix


def test_memory(cfg):
    f = good()
    f[1]["memory"]["available_bytes"] = 40 * GIB
    [c] = get(run(cfg, f), "memory", "worker1")
    assert c.status == "FAIL" and "40 GiB available" in c.detail and "GPU_UTIL" in c.fix
    f[1]["units"]["active"] = {"dsv41-r1.service": "active"}
    assert status(run(cfg, f), "memory", "worker1") == {"PASS"}
    f[1]["memory"] = {"error": "no /proc"}
    f[1]["units"]["active"] = {}
    assert status(run(cfg, f), "memory", "worker1") == {"WARN"}


def test_ports(cfg):
    f = good()
    f[0]["ports"]["8000"] = True
    res = run(cfg, f)
    assert [c.status for c in get(res, "ports")] == ["FAIL", "PASS", "PASS"]
    assert "PORT" in get(res, "ports")[0].fix and ":8000" in get(res, "ports")[0].fix
    f[0]["units"]["active"] = {"dsv41-r0.service": "active"}      # rank 0 on PORT (GATEWAY=0, or before it)
    assert status(run(cfg, f), "ports") == {"PASS"}
    f[0]["ports"]["18000"] = True                                   # rank 0 behind the gateway
    f[0]["units"]["active"] = {"dsv41-gateway.service": "active"}
    res = run(cfg, f)
    assert [c.status for c in get(res, "ports")] == ["PASS", "PASS", "FAIL"]
    assert "ENGINE_PORT" in get(res, "ports")[2].fix and "in use by the running dsv41-gateway" in get(res, "ports")[0].detail
    f[0]["units"]["active"] = {"dsv41-gateway.service": "active", "dsv41-r0.service": "active"}
    assert status(run(cfg, f), "ports") == {"PASS"}
    # PORT held by the gateway's socket unit while HAProxy restarts (or was stopped alone): ours, not in use
    f[0]["units"]["active"] = {"dsv41-gateway.socket": "active", "dsv41-gateway.service": "activating",
                               "dsv41-r0.service": "active"}
    res = run(cfg, f)
    assert [c.status for c in get(res, "ports")] == ["PASS", "PASS", "PASS"]
    assert get(res, "ports")[0].detail == "PORT 8000 held for the gateway by dsv41-gateway.socket"
    f[0]["units"]["active"] = {"dsv41-gateway.socket": "failed", "dsv41-gateway.service": "failed"}
    assert [c.status for c in get(run(cfg, f), "ports")] == ["FAIL", "PASS", "FAIL"]


def test_stale_containers(cfg):
    f = good()
    f[1]["docker"]["containers"] = [{"name": "dsv41-r1", "state": "running", "id": "abc"}]
    [c] = get(run(cfg, f), "stale-containers", "worker1")
    assert c.status == "FAIL" and c.fix == "docker rm -f dsv41-r1"
    f[1]["units"]["active"] = {"dsv41-r1.service": "active"}
    assert status(run(cfg, f), "stale-containers", "worker1") == {"PASS"}
    f[1]["docker"]["containers"] = [{"name": "dsv41-r1", "state": "exited", "id": "abc"}]
    f[1]["units"]["active"] = {}
    assert status(run(cfg, f), "stale-containers", "worker1") == {"WARN"}


def test_kernel(cfg):
    f = good()
    f[1]["kernel"] = {"release": "7.0.0-1019-nvidia", "cmdline": "ro quiet splash"}
    [c] = get(run(cfg, f), "kernel", "worker1")
    assert c.status == "FAIL" and "ENOMEM" in c.detail and "kho=off" in c.fix
    f[1]["kernel"]["cmdline"] = "ro quiet kho=off"
    assert status(run(cfg, f), "kernel", "worker1") == {"PASS"}


def test_clock(cfg):
    f = good()
    f[1]["time"] = f[1]["_t1"] + 9
    [c] = get(run(cfg, f), "clock", "worker1")
    assert c.status == "WARN" and "9.0 s" in c.detail and "set-ntp" in c.fix


def test_tools(cfg):
    f = good()
    f[1]["tools"]["rsync"] = False
    [c] = get(run(cfg, f), "tools", "worker1")
    assert c.status == "FAIL" and c.fix == "sudo apt-get install rsync"


def test_haproxy_is_needed_on_the_head_and_on_a_groups_first_node_only():
    """GROUPS=2 on two nodes: worker1 holds group 1's rank 0 and its side door, so HAProxy is needed there too."""
    cfg = load_config({"WORKER": "u@198.51.100.13", "GROUPS": "2"})
    f = good()
    f[1]["tools"]["haproxy"] = False
    [c] = get(run(cfg, f), "tools", "worker1")
    assert c.status == "FAIL" and c.fix == "sudo apt-get install haproxy (its side door runs it), or GROUPS=1"
    [c] = get(run(load_config({"WORKER": "u@198.51.100.13"}), f), "tools", "worker1")
    assert c.status == "PASS"                                 # one group: no side door, no HAProxy there


@pytest.mark.parametrize("ipc,status,says", [
    ({"remove_ipc": False, "source": "/etc/systemd/logind.conf"}, "PASS", "RemoveIPC=no"),
    ({"remove_ipc": True, "source": "default"}, "PASS", "the rank units run as root"),
    ({"remove_ipc": True, "source": "default", "rank_uids": {"dsv41-r1": 0}}, "PASS", "dsv41-r1 as uid 0"),
    ({"remove_ipc": True, "source": "default", "rank_uids": {"dsv41-r1": 998}}, "PASS", "spares root and system"),
    ({"remove_ipc": True, "source": "default", "rank_uids": {"dsv41-r1": 1000}}, "WARN", "dsv41-r1 as uid 1000"),
    ({"error": "permission denied"}, "WARN", "RemoveIPC unknown"),
])
def test_remove_ipc(cfg, ipc, status, says):
    facts = good()
    facts[1]["ipc"] = dict({"system_uid_max": 999, "rank_uids": {}}, **ipc) if "error" not in ipc else ipc
    c = get(run(cfg, facts), "remove-ipc", "worker1")[0]
    assert c.status == status and says in c.detail, c
    assert get(run(cfg, facts), "remove-ipc", "head")[0].status == "PASS"
    if status == "WARN" and "error" not in ipc:
        assert "RemoveIPC=no" in c.fix and "systemctl restart systemd-logind" in c.fix


def test_skip_setting(cfg):
    assert preflight.skip_set(load_config({"SKIP_CHECKS": "nvidia-runtime, link-speed"})) == {
        "nvidia-runtime", "link-speed"}
    with pytest.raises(UserError, match="SKIP_CHECKS: unknown name 'gpu': expected names from reachable"):
        load_config({"SKIP_CHECKS": "gpu"})          # refused at config time, not at preflight


def test_the_settings_schema_knows_every_check_by_name():
    from dsv41.settings import schema
    assert schema.CHECK_NAMES == tuple(preflight.CHECKS)


def test_rdma(cfg):
    over = load_config({"WORKER": "u@198.51.100.13", "WORKER_HCAS": "rocep1s0f1,mlx5_9"})
    f = good()
    f[0]["fabric"]["devices"][0]["state"] = "DOWN"
    head_over = load_config({"WORKER": "u@198.51.100.13", "HEAD_HCAS": "rocep1s0f1", "HEAD_IP": "198.51.100.11"})
    [c] = get(run(head_over, f), "rdma", "head")
    assert c.status == "FAIL" and "rocep1s0f1 DOWN" in c.detail and "R0_HCAS" in c.fix
    [c] = get(run(over, good()), "rdma", "worker1")
    assert c.status == "FAIL" and "mlx5_9 not found" in c.detail
    lab = load_config({"WORKER": "u@w", **{f"{n}_{k}": v for n, ip in (("HEAD", ".11"), ("WORKER", ".13"))
                       for k, v in (("IP", "198.51.100" + ip), ("IFNAME", "enp1s0f1np1"),
                                    ("HCAS", "lab_rdma0"), ("GID_INDEX", "3"))}})
    f = good()
    for r in f:
        f[r]["fabric"].update(present=False, devices=[])
    res = run(lab, f, skip={"rdma"})
    assert status(res, "fabric") == {"PASS"} and status(res, "rdma") == {"WARN"}
    assert "no RDMA devices" in get(res, "rdma")[0].detail


def report(cfg, facts, as_json=False):
    return preflight.report(cfg, preflight.Gathered(facts, head_fabric.decide_all(cfg, facts)), as_json)


def test_report_lines_json_and_exit_code(cfg, capsys):
    assert report(cfg, good()) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("PASS  reachable") and out[-1].endswith("0 failed")
    f = good()
    f[1]["kernel"]["release"] = "7.0.0-1019-nvidia"
    assert report(cfg, copy.deepcopy(f), as_json=True) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False
    [c] = [c for c in doc["checks"] if c["status"] == "FAIL"]
    assert c["name"] == "kernel" and c["node"] == "worker1" and "kho=off" in c["fix"]
    assert report(cfg, f) == 1
    assert [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("FAIL")] == [
        "FAIL  kernel           worker1: 7.0.0-1019-nvidia without kho=off: NCCL memory registration "
        "(ibv_reg_mr) fails with ENOMEM -- fix: add kho=off to GRUB_CMDLINE_LINUX in /etc/default/grub, "
        "sudo update-grub, reboot (or boot another kernel)"]


def test_ib_write_bw_output_and_missing_tool(cfg):
    # stand-in: the result table ib_write_bw --report_gbits prints (no RDMA here to produce one)
    text = (" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
            " 65536      1071060          0.00               112.31             0.214213\n")
    assert fabric_bench.parse_ib_write_bw(text) == 112.31
    assert fabric_bench.parse_ib_write_bw("Couldn't connect to 198.51.100.13:18515") is None
    if shutil.which("ib_write_bw"):
        pytest.skip("ib_write_bw is installed here")
    with pytest.raises(UserError, match="ib_write_bw is not installed on the head: .*apt-get install perftest"):
        fabric_bench.fabric_bench(cfg)


# ---- gathering for real ----------------------------------------------------------------------------

def test_gather_facts_head_and_worker_over_ssh(loopback_sshd, tmp_path, capsys):  # noqa: F811
    # the head is this machine; the worker is this machine again behind a real sshd
    cfg = load_config({"WORKER": loopback_sshd.target, "SSH_OPTS": loopback_sshd.ssh_opts,
                       "STATE_DIR": str(tmp_path / "state"), "MODEL_DIR": str(tmp_path / "models" / "M"),
                       "HEAD_IP": "127.0.0.1", "HEAD_IFNAME": "lo", "WORKER_IP": "127.0.0.1",
                       "WORKER_IFNAME": "lo"})
    facts = preflight.gather(Cluster(cfg)).facts
    assert capsys.readouterr().err.splitlines() == ["facts: head", f"facts: worker1 ({loopback_sshd.target})"]
    assert set(facts) == {0, 1} and "error" not in facts[0] and "error" not in facts[1], facts
    assert facts[0]["ports"] == {"8000": False, "29655": False, "18000": False} and facts[1]["ports"] == {}
    assert os.path.isdir(tmp_path / "state" / "lib" / "dsv41")   # code shipped to the worker's state dir
    assert facts[1]["_t0"] <= facts[1]["_t1"]
    # pings folded into the one facts call per node: the peers' addresses were known from overrides
    for r in (0, 1):
        [p] = facts[r]["pings"]
        assert p["peer"] == "127.0.0.1" and p["ifname"] == "lo" and p["size"] == facts[r]["mtus"]["lo"] - 28
    res = preflight.checks(cfg, facts)
    assert status(res, "reachable") == {"PASS"}
    if not os.path.exists("/sys/class/infiniband"):
        assert status(res, "fabric") == {"FAIL"}


def test_unreachable_worker_is_a_fail_line(tmp_path, capsys):
    cfg = load_config({"WORKER": "root@127.0.0.1", "STATE_DIR": str(tmp_path / "s"),
                       "SSH_OPTS": "-p 1 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"})
    assert preflight.task(cfg) is False
    out = capsys.readouterr().out
    assert "FAIL  reachable        worker1: cannot reach worker1 (root@127.0.0.1)" in out


def test_three_nodes_every_pair_pings_both_ways():
    cfg = load_config({"WORKERS": "u@198.51.100.13,u@198.51.100.14"})
    f = good()
    f[2] = node_facts("198.51.100.14")
    f[0]["pings"].append({"peer": "198.51.100.14", "ok": True, "size": 8972, "ifname": "enp1s0f1np1"})
    f[1]["pings"].append({"peer": "198.51.100.14", "ok": True, "size": 8972, "ifname": "enp1s0f1np1"})
    f[2]["pings"] = [{"peer": ip, "ok": True, "size": 8972, "ifname": "enp1s0f1np1"}
                     for ip in ("198.51.100.11", "198.51.100.13")]
    res = run(cfg, f)
    pairs = sorted(c.detail.split(":")[0] for c in get(res, "ping"))
    assert pairs == sorted(f"{a} -> {b} {ip}" for a, b, ip in (
        ("head", "worker1", "198.51.100.13"), ("worker1", "head", "198.51.100.11"),
        ("head", "worker2", "198.51.100.14"), ("worker2", "head", "198.51.100.11"),
        ("worker1", "worker2", "198.51.100.14"), ("worker2", "worker1", "198.51.100.13")))
    assert status(res, "ping") == {"PASS"}
    f[2]["pings"][1].update(ok=False, error="100% packet loss")             # worker2 cannot reach worker1
    [bad] = [c for c in get(run(cfg, f), "ping") if c.status == "FAIL"]
    assert bad.detail.startswith("worker2 -> worker1 198.51.100.13")


def test_json_shape_is_versioned(cfg, capsys):
    """`doit preflight --json` is for scripts: its shape is pinned (bump the schema to change it)."""
    report(cfg, good(), as_json=True)
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"schema", "ok", "checks"} and doc["schema"] == "dsv41.preflight/1"
    assert isinstance(doc["ok"], bool) and doc["checks"]
    for c in doc["checks"]:
        assert set(c) == {"name", "status", "detail", "fix", "node"} and c["status"] in ("PASS", "WARN", "FAIL")
        assert all(isinstance(v, str) for v in c.values())


def test_without_the_gateway_preflight_says_in_one_line_who_reaches_the_model():
    for env, want in (({}, "PASS"), ({"GATEWAY": "0"}, "WARN")):
        [c] = get(run(load_config({"WORKER": "u@198.51.100.13", **env}), good()), "door")
        assert c.status == want and ("/invocations" in c.line()) == (want == "WARN"), c.line()
