"""The report step of the validation pipeline (real/validation/pipeline/), for every engine: fidelity.json / .md /
.html from a run's cells, the aggregate over them (throughput errors and the verdicts of
real/validation/fidelity_stats.py where the engine is timed and repeated, steps errors, losslessness and tie flips,
the plugin's n-gram chains per depth), and the torch engine's page (the vLLM builds' is real/validation/vllm/flow.py
format_md)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from real.validation.fidelity_stats import CellVerdict, summarize
from sim.infra.cli import write_whole

QUICK_NOTE = ("--quick checks the pipeline, not fidelity (by default 3 requests of 16 tokens, one repeat): its errors "
              "and verdicts say nothing about the simulator's accuracy")

def write_output(path: Path, text: str) -> None:
    """Outputs under --out, regenerated from the cached cells on every run."""
    write_whole(path, text, overwrite=True)


def steps_csv(steps: dict) -> str:
    import pandas as pd

    return pd.DataFrame(steps).to_csv(index=False)


PER_STEP = ("step_ms", "verified_slots")  # per-step lists of a summary, kept out of fidelity.json


def write_reports(out: Path, cells: list[dict], meta: dict, md=None, plotly: str = "inline", page: bool = True) -> dict:
    """fidelity.json / .md / .html from the cells; returns the aggregate. md: the markdown formatter
    (default format_md, the torch engine's); plotly: the page's plotly.js inlined, or "shared" beside it
    (sim/infra/html_page.py; real/validate.py's --plotly); page: write the throughput page (an engine whose
    wall clock is not its own -- the vLLM CPU harness -- has no throughput to plot)."""
    from sim.infra.html_page import write_page

    agg = aggregate(cells)
    slim = [{k: ({kk: vv for kk, vv in v.items() if kk not in PER_STEP} if isinstance(v, dict) else v)
             for k, v in c.items()} for c in cells]
    write_output(out / "fidelity.json", json.dumps({"meta": meta, "aggregate": agg, "cells": slim}, indent=1) + "\n")
    write_output(out / "fidelity.md", (md or format_md)(slim, agg, meta))
    if page:
        write_page(out / "fidelity.html", format_html(slim, agg, meta, plotly), overwrite=True)
    return agg


def _med(xs) -> float:
    a = np.asarray([x for x in xs if x is not None], dtype=np.float64)
    return float(np.nanmedian(a)) if np.isfinite(a).any() else float("nan")


def _max(xs) -> float:
    a = np.asarray([x for x in xs if x is not None], dtype=np.float64)
    return float(np.nanmax(a)) if np.isfinite(a).any() else float("nan")


def aggregate(cells: list[dict]) -> dict:
    """A run's summary over its cells (fidelity.json's "aggregate"), over the cells that carry each figure: median
    and max |throughput error|, the synthetic drafter's and the step times' median errors, the steps' errors (how
    many within 3%), losslessness and tie flips, the verdicts' counts and conclusive errors
    (real/validation/fidelity_stats.summarize) when every cell was repeated, the drift-corrected errors when
    recorded, and the plugin's n-gram chains per depth when it ran."""
    pe = [c["predicted_error"] for c in cells if "predicted_error" in c]
    se = [c["steps_error"] for c in cells if "steps_error" in c]
    agg = {"cells": len(cells), "median_error": _med(pe), "max_error": _max(pe),
           "median_synthetic_error": _med(c["synthetic_error"] for c in cells if "synthetic_error" in c),
           "median_step_error": _med(c.get("step_error_median") for c in cells),
           "median_steps_error": _med(se), "max_steps_error": _max(se),
           "max_tokens_per_step_error": _max(c.get("tokens_per_step_error") for c in cells),
           "within_3pct": sum(e <= 0.03 for e in se), "predicted_cells": len(se),
           "tie_flips": int(sum(c["real"].get("tie_flips", 0) for c in cells)),
           "all_lossless": all(c["real"]["lossless"] and (c["real"]["outputs_equal_reference"]
                                                          or c["real"].get("tie_flips", 0) > 0) for c in cells)}
    depths = ngram_depths(cells)
    if depths:
        agg["ngram_depths"] = depths
    if cells and all("verdict" in c for c in cells):  # repeated cells (the torch engine): verdicts and their summary
        agg["verdicts"] = summarize(CellVerdict.from_json(c["verdict"]) for c in cells).to_json()
    drift = [abs(c["drift"]["error"]) for c in cells if c.get("drift")]
    if drift:  # the speed probes' drift-corrected errors (real/validation/validate.py assemble_cell): beside, not in, the verdicts
        agg["drift_corrected"] = {"cells": len(drift), "median_error": float(np.median(drift)),
                                  "max_error": float(np.max(drift))}
    return agg


