"""The watchdog's copy of the settings: the resolved Config as JSON-able data without secrets, what a
service started later runs on (so that neither the environment nor conf/ can change under it), and
the Config read back from it. A release records the same data. The engine's own settings are keys
of their own in it (kv_bytes, caps, ...), as dsv41's are."""
import dataclasses

from dsv41.settings import schema
from dsv41.settings.config import Config, NodeSpec
from dsv41.settings.kinds import ConfigError

NOT_RESOLVED = ("hf_token", "alert_webhook_url", "sources", "values", "settings", "engine")


def resolved(cfg):
    """{field or engine setting key: value} of cfg, no secret."""
    data = dataclasses.asdict(cfg)
    out = {f.name: data[f.name] for f in dataclasses.fields(cfg) if f.name not in NOT_RESOLVED}
    out.update({name.lower(): value for name, value in data["engine"]})
    return out


def from_resolved(data, engine=schema.ENGINE):
    """The Config resolved() wrote; ConfigError when it was written by another version."""
    def tuples(v):
        return tuple(tuples(x) for x in v) if isinstance(v, list) else v
    own = [s.name for s in engine.SETTINGS]
    want = {f.name for f in dataclasses.fields(Config)} - set(NOT_RESOLVED) | {n.lower() for n in own}
    if not isinstance(data, dict) or set(data) != want:
        raise ConfigError("the resolved settings were written by another version: run `doit launch`")
    try:
        values = {k: tuples(v) for k, v in data.items() if k.upper() not in own}
        values["nodes"] = tuple(NodeSpec(**{k: tuples(x) for k, x in n.items()}) for n in data["nodes"])
        return Config(**values, engine=tuple((n, tuples(data[n.lower()])) for n in own),
                      hf_token="", alert_webhook_url="", sources={}, values={},
                      settings=schema.table(engine))
    except (TypeError, AttributeError) as err:
        raise ConfigError(f"the resolved settings cannot be read ({err}): run `doit launch`") from None
