"""The scheduler both engines share (the simulator's and the real PyTorch engine's): admission, the
per-step token budget, chunked prefill and preemption, over per-request state arrays.

Rules (vLLM V1 style; units are tokens):
  * at most `batch_size` running requests; a waiting request is admitted (FIFO) while there is room and,
    unless nothing runs, its KV fits: used(kmax) + need(r, kmax + 1) <= capacity, where a request holding
    prompt_len + pos tokens and about to verify x more needs ceil((prompt_len + pos + x) / block) * block;
  * preemption (recompute, LIFO): while more than one request runs and used(kmax) > capacity, the most
    recently admitted request is removed, its KV freed, and it waits at the head of the queue to prefill
    prompt + generated tokens again (no token is lost or emitted twice);
  * token budget: max_num_batched_tokens per step, charged by one of two rules (`SlotCharge.rule`):
    - 'verified' (the project's engines, the simulator's default and the real torch engine's): each
      decoding request takes 1 token, and the draft slots are reserved as adaptive verification's
      host-side budget does, min(last step's verified draft count, decoding * kmax); prefill chunks take
      what is left, in running order;
    - 'scheduled' (vLLM's V1 scheduler, vllm/v1/core/sched/scheduler.py, the same rule in 0.32 and 0.33):
      every request scheduled in a step is charged its scheduled tokens plus `extra` slots
      (max_num_new_slots_for_drafting, per vLLM release, sim.core.vllm.VLLM_VERSIONS: for DSpark 0 in 0.33,
      K - 1 in 0.32; 0 for n-gram), in running order, while more than `extra` is left: a decoding request
      is scheduled 1 + `drafts` tokens (its whole proposal, num_speculative_tokens, whatever adaptive
      verification later trims on the GPU; for suffix decoding, `variable`, 1 + its proposal's own length
      up to `drafts`), cut to what is left (then fewer drafts, or not scheduled at
      all); a prefill chunk takes min(its prompt left, budget left - extra). KV per request: `drafts` + 1
      + `lookahead` past its context (vLLM's num_lookahead_tokens: K for anchor-sampling DSpark, 0 for
      n-gram; the same in both releases). Under vLLM's dynamic speculation length (`SlotCharge.per_batch`)
      a step's `drafts` is the table's K for the number of requests the previous step scheduled.
kmax is the longest chain the policy's drafters propose (0 for no speculation).

The scheduler owns the request state that scheduling reads and writes (`RequestState`); the engine
advances positions (`pos`) as it emits tokens and tells the scheduler which requests finished.

Steady stretches: when the engine gives the output lengths, a running set in which every request decodes
and whose KV at the requests' last steps, sum of need(r, out_len - pos + kmax + 1), fits the capacity can
neither be preempted nor start a prefill until it changes; while nothing can be admitted (nothing waits, or
the batch is full) `schedule` then returns the same plan without the per-request arithmetic (the rules
above give that plan: KV only grows with pos, and pos <= out_len; under the 'scheduled' rule a steady
set is also one whose full drafts fit the budget).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from sim.infra.errors import ConfigError

SMALL = 16  # up to this many running requests, per-request Python arithmetic is cheaper than numpy calls


def in_blocks(tokens, block: int):
    """KV tokens that `tokens` cached tokens occupy: rounded up to whole blocks of `block` (ints or arrays)."""
    return -(-tokens // block) * block


def full_kv_need(context, kmax: int, block: int):
    """KV tokens a request needs at its last step, alone: its whole context (prompt + output), the longest
    draft chain and the bonus token, in blocks. Above the cache's capacity it can never run."""
    return in_blocks(context + kmax + 1, block)


VERIFIED, SCHEDULED = "verified", "scheduled"  # SlotCharge.rule (module docstring)


