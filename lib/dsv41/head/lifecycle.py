"""launch, status, logs, stop, plan, clear-trip: the cluster's life under systemd.

Facts first, then the minimal change: each node is read once (probe.py), the desired units are
rendered locally, and only what differs is written, reloaded or restarted. Ranks start workers
first and the head last, and stop head first (a stale rendezvous otherwise races)."""
import dataclasses
import difflib
import hashlib
import json
import os
import secrets
import sys
import time

import requests

from dsv41 import commands, units
from dsv41.errors import UserError, one_line
from dsv41.files import write_atomic
from dsv41.nodes import NodeError, nodes, ship_code
from dsv41.probe import UNIT_DIR

GUARD = "dsv41-memguard.service"
KEY_ENV = "api_key.env"
GUARD_SETTINGS = "memguard.json"
STALE_MARGIN_S = 5   # a worker up this much less time than the head restarted on its own (RestartSec=30)


@dataclasses.dataclass
class Paths:
    model_dir: str
    state_dir: str
    python: str
    pythonpath: str


class Cluster:
    """The configured nodes plus what was learned about them during this run."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.nodes = nodes(cfg)
        self.specs = {n.name: s for n, s in zip(self.nodes, cfg.nodes)}
        self._prefix = {}
        self.facts = {}

    @property
    def head(self):
        return self.nodes[0]

    @property
    def workers(self):
        return self.nodes[1:]

    def spec(self, node):
        return self.specs[node.name]

    def paths(self, node):
        home = node.home()
        state = self.cfg.state_dir_on(self.spec(node), home)
        return Paths(self.cfg.model_dir_on(self.spec(node), home), state, "/usr/bin/python3",
                     f"{state}/lib")

    def module(self, node, name, *args):
        """argv running dsv41.<name> on the node from the package shipped to its state dir."""
        if node.name not in self._prefix:
            self._prefix[node.name] = ship_code(node, self.paths(node).state_dir)
        return self._prefix[node.name] + [f"dsv41.{name}", *args]

    def unit_names(self, node):
        return [GUARD, f"{self.spec(node).unit}.service"]

    def probe(self, node):
        p = self.paths(node)
        req = {"state_dir": p.state_dir, "units": self.unit_names(node), "image": self.cfg.image,
               "containers": [self.spec(node).unit], "files": [KEY_ENV, GUARD_SETTINGS, f"plans/{self.cfg.plan_name}"]}
        out = node.run(self.module(node, "probe", json.dumps(req))).stdout
        self.facts[node.name] = json.loads(out)
        return self.facts[node.name]

    def probe_all(self):
        return {n.name: self.probe(n) for n in self.nodes}

    def priv(self, node, argv):
        """argv as root: sudo -n when the node's user is not root."""
        uid = self.facts.get(node.name, {}).get("uid", 0)
        return list(argv) if uid == 0 else ["sudo", "-n", *argv]


def say(node, text):
    print(f"[{node.name}] {text}", flush=True)


# ---- desired state ---------------------------------------------------------------------------

def fabric_values(cl, facts=None):
    from dsv41 import fabric
    fab = fabric.fabric_from_overrides(cl.cfg)
    if fab is None:
        from dsv41 import preflight
        fab = fabric.resolve_fabric(cl.cfg, facts if facts is not None else preflight.gather_facts(cl.cfg))
    return fab


def render_all(cl, fab):
    """{node name: {unit file name: text}} for every node."""
    return {n.name: units.render_units(cl.cfg, cl.spec(n), fab, cl.paths(n))
            for n in cl.nodes}


def render(cfg):
    """doit render: write every node's units under $STATE_DIR/units/r<N>/ (changed files only).
    With every per-node fabric value given by override no node is contacted; a worker's home is
    then assumed from its ssh user (/root or /home/<user>)."""
    cl = Cluster(cfg)
    from dsv41 import fabric
    fab = fabric.fabric_from_overrides(cfg)
    offline = fab is not None
    if not offline:
        fab = fabric_values(cl)
    rendered = {}
    for n in cl.nodes:
        if offline and not n.is_local:
            user = n.target.split("@")[0] if "@" in n.target else os.environ.get("USER", "root")
            n._home = "/root" if user == "root" else f"/home/{user}"
        rendered[cl.spec(n).rank] = units.render_units(cfg, cl.spec(n), fab, cl.paths(n))
    out = os.path.join(cfg.state_dir, "units")
    units.write_rendered(cfg, rendered, out)
    note = " (no node contacted; workers' homes assumed from their ssh users)" if offline else ""
    print(f"rendered units for {len(rendered)} nodes in {out}{note}")


