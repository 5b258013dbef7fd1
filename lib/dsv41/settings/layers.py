"""One frozen Config: the schema's defaults (head/core/schema.py), then a profile (DSV41_PROFILE=NAME,
conf/NAME.toml, over the profiles it is based on), then the environment.

Every value is checked here, once, against the schema: a bad one raises ConfigError with one line
naming the variable (or the profile file and key), the value and what is accepted. Rules between
settings (TP_SIZE and NNODES against the node count, WORKER and WORKERS in one layer, MPORT against
PORT, no secret in a pass-through) are checked here too.
"""
import dataclasses
import json as _json
import os
import re
import shlex
import tomllib
from pathlib import Path
from typing import NamedTuple

from dsv41 import names
from dsv41.head.core import schema
from dsv41.head.core.schema import SETTINGS, ConfigError

ROOT = Path(__file__).resolve().parents[3]
CONF_DIR = ROOT / "conf"
LIB_DIR = str(ROOT / "lib")


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
    watchdog_backoff_s: int
    mem_return_gib: float
    mem_return_s: int
    incidents_keep: int
    releases_keep: int
    rollout_hold_s: int
    rollout_min_timeout_s: int
    rollback: bool
    free_gib_head: int
    free_gib_worker: int
    # ---- monitoring settings (doit monitoring, head/monitoring.py; alerts: head/alerts.py) ----------
    prometheus_port: int
    exporter_port: int
    scrape_interval_s: int
    metrics_with_key: bool
    alert_for_s: int
    alert_recent_min: int
    alert_ttft_p95_s: float
    alert_decode_toks_min: float
    alert_mem_margin_gib: float
    cluster_name: str
    alertmanager_port: int
    alert_webhook_url: str     # semi-secret: never in resolved(), only in the mode-0600 alertmanager.yml
    alert_email_to: tuple[str, ...]
    alert_email_from: str
    alert_smtp_smarthost: str
    alert_smtp_user: str
    alert_smtp_password_file: str
    alert_smtp_require_tls: bool
    alert_group_wait_s: int
    alert_group_interval_s: int
    alert_repeat_interval_min: int
    alert_silence_max_h: int
    # ---- end of the monitoring settings ----------------------------------------------------------
    skip_checks: tuple[str, ...]
    gpus: str
    memlock: str
    privileged: bool
    profile: str
    engine_args: tuple         # (("--flag", value or None to drop it, source), ...): an engine profile's changes
    engine_env: tuple          # (("NAME", value or None to drop it, source), ...); "{rank}" is the rank number
    nodes: tuple[NodeSpec, ...]
    sources: dict = dataclasses.field(compare=False, repr=False)   # {setting key or r<N>.<key>: where from}
    values: dict = dataclasses.field(compare=False, repr=False)    # {setting NAME: parsed value}

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



def capture_sizes(max_seqs, nspec):
    """1..min(NSPEC+1, CAP), then NSPEC+1 up to CAP in steps of 4, plus CAP (serving-config.md)."""
    cap = max_seqs * (nspec + 1)
    sizes = set(range(1, min(nspec + 1, cap) + 1))
    sizes.update(range(nspec + 1, cap + 1, 4))
    sizes.add(cap)
    return tuple(sorted(sizes))



# ---- loading: layers (defaults, profiles, the environment), checked against the schema -----------

