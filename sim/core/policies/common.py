"""Shared tensor helpers of the allocation policies: survival, step cost, goodput, budgets, top-B masks.

Everything here is batched torch with no host synchronisation (no `.item()`, `.cpu()`, `.tolist()`,
no branch on tensor values), so it runs unchanged on the CPU in the simulator, on the GPU inside an
asynchronous step, and under `torch.compile(fullgraph=True)`.

Notation (units): R requests, K slots per chain; survival a_j = p_1 * ... * p_j (probability, no unit);
costs in milliseconds; goodput G = expected emitted tokens per millisecond of step time:

    G = (N + sum of admitted survivals) / (draft_ms + verify_ms[T + admitted slots])   [tokens / ms]

where N = batch.num_sampling (requests that sample a token: every decoding request emits its bonus token,
and a prefill chunk that completes its prefill samples one) and T = non-draft tokens of the step.
Budgets B are capped at batch.max_draft_tokens (vLLM's logits-buffer cap) when the engine gives one.
"""
from __future__ import annotations

from typing import Union

import torch

from sim.core.policies.base import CHAIN_MODEL, CHAIN_NGRAM, CHAIN_NONE, Allocation, StepBatch

Scalar = Union[float, torch.Tensor]


CONST: dict = {}


def arange(n: int, device) -> torch.Tensor:
    """torch.arange(n), cached per (n, device) in eager mode: the simulator calls policies thousands of
    times per second on tiny tensors, where each op's dispatch dominates. Never modify the result."""
    if torch.compiler.is_compiling():
        return torch.arange(n, device=device)
    key = ("arange", n, str(device))
    out = CONST.get(key)
    if out is None:
        out = CONST[key] = torch.arange(n, device=device)
    return out


def slot_valid(length: torch.Tensor, num_slots: int) -> torch.Tensor:
    """valid[..., j] = j < length[...]  (bool [..., K])."""
    return arange(num_slots, length.device) < length.unsqueeze(-1)


def _unrolled_scan(x: torch.Tensor, op) -> torch.Tensor:
    """The inclusive scan of `op` along the last dim as K - 1 elementwise steps, accumulated in float64 (int64 for
    integers) and cast back per element: exactly what the CPU's cumsum / cumprod compute (they accumulate in that
    type, left to right), so a compiled step stays bit-identical to eager while the compiler fuses the steps into
    its neighbours (inductor has no CPU lowering for scans: each would be a separate fallback kernel)."""
    acc_dt = torch.float64 if x.dtype.is_floating_point else torch.int64
    acc = x[..., 0].to(acc_dt)
    out = [acc.to(x.dtype)]
    for j in range(1, x.shape[-1]):
        acc = op(acc, x[..., j].to(acc_dt))
        out.append(acc.to(x.dtype))
    return torch.stack(out, -1)


def _fuse_scans(x: torch.Tensor) -> bool:
    """Whether to unroll a scan over x's last dim: only while compiling for the CPU (a shape-only decision)."""
    return torch.compiler.is_compiling() and x.device.type == "cpu" and x.shape[-1] > 0


def prefix_sum(x: torch.Tensor) -> torch.Tensor:
    """torch.cumsum(x, -1); unrolled under compile on the CPU (`_unrolled_scan`, same values)."""
    return _unrolled_scan(x, torch.add) if _fuse_scans(x) else torch.cumsum(x, -1)


def prefix_product(x: torch.Tensor) -> torch.Tensor:
    """torch.cumprod(x, -1); unrolled under compile on the CPU (`_unrolled_scan`, same values)."""
    return _unrolled_scan(x, torch.mul) if _fuse_scans(x) else torch.cumprod(x, -1)


def count_above(neg_sorted: torch.Tensor, neg_value: torch.Tensor) -> torch.Tensor:
    """#{j : neg_sorted[..., j] < neg_value[..., c]} per row and value (int64 [..., C]), for rows sorted ascending:
    torch.searchsorted(neg_sorted, neg_value) (a binary search, O(C log K)) in eager mode; under compile the same
    count as a compare-and-sum (O(C K)), which fuses into one kernel with its neighbours, where a searchsorted
    would be a fallback kernel of its own. Equal whenever each row is sorted (survivals are non-increasing)."""
    return _count_below(neg_sorted, neg_value) if torch.compiler.is_compiling() else \
        torch.searchsorted(neg_sorted, neg_value)


