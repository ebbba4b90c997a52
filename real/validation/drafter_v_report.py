"""`python -m real.drafter_v_report --drafter FILE -o reports/drafter-v.md`: the vLLM-architecture drafter's report,
read from its weights file (real/drafter/train_v_job.py records everything in the file's metadata).

Writes the markdown (the training command, data, warm start, the learning curve as a table, and per held-out
set the first-slot accuracy beside the trivial predictors, free-running tau and survival ECE against the issue's
targets) and, beside it, an HTML page with the learning curve (`--plotly inline|shared|cached`). Nothing is
recomputed: the figures are the ones the training run measured; rerunning the training command rebuilds them.
"""
from __future__ import annotations

from pathlib import Path

from sim.infra.cli import ArgumentParser, check_in_file, check_out_files
from sim.infra.errors import ConfigError
from sim.infra.fsio import commit_files
from sim.infra.html_page import add_plotly_flag, check_asset, figure_div, heading, page, para, write_asset

TARGETS = {"general": 1.8, "codeedit": 2.5}   # tau at temperature 0, free-running (issue's floor)
ECE_TARGET = 0.03


def _meta(path: Path) -> dict:
    from real.drafter.model import load_drafter

    meta = load_drafter(path).meta  # checks the file's sha256, loads it as data only
    if "curve" not in meta or "measured" not in meta:
        raise ConfigError(f"{path}: not a vLLM-architecture drafter written by python -m real.train_drafter_v "
                          "(no learning curve or held-out measurements in its metadata)")
    return meta


def markdown(meta: dict, drafter: Path, html_name: str, plotly: str = "inline") -> str:
    cmd = (f"python -m real.drafter_v_report --drafter {drafter} -o <out.md>"
           + (f" --plotly {plotly}" if plotly != "inline" else ""))
    lines = [f"# The vLLM-architecture DSpark drafter for SmolLM2-135M ({drafter.name})", "",
             f"Made by `{meta['command']}`; this page by `{cmd}`. Learning curve: [{html_name}]({html_name}).", "",
             "## Data", "", "| source | sequences | train | held out | tokens | agreement with the target |",
             "|---|---|---|---|---|---|"]
    for k, v in meta["data"].items():
        lines.append(f"| {k} | {v['sequences']} | {v['train']} | {v['held_out']} | {v['tokens']} | "
                     f"{v['agreement']:.1%} |")
    w = meta.get("warm_start")
    lines += ["", "## Warm start (real/drafter/warm_start.py)", ""]
    lines += ([", ".join(f"{k} {v}" for k, v in w.items())] if w else ["off (`--no-warm-start`)"])
    ca = meta.get("confidence_affine")
    if ca:
        lines += ["", "## Confidence head recalibration (evaluate.fit_platt, folded into its weights)", "",
                  f"logit -> {ca['a']:.3f} x logit {ca['b']:+.3f}, fitted on {ca['slots']:,} held-out slots."]
    lines += ["", "## Learning curve (held-out general text, teacher forced)", "",
              f"{meta['steps_done']} steps, {meta['labelled_seen']:,} labelled positions seen"
              + ("" if meta.get("finished", True) else " (stopped at its time budget)") + ".", "",
              "| step | labelled positions seen | CPU s | tau_tf | first-slot top-1 |", "|---|---|---|---|---|"]
    for p in meta["curve"]:
        lines.append(f"| {p['step']} | {p['labelled']:,} | {p.get('cpu_s', 0):.0f} | {p['tau_tf']:.3f} | "
                     f"{p['top1'][0]:.3f} |")
    lines += ["", "## Held-out sets (free-running drafts at temperature 0)", "",
              "First slot: the drafter and three trivial predictors on the same anchors (real/drafter/baselines.py). "
              "\"Output\" rows count only anchors on the target's own continuation, what a serving drafter meets.", "",
              "| set | anchors | drafter | trigram | prompt copy | ridge | tau | tau floor | survival ECE (raw) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for name, m in meta["measured"].items():
        fs = m["first_slot"]
        floor = TARGETS["codeedit" if "codeedit" in name else "general"]
        beat = fs["drafter"] > max(fs["trigram"], fs["prompt_copy"], fs["ridge"])
        lines.append(f"| {name} | {fs['anchors']} | {fs['drafter']:.3f}{'' if beat else ' (below)'} | "
                     f"{fs['trigram']:.3f} | {fs['prompt_copy']:.3f} | {fs['ridge']:.3f} | {m['tau_all']:.2f} | "
                     f"{floor} {'met' if m['tau_all'] >= floor else 'missed'} | {m['ece_raw']:.3f} "
                     f"{'met' if m['ece_raw'] <= ECE_TARGET else 'missed'} |")
    return "\n".join(lines) + "\n"


def curve_html(meta: dict, plotly: str) -> str:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    c = meta["curve"]
    x = [p["labelled"] for p in c]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("held-out tau_tf", "held-out top-1 per slot"))
    fig.add_trace(go.Scatter(x=x, y=[p["tau_tf"] for p in c], mode="lines+markers", name="tau_tf"), 1, 1)
    for k in range(len(c[0]["top1"])):
        fig.add_trace(go.Scatter(x=x, y=[p["top1"][k] for p in c], mode="lines+markers", name=f"slot {k}"), 1, 2)
    fig.update_xaxes(title_text="labelled positions seen")
    fig.update_layout(height=460, width=1000, margin=dict(t=80),
                      title_text="Held-out learning curve against labelled positions seen")
    return page("drafter learning curve", [heading(2, "The vLLM-architecture drafter's learning curve"),
                                           para(meta["command"]), figure_div(fig, "curve")], plotly)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m real.drafter_v_report", description=__doc__.split("\n")[0])
    ap.add_argument("--drafter", required=True, help="the weights file python -m real.train_drafter_v wrote")
    ap.add_argument("-o", "--out", required=True, help="the markdown to write (the .html goes beside it)")
    ap.add_argument("--force", action="store_true", help="replace existing outputs")
    add_plotly_flag(ap)
    a = ap.parse_args(argv)
    drafter = check_in_file(a.drafter, "--drafter")
    out = Path(a.out)
    if out.suffix != ".md":
        raise ConfigError(f"--out {out}: expected a .md file (the .html is written beside it)")
    html = out.with_suffix(".html")
    folder = check_out_files(out.parent, [out.name, html.name], a.force, "--out", named=True,
                             given_folder=False)  # -o r.md: the working folder holds the two files
    if a.plotly == "shared":
        check_asset(folder)
    meta = _meta(drafter)
    if a.plotly == "shared":
        write_asset(folder)
    commit_files(folder, {html.name: curve_html(meta, a.plotly),
                          out.name: markdown(meta, drafter, html.name, a.plotly)})
    print(f"wrote {out} and {html}")
    return 0