def load_config(env=None):
    env = os.environ if env is None else env
    profile = schema.parse(schema.BY_NAME["DSV41_PROFILE"], "DSV41_PROFILE", env.get("DSV41_PROFILE", ""))
    engine = {"args": {}, "env": {}}
    layers = [Layer("default", {s.name: s.default for s in SETTINGS if not s.env_only}, {})]
    layers += [_profile_layer(name, prof, engine) for name, prof in _profile_chain(profile)]
    layers.append(Layer("environment", {s.name: env[s.name] for s in SETTINGS if s.name in env and not s.env_only},
                        {k: v for k, v in env.items() if schema.PER_NODE_RE.match(k) and v.strip()}))
    values, sources = {}, {}
    for s in SETTINGS:
        if s.name in ("WORKER", "WORKERS") or s.env_only:
            continue
        layer = next(la for la in reversed(layers) if s.name in la.values)
        values[s.name] = schema.parse(s, layer.label(s), layer.values[s.name])
        sources[s.key] = layer.source
    values["HF_TOKEN"] = str(env.get("HF_TOKEN", ""))
    values["ALERT_WEBHOOK_URL"] = schema.parse(schema.BY_NAME["ALERT_WEBHOOK_URL"], "ALERT_WEBHOOK_URL",
                                               env.get("ALERT_WEBHOOK_URL", ""))
    values["DSV41_PROFILE"] = profile
    targets = _workers(layers, values, sources)
    image = _image(env, values, sources)

    port, mport = values["PORT"], values["MPORT"]
    if mport == port:
        raise schema.bad("MPORT", mport, "a port other than PORT")
    if len({port, values["PROMETHEUS_PORT"], values["EXPORTER_PORT"]}) < 3:
        raise schema.bad("PROMETHEUS_PORT", values["PROMETHEUS_PORT"], "a port other than PORT and EXPORTER_PORT")
    if values["ALERTMANAGER_PORT"] in (port, values["PROMETHEUS_PORT"], values["EXPORTER_PORT"]):
        raise schema.bad("ALERTMANAGER_PORT", values["ALERTMANAGER_PORT"],
                         "a port other than PORT, PROMETHEUS_PORT and EXPORTER_PORT")
    _email(values)
    caps = values["CAPS"] or capture_sizes(values["MAX_SEQS"], values["NSPEC"])
    state_raw = values["STATE_DIR"]
    state_dir = os.path.expanduser(state_raw)
    api_key_file = (os.path.expanduser(values["API_KEY_FILE"]) if values["API_KEY_FILE"]
                    else names.state_path(state_dir, names.KEY))
    nodes = _nodes(layers, targets, values["WORKER_MODEL_DIR"] or None, sources)
    tp_size, nnodes = _topology(values, len(nodes))
    gid = values["NCCL_IB_GID_INDEX"]
    v = values
    return Config(
        image=image, allow_unpinned_image=v["ALLOW_UNPINNED_IMAGE"], hf_repo=v["HF_REPO"], revision=v["REVISION"],
        hf_token=v["HF_TOKEN"], plan_name=v["PLAN_NAME"], served_model_name=v["SERVED_MODEL_NAME"],
        model_dir=os.path.expanduser(v["MODEL_DIR"]), state_dir=state_dir, state_dir_raw=state_raw,
        api_key_file=api_key_file, port=port, mport=mport,
        memguard_gib=v["MEMGUARD_GIB"], memguard_mode=v["MEMGUARD_MODE"], kv_bytes=v["KV_BYTES"],
        max_len=v["MAX_LEN"], max_seqs=v["MAX_SEQS"], nspec=v["NSPEC"], batch=v["BATCH"], gpu_util=v["GPU_UTIL"],
        graph_mode=v["GRAPH_MODE"], caps=caps, extra=v["EXTRA"], engine_cmd=v["ENGINE_CMD"],
        tp_size=tp_size, nnodes=nnodes, nccl_ib_gid_index=None if gid < 0 else gid,
        ssh_opts=v["SSH_OPTS"], ssh_timeout_s=v["SSH_TIMEOUT_S"], keep_parts=v["KEEP_PARTS"],
        start_timeout_s=60 * v["START_TIMEOUT_MIN"], metrics_dir=os.path.expanduser(v["METRICS_DIR"]),
        watchdog=v["WATCHDOG"], watchdog_interval_s=v["WATCHDOG_INTERVAL_S"],
        watchdog_stall_s=v["WATCHDOG_STALL_S"], watchdog_probe_s=v["WATCHDOG_PROBE_S"],
        watchdog_max_recoveries=v["WATCHDOG_MAX_RECOVERIES"], watchdog_window_s=60 * v["WATCHDOG_WINDOW_MIN"],
        watchdog_backoff_s=v["WATCHDOG_BACKOFF_S"], mem_return_gib=v["MEM_RETURN_GIB"],
        mem_return_s=v["MEM_RETURN_S"], incidents_keep=v["INCIDENTS_KEEP"],
        releases_keep=v["RELEASES_KEEP"], rollout_hold_s=v["ROLLOUT_HOLD_S"],
        rollout_min_timeout_s=60 * v["ROLLOUT_MIN_TIMEOUT_MIN"], rollback=v["ROLLBACK"],
        free_gib_head=v["FREE_GIB_HEAD"], free_gib_worker=v["FREE_GIB_WORKER"], gpus=v["GPUS"],
        memlock=v["MEMLOCK"], privileged=v["PRIVILEGED"], skip_checks=v["SKIP_CHECKS"],
        prometheus_port=v["PROMETHEUS_PORT"], exporter_port=v["EXPORTER_PORT"],
        scrape_interval_s=v["SCRAPE_INTERVAL_S"], metrics_with_key=v["METRICS_WITH_KEY"],
        alert_for_s=v["ALERT_FOR_S"], alert_recent_min=v["ALERT_RECENT_MIN"], alert_ttft_p95_s=v["ALERT_TTFT_P95_S"],
        alert_decode_toks_min=v["ALERT_DECODE_TOKS_MIN"], alert_mem_margin_gib=v["ALERT_MEM_MARGIN_GIB"],
        cluster_name=v["CLUSTER_NAME"], alertmanager_port=v["ALERTMANAGER_PORT"],
        alert_webhook_url=v["ALERT_WEBHOOK_URL"],
        alert_email_to=tuple(a for a in v["ALERT_EMAIL_TO"].split(",") if a), alert_email_from=v["ALERT_EMAIL_FROM"],
        alert_smtp_smarthost=v["ALERT_SMTP_SMARTHOST"], alert_smtp_user=v["ALERT_SMTP_USER"],
        alert_smtp_password_file=os.path.expanduser(v["ALERT_SMTP_PASSWORD_FILE"]),
        alert_smtp_require_tls=v["ALERT_SMTP_REQUIRE_TLS"], alert_group_wait_s=v["ALERT_GROUP_WAIT_S"],
        alert_group_interval_s=v["ALERT_GROUP_INTERVAL_S"], alert_repeat_interval_min=v["ALERT_REPEAT_INTERVAL_MIN"],
        alert_silence_max_h=v["ALERT_SILENCE_MAX_H"],
        profile=profile, nodes=nodes, sources=sources, values=values,
        engine_args=tuple((k, val, src) for k, (val, src) in engine["args"].items()),
        engine_env=tuple((k, val, src) for k, (val, src) in engine["env"].items()),
    )