def _count_below(sorted_rows: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """#{j : sorted_rows[..., j] < value[..., c]} as a compare-and-sum (count_above's compiled form)."""
    return (sorted_rows.unsqueeze(-2) < value.unsqueeze(-1)).sum(-1)


def survival(conf: torch.Tensor, length: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Survival a[..., j] = prod_{i<=j} p[..., i] of the valid slots, 0 on slots j >= length[...].

    Confidences are clamped to [0, 1] so that survival is non-increasing along every row, which is
    what makes "best slots of a chain" always a prefix. Shape [..., K], dtype of `conf` (or `dtype`).
    """
    if dtype is not None:
        conf = conf.to(dtype)
    surv = prefix_product(conf.clamp(0.0, 1.0))
    return surv * slot_valid(length, conf.shape[-1])


def rank_scores(surv: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """Survival with out-of-range slots at -inf, the ranking score of a global top-B ([..., K]).
    (Real slots have survival >= 0, so `score >= 0` tells them apart.)"""
    return surv.masked_fill(~slot_valid(length, surv.shape[-1]), float("-inf"))


def verify_ms(batch: StepBatch, num_slots: torch.Tensor) -> torch.Tensor:
    """verify_cost_ms[T + num_slots], index clamped to the table (any shape of `num_slots`) [ms]."""
    table = batch.verify_cost_ms
    return table[(num_slots + batch.num_nondraft_tokens).clamp(0, table.shape[0] - 1)]


def goodput(batch: StepBatch, gain: torch.Tensor, num_slots: torch.Tensor,
            draft_ms: Scalar | None = None) -> torch.Tensor:
    """G = (N + gain) / (draft_ms + verify_ms[T + num_slots])  [tokens/ms], elementwise (broadcasting).

    gain = sum of the admitted slots' survivals (expected accepted draft tokens), num_slots = admitted
    slots; N = batch.num_sampling, the requests that sample a token (each emits one bonus token).
    draft_ms defaults to the batch's draft_cost_ms; a tensor broadcasting against `gain` prices several
    drafter sets at once.
    """
    step_ms = verify_ms(batch, num_slots).to(gain.dtype) + (batch.draft_cost_ms if draft_ms is None else draft_ms)
    return (gain + batch.num_sampling) / step_ms


def cap_budget(batch: StepBatch, budget: torch.Tensor) -> torch.Tensor:
    """min(budget, batch.max_draft_tokens) [draft slots]; unchanged when the engine gives no cap."""
    if batch.max_draft_tokens is None:
        return budget
    return budget.clamp(max=max(int(batch.max_draft_tokens), 0))


def _budget_curve(batch: StepBatch, scores: torch.Tensor, draft_ms: Scalar | None = None):
    """Sorted scores (descending, over the last two dims flattened) and G_B for B = 0..M ([..., M+1])."""
    sorted_scores = torch.sort(scores.flatten(-2), dim=-1, descending=True).values
    gains = torch.cumsum(sorted_scores.clamp(min=0.0), -1)
    gains = torch.nn.functional.pad(gains, (1, 0))  # gains[B] = S_1 + ... + S_B
    g = goodput(batch, gains, arange(gains.shape[-1], gains.device), draft_ms)
    return sorted_scores, g


def best_budget(batch: StepBatch, scores: torch.Tensor,
                draft_ms: Scalar | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Adaptive verification's budget: B* = argmax_{B=0..M} (N + S_1 + ... + S_B) / (D + V[T + B]).

    `scores` [..., R, K] holds survivals with -inf on absent slots; S is all real scores sorted
    descending. B ranges over 0..min(number of real slots, batch.max_draft_tokens) (vLLM truncates the
    sorted scores at the cap before its argmax); ties go to the smallest B (first maximum, as numpy's
    argmax). Returns (B* int64 [...], the scores sorted descending [..., R*K], -inf last).
    draft_ms: as in `goodput` (one draft cost per leading index, e.g. [S, 1]).
    """
    sorted_scores, g = _budget_curve(batch, scores, draft_ms)
    # B beyond the real slots is unreachable: sorted[B-1] = -inf there
    reachable = torch.nn.functional.pad(sorted_scores >= 0, (1, 0), value=True)
    if batch.max_draft_tokens is not None:  # and so is B beyond the logits-buffer cap
        reachable = reachable & (arange(g.shape[-1], g.device) <= max(int(batch.max_draft_tokens), 0))
    g = g.masked_fill(~reachable, float("-inf"))
    return torch.argmax(g, dim=-1), sorted_scores


def early_stop_budget(batch: StepBatch, scores: torch.Tensor) -> torch.Tensor:
    """DSpark Algorithm 1: B = number of leading slots (descending survival) each of which raises G.

    G_B as in `best_budget`; B_es = max{B : G_1 > G_0, G_2 > G_1, ..., G_B > G_{B-1}} (int64 [...]).
    """
    sorted_scores, g = _budget_curve(batch, scores)
    rises = (g[..., 1:] > g[..., :-1]) & (sorted_scores >= 0)
    return cap_budget(batch, torch.cumprod(rises.to(torch.int64), -1).sum(-1))


def top_b_counts(scores: torch.Tensor, budget: torch.Tensor) -> torch.Tensor:
    """Admitted count per request of the global top-`budget` slots of `scores` [R, K] (-inf = absent).

    Host-sync free top-B with a tensor B: stable descending sort of all slots, admit rank < B, drop
    absent slots. Survival is non-increasing along a row and the sort is stable, so the admitted slots
    of each row form a prefix and the count says it all. Returns int64 [R].
    """
    flat = scores.flatten()
    order = torch.argsort(flat, descending=True, stable=True)
    win = torch.zeros_like(flat, dtype=torch.bool).scatter(0, order, arange(flat.shape[0], flat.device) < budget)
    return (win & (flat >= 0)).view(scores.shape).sum(1)


def finish(chain: torch.Tensor, admitted: torch.Tensor) -> Allocation:
    """Normalise an allocation: int64, and chain = NONE wherever nothing is admitted."""
    admitted = admitted.to(torch.int64)
    chain = torch.where(admitted > 0, chain.to(torch.int64), torch.full_like(admitted, CHAIN_NONE))
    return Allocation(chain=chain, admitted=admitted)


__all__ = [
    "CHAIN_MODEL", "CHAIN_NGRAM", "CHAIN_NONE", "arange", "slot_valid", "survival", "rank_scores", "verify_ms",
    "goodput", "cap_budget", "best_budget", "early_stop_budget", "top_b_counts", "finish",
]
