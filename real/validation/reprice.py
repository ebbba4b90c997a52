"""Re-price a recorded validation run with today's cost fits, offline: no model runs, no timing.

    python -m real.fidelity_reprice DIR [--cost-table T.json] [--profile-max-seqs N] [--table-out FILE]
                                        [--legacy-pass-policies adaptive,hybrid-price]
                                        [--profile-reference REF.jsonl --profile-drafts DRAFTS.jsonl]

DIR is a `real/validate.py --out` directory of the torch engine: fidelity.json, the table it profiled
(cost_table.json, or the --cost-table the run was given) and the steps that table was fitted on (its .steps.csv,
traces/general.jsonl), and
per cell the simulator's steps (cells/<cell>/steps_predicted.csv) and the real repeats' throughputs.

It refits the table from the recorded profile steps with real/validation/profile.py's current fits (`fit_verify` with the
microbenchmarked logits_ms_per_row and kv_ms_per_token recorded in the table; `fit_step_parts`), then re-prices
every cell's predicted steps with it: a cell's decisions are the real engine's (the simulator replays the
recorded outputs and drafts, and its steps align one to one with the real ones), so the new prediction is
    time' = sum over steps of (step_ms - verify_ms - draft_ms + verify'(T, K, S, M) + draft'(R) [if draft ran])
and tok/s' = output tokens / time'. Only verify and draft are re-priced (the parts whose fits changed); the
other parts keep their recorded prices. The verdict is recomputed with real/fidelity_stats.judge on the
recorded repeats. What it does not show: the decisions a new table would lead the policies to take (a rerun of
real/validation/validate.py does that).

The padded verify form (sim/core/cost/padded.py) needs each step's padded attention shape (kv_gather, kv_view,
attn_rows_kv). Recordings made since the engine records it carry it in the profile steps; the cells' shapes come
from the simulator, re-run on the recorded reference and drafts with the recorded table (its decisions do not
depend on the charge, so its steps are the recorded ones; checked step by step). For an older recording the
profile's shapes are rebuilt the same way: --profile-reference / --profile-drafts name the reference and drafts of
the profile's slice of traces/general.jsonl (real/validation/validate.py's reference.jsonl / drafts.jsonl format; built by
`python -m real.fidelity_reprice --build-profile-reference DIR`), and every recorded profile run is re-simulated
with the provisional cost its decisions used (real.validation.workload.provisional_cost). Without them an old recording is
re-priced with the aggregate form.

Recordings made before the engine recorded the `draft_pass` step column cannot say which profile steps ran the
model pass; --legacy-pass-policies names the policies that ran it on every decoding step (default adaptive and
hybrid-price: `hybrid` is the one that skips it); a legacy recording with none of them keeps the old rule (every
step with draft time). Say so when quoting figures from such a recording.
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np

from real.validation.fidelity_stats import judge, pooled_scatter
from real.validation.pipeline.cells import cell_id
from sim.infra.cli import ArgumentParser, check_out_file, check_out_files, write_files
from sim.infra.fsio import temp_dir
from sim.infra.errors import ConfigError
from sim.core.config import MAX_BATCH_SIZE
from sim.core.cost.profiled import MAX_COUNT
from sim.infra.inputs import Bool, Int, List, Num, Obj, Opt, Str

# the fields of a run's fidelity.json that re-pricing reads (the report's full schema: real/validation/report.py)
_RATE = Num(lo=0)  # tokens / s
REPRICE_SCHEMA = Obj({
    "meta": Obj({"margin": Opt(Num(lo=0, strict_lo=True)), "model": Opt(Str())}),  # validate: any > 0
    "cells": List(Obj({"trace": Str(), "policy": Str(), "batch_size": Int(1, MAX_BATCH_SIZE), "output_tokens": Int(0, MAX_COUNT),
                       "loaded": Opt(Bool()), "repeats": Opt(List(Obj({"tok_per_s": _RATE}))),
                       "verdict": Opt(Obj({"predicted": _RATE}))}), lo=1)},
    expected="a real/validate.py fidelity.json (an object of meta and cells)")

LEGACY_PASS_POLICIES = ("adaptive", "hybrid-price")
# the columns a table of recorded steps must carry to be refitted (profile steps) or re-priced (a cell's steps)
PROFILE_COLUMNS = ("policy", "num_decode")  # what splitting the recorded steps into runs reads
FIT_COLUMNS = ("draft_ms", "ngram_ms", "alloc_ms", "verify_ms", "sample_ms", "cpu_ms", "kv_tokens", "tokens",
               "logit_rows", "num_seqs")  # and what the refit reads (real/validation/profile.py fit_step_parts, fit_verify)
CELL_COLUMNS = ("tokens", "kv_tokens", "num_seqs", "logit_rows", "draft_ms", "num_decode", "step_ms", "verify_ms")


def read_steps(path: Path, columns: tuple[str, ...]):
    """A recorded table of steps (CSV) through the input layer (sim/infra/inputs.py: a regular file within the
    table cap), with `columns` present and every column but `policy` a finite number >= 0; ConfigError naming
    the file, the row and the column otherwise."""
    import io

    import pandas as pd

    from sim.infra.inputs import TABLE, read_bytes

    data = read_bytes(path, TABLE)
    try:
        df = pd.read_csv(io.BytesIO(data))
    except (ValueError, pd.errors.ParserError, UnicodeError) as exc:  # EmptyDataError is a ValueError
        raise ConfigError(f"{path}: not a CSV table of steps ({str(exc).splitlines()[0][:120]})") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ConfigError(f"{path}: column '{missing[0]}' is missing (a table of recorded steps has "
                          f"{', '.join(columns)})")
    if not len(df):
        raise ConfigError(f"{path}: no steps recorded")
    for c in df.columns:
        if c == "policy":
            continue
        v = pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=np.float64)
        bad = ~(np.isfinite(v) & (v >= 0))
        if bad.any():
            i = int(np.argmax(bad))
            raise ConfigError(f"{path}: row {i + 1}, column '{c}': expected a finite number >= 0, got "
                              f"{str(df[c].iloc[i])[:40]!r}")
    return df


def _runs(df) -> list:
    """The recorded profile runs of a steps table, in order (a run starts where t_start_ms returns to 0; a table
    without that column: one group per policy)."""
    if "t_start_ms" not in df.columns:
        return [g for _, g in df.groupby("policy", sort=True)]
    run = (df["t_start_ms"].to_numpy() == 0).cumsum()
    return [g for _, g in df.groupby(run, sort=True)]


def _padded_table(obj: dict, path: Path) -> Path:
    """A copy of a cost table's JSON object marked padded (the engine's short-query bound), written to path: the
    simulator then records each step's padded shape (its charge changes, its decisions do not)."""
    from real.engine.model import SHORT_QUERY_MAX

    path.write_text(json.dumps({**obj, "short_query_max": SHORT_QUERY_MAX,
                                "kv_view_ms_per_token": obj.get("kv_view_ms_per_token", 0.0)}))
    return path