def _email(values):
    """E-mail needs its server and From address; a user needs its password file, and the other way round."""
    if values["ALERT_EMAIL_TO"]:
        for need in ("ALERT_SMTP_SMARTHOST", "ALERT_EMAIL_FROM"):
            if not values[need]:
                raise ConfigError(f"ALERT_EMAIL_TO is set but {need} is empty: set it too (README \"Alerts\"), "
                                  "or unset ALERT_EMAIL_TO")
    if bool(values["ALERT_SMTP_USER"]) != bool(values["ALERT_SMTP_PASSWORD_FILE"]):
        given, missing = (("ALERT_SMTP_USER", "ALERT_SMTP_PASSWORD_FILE") if values["ALERT_SMTP_USER"]
                          else ("ALERT_SMTP_PASSWORD_FILE", "ALERT_SMTP_USER"))
        raise ConfigError(f"{given} is set but {missing} is empty: the mail server's login needs both")


class Layer(NamedTuple):
    """One source of settings: {NAME: value} and {per-node NAME: value}, as that source wrote them."""
    source: str                 # "default", "profile NAME", "environment"
    values: dict
    per_node: dict

    def label(self, s, key=None):
        """How an error names the setting: the variable, or the profile file and key."""
        if self.source.startswith("profile "):
            return f"conf/{self.source[8:]}.toml {key or s.key}"
        return s.name


def _profile_layer(name, prof, engine):
    """A profile's settings as a Layer, every key and type checked; its [args] and [env] go to `engine`."""
    where = f"conf/{name}.toml"
    values, per_node = {}, {}
    for k, v in prof.items():
        if k == "base":
            continue
        if k in ("overrides", "args", "env"):
            if not isinstance(v, dict):
                raise ConfigError(f"{where}: {k} = {v!r} is not valid: expected a table [{k}] of "
                                  + ("NAME = \"value\" lines" if k == "overrides" else "entries = \"value\" or false"))
            for key, val in v.items():
                if k == "overrides":
                    per_node[key] = _override(where, key, val)
                else:
                    engine[k][key] = (_engine_change(where, k, key, val), f"profile {name}")
            continue
        s = schema.BY_KEY.get(k)
        if s is None:
            if k.upper() in schema.BY_NAME:
                raise ConfigError(f"{where}: {k} may be set only in the environment (a secret, or the profile's "
                                  "own name, never goes into a file)")
            raise ConfigError(f"{where}: unknown setting {k!r}{schema.nearest(k, schema.BY_KEY)}: the settings "
                              "are README's table in lower case; per-node values go under [overrides]")
        values[s.name] = schema.toml_type(s, f"{where} {k}", v)
    return Layer(f"profile {name}", values, per_node)


