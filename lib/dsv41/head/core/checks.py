"""What a preflight check is: its statuses, its result line, and the registry a topic's checks are
declared in (core.network_checks, core.host_checks); core.preflight runs them."""
from typing import NamedTuple

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"


class Check(NamedTuple):
    name: str
    status: str
    detail: str
    fix: str = ""
    node: str = ""

    def line(self):
        where = f"{self.node}: " if self.node else ""
        fix = f" -- fix: {self.fix}" if self.fix and self.status != PASS else ""
        return f"{self.status}  {self.name:<16} {where}{self.detail}{fix}"


def registry():
    """({name: (function, per_node)} in the order they print, the @check decorator that fills it): one
    topic's checks. A cluster check is called as fn(ctx); a per-node check as fn(ctx, spec, facts) for
    every node that answered. Either yields (status, detail[, fix[, node]]) tuples."""
    checks = {}

    def check(name, per_node=False):
        def register(fn):
            checks[name] = (fn, per_node)
            return fn
        return register
    return checks, check
