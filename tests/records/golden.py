"""Golden outputs for fixed inputs: the text `doit plan` prints, the units `doit render` writes, the
steps decide() takes (with and without the gateway) and what `doit releases` and `doit status` say of a
release history walked through the release machine's moves, as {case name: text} from the dsv41 on
sys.path. No node is contacted: the facts
and probe answers below stand in for the nodes' own.

    PYTHONPATH=<tree>/lib python tests/records/golden.py <out dir>    writes one .txt per case"""
import contextlib
import copy
import io
import ipaddress
import os
import pathlib
import shutil
import sys
import tempfile
from unittest import mock

from dsv41.errors import UserError
from dsv41.head import plan, render
from dsv41.head.core import cluster, fabric, nodes, preflight, state
from dsv41.head.core.decide import decide, sha
from dsv41.head.core.desired import desired
from dsv41.settings import layers, paths

KEY = "k" * 43
PLAN = '{"qdir": "qn:q31:q31s", "k": 1}'
TWO = {"WORKER": "root@198.51.100.13"}
THREE = {"WORKERS": "root@198.51.100.13,root@198.51.100.14"}
ALL_GIVEN = {"HEAD_IP": "198.51.100.11", "HEAD_IFNAME": "fab0", "HEAD_HCAS": "mlx5_0", "HEAD_GID_INDEX": "3",
             "WORKER_IP": "198.51.100.13", "WORKER_IFNAME": "fab0", "WORKER_HCAS": "mlx5_0",
             "WORKER_GID_INDEX": "3"}
PROFILE = """\
kv_bytes = 2500000000
nccl_ib_gid_index = 7
served_model_name = "golden-model"
port = 8100
memguard_gib = 2.5
memguard_mode = "observe"
gpus = ""
memlock = "8388608"
privileged = false
worker_model_dir = "~/models/golden"
[overrides]
R0_GID_INDEX = 0
R1_GID_INDEX = "5"
R1_IFNAME = "enp1s0f0np0"
R1_HCAS = "mlx5_7"
[args]
--max-num-seqs = "4"
[env]
NCCL_DEBUG = "INFO"
"""
UNREACHABLE = ("cannot reach worker1 (root@198.51.100.13): ssh: connect to host 198.51.100.13 port 22: "
               "Connection refused")


def fabric_facts(ip):
    """A node's facts as dsv41.node.facts reports them (the fabric part): one RoCE port on ip/24, GIDs
    link-local v1 and v2 (0, 1), then the IPv4-mapped address v1 (2) and v2 (3); a second port unused."""
    mapped = ipaddress.IPv6Address("::ffff:" + ip).exploded
    link = "fe80:0000:0000:0000:0000:00ff:fe00:0001"
    gids = [(0, link, "IB/RoCE v1"), (1, link, "RoCE v2"), (2, mapped, "IB/RoCE v1"), (3, mapped, "RoCE v2")]
    return {"fabric": {"present": True, "addrs": [
        {"ifname": "enp1s0f1np1", "ip": ip, "prefixlen": 24, "mtu": 9000, "operstate": "UP"},
        {"ifname": "enp1s0f0np0", "ip": "192.0.2." + ip.split(".")[-1], "prefixlen": 24, "mtu": 9000,
         "operstate": "UP"}],
        "devices": [{"name": "rocep1s0f1", "state": "ACTIVE", "netdevs": ["enp1s0f1np1"], "rate": None,
                     "gids": [{"index": i, "gid": g, "type": t, "ndev": "enp1s0f1np1"} for i, g, t in gids]}]}}


FACTS = {"head": fabric_facts("198.51.100.11"), "worker1": fabric_facts("198.51.100.13"),
         "worker2": fabric_facts("198.51.100.14")}


def probe_report(units, files=None, containers=(), image_id="sha256:abc"):
    """A probe's answer: the units {name: text or None (not installed)}, all active since @1000, and
    the containers running image_id."""
    return {"uid": 0, "image_id": image_id, "time": 5000.0, "tripped": None, "mem_available_kib": 100 << 20,
            "units": {name: {"installed": text is not None, "text": text, "ActiveState": "active",
                             "SubState": "running", "ActiveEnterTimestamp": "@1000", "NRestarts": "0"}
                      for name, text in units.items()},
            "containers": {c: {"state": {"Status": "running"}, "image": image_id} for c in containers},
            "files": files or {}}


