"""Training the vLLM-architecture drafter (real/drafter/qwen3_dspark.py) on teacher-forced labels
(real/drafter/labels.py): DSpark's recipe scaled down.

Labels per anchor a and block slot k as real/drafter/train.py `prepare` (valid while the text agrees with the
target's greedy tokens); the Markov head is teacher forced on the accepted prefix.

Loss, per valid slot (a, k), weighted by the position decay w_k = exp(-k / gamma):
    L = 0.9 * L1(p_k, q_k) + 0.1 * CE(q_k, g_{a+k})
  q_k = softmax(l_k) over the drafter's vocabulary; p_k the target's distribution at position a+k, known on its
  top-k ids only: L1 = sum_{i in top-k, i in V} |q_i - p_i| + sum_{i in top-k, i not in V} p_i + (1 - sum_{i in
  top-k, i in V} q_i) (the draft's mass outside the target's top-k counted as error; exact when the target's
  mass outside its top-k is 0). CE is skipped for a label outside V. Logits are computed only on valid slots.
Confidence head: binary cross-entropy of its raw logit (detached inputs) against the acceptance the engine
will see at temperature 0, y = 1{argmax l_k = g_{a+k}} (DSpark's soft label min(1, p(x)/q(x)) at temperature
0), weight `conf_weight`. vLLM applies the head raw, so it is trained to be calibrated raw.

Input scaling (`input_scale`): fc is trained as W_fc (s * h_j) with s_i = 1 / RMS of dimension i over the
training states (fixed before step 0), then W_fc diag(s) is saved: the same function in vLLM's layout. Without
it, fc at its init reads mostly the target's outlier dimensions (DSparkV.in_scale says why).

Steps: one sequence per optimizer step (its context computed once, `anchors` anchors sampled among those with
a valid slot 0), AdamW, warmup then cosine to 10%. Checkpoints every `checkpoint_every` steps and at a wall
deadline (`deadline_s`): model, optimizer, step, RNG, shuffle order and learning-curve points; a rerun with the
same settings resumes. Learning curve: every `eval_every` steps, held-out teacher-forced top-1 per slot and
tau_tf = 1 + sum_k prod_{i<=k} top1_i against labelled positions seen so far and the process's CPU seconds
(the budget that matters on a shared machine, unlike wall time).
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from sim.infra.errors import ConfigError
from real.drafter.qwen3_dspark import DSparkV
from real.drafter.train import SeqTensors, lr_at, sample_anchors
from sim.infra.fsio import own_path


@dataclass(frozen=True)
class VTrainConfig:
    steps: int = 2000
    anchors: int = 256
    lr: float = 3e-4              # 1e-3 on one-sequence steps undoes the warm start
    weight_decay: float = 0.01
    warmup: int = 40
    gamma: float = 4.0            # position decay
    l1_weight: float = 0.9
    ce_weight: float = 0.1
    conf_weight: float = 0.2
    seed: int = 0
    checkpoint_every: int = 50
    eval_every: int = 100
    deadline_s: float = 0.0       # stop (and checkpoint) after this many seconds of this run; 0: none
    input_scale: bool = True      # train fc on s * h, s = 1 / per-dimension RMS of the training states (folded)
    # warmup/epochs do not depend on the deadline: a resumed run continues the same schedule
    # (`total`: the cosine's length in steps)

    def validate(self) -> None:
        for k in ("steps", "anchors", "warmup", "checkpoint_every", "eval_every"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"train config: {k} must be a positive integer, got {v!r}")
        if not (0 < self.lr <= 1 and math.isfinite(self.lr)) or not (self.gamma > 0 and math.isfinite(self.gamma)):
            raise ConfigError(f"train config: lr must be in (0, 1] and gamma positive, got lr {self.lr!r}, "
                              f"gamma {self.gamma!r}")
        ws = (self.l1_weight, self.ce_weight, self.conf_weight, self.weight_decay)
        if not all(isinstance(w, (int, float)) and math.isfinite(w) and w >= 0 for w in ws):
            raise ConfigError(f"train config: loss weights and weight decay must be finite and >= 0, got L1 "
                              f"{self.l1_weight!r}, CE {self.ce_weight!r}, confidence {self.conf_weight!r}, "
                              f"weight decay {self.weight_decay!r}")
        if self.l1_weight + self.ce_weight <= 0:
            raise ConfigError(f"train config: loss weights must be >= 0 and not both 0, got L1 {self.l1_weight}, "
                              f"CE {self.ce_weight}")

    def schedule_key(self) -> dict:
        """The settings a checkpoint must share with the run that resumes it (not the deadline)."""
        d = asdict(self)
        d.pop("deadline_s")
        return d


def targets_at(st: SeqTensors, anchors: torch.Tensor, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's top-k ids and probabilities at positions a+k: [B, K, topk] each (clamped at the end;
    such slots are never valid)."""
    Fw = st.topk_ids.shape[0]
    idx = (anchors[:, None] + torch.arange(K)[None, :]).clamp(max=Fw - 1)
    return st.topk_ids[idx].long(), st.topk_p[idx].float()


