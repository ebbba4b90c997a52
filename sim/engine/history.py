"""The engine's per-request host history: what the host knows of each request's chains before a step (the
HostView's stale chains, sim/core/policies/base.py), and its upkeep as requests are admitted, drafted and finished.

Per request: the position of its previous decode step (prev_pos) and of the last step its model drafter ran
(model_pos); the running sums of the model chains drafted for it (m_conf_sum [., K_m], m_conf_cnt) and of its
n-gram chains' confidences (ng_conf_sum [., K_n], 0 past each chain's length; ng_conf_cnt). The K-wide sums are
indexed by history slot (`_hist`): the request itself with whole-trace tables; with streaming tables a slot
taken at admission and given back when the request finishes, so they take (live requests) x K, not n x K.
`Engine` (sim/engine/engine.py) owns the arrays; this mixin holds the methods that read and keep them.
"""
from __future__ import annotations

import numpy as np

from sim.engine.forms import NATIVE_STEP, WHOLE_STEP, transcribed_by
from sim.core.scheduler import StepPlan


def ragged_slots(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The flat layout of a step's emitted slots, counts[k] for request k in turn: for each slot, its request's
    index k (`rep`) and its depth j = 0 .. counts[k] - 1 (`j`), both [sum(counts)]."""
    rep = np.repeat(np.arange(len(counts)), counts)
    return rep, np.arange(len(rep)) - np.repeat(np.cumsum(counts) - counts, counts)


class HostHistory:
    """Mixin of sim.engine.engine.Engine: the per-request host history (module docstring)."""

    def _hist(self, reqs: np.ndarray) -> np.ndarray:
        """Rows of the K-wide host-history sums of requests `reqs`."""
        return reqs if self._hslot is None else self._hslot[reqs]

    @transcribed_by(*WHOLE_STEP)
    def _admit_rows(self, plan: StepPlan) -> StepPlan:
        """Streaming tables: build the rows and take a history slot for every newly running request."""
        if self.stream and self.sched.running:
            run = np.asarray(self.sched.running, dtype=np.int64)
            new = run[~self.tb.live[run]]
            if len(new):
                self.tb.admit(new)
                for r in new.tolist():
                    self._hslot[r] = self._free_slots.pop() if self._free_slots else self._new_slot()
        return plan

    def _new_slot(self) -> int:
        """A never-used history slot, growing the K-wide sums (doubling) when they are full."""
        s, cap = self._hused, len(self.m_conf_sum)
        if s == cap:
            grow = max(cap, 64)
            self.m_conf_sum = np.concatenate([self.m_conf_sum, np.zeros((grow, self.tb.k_model))])
            self.ng_conf_sum = np.concatenate([self.ng_conf_sum, np.zeros((grow, self.tb.k_ngram))])
        self._hused = s + 1
        return s

    @transcribed_by(*WHOLE_STEP)
    def _release_rows(self, finished: list[int]) -> None:
        """Streaming tables: check each finished request's output (lossless item 3), then free its rows and slot."""
        if not (self.stream and finished):
            return
        for r in finished:
            if self._out_violation is None or r < self._out_violation[0]:
                msg = self.tb.output_violation(r, int(self.pos[r]))
                if msg:
                    self._out_violation = (r, msg)
            s = int(self._hslot[r])
            self.m_conf_sum[s] = 0.0
            self.ng_conf_sum[s] = 0.0
            self._free_slots.append(s)
            self._hslot[r] = -1
        self.tb.release(finished)

    @transcribed_by(NATIVE_STEP, *WHOLE_STEP)
    def _host_history(self, reqs: np.ndarray, srows: np.ndarray, mrows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """What the host knows of each request's chains before the step: (stale model confidences [R, K_m],
        mean n-gram confidences [R, K_n]). The model row is the chain drafted at the previous step; if the
        pass was skipped then, the mean of the chains drafted for the request so far; 1.0 on the first
        decode step since (re)admission (vLLM's reset). The n-gram row is the mean over the request's
        earlier steps (0 past each chain's length), or the previous proposal on its first step."""
        tb = self.tb
        stale_m = tb.m_conf[mrows]  # a copy (fancy indexing)
        gap = (self.model_pos[reqs] != self.prev_pos[reqs]) & (self.m_conf_cnt[reqs] > 0)
        if gap.any():
            g = reqs[gap]
            stale_m[gap] = self.m_conf_sum[self._hist(g)] / self.m_conf_cnt[g][:, None]
        stale_m[self.fresh[reqs]] = 1.0
        self.fresh[reqs] = False
        if not self.policy.uses_ngram:  # only policies that draft n-gram chains read their history
            return stale_m, None
        cnt = self.ng_conf_cnt[reqs]
        last = tb.ng_conf[srows] if self._ng_clean else tb.ng_conf[srows] * (np.arange(tb.k_ngram) < tb.ng_len[srows][:, None])
        mean_ng = np.where(cnt[:, None] > 0, self.ng_conf_sum[self._hist(reqs)] / np.maximum(cnt, 1)[:, None], last)
        return stale_m, mean_ng

    @transcribed_by(NATIVE_STEP, *WHOLE_STEP)
    def _record_drafts(self, reqs: np.ndarray, rows: np.ndarray, model_ran: bool) -> None:
        """After a step: the chains drafted in it join the requests' host-side history."""
        tb = self.tb
        if model_ran:
            self.model_pos[reqs] = self.prev_pos[reqs]
            self.m_conf_sum[self._hist(reqs)] += tb.m_conf[rows]
            self.m_conf_cnt[reqs] += 1
        if self.policy.uses_ngram:
            self.ng_conf_sum[self._hist(reqs)] += (tb.ng_conf[rows] if self._ng_clean
                                       else tb.ng_conf[rows] * (np.arange(tb.k_ngram) < tb.ng_len[rows][:, None]))
            self.ng_conf_cnt[reqs] += 1

    def _model_chain_len(self, reqs: np.ndarray, at: np.ndarray) -> np.ndarray:
        """The length of the model chains requests `reqs` drafted at output positions `at` (int64 [R]): K_m, cut to
        the output left (out_len - at) unless the run is charged as vLLM (Engine.whole_model_chain: vLLM's drafter
        does not know max_tokens); es_gather transcribes it."""
        k = self.tb.k_model
        if self.whole_model_chain:
            return np.full(len(reqs), k, dtype=np.int64)
        return np.minimum(k, self.tb.out_len[reqs] - at)

    @transcribed_by(NATIVE_STEP, *WHOLE_STEP)
    def _host_state(self, reqs: np.ndarray) -> tuple[tuple, np.ndarray | None]:
        """What the host knows of the decoding requests' chains before the step: stale = (model conf, model
        len, n-gram conf, n-gram len) of the host-side history, and the mean n-gram chain (or None)."""
        tb = self.tb
        srows = tb.offsets[reqs] + self.prev_pos[reqs]
        mrows = tb.offsets[reqs] + self.model_pos[reqs]
        stale_m_conf, mean_ng = self._host_history(reqs, srows, mrows)
        stale = (stale_m_conf, self._model_chain_len(reqs, self.model_pos[reqs]), tb.ng_conf[srows],
                 tb.ng_len[srows])
        return stale, mean_ng
