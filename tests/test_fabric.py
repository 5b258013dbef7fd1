"""Fabric detection against fake sysfs trees whose netdevs are REAL veth interfaces inside a network
namespace this test creates (addresses come from the real `ip -j -4 addr` there), and the head's
resolution over overrides. The sysfs trees are stand-ins: this machine has no RDMA devices."""
import ipaddress
import itertools
import json
import os
import shutil
import subprocess

import pytest

from dsv41.head.core import fabric as head_fabric
from dsv41.node import fabric
from dsv41.settings.layers import load_config
from dsv41.errors import UserError

LIB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib")
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"  # the node's system python
V1, V2 = "IB/RoCE v1", "RoCE v2"
_seq = itertools.count()


def resolve(cfg, facts):
    return head_fabric.resolve(cfg, head_fabric.decide_all(cfg, facts))


def mapped(ip):
    return ipaddress.IPv6Address("::ffff:" + ip).exploded


def roce_gids(ip):
    """A typical RoCE port: link-local v1+v2, then the IPv4-mapped address v1 (2) and v2 (3)."""
    return [(0, "fe80:0000:0000:0000:0000:00ff:fe00:0001", V1), (1, "fe80:0000:0000:0000:0000:00ff:fe00:0001", V2),
            (2, mapped(ip), V1), (3, mapped(ip), V2)]


def make_sysfs(root, devices):
    """Stand-in for /sys/class/infiniband: devices = [(name, state, [netdevs], [(index, gid, type)])]."""
    ib = root / "class" / "infiniband"
    ib.mkdir(parents=True)
    for name, state, netdevs, gids in devices:
        port = ib / name / "ports" / "1"
        for d in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            (port / d).mkdir(parents=True)
        (port / "state").write_text({"ACTIVE": "4: ACTIVE", "DOWN": "1: DOWN"}[state] + "\n")
        (port / "rate").write_text("200 Gb/sec (4X NDR)\n")
        for n in netdevs:
            (ib / name / "device" / "net" / n).mkdir(parents=True)
        for i in range(8):  # unused entries are all zeros, as in sysfs
            (port / "gids" / str(i)).write_text(fabric.ZERO_GID + "\n")
        for i, gid, typ in gids:
            (port / "gids" / str(i)).write_text(gid + "\n")
            (port / "gid_attrs" / "types" / str(i)).write_text(typ + "\n")
            (port / "gid_attrs" / "ndevs" / str(i)).write_text(netdevs[0] + "\n")
    return root


class Netns:
    """A network namespace with veth pairs; both ends stay inside it."""

    def __init__(self):
        self.name = f"dsv41t-{os.getpid()}-{next(_seq)}"
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        self.ip("link", "set", "lo", "up")

    def ip(self, *args):
        subprocess.run(["ip", "-n", self.name, *args], check=True, capture_output=True)

    def veth(self, name, addr=None, mtu=None, peer_ns=None, peer_addr=None):
        """veth `name` (+ address) here; its other end `<name>p` here or in peer_ns."""
        other = peer_ns.name if peer_ns else self.name
        self.ip("link", "add", name, *(["mtu", str(mtu)] if mtu else []), "type", "veth",
                "peer", "name", name + "p", *(["mtu", str(mtu)] if mtu else []), "netns", other)
        if addr:
            self.ip("addr", "add", addr, "dev", name)
        if peer_addr:
            subprocess.run(["ip", "-n", other, "addr", "add", peer_addr, "dev", name + "p"], check=True)
        self.ip("link", "set", name, "up")
        subprocess.run(["ip", "-n", other, "link", "set", name + "p", "up"], check=True)

    def run(self, argv, **kw):
        env = {**os.environ, "PYTHONPATH": LIB}
        return subprocess.run(["ip", "netns", "exec", self.name, *argv], capture_output=True, text=True,
                              env=env, **kw)

    def delete(self):
        subprocess.run(["ip", "netns", "del", self.name], check=False)


def need_netns():
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("network namespaces need root and iproute2 (apt-get install iproute2)")


@pytest.fixture
def ns():
    need_netns()
    n = Netns()
    yield n
    n.delete()


def detect(ns, sysfs, peer=None, json_out=True):
    argv = [PY, "-m", "dsv41.node.fabric", "detect", "--sysfs", str(sysfs)]
    argv += ["--peer", peer] if peer else []
    argv += ["--json"] if json_out else []
    r = ns.run(argv)
    if r.returncode == 0 and json_out:
        return 0, json.loads(r.stdout)
    return r.returncode, r.stdout + r.stderr


# ---- detection on one node ------------------------------------------------------------------------

def test_one_active_port_with_ipv4(ns, tmp_path):
    ns.veth("fab0", "198.51.100.11/24")
    sysfs = make_sysfs(tmp_path, [("rocep1s0f1", "ACTIVE", ["fab0"], roce_gids("198.51.100.11"))])
    assert detect(ns, sysfs) == (0, {"ifname": "fab0", "ip": "198.51.100.11", "hcas": ["rocep1s0f1"],
                                     "gid_index": 3})
    code, text = detect(ns, sysfs, json_out=False)
    assert code == 0
    assert "fab0" in text and "198.51.100.11/24" in text and "rocep1s0f1" in text and "3 (RoCE v2)" in text