def v_losses(d: DSparkV, st: SeqTensors, anchors: torch.Tensor, cfg: VTrainConfig, ctx=None):
    """(loss, parts dict, per-slot (hits [K], valid [K])) of one sequence's anchors. `ctx`: precomputed
    sequence_context (held-out evaluation reuses it)."""
    K, V = d.cfg.block, d.cfg.vocab
    c, ck, cv = ctx if ctx is not None else d.sequence_context(st.feats, st.next_tok)
    mask = d.visible(c.shape[0], anchors)
    lab = st.labels[anchors]                                                   # [B, K] target ids, -1 outside
    valid = st.valid[anchors]
    prev = torch.cat([st.tokens[anchors][:, None], lab[:, :-1].clamp(min=0)], 1)
    u, m, raw = d.teacher_forced(st.tokens[anchors], anchors, ck, cv, mask, prev)
    sel = valid.nonzero(as_tuple=True)
    logits = d.slot_logits(u[sel], m[sel]).float()                             # [N, V]
    q = torch.softmax(logits, dim=-1)
    tid, tp = targets_at(st, anchors, K)
    tid, tp = tid[sel], tp[sel]                                                # [N, topk]
    r = d.to_reduced[tid]
    inv = r < V
    q_at = q.gather(-1, r.clamp(max=V - 1)) * inv
    l1 = (torch.where(inv, (q_at - tp).abs() - q_at, tp)).sum(-1) + 1.0        # [N]
    lab_r = d.to_reduced[lab[sel]]
    lab_in = lab_r < V
    ce = torch.where(lab_in, F.cross_entropy(logits, lab_r.clamp(max=V - 1), reduction="none"),
                     torch.zeros_like(l1))
    w = torch.exp(-sel[1].float() / cfg.gamma)
    main = (w * (cfg.l1_weight * l1 + cfg.ce_weight * ce)).sum() / w.sum().clamp(min=1e-9)
    hit = (logits.detach().argmax(-1) == lab_r) & lab_in
    bce = F.binary_cross_entropy_with_logits(raw[sel], hit.float())
    loss = main + cfg.conf_weight * bce
    hits = torch.zeros(K).index_add_(0, sel[1], hit.float())
    tot = torch.zeros(K).index_add_(0, sel[1], torch.ones_like(hit, dtype=torch.float))
    return loss, {"l1": float(l1.detach().mean()), "ce": float(ce.detach()[lab_in].mean()) if lab_in.any() else 0.0,
                  "bce": float(bce.detach()), "slots": int(len(sel[0]))}, (hits, tot)


def input_scale(seqs: list[SeqTensors]) -> torch.Tensor:
    """s_i = 1 / sqrt(mean_j h_ji^2) over every position j >= 1 of `seqs` (floored at 1e-3 RMS): [L*D] fp32.
    Position 0 is left out: its massive activations (up to ~10^3 in a few dimensions) would shrink every other
    position's scaled state about 10x in those dimensions."""
    sq, n = None, 0
    for st in seqs:
        x = st.feats[1:].float()
        sq = x.pow(2).sum(0) if sq is None else sq + x.pow(2).sum(0)
        n += x.shape[0]
    return 1.0 / (sq / max(n, 1)).sqrt().clamp(min=1e-3)


@torch.no_grad()
def heldout_curve_point(d: DSparkV, held: list[SeqTensors], cfg: VTrainConfig, anchors: int = 64) -> dict:
    """Teacher-forced top-1 per slot on held-out sequences (fixed anchors: the first `anchors` valid ones
    spread evenly) and tau_tf = 1 + sum_k prod_{i<=k} top1_i."""
    d.eval()
    K = d.cfg.block
    hit, tot = torch.zeros(K), torch.zeros(K)
    for st in held:
        ok = torch.nonzero(st.valid[1:, 0]).squeeze(1) + 1
        if len(ok) == 0:
            continue
        a = ok[torch.linspace(0, len(ok) - 1, min(anchors, len(ok))).long()].unique()
        _, _, (h, t) = v_losses(d, st, a, cfg)
        hit += h
        tot += t
    d.train()
    top1 = (hit / tot.clamp(min=1)).tolist()
    surv, tau = 1.0, 1.0
    for p in top1:
        surv *= p
        tau += surv
    return {"top1": top1, "tau_tf": tau}


