"""Training the drafter on collected sequences (real/drafter/data.py): losses, batches, checkpoints, STS fit.

Labels. For anchor a (the drafter has seen t_0..t_a) block position k predicts the target's greedy token at
a+1+k *given that the drafts before it were accepted*, i.e. given the context t_0..t_a, g_a, .., g_{a+k-1}.
Where the sequence itself follows the target (t_{a+1+i} = g_{a+i} for i < k) that token is g_{a+k}, read off
the data; elsewhere the label is unknown and masked:
    valid_k(a) = [a + k <= F - 1] * prod_{i<k} [t_{a+1+i} = g_{a+i}]
On the generated part every label is valid; on the human prompt only while the text agrees with the target.
The Markov head is teacher forced on the accepted prefix: x_{k-1} = g_{a+k-1} (x_{-1} = t_a), which is
exactly what it sees at inference whenever slot k can still be accepted.

Losses (per valid slot, averaged): cross-entropy of l_k over the reduced vocabulary (labels outside it are
skipped: the drafter cannot propose them), plus the confidence head's binary cross-entropy against the hard
agreement 1{argmax l_k = label} (temperature 0) on detached inputs, so it reads the backbone without steering it.

STS. On held-out sequences the drafter drafts freely (its own tokens), acc = leading matches with the
target's greedy tokens, y_k = 1{acc >= k+1}; T_k = argmin over a grid of the BCE of sigmoid(logit(s_k)/T_k)
against y_k, per position k (s_k the raw survival).
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from sim.infra.progress import progress_bar

from sim.infra.errors import ConfigError
from real.drafter.data import Sequence
from real.drafter.model import DSparkDrafter
from sim.infra.fsio import own_path


@dataclass(frozen=True)
class TrainConfig:
    epochs: float = 8.0           # passes over the training sequences
    anchors: int = 96             # anchors sampled per sequence per step
    accum: int = 1                # sequences per optimizer step
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: int = 50              # optimizer steps
    conf_weight: float = 0.5
    seed: int = 0
    heldout_every: int = 10       # sequence i is held out when i % heldout_every == heldout_every - 1
    checkpoint_every: int = 200   # optimizer steps
    subset: float = 1.0           # share of the training sequences used (a learning curve's smaller points)

    def validate(self) -> None:
        if not (isinstance(self.epochs, (int, float)) and self.epochs > 0 and math.isfinite(self.epochs)):
            raise ConfigError(f"--epochs must be a positive number, got {self.epochs!r}")
        for k in ("anchors", "accum", "warmup", "heldout_every", "checkpoint_every"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"train config: {k} must be a positive integer, got {v!r}")
        if not (isinstance(self.subset, (int, float)) and 0 < self.subset <= 1):
            raise ConfigError(f"--subset must be in (0, 1], got {self.subset!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"--lr must be a positive number, got {self.lr!r}")


def split(seqs: list[Sequence], every: int) -> tuple[list[Sequence], list[Sequence]]:
    train = [s for i, s in enumerate(seqs) if i % every != every - 1]
    held = [s for i, s in enumerate(seqs) if i % every == every - 1]
    return train, held


def reduced_vocab(seqs: list[Sequence], size: int) -> torch.Tensor:
    """The `size` most frequent greedy tokens of the sequences (ties by id): the drafter's output vocabulary."""
    counts = np.bincount(np.concatenate([s.greedy for s in seqs]).astype(np.int64), minlength=1)
    order = np.lexsort((np.arange(len(counts)), -counts))[:size]
    if len(order) < size:  # fewer distinct tokens than slots: fill with the next ids
        rest = np.setdiff1d(np.arange(size * 2), order)[: size - len(order)]
        order = np.concatenate([order, rest])
    return torch.from_numpy(np.sort(order).astype(np.int64))


@dataclass
class SeqTensors:
    """One sequence prepared for the drafter: context inputs and per-anchor labels."""
    feats: torch.Tensor      # [C, L*D] features of context positions j = 0..C-1
    next_tok: torch.Tensor   # [C] t_{j+1}
    tokens: torch.Tensor     # [T]
    labels: torch.Tensor     # [C+1, K] g_{a+k} per anchor a = 0..C (-1 where out of range)
    valid: torch.Tensor      # [C+1, K] bool
    prompt_len: int
    topk_ids: torch.Tensor | None = None  # [F, k] the target's top-k next tokens (teacher-forced labels only)
    topk_p: torch.Tensor | None = None    # [F, k] their probabilities


