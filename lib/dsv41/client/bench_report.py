"""What dsv41.client.bench writes beside its JSON: the Markdown table (each figure against the published
two-Spark one) and, with --chart, a PNG and an SVG drawn with matplotlib (imported only then)."""
import collections
import io

# Published two-Spark figures (mission.md, "Reported results").
PUBLISHED = {
    ("prefill", 8192): 2050, ("prefill", 32768): 2061,
    ("code", 1, "per_stream"): 40, ("code", 2, "aggregate"): 60, ("prose", 1, "per_stream"): 29,
}


def finish_counts(reasons):
    """{"stop": 3, "timeout": 1} from the finish reasons of a step's answers (None counts as "none")."""
    return dict(collections.Counter(r or "none" for r in reasons))


def finish_text(counts):
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) if counts else "-"


def _f(x, nd=1):
    return "-" if x is None else f"{x:,.{nd}f}"


def fmt_rate(x):
    """A tok/s figure as the chart prints it on its bar."""
    return f"{x:,.0f}" if x >= 100 or x == int(x) else f"{x:.1f}"


def comparison_rows(result):
    """(step, measured tok/s, published tok/s or None, finish counts or None) for every measured figure."""
    rows = []
    for p in result["prefill"]:
        rows.append((f"prefill {p['tokens']} (actual {p['prompt_tokens']})", p["median_tok_s"],
                     PUBLISHED.get(("prefill", p["tokens"])), None))
    for d in result["decode"]:
        k, c = d["kind"], d["concurrency"]
        rows.append((f"decode {k} c{c} per stream", d["per_stream_tok_s_median"], PUBLISHED.get((k, c, "per_stream")),
                     d["finish"]))
        rows.append((f"decode {k} c{c} aggregate", d["aggregate_tok_s"], PUBLISHED.get((k, c, "aggregate")),
                     d["finish"]))
    for x in result["ctx"]:
        rows.append((f"ctx {x['tokens']} prefill", x["prefill_tok_s"], None, {x["finish_reason"]: 1}))
    return rows


