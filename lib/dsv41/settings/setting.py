"""What a setting is: its environment variable, kind (a validator in settings/kinds.py), default,
accepted values, where it may be set, what it means and the fields of Config it makes (derived values
such as minutes to seconds declared with it). dsv41's own are listed in settings/schema.py, an
engine's in its package (dsv41/vllm/settings.py)."""
from typing import NamedTuple


class Setting(NamedTuple):
    name: str                 # the environment variable
    kind: str                 # a key of KINDS
    default: object           # as a profile writes it (TOML types)
    help: str
    lo: float | None = None   # int, float: the accepted range
    hi: float | None = None
    pattern: str = ""         # text: a regular expression the value matches (empty: only when the default is)
    expect: str = ""          # text, words, list: what is accepted, in words
    choices: tuple = ()       # choice, list: the accepted words
    env_only: bool = False    # never in a file: secrets, the profile's own name
    shown: str = ""           # docs/settings.md's default column when the default needs words
    field: str | None = ""    # its field of Config: "" the key; None none (WORKER: read into Config.nodes)
    to: object = None         # the field's value from the parsed one (minutes to seconds, -1 to None); None: as is
    also: tuple = ()          # more fields made from it: ((name, function of the parsed value or None), ...)
    absent: object = None     # what a record written before this setting existed meant, when not its default
                              # (GATEWAY: off); None: the default (settings/resolved.py reads old records)

    @property
    def fields(self):
        """((Config field, function of the parsed value or None), ...): the fields this setting makes."""
        return () if self.field is None else ((self.field or self.key, self.to), *self.also)

    def field_values(self, value):
        """{Config field: value} this setting makes of its parsed value."""
        return {name: value if to is None else to(value) for name, to in self.fields}

    @property
    def key(self):
        """The profile key: the variable in lower case (IMG's is `image`)."""
        return "image" if self.name == "IMG" else self.name.lower()

    @property
    def where(self):
        return "environment" if self.env_only else "environment, profile"


def number(x):
    """A bound as a person writes it: 65535, 0.5, 1e+20."""
    return str(x) if isinstance(x, int) else f"{x:g}"
