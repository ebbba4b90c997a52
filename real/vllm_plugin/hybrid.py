"""The hybrid's per-step work inside vLLM, as pure torch on the device: the n-gram chain, its calibrated
confidences, the per-request chain choice, and online acceptance statistics. No vLLM import (the vLLM
wiring is real/vllm_plugin/speculator.py), so all of it runs and is tested on CPU tensors.

Widths: W = vLLM's num_speculative_tokens (the draft slots per request vLLM schedules and verifies), K_b = DSpark's
trained block (the model chain's width, K_b <= W). With W > K_b (docs/real.md, "W slots") the model chain is
padded with confidence 0 past K_b, so adaptive verification admits those slots only when its budget has no
better slot left, and the n-gram chain keeps up to W tokens.

Per step (vLLM's order; R rows of the batch):
  observe   after the target verified the previous drafts (num_sampled = accepted + 1 bonus, num_rejected):
            - per depth j and chain (the one published last step), slot j was reached iff j <= accepted and
              j < admitted (= accepted + rejected), accepted iff j < accepted: counts and the sum of the
              published confidences of reached slots (live calibration, `stats`);
            - the copy history of each request: for every output position p emitted this step, hit(p) =
              whether the n-gram proposal at context prompt + output[:p] predicted output[p]
              (`first_token_hits`); kept as a running count and a ring of the last H = 32 positions (a step
              may emit W + 1 > H tokens: only its last H positions enter the ring);
            - returns num_sampled / num_rejected with the rows that verified an n-gram chain zeroed, so
              DSpark's own online acceptance estimator only ever grades DSpark's drafts.
  propose   after DSpark drafted (tokens and confidences [R, K_b]; none when the pass was skipped):
            - the n-gram proposal at the current context (`ngram_match`: n, start, length <= K, ext, occ,
              in_prompt), its conditional acceptances from the calibrator (`conditional_torch`) with the
              copy-history features read from the state above:
                  i = output position = total_len - prompt_len,  overall = (hits + 1) / (i + 2),
                  recent = (hits in the ring + 0.5) / (min(i, H) + 1),  prev_hit = ring[(i - 1) mod H];
            - the choice, by the simulator's own function (sim.core.policies.hybrid.choose_chain on
              published_view: K_b-slot model and W-slot n-gram chains, T = N = R, vLLM's profiled verify
              table and draft cost); after a skipped pass every eligible row takes its n-gram chain;
            - the published chain, W wide: tokens (the n-gram chain's where chosen, DSpark's past its
              length, FILLER_TOKEN past both) and confidences (`publish`: hybrid_spec.tail past the chosen
              chain's length, 0 by default), which vLLM's adaptive verification budgets and allocates unchanged.
  plan_skip (host, before DSpark's pass, only with hybrid_spec.skip): the simulator's `hybrid` decision
            (sim.core.policies.hybrid.plan_skip) on host copies of the last values: each request's DSpark chain as the
            simulator's engine forecasts it (the last step's when the pass ran then, else the mean of those
            drafted so far, 1.0 before any), its last n-gram chain and its mean n-gram chain so far, vLLM's
            profiled verify table, the draft cost at R with and without the block pass (`set_skip_table`).
            The host copies are taken at the end of each propose (`_snapshot_skip_state`: on CUDA an asynchronous
            copy into pinned memory and an event, which the next plan_skip waits on -- a step after it was issued,
            as vLLM's own record_confidences waits on its copy); a request new in its slot since the last
            plan_skip (its request id, a host value) starts an empty history there, as observe starts it on the
            device.
Everything is batched tensor ops with shapes fixed by (R, K, history width): no host synchronisation.
The plugin's own time per step is measured by `clock` (real/vllm_plugin/timing.py) and reported by `stats`.
A request resumed after preemption restarts its copy history at the resume point (earlier hits count
as misses); the simulator keeps the whole history, so such requests may get slightly different
n-gram confidences there.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from real.vllm_plugin.config import HybridSpecConfig
from real.vllm_plugin.ngram_kernels import first_token_hits, ngram_match
from real.vllm_plugin.timing import StepClock
from sim.core.drafters.calibration import NgramCalibrator, conditional_torch
from sim.core.drafters.recalibration import evidence, recalibrate
from sim.core.policies.base import StepBatch
from sim.core.policies.hybrid import SWEEP_EXACT_MAX, choose_chain, publish, published_view
from sim.core.vllm import PLUGIN_DRAFTERS

HISTORY_WINDOW = 32  # H: output positions in the `recent` copy-history share (sim.core.drafters.calibration.copy_history)
FILLER_TOKEN = 0  # token id in a published slot past both chains (confidence 0; any valid id is lossless)
CHAINS = ("model", "ngram")  # the stats' names of the plugin's chains, in PLUGIN_DRAFTERS' order
# the plugin's drafters as the step contract indexes them: vLLM's DSpark speculator, then the plugin's n-gram kernels
MODEL, NGRAM = PLUGIN_DRAFTERS
# plan_skip's inputs, per request slot, copied to the host at the end of each propose (`_snapshot_skip_state`)
SKIP_STATE = ("model_conf_last", "model_len_last", "model_conf_sum", "model_steps", "model_ran_last",
              "ngram_conf_last", "ngram_len_last", "ngram_conf_sum", "ngram_steps")


@dataclass
class Proposal:
    """What `HybridDrafter.propose` publishes for R rows: tokens int64 [R, W], conf float32 [R, W],
    use_ngram bool [R], and the n-gram chain's length int64 [R] (for logging and tests)."""

    tokens: torch.Tensor
    conf: torch.Tensor
    use_ngram: torch.Tensor
    ngram_len: torch.Tensor


