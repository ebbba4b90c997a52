"""Re-assemble a recorded validation run's verdicts re-anchored to the machine's speed, offline: no model runs.

    python -m real.fidelity_anchor DIR [--json]

DIR is a `real/validate.py --out` directory of the torch engine with speed probes: the profile's
(cost_table.json.load.json) and one after every repeat (cells/<cell>/real.rR.json). Each repeat's throughput is
re-anchored to the profile's reference speed as real/validation/validate.py does now (real/validation/fidelity_stats.py, re-anchoring):
x'_r = x_r q_r, q_r the geometric mean of the probes before and after the repeat against the reference. A
recording made before the probe before each repeat was stored takes the probe after the repeat measured just
before it in the run's order instead (the ABBA order over the trace's cells, real/fidelity_stats.abba_order; the
first repeat of a trace: the trace's probe before its cells, fidelity.json meta.speed_probes), which is the same
probe the live run now uses. A table profiled before probes were interleaved has one probe, after the profile, as
its reference; its uncertainty u_a then enters the band (trace_anchor). Nothing is re-timed and the predictions
are the recorded ones (cells/<cell>/predicted.json); it prints every cell's recorded and re-anchored error and
verdict, and both summaries.
"""
from __future__ import annotations

import json
import math
import statistics
import types
from pathlib import Path

from real.validation.fidelity_stats import CellVerdict, abba_order, pooled_scatter, summarize
from sim.infra.cli import ArgumentParser
from sim.infra.errors import ConfigError


def read_json(path: Path) -> dict:
    """A recorded run's JSON object, through the input layer (sim/infra/inputs.py: a regular file, capped, strict
    JSON but for the NaN the writer uses for "no data"); ConfigError naming the file otherwise."""
    from sim.infra.inputs import RECORD, Dict, Any, read_json as read_input

    return read_input(path, RECORD, Dict(Any()), finite=False)


def reanchor(run_dir: Path) -> dict:
    """Every cell re-assembled with re-anchoring (module docstring): {"cells": [...], "recorded": summary,
    "reanchored": summary, "anchors": per trace}."""
    from real.validation.profile import profile_load, profile_uncertainty_of
    from real.validation.pipeline.cells import cell_id
    from real.validation.validate import assemble_cell, repeat_speeds, trace_anchor

    from real.validation.report import read_fidelity

    fid = read_fidelity(run_dir)
    meta, margin = fid["meta"], float(fid["meta"].get("margin", 0.03))
    table = run_dir / "cost_table.json"
    prof = profile_load(table)
    if not (prof or {}).get("speed_probe"):
        raise ConfigError(f"{table}.load.json: no profile speed probe recorded; nothing to re-anchor to")
    pred_unc = profile_uncertainty_of(table)
    table_loaded = bool(prof.get("loaded"))
    by_trace: dict[str, list[dict]] = {}
    for c in fid["cells"]:
        by_trace.setdefault(c["trace"], []).append(c)
    rows, recorded, new, anchors = [], [], [], {}
    for trace, cells in by_trace.items():
        t_dir = run_dir / Path(trace).stem
        keys = [(c["policy"], int(c["batch_size"])) for c in cells]  # measure_trace's order: bs outer, policy inner
        n_rep = len(cells[0]["repeats"])
        reps = {k: [read_json(t_dir / "cells" / cell_id(trace, *k) / f"real.r{r}.json") for r in range(n_rep)]
                for k in keys}
        last = ((meta.get("speed_probes") or {}).get(trace) or {}).get("before")
        for k, r in abba_order(keys, n_rep):  # the probe before each repeat: the one after the repeat before it
            x = reps[k][r]
            x.setdefault("speed_probe_before", last)
            last = x.get("speed_probe")
        anchor = trace_anchor(prof, [(x["speed_probe_before"], x["speed_probe"]) for k in keys for x in reps[k]
                                     if x.get("speed_probe_before") and x.get("speed_probe")],
                              profile_uncertainty_of(table, one_run=True))
        anchors[trace] = None if anchor is None else {k: v for k, v in anchor.items() if k != "probe"}
        pooled = pooled_scatter([[x["tok_per_s"] * q for x, q in zip(reps[k], repeat_speeds(reps[k], anchor)
                                                                   or [1.0] * n_rep)] for k in keys
                                 if not any(x["load"]["loaded"] for x in reps[k])])
        for c, k in zip(cells, keys):
            pred = read_json(t_dir / "cells" / cell_id(trace, *k) / "predicted.json")
            n_tok, n_req = int(c["output_tokens"]), int(c["requests"])
            wl = types.SimpleNamespace(trace=trace, requests=[types.SimpleNamespace(output_len=n_tok)] +
                                       [types.SimpleNamespace(output_len=0)] * (n_req - 1))
            got = assemble_cell(wl, k[0], k[1], reps[k], pred, margin, table_loaded, prof["speed_probe"], pred_unc,
                                pooled, anchor)
            v_old, v_new = CellVerdict.from_json(c["verdict"]), CellVerdict.from_json(got["verdict"])
            recorded.append(v_old)
            new.append(v_new)
            rows.append({"cell": cell_id(trace, *k), "error_recorded": v_old.error, "verdict_recorded": v_old.verdict,
                         "speed": v_new.speed, "error": v_new.error, "band": v_new.band, "verdict": v_new.verdict,
                         "drifted": v_new.drifted, "anchored": v_new.anchored})
    return {"cells": rows, "recorded": summarize(recorded).to_json(), "reanchored": summarize(new).to_json(),
            "anchors": anchors, "pred_sd": pred_unc[0], "pred_df": pred_unc[1],
            "errors": {k: _err_summary([r[e] for r in rows]) for k, e in (("recorded", "error_recorded"),
                                                                          ("reanchored", "error"))}}


