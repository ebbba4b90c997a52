"""The attention work of one engine step in a padded layout: what a profiled table's `padded` verify form prices.

The torch engine (real/engine/model.py) runs every query of at most `short_max` tokens (decodes, draft
verification) in ONE batched attention call: their keys are gathered into an [Rs, Kmax] block, padded to the
longest sequence's keys, and their queries padded to the longest query. A longer query (a prefill chunk) gets its
own call over its own keys, read in place. A lone short query is also read in place (a view, no gather). So a
step's attention cost follows the padded shape, not the sum of contexts: 16 decodes of which one has 500 cached
entries and fifteen 100 pay for 16 x 500 gathered entries, not 2000.

For the step's sequences i with q_i query tokens and k_i keys after the step (cached entries plus its own q_i):
    short = {i : q_i <= short_max},  Rs = |short|,  Qmax = max_short q_i,  Kmax = max_short k_i
    kv_gather     = Rs * Kmax                      if Rs >= 2 else 0       [KV entries copied, padded]
    kv_view       = (k_i of the lone short query   if Rs == 1) + sum_long k_i    [KV entries read in place]
    attn_rows_kv  = Rs * (Qmax - 1) * Kmax + sum_long (q_i - 1) * k_i          [query rows beyond one per
                                                                               sequence x keys they score]
With equal contexts and equal queries (Rs >= 2, no long query) kv_gather = K (the step's KV entries) and
attn_rows_kv = (T - S) K / S: the aggregate form sim/core/cost/profiled.py uses when it has no shape.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class AttentionShape(NamedTuple):
    """A step's padded attention work (module docstring); counts of KV entries and of (query row x key) pairs."""
    kv_gather: int
    kv_view: int
    attn_rows_kv: int


SHAPE_COLUMNS = AttentionShape._fields
NO_SHAPE = AttentionShape(0, 0, 0)


def padded_shape(q_lens, keys, short_max: int) -> AttentionShape:
    """The shape of a step whose sequences have q_lens query tokens and `keys` keys each (cached + own queries);
    short_max: the longest query the batched (padded) call takes."""
    q = np.asarray(q_lens, dtype=np.int64)
    k = np.asarray(keys, dtype=np.int64)
    if q.size == 0:
        return NO_SHAPE
    short = q <= short_max
    rs = int(short.sum())
    qs, ks = q[short], k[short]
    ql, kl = q[~short], k[~short]
    kmax = int(ks.max()) if rs else 0
    gather = rs * kmax if rs >= 2 else 0
    view = (int(ks[0]) if rs == 1 else 0) + int(kl.sum())
    rows = (rs * (int(qs.max()) - 1) * kmax if rs else 0) + int(((ql - 1) * kl).sum())
    return AttentionShape(gather, view, rows)
