"""The hybrid's per-step work inside vLLM, as pure torch on the device: the n-gram chain, its calibrated
confidences, the per-request chain choice, and online acceptance statistics. No vLLM import (the vLLM
wiring is real/vllm_plugin/speculator.py), so all of it runs and is tested on CPU tensors.

Per step (vLLM's order; R rows of the batch, K = num_speculative_tokens):
  observe   after the target verified the previous drafts (num_sampled = accepted + 1 bonus, num_rejected):
            - per depth j and chain (the one published last step), slot j was reached iff j <= accepted and
              j < admitted (= accepted + rejected), accepted iff j < accepted: counts and the sum of the
              published confidences of reached slots (live calibration, `stats`);
            - the copy history of each request: for every output position p emitted this step, hit(p) =
              whether the n-gram proposal at context prompt + output[:p] predicted output[p]
              (`first_token_hits`); kept as a running count and a ring of the last W = 32 positions;
            - returns num_sampled / num_rejected with the rows that verified an n-gram chain zeroed, so
              DSpark's own online acceptance estimator only ever grades DSpark's drafts.
  propose   after DSpark drafted (tokens and confidences [R, K]):
            - the n-gram proposal at the current context (`ngram_match`: n, start, length <= K, ext, occ,
              in_prompt), its conditional acceptances from the calibrator (`conditional_torch`) with the
              copy-history features read from the state above:
                  i = output position = total_len - prompt_len,  overall = (hits + 1) / (i + 2),
                  recent = (hits in the ring + 0.5) / (min(i, W) + 1),  prev_hit = ring[(i - 1) mod W];
            - the choice, by the simulator's own function (sim.policies.hybrid.choose_chain on
              published_view: K-slot chains, T = N = R, vLLM's profiled verify table and draft cost);
            - the published chain: tokens (the n-gram chain's where chosen, DSpark's past its length) and
              confidences (`publish`: 0 past the chosen chain's length), which vLLM's adaptive verification
              budgets and allocates unchanged.
Everything is batched tensor ops with shapes fixed by (R, K, history width): no host synchronisation.
A request resumed after preemption restarts its copy history at the resume point (earlier hits count
as misses); the simulator keeps the whole history, so such requests may get slightly different
n-gram confidences there.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from real.vllm_plugin.config import HybridSpecConfig
from real.vllm_plugin.ngram_kernels import first_token_hits, ngram_match
from sim.drafters.calibration import NgramCalibrator, conditional_torch
from sim.policies.base import StepBatch
from sim.policies.hybrid import choose_chain, publish, published_view

HISTORY_WINDOW = 32  # output positions in the `recent` copy-history share (sim.drafters.calibration.copy_history)
CHAINS = ("model", "ngram")


@dataclass
class Proposal:
    """What `HybridDrafter.propose` publishes for R rows: tokens int64 [R, K], conf float32 [R, K],
    use_ngram bool [R], and the n-gram chain's length int64 [R] (for logging and tests)."""

    tokens: torch.Tensor
    conf: torch.Tensor
    use_ngram: torch.Tensor
    ngram_len: torch.Tensor


