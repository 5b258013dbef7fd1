"""`python3 -m dsv41.node.facts` run for real: on this machine, and inside network namespaces joined by a
veth "fabric" (real don't-fragment pings, real MTUs, real ethtool). The sysfs trees are stand-ins."""
import json
import os
import shutil
import socket
import subprocess

import pytest

from test_fabric import LIB, PY, Netns, make_sysfs, need_netns, roce_gids


def run_facts(*args, ns=None):
    argv = [PY, "-m", "dsv41.node.facts", *map(str, args)]
    if ns:
        r = ns.run(argv)
    else:
        r = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": LIB})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_facts_of_this_machine(tmp_path):
    model = tmp_path / "models" / "M"
    with socket.socket() as busy, socket.socket() as spare:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        spare.bind(("127.0.0.1", 0))  # bound, not listening: free for a server
        used, free = busy.getsockname()[1], spare.getsockname()[1]
        f = run_facts("--model-dir", model, "--ports", f"{used},{free}", "--sysfs", tmp_path)
    assert f["ports"] == {str(used): True, str(free): False}
    assert f["disk"]["model_dir"] == str(model) and f["disk"]["checked"] == str(tmp_path)
    assert f["disk"]["model_bytes"] == 0 and f["disk"]["free_bytes"] > 0
    assert 0 < f["memory"]["available_bytes"] <= f["memory"]["total_bytes"]
    assert f["kernel"]["release"] == os.uname().release
    assert f["kernel"]["cmdline"] == open("/proc/cmdline").read().strip()
    assert f["tools"]["python3"] is True and isinstance(f["time"], float)
    assert f["fabric"]["present"] is False and f["detected"]["missing"]
    assert any(a["ip"] == "127.0.0.1" for a in f["fabric"]["addrs"])  # the real `ip` output
    d = f["docker"]
    assert d["kind"] in ("ok", "missing", "permission", "daemon", "timeout", "other")
    assert d["ok"] == (d["kind"] == "ok") and (d["ok"] or d["error"])
    assert f["units"]["files"] == sorted(n for n in os.listdir("/etc/systemd/system")
                                         if n.startswith("dsv41-") and n.endswith((".service", ".socket")))


def test_the_units_installed_include_the_socket_that_holds_port(tmp_path):
    """Preflight's port check reads which of ours hold PORT: the gateway's socket unit is listed with the services."""
    for name in ("dsv41-gateway.socket", "dsv41-gateway.service", "dsv41-r0.service", "other.socket", "dsv41-x.timer"):
        (tmp_path / name).write_text("[Unit]\n")
    f = run_facts("--unit-dir", tmp_path)
    assert f["units"]["files"] == ["dsv41-gateway.service", "dsv41-gateway.socket", "dsv41-r0.service"]


def test_model_bytes_count_what_is_there(tmp_path):
    model = tmp_path / "M"
    (model / "sub").mkdir(parents=True)
    (model / "a.safetensors").write_bytes(b"x" * 1000)
    (model / "sub" / "b").write_bytes(b"y" * 24)
    f = run_facts("--model-dir", model)
    assert f["disk"]["model_bytes"] == 1024 and f["disk"]["checked"] == str(model)


