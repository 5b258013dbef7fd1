"""Cluster: the configured nodes and what this run learned about them (homes, paths, probes, uids).
Every command module works through one Cluster per run."""
import json
from typing import NamedTuple

from dsv41 import names
from dsv41.head.core import engine
from dsv41.head.core.nodes import Node, connect, ship_code


class Paths(NamedTuple):
    model_dir: str
    state_dir: str


class Cluster:
    def __init__(self, cfg, recipe=None):
        self.cfg = cfg
        self.recipe = recipe or engine.for_config(cfg)
        self.nodes = [Node.from_spec(s, cfg) for s in cfg.nodes]
        self.specs = {n.name: s for n, s in zip(self.nodes, cfg.nodes)}
        self.facts = {}
        self._prefix = {}
        self._uid = {}

    @property
    def head(self):
        return self.nodes[0]

    @property
    def workers(self):
        return self.nodes[1:]

    def spec(self, node):
        return self.specs[node.name]

    def engine_units(self, node):
        """The recipe's units on this node, in their start order there."""
        return list(self.recipe.units(self.spec(node)))

    def node(self, spec):
        return self.nodes[self.cfg.nodes.index(spec)]

    def unit_names(self, node):
        return [names.MEMGUARD_UNIT, *self.engine_units(node)] + ([names.WATCHDOG_UNIT] if node is self.head else [])

    def paths(self, node):
        home = node.home()
        return Paths(self.cfg.model_dir_on(self.spec(node), home), self.cfg.state_dir_on(self.spec(node), home))

    def module(self, node, name, *args):
        """argv running dsv41.node.<name> on the node from the code shipped to its state dir."""
        if node.name not in self._prefix:
            self._prefix[node.name] = ship_code(node, self.paths(node).state_dir)
        return self._prefix[node.name] + [f"dsv41.node.{name}", *args]

    def probe(self, node):
        """One call on the node: installed units and their states, containers, image, trip marker,
        memory, state file hashes (dsv41.node.probe)."""
        p = self.paths(node)
        req = {"state_dir": p.state_dir, "model_dir": p.model_dir, "units": self.unit_names(node),
               "image": self.cfg.image, "containers": list(self.recipe.containers(self.spec(node))),
               "files": [names.SECRET_KEY, names.GUARD_SETTINGS, f"{names.PLANS}/{self.cfg.plan_name}",
                         names.WATCHDOG_SETTINGS]}
        out = node.run(self.module(node, "probe", json.dumps(req))).stdout
        self.facts[node.name] = json.loads(out)
        self._uid[node.name] = self.facts[node.name]["uid"]
        return self.facts[node.name]

    def connect(self):
        """First contact with every node at once; returns those that did not answer (their errors
        are in .unreachable; every later command to them fails at once)."""
        return connect(self.nodes)

    def probe_all(self):
        self.connect()
        return {n.name: self.probe(n) for n in self.nodes}

    def uid(self, node):
        """The node user's uid: from its probe, else asked (never assumed)."""
        if node.name not in self._uid:
            self._uid[node.name] = int(node.run(["id", "-u"]).stdout.strip())
        return self._uid[node.name]

    def priv(self, node, argv):
        """argv as root: through sudo -n when the node's user is not root."""
        return list(argv) if self.uid(node) == 0 else ["sudo", "-n", *argv]


def say(node, text):
    print(f"[{node.name}] {text}", flush=True)