def state_files(cl, node, create_key=True):
    """{path under the state dir: (text, mode)} this node must hold: the guard's settings, the EXL3
    plan copy with its bank paths rewritten, and on the head the API key as the container's env file
    (text None when the key does not exist yet and create_key is off, as in a dry run)."""
    cfg = cl.cfg
    files = {GUARD_SETTINGS: (guard_settings(cfg), 0o644),
             f"plans/{cfg.plan_name}": (units.rewrite_plan(read_head_plan(cfg)), 0o644)}
    if node is cl.head:
        key = read_or_create_key(cfg) if create_key else read_key(cfg)
        files[KEY_ENV] = (f"VLLM_API_KEY={key}\n" if key else None, 0o600)
    return files


def ensure_state(cl, node, facts):
    """Write the state files that differ (never printing the key), make the cache and run dirs."""
    p = cl.paths(node)
    node.run(["mkdir", "-p", f"{p.state_dir}/cache/b12x", f"{p.state_dir}/cache/b12x-roce",
              f"{p.state_dir}/run"])
    for rel, (text, mode) in state_files(cl, node).items():
        if facts["files"].get(rel) != _sha(text):
            node.write_file(f"{p.state_dir}/{rel}", text, mode=mode)
            say(node, f"wrote {p.state_dir}/{rel}" + (f" (mode {mode:o})" if mode != 0o644 else ""))


def guard_settings(cfg):
    """The memory guard's floor and mode: a file the guard re-reads on `systemctl reload`, so a new
    MEMGUARD_GIB changes neither its unit nor the ranks bound to it."""
    return json.dumps({"floor_gib": cfg.memguard_gib, "mode": cfg.memguard_mode}) + "\n"


def _sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def read_key(cfg):
    try:
        with open(cfg.api_key_file) as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def read_or_create_key(cfg):
    key = read_key(cfg)
    if key:
        return key
    key = secrets.token_urlsafe(32)
    write_atomic(cfg.api_key_file, (key + "\n").encode(), 0o600)
    print(f"[head] created the API key in {cfg.api_key_file} (mode 0600)")
    return key


def read_head_plan(cfg):
    path = os.path.join(cfg.model_dir, "exl3", "plan", cfg.plan_name)
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        raise UserError(f"EXL3 plan {path} is missing: run `doit download` (or check PLAN_NAME)") from None


# ---- the plan: what launch would do ------------------------------------------------------------

@dataclasses.dataclass
class Step:
    node: str
    what: str       # "install", "restart-guard", "start-guard", "restart-ranks", "start-ranks"
    detail: str


def diff_units(cl, rendered, facts):
    """[(node, unit, installed text or None, desired text)] for units whose content differs."""
    out = []
    for n in cl.nodes:
        for name, text in rendered[n.name].items():
            have = facts[n.name]["units"].get(name, {})
            if have.get("text") != text:
                out.append((n, name, have.get("text"), text))
    return out


def _when(stamp):
    """systemd's "@<unix seconds>" as local time, "" when never."""
    if not stamp or not stamp.startswith("@") or stamp == "@0":
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(stamp[1:])))


def _since(unit_facts):
    """ActiveEnterTimestamp as unix seconds ("@1732940000"), or None."""
    v = unit_facts.get("ActiveEnterTimestamp", "")
    return float(v[1:]) if v.startswith("@") else None


def stale_workers(cl, facts=None):
    """A worker rank that (re)started after the head's rank cannot rejoin its rendezvous: the ranks
    must be restarted together. Lines naming each such worker. Each node's start time is measured
    against that node's own clock (its age), so clock skew between nodes cannot fake a restart."""
    facts = facts or cl.facts

    def age(node):
        f = facts.get(node.name, {})
        u = f.get("units", {}).get(f"{cl.spec(node).unit}.service", {})
        t = _since(u)
        return f["time"] - t if t and u.get("ActiveState") == "active" and "time" in f else None

    head_age = age(cl.head)
    out = []
    for n in cl.workers:
        a = age(n)
        if head_age is not None and a is not None and a < head_age - STALE_MARGIN_S:
            u = facts[n.name]["units"][f"{cl.spec(n).unit}.service"]
            out.append(f"{cl.spec(n).unit} on {n.label} restarted after the head's rank "
                       f"(NRestarts={u.get('NRestarts', '?')}): the ranks must restart together")
    return out