def _err_summary(errs: list[float]) -> dict:
    a = [abs(e) for e in errs]
    return {"median_abs": statistics.median(a), "max_abs": max(a), "mean": sum(errs) / len(errs)}


def format_report(res: dict) -> str:
    from real.validation.fidelity import summary_line

    lines = [f"{'cell':34s} {'recorded':>9s} {'verdict':>12s} {'speed q':>8s} {'re-anchored':>11s} {'band':>6s} "
             f"{'verdict':>12s}"]
    for r in res["cells"]:
        band = "-" if r["band"] is None or not math.isfinite(r["band"]) else f"{100 * r['band']:.1f}%"
        lines.append(f"{r['cell']:34s} {100 * r['error_recorded']:+8.1f}% {r['verdict_recorded']:>12s} "
                     f"{r['speed']:8.3f} {100 * r['error']:+10.1f}% {band:>6s} {r['verdict']:>12s}"
                     f"{' (drift)' if r['drifted'] else ''}")
    for t, a in res["anchors"].items():
        lines.append(f"{t}: " + ("no reference probe" if a is None else
                                 f"reference u_a {100 * a['sd']:.2f}% ({a['dof']:.0f} dof), table fitted at the reference: "
                                 f"{a['table_anchored']}"))
    lines.append(f"prediction's own uncertainty (profile repeats): u_p {100 * res['pred_sd']:.2f}% ({res['pred_df']} dof)")
    for k in ("recorded", "reanchored"):
        e = res["errors"][k]
        lines.append(f"{k:10s}: all cells median |error| {100 * e['median_abs']:.1f}%, max {100 * e['max_abs']:.1f}%, "
                     f"mean {100 * e['mean']:+.1f}%; {summary_line(res[k])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m real.fidelity_anchor", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="a real/validate.py --out directory (torch engine) with speed probes")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    a = ap.parse_args(argv)
    d = Path(a.run_dir)
    if not d.is_dir():
        raise ConfigError(f"{d}: not a directory")
    res = reanchor(d)
    print(json.dumps(res) if a.json else format_report(res))
    return 0
