"""Measure the project's drafter on a trace: acceptance, calibration and cost against SmolLM2-135M-Instruct.

    python -m real.eval_drafter --trace traces/chat.jsonl --limit 24 [--json]
    python -m real.eval_drafter --trace traces/codeedit.jsonl --limit 24 \
        --drafts-out /tmp/ce.drafts.jsonl --trace-out /tmp/ce.ref.jsonl     # then: python -m sim.run \
        --trace /tmp/ce.ref.jsonl --drafts /tmp/ce.drafts.jsonl              # the simulator replays them

The reference is the target's greedy output on each prompt (up to --max-tokens), generated with its hidden
states (cached like the training data); the drafter then drafts at every output position from those states
(real/drafter/evaluate.py defines every figure). Prompts longer than --max-prompt tokens are passed over and
counted in the output, never truncated silently. Cost: the median wall time of one drafter pass (appending
two context entries and drafting K tokens) against one target decode step, both at batch 1 on this machine.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from sim.infra.cli import ArgumentParser, check_in_file, check_out_file, write_whole
from sim.infra.errors import ConfigError
from real.drafter.data import DataConfig, collect_with_ids
from real.drafter.evaluate import first_position_by_copy, metrics, output_chains, recorded_drafts
from real.drafter.model import DEFAULT_DRAFTER, file_sha256, load_drafter


def time_costs(drafter, target, seq, reps: int = 15) -> dict:
    """Median ms of one drafter pass and one target decode step at batch 1, at the sequence's length."""
    from real.drafter.runtime import DrafterCache
    from real.validation.profile import median_ms

    P = seq.prompt_len
    n = min(len(seq.greedy), len(seq.tokens) - 1)
    cache = DrafterCache(drafter, 1, n + 8)
    lt = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    slot = lt([0])
    cache.append(torch.zeros(n - 2, dtype=torch.int64), torch.arange(n - 2), seq.feats[: n - 2],
                 torch.from_numpy(seq.tokens[1: n - 1].astype(np.int64)))
    f2, nx2, pos2 = seq.feats[n - 2: n], torch.from_numpy(seq.tokens[n - 1: n + 1].astype(np.int64)), torch.arange(n - 2, n)

    def drafter_pass():
        cache.ctx_len[0] = n - 2
        cache.append(torch.zeros(2, dtype=torch.int64), pos2, f2, nx2)
        cache.draft(slot, lt([int(seq.tokens[n])]))

    target.setup_caches(1, n + 8)
    with torch.inference_mode():
        target(torch.from_numpy(seq.tokens[:n].astype(np.int64)), lt([n]), lt([0]), slot, lt([n - 1]))

    def target_step():
        target(lt([int(seq.tokens[n])]), lt([1]), lt([n]), slot, lt([0]))

    with torch.inference_mode():
        d_ms = median_ms(drafter_pass, reps, torch.device("cpu"))
        t_ms = median_ms(target_step, reps, torch.device("cpu"))
    return {"drafter_ms": d_ms, "target_step_ms": t_ms, "ratio": d_ms / t_ms, "context_tokens": n, "prompt_tokens": P}


def evaluate_trace(trace: str, limit: int, max_tokens: int, max_prompt: int, drafter_path: str,
                   progress: bool = True, timing: bool = True, log=print) -> tuple[dict, list[str], list, list[dict]]:
    """(figures, request ids, reference sequences, per-request chains) of the drafter on `trace`."""
    from real.engine.weights import build_model, find_smollm2_gguf

    drafter = load_drafter(drafter_path, target="smollm2-135m", target_sha256=file_sha256(find_smollm2_gguf()))
    dcfg = DataConfig(trace=trace, num_prompts=limit, max_tokens=max_tokens, max_prompt=max_prompt,
                      layers=drafter.cfg.layers, batch=min(16, limit), purpose="eval")
    dcfg.validate()
    target, _ = build_model("smollm2-135m-gguf", "cpu", torch.float32, max_slots=1, max_len=8)
    drafter.attach_target(target.tok_embeddings.weight)
    rids, seqs = collect_with_ids(dcfg, progress=progress, log=log)
    chains = [output_chains(drafter, s) for s in seqs]
    m = metrics(chains, drafter.cfg.block)
    m.update(first_position_by_copy(chains, seqs))
    outs = np.concatenate([s.tokens[s.prompt_len:] for s in seqs])
    m.update(trace=trace, requests=len(seqs), output_tokens=int(len(outs)), drafter=str(drafter_path),
             block=drafter.cfg.block, vocab_coverage=float(np.isin(outs, drafter.vocab_ids.numpy()).mean()))
    if timing:
        longest = max(seqs, key=lambda s: len(s.tokens))
        m["cost"] = time_costs(drafter, target, longest)
    return m, rids, seqs, chains