def _sim_shapes(ref: Path, drafts: Path, table: Path, model: str, policy: str, bs: int, want) -> np.ndarray | None:
    """The simulator's padded shapes [steps, 3] of one run, or None when its steps are not `want`'s (tokens and
    sequences per step: the recorded run it should replay)."""
    from real.validation.validate import simulate
    from sim.core.cost.padded import SHAPE_COLUMNS

    st = simulate(ref, drafts, table, model, bs, policy, 0).steps
    if len(st["tokens"]) != len(want) or not (np.array_equal(st["tokens"], want["tokens"].to_numpy())
                                              and np.array_equal(st["num_seqs"], want["num_seqs"].to_numpy())):
        return None
    return np.stack([np.asarray(st[c]) for c in SHAPE_COLUMNS], axis=1)


def profile_steps(path: Path, legacy_pass: tuple[str, ...], rebuild: tuple[Path, Path] | None = None,
                  llm: str = "smollm2-135m", vocab: int = 0, batch_sizes: tuple[int, ...] = (1, 4, 16),
                  work: Path | None = None) -> list[dict]:
    """The recorded profile steps, one dict of column arrays per run (real/validation/profile.py's `steps` form). rebuild:
    (reference, drafts) of the profile's slice, to rebuild the padded shapes of a recording made before the engine
    recorded them (module docstring): each run is re-simulated with the provisional cost at each candidate
    batch size, and the one whose steps equal the run's gives its shapes; a run none matches is a ConfigError."""
    from sim.core.cost.padded import SHAPE_COLUMNS

    df = read_steps(path, PROFILE_COLUMNS)
    # a legacy recording: the policies that always run the pass stand for it; when it holds none of them, every
    # step with draft time counts (the old rule, which mixes in the upkeep-only steps)
    infer = "draft_pass" not in df.columns and bool(set(df["policy"]) & set(legacy_pass))
    shaped = set(SHAPE_COLUMNS) <= set(df.columns)
    table = None
    if rebuild is not None and not shaped:
        from real.validation.workload import provisional_table

        table = _padded_table(provisional_table(llm, vocab), (work or path.parent) / "provisional_padded.json")
    out = []
    for g in _runs(df):
        pol = str(g["policy"].iloc[0])
        d = {c: g[c].to_numpy() for c in g.columns if c != "policy"}
        d["policy"] = pol
        if infer:
            d["draft_pass"] = ((g["num_decode"].to_numpy() > 0) & (pol in legacy_pass)).astype(np.int64)
        if table is not None:
            cands = [int(g["batch_size"].iloc[0])] if "batch_size" in g else list(batch_sizes)
            for bs in cands:
                sh = _sim_shapes(rebuild[0], rebuild[1], table, llm, pol, bs, g)
                if sh is not None:
                    d.update({c: sh[:, i] for i, c in enumerate(SHAPE_COLUMNS)})
                    break
            else:
                raise ConfigError(f"{path}: the {pol} run at t_start_ms 0 (row {int(g.index[0])}) matches no "
                                  f"simulated run at batch {', '.join(map(str, cands))}: not this profile's reference")
        out.append(d)
    return out