def _override(where, key, value):
    """One [overrides] entry: a per-node variable (R<N>_IP, HEAD_IFNAME, ...) and a string or number."""
    s = schema.per_node_setting(key)
    if s is None:
        known = [f"R{r}_{k}" for r in range(9) for k in schema.PER_NODE] + [
            f"{p}_{k}" for p in ("HEAD", "WORKER") for k in schema.PER_NODE]
        raise ConfigError(f"{where} [overrides]: unknown variable {key!r}{schema.nearest(key, known)}: expected "
                          "per-node values R<N>_IP, R<N>_IFNAME, R<N>_HCAS, R<N>_GID_INDEX, R<N>_MODEL_DIR")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ConfigError(f"{where} [overrides] {key} = {value!r} is not valid: expected a string")
    value = str(value)
    schema.parse(s, f"{where} [overrides] {key}", value)       # checked now, even for ranks not configured
    return value


def _engine_change(where, table, key, value):
    """One [args] or [env] entry of a profile: a string replaces the value (an [env] one may add it),
    false drops it. Never a secret: the key file is the one way the API key reaches rank 0."""
    ok = (re.match(r"^--[a-z0-9-]+$", key) if table == "args" else re.match(r"^[A-Z_][A-Z0-9_]*$", key))
    if not ok or not (value is False or isinstance(value, str)) or len(str(value)) > schema.MAX_VALUE_LEN:
        what = "a --flag" if table == "args" else "an environment variable name"
        raise ConfigError(f"{where} [{table}] {key} = {value!r}: expected {what} = \"value\" or false")
    if key in schema.SECRET_FLAGS + schema.SECRET_ENV or (isinstance(value, str) and any(
            w.split("=", 1)[0] in schema.SECRET_FLAGS for w in value.split())):
        raise ConfigError(f"{where} [{table}] {key}: a secret never goes into a unit file; rank 0 reads the API "
                          "key from API_KEY_FILE ($STATE_DIR/api_key), HF_TOKEN comes from the environment")
    return None if value is False else value


def _workers(layers, values, sources):
    """The worker targets from the highest layer that sets WORKER or WORKERS (both in one layer: refused)."""
    layer = next(la for la in reversed(layers) if "WORKER" in la.values or "WORKERS" in la.values)
    given = [k for k in ("WORKER", "WORKERS") if str(layer.values.get(k, "")).strip()]
    if len(given) == 2:
        raise ConfigError(f"WORKER and WORKERS are both set in the {layer.source}: keep one "
                          "(WORKERS=user@a,user@b lists every worker, WORKER names the only one)")
    for k in ("WORKER", "WORKERS"):
        s = schema.BY_NAME[k]
        values[k] = schema.parse(s, layer.label(s), layer.values.get(k, ""))
        sources[s.key] = layer.source
    return values["WORKERS"] or ((values["WORKER"],) if values["WORKER"] else ())


def _image(env, values, sources):
    """IMG from the environment, else the image in IMAGE_FILE when set, else the configured image;
    pinned by digest unless ALLOW_UNPINNED_IMAGE."""
    if values["IMAGE_FILE"] and "IMG" not in env:
        try:
            with open(os.path.expanduser(values["IMAGE_FILE"])) as f:
                image = f.read(schema.MAX_VALUE_LEN).strip()
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"IMAGE_FILE={values['IMAGE_FILE']!r} cannot be read "
                              f"({getattr(err, 'strerror', None) or err}): write the pinned image reference there "
                              "(for the lab: make lab-up) or set IMG") from None
        values["IMG"], sources["image"] = image, "file " + values["IMAGE_FILE"]
    image = values["IMG"]
    if not schema.IMAGE_RE.match(image) or (not values["ALLOW_UNPINNED_IMAGE"] and not schema.DIGEST_RE.match(image)):
        raise schema.bad("IMG", image, "an image pinned by digest, repo@sha256:<64 hex> "
                         "(set ALLOW_UNPINNED_IMAGE=1 to accept a tag)")
    return image