VERDICT_TEXT = ("Verdicts (real/validation/fidelity_stats.py): each cell's real run is repeated (ABBA order across the cells) and "
                "its noise band is the relative half-width of the 90% t interval of its error, from the repeats' "
                "scatter and the prediction's own uncertainty (the profile's repeated runs). A cell **agrees** when "
                "its error is inside the margin and the band is narrower than the margin, **disagrees** when the "
                "error exceeds margin + band (\"|error| <= margin\" rejected at the 5% level), and is "
                "**inconclusive** otherwise: the band is wider than the margin, or the error lies between the margin "
                "and margin + band. A cell measured while other processes took cores the engine needed is marked "
                "*load* and cannot disagree (real/validation/machine_load.py).")


ANCHOR_TEXT = ("Re-anchored (real/validation/fidelity_stats.py): the same fixed forwards (real/validation/profile.py `speed_probe`) are "
               "timed after the warm-up and after every profile run, and before and after every cell repeat. The "
               "table is fitted at the profile probes' geometric mean speed (each profile run divided by the speed "
               "of the two probes around it), and each repeat's throughput is brought to that speed, x' = x q, q "
               "the geometric mean of its two probes' times over the reference's (> 1: the machine ran slower). "
               "The verdict, its error and its band use x'; 'machine speed q' is the median q of the repeats, "
               "'wall-clock error' the prediction against the repeats' wall clock as measured. A cell whose probes "
               "moved within its repeats by more than twice the margin (median |log(after / before)| / 2 > margin) "
               "is marked drifted and cannot disagree.")


