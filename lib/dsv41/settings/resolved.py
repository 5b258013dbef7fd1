"""The watchdog's copy of the settings: the resolved Config as JSON-able data without secrets, what a
service started later runs on (so that neither the environment nor conf/ can change under it), and
the Config read back from it. A release records the same data. The engine's own settings are keys
of their own in it (kv_bytes, caps, ...), as dsv41's are.

A record outlives the version that wrote it (a rollback runs a release recorded months before): a
setting missing from it (declared since) takes what a record without it meant (absent(): its default,
or the value its declaration gives, GATEWAY off); a key this version does not know (a record of a newer
version, or of a setting since removed) is refused, never dropped, since running without it would not
run what was recorded. This is the one place old records are upgraded."""
import dataclasses

from dsv41.settings import kinds, schema
from dsv41.settings.config import NodeSpec, config_class
from dsv41.settings.kinds import ConfigError

NOT_STORED = ("sources", "values", "settings", "engine", "cluster", "scope")   # cluster, scope: one group's view


def _secret(own):
    """The Config fields of the secrets: never written."""
    return {name for s in own if s.kind in kinds.HIDDEN_KINDS for name, _ in s.fields}


def resolved(cfg, own=schema.OWN):
    """{field or engine setting key: value} of cfg, no secret."""
    data = dataclasses.asdict(cfg)
    skip = set(NOT_STORED) | _secret(own)
    out = {f.name: data[f.name] for f in dataclasses.fields(cfg) if f.name not in skip}
    out.update({name.lower(): value for name, value in data["engine"]})
    return out


def absent(engine=schema.ENGINE, own=schema.OWN):
    """What a record missing each setting means: what resolved() writes for it at its default, or at the
    value its declaration says a record without it meant (Setting.absent)."""
    out = {}
    for s in own:
        out.update(s.field_values(kinds.parse(s, s.name, s.default) if s.absent is None else s.absent))
    engine_values = engine.derive({s.name: kinds.parse(s, s.name, s.default) for s in engine.SETTINGS})
    out.update({name.lower(): value for name, value in engine_values.items()})
    return {**out, "engine_args": (), "engine_env": ()}


def _kind(v):
    return ("boolean" if isinstance(v, bool) else "number" if isinstance(v, (int, float)) else
            "list" if isinstance(v, (list, tuple)) else "text" if isinstance(v, str) else type(v).__name__)


def _same_kind(value, meant):
    """A recorded value of the kind this version's value of it has (any, where that may be None)."""
    return meant is None or _kind(value) == _kind(meant)


def from_resolved(data, engine=schema.ENGINE, own=schema.OWN):
    """The Config resolved() wrote (by this version or an older one); ConfigError when it cannot be read."""
    def tuples(v):
        return tuple(tuples(x) for x in v) if isinstance(v, list) else v
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), (list, tuple)):
        raise ConfigError("the resolved settings have no nodes: run `doit launch`")
    known = absent(engine, own)
    unknown = sorted(set(data) - set(known) - {"nodes"})
    if unknown:
        raise ConfigError(f"the resolved settings hold {unknown[0]!r}, which this version does not know (written by "
                          "a newer one?): run `doit launch`")
    wrong = next((k for k in sorted(data) if k in known and not _same_kind(data[k], known[k])), None)
    if wrong:
        raise ConfigError(f"the resolved settings hold {wrong}={data[wrong]!r}, not a {_kind(known[wrong])} as this "
                          "version reads it: run `doit launch`")
    data, secret = {**known, **data}, _secret(own)
    names = [s.name for s in engine.SETTINGS]
    try:
        values = {k: tuples(v) for k, v in data.items() if k.upper() not in names and k not in secret}
        values["nodes"] = tuple(NodeSpec(**{k: tuples(x) for k, x in n.items()}) for n in data["nodes"])
        return config_class(own)(**values, **{f: "" for f in secret},
                                 engine=tuple((n, tuples(data[n.lower()])) for n in names),
                                 sources={}, values={}, settings=schema.table(engine, own))
    except (TypeError, AttributeError) as err:
        raise ConfigError(f"the resolved settings cannot be read ({err}): run `doit launch`") from None
