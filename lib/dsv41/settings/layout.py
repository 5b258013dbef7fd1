"""The serving layout: where clients and dsv41 reach the engine, as one typed value. It is made from a
Config (Config.layout): the settings' own, or the release in service's (core.release_status.as_served,
for the commands that judge what runs). Only this module and the settings read the raw GATEWAY switch.

With the door (GATEWAY=1), HAProxy (dsv41-gateway) answers on PORT and rank 0 listens on
127.0.0.1:ENGINE_PORT with its own key; without it, rank 0 serves PORT itself with the client key.

Behind the door are the serving groups (`groups`, GROUPS of them), each an engine of its own the door routes
among: group 0's rank 0 on the head's loopback, every other group's through the side door on its first node
(that node's fabric address, ENGINE_PORT), which lets only the head door's engine key in. The layout of one
group's Config (Config.group_config) is the same door, with that group's engine as `engine_url`."""
import dataclasses

from dsv41 import names


@dataclasses.dataclass(frozen=True)
class Group:
    """One serving group behind the door: its nodes (names; the first holds its rank 0) and where the door
    reaches its engine (rank 0 on the head's loopback, or the side door on the group's first node)."""
    index: int
    nodes: tuple
    host: str
    port: int
    server: str            # its server in the door's backend (names.door_server)

    @property
    def target(self):
        """host:port where the head reaches its engine."""
        return f"{_url_host(self.host)}:{self.port}"


@dataclasses.dataclass(frozen=True)
class Layout:
    door: bool             # the gateway runs on the head in front of rank 0
    port: int              # PORT: where clients connect (the door, or rank 0 itself)
    engine_port: int       # ENGINE_PORT: rank 0 behind the door (unused without one)
    head_ip: str           # the head's address clients use ("" in a one-machine setup: 127.0.0.1)
    api_key_file: str      # the client key (the door's `default`)
    state_dir: str         # the head's state dir
    groups: tuple = ()     # Group, ...: the engines behind the door, in order
    scope: int = 0         # the group whose engine engine_url is (a group's Config; group 0 otherwise)

    def settings(self):
        """{Config field: value} of the settings this layout is made of (a release records them)."""
        return {"gateway": self.door, "port": self.port, "engine_port": self.engine_port}

    @property
    def api_url(self):
        """What clients get: the gateway on PORT (rank 0 itself without the door)."""
        return f"http://{self.head_ip or '127.0.0.1'}:{self.port}/v1"

    @property
    def engine_url(self):
        """Rank 0's own API server (of the group in scope), where dsv41 judges the engine: behind the door on the
        head's loopback or through the group's side door."""
        if not self.door:
            return self.api_url
        g = self.groups[self.scope] if self.groups else Group(0, (), "127.0.0.1", self.engine_port, "r0")
        return f"http://{g.target}/v1"

    @property
    def engine_listen(self):
        """(host, port) rank 0's API server binds."""
        return ("127.0.0.1", self.engine_port) if self.door else ("0.0.0.0", self.port)

    @property
    def engine_key_file(self):
        """Where rank 0's key is kept on the head: its own file behind the door, else the client key's."""
        return names.state_path(self.state_dir, names.ENGINE_KEY_SOURCE) if self.door else self.api_key_file

    @property
    def ports(self):
        """((port, setting), ...) the head serves on: PORT, and ENGINE_PORT behind the door."""
        return ((self.port, "PORT"),) + (((self.engine_port, "ENGINE_PORT"),) if self.door else ())

    @property
    def head_units(self):
        """The serving units the head runs besides its rank: with the door, the socket unit that holds PORT and
        the gateway that takes it from there."""
        return (names.GATEWAY_SOCKET_UNIT, names.GATEWAY_UNIT) if self.door else ()


def records(state_dir, scope=None):
    """Where the head keeps the records of serving group `scope` (its watchdog's, its recoveries', its readiness):
    $STATE_DIR/groups/g<N> (None: the whole's, the state dir itself)."""
    return state_dir if scope is None else names.state_path(state_dir, names.GROUP_RECORDS, f"g{scope}")


def _url_host(host):
    return f"[{host}]" if ":" in host else host


def address(spec):
    """Where the head reaches a node: its fabric address (R<N>_IP), else the host of its ssh target."""
    if spec.ip:
        return spec.ip
    host = (spec.target or "").rpartition("@")[2]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def of(cfg):
    """The Layout a Config describes."""
    specs = [cfg.group_specs(i) for i in range(cfg.groups)] if cfg.nodes else [()]
    groups = tuple(Group(i, tuple(s.name for s in g), "127.0.0.1" if i == 0 else address(g[0]), cfg.engine_port,
                         names.door_server(i, cfg.groups)) for i, g in enumerate(specs))
    head = cfg.all_nodes[0] if cfg.nodes else None
    return Layout(door=bool(cfg.gateway), port=cfg.port, engine_port=cfg.engine_port,
                  head_ip=(head.ip if head else "") or "", api_key_file=cfg.api_key_file,
                  state_dir=cfg.state_dir, groups=groups, scope=cfg.scope or 0)
