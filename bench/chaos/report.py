"""The soak's figures and report: availability, detection and recovery percentiles per fault kind,
requests failed or cut per fault (pure functions), then chaos.json (schema dsv41.chaos/1), chaos.md
and chaos.png (a timeline of requests per second by outcome, each fault and recovery marked)."""
import json
import math
from pathlib import Path

from .load import DEADLINE, ERROR, FAILED_FAST, OK, OUTCOMES

SCHEMA = "dsv41.chaos/1"


def percentile(values, q):
    """The q-th percentile (0-100) with linear interpolation between ranks; None for no values."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def availability(records, t0, t1, bin_s=1.0):
    """Share of the time from t0 to t1 the API answered within the deadline: a bin counts as answered
    when an ok request overlaps it, as not answered when only failed or cut requests do; bins no
    request overlaps are left out. None when no bin counts."""
    n = max(1, math.ceil((t1 - t0) / bin_s))
    good, bad = [False] * n, [False] * n
    for r in records:
        end = r["ended"] if r["ended"] is not None else t1
        first = max(0, int((r["started"] - t0) // bin_s))
        last = min(n - 1, int((end - t0) // bin_s))
        for b in range(first, last + 1):
            (good if r["outcome"] == OK else bad)[b] = True
    counted = sum(1 for g, b in zip(good, bad) if g or b)
    return None if counted == 0 else sum(good) / counted


def per_second(records, t0, t1):
    """{outcome: [requests ended in each second from t0]} for the timeline."""
    n = max(1, math.ceil(t1 - t0))
    out = {o: [0] * n for o in OUTCOMES}
    for r in records:
        if r["ended"] is not None and r["outcome"] in out:
            out[r["outcome"]][min(n - 1, max(0, int(r["ended"] - t0)))] += 1
    return out


def requests_in(records, start, end):
    """(failed, cut at the deadline) among the requests that ended in [start, end)."""
    inside = [r for r in records if r["ended"] is not None and start <= r["ended"] < end]
    return (sum(r["outcome"] in (FAILED_FAST, ERROR) for r in inside),
            sum(r["outcome"] == DEADLINE for r in inside))


def per_kind(faults):
    """{kind: {n, detection_p50_s, detection_p95_s, recovery_p50_s, recovery_p95_s, unhealed}}."""
    out = {}
    for kind in sorted({f["kind"] for f in faults}):
        fs = [f for f in faults if f["kind"] == kind]
        det, rec = [f["detection_s"] for f in fs], [f["recovery_s"] for f in fs]
        out[kind] = {"n": len(fs), "detection_p50_s": percentile(det, 50), "detection_p95_s": percentile(det, 95),
                     "recovery_p50_s": percentile(rec, 50), "recovery_p95_s": percentile(rec, 95),
                     "unhealed": sum(f["healed_at"] is None for f in fs)}
    return out


def build(run, records, faults, incidents, problems):
    """The report as a dict (schema dsv41.chaos/1). run: the soak's settings and measurements."""
    t0, t1 = run["started"], run["ended"]
    counts = {o: sum(r["outcome"] == o for r in records) for o in OUTCOMES}
    counts["hung"] = sum(r["ended"] is None for r in records)
    for i, f in enumerate(faults):
        end = faults[i + 1]["injected_at"] if i + 1 < len(faults) else t1
        f["requests_failed"], f["requests_timed_out"] = requests_in(records, f["injected_at"], end)
    av = availability(records, t0, t1)
    return {"schema": SCHEMA, **run, "availability": av, "requests": {"total": len(records), **counts},
            "restarts": sum(i.get("action") == "restart" for i in incidents),
            "faults": faults, "per_kind": per_kind(faults), "incidents": incidents,
            "problems": problems, "ok": not problems}


def fmt(v, unit=" s"):
    return "-" if v is None else f"{v:.0f}{unit}"


