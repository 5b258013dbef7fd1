"""`doit fabric-bench`: ib_write_bw from the head to the first worker over one HCA, against what a
healthy Spark link does."""
import shutil
import subprocess
import time

from dsv41.errors import UserError, one_line
from dsv41.head.core import commands, preflight
from dsv41.head.core.cluster import Cluster

EXPECTED_WRITE_GBPS = 112.0        # ib_write_bw on one HCA, as reported between two Sparks
NCCL_FLOOR_GBPS = 175.0            # NCCL bus bandwidth between two Sparks, all HCAs


def parse_ib_write_bw(text):
    """BW average in Gb/s from `ib_write_bw --report_gbits` output, or None."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "BW average" in line:
            for data in lines[i + 1:]:
                cols = data.split()
                if len(cols) >= 4 and cols[0].isdigit():
                    try:
                        return float(cols[3])
                    except ValueError:
                        return None
    return None


def fabric_bench(cfg, seconds=10, progress=None):
    """ib_write_bw from the head to the first worker over one HCA; returns a dict with gbps,
    expected_gbps and status (PASS/WARN)."""
    say = progress or print
    if not shutil.which("ib_write_bw"):
        raise UserError("ib_write_bw is not installed on the head: sudo apt-get install perftest "
                        "(on every node)")
    w = cfg.require_workers()[0]
    cl = Cluster(cfg)
    gathered = preflight.gather(cl, progress)
    facts = gathered.facts
    for r in (0, w.rank):
        if "error" in facts[r]:
            raise UserError(facts[r]["error"])
    if not facts[w.rank].get("tools", {}).get("ib_write_bw"):
        raise UserError(f"ib_write_bw is not installed on {w.name}: sudo apt-get install perftest there")
    fab = gathered.fabric(cfg)
    h, wk = fab[0], fab[w.rank]
    hca_h, hca_w = h.hcas[0].split(":")[0], wk.hcas[0].split(":")[0]
    server = cl.workers[0].argv_for(["timeout", str(seconds + 60), *commands.ib_write_bw(seconds, hca_w, wk.gid_index)])
    say(f"fabric-bench: {seconds} s ib_write_bw {cfg.head.name} {hca_h} -> {w.name} {hca_w} ({wk.ip})")
    srv = subprocess.Popen(server, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        time.sleep(2)
        r = cl.head.run(commands.ib_write_bw(seconds, hca_h, h.gid_index, wk.ip), check=False, timeout=seconds + 60)
    finally:
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()
    gbps = parse_ib_write_bw(r.stdout)
    if gbps is None:
        raise UserError(f"ib_write_bw gave no result (exit {r.code}): {one_line(r.stderr[-300:] or r.stdout[-300:])}")
    status = "PASS" if gbps >= 0.8 * EXPECTED_WRITE_GBPS else "WARN"
    say(f"{status}  fabric-bench     {gbps:.1f} Gb/s on one HCA (expected about {EXPECTED_WRITE_GBPS:g} Gb/s; "
        f"NCCL bus bandwidth floor {NCCL_FLOOR_GBPS:g} Gb/s uses every HCA)"
        + ("" if status == "PASS" else " -- fix: check `ethtool` speed, reseat the QSFP cable"))
    return {"gbps": gbps, "expected_gbps": EXPECTED_WRITE_GBPS, "status": status}


def bench_task(cfg):
    """`doit fabric-bench`."""
    fabric_bench(cfg)