def steps_up_to(steps: list[dict], max_seqs: int) -> list[dict]:
    """The recorded profile runs (profile_steps' form) keeping only their steps with at most max_seqs sequences;
    a run left with none is dropped."""
    out = []
    for s in steps:
        keep = np.asarray(s["num_seqs"]) <= max_seqs
        if keep.any():
            out.append({k: (v if k == "policy" else np.asarray(v)[keep]) for k, v in s.items()})
    return out


def refit_table(run_dir: Path, legacy_pass: tuple[str, ...] = LEGACY_PASS_POLICIES,
                rebuild: tuple[Path, Path] | None = None, table_path: Path | None = None,
                max_seqs: int | None = None):
    """The table real/validation/profile.py would fit today from the recorded profile steps of table_path (default run_dir's
    cost_table.json) (CostTable). max_seqs: fit only the steps with at most that many sequences, what a profile
    whose runs never verified more together would have priced (the extrapolation real.validation.profile.profile_slice
    avoids)."""
    import re

    from real.engine.model import SHORT_QUERY_MAX
    from real.validation.profile import build_table, fit_step_parts, fit_verify
    from sim.core.cost.profiled import load_cost_table

    table_path = table_path or run_dir / "cost_table.json"
    old = load_cost_table(table_path)
    m = re.search(r"at batch ([0-9, ]+) on", old.source)
    bss = tuple(int(x) for x in m.group(1).split(",")) if m else (1, 4, 16)
    with temp_dir("hybridspec-reprice-") as work:  # the rebuild's scratch, removed whatever ends it
        steps = profile_steps(Path(str(table_path) + ".steps.csv"), legacy_pass, rebuild, old.llm,
                              int(old.vocab_size or 0), bss, run_dir if rebuild is None else work)
    missing = [c for c in FIT_COLUMNS if steps and c not in steps[0]]
    if missing:
        raise ConfigError(f"{table_path}.steps.csv: column '{missing[0]}' is missing (a table of recorded steps has "
                          f"{', '.join(PROFILE_COLUMNS + FIT_COLUMNS)})")
    if max_seqs is not None:
        steps = steps_up_to(steps, max_seqs)
    pols = sorted({s["policy"] for s in steps})
    parts = fit_step_parts(steps, pols)
    verify = fit_verify(steps, float(old.logits_ms_per_row or 0.0), float(old.kv_ms_per_token or 0.0), SHORT_QUERY_MAX)
    return build_table(old.llm, verify, parts, dict(old.machine), int(old.kv_capacity_tokens or 10**9),
                       int(old.vocab_size or 0), old.source + "; refitted offline by real/validation/reprice.py",
                       gpu=old.gpu)