def markdown(rep):
    av = rep["availability"]
    lines = [f"# Chaos soak: {rep['minutes_run']:.1f} min, {len(rep['faults'])} faults, seed {rep['seed']}", "",
             f"- engine: {rep['engine']}; watchdog: {', '.join(f'{k}={v}' for k, v in rep['watchdog'].items())}",
             f"- SLO {rep['slo_s']:.0f} s (detection bound {rep['detection_bound_s']:.0f} s + a measured start-up "
             f"{rep['startup_s']:.0f} s)",
             f"- availability: {'-' if av is None else f'{100 * av:.1f} %'} (share of the time the API answered "
             f"within the {rep['deadline_s']:.0f} s deadline)",
             "- requests: " + ", ".join(f"{v} {k}" for k, v in rep["requests"].items()),
             f"- restarts: {rep['restarts']}; incidents: {len(rep['incidents'])}",
             *[f"- the watchdog gave up ({b['reason'][:120]}); `doit launch` exited {b['launch_rc']} after "
               f"{b['launch_s']:.0f} s: {' / '.join(b['launch_said']) or '-'}" for b in rep.get("budget_test") or []],
             f"- result: {'PASS' if rep['ok'] else 'FAIL'}", "",
             "| # | at | kind | node | proof | detected | healed | failed | timed out | incidents |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, f in enumerate(rep["faults"], 1):
        lines.append(f"| {i} | +{f['at']:.0f} s | {f['kind']} | {f['node']} | {f['proof']} | {fmt(f['detection_s'])} "
                     f"| {fmt(f['recovery_s']) if f['healed_at'] else 'NO'} | {f['requests_failed']} | "
                     f"{f['requests_timed_out']} | {', '.join(f['incidents']) or '-'} |")
    lines += ["", "| kind | n | detection p50 | p95 | recovery p50 | p95 | unhealed |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for kind, k in rep["per_kind"].items():
        lines.append(f"| {kind} | {k['n']} | {fmt(k['detection_p50_s'])} | {fmt(k['detection_p95_s'])} | "
                     f"{fmt(k['recovery_p50_s'])} | {fmt(k['recovery_p95_s'])} | {k['unhealed']} |")
    if rep["problems"]:
        lines += ["", "## Failed checks", ""] + [f"- {p}" for p in rep["problems"]]
    return "\n".join(lines) + "\n"


def chart(rep, records, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t0, t1 = rep["started"], rep["ended"]
    series = per_second(records, t0, t1)
    fig, ax = plt.subplots(figsize=(12, 4.5))
    xs = range(len(series[OK]))
    bottom = [0] * len(xs)
    colours = {OK: "tab:green", FAILED_FAST: "tab:orange", ERROR: "tab:red", DEADLINE: "tab:purple"}
    for o in OUTCOMES:
        ax.bar(xs, series[o], bottom=bottom, width=1.0, color=colours[o], label=o, linewidth=0)
        bottom = [b + v for b, v in zip(bottom, series[o])]
    top = max(bottom + [1])
    for f in rep["faults"]:
        x = f["injected_at"] - t0
        ax.axvline(x, color="black", linestyle="-", linewidth=0.8)
        ax.text(x, top * 1.02, f["kind"], rotation=60, fontsize=7, va="bottom")
        if f["healed_at"]:
            ax.axvspan(x, f["healed_at"] - t0, color="grey", alpha=0.15, linewidth=0)
    for inc in rep["incidents"]:
        if inc.get("action") == "restart" and inc.get("ended"):     # one still open has not ended
            ax.axvline(inc["ended"] - t0, color="tab:blue", linestyle="--", linewidth=0.8)
    ax.plot([], [], color="black", label="fault")
    ax.plot([], [], color="tab:blue", linestyle="--", label="recovery ended")
    ax.set_xlabel("seconds since the soak started")
    ax.set_ylabel("requests ended per second")
    av = rep["availability"]
    ax.set_title(f"chaos soak, seed {rep['seed']}: availability {'-' if av is None else f'{100 * av:.1f} %'}",
                 pad=50)
    ax.set_ylim(0, top * 1.6)
    ax.legend(loc="upper right", fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(rep, records, out):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "chaos.json").write_text(json.dumps({**rep, "records": records}, indent=1) + "\n")
    (out / "chaos.md").write_text(markdown(rep))
    chart(rep, records, out / "chaos.png")
    return out
