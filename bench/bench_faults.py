"""The fault table at the watchdog's defaults (docs/faults.md, "At the watchdog's defaults"): a rank
container killed, the head's engine stopped, a worker's engine stopped, the API server stopped, a memory
guard killed, a worker's sshd frozen; each once, under the soak's steady load, far enough apart that each
heals before the next, in the lab (LAB_ENGINE=vllm: the real engine). For each: when the watchdog saw it
and when a token came back, against the baselines measured or set in the same run: the detection bound
(WATCHDOG_STALL_S + WATCHDOG_PROBE_S + two intervals + a look) and the SLO (that bound + the start-up the soak
measures first). It is the chaos soak (bench/bench_chaos.py) with these faults and no others; its report
goes to --out (default faults-report).

    LAB_ENGINE=vllm .venv/bin/python bench/bench_faults.py
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_chaos  # noqa: E402

FAULTS = "kill-rank,stop-engine,stop-worker,stop-api,kill-guard,stop-sshd"
ARGS = ["--once", "--faults", FAULTS, "--every", "300-330", "--watchdog", "default", "--seed", "23"]


def table(rep):
    bound, slo = rep["detection_bound_s"], rep["slo_s"]
    lines = [f"fault table at the watchdog's defaults ({rep['engine']} engine): detection bound {bound:.0f} s, "
             f"SLO {slo:.0f} s (bound + a measured start-up of {rep['startup_s']:.0f} s)",
             f"{'fault':<12} {'node':<8} {'seen after':>10} {'/bound':>7} {'serving after':>13} {'/SLO':>6}  "
             "clients got (failed, cut at the deadline); incidents"]
    for f in rep["faults"]:
        seen, back = f["detection_s"], f["recovery_s"]
        lines.append(f"{f['kind']:<12} {f['node']:<8} {report_s(seen):>10} {ratio(seen, bound):>7} "
                     f"{report_s(back):>13} {ratio(back, slo):>6}  {f['requests_failed']} failed, "
                     f"{f['requests_timed_out']} cut; {', '.join(f['incidents']) or 'none'}")
    return "\n".join(lines)


def report_s(v):
    return "-" if v is None else f"{v:.0f} s"


def ratio(v, base):
    return "-" if v is None else f"{v / base:.2f}"


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    out = argv[argv.index("--out") + 1] if "--out" in argv else "faults-report"
    rc = bench_chaos.main(ARGS + ["--out", out] + [a for a in argv if a not in ("--out", out)])
    path = Path(out) / "chaos.json"
    if path.exists():
        print(table(json.loads(path.read_text())))
    return rc


if __name__ == "__main__":
    sys.exit(main())
