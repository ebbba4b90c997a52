"""The public step interface the engine's fast paths run through (sim/engine/native_step.py, sim/engine/fast_forward.py,
sim/engine/stretch.py): what of sim.engine.engine.Engine they may read, write and call, and nothing private.

The fast paths stand in for whole steps or parts of them (sim.engine.forms), so they read the engine's state
and call the pieces of a step that they do not transcribe themselves. Those pieces are public Engine methods
(each marked with the fast forms that stand in for the step, where it is defined); the hooks a subclass
overrides (_plan, _propose, _allocate, _verify, _emit, _charge, ...) stay private to the engine, and a fast
path never calls them: a subclass overriding one runs without the fast path (sim.engine.forms.steps_as_defined).
`LiveSteps` adds what the live drafters' step (sim/engine/live.py) calls. Both are typing Protocols only;
Engine satisfies them, and the modules that take one import it from here, not from sim.engine.engine, so that the
imports run one way (engine -> fast paths -> this module).
"""
from __future__ import annotations

from typing import Optional, Protocol

import numpy as np

from sim.engine.step_time import StepPrices


class EngineSteps(Protocol):
    """What a fast path uses of an engine.

    State (arrays indexed by request, int64 unless said): pos (output position), prev_pos (position of the
    previous decode step), model_pos, fresh (bool), n_steps, m_conf_sum / ng_conf_sum (float64 [n, K]) and
    m_conf_cnt / ng_conf_cnt (the host history's running sums), acc_hist (drafts by accepted length),
    emitted_tokens (the emitted-token buffer by table row, -1 unwritten), out_base (token-buffer index of each
    request's output[0]), n_written (stores into emitted_tokens), violation ('' or the first failed check).
    Set-up: tb (DraftTables), sched (sim.core.scheduler.Scheduler), policy, cost (CostModel), cfg (EngineConfig),
    stream (streaming tables), steps (the StepLog), decision_table (the policies' verify table, a tensor),
    max_logits (vLLM's logits cap in rows, or None), padded (the cost's short_query_max: a padded cost prices
    each step's attention shape, which only the numpy step computes; 0 otherwise), filler_k (vLLM's filler
    slots of a vllm-ngram run, 0 otherwise), unused_pass (sim.core.vllm.drafts_skip of the run: None, or whether
    vLLM skips the drafter pass no request uses where its scheduler knows)."""

    tb: object
    sched: object
    policy: object
    cost: object
    cfg: object
    stream: bool
    steps: object
    decision_table: object
    max_logits: Optional[int]
    padded: int
    filler_k: int
    unused_pass: Optional[bool]
    pos: np.ndarray
    prev_pos: np.ndarray
    model_pos: np.ndarray
    fresh: np.ndarray
    n_steps: np.ndarray
    m_conf_sum: np.ndarray
    m_conf_cnt: np.ndarray
    ng_conf_sum: np.ndarray
    ng_conf_cnt: np.ndarray
    acc_hist: np.ndarray
    out_base: np.ndarray
    n_written: int
    violation: str
    # the violations the native commit reports, in the order the numpy step checks them
    COMMIT_CHECKS: tuple

    @property
    def emitted_tokens(self) -> np.ndarray: ...

    def native_step(self):
        """The native step bound to this engine's arrays (sim.engine.native_step.NativeStep), or None."""

    def array_form(self):
        """The policy's fast form on the native step's gathered arrays (Arrays -> Decision tuple), or None."""

    def step_prices(self, R: int) -> StepPrices:
        """The drafters' and the allocation's prices for R decoding requests (shared: copy before changing)."""

    def decide(self, form, g, T: int, kv_tokens: int, n_seqs: int, n_prefill_done: int, prices: StepPrices):
        """The policy's Decision on a gathered step (the array form, else the phases on a StepBatch)."""

    def drafters_ran(self, said: Optional[dict], prices: Optional[StepPrices], plan=None) -> tuple[bool, bool]:
        """Which drafters ran (plan less what the allocation says), dropping the others' prices."""

    def counts_charge(self, running: int, total_tokens: int) -> tuple:
        """(graph tokens, sample ms, CPU ms) of a step with `running` requests and `total_tokens` tokens."""

    def drafts_known_unused(self, decoding: np.ndarray, prefilling) -> bool:
        """Whether vLLM's scheduler knows, before the step, that no request will use the drafts after it."""

    def unused_pass_ms(self, decoding: np.ndarray, prefilling, completed: int, known: bool) -> float:
        """The drafter pass vLLM runs after the step for no request [ms] (0: none, or skipped)."""


class LiveSteps(EngineSteps, Protocol):
    """What the live drafters' part of a step (sim.engine.live.LiveChains, not a fast path: a piece of the step's
    definition) uses of an engine besides EngineSteps: the step checks and emission, each a public Engine method
    around the engine's own hook, so that a subclass's override (the real engine's emission) still runs."""

    def flag(self, bad: np.ndarray, reqs: np.ndarray, what: str) -> None:
        """Record the step checks' first violation: `what` for the first request with bad[k] set."""

    def check_chain_bounds(self, reqs, rows, from_n, n_draft, m_len, ng_len) -> None:
        """The lossless check's item 2 on emitted table-chain drafts."""

    def emit_drafts(self, reqs, rows, from_n, n_draft, n_bonus) -> None:
        """Emit the table chains' accepted drafts, then the bonus token."""

    def write_tokens(self, reqs, counts, dst, tokens) -> None:
        """Store emitted tokens at buffer slots `dst` and advance the positions."""

    def record_drafts(self, reqs, rows, model_ran: bool) -> None:
        """The table chains drafted this step join the host-side history."""