def format_md(cells: list[dict], agg: dict, meta: dict) -> str:
    m = meta["machine"]
    lines = ["# Fidelity: the simulator against the real engine", "",
             f"Produced by `{meta['command']}` on {m.get('cpu', '?')} ({m.get('device', '?')}, {m.get('threads', '?')} "
             f"threads of {m.get('cores', '?')} cores, torch {m.get('torch', '?')}); model {meta['model']} "
             f"({meta['mode']}); max {meta['max_tokens']} output tokens per request, prompts of at most "
             f"{meta['max_prompt']} tokens; {meta.get('repeats', 1)} repeat(s) per cell.", ""]
    if meta.get("quick"):
        lines += [f"**{QUICK_NOTE}.**", ""]
    lines += ["Real: the real engine's output tokens per second of engine time (the median of the repeats; in a "
              "re-anchored cell at the profile's speed, the figure its verdict judges). Errors are signed, predicted / "
              "real - 1, against that same real figure. Predicted: the simulator on the recorded outputs and drafts with this machine's profiled costs "
              "(`real/validation/profile.py`). Synthetic: the simulator drawing its synthetic drafter afresh instead of replaying "
              "the drafts. " + meta.get("drafter_note", ""), ""]
    ver = agg.get("verdicts")
    if ver:
        lines += [f"**{summary_line(ver)}.** Every real run lossless (outputs equal plain greedy decoding): "
                  f"{'yes' if agg['all_lossless'] else 'NO'}.", "", VERDICT_TEXT, ""]
    lines += [f"Median |throughput error| over all cells {100 * agg['median_error']:.1f}%, max "
              f"{100 * agg['max_error']:.1f}%; median step-time error {100 * agg['median_step_error']:.1f}%; synthetic "
              f"drafter: median {100 * agg['median_synthetic_error']:.1f}%."
              + ("" if ver else f" Every real run lossless: {'yes' if agg['all_lossless'] else 'NO'}."), ""]
    head = ("| trace | policy | bs | reqs | real tok/s | predicted tok/s | error | synthetic tok/s | error | "
            "steps real/sim | tok/engine step | mean latency real / sim (s) | step-time error (median) | speedup vs none |")
    rule = "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    if ver:
        head += " repeats (min-max tok/s) | noise band | verdict | cpu-clock tok/s |"
        rule += "---|---:|---|---:|"
    dc = agg.get("drift_corrected")
    if dc:
        head += " machine speed vs profile | drift-corrected error |"
        rule += "---:|---:|"
    anch = any(c.get("anchor") for c in cells)
    if anch:
        head += " machine speed q | wall-clock tok/s | wall-clock error |"
        rule += "---:|---:|---:|"
    lines += [head, rule]
    base = {(c["trace"], c["batch_size"]): judged_real(c) for c in cells if c["policy"] == "none"}
    for c in cells:
        b, r = base.get((c["trace"], c["batch_size"])), judged_real(c)
        sp = f"{r / b:.2f}x" if b else "-"
        row = (f"| {Path(c['trace']).stem} | {c['policy']} | {c['batch_size']} | {c['requests']} | "
               f"{r:.1f} | {c['predicted']['tok_per_s']:.1f} | {signed_error(c['predicted']['tok_per_s'], r)} | "
               f"{c['synthetic']['tok_per_s']:.1f} | {signed_error(c['synthetic']['tok_per_s'], r)} | "
               f"{c['real']['steps']}/{c['predicted']['steps']} | {per_engine_step(c['real']):.2f} | "
               f"{c['real']['mean_latency_s']:.2f} / {c['predicted']['mean_latency_s']:.2f} | "
               f"{100 * c['step_error_median']:.1f}% | {sp} |")
        if ver:
            v = c["verdict"]
            band = "-" if v["band"] is None else f"{100 * v['band']:.1f}%"
            cpu = c["real"].get("cpu_tok_per_s")
            row += (f" {v['repeats']} ({v['real_min']:.1f}-{v['real_max']:.1f}) | {band} | "
                    f"{v['verdict']}{' (load)' if c.get('loaded') else ''} | {'-' if cpu is None else f'{cpu:.1f}'} |")
        if dc:
            d = c.get("drift")
            row += (f" {1 / d['speed_vs_profile']:.3f}x | {100 * d['error']:+.1f}% |" if d else " - | - |")
        if anch:
            an = c.get("anchor")
            row += (f" {an['speed']:.3f} | {c['real']['tok_per_s']:.1f} | {100 * an['error_wall']:+.1f}% |" if an
                    else " - | - | - |")
        lines.append(row)
    lines += ["", ENGINE_STEP_NOTE, "cpu-clock tok/s: output tokens per second of the engine process's own CPU time "
              "divided by its threads, beside the wall clock: it moves less with other processes' load, but the "
              "verdicts use the wall clock, which is what the profiled table and the simulator predict.",
              "Each predicted cell is reproduced by the `sim_command` recorded for it in "
              "fidelity.json; every repeat's load record (others' cores, steal, load averages, clock) is there too.", ""]
    if dc:
        lines += [f"Drift-corrected (diagnostic, not used by the verdicts): after each real run the same fixed forwards "
                  f"as after the profile are timed on the run's model instance (real/validation/profile.py `speed_probe`); "
                  f"'machine speed vs profile' is the profile's probe time over the runs' (median; < 1: the machine "
                  f"ran slower than while profiling) and the drift-corrected error divides the prediction by that "
                  f"slowdown. Over {dc['cells']} cells: median |error| {100 * dc['median_error']:.1f}%, max "
                  f"{100 * dc['max_error']:.1f}%.", ""]
    if anch:
        lines += [ANCHOR_TEXT, ""]
    probes = meta.get("speed_probes") or {}
    if probes:  # diagnostic: the same fixed forwards on each trace's model instance against the profile's
        lines += ["Speed probe (real/validation/profile.py `speed_probe`; diagnostic, not used by the predictions): "
                  + "; ".join(f"{Path(t).stem}: {p['note']}" for t, p in probes.items()) + ".", ""]
    return "\n".join(lines)


def judged_real(cell: dict) -> float:
    """A cell's one real throughput: its verdict's (at the profile's speed when re-anchored), else the median
    repeat's wall clock (a cell without a verdict)."""
    return float(cell["verdict"]["real"]) if cell.get("verdict") else float(cell["real"]["tok_per_s"])


def signed_error(predicted: float, real: float) -> str:
    """predicted / real - 1 in percent, signed (+: the simulator predicts faster than it ran)."""
    return f"{100 * (predicted / real - 1.0):+.1f}%" if real else "-"


def summary_line(ver: dict) -> str:
    """RunSummary.line() of a summary read back from fidelity.json."""
    from real.validation.fidelity_stats import RunSummary

    nan = float("nan")
    return RunSummary(**{k: (nan if v is None else v) for k, v in ver.items()}).line()


ENGINE_STEP_NOTE = ("tok/engine step: output tokens per engine step that decodes, across the whole batch (not the "
                    "per-request tokens per step, `tok/step`, that `python -m sim.run` prints). step-time error: the "
                    "median over the median repeat's steps of |predicted - real| / real, its real step times brought "
                    "to the profile's speed (ms / q) in a re-anchored cell (fidelity.json keeps the wall clock's as "
                    "step_error_median_wall).")


def per_engine_step(real: dict) -> float:
    """The engine-wide tokens per step of a cell (fidelity.json written before the key was renamed: tokens_per_step)."""
    return real.get("tokens_per_engine_step", real.get("tokens_per_step", float("nan")))