def decide(cl, rendered, facts):
    """Pure decision: the steps that bring the nodes from `facts` to `rendered`."""
    steps = [Step("all", "why", line) for line in stale_workers(cl, facts)]
    changed = {(n.name, name) for n, name, _, _ in diff_units(cl, rendered, facts)}
    for node_name, name in sorted(changed):
        steps.append(Step(node_name, "install", name))
    restart_ranks = any(s.what == "why" for s in steps)
    for n in cl.nodes:
        f = facts[n.name]
        g = f["units"].get(GUARD, {})
        if (n.name, GUARD) in changed and g.get("ActiveState") == "active":
            steps.append(Step(n.name, "restart-guard", "memory guard unit changed"))
            steps.append(Step(n.name, "why", "the memory guard unit changed (ranks are bound to it)"))
            restart_ranks = True
        elif g.get("ActiveState") != "active" or (n.name, GUARD) in changed:
            steps.append(Step(n.name, "start-guard", "memory guard not running"))
        elif f["files"].get(GUARD_SETTINGS) != _sha(guard_settings(cl.cfg)):
            steps.append(Step(n.name, "reload-guard", "MEMGUARD_GIB or MEMGUARD_MODE changed"))
        stale = [rel for rel, (text, _) in state_files(cl, n, create_key=False).items()
                 if rel != GUARD_SETTINGS and (text is None or f["files"].get(rel) != _sha(text))]
        if stale:
            restart_ranks = True
            steps.append(Step(n.name, "why", f"{', '.join(stale)} changed on {n.name}"))
        unit = f"{cl.spec(n).unit}.service"
        u = f["units"].get(unit, {})
        container = f["containers"].get(cl.spec(n).unit)
        if (n.name, unit) in changed:
            restart_ranks, why = True, f"{unit} changed"
        elif u.get("ActiveState") != "active":
            restart_ranks, why = True, f"{unit} is {u.get('ActiveState', 'not installed')}"
        elif container and f["image_id"] and container["image"] != f["image_id"]:
            restart_ranks, why = True, f"{unit} runs an older image"
        else:
            continue
        steps.append(Step(n.name, "why", why))
    if restart_ranks:
        steps = [s for s in steps if s.what != "why"] + [
            Step("all", "restart-ranks", "; ".join(s.detail for s in steps if s.what == "why"))]
    return steps


# ---- launch -----------------------------------------------------------------------------------

def launch(cfg):
    t0 = time.monotonic()
    cfg.require_workers()
    cl = Cluster(cfg)
    from dsv41 import image, preflight
    facts_pf = preflight.preflight_for_launch(cfg)
    fab = fabric_values(cl, facts_pf)
    facts = cl.probe_all()
    tripped = [(n, facts[n.name]["tripped"]) for n in cl.nodes if facts[n.name]["tripped"]]
    if tripped:
        n, t = tripped[0]
        raise UserError(
            f"the memory guard on {n.label} tripped at {t.get('time', '?')} (MemAvailable "
            f"{t.get('mem_available_gib', '?')} GiB under the floor {t.get('floor_gib', '?')} GiB); "
            "lower KV_BYTES or GPU_UTIL first (raise MEMGUARD_GIB only after that), then run "
            "`doit clear-trip` and launch again")
    image.ensure(cl, facts)
    for n in cl.nodes:
        ensure_state(cl, n, facts[n.name])
    rendered = render_all(cl, fab)
    units.write_rendered(cfg, {cl.spec(n).rank: rendered[n.name] for n in cl.nodes},
                         os.path.join(cfg.state_dir, "units"))
    steps = decide(cl, rendered, facts)
    apply(cl, rendered, steps)
    wait_ready(cl, t0 if steps else None)


