"""Fit and check the synthetic DSpark profile against the published figures, on the bundled traces.

    python -m sim.drafters.fit_profile [--write]

Measures, with the simulator itself (`model-fixed:7`, batch size 4), the mean accepted length tau
(accepted + bonus token per request-step) on traces/chat.jsonl and traces/codeedit.jsonl, the
per-position conditional acceptance, and the confidence head's AUC. With --write it first bisects
q1[normal] so chat tau hits the middle of the published DSpark chat range (3.1-3.7) and q1[copied] so
code-editing tau lands at the top of the published code range (4.9-5.5), where copying helps, and
rewrites models/drafters/dspark-qwen3-b7.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import json

from sim.cli_util import run_cli
from sim.drafters.calibration import auc
from sim.drafters.model import MODELS_DIR, load_drafter_profile
from sim.run import SimSetup, prepare, run_one

CHAT_RANGE = (3.1, 3.7)
CODE_RANGE = (4.9, 5.5)
AUC_RANGE = (0.81, 0.90)


def measure(profile_name: str, trace: str, limit: int | None, overrides: dict | None = None) -> dict:
    """tau, per-position conditional acceptance and depth-1 AUC of the profile on a trace."""
    prof = load_drafter_profile(profile_name)
    if overrides:
        prof = dataclasses.replace(prof, **overrides)
    prep = prepare(SimSetup(trace=trace, drafter=profile_name, limit=limit), profile=prof)
    row, _ = run_one(prep, "model-fixed:7", 4)
    tb = prep.tables
    acc = tb.m_acc
    cond = [float((acc[acc >= j] >= j + 1).mean()) for j in range(tb.k_model)]
    return {"tau": row["mean_tokens_per_step"], "cond": cond,
            "auc": auc(tb.m_conf[:, 0].astype(float), (acc >= 1).astype(float))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.drafters.fit_profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="dspark-qwen3-b7")
    ap.add_argument("--limit", type=int, default=150, help="requests per trace used for the fit")
    ap.add_argument("--write", action="store_true", help="refit q1 and rewrite the profile file")
    a = ap.parse_args(argv)
    prof = load_drafter_profile(a.profile)
    if a.write:
        q_norm, q_copy = prof.q1
        for which, trace, target in ((0, "traces/chat.jsonl", sum(CHAT_RANGE) / 2), (1, "traces/codeedit.jsonl", CODE_RANGE[1])):
            lo, hi = 0.3, 0.995
            for _ in range(12):
                mid = (lo + hi) / 2
                q1 = (mid, q_copy) if which == 0 else (q_norm, mid)
                tau = measure(a.profile, trace, a.limit, {"q1": q1})["tau"]
                lo, hi = (mid, hi) if tau < target else (lo, mid)
            if which == 0:
                q_norm = round((lo + hi) / 2, 4)
            else:
                q_copy = round((lo + hi) / 2, 4)
        path = MODELS_DIR / f"{a.profile}.json"
        raw = json.loads(path.read_text())
        raw["q1"] = [q_norm, q_copy]
        path.write_text(json.dumps(raw, indent=2) + "\n")
        print(f"wrote {path}: q1 = {raw['q1']}")
    print(f"{'trace':<24}{'tau':>7}{'published':>14}{'AUC':>7}  conditional acceptance by position")
    for trace, rng in (("traces/chat.jsonl", CHAT_RANGE), ("traces/codeedit.jsonl", CODE_RANGE)):
        m = measure(a.profile, trace, a.limit)
        print(f"{trace:<24}{m['tau']:>7.2f}{f'{rng[0]}-{rng[1]}':>14}{m['auc']:>7.3f}  " + " ".join(f"{c:.2f}" for c in m["cond"]))
    return 0


if __name__ == "__main__":
    run_cli(main)