def format_html(cells: list[dict], agg: dict, meta: dict, plotly: str = "inline") -> str:
    """The page (sim/infra/html_page.py: plotly.js inlined, or shared beside it; renders offline), its heading
    the figure's title."""
    from sim.infra.html_page import page

    return page("hybridspec fidelity", figure_parts(cells, agg, "fidelity"), plotly)  # fixed id: byte-identical reruns


def figure_parts(cells: list[dict], agg: dict, div_id: str, level: int = 1) -> list[str]:
    """The throughput figure of a run's cells (real, predicted, synthetic; the repeats' range) and its heading."""
    import plotly.graph_objects as go

    from sim.infra.html_page import figure_div, heading
    from sim.infra.plot_style import series_color, style

    fig = go.Figure()
    lab = [f"{Path(c['trace']).stem} {c['policy']} bs{c['batch_size']}" for c in cells]
    for name, key in (("real", "real"), ("predicted (replayed drafts)", "predicted"),
                      ("predicted (synthetic drafter)", "synthetic")):
        # a re-anchored run's real side is the verdict's: the repeats at the profile's speed (x' = x q)
        ys = [c["verdict"]["real"] if key == "real" and c.get("anchor") else c[key]["tok_per_s"] for c in cells]
        err = None
        if key == "real" and cells and all("verdict" in c for c in cells):  # the repeats' range around the median
            err = dict(type="data", symmetric=False, array=[c["verdict"]["real_max"] - y for c, y in zip(cells, ys)],
                       arrayminus=[y - c["verdict"]["real_min"] for c, y in zip(cells, ys)])
        fig.add_bar(name=name, x=lab, y=ys, marker_color=series_color(name), error_y=err)
    title = f"Real vs simulated output throughput (median error {100 * agg['median_error']:.1f}%)"
    style(fig, barmode="group", title=title, yaxis_title="output tokens / s")
    return [heading(level, title), figure_div(fig, div_id)]


MIN_REACHED = 20  # a depth's observed acceptance counts as a measurement from this many chosen n-gram chains on


def ngram_depths(cells: list[dict]) -> list[dict]:
    """The plugin's chosen n-gram chains pooled over the cells, per depth d (1-based): chains that reached d,
    how many of them the engine accepted there, the observed acceptance (accepted / reached) and the calibrated
    confidence the plugin published for them (mean over the same chains); `measured` when reached >= MIN_REACHED."""
    reached, accepted, conf = {}, {}, {}
    for c in cells:
        pl = c["real"].get("plugin") or {}
        if pl.get("ngram_accepted") is None:
            continue
        for d, (r, a, p) in enumerate(zip(pl["ngram_reached"], pl["ngram_accepted"], pl["ngram_predicted"])):
            reached[d] = reached.get(d, 0) + r
            accepted[d] = accepted.get(d, 0) + a
            conf[d] = conf.get(d, 0.0) + (p or 0.0) * r
    return [{"depth": d + 1, "reached": reached[d], "accepted": accepted[d],
             "observed": accepted[d] / reached[d] if reached[d] else None,
             "predicted": conf[d] / reached[d] if reached[d] else None, "measured": reached[d] >= MIN_REACHED}
            for d in sorted(reached)]


def depth_section(depths: list[dict]) -> list[str]:
    """The markdown section of the plugin's n-gram chains per depth ([] without any)."""
    if not depths:
        return []
    meas = [x for x in depths if x["measured"]]
    gap = float(np.mean([abs(x["observed"] - x["predicted"]) for x in meas])) if meas else None
    L = ["## The plugin's n-gram chains per depth", "",
         f"Pooled over the hybrid cells (the plugin's counters): chains chosen that reached each depth, how many the "
         f"engine accepted there, and the calibrated confidence published for them. A depth reached at least "
         f"{MIN_REACHED} times counts as a measurement: {len(meas)} of {len(depths)} depths; mean |observed - "
         f"calibrated| over them: {'-' if gap is None else f'{gap:.3f}'}.", "",
         "| depth | reached | accepted | observed | calibrated | measured |", "|---:|---:|---:|---:|---:|---|"]
    for x in depths:
        o = "-" if x["observed"] is None else f"{x['observed']:.2f}"
        q = "-" if x["predicted"] is None else f"{x['predicted']:.2f}"
        L.append(f"| {x['depth']} | {x['reached']:.0f} | {x['accepted']:.0f} | {o} | {q} | "
                 f"{'yes' if x['measured'] else 'no'} |")
    return L + [""]