def apply(cl, rendered, steps):
    by_node = {n.name: n for n in cl.nodes}
    installed = {s.node for s in steps if s.what == "install"}
    for s in steps:
        if s.what == "install":
            install_unit(cl, by_node[s.node], s.detail, rendered[s.node][s.detail])
    for name in installed:
        by_node[name].run(cl.priv(by_node[name], commands.systemctl("daemon-reload")))
    for s in steps:
        node = by_node.get(s.node)
        if s.what in ("restart-guard", "start-guard", "reload-guard"):
            verb = s.what.split("-")[0]
            node.run(cl.priv(node, commands.systemctl(verb, GUARD)))
            node.run(cl.priv(node, commands.systemctl("enable", "--quiet", GUARD)))
            say(node, f"{verb}ed the memory guard")
    if any(s.what == "restart-ranks" for s in steps):
        why = next(s.detail for s in steps if s.what == "restart-ranks")
        print(f"(re)starting the ranks: {why}")
        stop_ranks(cl)
        for node in cl.workers + [cl.head]:
            unit = f"{cl.spec(node).unit}.service"
            node.run(cl.priv(node, commands.systemctl("reset-failed", unit)), check=False)
            node.run(cl.priv(node, commands.systemctl("start", unit)))
            say(node, f"started {unit}")


def install_unit(cl, node, name, text):
    """Write /etc/systemd/system/<name> atomically; through sudo -n when the node's user is not root."""
    path = f"{UNIT_DIR}/{name}"
    if cl.facts[node.name]["uid"] == 0:
        node.write_file(path, text)
    else:
        tmp = f"{cl.paths(node).state_dir}/run/.{name}.tmp"
        node.write_file(tmp, text)
        node.run(["sudo", "-n", "install", "-m", "0644", tmp, path])
    say(node, f"installed {path}")


def stop_ranks(cl):
    for node in [cl.head] + cl.workers:
        unit = f"{cl.spec(node).unit}.service"
        node.run(cl.priv(node, commands.systemctl("stop", unit)), check=False)


def wait_ready(cl, t0):
    """Ready: /v1/models answers 200 with the key and one token is generated, while every rank
    unit stays active. A failed rank stops the wait at once with its journal."""
    cfg = cl.cfg
    key = read_or_create_key(cfg)
    url = f"http://127.0.0.1:{cfg.port}/v1"
    started = time.monotonic()
    deadline = started + cfg.start_timeout_s
    last_note = 0.0
    while True:
        problem = ranks_down(cl)
        if problem:
            show_rank_logs(cl)
            raise UserError(f"{problem}; its journal is above (doit logs r<N> for more)")
        if api_ready(url, key, cfg.served_model_name):
            break
        now = time.monotonic()
        if now > deadline:
            show_rank_logs(cl)
            raise UserError(f"the API did not become ready within {cfg.start_timeout_s // 60} min "
                            "(START_TIMEOUT_MIN); the ranks' journals are above")
        if now - last_note >= (5 if sys.stderr.isatty() else 30):
            print(f"waiting for the API at {url}: {fmt_elapsed(now - started)} elapsed "
                  f"(first start takes about 12 min)", flush=True)
            last_note = now
        time.sleep(2)
    took = f"; start-up took {fmt_elapsed(time.monotonic() - t0)}" if t0 else "; nothing changed"
    ip = cfg.head.ip or "<head-ip>"
    print(f"ready: base URL http://{ip}:{cfg.port}/v1 (here: {url}), model {cfg.served_model_name}, "
          f"key in {cfg.api_key_file}{took}")


def fmt_elapsed(s):
    return f"{int(s // 60)}m{int(s % 60):02d}s"


def api_ready(url, key, model):
    h = {"Authorization": f"Bearer {key}"}
    try:
        r = requests.get(f"{url}/models", headers=h, timeout=5)
        if r.status_code != 200:
            return False
        r = requests.post(f"{url}/completions", headers=h, timeout=60,
                          json={"model": model, "prompt": "Hello", "max_tokens": 1})
        return r.status_code == 200 and bool(r.json().get("choices"))
    except (requests.RequestException, ValueError):
        return False


def ranks_down(cl):
    """None when every rank unit is active, else a sentence naming the first that is not."""
    for node in cl.nodes:
        unit = f"{cl.spec(node).unit}.service"
        r = node.run(commands.systemctl("show", "-p", "ActiveState,SubState,Result", unit), check=False)
        props = dict(l.split("=", 1) for l in r.stdout.splitlines() if "=" in l)
        if (props.get("ActiveState") not in ("active", "activating", "reloading")
                or props.get("SubState") == "auto-restart"):  # its container exited
            return (f"rank {unit} on {node.label} is {props.get('ActiveState', 'unknown')} "
                    f"({props.get('Result', '?')})")
    return None


