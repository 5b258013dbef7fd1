"""One frozen Config: conf/defaults.toml, then a profile (DSV41_PROFILE), then the environment.

Every value is validated here, once; a bad one raises ConfigError with one line naming the variable,
the value and what is accepted. Per-node values follow one scheme for any number of nodes:
R<N>_IP, R<N>_IFNAME, R<N>_HCAS, R<N>_GID_INDEX, R<N>_MODEL_DIR for rank N, where HEAD_* is R0_* and
WORKER_* is R1_* (the original two-node names).
"""
import dataclasses
import ipaddress
import json as _json
import os
import re
import shlex
import tomllib
from pathlib import Path

from dsv41 import names
from dsv41.errors import UserError
from dsv41.node import memguard

ROOT = Path(__file__).resolve().parents[3]
CONF_DIR = ROOT / "conf"
LIB_DIR = str(ROOT / "lib")
GRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
DIGEST_RE = re.compile(r"^[a-z0-9][a-z0-9._:/-]*@sha256:[0-9a-f]{64}$")
IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9._:/-]*(@sha256:[0-9a-f]{64})?$")
# user@host; neither may start with "-", so nothing that reaches ssh or rsync can become an option
TARGET_RE = re.compile(r"^(?:[a-z_][a-z0-9_.-]*@)?(?:[A-Za-z0-9.][A-Za-z0-9.-]*|\[[0-9a-fA-F:]+\])$")
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
HCA_RE = re.compile(r"^[A-Za-z0-9_.-]+(?::\d+)?$")
PER_NODE_RE = re.compile(r"^(R\d+|HEAD|WORKER)_(IP|IFNAME|HCAS|GID_INDEX|MODEL_DIR)$")


class ConfigError(UserError):
    pass


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    rank: int
    name: str                  # "head", "worker1", ...
    target: str | None         # ssh target; None for the head (the machine running doit)
    model_dir: str | None      # explicit model dir on this node, None: derived from the head's
    ip: str | None = None      # fabric overrides; None: detected
    ifname: str | None = None
    hcas: tuple[str, ...] | None = None
    gid_index: int | None = None

    @property
    def label(self):
        return self.name if self.target is None else f"{self.name} ({self.target})"


@dataclasses.dataclass(frozen=True)
class Config:
    image: str
    allow_unpinned_image: bool
    hf_repo: str
    revision: str
    hf_token: str
    plan_name: str
    served_model_name: str
    model_dir: str             # on the head, expanded
    state_dir: str             # on the head, expanded
    state_dir_raw: str         # as configured ("~/..."), resolved per node against its home
    api_key_file: str
    port: int
    mport: int
    memguard_gib: float
    memguard_mode: str
    kv_bytes: int
    max_len: int
    max_seqs: int
    nspec: int
    batch: int
    gpu_util: float
    graph_mode: str
    caps: tuple[int, ...]
    extra: tuple[str, ...]
    engine_cmd: tuple[str, ...]
    tp_size: int
    nnodes: int
    nccl_ib_gid_index: int | None
    ssh_opts: tuple[str, ...]
    ssh_timeout_s: int
    keep_parts: bool
    start_timeout_s: int
    metrics_dir: str
    watchdog: bool
    watchdog_interval_s: int
    watchdog_stall_s: int
    watchdog_probe_s: int
    watchdog_max_recoveries: int
    watchdog_window_s: int
    free_gib_head: int
    free_gib_worker: int
    # ---- monitoring settings (doit monitoring, head/monitoring.py): read by _monitoring() ----------
    prometheus_port: int
    exporter_port: int
    scrape_interval_s: int
    metrics_with_key: bool
    alert_for_s: int
    alert_recent_min: int
    alert_ttft_p95_s: float
    alert_decode_toks_min: float
    alert_mem_margin_gib: float
    # ---- end of the monitoring settings ----------------------------------------------------------
    skip_checks: tuple[str, ...]
    gpus: str
    memlock: str
    privileged: bool
    profile: str
    engine_args: tuple         # (("--flag", value or None to drop it, source), ...): an engine profile's changes
    engine_env: tuple          # (("NAME", value or None to drop it, source), ...); "{rank}" is the rank number
    nodes: tuple[NodeSpec, ...]
    sources: dict = dataclasses.field(compare=False, repr=False)

    @property
    def head(self):
        return self.nodes[0]

    @property
    def workers(self):
        return self.nodes[1:]

    @property
    def cap(self):
        return self.max_seqs * (self.nspec + 1)

    def require_workers(self):
        if not self.workers:
            raise ConfigError("WORKER is empty: set WORKER=user@<worker fabric address> "
                              "(or WORKERS=user@a,user@b for more workers)")
        return self.workers

    def node_path(self, raw, home):
        """A configured path ("~/x" or absolute) on a node whose home is `home`."""
        return home + raw[1:] if raw == "~" or raw.startswith("~/") else raw

    def model_dir_on(self, spec, home):
        """The model dir on a node: its override, else the head's path with the head's home swapped."""
        if spec.rank == 0:
            return self.model_dir
        if spec.model_dir:
            return self.node_path(spec.model_dir, home)
        head_home = os.path.expanduser("~")
        if self.model_dir == head_home or self.model_dir.startswith(head_home + "/"):
            return home + self.model_dir[len(head_home):]
        return self.model_dir

    def state_dir_on(self, spec, home):
        return self.state_dir if spec.rank == 0 else self.node_path(self.state_dir_raw, home)

    @property
    def api_url(self):
        host = self.head.ip or "127.0.0.1"
        return f"http://{host}:{self.port}/v1"


