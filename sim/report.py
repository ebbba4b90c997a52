"""HTML reports (plotly) of simulated runs: throughput per policy, speedup, step-time breakdown."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sim.metrics import BREAKDOWN


def _fig_html(fig: go.Figure, first: bool) -> str:
    return fig.to_html(full_html=False, include_plotlyjs="inline" if first else False)


def write_run_report(rows: list[dict], steps: list[tuple[dict, dict]], path: Path) -> None:
    """One self-contained HTML page for a `python -m sim.run --out` run."""
    sizes = sorted({r["batch_size"] for r in rows})
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    figs = []

    thr = go.Figure()
    for p in policies:
        rs = sorted((r for r in rows if r["policy"] == p), key=lambda r: r["batch_size"])
        thr.add_trace(go.Bar(name=p, x=[str(r["batch_size"]) for r in rs], y=[r["output_throughput_tok_s"] for r in rs]))
    thr.update_layout(title="Output throughput by policy", xaxis_title="batch size", yaxis_title="output tokens/s",
                      barmode="group", legend_title="policy")
    figs.append(thr)

    sp = go.Figure()
    for p in policies:
        rs = sorted((r for r in rows if r["policy"] == p), key=lambda r: r["batch_size"])
        sp.add_trace(go.Bar(name=p, x=[str(r["batch_size"]) for r in rs], y=[r["speedup_vs_baseline"] for r in rs]))
    sp.add_hline(y=1.0, line_dash="dot")
    sp.update_layout(title="Speedup over adaptive verification (baseline)", xaxis_title="batch size",
                     yaxis_title="throughput / adaptive", barmode="group", legend_title="policy")
    figs.append(sp)

    br = make_subplots(rows=1, cols=len(sizes), subplot_titles=[f"batch size {b}" for b in sizes], shared_yaxes=True)
    for ci, b in enumerate(sizes, start=1):
        rs = [r for r in rows if r["batch_size"] == b]
        for k in BREAKDOWN:
            name = k.removesuffix("_ms")
            br.add_trace(go.Bar(name=name, x=[r["policy"] for r in rs], y=[r["mean_step_ms"] * r["share_" + name] for r in rs],
                                legendgroup=name, showlegend=ci == 1), row=1, col=ci)
    br.update_layout(title="Mean step time breakdown (ms)", barmode="stack", yaxis_title="ms per step", legend_title="part")
    figs.append(br)

    ts = go.Figure()
    for row, st in steps:
        t = np.asarray(st["t_start_ms"]) / 1000.0
        if len(t) == 0:
            continue
        stride = max(1, len(t) // 2000)
        em = np.asarray(st["emitted"], dtype=float)
        dur = np.asarray(st["step_ms"], dtype=float)
        win = max(1, min(50, len(t) // 20))
        rate = np.convolve(em, np.ones(win), "same") / np.maximum(np.convolve(dur, np.ones(win), "same") / 1000.0, 1e-9)
        ts.add_trace(go.Scatter(x=t[::stride], y=rate[::stride], mode="lines", name=f"{row['policy']} bs={row['batch_size']}"))
    ts.update_layout(title="Output throughput over simulated time (moving window)", xaxis_title="simulated time (s)",
                     yaxis_title="output tokens/s", legend_title="run")
    figs.append(ts)

    head = rows[0]
    html = ["<html><head><meta charset='utf-8'><title>hybridspec run</title></head><body style='font-family:sans-serif'>",
            f"<h1>hybridspec: {head['trace']}</h1><p>{head['requests']} requests, {head['output_tokens']} output tokens; "
            f"{head['model']} on {head['gpu']} ({head['cost']} cost model); drafter {head['drafter']}, n-gram k={head['ngram_k']}; "
            f"seed {head['seed']}. Baseline: adaptive.</p>"]
    html += [_fig_html(f, i == 0) for i, f in enumerate(figs)]
    html.append("</body></html>")
    Path(path).write_text("\n".join(html))
