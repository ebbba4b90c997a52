"""reports/drafter.md: the trained drafter against the synthetic profile, per workload and position, and what
replacing the profile by the recorded drafts does to the simulator's hybrid-price / adaptive prediction.

    python -m real.drafter_report -o reports/drafter.md [--limit 24] [--max-tokens 128] [--force]

For chat.jsonl and codeedit.jsonl (evaluation traces; the drafter never saw them) it builds the reference
(SmolLM2's greedy outputs, real/validation/eval_drafter.py), drafts at every output position and writes the reference as a
token-id trace with its recorded-drafts sidecar next to the report (`<report stem>_data/`). Then, on that
same reference trace and the same costs (the simulator's defaults: Qwen3-8B on an H100 with the roofline
costs, stated in the report), it simulates `adaptive` and `hybrid-price` twice: with the synthetic DSpark
profile drawing the model drafter's chains, and replaying the recorded drafts. Held-out general text comes
from the drafter file's own metadata (measured by real.train_drafter on sequences it did not train on).
Nothing here is tuned: every figure is a measurement.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from sim.infra.cli import ArgumentParser, atomic_dir, check_out_dir, check_out_file, write_whole
from sim.infra.errors import ConfigError
from real.drafter.evaluate import recorded_drafts
from real.drafter.model import DEFAULT_DRAFTER, load_drafter
from real.validation.eval_drafter import evaluate_trace

def _rel(p) -> str:
    """A path as the repository sees it (reports never name this machine's folders)."""
    from real.drafter.model import REPO

    try:
        return str(Path(p).resolve().relative_to(REPO))
    except ValueError:
        return str(p)


TRACES = ("traces/chat.jsonl", "traces/codeedit.jsonl")
POLICIES = ("adaptive", "hybrid-price")
BATCHES = (1, 4, 16)


def simulate(ref: Path, drafts: Path | None, policy: str, bs: int) -> dict:
    from sim.api.run import SimSetup, prepare, run_one

    row, _ = run_one(prepare(SimSetup(trace=str(ref), drafts=str(drafts) if drafts else None)), policy, bs)
    return row


def synthetic_quality(ref: Path) -> dict:
    """The synthetic profile's tau, conditional acceptance by depth, AUC and ECE on the reference trace."""
    from sim.api.fit_profile import head_quality
    from sim.api.run import SimSetup, prepare, run_one

    prep = prepare(SimSetup(trace=str(ref)))
    row, _ = run_one(prep, "model-fixed:7", 4)
    return {"tau": row["mean_tokens_per_step"], **head_quality(prep.tables)}


def fit_profile_to(side: Path, ref: Path, out: Path, name: str) -> dict:
    """sim.api.fit_profile --from-drafts on the recorded drafts: the synthetic profile's knobs that
    reproduce them, and its tau beside the recorded one."""
    from sim.api.fit_profile import from_drafts

    r = from_drafts(str(side), str(ref), "dspark-qwen3-b7", None, None, out, name, force=True)
    return {"base": r["base"], "fitted": r["fitted"], "tau": {k: v["tau"] for k, v in r["measured"].items()}}


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m real.drafter_report", description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--out", required=True, help="the markdown report to write")
    ap.add_argument("--force", action="store_true", help="replace an existing report and its data folder")
    ap.add_argument("--limit", type=int, default=24, help="requests per trace")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-prompt", type=int, default=1536)
    ap.add_argument("--drafter", default=str(DEFAULT_DRAFTER))
    ap.add_argument("--compare", action="append", default=[],
                    help="other drafter files (e.g. trained with --subset 0.5) whose held-out figures go beside the "
                         "bundled one's: a learning curve (repeatable)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    data = out.with_name(out.stem + "_data")
    if a.limit < 1 or a.max_tokens < 1:
        raise ConfigError("--limit and --max-tokens must be >= 1")
    # before any work, both claimed: the report (a file) and its data folder (a folder of its own, whose other
    # files --force keeps: sim.infra.fsio.atomic_dir)
    check_out_file(out, a.force, "-o", hint="pass --force to replace it and its data folder")
    check_out_dir(data, a.force, "-o")
    drafter = load_drafter(a.drafter)
    meta = getattr(drafter, "meta", {})
    others = [(c, load_drafter(c).meta) for c in a.compare]  # checked before the long work
    results = {}
    with atomic_dir(data, flag="-o") as tmp:  # removed on any failure; the data folder before the report
        _evaluate(a, tmp, results)
    write_whole(out, format_md(results, meta, a, data, others), overwrite=a.force)
    print(f"wrote {out} and {data}/")
    return 0


def _evaluate(a, tmp: Path, results: dict) -> None:
    """Each trace's drafter figures and simulations into `results`, its files into `tmp`."""
    for trace in TRACES:
        name = Path(trace).stem
        m, rids, seqs, chains = evaluate_trace(trace, a.limit, a.max_tokens, a.max_prompt, a.drafter)
        ref, side = tmp / f"{name}.ref.jsonl", tmp / f"{name}.drafts.jsonl"
        ref.write_text("".join(json.dumps({"id": r, "prompt_ids": s.tokens[: s.prompt_len].tolist(),
                                           "output_ids": s.tokens[s.prompt_len:].tolist()}) + "\n"
                               for r, s in zip(rids, seqs)))
        side.write_text("".join(json.dumps(recorded_drafts(r, c)) + "\n" for r, c in zip(rids, chains)))
        syn = synthetic_quality(ref)
        fitted = fit_profile_to(side, ref, tmp / f"{name}.fitted-profile.json", f"fitted-smollm2-{name}")
        sims = {}
        for bs in BATCHES:
            for src, dr in (("synthetic", None), ("recorded", side)):
                for pol in POLICIES:
                    sims[(bs, src, pol)] = simulate(ref, dr, pol, bs)["output_throughput_tok_s"]
        results[name] = (m, syn, sims, fitted)
        print(f"{name}: tau {m['tau_walk']:.2f} (synthetic profile {syn['tau']:.2f})", file=sys.stderr)


def format_md(results: dict, meta: dict, a, data: Path, others: list) -> str:
    held = meta.get("heldout", {})
    cmd = f"python -m real.drafter_report -o {a.out} --limit {a.limit} --max-tokens {a.max_tokens}" + \
        "".join(f" --compare {_rel(c)}" for c, _ in others)
    L = ["# The trained drafter against the synthetic profile", "",
         f"Produced by `{cmd}` (simulation and measurement on this machine's CPU; no GPU run confirms these "
         "figures). Drafter: `" + _rel(a.drafter) + "`, a DSpark-style block-7 drafter for SmolLM2-135M-Instruct "
         "trained by `" + meta.get("command", "python -m real.train_drafter") + "` on traces/general.jsonl only "
         f"({meta.get('sequences', '?')} sequences, {meta.get('generated_tokens', '?')} generated tokens, "
         f"{meta.get('seconds', {}).get('train', '?')} s of training on {meta.get('threads', '?')} threads).", "",
         "Reference: SmolLM2's greedy output (at most " f"{a.max_tokens} tokens) on the first {a.limit} prompts of "
         f"each trace that fit in {a.max_prompt} tokens. tau = mean accepted length + 1 per verification of a "
         "model-drafter-only engine (decode walk); acceptance per position k = P(token k accepted | tokens < k "
         "accepted); ECE / AUC of the prefix survival prod c against acceptance, every slot inside the output "
         "(real/drafter/evaluate.py). Synthetic: the simulator's DSpark profile (models/drafters/dspark-qwen3-b7.json, "
         "fitted to published Qwen3 figures) drawing chains on the same reference; its tau is the simulator's "
         "tokens per step of `model-fixed:7` at batch 4.", "",
         "## Acceptance and calibration", "",
         "| workload | drafter | tau | acceptance per position 1..7 | ECE raw | ECE (STS) | AUC (STS) | depth-1 AUC |",
         "|---|---|---:|---|---:|---:|---:|---:|"]
    if held:
        L.append(f"| general (held out) | trained | {held.get('tau_walk', float('nan')):.2f} | "
                 + " ".join(f"{p:.2f}" for p in held.get("per_pos", [])) +
                 f" | {held.get('ece_raw', float('nan')):.3f} | {held.get('ece_sts', float('nan')):.3f} | "
                 f"{held.get('auc_sts', float('nan')):.3f} | {held.get('auc_depth1_sts', float('nan')):.3f} |")
    for name, (m, syn, _, _) in results.items():
        L.append(f"| {name} ({m['vocab_coverage']:.1%} of output tokens in the drafter's vocabulary) | trained | "
                 f"{m['tau_walk']:.2f} | " + " ".join(f"{p:.2f}" for p in m["per_pos"]) +
                 f" | {m['ece_raw']:.3f} | {m['ece_sts']:.3f} | {m['auc_sts']:.3f} | {m['auc_depth1_sts']:.3f} |")
        L.append(f"| {name} | synthetic profile | {syn['tau']:.2f} | " + " ".join(f"{p:.2f}" for p in syn["cond"]) +
                 f" | | {syn['ece']:.3f} | | {syn['auc']:.3f} |")
    L += ["", "## Cost", "", "| workload | drafter pass (ms) | target decode step (ms) | ratio | context (tokens) |",
          "|---|---:|---:|---:|---:|"]
    for name, (m, _, _, _) in results.items():
        c = m.get("cost")
        if c:
            L.append(f"| {name} | {c['drafter_ms']:.2f} | {c['target_step_ms']:.2f} | {c['ratio']:.1%} | "
                     f"{c['context_tokens']} |")
    L += ["", "Both at batch 1 on this CPU, median of 15; the drafter pass appends two context entries and drafts 7 "
          "tokens (real/validation/eval_drafter.py `time_costs`).", "",
          "## What the recorded drafts change in the simulator's prediction", "",
          "Same reference trace, same costs (the simulator's defaults: Qwen3-8B on an H100, roofline costs); only "
          "the model drafter's chains differ: drawn from the synthetic profile, or replayed from the recorded "
          f"drafts (`python -m sim.run --trace {data}/NAME.ref.jsonl --drafts {data}/NAME.drafts.jsonl`). "
          "Simulation only.", "",
          "| workload | batch | adaptive tok/s (synthetic / recorded) | hybrid-price tok/s (synthetic / recorded) | "
          "hybrid-price / adaptive: synthetic | recorded |", "|---|---:|---:|---:|---:|---:|"]
    for name, (_, _, sims, _) in results.items():
        for bs in BATCHES:
            ad_s, ad_r = sims[(bs, "synthetic", "adaptive")], sims[(bs, "recorded", "adaptive")]
            hy_s, hy_r = sims[(bs, "synthetic", "hybrid-price")], sims[(bs, "recorded", "hybrid-price")]
            L.append(f"| {name} | {bs} | {ad_s:.0f} / {ad_r:.0f} | {hy_s:.0f} / {hy_r:.0f} | {hy_s / ad_s:.3f}x | "
                     f"{hy_r / ad_r:.3f}x |")
    L += ["", "## What limits it", "",
          "Held-out general text (every 10th training-data sequence, never trained on), teacher-forced top-1 "
          "agreement with the target per block position and cross-entropy, for drafters trained on more or "
          "fewer of the same sequences (same settings otherwise; `python -m real.train_drafter --subset F`). "
          "Training cross-entropy is the mean of the last fifth of the logged steps.", "",
          "| drafter | training sequences | epochs | held-out CE | training CE | top-1 per position 1..7 "
          "| tau (held out) |", "|---|---:|---:|---:|---:|---|---:|"]
    for path, mt in [(a.drafter, meta)] + others:
        h = mt.get("heldout", {})
        hist = mt.get("loss_history", [])
        tail = [c for _, c, _ in hist[-max(1, len(hist) // 5):]]
        n_train = round(mt.get("train", {}).get("subset", 1.0) * (mt.get("sequences", 0) - mt.get("sequences", 0) // 10))
        L.append(f"| `{_rel(path)}` | {n_train} | {mt.get('train', {}).get('epochs', '?')} | "
                 f"{h.get('ce', float('nan')):.2f} | {np.mean(tail) if tail else float('nan'):.2f} | "
                 + " ".join(f"{x:.2f}" for x in h.get("top1_per_pos", [])) + f" | {h.get('tau_walk', float('nan')):.2f} |")
    L += ["", "## The synthetic profile fitted to the recorded drafts", "",
          "`python -m sim.fit_profile --from-drafts " f"{data}/NAME.drafts.jsonl --trace {data}/NAME.ref.jsonl` "
          f"(written to `{data}/NAME.fitted-profile.json`): the knobs with which the synthetic model reproduces the "
          "trained drafter, beside the bundled profile's (fitted to published Qwen3 figures). rho, copy_min_ext, "
          "temp_scale and conf_temperature are kept from the bundled profile.", "",
          "| workload | profile | q1 normal / copied | decay normal / copied | sigma | tau (model-fixed:7, batch 4) |",
          "|---|---|---|---|---:|---:|"]
    for name, (_, _, _, f) in results.items():
        for key in ("base", "fitted"):
            p = f[key]
            tau = f["tau"][key]
            L.append(f"| {name} | {'bundled dspark-qwen3-b7' if key == 'base' else 'fitted to the recorded drafts'} | "
                     f"{p.q1[0]:.3f} / {p.q1[1]:.3f} | {p.decay[0]:.3f} / {p.decay[1]:.3f} | {p.sigma:.3f} | {tau:.2f} |")
        L.append(f"| {name} | recorded drafts (replayed) | | | | {f['tau']['recorded']:.2f} |")
    return "\n".join(L) + "\n"