# ---- parsing -------------------------------------------------------------------------------------

def _bad(var, value, accepted):
    return ConfigError(f"{var}={value!r} is not valid: expected {accepted}")


def _int(var, value, lo, hi=None):
    try:
        n = int(str(value).strip().replace("_", ""))
    except ValueError:
        raise _bad(var, value, f"a whole number{_range(lo, hi)}") from None
    if n < lo or (hi is not None and n > hi):
        raise _bad(var, value, f"a whole number{_range(lo, hi)}")
    return n


def _range(lo, hi):
    return f" from {lo} to {hi}" if hi is not None else f" of at least {lo}"


def _float(var, value, lo, hi, lo_open=False):
    try:
        x = float(str(value).strip())
    except ValueError:
        x = float("nan")
    if not (x > lo if lo_open else x >= lo) or not x <= hi:
        bound = f"more than {lo}" if lo_open else f"at least {lo}"
        raise _bad(var, value, f"a number {bound} and at most {hi}")
    return x


def _bool(var, value):
    if isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise _bad(var, value, "1 or 0 (true/false)")


def _path(var, value):
    s = str(value)
    if not s or "\n" in s or "\0" in s or not (s.startswith("/") or s == "~" or s.startswith("~/")):
        raise _bad(var, value, "an absolute path or one starting with ~/ (spaces and quotes are fine)")
    return s.rstrip("/") or "/"


def _opt_path(var, value):
    s = str(value).strip()
    return os.path.expanduser(_path(var, s)) if s else ""


def _split(var, value):
    try:
        return tuple(shlex.split(str(value)))
    except ValueError as err:
        raise _bad(var, value, f"shell words with balanced quotes ({err})") from None


def _target(var, value):
    s = str(value).strip()
    if s.startswith("-") or "@-" in s:
        raise _bad(var, value, "an ssh target whose user and host do not start with '-' "
                   "(it would reach ssh as an option), like user@10.10.10.11")
    if not TARGET_RE.match(s):
        raise _bad(var, value, "an ssh target like user@10.10.10.11 (the worker's fabric address)")
    return s


def _ip(var, value):
    try:
        return str(ipaddress.IPv4Address(str(value).strip()))
    except ValueError:
        raise _bad(var, value, "an IPv4 address on the fabric network, e.g. 10.10.10.13") from None


def _ifname(var, value):
    if not IFNAME_RE.match(str(value)):
        raise _bad(var, value, "a network interface name as shown by `ip -br a`")
    return str(value)


def _hcas(var, value):
    items = tuple(x.strip() for x in str(value).split(",") if x.strip())
    if not items or not all(HCA_RE.match(x) for x in items):
        raise _bad(var, value, "a comma list of RDMA devices as shown by `rdma link`, e.g. rocep1s0f1")
    return items


def _caps(var, value):
    try:
        sizes = sorted({int(x) for x in str(value).split(",") if x.strip()})
    except ValueError:
        sizes = []
    if not sizes or sizes[0] < 1:
        raise _bad(var, value, "a comma list of positive whole numbers, e.g. 1,2,4,8")
    return tuple(sizes)


