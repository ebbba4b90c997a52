"""Fit the n-gram calibrator on general text and show how it transfers.

    python -m sim.calibrate [--general traces/general.jsonl] [--out out/calibrators/ngram-general.json | --write]

Fits on 80% of the general-text requests (split by a hash of the request id, so it is deterministic),
then prints ECE and AUC of the prefix survival on the held-out 20% and on the code-editing and chat
traces, which the fit never sees. The bound the project holds itself to: ECE <= 3% on held-out general text.
It writes the fitted calibrator to out/calibrators/ unless --write --force replaces the shipped one
(models/calibrators/ngram-general.json; every cached sweep cell that used it is then recomputed). Every path is
checked first; the calibrator is evaluated before it is written and written whole; it replaces the shipped one
only when its held-out ECE is within the bound; an existing file is replaced only with --force.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from sim.infra.cli import ArgumentParser, check_out_file, int_at_least
from sim.core.drafters.calibration import (CALIBRATOR_DIR, DEFAULT_CALIBRATOR, NgramCalibrator, auc, ece,
                                           fit_calibrator, survival_labels)
from sim.core.drafters.ngram import NgramConfig, NgramTable, ngram_tables
from sim.infra.errors import ConfigError

ECE_BOUND = 0.03
SHIPPED = CALIBRATOR_DIR / f"{DEFAULT_CALIBRATOR}.json"
DEFAULT_OUT = Path("out/calibrators") / f"{DEFAULT_CALIBRATOR}.json"


def tables_of(path: str, cfg: NgramConfig, limit: int | None = None) -> tuple[list[str], list[NgramTable]]:
    from sim.core.trace import load_trace

    tr = load_trace(path, limit=limit)
    if tr.length_only:
        raise ConfigError(f"{path}: calibration needs token content, not a length-only trace")
    ids, tabs = [], []
    for r in tr.requests:
        ids.append(r.id)
        tabs.append(ngram_tables(np.concatenate([r.prompt_ids, r.output_ids]), len(r.prompt_ids), cfg))
    return ids, tabs


def is_heldout(rid: str) -> bool:
    return hashlib.sha256(rid.encode()).digest()[0] < 52  # ~20%


def evaluate(cal: NgramCalibrator, tabs: list[NgramTable]) -> dict:
    pred, lab = survival_labels(tabs, [cal.conditional(t) for t in tabs])
    return {"slots": len(pred), "ece": ece(pred, lab), "auc": auc(pred, lab),
            "mean_pred": float(pred.mean()) if len(pred) else float("nan"),
            "mean_label": float(lab.mean()) if len(lab) else float("nan")}


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m sim.calibrate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--general", default="traces/general.jsonl")
    ap.add_argument("--eval", nargs="*", default=["traces/codeedit.jsonl", "traces/chat.jsonl"])
    ap.add_argument("--out", type=Path, default=None,
                    help=f"calibrator file to write (default {DEFAULT_OUT}, relative to the current directory)")
    ap.add_argument("--write", action="store_true",
                    help=f"replace the shipped calibrator {SHIPPED} (exclusive with --out; needs --force)")
    ap.add_argument("--force", action="store_true", help="replace an existing calibrator file")
    ap.add_argument("--n-min", type=int_at_least(1), default=2)
    ap.add_argument("--n-max", type=int_at_least(1), default=5)
    ap.add_argument("--k", type=int_at_least(1), default=32, help="longest chain the calibrator is fitted for")
    a = ap.parse_args(argv)
    if a.write and a.out is not None:
        raise ConfigError("--write replaces the shipped calibrator; it does not go with --out")
    out = SHIPPED if a.write else (a.out or DEFAULT_OUT)
    cfg = NgramConfig(n_min=a.n_min, n_max=a.n_max, k=a.k)
    from sim.core.trace.loader import scan_trace

    for p in [a.general, *a.eval]:  # every input read once before the fit
        scan_trace(p)
    check_out_file(out, a.force, "--write" if a.write else "--out", inputs=(a.general, *a.eval),
                   hint="it is the shipped calibrator; pass --force to replace it" if a.write else
                   "pass --force to replace it")
    ids, tabs = tables_of(a.general, cfg)
    train = [t for i, t in zip(ids, tabs) if not is_heldout(i)]
    held = [t for i, t in zip(ids, tabs) if is_heldout(i)]
    if not train or not held:
        raise ConfigError(f"{a.general}: {len(ids)} requests are too few to split 80/20 by id hash")
    cal = fit_calibrator(train, cfg, fitted_on=f"{a.general} (80% split by id hash)")
    print(f"fitted on {len(train)} requests of {a.general}")
    print(f"{'data':<28}{'slots':>9}{'ECE':>8}{'AUC':>8}{'mean est':>10}{'mean obs':>10}")
    res = {"general (held-out)": evaluate(cal, held)}  # evaluated before anything is written
    for p in a.eval:
        res[p] = evaluate(cal, tables_of(p, cfg)[1])
    for k, v in res.items():
        print(f"{k:<28}{v['slots']:>9}{v['ece']:>8.3f}{v['auc']:>8.3f}{v['mean_pred']:>10.3f}{v['mean_label']:>10.3f}")
    ok = res["general (held-out)"]["ece"] <= ECE_BOUND
    print(f"held-out ECE {'within' if ok else 'ABOVE'} the {ECE_BOUND:.0%} bound")
    if not ok and a.write:
        print(f"not written: a calibrator above the bound never replaces the shipped one ({out} is unchanged)")
        return 1
    cal.save(out, overwrite=True)  # whole, after the evaluation (an existing file only with --force, checked first)
    print(f"saved {out}" + ("" if a.write else " (--write --force replaces the shipped calibrator)"))
    return 0 if ok else 1