def _cell_name(c: dict) -> str:
    """A cell's directory name under its trace's cells/ (real/validation/pipeline/cells.py cell_id)."""
    return cell_id(c["trace"], c["policy"], c["batch_size"])


def reprice_cell(cell: dict, pred_steps, cost, shapes: np.ndarray | None = None) -> float:
    """The cell's predicted time [s] with `cost` pricing verify and draft (module docstring); shapes [steps, 3]:
    the steps' padded attention shapes, for a padded cost."""
    st = pred_steps
    T, K, S, M = (st[c].to_numpy() for c in ("tokens", "kv_tokens", "num_seqs", "logit_rows"))
    if shapes is not None and getattr(cost, "padded", False):
        verify = np.array([float(cost.verify_ms(int(t), int(k), int(s), logit_rows=int(m), shape=tuple(int(x) for x in sh)))
                           if t > 0 else 0.0 for t, k, s, m, sh in zip(T, K, S, M, shapes)])
    else:
        verify = np.array([float(cost.verify_ms(int(t), int(k), int(s), logit_rows=int(m))) if t > 0 else 0.0
                           for t, k, s, m in zip(T, K, S, M)])
    ran = st["draft_ms"].to_numpy() > 0
    draft = np.array([cost.draft_ms(int(r), cost.table.draft_block) if d else 0.0
                      for r, d in zip(st["num_decode"].to_numpy(), ran)])
    ms = st["step_ms"].to_numpy() - st["verify_ms"].to_numpy() - st["draft_ms"].to_numpy() + verify + draft
    return float(ms.sum()) / 1000.0


def reprice(run_dir: Path, legacy_pass: tuple[str, ...] = LEGACY_PASS_POLICIES, table_out: Path | None = None,
            rebuild: tuple[Path, Path] | None = None, table_path: Path | None = None,
            max_seqs: int | None = None) -> dict:
    """Every cell's recorded and re-priced prediction, error and verdict, and the summary of each. table_path: the
    table the run was priced with when not its own cost_table.json (real/validate.py --cost-table); max_seqs:
    refit_table's. Its temporary files live in one temp_dir, removed on every exit."""
    with temp_dir("hybridspec-reprice-") as scratch:
        return _reprice(run_dir, legacy_pass, table_out, rebuild, table_path, max_seqs, scratch)


