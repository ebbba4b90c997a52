"""HTML reports (plotly) of simulated runs: throughput per policy, speedup, step-time breakdown."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from sim.infra.inputs import Bool, List, Num, Obj, Opt, Str
from sim.infra.html_page import downsample, figure_div, heading, nav, page, para, write_page
from sim.core.metrics import BREAKDOWN
from sim.infra.plot_style import part_color, policy_colors, ratio_colors, style


_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def run_report_figures(rows: list[dict], steps: list[tuple[dict, dict]], baseline: str | None = "adaptive") -> list[go.Figure]:
    """The figures of a `python -m sim.run --out` report, in the shared plot style (sim/infra/plot_style.py); each
    title names what it plots (the page's headings are these titles). baseline None: no speedup figure."""
    sizes = sorted({r["batch_size"] for r in rows})
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    colors = policy_colors(policies)
    figs = []

    thr = go.Figure()
    for p in policies:
        rs = sorted((r for r in rows if r["policy"] == p), key=lambda r: r["batch_size"])
        thr.add_trace(go.Bar(name=p, x=[str(r["batch_size"]) for r in rs], y=[r["output_throughput_tok_s"] for r in rs],
                             marker_color=colors[p]))
    style(thr, title="Output throughput by policy and batch size", xaxis_title="batch size",
          yaxis_title="output tokens/s", barmode="group", legend_title="policy")
    figs.append(thr)

    if baseline:
        sp = go.Figure()
        for p in policies:
            rs = sorted((r for r in rows if r["policy"] == p), key=lambda r: r["batch_size"])
            sp.add_trace(go.Bar(name=p, x=[str(r["batch_size"]) for r in rs], y=[r["speedup_vs_baseline"] for r in rs],
                                marker_color=colors[p]))
        sp.add_hline(y=1.0, line_dash="dot")
        style(sp, title=f"Output throughput over {baseline} (the baseline) by policy and batch size",
              xaxis_title="batch size", yaxis_title=f"throughput / {baseline}", barmode="group", legend_title="policy")
        figs.append(sp)

    br = make_subplots(rows=1, cols=len(sizes), subplot_titles=[f"batch size {b}" for b in sizes], shared_yaxes=True)
    for ci, b in enumerate(sizes, start=1):
        rs = [r for r in rows if r["batch_size"] == b]
        for k in BREAKDOWN:
            name = k.removesuffix("_ms")
            br.add_trace(go.Bar(name=name, x=[r["policy"] for r in rs], y=[r["mean_step_ms"] * r["share_" + name] for r in rs],
                                legendgroup=name, showlegend=ci == 1, marker_color=part_color(name)), row=1, col=ci)
    style(br, title="Mean step time by part and policy (ms per engine step)", barmode="stack",
          yaxis_title="ms per step", legend_title="part")
    figs.append(br)

    # one panel per policy (20 lines on one chart cannot be told apart), a line per batch size, each line cut
    # to html_page.MAX_POINTS points (a long run's steps would make the page megabytes)
    runs = [(row, st) for row, st in steps if len(st["t_start_ms"])]
    pols = [p for p in policies if any(row["policy"] == p for row, _ in runs)]
    if pols:
        ncol = 2 if len(pols) > 1 else 1
        nrow = -(-len(pols) // ncol)
        # each panel its own time span (a run without speculation lasts several times longer), one y scale
        ts = make_subplots(rows=nrow, cols=ncol, subplot_titles=pols, shared_yaxes="all",
                           vertical_spacing=min(0.08, 0.5 / nrow))
        for row, st in runs:
            t = np.asarray(st["t_start_ms"], dtype=float) / 1000.0
            em = np.asarray(st["emitted"], dtype=float)
            dur = np.asarray(st["step_ms"], dtype=float)
            win = max(1, min(50, len(t) // 20))
            rate = np.convolve(em, np.ones(win), "same") / np.maximum(np.convolve(dur, np.ones(win), "same") / 1000.0, 1e-9)
            x, y = downsample(t, rate)
            i = pols.index(row["policy"])
            b = row["batch_size"]
            ts.add_trace(go.Scatter(x=x, y=y, mode="lines", name=f"{row['policy']} bs={b}",
                                    line=dict(color=colors[row["policy"]], dash=_DASHES[sizes.index(b) % len(_DASHES)])),
                         row=i // ncol + 1, col=i % ncol + 1)
        style(ts, title="Output throughput over simulated time by policy (moving window; dash: batch size)",
              legend_title="run", height=max(360, 230 * nrow))
        ts.update_xaxes(title_text="simulated time (s)", row=nrow)
        ts.update_yaxes(title_text="tokens/s", col=1)
        figs.append(ts)
    return figs


def write_run_report(rows: list[dict], steps: list[tuple[dict, dict]], path: Path, baseline: str | None = "adaptive",
                     plotly: str = "inline") -> None:
    """One HTML page for a `python -m sim.run --out` run (sim/infra/html_page.py: renders offline; plotly.js
    inlined, or with plotly="shared" one copy beside it); each figure under a heading that is its own title."""
    figs = run_report_figures(rows, steps, baseline)
    head = rows[0]
    body = [heading(1, f"hybridspec: {head['trace']}"),
            para(f"{head['requests']} requests, {head['output_tokens']} output tokens; {head['model']} on {head['gpu']} "
                 f"({head['cost']} cost model); drafter {head['drafter']}, n-gram k={head['ngram_k']}; seed {head['seed']}. "
                 f"Baseline: {baseline or 'none'}.")]
    for i, f in enumerate(figs):
        body += [heading(2, f.layout.title.text, f"fig{i}"), figure_div(f, f"fig{i}")]
    write_page(path, page("hybridspec run", body, plotly), overwrite=True)


# ================================================================================== sweep reports
# python -m sim.report SWEEP_DIR_OR_RESULTS -o reports/  ->  index.html, tables.md, paper.md

SWEEP_USAGE = """python -m sim.report SWEEP_DIR_OR_RESULTS [-o DIR]: the report of a `python -m sim.sweep` run
(default DIR: a `report/` folder inside the sweep directory; `-o reports/ --force --plotly shared` regenerates the
committed report: its index.html loads the plotly.js copy beside it instead of inlining 4.7 MB of it).
An existing index.html, tables.md or paper.md is replaced only with --force; a results table that is empty,
binary, corrupt or cut mid-row is an error, never a silently shorter report."""

HYBRID = "hybrid"  # the default hybrid; the seed's rule, hybrid-price, is reported beside it
SEED = "hybrid-price"
# single-drafter and fixed-rule policies the default hybrid must not lose to (issue: dominance >= 0.99)
SINGLE_PREFIXES = ("ngram-fixed:", "model-fixed:", "ngram-first", "ngram-threshold", "adaptive")
DOMINANCE = 0.99
ORACLE = "oracle"
from sim.core.config import BASELINE as BASE  # noqa: E402 -- the one baseline name
# The seed's published hybrid / adaptive throughput ranges (its abstract): workload -> {bs: (lo, hi)};
# None = every batch size.
PUBLISHED = {"codeedit": {4: (1.10, 1.62), 128: (1.04, 1.27)}, "chat": {None: (0.97, 1.01)}}
PUBLISHED["codeedit-model"] = PUBLISHED["codeedit"]  # the same edits with model-shaped outputs
CONTEXT_BINS = 4  # prompt-length quantile bins of the context-length heatmap
from sim.core.config import GRID_KEYS as _GRID_KEYS  # noqa: E402

_SETUP_KEYS = tuple(k for k in _GRID_KEYS if k not in ("policy", "batch_size"))  # what makes a workload (sim/core/config.py)


def load_sweep(path) -> tuple["pd.DataFrame", "pd.DataFrame"]:
    """(results, requests) of a sweep directory, or of a results.parquet/.csv file (requests next to it)."""
    import pandas as pd

    from sim.infra.errors import ConfigError

    p = Path(path)
    d = p if p.is_dir() else p.parent
    try:  # a sweep killed while committing its tables: finish the unit first (sim.infra.fsio.commit_files)
        from sim.infra.fsio import recover

        recover(d)
    except OSError:
        pass
    if p.is_dir():
        cand = [d / "results.parquet", d / "results.csv"]
        p = next((c for c in cand if c.is_file()), None)
        if p is None:
            raise ConfigError(f"{path}: no results.parquet or results.csv (run python -m sim.sweep --out {path} first)")
    elif not p.is_file():
        raise ConfigError(f"{path}: no such sweep directory or results file")
    elif p.suffix not in (".csv", ".parquet"):
        raise ConfigError(f"{path}: a results table is a .csv or .parquet file")

    df = read_table(p)
    from sim.core.metrics import BREAKDOWN

    # the columns the figures and tables read: present, and numbers where they are numbers (python -m sim.sweep
    # writes them all; a table missing one is refused here, not met as a KeyError halfway through the figures)
    numeric = ("batch_size", "output_throughput_tok_s", "speedup_vs_baseline", "mean_step_ms", "seed", "ngram_k",
               "requests", "output_tokens", "mean_tokens_per_step", "ngram_share_verified", "ngram_share_accepted",
               *(f"share_{k.removesuffix('_ms')}" for k in BREAKDOWN))
    need = {"policy", "trace", "status", "model", "gpu", "cost", "drafter", *numeric}
    if not need <= set(df.columns):
        raise ConfigError(f"{p}: not a sweep results table (missing {', '.join(sorted(need - set(df.columns)))})")
    if not len(df):
        raise ConfigError(f"{p}: the results table has no rows (an interrupted sweep? rerun it to resume)")
    for col in numeric:
        if not pd.api.types.is_numeric_dtype(df[col]):
            bad = df[col][pd.to_numeric(df[col], errors="coerce").isna() & df[col].notna()]
            raise ConfigError(f"{p}: column {col} must hold numbers, got {str(bad.iloc[0])[:40]!r}"
                              + (f" (row {bad.index[0] + 2})" if p.suffix == ".csv" else ""))
    rq = next((f for f in (d / "requests.parquet", d / "requests.csv") if f.is_file()), None)
    req = read_table(rq) if rq is not None else pd.DataFrame(columns=["cell_id", "prompt_len", "output_len", "decode_s"])
    return df, req


def check_csv_whole(f: Path) -> None:
    """ConfigError (file, line) unless the CSV file is whole: every record has the header's number of fields,
    no NUL byte, no field past the csv module's limit, and the file ends with a newline (pandas writes one;
    a file without it was cut mid-row). pandas alone would fill a cut row with NaN, silently."""
    import csv

    from sim.infra.errors import ConfigError

    with open(f, "rb") as fh:
        data = fh.read()
    if not data.strip():
        raise ConfigError(f"{f}: empty file")
    nl = b"\n"
    nul = data.find(b"\0")
    if nul >= 0:
        raise ConfigError(f"{f}:{data.count(nl, 0, nul) + 1}: a NUL byte (binary or damaged file)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{f}:{data.count(nl, 0, exc.start) + 1}: invalid UTF-8 (binary or damaged file)") from None
    if not text.endswith("\n"):
        raise ConfigError(f"{f}: the last row has no end of line: the file was cut mid-row (rerun the command that "
                          "wrote it)")
    reader = csv.reader(text.splitlines(keepends=True))
    try:
        width = None
        for row in reader:
            if width is None:
                width = len(row)
            elif row and len(row) != width:
                raise ConfigError(f"{f}:{reader.line_num}: {len(row)} fields, the header has {width}: a cut or damaged "
                                  "row (rerun the command that wrote it)")
    except csv.Error as exc:
        raise ConfigError(f"{f}:{reader.line_num}: not readable as CSV ({exc})") from None


def read_table(f: Path):
    """A results or requests table (.parquet, or .csv checked whole first); ConfigError naming the file for an
    empty, binary, cut or corrupt one (never a half-read table)."""
    import pandas as pd

    from sim.infra.errors import ConfigError

    if f.suffix == ".parquet":
        try:
            return pd.read_parquet(f)
        except ImportError:
            f = f.with_suffix(".csv")
        except Exception as exc:  # noqa: BLE001 - pyarrow's errors have no common base but OSError/ValueError
            if not isinstance(exc, (OSError, ValueError)) and type(exc).__module__.split(".")[0] != "pyarrow":
                raise
            raise ConfigError(f"{f}: not a readable parquet file ({str(exc).splitlines()[0][:200]}); delete it to "
                              "read the .csv beside it, or rerun the sweep") from None
    check_csv_whole(f)
    try:
        return pd.read_csv(f, keep_default_na=True)
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ConfigError(f"{f}: not a readable CSV table ({str(exc).splitlines()[0][:200]})") from None


def workloads(df) -> list[tuple[str, "pd.DataFrame"]]:
    """Split ok rows by setup (everything but policy and batch size; sim.api.setups.join_setups: a policy run apart
    with a drafter of its own joins its workload); label each by the trace's stem plus whatever else differs
    between the setups. Each policy keeps the `drafters` it ran with."""
    import pandas as pd

    from sim.api.setups import join_setups, setup_values

    keys = [k for k in _SETUP_KEYS if k in df.columns]
    ok = df[df["status"] == "ok"].copy()
    if ok.empty:
        return []
    ok = join_setups(ok, keys)
    varying = [k for k in keys if k != "trace" and setup_values(ok, k).nunique() > 1]
    out = []
    for _, g in ok.groupby("_setup", sort=False):
        r = g.iloc[0]
        label = Path(str(r["trace"])).stem
        extra = [f"{k}={r[k]}" for k in varying if not (isinstance(r[k], float) and pd.isna(r[k]))]
        out.append((" · ".join([label] + extra), g.drop(columns="_setup")))
    return out


def _policies(g) -> list[str]:
    order = list(dict.fromkeys(g["policy"]))
    return sorted(order, key=lambda p: (p != BASE, not p.startswith(HYBRID), p == ORACLE, order.index(p)))


def _hybrid_name(g) -> str | None:
    pols = list(dict.fromkeys(g["policy"]))
    return HYBRID if HYBRID in pols else next((p for p in pols if p.startswith(HYBRID)), None)


def _ratio_table(g, num: str, den: str, metric: str = "output_throughput_tok_s"):
    """metric(num) / metric(den) per batch size (a pandas Series), NaN where either is missing."""
    if metric not in g:
        return None
    t = g.pivot_table(index="batch_size", columns="policy", values=metric, aggfunc="first")
    if num not in t or den not in t:
        return None
    return (t[num] / t[den]).sort_index()


def context_bins(g, req, hybrid: str, base: str = BASE, nbins: int = CONTEXT_BINS):
    """Per-request decode-speed ratio hybrid/base by prompt-length bin and batch size.

    Within one mixed-batch run, a bin's decode speed = sum over its requests of (output_len - 1) / sum of their
    decode times (first token to last token); the heatmap shows that speed under `hybrid` over that under
    `base`, for the same requests, batch size and setup. Bins: prompt-length quantiles of the trace.
    Returns (ratio DataFrame [bin label x batch size], bin labels) or None without per-request data."""
    import numpy as np
    import pandas as pd

    if req is None or req.empty or "cell_id" not in g:
        return None
    cells = g[g["policy"].isin([hybrid, base])][["cell_id", "policy", "batch_size"]]
    r = req.merge(cells, on="cell_id")
    if r.empty:
        return None
    pl = r.drop_duplicates("cell_id")["cell_id"].iloc[0]
    lens = r.loc[r["cell_id"] == pl, "prompt_len"].to_numpy()
    edges = np.unique(np.quantile(lens, np.linspace(0, 1, nbins + 1)).round())
    if len(edges) < 2:
        edges = np.array([lens.min(), lens.max() + 1])
    edges[-1] = edges[-1] + 1  # last bin closed
    labels = [f"{int(edges[i])}-{int(edges[i + 1]) - 1}" for i in range(len(edges) - 1)]
    r = r.assign(bin=pd.cut(r["prompt_len"], edges, right=False, labels=labels),
                 tok=(r["output_len"] - 1).clip(lower=0), dec=pd.to_numeric(r["decode_s"], errors="coerce"))
    r = r[(r["tok"] > 0) & (r["dec"] > 0)]
    agg = r.groupby(["policy", "batch_size", "bin"], observed=False)[["tok", "dec"]].sum()
    speed = (agg["tok"] / agg["dec"]).unstack("policy")
    if hybrid not in speed or base not in speed:
        return None
    ratio = (speed[hybrid] / speed[base]).unstack("batch_size")
    counts = r[r["cell_id"] == pl].groupby("bin", observed=False).size()
    ylabels = [f"{b} tok (n={int(counts.get(b, 0))})" for b in ratio.index]
    return ratio, ylabels


def _div_id(name: str) -> str:
    return "fig-" + "".join(ch if ch.isalnum() else "-" for ch in name)


def _sweep_figures(df, req) -> list[tuple[str, str, list]]:
    """[(section title, explanation, [(figure id, go.Figure)])]."""
    from sim.core.metrics import BREAKDOWN

    wl = workloads(df)
    sections = []
    logx = dict(type="log", dtick=np.log10(2), tickformat="d")

    # 1. throughput and speedup against batch size
    figs = []
    for name, g in wl:
        fig = make_subplots(rows=1, cols=2, subplot_titles=["output throughput (tokens/s)", "throughput / adaptive"])
        colors = policy_colors(_policies(g))
        for p in _policies(g):
            rs = g[g["policy"] == p].sort_values("batch_size")
            color = colors[p]
            dash = "dot" if p == ORACLE else None
            fig.add_trace(go.Scatter(x=rs["batch_size"], y=rs["output_throughput_tok_s"], name=p, mode="lines+markers",
                                     legendgroup=p, line=dict(color=color, dash=dash)), row=1, col=1)
            fig.add_trace(go.Scatter(x=rs["batch_size"], y=rs["speedup_vs_baseline"], name=p, mode="lines+markers",
                                     legendgroup=p, showlegend=False, line=dict(color=color, dash=dash)), row=1, col=2)
        fig.add_hline(y=1.0, line_dash="dot", line_color="gray", row=1, col=2)
        fig.update_xaxes(title_text="batch size (max running requests)", **logx)
        fig.update_yaxes(title_text="output tokens/s", row=1, col=1)
        fig.update_yaxes(title_text="x adaptive", row=1, col=2)
        fig.update_layout(title=f"{name}: throughput against batch size", legend_title="policy", height=460)
        figs.append((f"thr-{name}", fig))
    sections.append((f"Output throughput and throughput / {BASE} against batch size", "Output tokens per simulated "
                     "second, every request of the trace run to completion; right: the same over adaptive verification "
                     "(the baseline) at that batch size.", figs))

    # 2. context-length heatmap
    figs, notes, plotted = [], [], []
    for name, g in wl:
        hyb = _hybrid_name(g)
        got = context_bins(g, req, hyb) if hyb and BASE in set(g["policy"]) else None
        if got is None:
            notes.append(name)
            continue
        plotted.append(hyb)
        ratio, ylabels = got
        z = ratio.to_numpy(dtype=float)
        text = [[("" if np.isnan(v) else f"{v:.2f}") for v in row] for row in z]
        fig = go.Figure(go.Heatmap(z=z, x=[str(b) for b in ratio.columns], y=ylabels, text=text,
                                   texttemplate="%{text}", **ratio_colors(z),
                                   colorbar=dict(title=f"{hyb}<br>/ {BASE}")))
        fig.update_layout(title=f"{name}: {hyb} over {BASE}, per-request decode speed by prompt length",
                          xaxis_title="batch size", yaxis_title="prompt length bin (quartiles)", height=420,
                          xaxis_type="category")
        figs.append((f"ctx-{name}", fig))
    shown = " and ".join(dict.fromkeys(plotted)) or "the hybrid"
    expl = ("Requests grouped by prompt length (quartiles of the trace). A cell is the decode speed of that group's "
            f"requests (their output tokens after the first over their first-to-last-token time) under {shown} "
            f"divided by the same under {BASE}, in the same full mixed-batch run: how much faster requests of that "
            "context length finish their decoding. It is not a throughput of a trace made only of such requests. "
            "Colour: white at 1, red below, blue above; the bar spans the cells' own range.")
    if notes:
        expl += f" (No per-request data for: {', '.join(notes)}.)"
    sections.append((f"{shown} over {BASE} by context length", expl, figs))

    # 3. drafter shares
    figs = []
    for name, g in wl:
        fig = make_subplots(rows=1, cols=2, subplot_titles=["n-gram share of verified draft tokens",
                                                            "n-gram share of accepted draft tokens"], shared_yaxes=True)
        colors = policy_colors(_policies(g))
        for p in _policies(g):
            rs = g[g["policy"] == p].sort_values("batch_size")
            color = colors[p]
            for col, key in ((1, "ngram_share_verified"), (2, "ngram_share_accepted")):
                fig.add_trace(go.Scatter(x=rs["batch_size"], y=rs[key], name=p, mode="lines+markers", legendgroup=p,
                                         showlegend=col == 1, line=dict(color=color)), row=1, col=col)
        fig.update_xaxes(title_text="batch size", **logx)
        fig.update_yaxes(title_text="share (rest: model drafter)", tickformat=".0%", range=[-0.03, 1.03], row=1, col=1)
        fig.update_yaxes(tickformat=".0%", range=[-0.03, 1.03], row=1, col=2)
        fig.update_layout(title=f"{name}: which drafter's tokens are verified and accepted", legend_title="policy",
                          height=440)
        figs.append((f"share-{name}", fig))
    sections.append(("Per-drafter share of verified and accepted tokens", "n-gram drafter tokens over all draft "
                     "tokens the target verified (left) and accepted (right); the rest are the model drafter's. adaptive and "
                     "model-fixed use the model drafter only (0%, drawn on top of each other), ngram-fixed the n-gram "
                     "drafter only (100%).", figs))

    # 4. step-time breakdown
    figs = []
    parts = [k.removesuffix("_ms") for k in BREAKDOWN]
    for name, g in wl:
        sizes = sorted(set(g["batch_size"]))
        pick = sorted({sizes[round(i * (len(sizes) - 1) / 3)] for i in range(4)}) if len(sizes) > 4 else sizes
        fig = make_subplots(rows=1, cols=len(pick), subplot_titles=[f"batch size {b}" for b in pick], shared_yaxes=False)
        pols = _policies(g)
        for ci, b in enumerate(pick, start=1):
            rs = g[g["batch_size"] == b].set_index("policy").reindex(pols)
            for part in parts:
                fig.add_trace(go.Bar(name=part, x=pols, y=rs["mean_step_ms"] * rs["share_" + part], legendgroup=part,
                                     showlegend=ci == 1, marker_color=part_color(part)), row=1, col=ci)
        fig.update_layout(title=f"{name}: mean step time by part (ms per engine step)", barmode="stack",
                          legend_title="part", height=480)
        fig.update_yaxes(title_text="ms per step", row=1, col=1)
        fig.update_xaxes(tickangle=-45)
        figs.append((f"steps-{name}", fig))
    sections.append(("Mean step time by part and policy", "Mean engine step split into drafting (model drafter, n-gram), allocation "
                     "(the policy), target verification, sampling, CPU scheduling and bubbles; a few batch sizes "
                     "(all of them are in tables.md).", figs))
    return sections


def _fmt(v, f: str) -> str:
    try:
        if v is None or (isinstance(v, float) and np.isnan(v)):
            return "-"
        return f.format(v)
    except (TypeError, ValueError):
        return str(v)


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _pivot_md(g, value: str, fmt: str, pols: list[str]) -> str:
    t = g.pivot_table(index="policy", columns="batch_size", values=value, aggfunc="first").reindex(pols)
    return _md_table(["policy"] + [f"bs {b}" for b in t.columns], [[p] + [_fmt(v, fmt) for v in t.loc[p]] for p in t.index])


def _setup_line(g) -> str:
    r = g.iloc[0]
    s = (f"`{r['trace']}`, {int(r['requests'])} requests, {int(r['output_tokens'])} output tokens; {r['model']} on "
         f"{r['gpu']} ({r['cost']} cost model); drafter {r['drafter']}, n-gram k={r['ngram_k']}; seed {r['seed']}")
    t = r.get("temperature")
    s += "; temperature " + ("from the trace" if t is None or (isinstance(t, float) and np.isnan(t)) else f"{t:g}")
    lim = r.get("limit")
    if lim is not None and not (isinstance(lim, float) and np.isnan(lim)):
        s += f"; first {int(lim)} requests only (--limit)"
    return s


def sweep_tables_md(df, req) -> str:
    out = ["# hybridspec sweep: tables", "",
           "Generated by `python -m sim.report`. Throughput is output tokens per simulated second; ratios are per "
           "batch size within one setup.", ""]
    err = df[df["status"] != "ok"]
    if len(err):
        out += [f"**{len(err)} of {len(df)} cells failed** (see the `error` column of results.csv):", ""]
        for _, r in err.head(20).iterrows():
            out.append(f"- {r['policy']} bs={r['batch_size']} {r['trace']}: {r['error']}")
        out.append("")
    for name, g in workloads(df):
        pols = _policies(g)
        out += [f"## {name}", "", _setup_line(g), ""]
        out += ["### Output throughput (tokens/s)", "", _pivot_md(g, "output_throughput_tok_s", "{:.0f}", pols), ""]
        out += ["### Throughput / adaptive", "", _pivot_md(g, "speedup_vs_baseline", "{:.3f}", pols), ""]
        if ORACLE in pols:
            t = g.pivot_table(index="policy", columns="batch_size", values="output_throughput_tok_s", aggfunc="first")
            g2 = g.assign(_vs_oracle=[r["output_throughput_tok_s"] / t.loc[ORACLE, r["batch_size"]]
                                      if r["batch_size"] in t.columns else np.nan for _, r in g.iterrows()])
            out += ["### Throughput / oracle (gap to the upper bound)", "", _pivot_md(g2, "_vs_oracle", "{:.3f}", pols), ""]
        out += ["### Mean emitted tokens per request-step", "", _pivot_md(g, "mean_tokens_per_step", "{:.2f}", pols), ""]
        out += ["### n-gram share of verified / accepted draft tokens", "",
                _md_table(["policy"] + [f"bs {b}" for b in sorted(set(g["batch_size"]))],
                          [[p] + [f"{_fmt(r['ngram_share_verified'], '{:.0%}')} / {_fmt(r['ngram_share_accepted'], '{:.0%}')}"
                                  for _, r in g[g["policy"] == p].sort_values("batch_size").iterrows()] for p in pols]), ""]
        out += ["### Step-time breakdown", ""]
        parts = [k.removesuffix("_ms") for k in BREAKDOWN]
        rows = []
        for b in sorted(set(g["batch_size"])):
            for p in pols:
                rs = g[(g["batch_size"] == b) & (g["policy"] == p)]
                if len(rs):
                    r = rs.iloc[0]
                    rows.append([p, str(b), _fmt(r["mean_step_ms"], "{:.2f}")] + [_fmt(r["share_" + k], "{:.0%}") for k in parts])
        out += [_md_table(["policy", "bs", "step ms"] + [f"{k}%" for k in parts], rows), ""]
        hyb = _hybrid_name(g)
        got = context_bins(g, req, hyb) if hyb and BASE in set(g["policy"]) else None
        if got is not None:
            ratio, ylabels = got
            out += [f"### {hyb} / adaptive per-request decode speed by prompt length", "",
                    _md_table(["prompt length"] + [f"bs {b}" for b in ratio.columns],
                              [[lab] + [_fmt(v, "{:.3f}") for v in ratio.iloc[i]] for i, lab in enumerate(ylabels)]), ""]
    return "\n".join(out)


def _best_single(t, b):
    """(policy, throughput) of the best single-drafter / fixed-rule policy at batch size b, or (None, nan)."""
    cols = [p for p in t.columns if p.startswith(SINGLE_PREFIXES)]
    vals = {p: t.at[b, p] for p in cols if b in t.index and not np.isnan(t.at[b, p])}
    if not vals:
        return None, float("nan")
    best = max(vals, key=vals.get)
    return best, vals[best]


MAIN_COLUMN = "best on vLLM main (unreleased)"  # serve_table's column of sim/core/deploy.py's MAIN_TIER


def serve_table(t, drafters: dict | str | None) -> str:
    """What to serve per batch size (sim/core/deploy.py's tiers, as sim.run's verdict ranks them): the fastest
    setup that runs in vLLM as released or with the plugin, the best in vLLM as released, the best on vLLM main
    (MAIN_TIER: unreleased, never recommended; only where the sweep ran such a policy), the fastest simulated-only
    design, and speculation's gain over `none`; ratios over adaptive [throughput / throughput]. `t`: throughput by
    batch size x policy; `drafters`: the drafters each policy ran with (policy -> `--drafters` value), or one value
    for all of them."""
    from sim.api.console import rank_key
    from sim.core.deploy import DEPLOYABLE, on_vllm_main, tier

    pols = {p: _run_policy(p, drafters) for p in t.columns}
    tiers = {p: tier(pol) for p, pol in pols.items()}
    main = {p for p, pol in pols.items() if on_vllm_main(pol)}
    deployable, today_set, designs = ({p for p in t.columns if tiers[p] in ts} for ts in (DEPLOYABLE, ("vllm",),
                                                                                        ("engine",)))
    rows = []
    for b in t.index:
        base = t.at[b, BASE] if BASE in t else float("nan")
        ok = {p: t.at[b, p] for p in t.columns if not np.isnan(t.at[b, p])}

        def best(names):  # as the verdict ranks (sim/api/console.py rank_key)
            cand = {p: v for p, v in ok.items() if p in names}
            if not cand:
                return None, float("nan")
            top = min(cand, key=lambda q: rank_key(cand[q], q, BASE))
            return top, cand[top]

        rec, rv = best(deployable)
        today, tv = best(today_set)
        design, dv = best(designs)
        newest = [best(main)] if main else []
        none = ok.get("none")
        rows.append([str(b), rec or "-", _fmt(rv / base, "{:.3f}"), "plugin" if tiers.get(rec) == "plugin" else
                     "vLLM", today or "-", _fmt(tv / base, "{:.3f}")]
                    + [c for p, v in newest for c in (p or "-", _fmt(v / base, "{:.3f}"))]
                    + [design or "-", _fmt(dv / base, "{:.3f}"), _fmt(rv / none if none else None, "{:.2f}")])
    return _md_table(["batch size", "recommended", "/ adaptive", "runs in", "best in vLLM as released", "/ adaptive"]
                     + ([MAIN_COLUMN, "/ adaptive"] if main else [])
                     + ["best simulated-only design", "/ adaptive", "recommended / none"], rows)


def _run_policy(name: str, drafters: dict | str | None):
    """The Policy `name` as the sweep ran it: over the drafters it ran with (serve_table's `drafters`)."""
    from sim.core.policies import get_policy

    d = drafters.get(name) if isinstance(drafters, dict) else drafters
    return get_policy(name, tuple(str(d).split(","))) if d and str(d) != "nan" else get_policy(name)


def main_tier_line(g) -> list[str]:
    """The paper's line under "What to serve" on vLLM main's tier (sim/core/deploy.py MAIN_TIER), for the rows `g`
    of one workload: which of the registered vLLM main policies the sweep ran, and why each other is absent (a
    policy on method 'mtp' needs a target with MTP layers, LLMSpec.mtp_layers); [] where it ran none."""
    from sim.core.config import WITH_SUFFIX
    from sim.core.deploy import MAIN_TIER, on_vllm_main
    from sim.core.models import get_llm
    from sim.core.policies.catalog import families, get_policy, split_spec
    from sim.infra.errors import ConfigError

    drafters = dict(zip(g["policy"], g["drafters"])) if "drafters" in g else None
    ran = sorted(p for p in set(g["policy"]) if on_vllm_main(_run_policy(p, drafters)))
    if not ran:
        return []
    model = str(g.iloc[0]["model"]) if "model" in g else None
    others = []
    for name in families():
        try:
            pol = get_policy(name, tuple(WITH_SUFFIX.split(",")))
        except ConfigError:  # a family that needs parameters: not one the sweep can have left out by default
            continue
        if on_vllm_main(pol) and not any(split_spec(p)[0] == name for p in ran):
            why = (f"needs a target with MTP layers, which {model} has not" if pol.vllm.method == "mtp" and model
                   and not get_llm(model).mtp_layers else "not run in this sweep")
            others.append(f"`{name}` {why}")
    return [f"`{MAIN_COLUMN}`: the tier \"{MAIN_TIER}\", what vLLM's main branch runs and no release does: the best "
            f"of {', '.join(f'`{p}`' for p in ran)}, under the project's own charge, never recommended"
            + (f" ({'; '.join(others)})" if others else "") + ".", ""]


def anchor_lines(anchors: list[dict] | None, trace_stem: str) -> list[str]:
    """The anchors' errors (reports/anchors.json, written by python -m sim.anchors) that bear on a code-editing
    trace's headline: PR 24344's Blazedit n-gram figures on that trace, and the step-cost anchor (PR 32374)."""
    if not anchors:
        return []
    edit = [a for a in anchors if a["anchor"].startswith("pr24344") and a["anchor"].endswith(f":{trace_stem}")
            and "acceptance at" not in a["metric"]]
    itl = [a for a in anchors if a["anchor"].startswith("pr32374")]
    if not edit and not itl:
        return []
    def diff(a):
        if a.get("tolerance_kind") == "absolute":
            return f"{a['simulated'] - a['published']:+.3f}, target ±{a['tolerance']:g}"
        return f"{a['error']:+.0%}, target ±{a['tolerance']:.0%}"

    parts = [f"{a['metric']} {a['simulated']:.3f} vs {a['published']:.3f} published ({diff(a)}"
             f"{'' if a['within'] else ': missed'})" for a in edit]
    line = ("Anchors (`python -m sim.anchors`, reports/anchors.md): vLLM PR 24344's Blazedit figures "
            "(n-gram K=5, EAGLE-1 K=3; batch 1; outputs cut at the published run's 256 tokens) "
            "reproduced on this trace: " + "; ".join(parts) + "." if parts else "Anchors (reports/anchors.md):")
    if itl:
        worst = max(itl, key=lambda a: abs(a["error"]))
        line += (f" The roofline's H100 step cost (llama-3.1-8b with an EAGLE-1 head) against PR 32374's inter-token "
                 f"latencies: {sum(a['within'] for a in itl)} of {len(itl)} within 15%, largest error "
                 f"{worst['error']:+.1%}.")
    return [line, ""]


def paper_md(df, command: str | None = None, anchors: list[dict] | None = None) -> str:
    """The default hybrid's and the seed's hybrid-price's throughput over adaptive on the bundled code-editing
    and chat traces beside the seed's published ranges, the hybrid against the best single-drafter policy,
    and every policy's gap to the per-step oracle."""
    out = ["# hybridspec: simulated speedups beside the seed's published figures", "",
           "Throughput ratios over adaptive verification (vLLM 0.33 `enable_adaptive_verification`, the baseline) at "
           "the same batch size, from the discrete-event simulator (output tokens per simulated second, every "
           "request of the trace run to completion). **Simulation only**: no real run confirms these H100 figures "
           "yet (reports/fidelity*.md checks the simulator on a CPU engine with a small model). Published: the seed's claims (its abstract): code editing "
           "1.10-1.62x at batch size 4 and 1.04-1.27x at 128; chat at temperature 0 0.97-1.01x.", "",
           f"`{HYBRID}` is the project's default hybrid: the seed's price rule (`{SEED}`, reported beside it) that also "
           "prices the model drafter's pass and skips it for a step when host-known values say the step earns "
           "more without it (docs/simulator.md). `best single` is the best of the single-drafter and fixed-rule "
           "policies run (adaptive, model-fixed, ngram-fixed, ngram-first, ngram-threshold), named; "
           f"`{HYBRID} / best` must stay >= {DOMINANCE}. `oracle` is the per-step oracle: each step's best "
           "allocation with perfect knowledge (which drafters run, which chain, the accepted prefix). It bounds "
           "every policy's step goodput on the states that policy visits (tests/test_oracle_bound.py); it is not "
           "a bound on end-to-end throughput of a finite trace, where the drain of the longest requests sets the "
           "makespan, so a policy can exceed it end to end (it then shows above 100% below). `steady-state` "
           "compares throughput over the steps in which the whole batch was decoding.", ""]
    if command:
        out += ["Regenerate (see docs/sweeps.md):", "", "    " + command, ""]
    wl = workloads(df)
    found = False
    for key, title in (("codeedit", "Code editing, copy-heavy bound"),
                       ("codeedit-model", "Code editing, model-shaped outputs"), ("chat", "Chat")):
        for name, g in wl:
            if Path(str(g.iloc[0]["trace"])).stem != key:
                continue
            found = True
            pub = PUBLISHED[key]
            hyb = _hybrid_name(g)
            out += [f"## {title} ({name})", "", _setup_line(g), ""] + anchor_lines(anchors, key)
            t = g.pivot_table(index="batch_size", columns="policy", values="output_throughput_tok_s", aggfunc="first")
            out += ["What to serve (the verdict of `python -m sim.run`; `vllm serve` flags: its output):", "",
                    serve_table(t, dict(zip(g["policy"], g["drafters"])) if "drafters" in g else None), ""]
            out += main_tier_line(g)
            r_o = _ratio_table(g, ORACLE, BASE)
            r_s = _ratio_table(g, hyb, BASE, "steady_throughput_tok_s") if hyb else None
            rows = []
            for b in sorted(set(g["batch_size"])):
                rng = pub.get(b, pub.get(None))
                base = t.at[b, BASE] if BASE in t else float("nan")
                hv = t.at[b, hyb] / base if hyb in t else None
                sv_seed = t.at[b, SEED] / base if SEED in t else None
                best, bt = _best_single(t, b)
                ov = r_o.get(b) if r_o is not None else None
                inr = "-" if rng is None or hv is None or np.isnan(hv) else (
                    "yes" if rng[0] <= hv <= rng[1] else ("above" if hv > rng[1] else "below"))
                dom = t.at[b, hyb] / bt if hyb in t and best else None
                sv = r_s.get(b) if r_s is not None else None
                rows.append([str(b), _fmt(hv, "{:.3f}"), _fmt(sv_seed, "{:.3f}"),
                             "-" if rng is None else f"{rng[0]:.2f}-{rng[1]:.2f}", inr,
                             _fmt(bt / base if best else None, "{:.3f}"), best or "-",
                             _fmt(dom, "{:.3f}") + ("" if dom is None or dom >= DOMINANCE else " **below**"),
                             _fmt(ov, "{:.3f}"), _fmt(hv / ov if hv is not None and ov else None, "{:.1%}"),
                             _fmt(sv, "{:.3f}")])
            out += [_md_table(["batch size", f"{hyb} / adaptive", f"{SEED} / adaptive", "published", "in range",
                               "best single / adaptive", "best single", f"{hyb} / best", "oracle / adaptive",
                               f"{hyb} / oracle", "steady-state / adaptive"], rows), ""]
            pols = _policies(g)
            if ORACLE in pols:
                tt = g.pivot_table(index="policy", columns="batch_size", values="output_throughput_tok_s", aggfunc="first")
                gap = (tt / tt.loc[ORACLE]).reindex(pols)
                out += ["Gap to the oracle (throughput / oracle's):", "",
                        _md_table(["policy"] + [f"bs {b}" for b in gap.columns],
                                  [[p] + [_fmt(v, "{:.3f}") for v in gap.loc[p]] for p in gap.index]), ""]
    if not found:
        out += ["No code-editing or chat rows in this sweep (traces/codeedit.jsonl, traces/chat.jsonl): run the "
                "paper preset.", ""]
    err = df[df["status"] != "ok"]
    if len(err):
        out += [f"Note: {len(err)} of {len(df)} cells failed and are missing above (see tables.md).", ""]
    return "\n".join(out)


PAPER_COMMAND = ("python -m sim.sweep --preset paper --out out/paper && "
                 "python -m sim.report out/paper -o reports/ --force --plotly shared")


REPORT_FILES = ("index.html", "tables.md", "paper.md")


# python -m sim.anchors' anchors.json (sim/api/anchors.py), as far as paper_md reads it; a damaged or hand-made file
# is refused in one line naming the field (sim/infra/inputs.py)
ANCHORS_SCHEMA = List(Obj({"anchor": Str(), "metric": Str(), "published": Num(), "simulated": Num(), "error": Num(),
                           "tolerance": Num(lo=0), "within": Bool(), "tolerance_kind": Opt(Str(("absolute", "relative"))),
                           "fitted": Opt(Bool())}))


def read_anchors(out_dir) -> list[dict] | None:
    """out_dir/anchors.json (python -m sim.anchors' figures, shown beside the headline), checked against
    ANCHORS_SCHEMA; None when there is none."""
    from sim.infra.errors import ConfigError
    from sim.infra.inputs import CONFIG, read_json

    f = Path(out_dir) / "anchors.json"
    if not f.exists():
        return None
    try:
        return read_json(f, CONFIG, ANCHORS_SCHEMA)
    except ConfigError as exc:
        raise ConfigError(f"{exc} (rerun python -m sim.anchors, or remove it)") from None


def write_sweep_report(df, req, out_dir, command: str | None = PAPER_COMMAND, plotly: str = "inline") -> list[Path]:
    """index.html (sim/infra/html_page.py: renders offline; plotly.js inlined once, or with plotly="shared" one
    copy beside it), tables.md and paper.md in out_dir, all rendered first, then written as one unit
    (sim.infra.fsio.commit_files: a full disk or a kill leaves the three old or the three new)."""
    from sim.infra.cli import write_files
    from sim.infra.html_page import uses_shared, write_asset

    out_dir = Path(out_dir)
    anchors = read_anchors(out_dir)  # before the figures: a damaged file costs no rendering
    out_dir.mkdir(parents=True, exist_ok=True)
    sections = _sweep_figures(df, req)
    ok = df[df["status"] == "ok"]
    setups = sorted({f"{Path(str(r['trace'])).stem}: {r['model']} on {r['gpu']}" for _, r in ok.iterrows()})
    body = [heading(1, "hybridspec sweep"),
            para(f"{len(df)} cells ({len(ok)} ok, {len(df) - len(ok)} failed); setups: {', '.join(setups) or 'none'}. "
                 f"Baseline: {BASE}. Numbers: tables.md; published comparison: paper.md."),
            nav([(f"sec{i}", t) for i, (t, _, _) in enumerate(sections)])]
    for i, (title, expl, figs) in enumerate(sections):
        body += [heading(2, title, f"sec{i}"), para(expl, "note")]
        if not figs:
            body.append(para("no data", italic=True))
        for fid, fig in figs:
            style(fig, margin=dict(t=80))
            body.append(figure_div(fig, _div_id(fid)))
    if not any(figs for _, _, figs in sections):
        body.append(para("No successful cells to plot.", italic=True))
    texts = [page("hybridspec sweep", body, plotly), sweep_tables_md(df, req) + "\n", paper_md(df, command, anchors) + "\n"]
    if uses_shared(texts[0]):
        write_asset(out_dir)  # the shared plotly.js first, so the page never points at a missing file
    return write_files(out_dir, dict(zip(REPORT_FILES, texts)), overwrite=True, unit="report")


def default_out(sweep) -> Path:
    """Where `python -m sim.report SWEEP` writes without -o: `report/` inside the sweep directory (or next to a
    results file), never the committed reports/."""
    p = Path(sweep)
    return (p if p.is_dir() else p.parent) / "report"


def main(argv: list[str] | None = None) -> int:
    from sim.infra.cli import ArgumentParser, check_out_files
    from sim.infra.html_page import add_plotly_flag, check_asset

    ap = ArgumentParser(prog="python -m sim.report", description=SWEEP_USAGE)
    ap.add_argument("sweep", help="a sweep output directory (results.parquet/.csv, requests.parquet/.csv) or results file")
    ap.add_argument("-o", "--out", default=None,
                    help="output directory (default: SWEEP/report/; -o reports/ --force --plotly shared replaces the committed "
                         "report)")
    ap.add_argument("--force", action="store_true", help="replace index.html, tables.md, paper.md already in the folder")
    add_plotly_flag(ap, "index.html: ")
    a = ap.parse_args(argv)
    out = Path(a.out) if a.out else default_out(a.sweep)
    check_out_files(out, REPORT_FILES, a.force, "-o")  # before any work
    if a.plotly == "shared":
        check_asset(out)
    df, req = load_sweep(a.sweep)
    paths = write_sweep_report(df, req, out, plotly=a.plotly)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