class HybridDrafter:
    """Device state and per-step functions of the hybrid for up to `max_reqs` request slots (vLLM's
    req_states indices). Row `max_reqs` is a sink that absorbs the writes of padded rows (index -1)."""

    def __init__(self, cfg: HybridSpecConfig, max_reqs: int, k: int, device: torch.device | str,
                 calibrator: NgramCalibrator | None = None, block: int | None = None, compiled: bool = False):
        """k: W, the slots vLLM verifies per request (its num_speculative_tokens); block: DSpark's K_b (default W);
        compiled: run observe and propose as compiled graphs (`compile_step`, made at warm-up)."""
        block = k if block is None else int(block)
        if not 1 <= block <= k:
            raise ValueError(f"DSpark's block must be in 1..W = {k}, got {block}")
        self.cfg, self.k, self.block, self.max_reqs = cfg, k, block, max_reqs
        self.device = torch.device(device)
        self.calibrator = calibrator or NgramCalibrator.load(cfg.calibrator)
        self.ngram_cfg = cfg.ngram(k)
        dev, S = self.device, max_reqs + 1
        self.weights = torch.as_tensor(self.calibrator.weights, dtype=torch.float64, device=dev)
        self.pos = torch.zeros(S, dtype=torch.int64, device=dev)        # output positions in the history
        self.hits = torch.zeros(S, dtype=torch.int64, device=dev)       # hits at those positions
        self.ring = torch.zeros(S, HISTORY_WINDOW, dtype=torch.int64, device=dev)  # hit at p, at p mod H
        self.last_ngram = torch.zeros(S, dtype=torch.bool, device=dev)  # chain published at the last step
        self.last_conf = torch.zeros(S, k, dtype=torch.float32, device=dev)
        # what plan_skip reads (host copies of these): per request slot, the last DSpark chain drafted for it
        # (not overwritten by a skipped step), its last n-gram chain, and the running sum / count of its n-gram
        # chains (the mean proposal of the simulator's forecast)
        self.model_conf_last = torch.zeros(S, block, dtype=torch.float32, device=dev)
        self.model_len_last = torch.zeros(S, dtype=torch.int64, device=dev)
        # the running sum / count of a request's drafted DSpark chains and whether the last step drafted one: after a
        # skipped step plan_skip forecasts the model chain by their mean, as the simulator's engine does
        # (sim.engine.history._host_history), and by 1.0 before any (vLLM's reset of a new request's confidences)
        self.model_conf_sum = torch.zeros(S, block, dtype=torch.float64, device=dev)
        self.model_steps = torch.zeros(S, dtype=torch.int64, device=dev)
        self.model_ran_last = torch.zeros(S, dtype=torch.bool, device=dev)
        self.ngram_conf_last = torch.zeros(S, k, dtype=torch.float32, device=dev)
        self.ngram_len_last = torch.zeros(S, dtype=torch.int64, device=dev)
        self.ngram_conf_sum = torch.zeros(S, k, dtype=torch.float64, device=dev)
        self.ngram_steps = torch.zeros(S, dtype=torch.int64, device=dev)
        # online recalibration (hybrid_spec.runcal = k > 0): one logit offset b and its precision P per drafter
        # (row 0 DSpark, 1 n-gram), the simulator's runcal=k state, and what observe grades it on: each slot's last
        # proposed chain of both drafters (tokens, calibrated confidences before the offset, length)
        self.runcal = float(cfg.runcal)
        if self.runcal:
            self.rc_b = torch.zeros(2, dtype=torch.float64, device=dev)
            self.rc_P = torch.full((2,), self.runcal, dtype=torch.float64, device=dev)
            self.rc_tok = torch.zeros(2, S, k, dtype=torch.int64, device=dev)
            self.rc_conf = torch.zeros(2, S, k, dtype=torch.float32, device=dev)
            self.rc_len = torch.zeros(2, S, dtype=torch.int64, device=dev)
        # live statistics per chain (row 0 model, 1 n-gram) and depth
        self.reached = torch.zeros(2, k, dtype=torch.float64, device=dev)
        self.accepted = torch.zeros(2, k, dtype=torch.float64, device=dev)
        self.predicted = torch.zeros(2, k, dtype=torch.float64, device=dev)
        self.chosen = torch.zeros(2, dtype=torch.float64, device=dev)  # requests x steps per published chain
        self.steps = 0
        self.skipped = 0  # steps whose DSpark block pass plan_skip skipped
        self._table: torch.Tensor | None = None
        self._table_src = None
        self._table_host: torch.Tensor | None = None
        self.draft_table: list[float] = []
        self.skip_table: list[float] | None = None  # draft cost at R when the block pass is skipped [ms]
        # the host copies of SKIP_STATE (pinned on CUDA), zeros as the device state starts; on CUDA the event
        # recorded after the last copy (None before the first)
        self._skip_host = None if not cfg.skip else {
            n: torch.zeros(getattr(self, n).shape, dtype=getattr(self, n).dtype, pin_memory=dev.type == "cuda")
            for n in SKIP_STATE}
        self._skip_ready = None
        self._owner: dict[int, str] = {}  # request slot -> the request id plan_skip last saw there
        self.host_wait = contextlib.nullcontext  # the context a host wait on the device runs in (the speculator
        # sets vLLM's gpu_sync_allowed, which VLLM_GPU_SYNC_CHECK honours)
        self.clock = StepClock(self.device)
        self.compiled = bool(compiled)
        self._observe_fn, self._propose_fn = self._observe_step, self._propose_step
        if self.compiled:
            self.compile_step()

    def compile_step(self) -> None:
        """Compile observe's and propose's device work (`torch.compile`, fullgraph, the batch size R dynamic), so that
        each runs as a few fused kernels (counted by `real.vllm_plugin.checks.count_compiled_kernels`; inductor fuses
        the ops of the step, and the policy functions replace their scans and binary searches by fusable forms
        while compiling: sim.core.policies.common.prefix_sum / prefix_product / count_above, same values). The graphs are
        built at the first call of each shape family: `warm_up` makes them at start-up. Their inputs are the
        step's arguments and this object's persistent buffers, so a CUDA build can also capture them."""
        self._observe_fn = torch.compile(self._observe_step, fullgraph=True, dynamic=True)
        self._propose_fn = torch.compile(self._propose_step, fullgraph=True, dynamic=True)

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
        self._table_host = torch.as_tensor(verify_table, dtype=torch.float64).cpu()
        self.draft_table = [float(x) for x in draft_table]

    def set_skip_table(self, skip_table) -> None:
        """The draft cost at R request counts when DSpark's block pass is skipped (context K/V and the hybrid's
        step only) [ms]; what plan_skip prices the n-gram-only scenario at (None: the skip is not priced)."""
        self.skip_table = None if skip_table is None else [float(x) for x in skip_table]

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
        two code paths: exact below SWEEP_EXACT_MAX slots, the two-stage grid above); compiled, also 2 and the
        largest exact-sweep batch, so that every graph of the dynamic batch size is built here."""
        if self._table is None:
            raise RuntimeError("warm_up needs the cost tables: call set_cost_tables first")
        if batch_sizes is None:
            batch_sizes = {1, self.max_reqs}
            if self.compiled:  # every graph the dynamic-R compile makes: R = 1 is specialised, R >= 2 is symbolic
                # on both sides of the sweep's exact / two-stage switch
                exact = max(min(SWEEP_EXACT_MAX // (self.block + self.k), self.max_reqs), 1)
                batch_sizes |= {min(2, self.max_reqs), exact}
        for R in sorted(batch_sizes):
            for ran in (True, False):  # both shapes of the step: after DSpark's pass and after a skipped one
                self.padded_step(R, token_ids, total_len, prompt_len, ran_model=ran)

    def padded_step(self, R: int, token_ids: torch.Tensor, total_len: torch.Tensor, prompt_len: torch.Tensor,
                    ran_model: bool = True) -> None:
        """observe + propose of R padded rows (index -1: the sink row takes every write; the counters are restored):
        the step's kernels at batch R without touching any request's state. The warm-up runs it, and so does every
        profiling run of vLLM's (`HybridSpeculator.propose` with dummy_run), so that the drafter cost vLLM
        profiles includes the plugin's step; before the tables arrive the prices are a stand-in (zeros: same
        shapes, same ops)."""
        dev, Kb = self.device, self.block
        table = self._table if self._table is not None else \
            torch.zeros(R * (self.k + 1) + 1, dtype=torch.float64, device=dev)
        steps, skipped = self.steps, self.skipped
        idx = torch.full((R,), -1, dtype=torch.int32, device=dev)
        ns = torch.ones(R, dtype=torch.int32, device=dev)
        self.observe(idx, ns, torch.zeros_like(ns), token_ids, total_len, prompt_len)
        self.propose(idx, ns, torch.zeros(R, Kb, dtype=torch.int64, device=dev),
                     torch.zeros(R, Kb, dtype=torch.float32, device=dev), token_ids, total_len, prompt_len,
                     table, self.draft_ms(R) if self.draft_table else 0.0, ran_model=ran_model)
        self.steps, self.skipped = steps, skipped

    # ------------------------------------------------------------------------------------------ observe
    def observe(self, idx_mapping: torch.Tensor, num_sampled: torch.Tensor, num_rejected: torch.Tensor,
                token_ids: torch.Tensor, total_len: torch.Tensor, prompt_len: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fold the verification of the last published drafts in (module docstring) and return
        (num_sampled, num_rejected) for DSpark's estimator, zero on rows that verified an n-gram chain.
        token_ids [max_reqs, width] and total_len / prompt_len [max_reqs] are vLLM's request state after
        this step's tokens were appended."""
        return self._observe_fn(idx_mapping, num_sampled, num_rejected, token_ids, total_len, prompt_len)

    def _observe_step(self, idx_mapping: torch.Tensor, num_sampled: torch.Tensor, num_rejected: torch.Tensor,
                      token_ids: torch.Tensor, total_len: torch.Tensor, prompt_len: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """observe's device work (tensor ops and writes to this object's buffers only: it compiles as one graph)."""
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
        # position first + j lands in ring slot (first + j) mod H; a step emits up to W + 1 tokens, which may
        # exceed H, so only its last H positions enter the ring: then at most one j per slot
        last_h = keep & (jj[None] >= count[:, None] - HISTORY_WINDOW) if kmax > HISTORY_WINDOW else keep
        onehot = ((first.clamp(min=0)[:, None] + jj[None]) % HISTORY_WINDOW)[:, :, None] == \
            torch.arange(HISTORY_WINDOW, device=rows.device)[None, None]
        onehot = onehot & last_h[:, :, None]  # [R, kmax, H]
        ring = torch.where(fresh[:, None], 0, self.ring[rows])
        ring = torch.where(onehot.any(1), (onehot * hit[:, :, None]).sum(1), ring)
        self.ring[rows] = ring
        self.hits[rows] = torch.where(fresh, 0, self.hits[rows]) + (hit * keep).sum(1)
        self.pos[rows] = torch.where(count > 0, first + count, torch.where(fresh, first, self.pos[rows]))
        if self.runcal:
            self._grade(rows, token_ids, src, plen + first.clamp(min=0), torch.where(fresh, 0, count), kmax)
        if self.cfg.skip:  # a new request in the slot: plan_skip's history of it starts empty
            self.ngram_steps[rows] = torch.where(fresh, 0, self.ngram_steps[rows])
            self.model_len_last[rows] = torch.where(fresh, 0, self.model_len_last[rows])
            self.model_steps[rows] = torch.where(fresh, 0, self.model_steps[rows])
            self.model_ran_last[rows] = self.model_ran_last[rows] & ~fresh

        used_ngram = self.last_ngram[rows] & valid
        return torch.where(used_ngram, 0, num_sampled), torch.where(used_ngram, 0, num_rejected)

    def _grade(self, rows, token_ids, src, start, count, kmax: int) -> None:
        """The runcal update from this step's verdict (sim/core/drafters/recalibration.py, observe_shared's rule: the
        simulator's engine does the same from its tables): each drafter's last chain in the row, whether verified
        or not, against the `count` tokens the row emitted from context position `start`: its leading tokens
        that match are the slots accepted, the first mismatch (if reached) the one rejected. Rows with count 0
        (padding, prefill, a request new in its slot) add no evidence."""
        jj = torch.arange(kmax, device=rows.device)
        pos = (start[:, None] + jj[None]).clamp(max=token_ids.shape[1] - 1)
        emitted = token_ids[src[:, None], pos].to(torch.int64)  # [R, kmax] (not whole rows); valid where jj < count
        live = jj[None, :self.k] < count[:, None]
        same = (self.rc_tok[:, rows] == emitted[None, :, :self.k]) & live[None]  # [2, R, k]: both drafters at once
        miss = ~same  # leading matches = the first miss (an argmax, which fuses where a cumprod would not)
        acc = torch.where(miss.any(2), miss.to(torch.int32).argmax(2), self.k).to(torch.int64)  # [2, R]
        R = rows.shape[0]
        # observe_shared for each drafter's offset, the two drafters' rows stacked: P <- P + sum_r h, b <- b + sum_r g / P
        g, h = evidence(self.rc_b.repeat_interleave(R), self.rc_conf[:, rows].reshape(2 * R, self.k),
                        self.rc_len[:, rows].reshape(2 * R), acc.reshape(2 * R), count.repeat(2))
        P = self.rc_P + h.view(2, R).sum(1)
        self.rc_b.copy_(self.rc_b + g.view(2, R).sum(1) / P)
        self.rc_P.copy_(P)
        self.rc_len[:, rows] = 0  # each chain is graded once: a row propose skips (a prefill chunk, the slot's next
        # request) then carries no chain, never the one graded here

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
                prompt_len: torch.Tensor, verify_table: torch.Tensor, draft_ms: float,
                ran_model: bool = True) -> Proposal:
        """The W-wide chains to publish for the R rows (module docstring). model_tokens int64 [R, K_b] and
        model_conf [R, K_b] are DSpark's (not read when ran_model is False: the pass was skipped, so every
        eligible row takes its n-gram chain); verify_table float [T_max + 1] in ms; draft_ms the drafter's
        cost at R [ms]; ran_model a host bool (plan_skip's decision)."""
        tokens, conf, use_ngram, ngram_len = self._propose_fn(idx_mapping, num_sampled, model_tokens, model_conf,
                                                              token_ids, total_len, prompt_len, verify_table,
                                                              float(draft_ms), bool(ran_model))
        self.steps += 1
        self.skipped += 0 if ran_model else 1
        if self.cfg.skip:
            self._snapshot_skip_state()
        return Proposal(tokens=tokens, conf=conf, use_ngram=use_ngram, ngram_len=ngram_len)

    def _propose_step(self, idx_mapping: torch.Tensor, num_sampled: torch.Tensor, model_tokens: torch.Tensor,
                      model_conf: torch.Tensor, token_ids: torch.Tensor, total_len: torch.Tensor,
                      prompt_len: torch.Tensor, verify_table: torch.Tensor, draft_ms: float, ran_model: bool):
        """propose's device work: (tokens, conf, use_ngram, ngram_len); tensor ops and writes to this object's
        buffers only, so it compiles as one graph (one per value of ran_model)."""
        R, Kb = model_tokens.shape
        W = self.k
        rows = self._rows(idx_mapping)
        eligible = (idx_mapping >= 0) & (num_sampled > 0)  # rows still prefilling draft nothing useful
        m, ng_conf = self.ngram_conf(idx_mapping, eligible, token_ids, total_len, prompt_len)
        model_len = torch.full((R,), Kb if ran_model else 0, dtype=torch.int64, device=rows.device)
        mc = model_conf.to(torch.float32) if ran_model else torch.zeros(R, Kb, dtype=torch.float32,
                                                                        device=rows.device)
        if self.runcal:  # keep the raw chains for the next observe, then choose and publish on corrected values
            srows = torch.where(eligible, rows, self.max_reqs)
            base_tok = model_tokens.to(torch.int64) if W == Kb else \
                torch.nn.functional.pad(model_tokens.to(torch.int64), (0, W - Kb), value=FILLER_TOKEN)
            self.rc_tok[0, srows], self.rc_tok[1, srows] = base_tok, m.tokens.to(torch.int64)
            self.rc_conf[0, srows] = torch.nn.functional.pad(mc, (0, W - Kb)) if W > Kb else mc
            self.rc_conf[1, srows] = ng_conf.to(torch.float32)
            self.rc_len[0, srows], self.rc_len[1, srows] = model_len, m.length
            mc = recalibrate(mc, self.rc_b[0].expand(R))
            ng_conf = recalibrate(ng_conf, self.rc_b[1].expand(R))
        if ran_model:
            chains = {MODEL: (mc, model_len), NGRAM: (ng_conf, m.length)}
            batch = StepBatch(chains=chains, stale_chains=chains, num_nondraft_tokens=R, verify_cost_ms=verify_table,
                              draft_cost_ms=float(draft_ms), num_sampling_reqs=R)
            use_ngram = choose_chain(published_view(batch, W), self.cfg.method, float(self.cfg.margin)) & eligible
        else:  # as the simulator's allocate_skip: a request without a model chain takes its n-gram chain
            use_ngram = eligible
        conf = publish(mc, model_len, ng_conf, m.length, use_ngram, W, float(self.cfg.tail))
        j = torch.arange(W, device=rows.device)
        base = model_tokens if W == Kb else \
            torch.nn.functional.pad(model_tokens.to(torch.int64), (0, W - Kb), value=FILLER_TOKEN)
        tokens = torch.where(use_ngram[:, None] & (j[None] < m.length[:, None]), m.tokens, base)
        self.last_ngram[rows] = use_ngram
        self.last_conf[rows] = conf
        self.chosen.index_add_(0, use_ngram.to(torch.int64), eligible.to(torch.float64))
        if self.cfg.skip:
            self._keep_for_skip(rows, eligible, ran_model, mc, model_len, ng_conf, m.length)
        return tokens, conf, use_ngram, m.length

    # ------------------------------------------------------------------------------------------ skip
    def _keep_for_skip(self, rows, eligible, ran_model: bool, mc, model_len, ng_conf, ng_len) -> None:
        """plan_skip's inputs after a step (only with hybrid_spec.skip): only eligible rows count (the sink row
        takes the others' writes); a skipped step leaves the last drafted DSpark chain in place."""
        srows = torch.where(eligible, rows, self.max_reqs)
        if ran_model:
            self._keep_chain("model", srows, mc, model_len)
        self.model_ran_last[srows] = torch.full_like(srows, ran_model, dtype=torch.bool)
        self._keep_chain("ngram", srows, ng_conf, ng_len)

    def _keep_chain(self, drafter: str, srows, conf, length) -> None:
        """One drafter's kept chain for plan_skip: its last confidences and length, and the running sum of its
        confidences over the request's steps (restarted at the request's first step; float64)."""
        getattr(self, f"{drafter}_conf_last")[srows] = conf
        getattr(self, f"{drafter}_len_last")[srows] = length
        total, steps = getattr(self, f"{drafter}_conf_sum"), getattr(self, f"{drafter}_steps")
        total[srows] = torch.where((steps[srows] == 0)[:, None], 0.0, total[srows]) + conf.to(torch.float64)
        steps[srows] = steps[srows] + 1

    def _snapshot_skip_state(self) -> None:
        """Copy plan_skip's inputs (SKIP_STATE) to the host as they are after this step (module docstring): on CUDA
        into pinned buffers without waiting, then an event; on the CPU a plain copy."""
        cuda = self.device.type == "cuda"
        for n, host in self._skip_host.items():
            host.copy_(getattr(self, n), non_blocking=cuda)
        if cuda:
            if self._skip_ready is None:  # the warm-up's first step, before any live request
                self._skip_ready = torch.cuda.Event()
            self._skip_ready.record()

    def plan_skip(self, slots, hysteresis: float = 0.0, req_ids=None) -> bool:
        """Whether DSpark's block pass runs this step for the requests in vLLM's slots `slots` (host ints, the
        batch's idx_mapping_np), decided on the host before the pass by the simulator's `hybrid` rule
        (sim.core.policies.hybrid.plan_skip) from the host copies of the last values (module docstring). req_ids:
        the requests' ids (host strings; None: every slot keeps its request), so that a request new in its slot
        starts an empty history. True (run it) when no skip cost is known."""
        from sim.core.policies.base import HostView
        from sim.core.policies.hybrid import plan_skip

        R = len(slots)
        new = torch.zeros(R, dtype=torch.bool)
        if req_ids is not None:
            new = torch.as_tensor([self._owner.get(int(s)) != rid for s, rid in zip(slots, req_ids)], dtype=torch.bool)
            self._owner.update((int(s), rid) for s, rid in zip(slots, req_ids))
        if self.skip_table is None or self._table_host is None or not self.draft_table or not self.cfg.skip:
            return True
        if self._skip_ready is not None:
            with self.host_wait():
                self._skip_ready.synchronize()
        idx = torch.as_tensor(list(slots), dtype=torch.int64)
        h = {n: t[idx] for n, t in self._skip_host.items()}
        # as observe does on the device for a request new in its slot (the copies predate its observe)
        for n in ("ngram_steps", "model_len_last", "model_steps"):
            h[n] = torch.where(new, 0, h[n])
        h["model_ran_last"] = h["model_ran_last"] & ~new
        n_steps = h["ngram_steps"]
        mean = h["ngram_conf_sum"] / n_steps.clamp(min=1)[:, None].to(torch.float64)
        full = self.draft_ms(R)
        saved = max(full - self.skip_table[min(R, len(self.skip_table) - 1)], 0.0)
        m_steps, ran_last = h["model_steps"], h["model_ran_last"]
        m_mean = (h["model_conf_sum"] / m_steps.clamp(min=1)[:, None].to(torch.float64)).to(torch.float32)
        stale_m = torch.where(ran_last[:, None], h["model_conf_last"], m_mean)
        stale_m = torch.where((m_steps == 0)[:, None], 1.0, stale_m)  # none drafted yet: vLLM's reset value
        stale_len = torch.where(m_steps == 0, self.block, h["model_len_last"])
        view = HostView(stale_chains={MODEL: (stale_m, stale_len), NGRAM: (h["ngram_conf_last"], h["ngram_len_last"])},
                        scheduled_len={MODEL: torch.full((R,), self.block, dtype=torch.int64)}, num_nondraft_tokens=R,
                        verify_cost_ms=self._table_host, draft_cost_ms=full,
                        means={NGRAM: torch.where(n_steps[:, None] > 0, mean, h["ngram_conf_last"].to(torch.float64))},
                        num_sampling_reqs=R, draft_ms_of={MODEL: saved})
        return plan_skip(view, self.cfg.method, float(self.cfg.margin), hysteresis).runs(MODEL)

    # ------------------------------------------------------------------------------------------ stats
    def stats(self) -> dict:
        """Host copy of the live statistics (a device sync: call outside the step, e.g. over RPC); plugin_ms: the
        plugin's own time per step, live and profiling apart (timing.StepClock.stats: samples and affine fits)."""
        reached, accepted, predicted = (t.cpu().tolist() for t in (self.reached, self.accepted, self.predicted))
        chosen = self.chosen.cpu().tolist()
        out = {"steps": self.steps, "k": self.k, "block": self.block, "skipped": self.skipped,
               "config": self.cfg.to_additional_config(), "plugin_ms": self.clock.stats(),
               "skip_table": self.skip_table}  # the skipped pass's cost by requests [ms] (index R), or None
        if self.runcal:  # the learnt offsets [logits] and their precisions, DSpark then n-gram
            out["runcal"] = {"offset": self.rc_b.cpu().tolist(), "precision": self.rc_P.cpu().tolist()}
        for c, name in enumerate(CHAINS):
            out[name] = {
                "chosen": chosen[c],
                "reached": reached[c], "accepted": accepted[c],
                # observed conditional acceptance per depth vs the mean published confidence there
                "observed": [a / r if r else None for a, r in zip(accepted[c], reached[c])],
                "predicted": [p / r if r else None for p, r in zip(predicted[c], reached[c])],
            }
        return out