def format_table(m: dict) -> str:
    K = m["block"]
    lines = [f"{m['trace']}: {m['requests']} requests, {m['output_tokens']} output tokens, {m['positions']} positions; "
             f"{m['vocab_coverage']:.1%} of the output tokens are in the drafter's vocabulary",
             f"  tau (decode walk) {m['tau_walk']:.2f}   tau (every position) {m['tau_all']:.2f}",
             "  acceptance per position  " + " ".join(f"{k + 1}:{p:.2f}" for k, p in zip(range(K), m["per_pos"])),
             f"  first-position acceptance: copied tokens {m['q1_copied']:.2f} ({m['copied']}), normal "
             f"{m['q1_normal']:.2f} ({m['normal']})",
             f"  survival ECE  raw {m['ece_raw']:.3f} (what vLLM sees: its confidence head is used raw)  STS {m['ece_sts']:.3f}",
             f"  survival AUC  raw {m['auc_raw']:.3f}  STS {m['auc_sts']:.3f}   depth-1 AUC {m['auc_depth1_sts']:.3f}"]
    if "cost" in m:
        c = m["cost"]
        lines.append(f"  cost at batch 1: drafter pass {c['drafter_ms']:.2f} ms vs target decode step "
                     f"{c['target_step_ms']:.2f} ms = {c['ratio']:.1%} (context {c['context_tokens']} tokens)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m real.eval_drafter", description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True, help="a text trace (JSONL with prompts)")
    ap.add_argument("--limit", type=int, default=24, help="requests (first N with a prompt that fits)")
    ap.add_argument("--max-tokens", type=int, default=128, help="greedy reference tokens per request")
    ap.add_argument("--max-prompt", type=int, default=1536, help="longer prompts are passed over (counted)")
    ap.add_argument("--drafter", default=str(DEFAULT_DRAFTER), help="drafter weights file")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--drafts-out", default=None, help="write the recorded-drafts sidecar for sim.api.run --drafts")
    ap.add_argument("--trace-out", default=None, help="write the reference as a token-id trace for sim.api.run --trace")
    ap.add_argument("--no-timing", action="store_true", help="skip the cost measurement")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    if a.limit < 1 or a.max_tokens < 1 or a.max_prompt < 2:
        raise ConfigError("--limit and --max-tokens must be >= 1, --max-prompt >= 2")
    if a.max_prompt + a.max_tokens > 8192:
        raise ConfigError(f"--max-prompt + --max-tokens = {a.max_prompt + a.max_tokens} exceeds SmolLM2's context 8192")
    from real.validation.workload import slice_prompts

    slice_prompts(a.trace, None, 0)  # every line, and a prompt text on each, before the model loads
    check_in_file(a.drafter, "--drafter")
    for flag, p in (("--drafts-out", a.drafts_out), ("--trace-out", a.trace_out)):
        if p:
            check_out_file(p, False, flag, inputs=(a.trace, a.drafter), hint="choose another path")
    m, rids, seqs, chains = evaluate_trace(a.trace, a.limit, a.max_tokens, a.max_prompt, a.drafter,
                                           progress=not a.no_progress, timing=not a.no_timing,
                                           log=lambda msg: print(msg, file=sys.stderr))  # stdout: the result only
    if a.trace_out:
        write_whole(Path(a.trace_out), "".join(json.dumps({"id": r, "prompt_ids": s.tokens[: s.prompt_len].tolist(),
                                                            "output_ids": s.tokens[s.prompt_len:].tolist()}) + "\n"
                                               for r, s in zip(rids, seqs)), hint="choose another path (this command never replaces a file)")
    if a.drafts_out:
        write_whole(Path(a.drafts_out), "".join(json.dumps(recorded_drafts(r, c)) + "\n" for r, c in zip(rids, chains)),
                    hint="choose another path (this command never replaces a file)")
    print(json.dumps(m, indent=1) if a.json else format_table(m))
    return 0
