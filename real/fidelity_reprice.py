"""Re-price a recorded validation run with today's cost fits, offline: no model runs, no timing.

    python -m real.fidelity_reprice DIR [--legacy-pass-policies adaptive,hybrid-price] [--table-out FILE]

DIR is a `real/validate.py --out` directory of the torch engine: fidelity.json, the table it profiled
(cost_table.json) and the steps that table was fitted on (cost_table.json.steps.csv, traces/general.jsonl), and
per cell the simulator's steps (cells/<cell>/steps_predicted.csv) and the real repeats' throughputs.

It refits the table from the recorded profile steps with real/profile.py's current fits (`fit_verify` with the
microbenchmarked logits_ms_per_row and kv_ms_per_token recorded in the table; `fit_step_parts`), then re-prices
every cell's predicted steps with it: a cell's decisions are the real engine's (the simulator replays the
recorded outputs and drafts, and its steps align one to one with the real ones), so the new prediction is
    time' = sum over steps of (step_ms - verify_ms - draft_ms + verify'(T, K, S, M) + draft'(R) [if draft ran])
and tok/s' = output tokens / time'. Only verify and draft are re-priced (the parts whose fits changed); the
other parts keep their recorded prices. The verdict is recomputed with real/fidelity_stats.judge on the
recorded repeats. What it does not show: the decisions a new table would lead the policies to take (a rerun of
real/validate.py does that).

Recordings made before the engine recorded the `draft_pass` step column cannot say which profile steps ran the
model pass; --legacy-pass-policies names the policies that ran it on every decoding step (default adaptive and
hybrid-price: `hybrid` is the one that skips it); a legacy recording with none of them keeps the old rule (every
step with draft time). Say so when quoting figures from such a recording.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

from real.fidelity_stats import judge
from sim.cli_util import ArgumentParser, run_cli
from sim.errors import ConfigError

LEGACY_PASS_POLICIES = ("adaptive", "hybrid-price")


def profile_steps(path: Path, legacy_pass: tuple[str, ...]) -> list[dict]:
    """The recorded profile steps, one dict of column arrays per policy (real/profile.py's `steps` form)."""
    import pandas as pd

    df = pd.read_csv(path)
    # a legacy recording: the policies that always run the pass stand for it; when it holds none of them, every
    # step with draft time counts (the old rule, which mixes in the upkeep-only steps)
    infer = "draft_pass" not in df.columns and bool(set(df["policy"]) & set(legacy_pass))
    out = []
    for pol, g in df.groupby("policy", sort=True):
        d = {c: g[c].to_numpy() for c in g.columns if c != "policy"}
        d["policy"] = str(pol)
        if infer:
            d["draft_pass"] = ((g["num_decode"].to_numpy() > 0) & (str(pol) in legacy_pass)).astype(np.int64)
        out.append(d)
    return out


def refit_table(run_dir: Path, legacy_pass: tuple[str, ...] = LEGACY_PASS_POLICIES):
    """The table real/profile.py would fit today from run_dir's recorded profile steps (CostTable)."""
    from real.profile import build_table, fit_step_parts, fit_verify
    from sim.cost.profiled import load_cost_table

    old = load_cost_table(run_dir / "cost_table.json")
    steps = profile_steps(run_dir / "cost_table.json.steps.csv", legacy_pass)
    parts = fit_step_parts(steps, [s["policy"] for s in steps])
    verify = fit_verify(steps, float(old.logits_ms_per_row or 0.0), float(old.kv_ms_per_token or 0.0))
    return build_table(old.llm, verify, parts, dict(old.machine), int(old.kv_capacity_tokens or 10**9),
                       int(old.vocab_size or 0), old.source + "; refitted offline by real/fidelity_reprice.py")


def reprice_cell(cell: dict, pred_steps, cost) -> float:
    """The cell's predicted time [s] with `cost` pricing verify and draft (module docstring)."""
    st = pred_steps
    T, K, S, M = (st[c].to_numpy() for c in ("tokens", "kv_tokens", "num_seqs", "logit_rows"))
    verify = np.array([float(cost.verify_ms(int(t), int(k), int(s), logit_rows=int(m))) if t > 0 else 0.0
                       for t, k, s, m in zip(T, K, S, M)])
    ran = st["draft_ms"].to_numpy() > 0
    draft = np.array([cost.draft_ms(int(r), cost.table.draft_block) if d else 0.0
                      for r, d in zip(st["num_decode"].to_numpy(), ran)])
    ms = st["step_ms"].to_numpy() - st["verify_ms"].to_numpy() - st["draft_ms"].to_numpy() + verify + draft
    return float(ms.sum()) / 1000.0


def reprice(run_dir: Path, legacy_pass: tuple[str, ...] = LEGACY_PASS_POLICIES, table_out: Path | None = None) -> dict:
    """Every cell's recorded and re-priced prediction, error and verdict, and the summary of each."""
    import pandas as pd

    from sim.cost.profiled import ProfiledCost, write_cost_table

    fj = run_dir / "fidelity.json"
    for p in (fj, run_dir / "cost_table.json", run_dir / "cost_table.json.steps.csv"):
        if not p.is_file():
            raise ConfigError(f"{p}: not found; give a real/validate.py --out directory whose table it profiled")
    fid = json.loads(fj.read_text())
    table = refit_table(run_dir, legacy_pass)
    if table_out is not None:
        write_cost_table(table, table_out)
    cost = ProfiledCost(table, fallback=None)
    margin = float(fid["meta"].get("margin", 0.03))
    from real.profile import profile_uncertainty_of

    u_p, dof = profile_uncertainty_of(run_dir / "cost_table.json")  # the band as real/validate.py forms it today
    rows = []
    for c in fid["cells"]:
        trace = Path(c["trace"]).stem
        cid = f"{trace}__{c['policy'].replace(':', '-')}__bs{c['batch_size']}"
        f = run_dir / trace / "cells" / cid / "steps_predicted.csv"
        if not f.is_file():
            raise ConfigError(f"{f}: not found (cell {cid} of {fj})")
        t_new = reprice_cell(c, pd.read_csv(f), cost)
        tps = [r["tok_per_s"] for r in c["repeats"]]
        new = c["output_tokens"] / t_new
        v_old, v_new = c["verdict"], judge(tps, new, margin, bool(c.get("loaded")), pred_sd=u_p,
                                           pred_df=dof if dof else math.inf)
        v_rule = judge(tps, v_old["predicted"], margin, bool(c.get("loaded")), pred_sd=u_p,
                       pred_df=dof if dof else math.inf)  # the recorded prediction under today's verdict rule
        rows.append({"cell": cid, "real": v_new.real, "band": v_new.band, "predicted_recorded": v_old["predicted"],
                     "error_recorded": v_old["error"], "verdict_recorded": v_old["verdict"],
                     "verdict_recorded_today": v_rule.verdict, "predicted": new,
                     "error": v_new.error, "verdict": v_new.verdict})

    def summary(key: str, vkey: str) -> dict:
        e = [abs(r[key]) for r in rows]
        counts = {k: sum(r[vkey] == k for r in rows) for k in ("agrees", "disagrees", "inconclusive")}
        return {"median_abs_error": statistics.median(e), "max_abs_error": max(e),
                "positive": sum(r[key] > 0 for r in rows), "cells": len(rows), **counts}

    return {"table": table.to_json(), "cells": rows, "recorded": summary("error_recorded", "verdict_recorded"),
            "recorded_today": summary("error_recorded", "verdict_recorded_today"),
            "repriced": summary("error", "verdict"), "pred_sd": u_p, "pred_df": dof}


def format_report(res: dict) -> str:
    t = res["table"]
    lines = [f"refitted: attn_ms_per_row_kv {t.get('attn_ms_per_row_kv', 0.0):.3g}  seq_ms {t.get('seq_ms', 0.0):.3g}  "
             f"kv_ms_per_token {t.get('kv_ms_per_token', 0.0):.3g}  draft ms by requests "
             f"{[round(x, 2) for x in t['draft']['ms'][:4]]}",
             f"{'cell':34s} {'real':>7s} {'band':>6s} {'recorded':>9s} {'error':>7s} {'verdict':>12s} "
             f"{'today':>12s} {'repriced':>9s} {'error':>7s} {'verdict':>12s}"]
    for r in res["cells"]:
        lines.append(f"{r['cell']:34s} {r['real']:7.2f} {100 * r['band']:5.1f}% {r['predicted_recorded']:9.2f} "
                     f"{100 * r['error_recorded']:+6.1f}% {r['verdict_recorded']:>12s} {r['verdict_recorded_today']:>12s} "
                     f"{r['predicted']:9.2f} "
                     f"{100 * r['error']:+6.1f}% {r['verdict']:>12s}")
    lines.append(f"prediction's own uncertainty (profile repeats): u_p {100 * res['pred_sd']:.2f}% "
                 f"({res['pred_df']} dof)")
    for k in ("recorded", "recorded_today", "repriced"):
        s = res[k]
        lines.append(f"{k:14s}: median |error| {100 * s['median_abs_error']:.2f}%, max {100 * s['max_abs_error']:.2f}%, "
                     f"{s['positive']} of {s['cells']} positive (simulator fast); {s['agrees']} agree, "
                     f"{s['disagrees']} disagree, {s['inconclusive']} inconclusive")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m real.fidelity_reprice", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="a real/validate.py --out directory (torch engine) whose table it profiled")
    ap.add_argument("--legacy-pass-policies", default=",".join(LEGACY_PASS_POLICIES),
                    help="for recordings without the draft_pass column: the policies that ran the model pass on "
                         "every decoding step (default adaptive,hybrid-price)")
    ap.add_argument("--table-out", default=None, help="also write the refitted table here (JSON; never overwrites)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    a = ap.parse_args(argv)
    d = Path(a.run_dir)
    if not d.is_dir():
        raise ConfigError(f"{d}: not a directory")
    res = reprice(d, tuple(p for p in a.legacy_pass_policies.split(",") if p),
                  Path(a.table_out) if a.table_out else None)
    print(json.dumps(res) if a.json else format_report(res))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
