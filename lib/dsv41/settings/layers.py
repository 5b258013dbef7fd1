"""Loading the settings in layers: the schema's defaults (settings/schema.py and the engine's own),
then a profile (DSV41_PROFILE=NAME, conf/NAME.toml, over the profiles it is based on), then the
environment, into one Config (settings/config.py).

Every value is checked here, once, against the schema: a bad one raises ConfigError with one line
naming the variable (or the profile file and key), the value and what is accepted. Rules between
settings (TP_SIZE and NNODES against the node count, WORKER and WORKERS in one layer, MPORT against
PORT, no secret in a pass-through) are checked here too.
"""
import os
import re
import tomllib
from typing import NamedTuple

from dsv41 import names
from dsv41.settings import kinds, schema
from dsv41.settings.config import NodeSpec, config_class
from dsv41.settings.kinds import ConfigError
from dsv41.settings.paths import CONF_DIR


def load_config(env=None, engine=schema.ENGINE, own=schema.OWN):
    """The Config of the environment `env` (os.environ) over its profile over the defaults; `engine`
    declares the engine's own settings (SETTINGS, SECRET_ENV, FLAG_SETTINGS, derive(values)): vLLM's by
    default; `own` dsv41's (schema.OWN). Config.values holds each setting's effective value (TP_SIZE=0: the
    node count), its fields what the settings declare of those."""
    env = os.environ if env is None else env
    settings = schema.table(engine, own)
    profile = kinds.parse(schema.BY_NAME["DSV41_PROFILE"], "DSV41_PROFILE", env.get("DSV41_PROFILE", ""))
    changes = {"args": {}, "env": {}}
    layers = [Layer("default", {s.name: s.default for s in settings if not s.env_only}, {})]
    layers += [_profile_layer(name, prof, changes, settings, engine) for name, prof in _profile_chain(profile)]
    layers.append(Layer("environment", {s.name: env[s.name] for s in settings if s.name in env and not s.env_only},
                        {k: v for k, v in env.items() if schema.PER_NODE_RE.match(k) and v.strip()}))
    values, sources = {}, {}
    for s in settings:
        if s.name in ("WORKER", "WORKERS") or s.env_only:
            continue
        *below, layer = [la for la in layers if s.name in la.values]
        for la in below:                                # checked too, though a later layer overrides it
            kinds.parse(s, la.label(s), la.values[s.name])
        values[s.name] = kinds.parse(s, layer.label(s), layer.values[s.name])
        sources[s.key] = layer.source
    for s in settings:
        if s.env_only:                                  # a secret is taken as it is: an error would print it
            value = env.get(s.name, s.default)
            values[s.name] = str(value) if s.kind == "secret" else kinds.parse(s, s.name, value)
    targets = _workers(layers, values, sources)
    _image(env, values, sources)

    port, mport = values["PORT"], values["MPORT"]
    if mport == port:
        raise kinds.bad("MPORT", mport, "a port other than PORT")
    if len({port, values["PROMETHEUS_PORT"], values["EXPORTER_PORT"]}) < 3:
        raise kinds.bad("PROMETHEUS_PORT", values["PROMETHEUS_PORT"], "a port other than PORT and EXPORTER_PORT")
    if values["ALERTMANAGER_PORT"] in (port, values["PROMETHEUS_PORT"], values["EXPORTER_PORT"]):
        raise kinds.bad("ALERTMANAGER_PORT", values["ALERTMANAGER_PORT"],
                         "a port other than PORT, PROMETHEUS_PORT and EXPORTER_PORT")
    others = {"PORT": port, "MPORT": mport, "PROMETHEUS_PORT": values["PROMETHEUS_PORT"],
              "EXPORTER_PORT": values["EXPORTER_PORT"], "ALERTMANAGER_PORT": values["ALERTMANAGER_PORT"]}
    if values["GATEWAY"] and values["ENGINE_PORT"] in others.values():
        raise kinds.bad("ENGINE_PORT", values["ENGINE_PORT"], "a port other than " + ", ".join(others))
    _email(values)
    _flag_settings(changes["args"], values, engine)
    derived = engine.derive({s.name: values[s.name] for s in engine.SETTINGS})
    for s in engine.SETTINGS:                           # derived from others: CAPS from MAX_SEQS and NSPEC
        if derived[s.name] != values[s.name]:
            values[s.name], sources[s.key] = derived[s.name], "derived"
    if not values["API_KEY_FILE"]:
        values["API_KEY_FILE"], sources["api_key_file"] = names.state_path(values["STATE_DIR"], names.KEY), "derived"
    values["API_KEY_FILE"] = os.path.expanduser(values["API_KEY_FILE"])
    nodes = _nodes(layers, targets, values["WORKER_MODEL_DIR"] or None, sources)
    _topology(values, len(nodes), sources)
    return config_class(own)(
        **{k: v for s in own for k, v in s.field_values(values[s.name]).items()},
        engine=tuple((s.name, values[s.name]) for s in engine.SETTINGS), nodes=nodes, sources=sources,
        values=values, settings=settings, engine_args=tuple((k, val, src) for k, (val, src) in changes["args"].items()),
        engine_env=tuple((k, val, src) for k, (val, src) in changes["env"].items()))