def show_rank_logs(cl, lines=40):
    for node in cl.nodes:
        unit = f"{cl.spec(node).unit}.service"
        r = node.run(commands.journalctl(unit, lines=lines), check=False)
        print(f"---- last {lines} lines of {unit} on {node.label} ----")
        print(r.stdout.rstrip() or r.stderr.rstrip() or "(empty)")


# ---- status, logs, stop, clear-trip, plan ----------------------------------------------------

def status(cfg, json=False):
    cl = Cluster(cfg)
    rows, report = [], {"nodes": {}, "api": None}
    ranks_ok = True
    for node in cl.nodes:
        try:
            f = cl.probe(node)
        except NodeError as err:
            report["nodes"][node.name] = {"error": str(err)}
            rows.append((node.name, "unreachable", one_line(err, 100)))
            ranks_ok = False
            continue
        unit = f"{cl.spec(node).unit}.service"
        g, u = f["units"][GUARD], f["units"][unit]
        c = f["containers"].get(cl.spec(node).unit) if isinstance(f["containers"], dict) else None
        entry = {
            "memguard": g.get("ActiveState", "not installed") if g["installed"] else "not installed",
            "rank_unit": unit, "rank_state": (u.get("ActiveState", "?") + "/" + u.get("SubState", "?"))
            if u["installed"] else "not installed",
            "since": _when(u.get("ActiveEnterTimestamp") if u.get("ActiveState") == "active"
                           else u.get("InactiveEnterTimestamp")),
            "container": c["state"]["Status"] if c else "none",
            "mem_available_gib": round(f["mem_available_kib"] / 2**20, 1),
            "gpu_memory": f["gpu_memory"], "tripped": f["tripped"]}
        report["nodes"][node.name] = entry
        if u.get("ActiveState") != "active" or entry["container"] != "running":
            ranks_ok = False
    api = api_status(cfg)
    stale = stale_workers(cl)
    if stale:
        ranks_ok = False
        report["stale"] = stale
    any_up = any(isinstance(e, dict) and e.get("rank_state", "").split("/")[0] in ("active", "activating")
                 for e in report["nodes"].values())
    if api["models"]:
        api["state"] = "READY" if ranks_ok else "DEGRADED"
    else:
        api["state"] = "DOWN" if any_up else "NOT RUNNING"
    report["api"] = api
    if json:
        print(_json.dumps(report, indent=2))
        return
    print(f"{'node':<10} {'memguard':<14} {'rank':<26} {'since':<30} {'container':<10} {'MemAvail':>9}  GPU mem")
    for name, e in report["nodes"].items():
        if "error" in e:
            print(f"{name:<10} UNREACHABLE: {e['error']}")
            continue
        guard = "TRIPPED" if e["tripped"] else e["memguard"]
        print(f"{name:<10} {guard:<14} {e['rank_unit'] + ' ' + e['rank_state']:<26} {e['since'][:30]:<30} "
              f"{e['container']:<10} {e['mem_available_gib']:>6.1f} GiB  {e['gpu_memory'] or '-'}")
        if e["tripped"]:
            print(f"{'':<10} memory guard tripped: {one_line(_json.dumps(e['tripped']), 160)}; "
                  "lower KV_BYTES or GPU_UTIL, then `doit clear-trip`")
    for line in stale:
        print(line)
    print(f"API {api['url']}: {api['state']} (health {api['health']}, models {api['models'] or '-'})")
    if api["state"] == "NOT RUNNING":
        print("nothing is running; start it with `doit launch`")


_json = json


def api_status(cfg):
    url = f"http://127.0.0.1:{cfg.port}"
    out = {"url": f"{url}/v1", "health": None, "models": None}
    try:
        from dsv41.show import api_key
        key = api_key(cfg)
    except UserError:
        key = ""
    try:
        out["health"] = requests.get(f"{url}/health", timeout=3).status_code
        r = requests.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=5)
        if r.status_code == 200:
            out["models"] = [m["id"] for m in r.json().get("data", [])]
    except (requests.RequestException, ValueError):
        pass
    return out


