"""Cluster: the configured nodes and what this run learned about them (homes, paths, probes, uids).
Every command module works through one Cluster per run."""
import json
import shlex
from typing import NamedTuple

from dsv41 import names
from dsv41.client.api import Client
from dsv41.errors import UserError
from dsv41.settings.paths import LIB_DIR
from dsv41.head.core import commands, engine, state
from dsv41.head.core.apikey import engine_key, engine_key_file, group_key, read_key, write_key  # noqa: F401 (the verbs' way to the keys)
from dsv41.head.core.gateway import Gateway
from dsv41.head.core.nodes import Node, NodeError, connect, forget_unreachable, say  # noqa: F401 (say: for the verbs)


class Paths(NamedTuple):
    model_dir: str
    state_dir: str


# What a node gets: the node package and the shared standard-library modules it imports.
SHIPPED = ("dsv41/__init__.py", "dsv41/errors.py", "dsv41/files.py", "dsv41/names.py", "dsv41/node/")


def ship_code(node, state_dir):
    """Copy the node code to <state_dir>/lib on a node, the head included (services run it from there:
    workers may have no internet or venv, and the checkout may move); returns node_python's prefix."""
    dest = f"{state_dir}/{names.LIB}/"
    node.run(commands.mkdir(dest))
    ssh = [] if node.is_local else ["-e", shlex.join(node.ssh_command())]
    includes = [f"--include={p}" if not p.endswith("/") else f"--include={p}***" for p in SHIPPED]
    Node("head").run(commands.rsync_code(f"{LIB_DIR}/dsv41", includes, ssh, node.rsync_target(dest)))
    return commands.node_python(state_dir)