def _email(values):
    """E-mail needs its server and From address; a user needs its password file, and the other way round."""
    if values["ALERT_EMAIL_TO"]:
        for need in ("ALERT_SMTP_SMARTHOST", "ALERT_EMAIL_FROM"):
            if not values[need]:
                raise ConfigError(f"ALERT_EMAIL_TO is set but {need} is empty: set it too (docs/monitoring.md), "
                                  "or unset ALERT_EMAIL_TO")
    if bool(values["ALERT_SMTP_USER"]) != bool(values["ALERT_SMTP_PASSWORD_FILE"]):
        given, missing = (("ALERT_SMTP_USER", "ALERT_SMTP_PASSWORD_FILE") if values["ALERT_SMTP_USER"]
                          else ("ALERT_SMTP_PASSWORD_FILE", "ALERT_SMTP_USER"))
        raise ConfigError(f"{given} is set but {missing} is empty: the mail server's login needs both")


def _flag_settings(args, values, engine):
    """A profile's [args] may not contradict the setting a flag follows (PORT gives --port)."""
    for flag, name in engine.FLAG_SETTINGS.items():
        value, source = args.get(flag, (str(values[name]), ""))
        if value != str(values[name]):
            shown = "false" if value is None else f'"{value}"'
            raise ConfigError(f"conf/{source[8:]}.toml [args] {flag} = {shown} contradicts {name}={values[name]}: "
                              f"remove it from [args] and set {name} (`{name.lower()}` in a profile) instead")


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


def _profile_layer(name, prof, changes, settings, engine):
    """A profile's settings as a Layer, every key and type checked against `settings`; its [args] and
    [env] go to `changes` (checked for the engine's secret variables too)."""
    where = f"conf/{name}.toml"
    values, per_node = {}, {}
    by_key = {s.key: s for s in settings if not s.env_only}
    known = {s.name for s in settings}
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
                    changes[k][key] = (_engine_change(where, k, key, val, engine), f"profile {name}")
            continue
        s = by_key.get(k)
        if s is None:
            if k.upper() in known:
                raise ConfigError(f"{where}: {k} may be set only in the environment: set {k.upper()} there (a "
                                  "secret, the profile's own name or a variable other tools read too never goes "
                                  "into a file)")
            raise ConfigError(f"{where}: unknown setting {k!r}{kinds.nearest(k, by_key)}: the settings "
                              "are docs/settings.md's table in lower case; per-node values go under [overrides]")
        values[s.name] = kinds.toml_type(s, f"{where} {k}", v)
    return Layer(f"profile {name}", values, per_node)


def _override(where, key, value):
    """One [overrides] entry: a per-node variable (R<N>_IP, HEAD_IFNAME, ...) and a string or number."""
    s = schema.per_node_setting(key)
    if s is None:
        known = [f"R{r}_{k}" for r in range(9) for k in schema.PER_NODE] + [
            f"{p}_{k}" for p in ("HEAD", "WORKER") for k in schema.PER_NODE]
        raise ConfigError(f"{where} [overrides]: unknown variable {key!r}{kinds.nearest(key, known)}: expected "
                          "per-node values R<N>_IP, R<N>_IFNAME, R<N>_HCAS, R<N>_GID_INDEX, R<N>_MODEL_DIR")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ConfigError(f"{where} [overrides] {key} = {value!r} is not valid: expected a string")
    value = str(value)
    kinds.parse(s, f"{where} [overrides] {key}", value)       # checked now, even for ranks not configured
    return value


def _engine_change(where, table, key, value, engine):
    """One [args] or [env] entry of a profile: a string replaces the value (an [env] one may add it),
    false drops it. Never a secret: the key file is the one way the API key reaches rank 0."""
    ok = (re.match(r"^--[a-z0-9-]+$", key) if table == "args" else re.match(r"^[A-Z_][A-Z0-9_]*$", key))
    if not ok or not (value is False or isinstance(value, str)) or len(str(value)) > kinds.MAX_VALUE_LEN:
        what = "a --flag" if table == "args" else "an environment variable name"
        raise ConfigError(f"{where} [{table}] {key} = {value!r}: expected {what} = \"value\" or false")
    if key in kinds.SECRET_FLAGS + kinds.SECRET_ENV + tuple(engine.SECRET_ENV) or (isinstance(value, str) and any(
            w.split("=", 1)[0] in kinds.SECRET_FLAGS for w in value.split())):
        raise ConfigError(f"{where} [{table}] {key}: a secret never goes into a unit file; rank 0 reads the API "
                          "key from API_KEY_FILE ($STATE_DIR/api_key), HF_TOKEN comes from the environment")
    return None if value is False else value


