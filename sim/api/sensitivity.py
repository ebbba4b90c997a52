"""What moves the headline: the code-editing ratios over `adaptive` when one assumption changes at a time.

    python -m sim.sensitivity --out out/sensitivity          # sensitivity.md, sensitivity.html, sensitivity.csv
    python -m sim.sensitivity --out reports --force --plotly shared   # regenerate the committed reports/sensitivity.*

--plotly shared (the committed reports/) writes plotly.js once beside the page as plotly-VERSION.min.js, which
the page loads; the default, inline, puts it in the page (one file to send around).

From the default setup (the trace, qwen3-8b on h100-sxm, roofline costs, n-gram k = 32, the default DSpark
profile), each axis varies one thing:
  ngram_k     the n-gram chain length k in {8, 16, 32, 64}
  gpu         a100-80g, h100-sxm, h200
  copy        the trace's requests split into terciles of their copy fraction (share of output positions
              where the n-gram proposal's first token is right), low / mid / high
  copied_acc  the DSpark profile's conditional acceptance of copied tokens at depth 1 (q1[1]), an
              assumption no trace pins down (docs/simulator.md)
and every policy below runs at each batch size. Each row reports throughput / adaptive's for the default
hybrid, the seed's hybrid-price, the best single-drafter policy (ngram-fixed:k, model-fixed:7,
ngram-first, ngram-threshold; named) and the per-step oracle. Simulation only: no real run checks
these figures yet.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from sim.infra.cli import ArgumentParser, check_in_file, check_out_files, int_at_least, write_files
from sim.core.cost import make_cost_model
from sim.core.drafters.model import load_drafter_profile
from sim.infra.errors import ConfigError
from sim.api.run import BASELINE, SimSetup, prepare, run_many

HYBRIDS = ("hybrid", "hybrid-price")
SINGLES = ("model-fixed:7", "ngram-first", "ngram-threshold")  # plus ngram-fixed:k of the row's k
AXES = {"ngram_k": (8, 16, 32, 64), "gpu": ("a100-80g", "h100-sxm", "h200"), "copy": ("low", "mid", "high"),
        "copied_acc": (0.8, None, 0.95, 0.99)}  # None = the profile's own value
COMMAND = "python -m sim.sensitivity --out reports --force --plotly shared"


def _policies(k: int) -> list[str]:
    return [BASELINE, *HYBRIDS, f"ngram-fixed:{k}", *SINGLES, "oracle"]


def _variants(base: SimSetup, progress: bool):
    """(axis, value label, Prepared) for every row; tables are built once per (k, profile)."""
    profile = load_drafter_profile(base.drafter)
    default = prepare(base, progress=progress)
    for k in AXES["ngram_k"]:
        yield "ngram_k", str(k), default if k == base.ngram_k else prepare(dataclasses.replace(base, ngram_k=k))
    for gpu in AXES["gpu"]:
        cost = make_cost_model(base.cost, llm=base.model, gpu=gpu)
        yield "gpu", gpu, dataclasses.replace(default, cost=cost, setup=dataclasses.replace(base, gpu=gpu))
    if getattr(default.tables, "streaming", False):  # the copy terciles read every request's rows up front
        raise ConfigError(f"{base.trace}: the sensitivity study needs whole draft tables; use --draft-tables whole "
                          "(or a smaller --limit/--sample)")
    frac = default.tables.copy_fraction()
    if len(frac) < 3:
        raise ConfigError(f"{base.trace}: the copy-fraction terciles need at least 3 requests, got {len(frac)}")
    # equal-count terciles by rank (ties broken by trace order), kept in trace order within each
    for label, idx in zip(AXES["copy"], np.array_split(np.argsort(frac, kind="stable"), 3)):
        idx = np.sort(idx)
        sub = dataclasses.replace(default, tables=default.tables.subset(idx), arrivals=default.arrivals[idx])
        lo, hi = frac[idx].min(), frac[idx].max()
        yield "copy", f"{label} ({len(idx)} req, {lo:.2f}-{hi:.2f})", sub
    for q in AXES["copied_acc"]:
        if q is None:
            yield "copied_acc", f"{profile.q1[1]:.3f} (profile)", default
        else:
            prof = dataclasses.replace(profile, q1=(profile.q1[0], q))
            yield "copied_acc", f"{q:.3f}", prepare(base, profile=prof)


def run_sensitivity(base: SimSetup, batch_sizes: list[int], workers: int | None = None,
                    progress: bool = False) -> pd.DataFrame:
    """One row per (axis, value, batch size, policy): the summary row plus the axis columns."""
    rows = []
    variants = list(_variants(base, progress))
    for n, (axis, label, prep) in enumerate(variants, start=1):
        if progress:
            print(f"[{n}/{len(variants)}] {axis} = {label}", file=sys.stderr, flush=True)
        k = prep.setup.ngram_k
        combos = [(p, b) for b in batch_sizes for p in _policies(k)]
        for row, res in run_many(prep, combos, workers=workers):
            res.raise_if_lossy(f"{axis}={label}: policy {row['policy']} at batch size {row['batch_size']}")
            rows.append({"axis": axis, "value": label, **row})
    return pd.DataFrame(rows)


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (axis, value, batch size): ratios over adaptive and the best single-drafter policy."""
    out = []
    for (axis, value, bs), g in df.groupby(["axis", "value", "batch_size"], sort=False):
        tput = dict(zip(g["policy"], g["output_throughput_tok_s"]))
        base = tput[BASELINE]
        singles = {p: t for p, t in tput.items() if p.startswith("ngram-fixed:") or p in SINGLES}
        best = max(singles, key=singles.get)
        out.append({"axis": axis, "value": value, "batch_size": int(bs),
                    "hybrid": tput["hybrid"] / base, "hybrid-price": tput["hybrid-price"] / base,
                    "best single": singles[best] / base, "best single policy": best,
                    "oracle": tput["oracle"] / base, "hybrid / best single": tput["hybrid"] / singles[best]})
    return pd.DataFrame(out)


