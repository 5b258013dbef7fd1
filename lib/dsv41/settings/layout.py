"""The serving layout: where clients and dsv41 reach the engine, as one typed value. It is made from a
Config (Config.layout): the settings' own, or the release in service's (core.release_status.as_served,
for the commands that judge what runs). Only this module and the settings read the raw GATEWAY switch.

With the door (GATEWAY=1), HAProxy (dsv41-gateway) answers on PORT and rank 0 listens on
127.0.0.1:ENGINE_PORT with its own key; without it, rank 0 serves PORT itself with the client key.

Behind the door are the serving groups (`groups`), each an engine of its own the door routes among: today
one, every node's ranks in one group. The door's config and its node side already take several (a group
whose rank 0 is not the head is reached through the side door on its first node)."""
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


@dataclasses.dataclass(frozen=True)
class Layout:
    door: bool             # the gateway runs on the head in front of rank 0
    port: int              # PORT: where clients connect (the door, or rank 0 itself)
    engine_port: int       # ENGINE_PORT: rank 0 behind the door (unused without one)
    head_ip: str           # the head's address clients use ("" in a one-machine setup: 127.0.0.1)
    api_key_file: str      # the client key (the door's `default`)
    state_dir: str         # the head's state dir
    groups: tuple = ()     # Group, ...: the engines behind the door, in order

    def settings(self):
        """{Config field: value} of the settings this layout is made of (a release records them)."""
        return {"gateway": self.door, "port": self.port, "engine_port": self.engine_port}

    @property
    def api_url(self):
        """What clients get: the gateway on PORT (rank 0 itself without the door)."""
        return f"http://{self.head_ip or '127.0.0.1'}:{self.port}/v1"

    @property
    def engine_url(self):
        """Rank 0's own API server, where dsv41 judges the engine."""
        return f"http://127.0.0.1:{self.engine_port}/v1" if self.door else self.api_url

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


def of(cfg):
    """The Layout a Config describes."""
    group = Group(0, tuple(s.name for s in cfg.nodes), "127.0.0.1", cfg.engine_port, names.door_server(0, 1))
    return Layout(door=bool(cfg.gateway), port=cfg.port, engine_port=cfg.engine_port,
                  head_ip=(cfg.head.ip if cfg.nodes else "") or "", api_key_file=cfg.api_key_file,
                  state_dir=cfg.state_dir, groups=(group,))
