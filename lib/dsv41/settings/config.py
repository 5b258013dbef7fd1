"""The resolved settings as one frozen Config (and a NodeSpec per rank): what every verb and the
machinery read, its fields made from the settings' declarations (settings/schema.py). settings/layers.py
makes one from the defaults, a profile and the environment; settings/resolved.py writes and reads the
copy a later service runs on. The engine's own settings (its flags, declared by its recipe:
dsv41/vllm/settings.py) are in `engine`, by variable name."""
import dataclasses
import functools
import os
from types import SimpleNamespace

from dsv41.settings import kinds, layout, schema
from dsv41.settings.kinds import ConfigError


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


class _Config:
    """What every Config does besides holding its fields (config_class() makes the fields)."""

    @property
    def head(self):
        return self.nodes[0]

    # ---- serving groups (GROUPS): the nodes split in order into groups of equal size ----

    @property
    def all_nodes(self):
        """Every node, the head first: `nodes` itself, unless this Config is one group's (group_config)."""
        return self.cluster or self.nodes

    @property
    def groups_here(self):
        """How many serving groups `nodes` holds: GROUPS, or 1 for one group's Config (group_config)."""
        return 1 if self.scope is not None else self.groups

    def group_specs(self, index):
        """The NodeSpecs of serving group `index`, its first (its rank 0) first."""
        size = len(self.all_nodes) // self.groups
        return tuple(self.all_nodes[index * size:(index + 1) * size])

    def group_of(self, spec):
        """The index of the serving group a node is in."""
        return [s.name for s in self.all_nodes].index(spec.name) // (len(self.all_nodes) // self.groups)

    def leader(self, spec):
        """The first node of a node's group: where its group's rank 0 and API server run."""
        return self.group_specs(self.group_of(spec))[0]

    def address(self, spec):
        """Where the head reaches a node: its fabric address (R<N>_IP), else its ssh target's host ("" for the head
        without R0_IP)."""
        return layout.address(spec)

    def leads(self, spec):
        """Whether a node runs its group's rank 0 (the API server, with the key)."""
        return self.leader(spec).name == spec.name

    def side_door_node(self, spec):
        """Whether a node holds a side door: its group's first node, off the head (GROUPS > 1)."""
        return self.leads(spec) and spec.name != self.all_nodes[0].name

    @property
    def records(self):
        """Where this Config's watchdog, recoveries and readiness keep their records on the head: the state dir,
        or of one group's Config (GROUPS > 1) its folder $STATE_DIR/groups/g<N>."""
        return layout.records(self.state_dir, self.scope)

    def group_config(self, index):
        """This Config narrowed to serving group `index`: its nodes (the group's first as `head`), the rest of
        the settings the same. With one group, the Config itself."""
        if self.groups == 1:
            return self
        return dataclasses.replace(self, nodes=self.group_specs(index), cluster=self.all_nodes, scope=index)

    @property
    def workers(self):
        return self.nodes[1:]

    def engine_value(self, name):
        """One of the engine's own settings, by its variable name (KV_BYTES)."""
        return dict(self.engine)[name]

    def engine_settings(self):
        """The engine's own settings as attributes by lower-case name: .kv_bytes, .caps, ..."""
        return SimpleNamespace(**{name.lower(): value for name, value in self.engine})

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
    def layout(self):
        """The serving layout these settings describe (settings.layout.Layout)."""
        return layout.of(self)

    @property
    def api_url(self):
        """What clients get: the gateway on PORT (rank 0 itself with GATEWAY=0)."""
        return self.layout.api_url

    @property
    def engine_url(self):
        """Rank 0's own API server, where dsv41 judges the engine (settings.layout.Layout.engine_url)."""
        return self.layout.engine_url


def field_type(s, name):
    """The type of a Config field: its value's at the setting's default (a kind's parsed value, or what its
    declaration derives from it), with None allowed where the default gives None (NCCL_IB_GID_INDEX=-1)."""
    value = s.field_values(kinds.parse(s, s.name, s.default))[name]
    return type(value) if value is not None else kinds.PY_TYPES[s.kind] | None


@functools.cache
def config_class(own):
    """The frozen Config of the settings `own` (schema.OWN): the fields each setting declares (settings/
    setting.py: its key, or a value derived from it), then the engine's settings, the profile's changes to
    the engine's argv and environment, and the nodes."""
    fields = [(name, field_type(s, name)) for s in own for name, _ in s.fields]
    fields += [("engine", tuple),          # ((NAME, value), ...): the engine's own settings, derived
               ("engine_args", tuple),     # (("--flag", value or None to drop it, source), ...): a profile's changes
               ("engine_env", tuple),      # (("NAME", value or None to drop it, source), ...); "{rank}": the rank
               ("nodes", tuple),           # NodeSpec, ...
               ("sources", dict, dataclasses.field(compare=False, repr=False)),   # {key or r<N>.<key>: where from}
               ("values", dict, dataclasses.field(compare=False, repr=False)),    # {setting NAME: effective value}
               ("settings", tuple, dataclasses.field(compare=False, repr=False, default=())),  # checked against
               ("cluster", tuple, dataclasses.field(default=(), repr=False)),  # every node, when `nodes` is one group's
               ("scope", int | None, dataclasses.field(default=None)),    # which group `nodes` is (group_config)
               ]
    cls = dataclasses.make_dataclass("Config", fields, bases=(_Config,), frozen=True)
    cls.__module__ = __name__
    return cls


Config = config_class(schema.OWN)