def prepare(seq: Sequence, K: int) -> SeqTensors:
    T, Fw = len(seq.tokens), len(seq.greedy)
    C = min(Fw, T - 1)
    t = torch.from_numpy(seq.tokens.astype(np.int64))
    g = torch.from_numpy(seq.greedy.astype(np.int64))
    a = torch.arange(C + 1)[:, None]
    k = torch.arange(K)[None, :]
    idx = a + k                                         # position of g for slot k
    inside = idx <= Fw - 1
    lab = torch.where(inside, g[idx.clamp(max=Fw - 1)], torch.full_like(idx, -1))
    nxt = idx + 1                                       # t_{a+1+k} must equal g_{a+k} for the next slot
    agree = inside & (nxt <= T - 1) & (t[nxt.clamp(max=T - 1)] == lab)
    prefix_ok = torch.cat([torch.ones(C + 1, 1, dtype=torch.bool), torch.cumprod(agree[:, :-1].int(), 1).bool()], 1)
    return SeqTensors(seq.feats[:C], t[1: C + 1], t, lab, inside & prefix_ok, seq.prompt_len,
                      getattr(seq, "topk_ids", None), getattr(seq, "topk_p", None))


def forward_anchors(d: DSparkDrafter, st: SeqTensors, anchors: torch.Tensor):
    """Teacher-forced pass over `anchors` (positions a >= 1) of one sequence.
    Returns (logits [B, K, V], raw conf logits [B, K], u [B, K, D])."""
    c, ck, cv = d.sequence_context(st.feats, st.next_tok)                   # c [C, D]
    B = anchors.shape[0]
    mask = d.visible(c.shape[0], anchors)
    z, zpos = d.block_inputs(c[anchors - 1], anchors)
    u = d.backbone(z, zpos, ck.expand(B, *ck.shape), cv.expand(B, *cv.shape), mask)
    base = d.base_logits(u)                                                  # [B, K, V]
    lab = st.labels[anchors]                                                 # [B, K]
    prev_tok = torch.cat([st.tokens[anchors][:, None], lab[:, :-1].clamp(min=0)], 1)
    prev = d.to_reduced[prev_tok]
    m = d.markov_in(prev)
    logits = base + d.markov_out(m)
    # detached: the confidence head reads the backbone without steering it
    raw = d.raw_confidence(u.detach(), m.detach(), logits.detach())
    return logits, raw, u


def losses(d: DSparkDrafter, st: SeqTensors, anchors: torch.Tensor, conf_weight: float):
    logits, raw, _ = forward_anchors(d, st, anchors)
    lab = d.to_reduced[st.labels[anchors].clamp(min=0)]
    valid = st.valid[anchors]
    inv = valid & (lab < d.cfg.vocab)
    ce = F.cross_entropy(logits[inv].float(), lab[inv]) if inv.any() else logits.sum() * 0
    hit = (logits.detach().argmax(-1) == lab) & inv
    bce = F.binary_cross_entropy_with_logits(raw[valid], hit[valid].float()) if valid.any() else raw.sum() * 0
    per_pos = (hit.sum(0).float(), valid.sum(0).float())
    return ce + conf_weight * bce, ce.detach(), bce.detach(), per_pos


def sample_anchors(st: SeqTensors, n: int, gen: torch.Generator, stop: int | None = None) -> torch.Tensor:
    """Anchors 1 <= a < stop (None: every anchor, a <= C) with a valid first label, `n` of them drawn at random
    (gen) where there are more, in increasing order."""
    ok = torch.nonzero(st.valid[1:stop, 0]).squeeze(1) + 1
    if len(ok) > n:
        ok = ok[torch.randperm(len(ok), generator=gen)[:n]]
    return ok.sort().values


def rms_unit(x: torch.Tensor) -> torch.Tensor:
    """x / RMS(x) over the last dimension (RMS floored at 1e-6): RMSNorm without its weight."""
    return x / x.pow(2).mean(-1, keepdim=True).sqrt().clamp(min=1e-6)


def final_state(st: SeqTensors, idx: torch.Tensor, D: int) -> torch.Tensor:
    """The target's final-layer state at context positions `idx` (the last D of each position's features),
    rms_unit-normed, fp32: what its LM head reads there, up to the final norm's weight."""
    return rms_unit(st.feats[idx, -D:].float())


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    p = (step - cfg.warmup) / max(1, total - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))