@dataclass(frozen=True)
class SlotCharge:
    """How a step's token budget and the KV reservation charge speculative decoding (module docstring).

    rule        VERIFIED: reserve the previous step's verified drafts (the project's engines); SCHEDULED:
                vLLM's scheduler, every decoding request is scheduled its whole proposal
    drafts      draft tokens per decoding request [tokens]: kmax under VERIFIED; vLLM's
                num_speculative_tokens under SCHEDULED
    extra       slots charged per scheduled request on top of its tokens [tokens] (vLLM's
                max_num_new_slots_for_drafting); 0 under VERIFIED
    lookahead   KV slots reserved past the scheduled tokens [tokens] (vLLM's num_lookahead_tokens)
    verify_all  the target verifies every scheduled draft slot (no adaptive verification to trim them): the
                step's forward is charged 1 + drafts per decoding request, matched or not
    per_batch   vLLM's dynamic speculation length (num_speculative_tokens_per_batch_size, sim.core.vllm
                parse_per_batch: ((start, end, K), ...)): a step schedules drafts_for(b) drafts per decoding
                request, b = the requests the previous step scheduled (vLLM sizes the next step's proposals from
                the step it schedules); () = always `drafts`
    variable    the proposals keep their own length (vLLM's suffix decoding): a decoding request is scheduled
                1 + min(its proposal, drafts) tokens (Scheduler.draft_lens), not 1 + drafts; `drafts` stays
                the bound that the KV reservation and the steady test use
    Made for vLLM in one place (sim.core.vllm.vllm_slot_charge); VERIFIED's is `SlotCharge.verified(kmax)`.
    """

    rule: str = VERIFIED
    drafts: int = 0
    extra: int = 0
    lookahead: int = 0
    verify_all: bool = False
    per_batch: tuple = ()
    variable: bool = False

    def __post_init__(self) -> None:
        if self.rule not in (VERIFIED, SCHEDULED):
            raise ConfigError(f"slot charge rule must be {VERIFIED!r} or {SCHEDULED!r}, got {self.rule!r}")
        for name in ("drafts", "extra", "lookahead"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"slot charge: {name} must be an integer >= 0, got {v!r}")
        if self.rule == VERIFIED and (self.extra or self.lookahead or self.verify_all or self.per_batch
                                      or self.variable):
            raise ConfigError("slot charge: extra, lookahead, verify_all, per_batch and variable belong to the "
                              "'scheduled' rule")

    def drafts_for(self, scheduled: int) -> int:
        """Drafts per decoding request after a step that scheduled `scheduled` requests [tokens]: min(drafts, K of
        the last per_batch range starting at or below it) -- inside a range its K, in a gap between ranges or past
        the last the K before it, as vLLM fills its dense table; `drafts` where there is no table or nothing was
        scheduled (vLLM then keeps num_speculative_tokens)."""
        k = self.drafts
        if self.per_batch and scheduled > 0:
            for start, _, kk in self.per_batch:
                if start > scheduled:
                    break
                k = min(self.drafts, kk)
        return k

    @classmethod
    def verified(cls, kmax: int) -> "SlotCharge":
        """The project's engines' charge for chains of at most kmax drafts."""
        return cls(VERIFIED, drafts=kmax)

    @property
    def kv_extra(self) -> int:
        """KV tokens a decoding request reserves past its context: its drafts, the bonus token, the lookahead."""
        return self.drafts + 1 + self.lookahead

    @property
    def per_decode(self) -> int:
        """Budget one fully scheduled decoding request takes under SCHEDULED: 1 + drafts + extra [tokens]."""
        return 1 + self.drafts + self.extra


@dataclass
class RequestState:
    """Per-request scheduling state (arrays of length n, one entry per request of the trace).

    pos             output tokens emitted so far
    prefilled       tokens of the current prefill target processed
    prefill_target  tokens to prefill before decoding: the prompt, or prompt + generated after a preemption
    n_preempt       times the request was preempted
    fresh           True until the request's first decode step since it was (re)admitted (vLLM's
                    add_request resets its stale confidences then)
    """

    pos: np.ndarray
    prefilled: np.ndarray
    prefill_target: np.ndarray
    n_preempt: np.ndarray
    fresh: np.ndarray

    @classmethod
    def new(cls, prompt_len: np.ndarray) -> "RequestState":
        n = len(prompt_len)
        return cls(pos=np.zeros(n, dtype=np.int64), prefilled=np.zeros(n, dtype=np.int64),
                   prefill_target=np.asarray(prompt_len, dtype=np.int64).copy(),
                   n_preempt=np.zeros(n, dtype=np.int64), fresh=np.ones(n, dtype=bool))


@dataclass
class StepPlan:
    """One step's schedule: decoding requests, (request, chunk) prefill pieces, how many were preempted
    (`preempted_ids`: which, in preemption order), and `draft_cap`."""

    decoding: np.ndarray
    prefilling: list[tuple[int, int]]
    preempted: int
    preempted_ids: list[int]
    # drafts scheduled per decoding request where the 'scheduled' rule's budget cut them (the last one
    # scheduled may get fewer than its chain); None: every decoding request is scheduled its whole chain
    draft_cap: np.ndarray | None = None