def _topology(values, count):
    """TP_SIZE and NNODES against the node count: one rank per node, TP_SIZE / count GPUs on each."""
    tp_size, nnodes = values["TP_SIZE"] or count, values["NNODES"] or count
    if nnodes != count:
        raise ConfigError(f"NNODES={nnodes} with {count} node(s): expected {count} (one rank per node; "
                          "WORKER/WORKERS set the node count) or 0")
    if tp_size % count:
        raise ConfigError(f"TP_SIZE={tp_size} with {count} node(s): expected a multiple of {count} (each node "
                          f"runs TP_SIZE/{count} of the GPUs) or 0 for the node count")
    return tp_size, nnodes


def _profile_chain(profile):
    """[(name, its settings)] for the profile and the profiles it is based on (`base = "..."`), the most
    basic first."""
    chain = {}
    via = "DSV41_PROFILE"
    while profile:
        path = CONF_DIR / f"{profile}.toml"
        if not re.match(r"^[A-Za-z0-9_-]+$", profile) or not path.exists():
            known = sorted(p.stem for p in CONF_DIR.glob("*.toml"))
            raise schema.bad(via, profile, f"one of {', '.join(known)} (files in conf/)")
        if profile in chain:
            raise ConfigError(f"conf/{profile}.toml: its `base` chain comes back to itself "
                              f"({' -> '.join([*chain, profile])}): remove one `base`")
        chain[profile] = prof = _load_toml(path)
        base = prof.get("base", "")
        if not isinstance(base, str):
            raise ConfigError(f"conf/{profile}.toml: base = {base!r} is not valid: expected a profile name string")
        via, profile = f"conf/{profile}.toml base", base.strip()
    return list(chain.items())[::-1]


def _load_toml(path):
    try:
        data = path.read_bytes()
        text = data.decode("utf-8")
        prof = tomllib.loads(text)
    except OSError as err:
        raise ConfigError(f"{path} cannot be read ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}): "
                          "save it as UTF-8") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path} is not valid TOML: {err}") from None
    if not prof:
        raise ConfigError(f"{path} is empty: a profile sets at least one setting (or delete the file)")
    return prof


def _nodes(layers, targets, worker_model_dir, sources):
    """One NodeSpec per rank: the head, then the workers; per-node values from the highest layer that
    gives them (R<N>_X before HEAD_X / WORKER_X in one layer)."""
    count = len(targets) + 1
    for la in layers:
        for var in la.per_node:
            if la.source == "environment" and schema.per_node_rank(var) >= count:
                raise ConfigError(f"{var} is set but there is no rank {schema.per_node_rank(var)}: ranks are "
                                  f"r0 (head) to r{count - 1}; check WORKER/WORKERS")

    def per_rank(rank, key):
        names_ = [f"R{rank}_{key}"] + {0: ["HEAD_" + key], 1: ["WORKER_" + key]}.get(rank, [])
        for la in reversed(layers):
            for var in names_:
                if var in la.per_node:
                    sources[f"r{rank}.{key.lower()}"] = f"{la.source} ({var})"
                    s = schema.per_node_setting(var)
                    return schema.parse(s, la.label(s, f"[overrides] {var}") if la.source != "environment"
                                        else var, la.per_node[var]) or None
        return None

    specs = []
    for rank, target in enumerate([None, *targets]):
        model_dir = per_rank(rank, "MODEL_DIR") if rank else None
        specs.append(NodeSpec(
            rank=rank, name="head" if rank == 0 else f"worker{rank}", target=target,
            model_dir=model_dir or (worker_model_dir if rank else None),
            ip=per_rank(rank, "IP"), ifname=per_rank(rank, "IFNAME"), hcas=per_rank(rank, "HCAS"),
            gid_index=per_rank(rank, "GID_INDEX")))
    return tuple(specs)


# ---- the watchdog's copy: the resolved values, no secret ------------------------------------------

NOT_RESOLVED = ("hf_token", "alert_webhook_url", "sources", "values")