def _workers(layers, values, sources):
    """The worker targets from the highest layer that sets WORKER or WORKERS (both in one layer: refused)."""
    for la in layers:                                   # each layer's, checked though a later one overrides it
        for k in ("WORKER", "WORKERS"):
            if k in la.values:
                kinds.parse(schema.BY_NAME[k], la.label(schema.BY_NAME[k]), la.values[k])
    layer = next(la for la in reversed(layers) if "WORKER" in la.values or "WORKERS" in la.values)
    given = [k for k in ("WORKER", "WORKERS") if str(layer.values.get(k, "")).strip()]
    if len(given) == 2:
        raise ConfigError(f"WORKER and WORKERS are both set in the {layer.source}: keep one "
                          "(WORKERS=user@a,user@b lists every worker, WORKER names the only one)")
    for k in ("WORKER", "WORKERS"):
        s = schema.BY_NAME[k]
        values[k] = kinds.parse(s, layer.label(s), layer.values.get(k, ""))
        sources[s.key] = layer.source
    return values["WORKERS"] or ((values["WORKER"],) if values["WORKER"] else ())


def _image(env, values, sources):
    """IMG from the environment, else the image in IMAGE_FILE when set, else the configured image;
    pinned by digest unless ALLOW_UNPINNED_IMAGE."""
    if values["IMAGE_FILE"] and "IMG" not in env:
        try:
            with open(os.path.expanduser(values["IMAGE_FILE"])) as f:
                image = f.read(kinds.MAX_VALUE_LEN).strip()
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"IMAGE_FILE={values['IMAGE_FILE']!r} cannot be read "
                              f"({getattr(err, 'strerror', None) or err}): write the pinned image reference there "
                              "(for the lab: make lab-up) or set IMG") from None
        values["IMG"], sources["image"] = image, "file " + values["IMAGE_FILE"]
    image = values["IMG"]
    if not kinds.IMAGE_RE.match(image) or (not values["ALLOW_UNPINNED_IMAGE"] and not kinds.DIGEST_RE.match(image)):
        raise kinds.bad("IMG", image, "an image pinned by digest, repo@sha256:<64 hex> "
                         "(set ALLOW_UNPINNED_IMAGE=1 to accept a tag)")


def _topology(values, nodes, sources):
    """GROUPS against the node count (each group the same size; several only behind the door), then TP_SIZE
    and NNODES against a group's node count (0: that count): one rank per node, TP_SIZE / count GPUs on each."""
    groups = values["GROUPS"]
    if nodes % groups:
        raise ConfigError(f"GROUPS={groups} with {nodes} node(s): the nodes must split into groups of equal size "
                          f"(set GROUPS to a divisor of {nodes}, or add nodes to WORKERS)")
    if groups > 1 and not values["GATEWAY"]:
        raise ConfigError(f"GROUPS={groups} with GATEWAY=0: several groups are served only behind the door "
                          "(set GATEWAY=1, or GROUPS=1)")
    count, per = nodes // groups, " a group" if groups > 1 else ""
    for name in ("TP_SIZE", "NNODES"):
        if not values[name]:
            values[name], sources[name.lower()] = count, "derived"
    tp_size, nnodes = values["TP_SIZE"], values["NNODES"]
    if nnodes != count:
        raise ConfigError(f"NNODES={nnodes} with {count} node(s){per}: expected {count} (one rank per node; "
                          "WORKER/WORKERS and GROUPS set the node count) or 0")
    if tp_size % count:
        raise ConfigError(f"TP_SIZE={tp_size} with {count} node(s){per}: expected a multiple of {count} (each node "
                          f"runs TP_SIZE/{count} of the GPUs) or 0 for the node count")


def _profile_chain(profile):
    """[(name, its settings)] for the profile and the profiles it is based on (`base = "..."`), the most
    basic first."""
    chain = {}
    via = "DSV41_PROFILE"
    while profile:
        path = CONF_DIR / f"{profile}.toml"
        if not re.match(r"^[A-Za-z0-9_-]+$", profile) or not path.exists():
            known = sorted(p.stem for p in CONF_DIR.glob("*.toml"))
            raise kinds.bad(via, profile, f"one of {', '.join(known)} (files in conf/)")
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
            if la.source == "environment":              # HEAD_IP is checked though R0_IP wins
                kinds.parse(schema.per_node_setting(var), var, la.per_node[var])

    def per_rank(rank, key):
        names_ = [f"R{rank}_{key}"] + {0: ["HEAD_" + key], 1: ["WORKER_" + key]}.get(rank, [])
        for la in reversed(layers):
            for var in names_:
                if var in la.per_node:
                    sources[f"r{rank}.{key.lower()}"] = f"{la.source} ({var})"
                    s = schema.per_node_setting(var)
                    value = kinds.parse(s, la.label(s, f"[overrides] {var}") if la.source != "environment"
                                        else var, la.per_node[var])
                    return None if value == "" else value     # an empty path: none; GID index 0 is one
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