def _reprice(run_dir: Path, legacy_pass: tuple[str, ...], table_out: Path | None, rebuild: tuple[Path, Path] | None,
             table_path: Path | None, max_seqs: int | None, scratch: Path) -> dict:
    from sim.core.cost.padded import SHAPE_COLUMNS
    from sim.core.cost.profiled import ProfiledCost, write_cost_table

    from real.validation.report import read_fidelity
    from sim.infra.inputs import RECORD, check_regular, read_json

    fj = run_dir / "fidelity.json"
    fid = read_fidelity(run_dir, REPRICE_SCHEMA)  # what re-pricing reads, checked (sim/infra/inputs.py)
    unrepeated = [c for c in fid["cells"] if "verdict" not in c or "repeats" not in c]
    if unrepeated:
        raise ConfigError(f"{fj}: cell {_cell_name(unrepeated[0])} has no repeats or verdict: re-pricing needs a "
                          "torch-engine run whose cells were repeated")
    table_path = table_path or run_dir / "cost_table.json"
    for p in (table_path, Path(str(table_path) + ".steps.csv")):
        if not p.exists():
            raise ConfigError(f"{p}: not found; give a real/validate.py --out directory whose table it profiled, "
                              "or --cost-table with the table it was given")
        check_regular(p)  # a pipe or a device: one line naming it, never a read that blocks or never ends
    table = refit_table(run_dir, legacy_pass, rebuild, table_path, max_seqs)
    if table_out is not None:
        write_cost_table(table, table_out)
    cost = ProfiledCost(table, fallback=None)
    margin = float(fid["meta"].get("margin", 0.03))
    from real.validation.profile import profile_uncertainty_of

    u_p, dof = profile_uncertainty_of(table_path)  # the band as real/validation/validate.py forms it today
    padded_rec = None
    if cost.padded:  # the recorded table, marked padded: the simulator's replay then records each step's shape
        padded_rec = _padded_table(read_json(table_path, RECORD), scratch / "recorded_padded.json")
    rows = []
    by_trace: dict = {}  # the repeats' scatter pooled over each trace's cells, as real/validation/validate.py pools it
    for c in fid["cells"]:
        by_trace.setdefault(c["trace"], [])
        if not c.get("loaded"):  # a loaded cell stays out of the pool
            by_trace[c["trace"]].append([r["tok_per_s"] for r in c["repeats"]])
    pooled = {t: pooled_scatter(v) for t, v in by_trace.items()}
    for c in fid["cells"]:
        trace, cid = Path(c["trace"]).stem, _cell_name(c)
        f = run_dir / trace / "cells" / cid / "steps_predicted.csv"
        if not f.exists():
            raise ConfigError(f"{f}: not found (cell {cid} of {fj})")
        pred = read_steps(f, CELL_COLUMNS)
        shapes = None
        if padded_rec is not None:
            if set(SHAPE_COLUMNS) <= set(pred.columns):
                shapes = pred[list(SHAPE_COLUMNS)].to_numpy()
            else:
                t_dir = run_dir / trace
                shapes = _sim_shapes(t_dir / "reference.jsonl", t_dir / "drafts.jsonl", padded_rec,
                                     fid["meta"].get("model", "smollm2-135m"), c["policy"], int(c["batch_size"]), pred)
                if shapes is None:
                    raise ConfigError(f"{f}: the simulator's replay of {cid} no longer gives the recorded steps")
        t_new = reprice_cell(c, pred, cost, shapes)
        if not (t_new > 0 and math.isfinite(t_new)):  # a table's prices are bounded (sim/core/cost/profiled.py)
            raise ConfigError(f"{f}: the re-priced steps of {cid} take {t_new:g} s: nothing to divide by")
        tps = [r["tok_per_s"] for r in c["repeats"]]
        new = c["output_tokens"] / t_new
        v_old, v_new = c["verdict"], judge(tps, new, margin, bool(c.get("loaded")), pred_sd=u_p,
                                           pred_df=dof if dof else math.inf, pooled=pooled[c["trace"]])
        v_rule = judge(tps, v_old["predicted"], margin, bool(c.get("loaded")), pred_sd=u_p,
                       pred_df=dof if dof else math.inf,
                       pooled=pooled[c["trace"]])  # the recorded prediction under today's verdict rule
        rows.append({"cell": cid, "real": v_new.real, "band": v_new.band, "predicted_recorded": v_old["predicted"],
                     "error_recorded": v_old["error"], "verdict_recorded": v_old["verdict"],
                     "verdict_recorded_today": v_rule.verdict, "predicted": new,
                     "error": v_new.error, "verdict": v_new.verdict})

    def summary(key: str, vkey: str) -> dict:
        e = [abs(r[key]) for r in rows]
        counts = {k: sum(r[vkey] == k for r in rows) for k in ("agrees", "disagrees", "inconclusive")}
        ec = [abs(r[key]) for r in rows if r[vkey] != "inconclusive"]  # the run summary's figures (conclusive cells)
        return {"median_abs_error": statistics.median(e), "max_abs_error": max(e),
                "conclusive_median": statistics.median(ec) if ec else None, "conclusive_max": max(ec) if ec else None,
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
                     f"{s['disagrees']} disagree, {s['inconclusive']} inconclusive"
                     + (f" (conclusive: median {100 * s['conclusive_median']:.2f}%, max {100 * s['conclusive_max']:.2f}%)"
                        if s["conclusive_median"] is not None else ""))
    return "\n".join(lines)


