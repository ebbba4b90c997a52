"""What a fidelity run writes and how it names the simulator's side: the pieces every real engine's validation
flow shares (real/validation/validate.py for the torch engine, real/validation/vllm/flow.py and real/validation/vllm_cpu/validate.py for
vLLM): a simulated run's summary, the `python -m sim.run` command that reproduces a prediction, prepared draft
tables reused across cells, and fidelity.json / .md / .html with the verdicts of real/validation/fidelity_stats.py."""
from __future__ import annotations

import dataclasses
import functools
import json
import shlex
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


def run_summary(res, n_tokens: int) -> dict:
    st = res.steps
    t = float(res.sim_time_s)
    lat = res.requests["finish_s"] - res.requests["arrival_s"]
    return {"time_s": t, "tok_per_s": n_tokens / t if t > 0 else float("nan"), "steps": int(len(st["step_ms"])),
            # engine-wide: all output tokens over the steps that decode (sim.api.run's tok/step is per request per step)
            "tokens_per_engine_step": n_tokens / max(1, int((st["num_decode"] > 0).sum())),
            "mean_latency_s": float(np.nanmean(lat)), "lossless": bool(res.lossless), "violation": res.violation,
            "step_ms": [float(x) for x in st["step_ms"]]}


def sim_command(setup, policy: str, bs: int) -> str:
    """The `python -m sim.run` command that computes run_one(prepare(setup), policy, bs): the trace, model,
    cost and gpu, then every other SimSetup field that differs from its default (flags named after the fields)."""
    from sim.api.run import SimSetup

    default = SimSetup()
    argv = ["python", "-m", "sim.run"]
    for f in dataclasses.fields(SimSetup):
        v = getattr(setup, f.name)
        if v is None or (v == getattr(default, f.name) and f.name not in ("trace", "model", "cost", "gpu")):
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(v, bool):
            argv.append(flag if v else "--no-" + flag[2:])
        else:
            argv += [flag, str(v)]
    return shlex.join(argv + ["--policy", policy, "--batch-size", str(bs)])


@functools.lru_cache(maxsize=16)
def _prepared_key(key: tuple):
    from sim.api.run import SimSetup, prepare

    return prepare(SimSetup(*key))


def clear_prepared() -> None:
    """Forget every prepared setup: a validation rewrites its references, so none may be served from an earlier
    call in the same process."""
    _prepared_key.cache_clear()


def prepared_setup(setup):
    """sim.api.run's prepare(setup) (a trace's draft tables), built once per distinct setup and reused by its cells."""
    return _prepared_key(dataclasses.astuple(setup))


def write_reports(out: Path, cells: list[dict], meta: dict, md=None, plotly: str = "inline") -> dict:
    """fidelity.json / .md / .html from the cells; returns the aggregate. md: the markdown formatter
    (default format_md, the torch engine's); plotly: the page's plotly.js inlined, or "shared" beside it
    (sim/infra/html_page.py; real/validate.py's --plotly)."""
    from sim.infra.html_page import write_page

    agg = aggregate(cells)
    slim = [{k: ({kk: vv for kk, vv in v.items() if kk != "step_ms"} if isinstance(v, dict) else v)
             for k, v in c.items()} for c in cells]
    write_output(out / "fidelity.json", json.dumps({"meta": meta, "aggregate": agg, "cells": slim}, indent=1) + "\n")
    write_output(out / "fidelity.md", (md or format_md)(slim, agg, meta))
    write_page(out / "fidelity.html", format_html(slim, agg, meta, plotly), overwrite=True)
    return agg


def aggregate(cells: list[dict]) -> dict:
    """A run's summary over its cells (fidelity.json's "aggregate"): median and max |throughput error|, the
    synthetic drafter's and the steps' median errors, losslessness, the verdicts' counts and conclusive errors
    (real/fidelity_stats.summarize) when every cell was repeated, and the drift-corrected errors when recorded."""
    errs = np.asarray([c["predicted_error"] for c in cells])
    serrs = np.asarray([c["step_error_median"] for c in cells], dtype=np.float64)
    agg = {"cells": len(cells), "median_error": float(np.median(errs)) if len(errs) else float("nan"),
           "max_error": float(errs.max()) if len(errs) else float("nan"),
           "median_synthetic_error": float(np.median([c["synthetic_error"] for c in cells])) if cells else float("nan"),
           "median_step_error": float(np.nanmedian(serrs)) if np.isfinite(serrs).any() else float("nan"),
           "all_lossless": all(c["real"]["lossless"] and c["real"]["outputs_equal_reference"] for c in cells)}
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
    lines += ["Real: the real engine's output tokens per second of engine time (wall clock; the median of the repeats). "
              "Predicted: the simulator on the recorded outputs and drafts with this machine's profiled costs "
              "(`real/validation/profile.py`). Synthetic: the simulator drawing its synthetic drafter afresh instead of replaying "
              "the drafts. " + meta.get("drafter_note", ""), ""]
    ver = agg.get("verdicts")
    if ver:
        lines += [f"**{summary_line(ver)}.** Every real run lossless (outputs equal plain greedy decoding): "
                  f"{'yes' if agg['all_lossless'] else 'NO'}.", "", VERDICT_TEXT, ""]
    lines += [f"Median throughput error over all cells {100 * agg['median_error']:.1f}%, max "
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
        head += " machine speed q | real at the profile's speed tok/s | wall-clock error |"
        rule += "---:|---:|---:|"
    lines += [head, rule]
    base = {(c["trace"], c["batch_size"]): c["real"]["tok_per_s"] for c in cells if c["policy"] == "none"}
    for c in cells:
        b = base.get((c["trace"], c["batch_size"]))
        sp = f"{c['real']['tok_per_s'] / b:.2f}x" if b else "-"
        row = (f"| {Path(c['trace']).stem} | {c['policy']} | {c['batch_size']} | {c['requests']} | "
               f"{c['real']['tok_per_s']:.1f} | {c['predicted']['tok_per_s']:.1f} | {100 * c['predicted_error']:.1f}% | "
               f"{c['synthetic']['tok_per_s']:.1f} | {100 * c['synthetic_error']:.1f}% | "
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
            row += (f" {an['speed']:.3f} | {an['real_at_reference']:.1f} | {100 * an['error_wall']:+.1f}% |" if an
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
