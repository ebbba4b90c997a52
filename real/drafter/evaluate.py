"""Free-running drafts over whole reference sequences, and what is measured on them: acceptance, calibration, STS.

A reference sequence is a prompt and the target's greedy output of L tokens (real/drafter/data.py), with the
target's features at every token it ran. The chain drafted at output position i (i = 0..L-1) has anchor
a = P - 1 + i (the last token before output[i]) and proposes output[i .. i+K-1]; acc_i = its leading tokens
equal to the target's, capped at L - i. This is exactly what the engine would draft at that position in a
lossless run (up to float summation order of the target's batched forwards).

  tau_walk   mean of acc_i + 1 over the positions a decode visits (i = 1, then i += acc_i + 1): tokens per
             verification step of a model-drafter-only engine; output[0] comes from the prefill
  tau_all    mean of acc_i + 1 over every position (what a position-wise replay averages)
  per_pos    P(acc >= k+1 | acc >= k), k = 0..K-1
  survival   s_ik = prod_{l<=k} c_il against y_ik = 1{acc_i >= k+1}, every slot inside the output: ECE (15 bins)
             and AUC, raw and after STS; auc_depth1: c_i0 against y_i0
  q1 copied / normal   P(acc_i >= 1) over output positions whose token is copied (the simulator's
             classification: sim/core/drafters/tables.copy_mask over the n-gram tables of prompt + output, the
             profile's copy_min_ext) and over the others (`first_position_by_copy`)
"""
from __future__ import annotations

import numpy as np
import torch

from sim.core.drafters.calibration import auc, ece
from real.drafter.data import Sequence
from real.drafter.model import DSparkDrafter
from real.drafter.train import SeqTensors, prepare

STS_GRID = np.exp(np.linspace(np.log(0.25), np.log(4.0), 97))


@torch.inference_mode()
def draft_positions(d: DSparkDrafter, st: SeqTensors, anchors: torch.Tensor, chunk: int = 256):
    """Free-running drafts at `anchors`: tokens [B, K] (target ids), calibrated conf [B, K], raw conf [B, K]."""
    dev = next(d.parameters()).device
    c, ck, cv = d.sequence_context(st.feats.to(dev), st.next_tok.to(dev))
    tokens = st.tokens.to(dev)
    toks, conf, raw = [], [], []
    for a in anchors.to(dev).split(chunk):
        B = a.shape[0]
        mask = d.visible(c.shape[0], a)
        out = d.draft(ck.expand(B, *ck.shape), cv.expand(B, *cv.shape), mask, c[a - 1], a, tokens[a])
        toks.append(out.tokens.cpu())
        conf.append(out.conf.float().cpu())
        raw.append(out.raw.float().cpu())
    return torch.cat(toks), torch.cat(conf), torch.cat(raw)


def output_chains(d: DSparkDrafter, seq: Sequence) -> dict:
    """Every output position's chain of one reference sequence: tokens [L, K], conf, raw [L, K], acc [L]."""
    K = d.cfg.block
    st = prepare(seq, K)
    P, T = seq.prompt_len, len(seq.tokens)
    L = T - P
    anchors = torch.arange(P - 1, P - 1 + L)
    anchors = anchors[anchors >= 1]
    if len(anchors) < L:  # a one-token prompt: output[0] has no context to draft from
        raise ValueError("prompt too short to draft output[0]")
    toks, conf, raw = draft_positions(d, st, anchors)
    lab = st.labels[anchors]
    valid = st.valid[anchors]
    hit = (toks == lab) & valid
    acc = torch.cumprod(hit.int(), dim=1).sum(1)
    return {"tokens": toks.numpy(), "conf": conf.numpy(), "raw": raw.numpy(), "acc": acc.numpy(),
            "inside": valid.numpy()}


def fit_sts(raw: np.ndarray, acc: np.ndarray, inside: np.ndarray) -> np.ndarray:
    """Per-position temperatures T_k (grid search, BCE) for the survival s_k = prod_{l<=k} raw_l."""
    K = raw.shape[1]
    s = np.clip(np.cumprod(raw, axis=1), 1e-6, 1 - 1e-6)
    lg = np.log(s) - np.log1p(-s)
    y = (acc[:, None] >= np.arange(1, K + 1)[None, :]).astype(np.float64)
    temps = np.ones(K)
    for k in range(K):
        m = inside[:, k]
        if m.sum() < 20:
            continue
        best = None
        for T in STS_GRID:
            p = np.clip(1 / (1 + np.exp(-lg[m, k] / T)), 1e-7, 1 - 1e-7)
            nll = -np.mean(y[m, k] * np.log(p) + (1 - y[m, k]) * np.log1p(-p))
            if best is None or nll < best[0]:
                best = (nll, T)
        temps[k] = best[1]
    return temps


