"""What the memory guard reads from /proc: MemAvailable (a kept-open /proc/meminfo, read at every look),
and in one pass over the processes the rank processes to kill and the biggest memory holders to name.
"""
import os

from dsv41.names import RANK_ENV
from dsv41.node.memguard import gib

RANK_ENV_B = f"{RANK_ENV}=".encode()
PAGE = os.sysconf("SC_PAGE_SIZE")


class MemInfo:
    """MemAvailable through a kept-open /proc/meminfo (about 10 us a read)."""

    def __init__(self, path="/proc/meminfo"):
        self.fd = os.open(path, os.O_RDONLY)

    def available(self):
        data = os.pread(self.fd, 16384, 0)
        i = data.index(b"MemAvailable:") + 13
        return int(data[i:data.index(b"\n", i)].split()[0]) * 1024

    def __del__(self):
        os.close(self.fd)


def _read(path, limit=-1):
    try:
        with open(path, "rb", buffering=0) as f:
            return f.read(limit) if limit > 0 else f.readall()
    except OSError:
        return b""


def scan(cids, want_ranks=True):
    """One pass over /proc: (rank processes {pid: (rank, how)}, user processes [(rss, pid)]).
    A rank process is in a container's cgroup (its id from a cidfile) or has DSV41_RANK= in its
    environment."""
    me = os.getpid()
    ranks, sizes = {}, []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        statm = _read(f"/proc/{pid}/statm", 200).split()
        rss = int(statm[1]) * PAGE if len(statm) > 1 else 0
        if rss == 0 or pid == me:
            continue  # kernel thread, zombie, gone, or the guard itself
        sizes.append((rss, pid))
        if not want_ranks:
            continue
        if cids:
            cg = _read(f"/proc/{pid}/cgroup").decode("ascii", "replace")
            hit = next((c for c in cids if c in cg), None)
            if hit:
                ranks[pid] = (cids[hit], "cgroup")
                continue
        env = _read(f"/proc/{pid}/environ")
        i = env.find(RANK_ENV_B)
        if i == 0 or (i > 0 and env[i - 1] == 0):
            value = env[i + len(RANK_ENV_B):].split(b"\0", 1)[0]
            ranks[pid] = (int(value) if value.isdigit() else None, "env")
    return ranks, sizes


def comm(pid):
    return _read(f"/proc/{pid}/comm", 64).strip().decode("utf-8", "replace") or "?"


def top_holders(sizes, n=3):
    return [{"pid": pid, "comm": comm(pid), "rss_gib": gib(rss)}
            for rss, pid in sorted(sizes, reverse=True)[:n]]


def fmt_top(top):
    return ", ".join(f"{t['comm']}[{t['pid']}] {t['rss_gib']:.2f} GiB" for t in top) or "none"