def markdown(result):
    timeout = result["request_timeout_s"]
    lines = [f"# Benchmark: {result['label']}", "",
             f"Model `{result['model']}` at {result['url']}, {result['ts']}. Metric definitions: "
             "`vllm bench serve` (TPOT = (E2EL - TTFT) / (tokens - 1); per-stream tok/s = 1 / TPOT). "
             f"A request still running after {timeout:g} s is cut (`--request-timeout-s`)"
             + (f"; max_model_len {result['max_model_len']}." if result["max_model_len"] else "."), ""]
    if result.get("error"):
        lines += [f"**Stopped early:** {result['error']}", ""]
    for skip in result["skipped"]:
        lines += [f"**Skipped** {skip['step']}: {skip['reason']}.", ""]
    cut = [f"decode {d['kind']} c{d['concurrency']} ({d['finish']['timeout']} of {len(d['requests'])} requests)"
           for d in result["decode"] if d["finish"].get("timeout")]
    cut += [f"ctx {x['tokens']}" for x in result["ctx"] if x["finish_reason"] == "timeout"]
    if cut:
        lines += [f"**Cut at the {timeout:g} s deadline** (finish timeout; their figures cover the tokens "
                  f"that came before it): {', '.join(cut)}.", ""]
    lines += ["| step | tok/s | two-Spark published | ratio | finish |", "| --- | ---: | ---: | ---: | --- |"]
    for name, got, pub, finish in comparison_rows(result):
        ratio = f"{got / pub:.2f}" if (got and pub) else "-"
        lines.append(f"| {name} | {_f(got)} | {_f(pub, 0) if pub else '-'} | {ratio} | "
                     f"{finish_text(finish) if finish else '-'} |")
    lines += ["", "finish: how the answers ended (stop: the model ended it; length: the server's limit; timeout: "
              "cut at the deadline). Prefill requests are closed at their first token."]
    if result["prefill"]:
        lines += ["", "| prefill tokens | actual | median tok/s | TTFT median ms | TTFT p99 ms |",
                  "| ---: | ---: | ---: | ---: | ---: |"]
        for p in result["prefill"]:
            lines.append(f"| {p['tokens']} | {p['prompt_tokens']} | {_f(p['median_tok_s'])} | "
                         f"{_f(p['ttft_ms']['median'])} | {_f(p['ttft_ms']['p99'])} |")
    if result["decode"]:
        lines += ["", "| kind | conc | per-stream tok/s | aggregate tok/s | TTFT mean/median/p99 ms | "
                  "TPOT mean/median/p99 ms | ITL mean/median/p99 ms | E2EL median ms |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for d in result["decode"]:
            trio = lambda s: f"{_f(s['mean'])} / {_f(s['median'])} / {_f(s['p99'])}"  # noqa: E731
            lines.append(f"| {d['kind']} | {d['concurrency']} | {_f(d['per_stream_tok_s_median'])} | "
                         f"{_f(d['aggregate_tok_s'])} | {trio(d['ttft_ms'])} | {trio(d['tpot_ms'])} | "
                         f"{trio(d['itl_ms'])} | {_f(d['e2el_ms']['median'])} |")
    if result["ctx"]:
        lines += ["", "| context | actual | TTFT ms | prefill tok/s | decode tok/s | finish | recall |",
                  "| ---: | ---: | ---: | ---: | ---: | --- | --- |"]
        for x in result["ctx"]:
            lines.append(f"| {x['tokens']} | {x['prompt_tokens']} | {_f(x['ttft_ms'])} | {_f(x['prefill_tok_s'])} | "
                         f"{_f(x['decode_tok_s'])} | {x['finish_reason']} | {'yes' if x['recall'] else 'no'} |")
    return "\n".join(lines) + "\n"


MEASURED, PUBLISHED_COLOUR = "#2b6cb0", "#a0aec0"


def chart_panels(result):
    """(title, x label, y label, categories, [(series name, values, colour)]) per chart panel with data."""
    panels = []
    pre = result["prefill"]
    if pre:
        panels.append(("Prefill by prompt length", "prompt length (tokens)", "prefill tok/s",
                       [f"{p['tokens']:,}" for p in pre],
                       [("measured", [p["median_tok_s"] for p in pre], MEASURED),
                        ("two-Spark published", [PUBLISHED.get(("prefill", p["tokens"])) for p in pre],
                         PUBLISHED_COLOUR)]))
    dec = result["decode"]
    for what, key, ylabel in (("per_stream", "per_stream_tok_s_median", "decode tok/s per stream"),
                              ("aggregate", "aggregate_tok_s", "aggregate decode tok/s")):
        if dec:
            panels.append((f"Decode {'per stream' if what == 'per_stream' else 'aggregate'} by concurrency",
                           "concurrent streams (prompt kind)", ylabel,
                           [f"{d['concurrency']}\n{d['kind']}" for d in dec],
                           [("measured", [d[key] for d in dec], MEASURED),
                            ("two-Spark published", [PUBLISHED.get((d["kind"], d["concurrency"], what)) for d in dec],
                             PUBLISHED_COLOUR)]))
    if result["ctx"]:
        panels.append(("Long-context prefill", "context length (tokens)", "prefill tok/s",
                       [f"{x['tokens']:,}" for x in result["ctx"]],
                       [("measured", [x["prefill_tok_s"] for x in result["ctx"]], MEASURED)]))
    return panels


def chart(result):
    """{".png": bytes, ".svg": bytes}: one bar panel per kind of step, the measured tok/s beside the
    published two-Spark figure, values on the bars. matplotlib is imported here, only when charting."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.ticker import StrMethodFormatter

    panels = chart_panels(result)
    fig = Figure(figsize=(10, 1.4 + 3.1 * max(1, len(panels))), layout="constrained")
    fig.suptitle(f"dsv41 bench: {result['label']}\nmodel {result['model']}, {result['ts']}", fontsize=11)
    if not panels:
        ax = fig.add_subplot()
        ax.axis("off")
        ax.text(0.5, 0.5, "no step measured yet", ha="center", va="center")
    width = 0.38
    for i, (title, xlabel, ylabel, cats, series) in enumerate(panels):
        ax = fig.add_subplot(len(panels), 1, i + 1)
        shown = [sr for sr in series if any(v is not None for v in sr[1])]
        for j, (name, values, colour) in enumerate(shown):
            offset = 0 if len(shown) == 1 else (j - 0.5) * width
            xs = [k + offset for k, v in enumerate(values) if v is not None]
            vs = [v for v in values if v is not None]
            bars = ax.bar(xs, vs, width * 0.95, label=name, color=colour)
            ax.bar_label(bars, labels=[fmt_rate(v) for v in vs], padding=2, fontsize=8)
        pad = max(0, 3 - len(cats)) / 2  # one or two groups stay narrow, centred
        ax.set_xticks(range(len(cats)), cats)
        ax.set_xlim(-0.5 - pad, len(cats) - 0.5 + pad)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
        ax.margins(y=0.15)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    handles = {h.get_label(): h for ax in fig.axes for h in ax.get_legend_handles_labels()[0]}
    if handles:
        fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncols=len(handles), frameon=False)
    out = {}
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dsv41"}):
        for suffix, fmt in ((".png", "png"), (".svg", "svg")):
            buf = io.BytesIO()
            fig.savefig(buf, format=fmt, dpi=110, metadata={"Date": None} if fmt == "svg" else None)
            out[suffix] = buf.getvalue()
    return out