def running(cl, want, installed=None):
    """Every node's probe answer when `want` is installed (a unit's text from `installed` when there),
    its state files written and its containers running."""
    return {n.name: probe_report({u: (installed or {}).get(u, t) for u, t in want.units[n.name].items()},
                                 {rel: sha(t) for rel, (t, _) in want.files[n.name].items()},
                                 cl.recipe.containers(cl.spec(n))) for n in cl.nodes}


@contextlib.contextmanager
def lab(tmp, env, facts=None):
    """load_config(env) with STATE_DIR and MODEL_DIR made afresh under tmp, profile `golden` in conf/,
    every node's home fixed and its facts taken from `facts` ({node name: facts}, default FACTS)."""
    for d in ("state", "model"):
        shutil.rmtree(pathlib.Path(tmp, d), ignore_errors=True)
    conf = pathlib.Path(tmp, "conf")
    conf.mkdir(exist_ok=True)
    (conf / "golden.toml").write_text(PROFILE)
    model = pathlib.Path(tmp, "model")
    # GATEWAY=0: the layout e8d141c had, rank 0 on PORT (the gateway's units and steps: test_units, test_decide)
    env = {"STATE_DIR": f"{tmp}/state", "MODEL_DIR": str(model), "GATEWAY": "0", **env}
    home = lambda node: "/home/op" if node.is_local else "/root"
    facts_call = lambda cl, node, args: copy.deepcopy((facts or FACTS)[node.name])
    with mock.patch.object(layers, "CONF_DIR", conf), mock.patch.object(nodes.Node, "home", home), \
            mock.patch.object(cluster.Cluster, "connect", lambda cl: []), \
            mock.patch.object(preflight, "_facts_call", facts_call), \
            contextlib.redirect_stderr(io.StringIO()):         # the progress lines
        cfg = layers.load_config(env)
        os.makedirs(cfg.state_dir, exist_ok=True)
        pathlib.Path(cfg.api_key_file).write_text(KEY + "\n")
        (model / "exl3" / "plan").mkdir(parents=True, exist_ok=True)
        (model / "exl3" / "plan" / cfg.plan_name).write_text(PLAN)
        yield cfg


def normalised(text, tmp):
    """Paths that differ per run and per checkout replaced by names (the interpreter first: it may be in
    the checkout)."""
    for path, name in ((sys.executable, "<python>"), (tmp, "<tmp>"), (str(paths.ROOT), "<root>")):
        text = text.replace(path, name)
    return text


def printed(fn, *args):
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            fn(*args)
    except UserError as err:
        print(f"error: {err}", file=out)
    return out.getvalue()


# ---- doit plan ---------------------------------------------------------------------------------------

def plan_text(tmp, env, probes=None, facts=None, installed=None):
    """doit plan's text; probes default to every desired unit installed (a unit's text from
    `installed` when there, else the rendered one), the state files written, the containers running."""
    with lab(tmp, env, facts) as cfg:
        if probes is None:
            cl = cluster.Cluster(cfg)
            probes = running(cl, desired(cl, preflight.resolved_fabric(cl), KEY, PLAN), installed)
        with mock.patch.object(cluster.Cluster, "probe",
                               lambda cl, node, versions=False: state.parse(probes[node.name])):
            return normalised(printed(plan.plan, cfg), tmp)


def plans(tmp):
    nothing = {n: probe_report({}, image_id="") for n in ("head", "worker1")}
    old_unit = {"dsv41-r1.service": "[Unit]\nDescription=dsv41 rank 1 (an older version)\n"}
    return {
        "plan-nothing-installed": plan_text(tmp, TWO, probes=nothing),
        "plan-one-unit-differs": plan_text(tmp, TWO, installed=old_unit),
        "plan-unchanged-gid-0-given": plan_text(tmp, {**ALL_GIVEN, **TWO, "HEAD_GID_INDEX": "0",
                                                      "NCCL_IB_GID_INDEX": "3"}),
        "plan-profile": plan_text(tmp, {**TWO, "DSV41_PROFILE": "golden"}),
        "plan-worker-unreachable": plan_text(tmp, TWO, probes=nothing,
                                             facts={**FACTS, "worker1": {"error": UNREACHABLE}}),
    }