class HybridDrafter:
    """Device state and per-step functions of the hybrid for up to `max_reqs` request slots (vLLM's
    req_states indices). Row `max_reqs` is a sink that absorbs the writes of padded rows (index -1)."""

    def __init__(self, cfg: HybridSpecConfig, max_reqs: int, k: int, device: torch.device | str,
                 calibrator: NgramCalibrator | None = None):
        if k + 1 > HISTORY_WINDOW:
            raise ValueError(f"num_speculative_tokens + 1 must be <= {HISTORY_WINDOW}, got {k}")
        self.cfg, self.k, self.max_reqs = cfg, k, max_reqs
        self.device = torch.device(device)
        self.calibrator = calibrator or NgramCalibrator.load(cfg.calibrator)
        self.ngram_cfg = cfg.ngram(k)
        dev, S = self.device, max_reqs + 1
        self.weights = torch.as_tensor(self.calibrator.weights, dtype=torch.float64, device=dev)
        self.pos = torch.zeros(S, dtype=torch.int64, device=dev)        # output positions in the history
        self.hits = torch.zeros(S, dtype=torch.int64, device=dev)       # hits at those positions
        self.ring = torch.zeros(S, HISTORY_WINDOW, dtype=torch.int64, device=dev)  # hit at p, at p mod W
        self.last_ngram = torch.zeros(S, dtype=torch.bool, device=dev)  # chain published at the last step
        self.last_conf = torch.zeros(S, k, dtype=torch.float32, device=dev)
        # live statistics per chain (row 0 model, 1 n-gram) and depth
        self.reached = torch.zeros(2, k, dtype=torch.float64, device=dev)
        self.accepted = torch.zeros(2, k, dtype=torch.float64, device=dev)
        self.predicted = torch.zeros(2, k, dtype=torch.float64, device=dev)
        self.chosen = torch.zeros(2, dtype=torch.float64, device=dev)  # requests x steps per published chain
        self.steps = 0
        self._table: torch.Tensor | None = None
        self._table_src = None
        self.draft_table: list[float] = []

    # ------------------------------------------------------------------------------------------ helpers
    def _rows(self, idx_mapping: torch.Tensor) -> torch.Tensor:
        """idx_mapping with padded rows (-1) sent to the sink row (indexes this object's state)."""
        idx = idx_mapping.to(torch.int64)
        return torch.where(idx >= 0, idx, self.max_reqs)

    @staticmethod
    def _src(idx_mapping: torch.Tensor) -> torch.Tensor:
        """idx_mapping with padded rows sent to slot 0 (indexes vLLM's [max_reqs] request state; the
        values read for padded rows are masked out)."""
        return idx_mapping.to(torch.int64).clamp(min=0)

    def verify_table(self, table) -> torch.Tensor:
        """vLLM's profiled verify-cost table (numpy, ms per total tokens) on the device, uploaded once per table.
        Call it when the table arrives (`set_cost_tables`), never inside a step: the upload is a host-to-device
        copy, which a step must not make (VLLM_GPU_SYNC_CHECK=error)."""
        if self._table is None or self._table_src is not table:
            self._table = torch.as_tensor(table, dtype=torch.float64).to(self.device)
            self._table_src = table
        return self._table

    def set_cost_tables(self, draft_table, verify_table) -> None:
        """Adaptive verification's profiled tables arrived (draft ms by request count, verify ms by total tokens,
        numpy): upload the verify table now and keep the draft table on the host (its entry at R is a Python
        float of the step)."""
        self.verify_table(verify_table)
        self.draft_table = [float(x) for x in draft_table]

    def draft_ms(self, num_reqs: int) -> float:
        """The drafter's profiled cost at `num_reqs` requests [ms] (host-side: a Python float)."""
        t = self.draft_table
        return t[min(int(num_reqs), len(t) - 1)]

    @property
    def table(self) -> torch.Tensor | None:
        """The uploaded verify table (None until `set_cost_tables`)."""
        return self._table

    def warm_up(self, token_ids: torch.Tensor, total_len: torch.Tensor, prompt_len: torch.Tensor,
                batch_sizes: tuple[int, ...] | None = None) -> None:
        """Run observe + propose once per batch size on padded rows (index -1, the sink row) so that every constant
        the step caches on the device (the price grid, aranges) is made and every Triton kernel is compiled now,
        at start-up, not at the first live request. Needs the uploaded table; leaves the statistics as they were
        (padded rows count nothing; the step counter is restored). Default sizes: 1 and max_reqs (the sweep's
        two code paths: exact below SWEEP_EXACT_MAX slots, the two-stage grid above)."""
        if self._table is None:
            raise RuntimeError("warm_up needs the cost tables: call set_cost_tables first")
        dev, K = self.device, self.k
        steps = self.steps
        for R in batch_sizes or tuple(sorted({1, self.max_reqs})):
            idx = torch.full((R,), -1, dtype=torch.int32, device=dev)
            ns = torch.ones(R, dtype=torch.int32, device=dev)
            self.observe(idx, ns, torch.zeros_like(ns), token_ids, total_len, prompt_len)
            self.propose(idx, ns, torch.zeros(R, K, dtype=torch.int64, device=dev),
                         torch.zeros(R, K, dtype=torch.float32, device=dev), token_ids, total_len, prompt_len,
                         self._table, self.draft_ms(R))
        self.steps = steps

    # ------------------------------------------------------------------------------------------ observe
    def observe(self, idx_mapping: torch.Tensor, num_sampled: torch.Tensor, num_rejected: torch.Tensor,
                token_ids: torch.Tensor, total_len: torch.Tensor, prompt_len: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fold the verification of the last published drafts in (module docstring) and return
        (num_sampled, num_rejected) for DSpark's estimator, zero on rows that verified an n-gram chain.
        token_ids [max_reqs, width] and total_len / prompt_len [max_reqs] are vLLM's request state after
        this step's tokens were appended."""
        rows = self._rows(idx_mapping)
        valid = idx_mapping >= 0
        ns = num_sampled.to(torch.int64)
        acc = (ns - 1).clamp(min=0)
        adm = acc + num_rejected.to(torch.int64)
        j = torch.arange(self.k, device=rows.device)
        reached = ((j[None] <= acc[:, None]) & (j[None] < adm[:, None]) & valid[:, None]).to(torch.float64)
        accepted = ((j[None] < acc[:, None]) & valid[:, None]).to(torch.float64)
        chain = self.last_ngram[rows].to(torch.int64)
        self.reached.index_add_(0, chain, reached)
        self.accepted.index_add_(0, chain, accepted)
        self.predicted.index_add_(0, chain, reached * self.last_conf[rows].to(torch.float64))

        # copy history: hits at the output positions emitted this step
        src = self._src(idx_mapping)
        plen = prompt_len[src].to(torch.int64)
        first = total_len[src].to(torch.int64) - plen - ns  # output position of the first emitted token
        count = torch.where(valid & (first >= 0), ns, 0)
        fresh = self.pos[rows] != first  # a new request in the slot (or a resumed one): start over
        kmax = self.k + 1
        hit = first_token_hits(token_ids, torch.where(count > 0, src, -1), plen + first.clamp(min=0), count, kmax,
                               plen, n_min=self.ngram_cfg.n_min, n_max=self.ngram_cfg.n_max).to(torch.int64)
        jj = torch.arange(kmax, device=rows.device)
        keep = jj[None] < count[:, None]  # [R, kmax]: emitted position first + j
        # position first + j lands in ring slot (first + j) mod W; kmax <= W, so at most one j per slot
        onehot = ((first.clamp(min=0)[:, None] + jj[None]) % HISTORY_WINDOW)[:, :, None] == \
            torch.arange(HISTORY_WINDOW, device=rows.device)[None, None]
        onehot = onehot & keep[:, :, None]  # [R, kmax, W]
        ring = torch.where(fresh[:, None], 0, self.ring[rows])
        ring = torch.where(onehot.any(1), (onehot * hit[:, :, None]).sum(1), ring)
        self.ring[rows] = ring
        self.hits[rows] = torch.where(fresh, 0, self.hits[rows]) + (hit * keep).sum(1)
        self.pos[rows] = torch.where(count > 0, first + count, torch.where(fresh, first, self.pos[rows]))

        used_ngram = self.last_ngram[rows] & valid
        return torch.where(used_ngram, 0, num_sampled), torch.where(used_ngram, 0, num_rejected)

    # ------------------------------------------------------------------------------------------ propose
    def ngram_conf(self, idx_mapping: torch.Tensor, eligible: torch.Tensor, token_ids: torch.Tensor,
                   total_len: torch.Tensor, prompt_len: torch.Tensor):
        """The n-gram proposal at each row's current context and its calibrated conditional acceptances."""
        rows, src = self._rows(idx_mapping), self._src(idx_mapping)
        ctx = total_len[src].to(torch.int64)
        plen = prompt_len[src].to(torch.int64)
        ng = self.ngram_cfg
        m = ngram_match(token_ids, torch.where(eligible, src, -1), ctx, plen, n_min=ng.n_min, n_max=ng.n_max,
                        k=self.k, ext_max=ng.ext_max)
        i = (ctx - plen).clamp(min=0)
        hits = self.hits[rows]
        overall = (hits + 1).to(torch.float64) / (i + 2).to(torch.float64)
        recent = (self.ring[rows].sum(1).to(torch.float64) + 0.5) / (i.clamp(max=HISTORY_WINDOW) + 1).to(torch.float64)
        prev = self.ring[rows].gather(1, ((i - 1) % HISTORY_WINDOW)[:, None])[:, 0] * (i >= 1)
        conf = conditional_torch(self.weights, m.ext, m.n, m.in_prompt, m.occ, prev, overall, recent, m.length,
                                 self.k, ng.n_max)
        return m, conf

    def propose(self, idx_mapping: torch.Tensor, num_sampled: torch.Tensor, model_tokens: torch.Tensor,
                model_conf: torch.Tensor, token_ids: torch.Tensor, total_len: torch.Tensor,
                prompt_len: torch.Tensor, verify_table: torch.Tensor, draft_ms: float) -> Proposal:
        """The chains to publish for the R rows (module docstring). model_tokens int64 [R, K] and model_conf
        [R, K] are DSpark's; verify_table float [T_max + 1] in ms; draft_ms the drafter's cost at R [ms]."""
        R, K = model_tokens.shape
        rows = self._rows(idx_mapping)
        eligible = (idx_mapping >= 0) & (num_sampled > 0)  # rows still prefilling draft nothing useful
        m, ng_conf = self.ngram_conf(idx_mapping, eligible, token_ids, total_len, prompt_len)
        model_len = torch.full((R,), K, dtype=torch.int64, device=rows.device)
        mc = model_conf.to(torch.float32)
        batch = StepBatch(model_conf=mc, model_len=model_len, ngram_conf=ng_conf, ngram_len=m.length,
                          stale_model_conf=mc, stale_model_len=model_len, stale_ngram_conf=ng_conf,
                          stale_ngram_len=m.length, num_nondraft_tokens=R, verify_cost_ms=verify_table,
                          draft_cost_ms=float(draft_ms), num_sampling_reqs=R)
        use_ngram = choose_chain(published_view(batch, K), self.cfg.method, float(self.cfg.margin)) & eligible
        conf = publish(mc, model_len, ng_conf, m.length, use_ngram)
        j = torch.arange(K, device=rows.device)
        tokens = torch.where(use_ngram[:, None] & (j[None] < m.length[:, None]), m.tokens, model_tokens)
        self.last_ngram[rows] = use_ngram
        self.last_conf[rows] = conf
        self.chosen.index_add_(0, use_ngram.to(torch.int64), eligible.to(torch.float64))
        self.steps += 1
        return Proposal(tokens=tokens, conf=conf, use_ngram=use_ngram, ngram_len=m.length)

    # ------------------------------------------------------------------------------------------ stats
    def stats(self) -> dict:
        """Host copy of the live statistics (a device sync: call outside the step, e.g. over RPC)."""
        reached, accepted, predicted = (t.cpu().tolist() for t in (self.reached, self.accepted, self.predicted))
        chosen = self.chosen.cpu().tolist()
        out = {"steps": self.steps, "k": self.k, "config": self.cfg.to_additional_config()}
        for c, name in enumerate(CHAINS):
            out[name] = {
                "chosen": chosen[c],
                "reached": reached[c], "accepted": accepted[c],
                # observed conditional acceptance per depth vs the mean published confidence there
                "observed": [a / r if r else None for a, r in zip(accepted[c], reached[c])],
                "predicted": [p / r if r else None for p, r in zip(predicted[c], reached[c])],
            }
        return out