class Scheduler:
    """Admission, token budget, chunked prefill and preemption; see the module docstring for the rules."""

    def __init__(self, prompt_len: np.ndarray, batch_size: int, max_num_batched_tokens: int, block_size: int,
                 kv_capacity_tokens: int, kmax: int, out_len: np.ndarray | None = None,
                 charge: SlotCharge | None = None) -> None:
        """charge: how the budget and the KV charge drafts (None: SlotCharge.verified(kmax))."""
        self.prompt_len = np.asarray(prompt_len, dtype=np.int64)
        self.batch_size, self.budget, self.block = batch_size, max_num_batched_tokens, block_size
        self.kv_cap, self.kmax = kv_capacity_tokens, kmax
        self.charge = SlotCharge.verified(kmax) if charge is None else charge
        if self.charge.rule == VERIFIED and self.charge.drafts != kmax:
            raise ConfigError(f"slot charge: the 'verified' rule reserves kmax = {kmax} drafts, got {self.charge.drafts}")
        if self.charge.rule == SCHEDULED and self.budget <= self.charge.extra:  # nothing could ever be scheduled
            raise ConfigError(f"--max-num-batched-tokens {self.budget} cannot hold one token of a request plus the "
                              f"{self.charge.extra} extra slot(s) vLLM's scheduler charges it: give at least "
                              f"{self.charge.extra + 1}")
        self.kv_extra = self.charge.kv_extra  # KV tokens past the context per running request (kmax + 1 by default)
        self.state = RequestState.new(self.prompt_len)
        self.running: list[int] = []
        self.waiting: deque[int] = deque()  # FIFO; a deque: a million queued requests pop in O(1)
        self.last_draft = 0  # draft slots verified in the previous step (the next step's reservation)
        self.last_scheduled = 0  # requests the previous step scheduled (SlotCharge.per_batch's batch size)
        self.step_k = None  # drafts per decoding request this step under SlotCharge.per_batch, else None
        # SlotCharge.variable: decoding requests -> the length of each one's proposal (int64 [R]), asked as the
        # budget is split (the engine proposes then, as vLLM drafted after the previous step); None: `drafts` each
        self.draft_lens = None
        self.out_len = None if out_len is None else np.asarray(out_len, dtype=np.int64)
        self._steady = None  # the decoding requests while the running set is steady (module docstring)
        self._run = None  # running as an int64 array, while the list is unchanged (_running_array)
        self._buf = np.empty(0, dtype=np.int64)  # storage _run may view, grown in place by admissions
        # The engine's native scans (sim/engine/native_step.py, NativeScans: kv_used, split, done, full_need), or None:
        # the numpy below, which they transcribe, runs. Only for more than SMALL running requests.
        self.scans = None

    def add(self, r: int) -> None:
        """A request arrives: it waits for admission."""
        self.waiting.append(int(r))

    def idle(self) -> bool:
        return not self.running and not self.waiting

    def kv_need(self, r: int, extra: int) -> int:
        """KV tokens request r holds, in whole blocks, once `extra` more tokens are cached."""
        return in_blocks(int(self.prompt_len[r]) + int(self.state.pos[r]) + extra, self.block)

    def _running_array(self) -> np.ndarray:
        """`running` as an int64 array, made once per change of the running set (every change goes through
        this class, which drops it or, for an admission, extends it in place: _admitted)."""
        if self._run is None:
            n = len(self.running)
            if self._buf.size < n:
                self._buf = np.empty(max(n, min(self.batch_size, len(self.prompt_len))), dtype=np.int64)
            self._buf[:n] = self.running
            self._run = self._buf[:n]
        return self._run

    def _admitted(self, r: int) -> None:
        """running.append(r), and _run with it: written past its end where it views _buf and there is room
        (a numpy list conversion costs microseconds at a batch of 128), else dropped."""
        self.running.append(r)
        run = self._run
        if run is not None and run.base is self._buf and len(run) < self._buf.size:
            self._buf[len(run)] = r
            self._run = self._buf[:len(run) + 1]
        else:
            self._run = None

    def kv_used(self) -> int:
        """KV tokens the running requests hold after this step (each its context + kv_extra), in blocks."""
        if not self.running:
            return 0
        bs, extra = self.block, self.kv_extra
        if len(self.running) <= SMALL:  # integers either way; per-element Python beats numpy's call overhead
            pl, pos = self.prompt_len, self.state.pos
            return sum(in_blocks(int(pl[r]) + int(pos[r]) + extra, bs) for r in self.running)
        r = self._running_array()
        if self.scans is not None:
            return self.scans.kv_used(r, extra, bs)
        return int(in_blocks(self.prompt_len[r] + self.state.pos[r] + extra, bs).sum())

    def steady(self) -> bool:
        """Whether `schedule` returns the steady plan now: the running set is steady (module docstring) and
        nothing can be admitted (nothing waits, or the batch is full). Its decoding requests: `steady_decoding`."""
        return self._steady is not None and not (self.waiting and len(self.running) < self.batch_size) \
            and not self.charge.per_batch  # per_batch: the drafts follow the last step's count, not the set

    @property
    def steady_decoding(self) -> np.ndarray | None:
        """The decoding requests of the steady plan (int64 ids, running order; the array `schedule` hands
        every steady step), or None while the running set is not steady."""
        return self._steady

    def schedule(self) -> StepPlan:
        """Admit waiting requests, preempt on KV overflow, and split the token budget."""
        st, kmax = self.state, self.kmax
        if self.steady():
            return StepPlan(self._steady, [], 0, [])
        # used = kv_used(), computed once and then kept by adding or removing the one request whose term
        # changes (positions do not move during scheduling): the same integers without a sum per admission
        used = None
        while self.waiting and len(self.running) < self.batch_size:
            r = self.waiting[0]
            need = self.kv_need(r, self.kv_extra)
            if self.running:
                if used is None:
                    used = self.kv_used()
                if used + need > self.kv_cap:
                    break
            self.waiting.popleft()
            self._admitted(r)
            if used is not None:
                used += need
            self._steady = None
        preempted: list[int] = []
        while len(self.running) > 1:
            if used is None:
                used = self.kv_used()
            if used <= self.kv_cap:
                break
            r = self.running.pop()
            self._run = None
            used -= self.kv_need(r, self.kv_extra)
            st.prefill_target[r] = self.prompt_len[r] + st.pos[r]
            st.prefilled[r] = 0
            st.n_preempt[r] += 1
            st.fresh[r] = True
            self.waiting.appendleft(r)
            preempted.append(r)
            self._steady = None
        budget = self.budget
        if len(self.running) <= SMALL:  # the same integers without numpy's per-call overhead
            tgt, done = st.prefill_target, st.prefilled
            pend = [(r, int(tgt[r]) - int(done[r])) for r in self.running]
            decoding = np.array([r for r, p in pend if p <= 0], dtype=np.int64)
            waiting_prefill = [(r, p) for r, p in pend if p > 0]
        elif self.scans is not None:
            decoding, waiting_prefill = self.scans.split(self._running_array())
        else:
            run = self._running_array()
            pending = st.prefill_target[run] - st.prefilled[run]
            decoding = run[pending <= 0]
            waiting_prefill = zip(run[pending > 0].tolist(), pending[pending > 0].tolist())
        cap = None
        if self.charge.rule == SCHEDULED:
            decoding, prefilling, cap = self._split_scheduled(decoding, waiting_prefill)
        else:
            # Decoding requests take one token each plus the draft slots; like adaptive verification's
            # CPU-side budget, the reservation is the previous step's verified draft count (known to the
            # host under async scheduling), capped at the chains' full length.
            budget -= len(decoding) + min(self.last_draft, len(decoding) * kmax)
            prefilling = []
            for r, left in waiting_prefill:
                if budget <= 0:
                    break
                chunk = min(left, budget)
                prefilling.append((r, chunk))
                budget -= chunk
        if len(decoding) == len(self.running) and self._steady is None and self._fits_to_the_end() and \
                not (self.charge.variable and len(decoding) * self.charge.per_decode > self.budget):
            self._steady = decoding  # (variable: only where whole chains of `drafts` would fit too)
        self.last_scheduled = len(decoding) + len(prefilling)
        return StepPlan(decoding, prefilling, len(preempted), preempted, cap)

    @property
    def may_cut_drafts(self) -> bool:
        """Whether the 'scheduled' rule can ever cut a decoding request's drafts (or leave it out): a full batch
        of whole chains passes the budget. Engines that gather chains at their full width (the native step)
        step as defined when it can."""
        c = self.charge
        most = min(self.batch_size, len(self.prompt_len))
        return c.rule == SCHEDULED and (most * c.per_decode > self.budget or bool(c.per_batch))

    def _split_scheduled(self, decoding: np.ndarray, waiting_prefill) -> tuple:
        """The 'scheduled' rule (module docstring): (decoding requests scheduled, prefill chunks, draft_cap or
        None). Decoding requests come first in running order (admission is FIFO, so no prefilling request is
        ahead of a decoding one), each charged 1 + drafts + extra while more than `extra` is left; drafts: the
        charge's per_batch K for the previous step's count (step_k), or all of them; under SlotCharge.variable
        each request's own proposal, at most that many (`_split_variable`)."""
        c = self.charge
        drafts = c.drafts_for(self.last_scheduled) if c.per_batch else c.drafts
        self.step_k = drafts if c.per_batch else None
        budget, per = self.budget, 1 + drafts + c.extra
        cap = None
        if c.variable:
            decoding, cap, budget = self._split_variable(decoding, drafts)
        elif len(decoding) * per > budget:
            full = budget // per
            left = budget - full * per
            part = left - c.extra  # tokens the next request gets: 1 + its cut drafts (if >= 1)
            n = full + (1 if part >= 1 else 0)
            cap = np.full(n, drafts, dtype=np.int64)
            if part >= 1:
                cap[-1] = part - 1
            decoding = decoding[:n]
            budget = 0 if part >= 1 else left
        else:
            budget -= len(decoding) * per
            if drafts < c.drafts:
                cap = np.full(len(decoding), drafts, dtype=np.int64)
        prefilling = []
        for r, left in waiting_prefill:
            if budget <= c.extra:
                break
            chunk = min(left, budget - c.extra)
            prefilling.append((r, chunk))
            budget -= chunk + c.extra
        return decoding, prefilling, cap

    def _split_variable(self, decoding: np.ndarray, drafts: int) -> tuple:
        """The decoding part of the 'scheduled' rule for proposals of their own length (SlotCharge.variable):
        request i, in running order, takes 1 + d_i + extra, d_i = min(its proposal, drafts), while the budget
        holds it; the first that does not fit gets 1 + what is left past `extra` (if >= 1) and the rest wait.
        Returns (decoding requests scheduled, draft_cap or None when none was cut, budget left) [tokens]."""
        c, budget = self.charge, self.budget
        if not len(decoding):
            return decoding, None, budget
        lens = np.full(len(decoding), drafts, dtype=np.int64) if self.draft_lens is None else \
            np.asarray(self.draft_lens(decoding), dtype=np.int64)
        own = np.minimum(lens, drafts)
        used = np.cumsum(1 + own + c.extra)
        if used[-1] <= budget:
            return decoding, None, budget - int(used[-1])
        full = int(np.searchsorted(used, budget, side="right"))  # requests scheduled whole
        left = budget - (int(used[full - 1]) if full else 0)
        part = left - c.extra  # tokens the next request gets: 1 + its cut drafts (if >= 1)
        n = full + (1 if part >= 1 else 0)
        cap = own[:n].copy()
        if part >= 1:
            cap[-1] = part - 1
        return decoding[:n], cap, (0 if part >= 1 else left)

    def _fits_to_the_end(self) -> bool:
        """Whether the running requests' KV fits at every later step without a change of the running set:
        at most one runs, or their need at the last step (pos = out_len) fits the capacity."""
        if self.out_len is None:
            return False
        if len(self.running) <= 1:
            return True
        r = self._running_array()
        if self.scans is not None:
            return self.scans.full_need(r, self.kv_extra - 1, self.block) <= self.kv_cap
        return int(full_kv_need(self.prompt_len[r] + self.out_len[r], self.kv_extra - 1, self.block).sum()) <= self.kv_cap

    def pop_finished(self, out_len: np.ndarray) -> list[int]:
        """Remove the running requests whose output is complete -- its output emitted (pos >= out_len) and no
        prefill pending -- and return their ids, in running order."""
        st = self.state
        pos, pre, tgt = st.pos, st.prefilled, st.prefill_target
        if len(self.running) <= SMALL:  # the same comparisons without numpy's per-call overhead
            done, keep = [], []
            for r in self.running:
                (done if pos[r] >= out_len[r] and pre[r] >= tgt[r] else keep).append(r)
            if done:
                self.running = keep
                self._run = self._steady = None
            return done
        run = self._running_array()
        if self.scans is not None:
            done = self.scans.done(run, out_len)  # run keeps the others, at its front
            if done:
                self._run = run[:len(run) - len(done)]
                for r in done:
                    self.running.remove(r)
                self._steady = None
            return done
        done = pos[run] >= out_len[run]
        if not done.any():  # the usual step: nothing reached its length (the prefill test only where one did)
            return []
        done[done] = pre[run[done]] >= tgt[run[done]]
        self._run = run[~done]
        self.running = self._run.tolist()
        self._steady = None
        return run[done].tolist()