# ---- doit render -------------------------------------------------------------------------------------

def rendered(tmp, env):
    """doit render's line, then each unit file it wrote, by rank."""
    with lab(tmp, env) as cfg:
        out = [printed(render.render, cfg)]
        for f in sorted(pathlib.Path(cfg.state_dir, "units").glob("r*/*")):
            out.append(f"==== {f.parent.name}/{f.name}\n{f.read_text()}")
    return normalised("".join(out), tmp)


def renders(tmp):
    return {
        "render-defaults": rendered(tmp, TWO),
        "render-profile-gid-0": rendered(tmp, {**TWO, "DSV41_PROFILE": "golden"}),
        # every fabric value given: no node asked, homes assumed from the ssh users
        "render-three-nodes": rendered(tmp, {**THREE, **{f"R{r}_{k}": v for r in range(3) for k, v in (
            ("IP", f"198.51.100.{(11, 13, 14)[r]}"), ("IFNAME", "fab0"), ("HCAS", "mlx5_0,mlx5_1"))},
            "HEAD_GID_INDEX": "0", "R2_GID_INDEX": "4", "NCCL_IB_GID_INDEX": "3", "R2_MODEL_DIR": "/data/m2",
            "WATCHDOG": "0", "TP_SIZE": "0"}),
    }


# ---- decide() ----------------------------------------------------------------------------------------

def steps(tmp, env, change=None, key=KEY, plan_json=PLAN, was=None):
    """decide()'s steps when the nodes run what `was` (default: env) resolves to and `change` is done
    to their probe answers, the new configuration being env."""
    def want_of(e, key=KEY, plan_json=PLAN):
        with lab(tmp, {**TWO, **ALL_GIVEN, **e}) as cfg:
            cl = cluster.Cluster(cfg)
            return cl, desired(cl, fabric.from_overrides(cfg) or preflight.resolved_fabric(cl), key, plan_json)
    reports = running(*want_of(env if was is None else was))
    (change or (lambda r: None))(reports)
    cl, new = want_of(env, key, plan_json)
    got = decide(cl.cfg.nodes, new, {n: state.parse(r) for n, r in reports.items()}, cl.recipe)
    return normalised("".join(f"{s.line()}\n" for s in got) or "no steps\n", tmp)


def unit(reports, node, name, **props):
    reports[node]["units"][name].update(props)


def decisions(tmp):
    cases = {
        "nothing changed": dict(env={}),
        "a rank setting changed": dict(env={"KV_BYTES": "2600000000"}, was={}),
        "the guard floor changed": dict(env={"MEMGUARD_GIB": "2"}, was={}),
        "the watchdog's interval changed": dict(env={"WATCHDOG_INTERVAL_S": "5"}, was={}),
        "WATCHDOG=0": dict(env={"WATCHDOG": "0"}, was={}),
        "a new image": dict(env={}, change=lambda r: [x.update(image_id="sha256:new") for x in r.values()]),
        "the guard stopped, a rank failed": dict(env={}, change=lambda r: (
            unit(r, "worker1", "dsv41-memguard.service", ActiveState="inactive"),
            unit(r, "worker1", "dsv41-r1.service", ActiveState="failed"))),
        "a worker restarted alone": dict(env={}, change=lambda r: unit(
            r, "worker1", "dsv41-r1.service", ActiveEnterTimestamp="@1100", NRestarts="1")),
        "the guard unit differs": dict(env={}, change=lambda r: unit(
            r, "head", "dsv41-memguard.service", text="[Unit]\n")),
        "model files replaced": dict(env={}, change=lambda r: r["worker1"].update(
            model_dir="/root/models/M", model_changed_at=1200.0)),
        "the EXL3 plan changed": dict(env={}, plan_json='{"qdir": "qn:q31", "k": 2}'),
        "the key not known yet": dict(env={}, key=None),
        "nothing installed": dict(env={}, change=lambda r: [x.update(
            units={u: {"installed": False, "text": None} for u in x["units"]}, files={}, containers={})
            for x in r.values()]),
    }
    return {"decide": "".join(f"== {what}\n{steps(tmp, **kw)}" for what, kw in cases.items()),
            "decide-gid-0-given": steps(tmp, {"WORKER_GID_INDEX": "0", "NCCL_IB_GID_INDEX": "3"},
                                        was={"NCCL_IB_GID_INDEX": "3"})}