def capture_sizes(max_seqs, nspec):
    """1..min(NSPEC+1, CAP), then NSPEC+1 up to CAP in steps of 4, plus CAP (serving-config.md)."""
    cap = max_seqs * (nspec + 1)
    sizes = set(range(1, min(nspec + 1, cap) + 1))
    sizes.update(range(nspec + 1, cap + 1, 4))
    sizes.add(cap)
    return tuple(sorted(sizes))


def _load_toml(path):
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path} is missing: restore it from the repository") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path} is not valid TOML: {err}") from None


def load_config(env=None):
    env = dict(os.environ if env is None else env)
    raw = _load_toml(CONF_DIR / "defaults.toml")
    sources = {k: "default" for k in raw}
    profile = env.get("DSV41_PROFILE", "").strip()
    engine = {"args": {}, "env": {}}
    profiled = {}                                       # per-node values a profile gave, for ranks it may not have
    for name, prof in _profile_chain(profile):
        prof.pop("base", None)
        for k, v in prof.pop("overrides", {}).items():  # per-node values, env-style names
            if k not in env:
                env[k], profiled[k] = str(v), name
        for table in ("args", "env"):                   # the engine's argv and environment, changed
            for k, v in prof.pop(table, {}).items():
                engine[table][k] = (_engine_change(name, table, k, v), f"profile {name}")
        for k, v in prof.items():
            if k not in raw:
                raise ConfigError(f"conf/{name}.toml: unknown setting {k!r}")
            raw[k], sources[k] = v, f"profile {name}"
    for k in raw:
        if k.upper() in env:
            raw[k], sources[k] = env[k.upper()], "environment"
    if "IMG" in env:
        raw["image"], sources["image"] = env["IMG"], "environment (IMG)"
    elif str(raw.get("image_file", "")).strip():
        raw["image"], sources["image"] = _image_from_file(raw["image_file"]), "file " + raw["image_file"]
    get = raw.get

    allow_unpinned = _bool("ALLOW_UNPINNED_IMAGE", get("allow_unpinned_image"))
    image = str(get("image")).strip()
    if not IMAGE_RE.match(image) or (not allow_unpinned and not DIGEST_RE.match(image)):
        raise _bad("IMG", image, "an image pinned by digest, repo@sha256:<64 hex> "
                   "(set ALLOW_UNPINNED_IMAGE=1 to accept a tag)")
    graph_mode = str(get("graph_mode")).strip()
    if graph_mode not in GRAPH_MODES:
        raise _bad("GRAPH_MODE", graph_mode, "one of " + ", ".join(GRAPH_MODES))
    memguard_mode = _checked(memguard.check_mode, str(get("memguard_mode")).strip())
    plan_name = str(get("plan_name")).strip()
    if not re.match(r"^[A-Za-z0-9._-]+\.json$", plan_name):
        raise _bad("PLAN_NAME", plan_name, "a plan file name in exl3/plan/, e.g. J268-ho-v31-K5n.json")
    hf_repo = str(get("hf_repo")).strip()
    if not re.match(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$", hf_repo):
        raise _bad("HF_REPO", hf_repo, "a Hugging Face repo id, owner/name")
    revision = str(get("revision")).strip()
    if revision and not re.match(r"^[A-Za-z0-9_./-]+$", revision):
        raise _bad("REVISION", revision, "a commit hash, branch or tag")

    port = _int("PORT", get("port"), 1, 65535)
    mport = _int("MPORT", get("mport"), 1, 65535)
    if mport == port:
        raise _bad("MPORT", mport, "a port other than PORT")
    max_seqs = _int("MAX_SEQS", get("max_seqs"), 1, 1024)
    nspec = _int("NSPEC", get("nspec"), 0, 32)
    caps_raw = str(get("caps")).strip()
    caps = _caps("CAPS", caps_raw) if caps_raw else capture_sizes(max_seqs, nspec)

    state_raw = _path("STATE_DIR", get("state_dir"))
    state_dir = os.path.expanduser(state_raw)
    model_dir = os.path.expanduser(_path("MODEL_DIR", get("model_dir")))
    key_raw = str(get("api_key_file")).strip()
    api_key_file = (os.path.expanduser(_path("API_KEY_FILE", key_raw)) if key_raw
                    else names.state_path(state_dir, names.KEY))

    nodes = _nodes(env, get, sources, profiled)
    count = len(nodes)
    tp_size = _int("TP_SIZE", get("tp_size"), 0, 1024) or count
    nnodes = _int("NNODES", get("nnodes"), 0, 1024) or count
    gid = _int("NCCL_IB_GID_INDEX", get("nccl_ib_gid_index"), -1, 255)

    return Config(
        image=image, allow_unpinned_image=allow_unpinned, hf_repo=hf_repo, revision=revision,
        hf_token=str(env.get("HF_TOKEN", "")), plan_name=plan_name,
        served_model_name=str(get("served_model_name")).strip(),
        model_dir=model_dir, state_dir=state_dir, state_dir_raw=state_raw, api_key_file=api_key_file,
        port=port, mport=mport,
        memguard_gib=_checked(memguard.check_floor, get("memguard_gib")),
        memguard_mode=memguard_mode,
        kv_bytes=_int("KV_BYTES", get("kv_bytes"), 1),
        max_len=_int("MAX_LEN", get("max_len"), 16, 16_777_216),
        max_seqs=max_seqs, nspec=nspec,
        batch=_int("BATCH", get("batch"), 1, 1_048_576),
        gpu_util=_float("GPU_UTIL", get("gpu_util"), 0, 1, lo_open=True),
        graph_mode=graph_mode, caps=caps, extra=_split("EXTRA", get("extra")),
        engine_cmd=_engine_cmd(get("engine_cmd")),
        tp_size=tp_size, nnodes=nnodes, nccl_ib_gid_index=None if gid < 0 else gid,
        ssh_opts=_split("SSH_OPTS", get("ssh_opts")),
        ssh_timeout_s=_int("SSH_TIMEOUT_S", get("ssh_timeout_s"), 1, 300),
        keep_parts=_bool("KEEP_PARTS", get("keep_parts")),
        start_timeout_s=60 * _int("START_TIMEOUT_MIN", get("start_timeout_min"), 1, 24 * 60),
        metrics_dir=_opt_path("METRICS_DIR", get("metrics_dir")),
        watchdog=_bool("WATCHDOG", get("watchdog")),
        watchdog_interval_s=_int("WATCHDOG_INTERVAL_S", get("watchdog_interval_s"), 1, 3600),
        watchdog_stall_s=_int("WATCHDOG_STALL_S", get("watchdog_stall_s"), 1, 24 * 3600),
        watchdog_probe_s=_int("WATCHDOG_PROBE_S", get("watchdog_probe_s"), 1, 3600),
        watchdog_max_recoveries=_int("WATCHDOG_MAX_RECOVERIES", get("watchdog_max_recoveries"), 0, 100),
        watchdog_window_s=60 * _int("WATCHDOG_WINDOW_MIN", get("watchdog_window_min"), 1, 7 * 24 * 60),
        free_gib_head=_int("FREE_GIB_HEAD", get("free_gib_head"), 0),
        free_gib_worker=_int("FREE_GIB_WORKER", get("free_gib_worker"), 0),
        gpus=_gpus(str(get("gpus")).strip()),
        memlock=_memlock(str(get("memlock")).strip()),
        privileged=_bool("PRIVILEGED", get("privileged")),
        skip_checks=tuple(x.strip() for x in str(get("skip_checks")).split(",") if x.strip()),
        profile=profile, nodes=nodes, sources=sources,
        engine_args=tuple((k, v, src) for k, (v, src) in engine["args"].items()),
        engine_env=tuple((k, v, src) for k, (v, src) in engine["env"].items()),
        **_monitoring(get, port),
    )


# ---- monitoring settings (doit monitoring, head/monitoring.py) -----------------------------------
def _monitoring(get, port):
    prometheus_port = _int("PROMETHEUS_PORT", get("prometheus_port"), 1, 65535)
    exporter_port = _int("EXPORTER_PORT", get("exporter_port"), 1, 65535)
    if port in (prometheus_port, exporter_port) or prometheus_port == exporter_port:
        raise _bad("PROMETHEUS_PORT", prometheus_port, "a port other than PORT and EXPORTER_PORT")
    return dict(
        prometheus_port=prometheus_port, exporter_port=exporter_port,
        scrape_interval_s=_int("SCRAPE_INTERVAL_S", get("scrape_interval_s"), 1, 3600),
        metrics_with_key=_bool("METRICS_WITH_KEY", get("metrics_with_key")),
        alert_for_s=_int("ALERT_FOR_S", get("alert_for_s"), 0, 24 * 3600),
        alert_recent_min=_int("ALERT_RECENT_MIN", get("alert_recent_min"), 1, 24 * 60),
        alert_ttft_p95_s=_float("ALERT_TTFT_P95_S", get("alert_ttft_p95_s"), 0, 3600, lo_open=True),
        alert_decode_toks_min=_float("ALERT_DECODE_TOKS_MIN", get("alert_decode_toks_min"), 0, 10000,
                                     lo_open=True),
        alert_mem_margin_gib=_float("ALERT_MEM_MARGIN_GIB", get("alert_mem_margin_gib"), 0, 1024),
    )
# ---- end of the monitoring settings --------------------------------------------------------------


def _checked(check, value):
    """A value checked by the rule its user applies (the memory guard's own), as a ConfigError."""
    try:
        return check(value)
    except UserError as err:
        raise ConfigError(str(err)) from None


def _engine_cmd(value):
    words = _split("ENGINE_CMD", value)
    if not words or words[0].startswith("-"):
        raise _bad("ENGINE_CMD", value, "the serving image's command, e.g. vllm serve")
    return words


def _gpus(value):
    if value and not re.match(r"^[A-Za-z0-9=,:\"-]+$", value):
        raise _bad("GPUS", value, "docker run's --gpus value, e.g. all or device=0 (empty: none)")
    return value


def _memlock(value):
    if not re.match(r"^(-1|\d+(:\d+)?)$", value):
        raise _bad("MEMLOCK", value, "-1 (unlimited) or a byte count, as docker run --ulimit memlock= takes")
    return value


def _profile_chain(profile):
    """[(name, its settings)] for the profile and the profiles it is based on (`base = "..."`), the most
    basic first."""
    chain = {}
    while profile:
        if not re.match(r"^[A-Za-z0-9_-]+$", profile) or not (CONF_DIR / f"{profile}.toml").exists():
            known = sorted(p.stem for p in CONF_DIR.glob("*.toml") if p.stem != "defaults")
            raise _bad("DSV41_PROFILE", profile, f"one of {', '.join(known)} (files in conf/)")
        if profile in chain:
            raise ConfigError(f"conf/{profile}.toml: its `base` chain comes back to itself")
        chain[profile] = _load_toml(CONF_DIR / f"{profile}.toml")
        profile = str(chain[profile].get("base", "")).strip()
    return list(chain.items())[::-1]


def _engine_change(profile, table, key, value):
    """One [args] or [env] entry of a profile: a string replaces the value (an [env] one may add it),
    false drops it."""
    ok = (re.match(r"^--[a-z0-9-]+$", key) if table == "args" else re.match(r"^[A-Z_][A-Z0-9_]*$", key))
    if not ok or not (value is False or isinstance(value, str)):
        what = "a --flag" if table == "args" else "an environment variable name"
        raise ConfigError(f"conf/{profile}.toml [{table}] {key} = {value!r}: expected {what} = \"value\" or false")
    return None if value is False else value


def _image_from_file(path):
    try:
        with open(os.path.expanduser(path)) as f:
            return f.read().strip()
    except OSError as err:
        raise ConfigError(f"IMAGE_FILE={path!r} cannot be read ({err.strerror}): write the pinned "
                          "image reference there (for the lab: make lab-up) or set IMG") from None


def _nodes(env, get, sources, profiled=()):
    workers_raw = str(get("workers")).strip()
    if workers_raw:
        var = "WORKERS"
        targets = [w.strip() for w in workers_raw.split(",")]
        if any(not t for t in targets):
            raise _bad(var, workers_raw, "a comma list of ssh targets, user@a,user@b")
    else:
        var = "WORKER"
        worker = str(get("worker")).strip()
        targets = [worker] if worker else []
    targets = [_target(var, t) for t in targets]
    if len(set(targets)) != len(targets):
        raise _bad(var, ",".join(targets), "distinct ssh targets, one per worker")
    wmd = str(get("worker_model_dir")).strip()
    worker_model_dir = _path("WORKER_MODEL_DIR", wmd) if wmd else None

    def per_rank(rank, key, parse):
        names = [f"R{rank}_{key}"] + (["HEAD_" + key] if rank == 0 else []) + (
            ["WORKER_" + key] if rank == 1 else [])
        for name in names:
            if env.get(name, "").strip():
                sources[f"r{rank}.{key.lower()}"] = (f"profile {profiled[name]} ({name})" if name in profiled
                                                     else f"environment ({name})")
                return parse(name, env[name].strip())
        return None

    specs = []
    for rank, target in enumerate([None] + targets):
        gid = per_rank(rank, "GID_INDEX", lambda v, x: _int(v, x, 0, 255))
        model_dir = per_rank(rank, "MODEL_DIR", _path) if rank else None
        specs.append(NodeSpec(
            rank=rank, name="head" if rank == 0 else f"worker{rank}", target=target,
            model_dir=model_dir or (worker_model_dir if rank else None),
            ip=per_rank(rank, "IP", _ip), ifname=per_rank(rank, "IFNAME", _ifname),
            hcas=per_rank(rank, "HCAS", _hcas), gid_index=gid))
    known = {f"R{s.rank}_{k}" for s in specs for k in ("IP", "IFNAME", "HCAS", "GID_INDEX", "MODEL_DIR")}
    for name in env:
        if PER_NODE_RE.match(name) and name.startswith("R") and name not in known and name not in profiled:
            raise ConfigError(f"{name} is set but there is no rank {name[1:].split('_')[0]}: "
                              f"ranks are r0 (head) to r{len(specs) - 1}; check WORKER/WORKERS")
    return tuple(specs)


def settings_env(env=None):
    """The environment variables that shape the Config (its settings, the profile, the per-node
    overrides), never secrets: what a service started later needs to rebuild the same Config."""
    env = os.environ if env is None else env
    keys = {k.upper() for k in _load_toml(CONF_DIR / "defaults.toml")} | {"IMG", "DSV41_PROFILE"}
    return {k: v for k, v in sorted(env.items()) if k in keys or PER_NODE_RE.match(k)}


SECRET_KEYS = {"hf_token"}


def describe(cfg):
    """(setting, value, source) rows for `doit config`; secrets are shown as set/unset only."""
    rows = []
    for field in dataclasses.fields(cfg):
        k = field.name
        if k in ("sources", "nodes", "state_dir_raw", "engine_args", "engine_env"):
            continue
        v = getattr(cfg, k)
        if k in SECRET_KEYS:
            v = "(set)" if v else "(unset)"
        elif k in ("start_timeout_s", "watchdog_window_s"):
            k, v = k[:-2] + "_min", v // 60
        elif v is None:
            v = "(detected per node)"
        elif isinstance(v, tuple):
            v = ",".join(map(str, v)) if k == "caps" else shlex.join(v)
        src = cfg.sources.get(k, "derived" if k in ("tp_size", "nnodes", "caps") else "default")
        if k == "hf_token":
            src = "environment" if cfg.hf_token else "default"
        rows.append((k.upper() if k != "image" else "IMG", str(v), src))
    for k, v, src in cfg.engine_args + cfg.engine_env:
        rows.append((f"engine {k}", "(dropped)" if v is None else v, src))
    for s in cfg.nodes:
        facts = {"target": s.target or "(local)", "model_dir": s.model_dir, "ip": s.ip,
                 "ifname": s.ifname, "hcas": ",".join(s.hcas) if s.hcas else None,
                 "gid_index": s.gid_index}
        for k, v in facts.items():
            src = cfg.sources.get(f"r{s.rank}.{k}", "detected at launch" if v is None else "environment")
            if k == "model_dir" and v is None:
                v, src = ("(head's path, home swapped)" if s.rank else cfg.model_dir), "derived"
            if k == "target":
                src = "environment" if s.target else "the machine running doit"
            rows.append((f"r{s.rank}.{k}", "" if v is None else str(v), src))
    return rows


def show(cfg, json=False):
    """doit config: every effective setting with where it came from."""
    rows = describe(cfg)
    if json:
        print(_json.dumps({k: {"value": v, "source": s} for k, v, s in rows}, indent=2))
        return
    width = max(len(k) for k, _, _ in rows)
    vwidth = min(60, max(len(v) for _, v, _ in rows))
    for k, v, s in rows:
        print(f"{k:<{width}}  {v:<{vwidth}}  ({s})")