class Cluster:
    def __init__(self, cfg, recipe=None):
        self.cfg = cfg
        self.recipe = recipe or engine.for_config(cfg)
        self.nodes = [Node.from_spec(s, cfg) for s in cfg.nodes]       # in cfg.nodes' order
        self._by_name = {n.name: n for n in self.nodes}
        # the machine doit runs on, where the door and the records are: the head (also for one group's Cluster)
        self.home = self._by_name.get(cfg.all_nodes[0].name) or Node.from_spec(cfg.all_nodes[0], cfg)
        self.specs = {s.name: s for s in cfg.all_nodes}      # the head's too, for one group's Cluster (home)
        self.states = {}                # node name -> state.NodeState from this run's probe
        self._prefix = {}
        self._uid = {}

    @property
    def head(self):
        """The head's Node (which node is the head: the configuration's head; of one group's Cluster, that
        group's first node, where its rank 0 runs)."""
        return self.node(self.cfg.head)

    @property
    def workers(self):
        return [self.node(s) for s in self.cfg.workers]

    def groups(self):
        """[Cluster] of each serving group this Cluster holds (Config.group_config), in order: itself when it is
        one group's, or there is one."""
        if self.cfg.scope is not None or self.cfg.groups == 1:
            return [self]
        return [Cluster(self.cfg.group_config(i)) for i in range(self.cfg.groups)]

    def spec(self, node):
        return self.specs[node.name]

    def engine_units(self, node):
        """The recipe's units on this node, in their start order there."""
        return list(self.recipe.units(self.spec(node)))

    def node(self, spec):
        """The Node of a NodeSpec."""
        return self._by_name[spec.name]

    def unit_names(self, node):
        exporter = [names.EXPORTER_UNIT, names.EXPORTER_DROPIN] if self.cfg.metrics_dir else []  # monitoring
        head = [names.WATCHDOG_UNIT, names.GATEWAY_SOCKET_UNIT, names.GATEWAY_UNIT] if node is self.home else []
        side = [names.SIDE_DOOR_UNIT] if node is not self.home and self.cfg.groups > 1 else []
        return [names.MEMGUARD_UNIT, *self.engine_units(node)] + head + side + exporter

    def paths(self, node):
        home = node.home()
        return Paths(self.cfg.model_dir_on(self.spec(node), home), self.cfg.state_dir_on(self.spec(node), home))

    def module(self, node, name, *args):
        """argv running dsv41.node.<name> on the node from the code shipped to its state dir."""
        if node.name not in self._prefix:
            self._prefix[node.name] = ship_code(node, self.paths(node).state_dir)
        return self._prefix[node.name] + [f"dsv41.node.{name}", *args]

    def probe(self, node, versions=False, caches=False):
        """One call on the node: installed units and their states, containers, image, trip marker,
        memory, state file hashes (dsv41.node.probe), as a state.NodeState; with versions also the
        kernel, driver and Docker versions (what a release records), with caches the engine's caches of
        the image (a walk of their folders, bounded: status and the restart only)."""
        p = self.paths(node)
        req = {"state_dir": p.state_dir, "model_dir": p.model_dir, "units": self.unit_names(node),
               "image": self.cfg.image, "containers": list(self.recipe.containers(self.spec(node))),
               "files": [names.SECRET_KEY, names.GUARD_SETTINGS, f"{names.PLANS}/{self.cfg.plan_name}",
                         names.WATCHDOG_SETTINGS, names.GATEWAY_CONFIG, names.SIDE_DOOR_CONFIG, names.SIDE_DOOR_KEYS],
               **({"versions": True} if versions else {}),
               **({"caches": names.cache_key(self.cfg.image)} if caches else {})}
        out = node.run(self.module(node, "probe", json.dumps(req))).stdout
        self.states[node.name] = state.parse(out, node.label)
        self._uid[node.name] = self.states[node.name].uid
        return self.states[node.name]

    def refresh(self):
        """Ask every node afresh (a long-running process: the watchdog): forget who did not answer
        and what the probes said, then contact every node again."""
        forget_unreachable()
        self.states.clear()
        return self.connect()

    def engine_client(self, read_timeout, create_key=False, problems=None):
        """A client of the engine itself (rank 0's API server, behind the gateway when there is one) with
        rank 0's key (created first when create_key and missing): where dsv41 judges the engine. With a
        list for problems, a key file that cannot be read is said there and no key is sent (status and
        top still ask /health)."""
        return self._client(self.layout.engine_url, lambda: engine_key(self.cfg, create=create_key), read_timeout,
                            problems)

    @property
    def layout(self):
        """Where clients and dsv41 reach the engine (settings.layout.Layout) of the Config given: the
        settings', or the release in service's (core.release_status.as_served)."""
        return self.cfg.layout

    @property
    def gateway(self):
        """The head's gateway (core.gateway.Gateway): its door, the drain, the keys."""
        return Gateway(self)

    def door_client(self, read_timeout, problems=None):
        """A client of what clients get (the gateway on PORT) with the client key `default`."""
        return self._client(self.layout.api_url, lambda: read_key(self.cfg), read_timeout, problems)

    def _client(self, url, key_of, read_timeout, problems):
        try:
            key = key_of()
        except UserError as err:
            if problems is None:
                raise
            problems += [] if str(err) in problems else [str(err)]
            key = None
        return Client(url, key, read_timeout=read_timeout)

    def probe_argv(self, node, state_dir):
        """The probe's argv without its containers (top, run from code it shipped itself)."""
        req = {"state_dir": state_dir, "units": self.unit_names(node), "containers": []}
        return commands.node_python(state_dir) + ["dsv41.node.probe", json.dumps(req)]

    def connect(self):
        """First contact with every node at once; returns those that did not answer (their errors
        are in .unreachable; every later command to them fails at once)."""
        return connect(self.nodes)

    def observe(self, caches=False):
        """{node name: NodeState} of every node asked afresh; a node that did not answer has its
        error in its state (the watchdog looks at every node every interval)."""
        self.refresh()
        return {n.name: self.look(n, caches) for n in self.nodes}

    def look(self, node, caches=False):
        """The node's NodeState, or one holding the error when it did not answer."""
        try:
            return self.probe(node, caches=caches)
        except (NodeError, state.ProbeError) as err:
            return state.unreachable(err)

    def probe_all(self, versions=False):
        self.connect()
        return {n.name: self.probe(n, versions) for n in self.nodes}

    def uid(self, node):
        """The node user's uid: from its probe, else asked (never assumed)."""
        if node.name not in self._uid:
            self._uid[node.name] = int(node.run(commands.uid()).stdout.strip())
        return self._uid[node.name]

    def priv(self, node, argv):
        """argv as root: through sudo -n when the node's user is not root."""
        return list(argv) if self.uid(node) == 0 else ["sudo", "-n", *argv]

    def systemctl(self, node, *args, check=True):
        """systemctl as root on the node."""
        return node.run(self.priv(node, commands.systemctl(*args)), check=check)

    def unit_props(self, node, unit, *props):
        """{property: value} of a unit, read without privileges."""
        r = node.run(commands.systemctl("show", "-p", ",".join(props), unit), check=False)
        return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)

    def journal(self, node, unit, lines=None, follow=False, fg=False, check=True, since_s=None):
        """A unit's journal on the node (fg: straight to the terminal; since_s: its last seconds, timed)."""
        return node.run(commands.journalctl(unit, follow=follow, lines=lines, since_s=since_s), check=check, fg=fg)

    def docker_kill(self, node, name):
        """docker kill of a container on the node (as root); its failure (no such container) is ignored."""
        return node.run(self.priv(node, commands.docker_kill(name)), check=False)

    def remove(self, node, *paths):
        """rm -f on the node (as the node's user)."""
        return node.run(commands.rm_f("--", *paths), check=False)


def log_targets(cfg):
    """The words `doit logs` takes: each node's engine units (r<N>), memguard, watchdog."""
    return list(engine.for_config(cfg).log_units(cfg.nodes)) + ["memguard", "watchdog"]