def train_v(d: DSparkV, train_seqs: list[SeqTensors], held: list[SeqTensors], cfg: VTrainConfig,
            ckpt: Path | None, log=print) -> dict:
    """Train in place, resuming from `ckpt` (data only, weights_only) when it holds the same schedule.
    Returns {"steps_done", "hist", "curve", "labelled", "seconds", "finished"}."""
    cfg.validate()
    params = [p for p in d.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    gen = torch.Generator().manual_seed(cfg.seed)
    step, hist, curve, labelled = 0, [], [], 0
    order: list[int] = []
    if ckpt is not None and ckpt.exists():
        try:
            state = torch.load(ckpt, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 -- one line, never code
            raise ConfigError(f"{ckpt}: not a training checkpoint this version can read ({type(exc).__name__}); "
                              "remove it to start over") from None
        if not isinstance(state, dict) or state.get("train_config") != cfg.schedule_key():
            raise ConfigError(f"{ckpt}: a checkpoint of other training settings; remove it or use the same ones")
        d.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        gen.set_state(state["gen"])
        step, hist, curve = state["step"], [list(h) for h in state["hist"]], [dict(c) for c in state["curve"]]
        labelled, order = int(state["labelled"]), [int(i) for i in state["order"]]
        d.in_scale = state.get("in_scale")
        log(f"resumed from {ckpt} at step {step}/{cfg.steps} ({labelled} labelled positions seen)")

    if cfg.input_scale and d.in_scale is None:
        d.in_scale = input_scale(train_seqs)

    def save():
        if ckpt is None:
            return
        tmp = own_path(ckpt, "part")
        try:
            torch.save({"model": d.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(), "step": step,
                        "hist": hist, "curve": curve, "labelled": labelled, "order": list(order),
                        "in_scale": d.in_scale,
                        "train_config": cfg.schedule_key()}, tmp)
            os.replace(tmp, ckpt)  # whole or not at all
        finally:
            tmp.unlink(missing_ok=True)

    t0 = time.perf_counter()
    c0 = time.process_time() - (curve[-1].get("cpu_s", 0.0) if curve else 0.0)  # CPU seconds across resumes
    d.train()
    if not curve:
        curve.append({"step": 0, "labelled": 0, **heldout_curve_point(d, held, cfg)})
        log(f"step 0: held-out tau_tf {curve[-1]['tau_tf']:.3f}")
    finished = True
    while step < cfg.steps:
        if cfg.deadline_s and time.perf_counter() - t0 > cfg.deadline_s:
            finished = False
            break
        if not order:
            order = torch.randperm(len(train_seqs), generator=gen).tolist()
        st = train_seqs[order.pop()]
        anchors = sample_anchors(st, cfg.anchors, gen)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg.steps, _Sched(cfg.lr, cfg.warmup))
        opt.zero_grad(set_to_none=True)
        if len(anchors):
            loss, parts, _ = v_losses(d, st, anchors, cfg)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            labelled += parts["slots"]
            hist.append([step + 1, round(parts["l1"], 4), round(parts["ce"], 4), round(parts["bce"], 4), labelled])
        step += 1
        if step % 10 == 0 and hist:
            h = hist[-1]
            log(f"step {step}/{cfg.steps}  L1 {h[1]:.3f}  CE {h[2]:.3f}  conf BCE {h[3]:.3f}  labelled {labelled}  "
                f"{time.perf_counter() - t0:.0f} s wall, {time.process_time() - c0:.0f} CPU s  "
                f"load {os.getloadavg()[0]:.2f}")
        if step % cfg.eval_every == 0 or step == cfg.steps:
            curve.append({"step": step, "labelled": labelled, "cpu_s": time.process_time() - c0,
                          **heldout_curve_point(d, held, cfg)})
            log(f"step {step}: held-out tau_tf {curve[-1]['tau_tf']:.3f} at {labelled} labelled positions seen, "
                f"{curve[-1]['cpu_s']:.0f} CPU s; top-1 " + " ".join(f"{x:.2f}" for x in curve[-1]["top1"]))
        if step % cfg.checkpoint_every == 0:
            save()
    if not finished and (not curve or curve[-1]["step"] != step):
        curve.append({"step": step, "labelled": labelled, "cpu_s": time.process_time() - c0,
                      **heldout_curve_point(d, held, cfg)})
    save()
    d.fold_input_scale()
    d.eval()
    return {"steps_done": step, "hist": hist, "curve": curve, "labelled": labelled,
            "seconds": time.perf_counter() - t0, "finished": finished}


@dataclass(frozen=True)
class _Sched:  # the two fields real/drafter/train.lr_at reads
    lr: float
    warmup: int


__all__ = ["VTrainConfig", "v_losses", "train_v", "heldout_curve_point", "targets_at"]