AXIS_TITLES = {"ngram_k": "n-gram chain length k", "gpu": "GPU", "copy": "copy-fraction tercile of the trace",
                "copied_acc": "DSpark acceptance of copied tokens (q1[1], an assumption)"}


def sensitivity_md(summ: pd.DataFrame, base: SimSetup, batch_sizes: list[int]) -> str:
    lines = ["# What moves the headline: sensitivity of the code-editing ratios", "",
             f"Throughput over `adaptive` (vLLM 0.33 adaptive verification) at the same batch size; `{base.trace}`, "
             f"{base.model} on {base.gpu} ({base.cost} cost model), n-gram k = {base.ngram_k}, drafter profile "
             f"{base.drafter}, seed {base.seed}, temperature 0"
             + (f", a seeded sample of {base.sample} requests" if base.sample else "") + ". Each section changes "
             "one assumption; `best single` is the best of ngram-fixed:k, model-fixed:7, ngram-first and "
             "ngram-threshold (named), `oracle` the per-step oracle (a per-step bound, not an end-to-end one).",
             "", "**Simulation only**: no real run has confirmed these figures. The real runs in "
             "reports/fidelity*.md check the simulator itself on a CPU engine with a small model, not these "
             "H100 figures. Regenerate with:", "", f"    {COMMAND}", ""]
    lines += ["## Summary: the range each assumption spans", "",
              "| assumption | batch | hybrid / adaptive | best single / adaptive | hybrid / best single |",
              "|---|---:|---:|---:|---:|"]
    for axis, title in AXIS_TITLES.items():
        for b in batch_sizes:
            g = summ[(summ["axis"] == axis) & (summ["batch_size"] == b)]
            if len(g):
                lines.append(f"| {title} | {b} | {g['hybrid'].min():.2f}-{g['hybrid'].max():.2f} | "
                             f"{g['best single'].min():.2f}-{g['best single'].max():.2f} | "
                             f"{g['hybrid / best single'].min():.3f}-{g['hybrid / best single'].max():.3f} |")
    lines.append("")
    for axis, title in AXIS_TITLES.items():
        g = summ[summ["axis"] == axis]
        lines += [f"## {title}", "", "| value | batch | hybrid | hybrid-price | best single | (policy) | "
                  "hybrid / best single | oracle |", "|---|---:|---:|---:|---:|---|---:|---:|"]
        for _, r in g.iterrows():
            lines.append(f"| {r['value']} | {r['batch_size']} | {r['hybrid']:.3f} | {r['hybrid-price']:.3f} | "
                         f"{r['best single']:.3f} | {r['best single policy']} | {r['hybrid / best single']:.3f} | "
                         f"{r['oracle']:.3f} |")
        lines.append("")
    return "\n".join(lines)


