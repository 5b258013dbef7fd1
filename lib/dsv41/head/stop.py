"""doit stop (the head's rank first, then the workers', then the memory guards) and doit clear-trip."""
from dsv41 import names
from dsv41.head import commands
from dsv41.head.cluster import Cluster, say
from dsv41.head.launch import stop_ranks


def stop(cfg):
    cl = Cluster(cfg)
    stop_ranks(cl)
    for n in cl.nodes:
        say(n, f"stopped {cl.rank_unit(n)}")
    for n in cl.nodes:
        n.run(cl.priv(n, commands.systemctl("stop", names.MEMGUARD_UNIT)), check=False)
        say(n, "stopped the memory guard")


def clear_trip(cfg):
    cl = Cluster(cfg)
    for n in cl.nodes:
        marker = commands.tripped_marker(cl.paths(n).state_dir)
        r = n.run(commands.rm_f("--", marker))
        say(n, f"cleared {marker}" if r.ok else f"could not clear {marker}")