def test_two_active_ports_picks_the_one_on_the_peers_subnet(ns, tmp_path):
    ns.veth("fab0", "198.51.100.11/26")   # 198.51.100.0/26: not where the peer is
    ns.veth("fab1", "198.51.100.75/26")   # 198.51.100.64/26: cabled to the peer
    sysfs = make_sysfs(tmp_path, [("rocep1s0f0", "ACTIVE", ["fab0"], roce_gids("198.51.100.11")),
                                  ("rocep1s0f1", "ACTIVE", ["fab1"], roce_gids("198.51.100.75")[:3]
                                   + [(5, mapped("198.51.100.75"), V2)])])
    assert detect(ns, sysfs, peer="198.51.100.70") == (
        0, {"ifname": "fab1", "ip": "198.51.100.75", "hcas": ["rocep1s0f1"], "gid_index": 5})
    # without a peer: the first port, and only HCAs on its own subnet
    assert detect(ns, sysfs)[1]["hcas"] == ["rocep1s0f0"]
    code, text = detect(ns, sysfs, peer="198.51.100.200")
    assert code == 2 and text.count("\n") == 1
    assert "peer's subnet (198.51.100.200)" in text and "fab0=198.51.100.11/26" in text and "HEAD_IP" in text


def test_twin_hcas_on_one_netdev_are_both_listed(ns, tmp_path):
    ns.veth("fab0", "198.51.100.11/24")
    gids = roce_gids("198.51.100.11")
    sysfs = make_sysfs(tmp_path, [("rocep1s0f1", "ACTIVE", ["fab0"], gids),
                                  ("roceP2p1s0f1", "ACTIVE", ["fab0"], gids)])
    code, out = detect(ns, sysfs, peer="198.51.100.13")
    assert code == 0 and sorted(out["hcas"]) == ["roceP2p1s0f1", "rocep1s0f1"] and out["gid_index"] == 3


def test_active_port_without_ipv4_is_skipped(ns, tmp_path):
    ns.veth("fab2")                       # up, no address
    ns.veth("fab0", "198.51.100.11/24")
    sysfs = make_sysfs(tmp_path, [("rocep1s0f0", "ACTIVE", ["fab2"], []),
                                  ("rocep1s0f1", "ACTIVE", ["fab0"], roce_gids("198.51.100.11"))])
    assert detect(ns, sysfs) == (0, {"ifname": "fab0", "ip": "198.51.100.11", "hcas": ["rocep1s0f1"],
                                     "gid_index": 3})
    only = make_sysfs(tmp_path / "only", [("rocep1s0f0", "ACTIVE", ["fab2"], [])])
    code, text = detect(ns, only)
    assert code == 2 and "rocep1s0f0 ACTIVE (fab2=no IPv4)" in text


def test_down_port_is_ignored_even_on_the_same_subnet(ns, tmp_path):
    ns.veth("fab3", "198.51.100.12/24")
    ns.veth("fab0", "198.51.100.11/24")
    down = ("rocep1s0f0", "DOWN", ["fab3"], roce_gids("198.51.100.12"))
    sysfs = make_sysfs(tmp_path, [down, ("rocep1s0f1", "ACTIVE", ["fab0"], roce_gids("198.51.100.11"))])
    assert detect(ns, sysfs, peer="198.51.100.13")[1]["hcas"] == ["rocep1s0f1"]
    code, text = detect(ns, make_sysfs(tmp_path / "down", [down]))
    assert code == 2 and "rocep1s0f0 DOWN (fab3=198.51.100.12/24)" in text


def test_gid_table_only_the_v2_mapped_entry_of_the_fabric_address_matches(ns, tmp_path):
    ns.veth("fab0", "198.51.100.11/24")
    gids = [(0, "fe80:0000:0000:0000:0000:00ff:fe00:0001", V1), (1, "fe80:0000:0000:0000:0000:00ff:fe00:0001", V2),
            (2, mapped("198.51.100.11"), V1), (3, mapped("198.51.100.99"), V2),
            (4, "2001:0db8:0000:0000:0000:0000:0000:0011", V2), (6, mapped("198.51.100.11"), V2)]
    sysfs = make_sysfs(tmp_path, [("rocep1s0f1", "ACTIVE", ["fab0"], gids)])
    assert detect(ns, sysfs)[1]["gid_index"] == 6
    no_v2 = make_sysfs(tmp_path / "v1", [("rocep1s0f1", "ACTIVE", ["fab0"], gids[:5])])
    code, text = detect(ns, no_v2)
    assert code == 2 and "no RoCE v2 GID maps 198.51.100.11 on rocep1s0f1" in text and "GID_INDEX" in text


def test_no_infiniband_class_in_a_fake_tree(ns, tmp_path):
    (tmp_path / "class").mkdir()
    code, text = detect(ns, tmp_path)
    assert code == 2
    assert text.startswith("dsv41: ") and text.count("\n") == 1
    assert "no RDMA devices" in text and "HEAD_IP/HEAD_IFNAME/HEAD_HCAS" in text and "R<N>_IP" in text


