"""Live n-gram (prompt-lookup) drafter of the real engine: batched torch ops over a device token history.

The simulator precomputes the n-gram proposals of a whole request offline (`sim.core.drafters.ngram`); the real
engine drafts them step by step for the running batch, on the CPU or the GPU, without host synchronisation
(no `.item()`, `.cpu()`, `.tolist()`, `nonzero`, no branch on tensor values; output shapes depend only on
the input shapes), so the drafter can sit inside an asynchronous step or a CUDA graph. `HistoryBuffer`
keeps every running request's context (prompt + output so far) on the device for it.

Matching rule (exactly that of `sim.core.drafters.ngram`, vLLM's GPU n-gram speculator): for a context c of
length t, for n from n_max down to n_min, look for an earlier occurrence of the suffix c[t-n:t], an end
e with n <= e < t and c[e-n:e] = c[t-n:t]; take the largest n that has one and, for it, the rightmost
occurrence (largest e). The proposal is c[e : min(e + k, t)], a chain of 1..k tokens.

Formulation (Q = n_max; ends e in 0..L-1 of a [R, L] history h; t_r the length of row r):

    same_q[r, e]  = h[r, e-1-q] == h[r, t_r-1-q]                       (q = 0..Q-1; one compare each)
    match_n[r, e] = same_0 & ... & same_{n-1} = match_{n-1} & same_{n-1}   (c[e-n:e] == c[t-n:t])
    m[r, e]       = match_1 + ... + match_Q   (the match sets are nested: the matched suffix length, <= Q)
    cap[r, e]     = e if e < t_r else 0       (e is an occurrence for n iff m >= n, e >= n and e < t)
    key[r, e]     = min(m, cap) * L + e
    best[r]       = max_e key[r, e];  n* = best // L,  e* = best % L;  no match when n* < n_min

The largest key is the largest matched n, then the rightmost end for it: exactly the rule. same_q reads h
through a view shifted by q+1 columns of the history left-padded with Q columns, so a compare is one pass
over [R, L] with no copy; the pad is read only at ends e < q+1 <= n, which the cap removes, and an end
e < t reads only context tokens (e-1-q <= t-2), so whatever lies past a row's length never matters.
Cost: Q compares, ands and adds plus a handful of passes and one max over [R, L], all on history.device;
memory O(R * L) live at a time (O(R * L * n_max) if every same_q were kept). Default config, one CPU
core: about 0.4 ms for R=1 (op dispatch) up to about 1 ms for R=16, L=4096.

Calibrator features (`features=True`; those of `sim.core.drafters.ngram.ngram_tables`, same definitions):

    occ[r] = #{e : min(m, cap)[r, e] >= n*}   earlier ends of the matched n-gram (n* <= e < t): one more
                                             compare and sum over the capped m that the search built anyway
    ext[r] = #leading q in 0..X-1 with e*-1-q >= 0 and c[t-1-q] == c[e*-1-q]   (X = min(cfg.ext_max, L))
             = the longest common suffix of c[:t] and c[:e*], capped at ext_max (ext <= e* < L, so the cap
             min(ext_max, L) is the same value); one gather of 2 * X tokens and a cumulative product.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np
import torch

from sim.core.drafters.ngram import NgramConfig
from sim.core.policies.common import arange

__all__ = ["NgramProposal", "propose_ngram", "HistoryBuffer", "PAD_TOKEN"]

PAD_TOKEN = -1  # value of `NgramProposal.tokens` past each chain's length


@dataclass
class NgramProposal:
    """n-gram proposals of a batch of R requests (int64 tensors on the history's device).

    start [R]     index in the context of the first proposed token (-1 = no proposal)
    length [R]    chain length, 0..cfg.k (0 = no proposal)
    n [R]         matched suffix length (0 = no match)
    tokens [R, k] proposed tokens: history[r, start + j] for j < length[r], PAD_TOKEN elsewhere
    ext [R]       (features=True only, else None) longest common suffix of c[:t] and c[:start], capped at
                  cfg.ext_max (0 = no match; >= n when matched)
    occ [R]       (features=True only, else None) earlier ends e of the matched n-gram, n <= e < t
                  (0 = no match; >= 1 when matched)
    """

    start: torch.Tensor
    length: torch.Tensor
    n: torch.Tensor
    tokens: torch.Tensor
    ext: Optional[torch.Tensor] = None
    occ: Optional[torch.Tensor] = None


def _equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a == b (broadcasting). On the CPU as not(a xor b): integer ops, 2-4x faster there than `==`, whose
    bool output is not vectorised; one kernel (`==`) elsewhere, where launches dominate."""
    if a.device.type == "cpu":
        return torch.logical_not(a ^ b)
    return a == b


def propose_ngram(history: torch.Tensor, lengths: torch.Tensor, cfg: NgramConfig = NgramConfig(), *,
                  features: bool = False) -> NgramProposal:
    """n-gram proposal of every request of a batch (rule and formulation in the module docstring).

    history: integer [R, L], history[r, :lengths[r]] the context of request r (entries past the length are
    ignored, any value); lengths: integer [R], 0 <= lengths[r] <= L. features: also compute the calibrator
    features ext and occ (otherwise None). Host-sync free; all outputs on history.device.
    """
    R, L = history.shape
    dev = history.device
    k = cfg.k
    t = lengths.to(torch.int64)
    if L == 0:  # shape-only branch: no context anywhere, nothing to propose
        none = torch.full((R,), -1, dtype=torch.int64, device=dev)
        zero = torch.zeros_like(none)
        return NgramProposal(none, zero, zero, torch.full((R, k), PAD_TOKEN, dtype=torch.int64, device=dev),
                             ext=zero if features else None, occ=zero if features else None)
    Q = cfg.n_max
    # hp[:, Q + p] = history[:, p]; the Q pad columns are only read at ends e < n, cut off by the cap below.
    hp = torch.nn.functional.pad(history, (Q, 0))
    # last[:, q] = c[t-1-q] (clamped index when t <= q: such a suffix is never used, see the cap e >= m)
    last = torch.gather(history, 1, (t.unsqueeze(1) - 1 - arange(Q, dev)).clamp(0, L - 1))
    # int32 keys while m * L + e fits (a shape-only choice)
    idx_t = torch.int32 if (Q + 1) * L < 2**31 else torch.int64
    ends = arange(L, dev).to(idx_t)
    match = m = None
    for q in range(Q):
        # c[e-1-q] == c[t-1-q] for every end e (columns Q-1-q .. Q-1-q+L-1 of hp: a view, no copy)
        same = _equal(hp[:, Q - 1 - q: Q - 1 - q + L], last[:, q: q + 1])
        if match is None:
            match, m = same, same.to(torch.uint8)
        else:
            match = match & same
            m += match.view(torch.uint8)  # match_{q+1} is inside match_q: m counts the matched suffix length
    # e is an occurrence for n iff m[e] >= n and n <= e < t: cap m by e, and by 0 from t on
    # (cap = e * clamp(t - e, 0, 1): integer ops again); the best (n, e) is the largest capped m, then e
    cap = ends * (t.to(idx_t).unsqueeze(1) - ends).clamp_(0, 1)
    m_cap = torch.minimum(m.to(idx_t), cap)
    key = m_cap * L + ends
    best = key.amax(dim=1).to(torch.int64)
    best_n = best // L
    found = best_n >= cfg.n_min
    best_n = torch.where(found, best_n, 0)
    best_e = torch.where(found, best % L, -1)
    matched = best_e >= 0
    length = torch.where(matched, torch.clamp(t - best_e, max=k), 0)
    j = arange(k, dev)
    src = (best_e.clamp(min=0).unsqueeze(1) + j).clamp(max=L - 1)
    tokens = torch.gather(history, 1, src).to(torch.int64)
    tokens = torch.where(j < length.unsqueeze(1), tokens, PAD_TOKEN)
    prop = NgramProposal(start=best_e, length=length, n=best_n, tokens=tokens)
    if features:
        # every end whose capped match length reaches n* is an occurrence of the matched n-gram (n* = 0,
        # no match, is masked: every end would count)
        prop.occ = ((m_cap >= best_n.to(idx_t).unsqueeze(1)) & found.unsqueeze(1)).sum(dim=1)
        X = min(cfg.ext_max, L)  # ext <= e* <= L - 1: capping the scan at L changes nothing
        q = arange(X, dev)
        a = (t.unsqueeze(1) - 1 - q).clamp(0, L - 1)
        b = best_e.unsqueeze(1) - 1 - q  # < 0 past the history start and for every q when unmatched
        same = (b >= 0) & _equal(torch.gather(history, 1, a), torch.gather(history, 1, b.clamp(0, L - 1)))
        # the leading run of matches = the first mismatch's index (X if none): one fusable reduction
        prop.ext = torch.where(same, X, q).amin(dim=1)
    return prop


TokenIds = Union[torch.Tensor, np.ndarray, Sequence[int]]


class HistoryBuffer:
    """Token history of the running requests on the device: [max_reqs, max_len] int64 plus lengths [max_reqs].

    A request owns a slot from `reset(slot, prompt_ids)` until the slot is reset for another. Capacity:
    tokens appended past max_len are dropped (written to a spare column, the length stays at max_len),
    so size max_len to the engine's maximum sequence length; nothing is checked on the device.
    """

    def __init__(self, max_reqs: int, max_len: int, device: torch.device | str = "cpu"):
        if max_reqs < 1 or max_len < 1:
            raise ValueError(f"HistoryBuffer needs max_reqs >= 1 and max_len >= 1, got {max_reqs}, {max_len}")
        self.max_reqs = max_reqs
        self.max_len = max_len
        self.device = torch.device(device)
        # one spare column past max_len takes the tokens that overflow a slot
        self._tokens = torch.zeros(max_reqs, max_len + 1, dtype=torch.int64, device=self.device)
        self.lengths = torch.zeros(max_reqs, dtype=torch.int64, device=self.device)

    def reset(self, slot: int, prompt_ids: TokenIds) -> None:
        """Start slot `slot` with context prompt_ids (host or device ids; copied)."""
        ids = torch.as_tensor(prompt_ids, dtype=torch.int64).to(self.device).reshape(-1)
        P = ids.shape[0]
        if P > self.max_len:
            raise ValueError(f"prompt of {P} tokens exceeds the history capacity {self.max_len}")
        if not 0 <= slot < self.max_reqs:
            raise ValueError(f"slot {slot} out of range 0..{self.max_reqs - 1}")
        self._tokens[slot, :P] = ids
        self.lengths[slot] = P

    def append(self, slots: TokenIds, tokens_flat: TokenIds, counts: TokenIds) -> None:
        """Append counts[b] tokens to slot slots[b] for every b, read in order from tokens_flat.

        tokens_flat [sum(counts)] holds the tokens of slots[0], then slots[1], ... (e.g. the accepted draft
        tokens plus the bonus token of each request of a step). Batched (one scatter, no per-request loop),
        host-sync free when the inputs are device tensors; slots must be distinct.
        """
        dev = self.device
        slots = torch.as_tensor(slots, dtype=torch.int64).to(dev).reshape(-1)
        toks = torch.as_tensor(tokens_flat, dtype=torch.int64).to(dev).reshape(-1)
        counts = torch.as_tensor(counts, dtype=torch.int64).to(dev).reshape(-1)
        N = toks.shape[0]
        # owner[i] = b of flat token i; its offset inside request b's tokens
        owner = torch.repeat_interleave(arange(slots.shape[0], dev), counts, output_size=N)
        first = torch.cumsum(counts, 0) - counts
        row = slots[owner]
        col = self.lengths[row] + arange(N, dev) - first[owner]
        self._tokens.index_put_((row, col.clamp(max=self.max_len)), toks)
        self.lengths.index_put_((slots,), (self.lengths[slots] + counts).clamp(max=self.max_len))

    def view(self, slots: TokenIds, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(history [R, W], lengths [R]) of slots (a copy), W = width or max_len.

        `width` (a host-side bound >= every selected length, e.g. tracked by the scheduler) trims the
        columns, and the n-gram search with them (its cost is linear in W).
        """
        slots = torch.as_tensor(slots, dtype=torch.int64).to(self.device).reshape(-1)
        W = self.max_len if width is None else min(int(width), self.max_len)
        return self._tokens[slots, :W], self.lengths[slots]