def fit_platt(raw: np.ndarray, acc: np.ndarray, inside: np.ndarray) -> tuple[float, float, int]:
    """(a, b, slots): the affine map of the conditional confidence logit, c' = sigmoid(a * logit(c) + b) with
    a > 0, that minimises the binary cross-entropy against acceptance on every slot the chain reached
    (acc_i >= k) inside the labels. Unlike STS it is one map for every slot, so it folds exactly into a single
    linear confidence head (real/drafter/qwen3_dspark.DSparkV.fold_confidence_affine) and survives export;
    a > 0 keeps the order of confidences (AUC at depth 1 unchanged)."""
    K = raw.shape[1]
    m = (acc[:, None] >= np.arange(K)[None, :]) & inside
    r = np.clip(raw[m].astype(np.float64), 1e-7, 1 - 1e-7)
    z = torch.from_numpy(np.log(r) - np.log1p(-r))
    y = torch.from_numpy((acc[:, None] >= np.arange(1, K + 1)[None, :])[m].astype(np.float64))
    p = torch.zeros(2, dtype=torch.float64, requires_grad=True)  # (log a, b)
    opt = torch.optim.LBFGS([p], max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(torch.exp(p[0]) * z + p[1], y)
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return float(torch.exp(p[0]).detach()), float(p[1].detach()), int(m.sum())


def metrics(chains: list[dict], K: int) -> dict:
    """The module docstring's figures over the chains of many sequences."""
    acc = np.concatenate([c["acc"] for c in chains])
    inside = np.concatenate([c["inside"] for c in chains])
    walk = []
    for c in chains:
        i, a = 1, c["acc"]
        while i < len(a):
            walk.append(a[i] + 1)
            i += a[i] + 1
    y = acc[:, None] >= np.arange(1, K + 1)[None, :]
    reach = acc[:, None] >= np.arange(K)[None, :]
    per_pos = [float(y[reach[:, k] & inside[:, k], k].mean()) if (reach[:, k] & inside[:, k]).any() else float("nan")
               for k in range(K)]
    out = {"positions": int(len(acc)), "tau_walk": float(np.mean(walk)) if walk else float("nan"),
           "tau_all": float(np.mean(acc + 1)), "per_pos": per_pos}
    for name in ("raw", "conf"):
        c = np.concatenate([ch[name] for ch in chains])
        s = np.cumprod(c, axis=1)
        tag = "raw" if name == "raw" else "sts"
        out[f"ece_{tag}"] = ece(s[inside], y[inside].astype(np.float64))
        out[f"auc_{tag}"] = auc(s[inside], y[inside].astype(np.float64))
        out[f"auc_depth1_{tag}"] = auc(c[inside[:, 0], 0], y[inside[:, 0], 0].astype(np.float64))
    return out


def first_position_by_copy(chains: list[dict], seqs: list[Sequence]) -> dict:
    """First-position acceptance on copied and on normal output tokens (module docstring)."""
    from sim.core.drafters.calibration import NgramCalibrator
    from sim.core.drafters.model import load_drafter_profile
    from sim.core.drafters.ngram import NgramConfig, ngram_tables
    from sim.core.drafters.tables import copy_mask

    cal = NgramCalibrator.load()
    cfg = NgramConfig(n_min=cal.cfg.n_min, n_max=cal.cfg.n_max, ext_max=cal.cfg.ext_max)
    min_ext = load_drafter_profile("dspark-qwen3-b7").copy_min_ext
    hit = {True: [0, 0], False: [0, 0]}
    for c, s in zip(chains, seqs):
        tab = ngram_tables(s.tokens.astype(np.int64), s.prompt_len, cfg)
        cm = np.asarray(copy_mask(tab, min_ext), dtype=bool)[: len(c["acc"])]
        for flag in (True, False):
            sel = cm == flag
            hit[flag][0] += int((c["acc"][: len(cm)][sel] >= 1).sum())
            hit[flag][1] += int(sel.sum())
    return {"q1_copied": hit[True][0] / hit[True][1] if hit[True][1] else float("nan"), "copied": hit[True][1],
            "q1_normal": hit[False][0] / hit[False][1] if hit[False][1] else float("nan"), "normal": hit[False][1]}


def recorded_drafts(seq_id: str, chains: dict) -> dict:
    """One line of the simulator's recorded-drafts sidecar (sim.core.drafters.model.load_recorded_drafts)."""
    return {"id": seq_id, "model_conf": np.round(chains["conf"].astype(np.float64), 5).tolist(),
            "model_acc": chains["acc"].astype(int).tolist()}


__all__ = ["draft_positions", "output_chains", "fit_sts", "metrics", "recorded_drafts", "first_position_by_copy"]