def sensitivity_html(summ: pd.DataFrame, plotly: str = "inline") -> str:
    """The page (sim/infra/html_page.py: renders offline; plotly.js inlined, or shared beside it): one figure per
    axis, under a heading that is its title."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from sim.infra.html_page import figure_div, heading, page, para
    from sim.infra.plot_style import series_color, style

    sizes = sorted(summ["batch_size"].unique())
    body = [heading(1, "What moves the headline"), para("Throughput / adaptive; simulation only (see sensitivity.md).")]
    colors = {k: series_color(k) for k in ("hybrid", "hybrid-price", "best single", "oracle")}
    for i, (axis, title) in enumerate(AXIS_TITLES.items()):
        g = summ[summ["axis"] == axis]
        fig = make_subplots(rows=1, cols=len(sizes), subplot_titles=[f"batch size {b}" for b in sizes],
                            shared_yaxes=True)
        for ci, b in enumerate(sizes, start=1):
            gb = g[g["batch_size"] == b]
            for col, color in colors.items():
                fig.add_trace(go.Bar(name=col, x=gb["value"], y=gb[col], marker_color=color, legendgroup=col,
                                     showlegend=ci == 1), row=1, col=ci)
        fig.add_hline(y=1.0, line_dash="dot")
        style(fig, title=title, barmode="group", yaxis_title="throughput / adaptive")
        body += [heading(2, title, f"axis{i}"), figure_div(fig, f"axis-{axis}")]
    return page("hybridspec sensitivity", body, plotly)


OUTPUTS = ("sensitivity.md", "sensitivity.html", "sensitivity.csv")


def write_outputs(out: Path, summ: pd.DataFrame, base: SimSetup, sizes: list[int], plotly: str = "inline") -> list[Path]:
    """The three files written as one unit (sim.infra.fsio.commit_files: a full disk or a kill leaves all old or
    all new); with plotly="shared" the page's plotly.js beside them first (sim/infra/html_page.py write_asset)."""
    from sim.infra.html_page import write_asset

    files = {"sensitivity.md": sensitivity_md(summ, base, sizes) + "\n",
             "sensitivity.html": sensitivity_html(summ, plotly), "sensitivity.csv": summ.to_csv(index=False)}
    if plotly == "shared":
        write_asset(out)
    return write_files(out, files, overwrite=True, unit="sensitivity")


def main(argv: list[str] | None = None) -> int:
    from sim.infra.html_page import add_plotly_flag, check_asset, write_page

    ap = ArgumentParser(prog="python -m sim.sensitivity", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--trace", default="traces/codeedit.jsonl")
    ap.add_argument("--batch-size", action="append", type=int_at_least(1), help="repeatable; default 4 and 128")
    ap.add_argument("--sample", type=int_at_least(1), default=None, help="a seeded sample of N requests (default: all)")
    ap.add_argument("--out", type=Path, default=Path("out/sensitivity"))
    ap.add_argument("--force", action="store_true", help="replace sensitivity.* files already in --out")
    ap.add_argument("--workers", type=int_at_least(1), default=None)
    ap.add_argument("--html-from", type=Path, default=None, metavar="CSV",
                    help="only re-render sensitivity.html into --out from an earlier run's sensitivity.csv (no "
                         "simulation): python -m sim.sensitivity --html-from reports/sensitivity.csv --out reports "
                         "--force --plotly shared")
    add_plotly_flag(ap, "sensitivity.html: ")
    a = ap.parse_args(argv)
    if a.html_from is not None:
        check_out_files(a.out, ("sensitivity.html",), a.force)
        if a.plotly == "shared":
            check_asset(a.out)
        summ = pd.read_csv(check_in_file(a.html_from, "--html-from"), dtype={"value": str})
        missing = {"axis", "value", "batch_size", "hybrid", "hybrid-price", "best single", "oracle"} - set(summ.columns)
        if missing:
            raise ConfigError(f"--html-from {a.html_from}: not a sensitivity.csv (missing {', '.join(sorted(missing))})")
        path = write_page(a.out / "sensitivity.html", sensitivity_html(summ, a.plotly), overwrite=True)
        print(f"wrote {path}", file=sys.stderr)
        return 0
    sizes = list(dict.fromkeys(a.batch_size or [4, 128]))
    if any(b < 1 for b in sizes):
        raise ConfigError(f"--batch-size must be >= 1, got {min(sizes)}")
    check_out_files(a.out, OUTPUTS, a.force)  # before the runs, not after
    if a.plotly == "shared":
        check_asset(a.out)
    from sim.core.trace.loader import scan_trace

    n = scan_trace(a.trace)[0]  # every line, before any run
    if a.sample is not None and a.sample > n:
        raise ConfigError(f"{a.trace}: --sample {a.sample} exceeds the trace's {n} requests")
    if min(n, a.sample or n) < 3:
        raise ConfigError(f"{a.trace}: the copy-fraction terciles need at least 3 requests, got {min(n, a.sample or n)}")
    base = SimSetup(trace=a.trace, sample=a.sample)
    df = run_sensitivity(base, sizes, workers=a.workers, progress=True)
    summ = summary_table(df)
    paths = write_outputs(a.out, summ, base, sizes, a.plotly)
    print(sensitivity_md(summ, base, sizes))
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0