def resolved(cfg):
    """The resolved Config as JSON-able data, without secrets: what a service started later runs on
    (the watchdog), so that neither the environment nor conf/ can change under it."""
    return {f.name: dataclasses.asdict(cfg)[f.name] for f in dataclasses.fields(cfg) if f.name not in NOT_RESOLVED}


def from_resolved(data):
    """The Config resolved() wrote; ConfigError when it was written by another version."""
    def tuples(v):
        return tuple(tuples(x) for x in v) if isinstance(v, list) else v
    want = {f.name for f in dataclasses.fields(Config)} - set(NOT_RESOLVED)
    if not isinstance(data, dict) or set(data) != want:
        raise ConfigError("the resolved settings were written by another version: run `doit launch`")
    try:
        values = {k: tuples(v) for k, v in data.items()}
        values["nodes"] = tuple(NodeSpec(**{k: tuples(x) for k, x in n.items()}) for n in data["nodes"])
        return Config(**values, hf_token="", alert_webhook_url="", sources={}, values={})
    except (TypeError, AttributeError) as err:
        raise ConfigError(f"the resolved settings cannot be read ({err}): run `doit launch`") from None


# ---- doit config ---------------------------------------------------------------------------------

def describe(cfg):
    """(setting, value, source) rows for `doit config`, in the schema's order; secrets are shown as
    set/unset only."""
    rows = []
    effective = {"IMG": cfg.image, "TP_SIZE": cfg.tp_size, "NNODES": cfg.nnodes, "CAPS": cfg.caps,
                 "API_KEY_FILE": cfg.api_key_file, "WORKER_MODEL_DIR": cfg.values["WORKER_MODEL_DIR"]
                 or "(head's path, home swapped)"}
    for s in SETTINGS:
        v = effective.get(s.name, cfg.values[s.name])
        src = cfg.sources.get(s.key, "environment" if s.env_only and v else "default")
        if s.name in ("TP_SIZE", "NNODES", "CAPS", "API_KEY_FILE") and not cfg.values[s.name]:
            src = "derived"
        if s.kind in schema.HIDDEN_KINDS:
            v = "(set)" if v else "(unset)"
        elif isinstance(v, bool):
            v = int(v)
        elif s.name == "NCCL_IB_GID_INDEX" and v < 0:
            v = "(detected per node)"
        elif isinstance(v, tuple):
            v = ",".join(map(str, v)) if s.kind in ("caps", "list", "targets") else shlex.join(v)
        rows.append((s.name, str(v), src))
    for k, v, src in cfg.engine_args + cfg.engine_env:
        rows.append((f"engine {k}", "(dropped)" if v is None else v, src))
    for s in cfg.nodes:
        facts = {"target": s.target or "(local)", "model_dir": s.model_dir, "ip": s.ip,
                 "ifname": s.ifname, "hcas": ",".join(s.hcas) if s.hcas else None, "gid_index": s.gid_index}
        for k, v in facts.items():
            src = cfg.sources.get(f"r{s.rank}.{k}", "detected at launch" if v is None else "derived")
            if k == "model_dir" and not cfg.sources.get(f"r{s.rank}.{k}"):
                v, src = ("(head's path, home swapped)" if s.rank else cfg.model_dir), "derived"
            if k == "target":
                src = (cfg.sources.get("workers") or "default") if s.target else "the machine running doit"
            rows.append((f"r{s.rank}.{k}", "" if v is None else str(v), src))
    return rows


def show(cfg, json=False, setting=()):
    """doit config: every effective setting with where it came from (or only the named ones)."""
    rows = describe(cfg)
    if setting:
        wanted = {w.upper() for w in setting}
        unknown = sorted(wanted - {k.upper() for k, _, _ in rows})
        if unknown:
            raise ConfigError(f"no setting {unknown[0]}{schema.nearest(unknown[0], [k for k, _, _ in rows])}: "
                              "`doit config` lists them all")
        rows = [r for r in rows if r[0].upper() in wanted]
    if json:
        print(_json.dumps({k: {"value": v, "source": s} for k, v, s in rows}, indent=2))
        return
    width = max(len(k) for k, _, _ in rows)
    vwidth = min(60, max(len(v) for _, v, _ in rows))
    for k, v, s in rows:
        print(f"{k:<{width}}  {v:<{vwidth}}  ({s})")