def train(d: DSparkDrafter, train_seqs: list[SeqTensors], cfg: TrainConfig, ckpt: Path | None, log=print,
          progress: bool = True) -> dict:
    """Train in place; resumes from `ckpt` when it exists (model, optimizer, step, generator, and what is left
    of the epoch's shuffle order, so a resumed run ends with the same weights as an uninterrupted one; the
    file is read with weights_only=True: data, never code). Returns stats."""
    cfg.validate()
    params = [p for p in d.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    steps_per_epoch = math.ceil(len(train_seqs) / cfg.accum)
    total = max(1, int(round(cfg.epochs * steps_per_epoch)))
    gen = torch.Generator().manual_seed(cfg.seed)
    step, hist = 0, []
    order: list[int] = []
    if ckpt is not None and ckpt.exists():
        try:  # data only: weights_only refuses any pickled code (a planted checkpoint cannot run anything)
            state = torch.load(ckpt, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 -- any unreadable checkpoint is one line, never code
            raise ConfigError(f"{ckpt}: not a training checkpoint this version can read ({type(exc).__name__}); "
                              "remove it to start over") from None
        if not isinstance(state, dict) or state.get("train_config") != asdict(cfg):
            raise ConfigError(f"{ckpt}: a checkpoint of other training settings; remove it or use the same ones")
        d.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        gen.set_state(state["gen"])
        step, hist = state["step"], [tuple(h) for h in state["hist"]]
        order = [int(i) for i in state.get("order", [])]  # the epoch's shuffle order not yet consumed
        log(f"resumed from {ckpt} at step {step}/{total}")
    bar = progress_bar(total=total, leave=True, initial=step, desc="train drafter", unit="step", disable=not progress)
    t0 = time.perf_counter()
    d.train()
    while step < total:
        if not order:
            order = torch.randperm(len(train_seqs), generator=gen).tolist()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, cfg)
        opt.zero_grad(set_to_none=True)
        ce_sum = bce_sum = 0.0
        for _ in range(cfg.accum):
            if not order:
                break
            st = train_seqs[order.pop()]
            anchors = sample_anchors(st, cfg.anchors, gen)
            if len(anchors) == 0:
                continue
            loss, ce, bce, _ = losses(d, st, anchors, cfg.conf_weight)
            (loss / cfg.accum).backward()
            ce_sum += float(ce)
            bce_sum += float(bce)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        hist.append((step, ce_sum / cfg.accum, bce_sum / cfg.accum))
        bar.update(1)
        bar.set_postfix(ce=f"{ce_sum / cfg.accum:.3f}", conf=f"{bce_sum / cfg.accum:.3f}")
        if step % 100 == 0 and not progress:
            log(f"step {step}/{total}  ce {ce_sum / cfg.accum:.3f}  conf bce {bce_sum / cfg.accum:.3f}  "
                f"{time.perf_counter() - t0:.0f} s")
        if ckpt is not None and (step % cfg.checkpoint_every == 0 or step == total):
            tmp = own_path(ckpt, "part")
            try:  # the epoch's remaining order too: a resumed run is bit for bit the uninterrupted one
                torch.save({"model": d.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(), "step": step,
                            "hist": hist, "order": list(order), "train_config": asdict(cfg)}, tmp)
                os.replace(tmp, ckpt)
            finally:
                tmp.unlink(missing_ok=True)
    bar.close()
    d.eval()
    return {"steps": total, "hist": hist, "seconds": time.perf_counter() - t0}


@torch.no_grad()
def heldout_loss(d: DSparkDrafter, seqs: list[SeqTensors]) -> dict:
    """Teacher-forced CE and per-position top-1 agreement on every valid anchor of held-out sequences."""
    ce_n = ce_sum = 0.0
    hit = torch.zeros(d.cfg.block)
    tot = torch.zeros(d.cfg.block)
    for st in seqs:
        anchors = torch.nonzero(st.valid[1:, 0]).squeeze(1) + 1
        for ch in anchors.split(256):
            _, ce, _, (h, t) = losses(d, st, ch, 0.0)
            n = float(t.sum())
            ce_sum += float(ce) * n
            ce_n += n
            hit += h
            tot += t
    return {"ce": ce_sum / max(ce_n, 1), "top1_per_pos": (hit / tot.clamp(min=1)).tolist()}


__all__ = ["TrainConfig", "split", "reduced_vocab", "prepare", "train", "heldout_loss", "forward_anchors",
           "SeqTensors"]