def gateway_decisions(tmp):
    """decide()'s steps for the head's gateway: kept, stopped, its config or rank 0's key changed, turned
    off, turned on."""
    on = {"GATEWAY": "1"}
    cases = {
        "nothing changed": dict(env=on),
        "the gateway stopped": dict(env=on, change=lambda r: unit(r, "head", "dsv41-gateway.service",
                                                                  ActiveState="inactive")),
        "its config changed": dict(env={**on, "GATEWAY_TIMEOUT_S": "123"}, was=on),
        "rank 0's key changed": dict(env=on, key="n" * 43, was=on),
        "GATEWAY=0 after 1": dict(env={}, was=on),
        "GATEWAY=1 after 0": dict(env=on, was={}),
    }
    return {"decide-gateway": "".join(f"== {what}\n{steps(tmp, **kw)}" for what, kw in cases.items()),
            "render-gateway": rendered(tmp, {**TWO, **on})}


def release_walk(tmp):
    """A history walked through the release machine's moves (good, failed and rolled back, failed and
    down, one left rolling out), and what `doit releases`, `doit releases show N`, `doit rollback`'s
    refusal and status's release line say after each move."""
    from dsv41.head import releases as verb
    from dsv41.head.core import release_status, releases as rel
    out = []
    with lab(tmp, TWO) as cfg:
        state_dir, t = cfg.state_dir, 1_800_000_000.0

        def fields(kv):
            return {"image": "ghcr.io/x/engine@sha256:" + "ab" * 32, "image_ids": {"head": "sha256:" + "aa" * 32},
                    "checkpoint": {"repo": "o/m", "revision": "r1", "manifest_digest": "sha256:" + "11" * 32},
                    "settings": {"kv_bytes": kv}, "node_versions": {"head": {"kernel": "6.11", "driver": "580",
                                                                            "docker": "28"}},
                    "units": {"head": {"dsv41-r0.service": f"ExecStart=run --kv {kv}\n"}},
                    "files": {"head": {}}, "secret_files": {"head": []}}

        def said(move):
            entry = release_status.service_entry(state_dir)
            out.append(f"== {move}\n" + printed(verb.releases, cfg) + printed(verb.releases, cfg, ["show"])
                       + f"status: {release_status.service_line(entry)}\n")
        r = rel.begin(state_dir, fields(1), 10, now=t)
        said("release 1 rolling out")
        rel.finish(state_dir, r.number, rel.GOOD, "ready", startup_s=700.0, now=t + 700)
        said("release 1 good")
        r = rel.begin(state_dir, fields(2), 10, now=t + 1000)
        rel.finish(state_dir, r.number, rel.FAILED, "not ready in time", now=t + 1900, back_to=1)
        said("release 2 failed, going back to 1")
        rel.rolling_back(state_dir, r.number, now=t + 1901)
        rel.rolled_back(state_dir, r.number, 1, now=t + 2600)
        said("release 2 rolled back to 1")
        r = rel.begin(state_dir, fields(3), 10, now=t + 3000)
        rel.finish(state_dir, r.number, rel.FAILED, "a rank failed", now=t + 3100, back_to=1)
        rel.rolling_back(state_dir, r.number, now=t + 3101)
        rel.down(state_dir, r.number, "rank 0 did not start", now=t + 3900)
        said("release 3 down")
        out.append(printed(verb.rollback, cfg, ["3"]))
        rel.begin(state_dir, fields(4), 10, now=t + 4000)
        said("release 4 left rolling out")
    return {"releases-walk": normalised("".join(out), tmp)}


def outputs():
    """{case name: text} of every case."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = os.path.realpath(tmp)
        return {**plans(tmp), **renders(tmp), **decisions(tmp), **gateway_decisions(tmp), **release_walk(tmp)}


if __name__ == "__main__":
    os.makedirs(sys.argv[1], exist_ok=True)
    for name, text in outputs().items():
        with open(os.path.join(sys.argv[1], f"{name}.txt"), "w", encoding="utf-8") as f:
            f.write(text)
