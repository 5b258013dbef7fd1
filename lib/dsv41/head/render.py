"""doit render: every node's units written under $STATE_DIR/units/r<N>/, without installing them; with the
gateway, its HAProxy config too (units/r0/haproxy.cfg, beside empty maps so `haproxy -c -f` checks it there)."""
import os

from dsv41.head.core import preflight, units
from dsv41.head.core.cluster import Cluster


def render(cfg):
    """doit render: write every node's units under $STATE_DIR/units/r<N>/ (changed files only).
    With every per-node fabric value given by override no node is contacted; a worker's home is
    then assumed from its ssh user (/root or /home/<user>)."""
    cl = Cluster(cfg)
    fab = preflight.resolved_fabric(cl, offline=True)
    offline = fab is not None
    if not offline:
        fab = preflight.resolved_fabric(cl)
    else:
        for n in cl.workers:
            user = n.target.split("@")[0] if "@" in n.target else os.environ.get("USER", "root")
            n.assume_home("/root" if user == "root" else f"/home/{user}")
    rendered = {cl.spec(n).rank: units.render_units(cfg, cl.recipe, cl.spec(n), fab, cl.paths(n)) for n in cl.nodes}
    if cfg.layout.door:
        rendered[0].update(units.gateway_config_files(cfg))
    out = units.rendered_dir(cfg)
    units.write_rendered(cfg, rendered, out)
    note = " (no node contacted; workers' homes assumed from their ssh users)" if offline else ""
    print(f"rendered units for {len(rendered)} nodes in {out}{note}")