def test_bad_ports_is_one_line():
    r = subprocess.run([PY, "-m", "dsv41.node.facts", "--ports", "80,http"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": LIB})
    assert r.returncode == 2 and r.stderr == "dsv41: --ports '80,http': expected a comma list of port numbers\n"


@pytest.fixture
def pair():
    """Two namespaces, head and worker, joined by a veth with MTU 9000 (a stand-in fabric)."""
    need_netns()
    head, worker = Netns(), Netns()
    try:
        head.veth("fab0", "198.51.100.11/24", mtu=9000, peer_ns=worker, peer_addr="198.51.100.13/24")
        yield head, worker
    finally:
        head.delete()
        worker.delete()


def test_ping_over_the_fabric_and_mtu_mismatch(pair, tmp_path):
    head, worker = pair
    if not shutil.which("ping"):
        pytest.skip("ping is not installed (apt-get install iputils-ping)")
    sysfs = make_sysfs(tmp_path / "h", [("rocep1s0f1", "ACTIVE", ["fab0"], roce_gids("198.51.100.11"))])
    f = run_facts("--sysfs", sysfs, "--peer", "198.51.100.13", "--ping", "198.51.100.13", ns=head)
    assert f["detected"]["ifname"] == "fab0" and f["detected"]["gid_index"] == 3
    assert f["mtus"]["fab0"] == 9000
    want = "ethtool" if shutil.which("ethtool") else "sysfs (ethtool missing)"
    assert f["speeds"]["fab0"]["source"] == want   # a veth reports 10000Mb/s or nothing
    [p] = f["pings"]
    assert p["ok"] and p["size"] == 8972 and p["ifname"] == "fab0"
    assert p["command"] == "ping -M do -s 8972 -c 1 -W 2 -I fab0 198.51.100.13"
    # the worker's end falls back to 1500 (as after a firmware reboot): the big ping fails both ways
    worker.ip("link", "set", "fab0p", "mtu", "1500")
    [p] = run_facts("--sysfs", sysfs, "--ping", "198.51.100.13", ns=head)["pings"]
    assert not p["ok"] and p["error"]
    w = run_facts("--ping-only", "--ifname", "fab0p", "--ping", "198.51.100.11", ns=worker)
    assert set(w) == {"hostname", "pings", "time"}
    assert w["pings"][0]["size"] == 1472 and w["pings"][0]["ok"]
    worker.ip("link", "set", "fab0p", "mtu", "9000")
    w = run_facts("--ping-only", "--ifname", "fab0p", "--ping", "198.51.100.11", ns=worker)
    assert w["pings"][0]["size"] == 8972 and w["pings"][0]["ok"]


# ---- systemd-logind's RemoveIPC, from fake conf trees ------------------------------------------------

def conf(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize("files,want", [
    ({}, (True, "default")),
    ({"etc/systemd/logind.conf": "[Login]\n#RemoveIPC=no\nKillUserProcesses=no\n"}, (True, "default")),
    ({"etc/systemd/logind.conf": "[Login]\nRemoveIPC = no\n"}, (False, "etc/systemd/logind.conf")),
    ({"usr/lib/systemd/logind.conf": "[Login]\nRemoveIPC=no\n",
      "etc/systemd/logind.conf": "[Login]\n"}, (True, "default")),          # only the first main file counts
    ({"etc/systemd/logind.conf": "[Login]\nRemoveIPC=no\n",
      "usr/lib/systemd/logind.conf.d/10-x.conf": "[Login]\nRemoveIPC=yes\n"},
     (True, "usr/lib/systemd/logind.conf.d/10-x.conf")),                    # drop-ins come after the main file
    ({"usr/lib/systemd/logind.conf.d/50-a.conf": "[Login]\nRemoveIPC=yes\n",
      "etc/systemd/logind.conf.d/50-a.conf": "[Login]\nRemoveIPC=no\n"},
     (False, "etc/systemd/logind.conf.d/50-a.conf")),                       # /etc hides the same name
    ({"etc/systemd/logind.conf.d/10-a.conf": "[Login]\nRemoveIPC=no\n",
      "usr/lib/systemd/logind.conf.d/90-b.conf": "[Login]\nRemoveIPC=yes\n"},
     (True, "usr/lib/systemd/logind.conf.d/90-b.conf")),                    # file-name order across dirs
    ({"etc/systemd/logind.conf": "[Other]\nRemoveIPC=no\n"}, (True, "default")),
    ({"etc/systemd/logind.conf.d/x.conf.disabled": "[Login]\nRemoveIPC=no\n"}, (True, "default")),
])
def test_remove_ipc_from_conf_trees(tmp_path, files, want):
    from dsv41.node import facts
    for rel, text in files.items():
        conf(tmp_path, rel, text)
    value, source = facts.remove_ipc(str(tmp_path))
    assert (value, source if source == "default" else os.path.relpath(source, tmp_path)) == want


def test_system_uid_max_and_ipc_facts_of_this_machine(tmp_path):
    from dsv41.node import facts
    conf(tmp_path, "etc/login.defs", "# comment\nSYS_UID_MAX\t\t500\n")
    assert facts.system_uid_max(str(tmp_path / "etc/login.defs")) == 500
    assert facts.system_uid_max(str(tmp_path / "missing")) == 999
    ipc = run_facts()["ipc"]
    assert isinstance(ipc["remove_ipc"], bool) and ipc["rank_uids"] == {}


# ---- the engine's caches (node.probe's "caches", read by status and before the ranks start) -------------

def cache_tree(root, files):
    """files: {path under root: bytes}."""
    for rel, size in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"k" * size)


def run_probe_caches(state_dir, key):
    req = {"state_dir": str(state_dir), "caches": key}
    r = subprocess.run([PY, "-m", "dsv41.node.probe", json.dumps(req)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": LIB})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["caches"]


def test_the_probe_reports_each_librarys_cache_and_two_ranks_holding_the_same_kernels_match(tmp_path):
    """Sizes and file counts per library folder; a fingerprint that is the same on two ranks holding the
    same kernels (vLLM's per-rank folder named alike, a compile's temporary and lock files left out) and
    differs when one rank holds a kernel the other does not, or a file of another size."""
    key = "5668e35e5ee0"
    same = {"triton/ab/k.cubin": 1000, "triton/ab/k.json": 24, "flashinfer/.cache/flashinfer/121/op.so": 500}
    cache_tree(tmp_path / "r0/cache" / key, {**same, "vllm/torch_compile_cache/f00/rank_0_0/backbone/a.py": 70,
                                             "deep_gemm/tmp/9f/kernel.cu": 5, "triton/ab/.k.cubin.tmp.pid_7": 9,
                                             "flashinfer/.cache/flashinfer/121/op.lock": 0})
    cache_tree(tmp_path / "r1/cache" / key, {**same, "vllm/torch_compile_cache/f00/rank_1_0/backbone/a.py": 70})
    cache_tree(tmp_path / "r1/cache", {"0123456789ab/triton/old.cubin": 3, "b12x/left.o": 1})
    r0, r1 = run_probe_caches(tmp_path / "r0", key), run_probe_caches(tmp_path / "r1", key)
    assert r0["key"] == key and list(r0["libraries"]) == ["vllm", "torchinductor", "triton", "flashinfer",
                                                         "tilelang", "cutedsl", "deep_gemm", "b12x", "b12x-roce"]
    assert {k: (v["bytes"], v["files"]) for k, v in r0["libraries"].items() if v["files"]} == {
        "vllm": (70, 1), "triton": (1024, 2), "flashinfer": (500, 1)}
    assert r0["libraries"]["tilelang"] == r1["libraries"]["tilelang"] == {
        "bytes": 0, "files": 0, "fingerprint": r0["libraries"]["cutedsl"]["fingerprint"]}    # absent: empty
    assert all(r0["libraries"][f] == r1["libraries"][f] for f in r0["libraries"])
    assert (r0["others"], r1["others"]) == ([], ["0123456789ab", "b12x"])
    cache_tree(tmp_path / "r1/cache" / key, {"triton/cd/k2.cubin": 1000, "flashinfer/.cache/flashinfer/121/op.so": 501})
    r1 = run_probe_caches(tmp_path / "r1", key)
    for folder in ("triton", "flashinfer"):
        assert r0["libraries"][folder]["fingerprint"] != r1["libraries"][folder]["fingerprint"], folder
    assert r0["libraries"]["vllm"] == r1["libraries"]["vllm"]


def test_a_cache_walk_cut_short_gives_no_fingerprint(tmp_path):
    from dsv41.node.facts import cache_report
    cache_tree(tmp_path / "k", {f"triton/{i}.cubin": 1 for i in range(5)} | {"vllm/a.py": 1})
    short = cache_report(str(tmp_path), "k", files_max=3)["libraries"]      # vLLM's folder is walked first
    assert short["vllm"]["fingerprint"] and short["triton"] == {"bytes": 2, "files": 2, "fingerprint": None}
    cut = cache_report(str(tmp_path), "k", walk_s=-1)["libraries"]
    assert cut["vllm"]["fingerprint"] is None and cut["tilelang"]["fingerprint"] is not None   # nothing to walk
    whole = cache_report(str(tmp_path), "k")["libraries"]
    assert whole["triton"]["files"] == 5 and whole["triton"]["fingerprint"] is not None
