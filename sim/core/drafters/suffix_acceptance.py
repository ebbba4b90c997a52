"""The suffix drafter's online acceptance statistics: the confidences vLLM main's suffix speculator hands its adaptive
verification (the suffix drafter's `confidence: online` setting, sim/core/drafters/suffix.py).

What vLLM main does (vllm/v1/worker/gpu/spec_decode/suffix/speculator.py, Model Runner V2, with
enable_adaptive_verification; in no release the simulator models, 0.32 or 0.33). Each proposal falls in a group
g = (source, match-length bucket): source 0 for a match in the request's own context, 1 for one in the outputs of
finished requests; bucket of the matched suffix length m >= 1: m = 1..6 one bucket each, then 7-10, 11-20, 21+
(LEN_EDGES). Per group and draft position k = 0..K-1 it counts, over the run,
    accepted[g, k]   drafts at position k the target accepted
    observed[g, k]   drafts at position k whose verdict was seen: k <= a, k < v and k < n for a proposal of n valid
                     tokens of which v were verified and a accepted (the accepted ones and the first rejected one;
                     slots adaptive verification trimmed are never seen)
and the confidence of position k of a proposal in group g is the Laplace-smoothed rate
    c[g, k] = (accepted[g, k] + 1) / (observed[g, k] + 2)      [probability; 0 past the proposal's n tokens]
a conditional acceptance (position k is observed only when 0..k-1 were accepted), what adaptive verification's
survival cumprod(c) expects. Every HALF_LIFE = 1024 proposals (steps) both counts are halved (integer shift), so the
estimate follows the workload. A request's verdict comes after the step that verified its proposal (`observe`);
vLLM folds it in at the next proposal, before it drafts: the same order.

The simulator's suffix drafter is a suffix tree (Arctic Inference's idea), where vLLM main's is a GPU matcher over
the request's history and a hash-indexed corpus of finished outputs; both report the matched suffix length and
whether the match came from the request or from finished outputs, which is all the groups need.
State: two int64 arrays [2 * len(LEN_EDGES), K, 2] and a step counter, per run (one drafter per run).
"""
from __future__ import annotations

import numpy as np

# the lower edge of each match-length bucket [tokens]: 1..6 alone, then 7-10, 11-20, 21 and longer
LEN_EDGES = (1, 2, 3, 4, 5, 6, 7, 11, 21)
SOURCES = ("request", "global")  # the suffix drafter's SuffixProposal.source -> source index
HALF_LIFE = 1024  # proposals (steps) between halvings of the counts (vLLM main's _STATS_HALF_LIFE)


def group(source: np.ndarray, match_len: np.ndarray) -> np.ndarray:
    """g = source * len(LEN_EDGES) + bucket(max(m, 1)) per proposal (int64 [R]); source: index into SOURCES."""
    bucket = np.searchsorted(LEN_EDGES, np.maximum(np.asarray(match_len, dtype=np.int64), 1), side="right") - 1
    return np.asarray(source, dtype=np.int64) * len(LEN_EDGES) + bucket


class AcceptanceStats:
    """The counts of one run (module docstring) for chains of at most `k` tokens."""

    def __init__(self, k: int) -> None:
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"chain length must be an integer >= 1, got {k!r}")
        self.k = k
        self.counts = np.zeros((len(SOURCES) * len(LEN_EDGES), k, 2), dtype=np.int64)  # (accepted, observed)
        self.steps = 0

    def confidences(self, groups: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """c [R, K] of proposals in `groups` with `valid` tokens each (0 past them); counts one proposal step
        and halves the counts every HALF_LIFE of them, before drafting (vLLM's order)."""
        self.steps += 1
        if self.steps % HALF_LIFE == 0:
            self.counts >>= 1
        c = self.counts[np.asarray(groups, dtype=np.int64)]
        conf = (c[..., 0] + 1.0) / (c[..., 1] + 2.0)
        return np.where(np.arange(self.k)[None, :] < np.asarray(valid)[:, None], conf, 0.0)

    def observe(self, groups: np.ndarray, valid: np.ndarray, verified: np.ndarray, accepted: np.ndarray) -> None:
        """The verdicts of proposals in `groups` (int64 [R]) of `valid` tokens, `verified` of them verified and
        `accepted` of those accepted: position k is observed where k <= accepted, k < verified and k < valid, and
        accepted where k < accepted. A proposal with nothing verified adds nothing."""
        j = np.arange(self.k)[None, :]
        a = np.asarray(accepted, dtype=np.int64)[:, None]
        seen = (j <= a) & (j < np.asarray(verified, dtype=np.int64)[:, None]) & (j < np.asarray(valid)[:, None])
        g = np.broadcast_to(np.asarray(groups, dtype=np.int64)[:, None], seen.shape)
        pos = np.broadcast_to(j, seen.shape)
        np.add.at(self.counts[..., 0], (g[seen], pos[seen]), (pos < a)[seen].astype(np.int64))
        np.add.at(self.counts[..., 1], (g[seen], pos[seen]), 1)