def test_no_rdma_on_this_machine_for_real():
    if os.path.exists("/sys/class/infiniband"):
        pytest.skip("this machine has RDMA devices")
    r = subprocess.run([PY, "-m", "dsv41.node.fabric", "detect", "--json"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": LIB})
    assert r.returncode == 2 and r.stdout == ""
    assert "no RDMA devices (/sys/class/infiniband is missing)" in r.stderr and "Traceback" not in r.stderr


def test_bad_peer_is_one_line():
    r = subprocess.run([PY, "-m", "dsv41.node.fabric", "detect", "--peer", "10.0.0"], capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": LIB})
    assert r.returncode == 2 and r.stderr == "dsv41: --peer '10.0.0' is not an IPv4 address\n"


# ---- overrides over detected facts (pure) ---------------------------------------------------------

def facts(addrs, devices):
    """Node facts as dsv41.node.facts reports them (fabric section only)."""
    return {"fabric": {"present": True, "addrs": [
        {"ifname": i, "ip": a.split("/")[0], "prefixlen": int(a.split("/")[1]), "mtu": 9000, "operstate": "UP"}
        for i, a in addrs], "devices": [
        {"name": n, "state": st, "netdevs": nd, "rate": None,
         "gids": [{"index": i, "gid": g, "type": t, "ndev": nd[0]} for i, g, t in gids]}
        for n, st, nd, gids in devices]}}


HEAD = facts([("enp1s0f1np1", "198.51.100.11/24"), ("wlan0", "192.0.2.50/24")],
             [("rocep1s0f1", "ACTIVE", ["enp1s0f1np1"], roce_gids("198.51.100.11"))])
WORKER = facts([("enp1s0f0np0", "198.51.100.140/26"), ("enp1s0f1np1", "198.51.100.13/26")],
               [("rocep1s0f0", "ACTIVE", ["enp1s0f0np0"], roce_gids("198.51.100.140")),
                ("rocep1s0f1", "ACTIVE", ["enp1s0f1np1"], roce_gids("198.51.100.13")[:2]
                 + [(4, mapped("198.51.100.13"), V2)])])


def cfg_with(**env):
    return load_config({"WORKER": "root@worker.lab", **env})


def test_resolve_detects_worker_port_on_the_heads_subnet():
    out = resolve(cfg_with(), {0: HEAD, 1: WORKER})
    assert out == {0: head_fabric.Fabric("198.51.100.11", "enp1s0f1np1", ("rocep1s0f1",), 3),
                   1: head_fabric.Fabric("198.51.100.13", "enp1s0f1np1", ("rocep1s0f1",), 4)}


def test_overrides_win_over_detection():
    cfg = cfg_with(WORKER_IFNAME="enp1s0f0np0", HEAD_HCAS="mlx5_9", NCCL_IB_GID_INDEX="7")
    out = resolve(cfg, {0: HEAD, 1: WORKER})
    assert out[0] == head_fabric.Fabric("198.51.100.11", "enp1s0f1np1", ("mlx5_9",), 7)
    assert out[1] == head_fabric.Fabric("198.51.100.140", "enp1s0f0np0", ("rocep1s0f0",), 7)
    assert resolve(cfg_with(R1_GID_INDEX="2"), {0: HEAD, 1: WORKER})[1].gid_index == 2


def test_undetectable_value_raises_one_line_naming_the_variable():
    bare = {"fabric": {"present": False, "devices": [], "addrs": HEAD["fabric"]["addrs"]}}
    with pytest.raises(UserError) as err:
        resolve(cfg_with(), {0: HEAD, 1: bare})
    msg = str(err.value)
    assert msg.startswith("worker1: ") and "\n" not in msg
    assert "no RDMA devices" in msg and "WORKER_IP/WORKER_IFNAME/WORKER_HCAS" in msg and "R1_IP" in msg
    with pytest.raises(UserError, match="worker1: no fabric facts .*cannot reach"):
        resolve(cfg_with(), {0: HEAD, 1: {"error": "cannot reach worker1"}})


def test_full_overrides_need_no_node():
    env = dict(HEAD_IP="198.51.100.11", HEAD_IFNAME="fab0", HEAD_HCAS="a,b", WORKER_IP="198.51.100.13",
               WORKER_IFNAME="fab1", WORKER_HCAS="c", NCCL_IB_GID_INDEX="3")
    want = {0: head_fabric.Fabric("198.51.100.11", "fab0", ("a", "b"), 3),
            1: head_fabric.Fabric("198.51.100.13", "fab1", ("c",), 3)}
    assert head_fabric.from_overrides(cfg_with(**env)) == want
    assert resolve(cfg_with(**env), {}) == want
    env.pop("NCCL_IB_GID_INDEX")
    assert head_fabric.from_overrides(cfg_with(**env)) is None
    assert head_fabric.from_overrides(cfg_with(**env, R0_GID_INDEX="1", R1_GID_INDEX="2"))[1].gid_index == 2