def _log_args(words, follow, lines, node):
    """doit stops parsing options at the first positional word: take -f/-n/--node from anywhere."""
    targets, words = [], list(words)
    while words:
        w = words.pop(0)
        if w in ("-f", "--follow"):
            follow = True
        elif w in ("-n", "--lines", "--node") and words:
            value = words.pop(0)
            if w == "--node":
                node = value
            elif value.isdigit():
                lines = int(value)
            else:
                raise UserError(f"-n {value!r} is not a number of lines")
        else:
            targets.append(w)
    return targets, follow, lines, node


def logs(cfg, units=(), follow=False, lines=100, node=""):
    cl = Cluster(cfg)
    targets, follow, lines, node = _log_args(units, follow, lines, node)
    targets = targets or ["r0"]
    for t in targets:
        if t == "memguard":
            picks = [n for n in cl.nodes if not node or n.name == node]
            if not picks:
                raise UserError(f"--node {node!r} is not a node: choose from "
                                + ", ".join(n.name for n in cl.nodes))
            for n in picks:
                print(f"---- {GUARD} on {n.label} ----", flush=True)
                n.run(commands.journalctl(GUARD, follow=follow and len(picks) == 1, lines=lines), fg=True)
            continue
        ranks = {f"r{cl.spec(n).rank}": n for n in cl.nodes}
        if t not in ranks:
            raise UserError(f"no unit {t!r}: choose from {', '.join(ranks)} or memguard")
        n = ranks[t]
        print(f"---- dsv41-{t}.service on {n.label} ----", flush=True)
        n.run(commands.journalctl(f"dsv41-{t}.service", follow=follow, lines=lines), fg=True)


def stop(cfg):
    cl = Cluster(cfg)
    for n in cl.nodes:
        cl.facts[n.name] = {"uid": int(n.run(["id", "-u"]).stdout)}
    stop_ranks(cl)
    for n in cl.nodes:
        say(n, f"stopped {cl.spec(n).unit}.service")
    for n in cl.nodes:
        n.run(cl.priv(n, commands.systemctl("stop", GUARD)), check=False)
        say(n, "stopped the memory guard")


def clear_trip(cfg):
    cl = Cluster(cfg)
    for n in cl.nodes:
        marker = f"{cl.paths(n).state_dir}/memguard.tripped"
        r = n.run(["rm", "-f", "--", marker])
        say(n, f"cleared {marker}" if r.ok else f"could not clear {marker}")


def plan(cfg):
    cl = Cluster(cfg)
    cfg.require_workers()
    from dsv41 import preflight
    facts_pf = preflight.gather_facts(cfg)
    fab = fabric_values(cl, facts_pf)
    facts = cl.probe_all()
    print("settings:")
    for key in ("image", "model_dir", "state_dir", "kv_bytes", "max_len", "max_seqs", "nspec",
                "gpu_util", "port", "memguard_gib"):
        print(f"  {key.upper():<14} {getattr(cfg, key)}")
    print("nodes:")
    for n in cl.nodes:
        f, fb = facts[n.name], fab[cl.spec(n).rank]
        print(f"  r{cl.spec(n).rank} {n.label}: fabric {fb.ip} on {fb.ifname}, HCAs "
              f"{','.join(fb.hcas)}, GID {fb.gid_index}; image {'present' if f['image_id'] else 'missing'}; "
              f"MemAvailable {f['mem_available_kib'] / 2**20:.1f} GiB"
              + ("; memory guard TRIPPED" if f["tripped"] else ""))
    rendered = render_all(cl, fab)
    for n, name, have, want in diff_units(cl, rendered, facts):
        print(f"diff {name} on {n.label}:")
        print("".join(difflib.unified_diff(
            (have or "").splitlines(True), want.splitlines(True),
            f"installed/{name}", f"rendered/{name}")), end="")
    steps = decide(cl, rendered, facts)
    missing = [n for n in cl.nodes if not facts[n.name]["image_id"]]
    print("launch would:")
    for n in missing:
        print(f"  pull {cfg.image} on {n.label}")
    for s in steps:
        print(f"  {s.what} on {s.node}: {s.detail}")
    if not steps and not missing:
        print("  nothing: everything is installed, running and unchanged")
