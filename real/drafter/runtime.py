"""The drafter inside an engine: per-slot context caches fed by the target's verify forwards, one batched draft.
Either drafter architecture (real/drafter/model.py, real/drafter/qwen3_dspark.py: vLLM's) runs here: each says
its cached entry's shape (`kv_entry_shape`) and the RoPE position of context entry j (j + `ctx_pos_offset`).

For a request in slot s whose context is t_0..t_a (t_a the last emitted token, not yet run by the target), the
cache holds the drafter's context entries j = 0..a-1 (keys, values: [max_len, KV, hd]) and c_{a-1}. After
each target forward the engine appends, for every row j whose following token is now known, c_j =
context(h_j, t_{j+1}) (real/drafter/model.py): prefill rows, and on a decode row the last emitted token and
the accepted drafts (a rejected draft's row is overwritten later: entries past ctx_len are never read).
"""
from __future__ import annotations

import torch

from real.drafter.model import DraftOut, DSparkDrafter


class DrafterCache:
    """Context keys/values of `slots` requests of up to `max_len` tokens each, on the drafter's device."""

    def __init__(self, drafter: DSparkDrafter, slots: int, max_len: int) -> None:
        cfg = drafter.cfg
        p = next(drafter.parameters())
        self.d = drafter
        self.k = torch.zeros(slots, max_len, *drafter.kv_entry_shape, device=p.device, dtype=p.dtype)
        self.v = torch.zeros_like(self.k)
        self.c_last = torch.zeros(slots, cfg.hidden, device=p.device, dtype=p.dtype)
        self.ctx_len = torch.zeros(slots, dtype=torch.int64, device=p.device)
        self.max_len = max_len

    @torch.inference_mode()
    def reset(self, slot: int) -> None:
        self.ctx_len[slot] = 0

    @torch.inference_mode()
    def append(self, slots: torch.Tensor, pos: torch.Tensor, feats: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Write entries at positions pos [N] of slots [N] from the target's features [N, L*D] and the tokens
        that followed them [N]. Rows of one slot must be consecutive and ascending (its last row is c_{a-1})."""
        if slots.numel() == 0:
            return
        c = self.d.context(feats, next_tokens)
        k, v = self.d.context_kv(c, pos + self.d.ctx_pos_offset)
        self.k[slots, pos] = k
        self.v[slots, pos] = v
        # each slot's last row: positions ascend within a slot, so it is the row with the largest position
        last = torch.zeros_like(self.ctx_len).scatter_reduce(0, slots, pos + 1, "amax", include_self=False)
        touched = torch.zeros(self.ctx_len.shape[0], dtype=torch.bool, device=slots.device)
        touched[slots] = True
        self.ctx_len = torch.where(touched, last, self.ctx_len)
        is_last = (pos + 1) == self.ctx_len[slots]
        self.c_last[slots[is_last]] = c[is_last]

    @torch.inference_mode()
    def draft(self, slots: torch.Tensor, anchor_tok: torch.Tensor) -> DraftOut:
        """K-token drafts for the requests in `slots` [R], whose last emitted tokens are anchor_tok [R]."""
        n = self.ctx_len[slots]
        L = max(int(n.max()), 1)  # one host read: sizes the gather
        ck, cv = self.k[slots, :L], self.v[slots, :L]
        mask = self.d.visible(L, n)  # anchor a = ctx_len: entries 0..a-1
        return self.d.draft(ck, cv, mask, self.c_last[slots], n, anchor_tok)


__all__ = ["DrafterCache"]