def build_profile_reference(out: Path) -> int:
    """Write the slice real/validation/profile.py ran before the padded shapes were recorded (its Workload: traces/general.jsonl,
    10 requests of at most 512 prompt tokens, 24 output tokens, SmolLM2's greedy outputs and the trained drafter's
    chains) as reference.jsonl and drafts.jsonl under `out` (refused when they exist)."""
    from real.validation.profile import PROFILE_TRACE, profile_slice
    from real.validation.validate import write_drafts
    from real.validation.workload import Workload

    ref, drafts = out / "reference.jsonl", out / "drafts.jsonl"
    check_out_files(out, (ref.name, drafts.name), False, "--build-profile-reference",  # before minutes of work
                    hint="they are never replaced: give an empty directory")
    wl = Workload.build(PROFILE_TRACE, "smollm2-135m", False, "cpu", **profile_slice(False), progress=True)
    with temp_dir("hybridspec-reprice-") as d:  # written aside, then committed as one unit (never one alone)
        wl.write_trace(d / ref.name)
        write_drafts(wl, d / drafts.name)
        write_files(out, {q.name: (d / q.name).read_bytes() for q in (ref, drafts)}, unit="profile-reference")
    print(f"wrote {ref} and {drafts}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m real.fidelity_reprice", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="a real/validate.py --out directory (torch engine) whose table it profiled")
    ap.add_argument("--legacy-pass-policies", default=",".join(LEGACY_PASS_POLICIES),
                    help="for recordings without the draft_pass column: the policies that ran the model pass on "
                         "every decoding step (default adaptive,hybrid-price)")
    ap.add_argument("--cost-table", default=None, help="the table the run was given (real/validation/validate.py "
                    "--cost-table; default DIR/cost_table.json, the table the run profiled)")
    from sim.infra.cli import int_at_least

    ap.add_argument("--profile-max-seqs", type=int_at_least(1), default=None, metavar="N",
                    help="refit from the profile steps with at most N sequences only: what a profile whose runs "
                         "never verified more together would have priced")
    ap.add_argument("--table-out", default=None, help="also write the refitted table here (JSON; never overwrites)")
    ap.add_argument("--profile-reference", default=None,
                    help="reference.jsonl of the profile's slice of traces/general.jsonl: rebuilds the padded shapes "
                         "of a recording whose profile steps lack them (with --profile-drafts)")
    ap.add_argument("--profile-drafts", default=None, help="drafts.jsonl of that slice")
    ap.add_argument("--build-profile-reference", default=None, metavar="DIR",
                    help="write the profile's slice (reference.jsonl, drafts.jsonl: real/validation/profile.py's workload, "
                         "SmolLM2 greedy) to DIR and exit; needs the model, minutes of CPU")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    a = ap.parse_args(argv)
    if a.build_profile_reference:
        return build_profile_reference(Path(a.build_profile_reference))
    if bool(a.profile_reference) != bool(a.profile_drafts):
        raise ConfigError("--profile-reference and --profile-drafts go together")
    rebuild = None
    if a.profile_reference:
        rebuild = (Path(a.profile_reference), Path(a.profile_drafts))
        for q in rebuild:
            if not q.is_file():
                raise ConfigError(f"{q}: not found")
    if a.table_out:
        check_out_file(a.table_out, False, "--table-out", hint="it is never overwritten: choose another file")
    d = Path(a.run_dir)
    if not d.is_dir():
        raise ConfigError(f"{d}: not a directory")
    if a.profile_max_seqs is not None and a.profile_max_seqs < 1:
        raise ConfigError(f"--profile-max-seqs {a.profile_max_seqs}: give 1 or more")
    res = reprice(d, tuple(p for p in a.legacy_pass_policies.split(",") if p),
                  Path(a.table_out) if a.table_out else None, rebuild,
                  Path(a.cost_table) if a.cost_table else None, a.profile_max_seqs)
    print(json.dumps(res) if a.json else format_report(res))
    return 0
