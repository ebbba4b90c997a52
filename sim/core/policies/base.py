"""The contract between engines and allocation policies: what a policy sees each step and what it returns.

Every engine (the simulator, the torch engine, the vLLM plugin) runs one decode step in three phases and
calls a policy from the registry (`sim.core.policies.registry`) in two of them:

  1. plan      on the host, before any drafter runs: `Policy.plan(HostView) -> Plan`, from what the host
               knows (the previous step's chains, the request's history, the step's shape and prices):
               which drafters run this step and, for budgeted policies, the step's draft budget B;
  2. propose   the engine runs only the drafters the Plan names (a drafter left out is neither run nor
               charged; its chain is empty in the StepBatch);
  3. allocate  on the device, from this step's chains: `Policy.allocate(StepBatch, Plan) -> Allocation`.
               A pure function over batched tensors: no `.item()`, no `.cpu()`, no Python loop over
               requests, so the same code runs on the CPU in the simulator and inside an asynchronous GPU
               step. The Plan's fields are host values (Python bools, a host tensor), so an engine branches
               on them without a device sync.
A single-phase policy (no plan function) plans "every drafter it uses, no budget" and decides everything in
allocate. `Policy.fn(batch)` is the policy on one view, plan then allocate (what tests and the fast forms
compare against).

Shapes: R running requests that decode this step, K_d drafter d's chain length (K_m the model drafter's).
Units: costs in milliseconds, probabilities in [0, 1].
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional, Union

import torch

CHAIN_NONE = 0
CHAIN_MODEL = 1  # the registry's chain ids (sim/core/drafters/registry.py): dspark, ngram, suffix, ...
CHAIN_NGRAM = 2
MODEL, NGRAM = "dspark", "ngram"  # the default drafters (sim.core.drafters.DEFAULT_DRAFTERS): CHAIN_MODEL, CHAIN_NGRAM

FREE = -1  # Replay.chain: no recorded choice at this row; the policy chooses


@dataclass(frozen=True)
class Replay:
    """A real engine's recorded decisions, replayed as data (a recorded-drafts sidecar's `chosen` / `skipped`,
    sim/core/drafters/model.py): per decoding request, host tensors.

    chain[r]        the chain id the engine published at this step's row (CHAIN_MODEL, CHAIN_NGRAM, ...), FREE
                    where none was recorded (int64 [R]).
    skipped[r]      the engine's model pass was skipped at that row (bool [R]; False where none was recorded).
    stale_chain[r]  chain at the request's previous step (the publication its stale budget came from), FREE where
                    none was recorded (int64 [R]).
    A policy that can take a recorded decision (hybrid-vllm) takes it where recorded and reports its own beside it
    (Plan.own_drafters, Allocation.own_chain); the others ignore it."""

    chain: torch.Tensor
    skipped: torch.Tensor
    stale_chain: torch.Tensor


@dataclass
class StepBatch:
    """Everything a policy may look at for one decode step. Every drafter travels it the same way: its entries are
    indexed by its registered name (sim/core/drafters/registry.py), the two defaults (dspark, ngram) included.

    chains[d]           drafter d's current chain (conf [R, K_d], len [R]): conf[r, j] the calibrated conditional
                        acceptance estimate of token j (float), len[r] the chain's valid length (int64); slots
                        j >= len are absent. A drafter that did not run this step has len 0.
    stale_chains[d]     its host-known chain, one step old (the chain last drafted for the request): adaptive
                        verification chooses its budget from these on the CPU, as vLLM does.
    num_nondraft_tokens T: tokens in the step that are not draft slots (one per decoding request plus any
                        prefill tokens batched with it), int.
    verify_cost_ms[t]   target verify time of a step with t tokens in total, t = 0..len-1 (float [T_max+1]).
                        Monotone. Policies must clamp indices to the table's last entry.
    draft_cost_ms       time of the drafters this step if every drafter the policy uses runs, plus the
                        allocation kernel [ms] (float scalar tensor or python float).
    draft_ms_of[d]      drafter d's part of draft_cost_ms [ms] (its own price, sim/core/drafters/registry.py:
                        Drafter.price), what a policy saves by leaving it out for the whole step (Plan); absent: 0.
                        What is left, draft_cost_ms - sum of the parts, is the allocation kernel, paid whenever a
                        drafter runs.
    means[d]            the mean, over the request's earlier decode steps, of model-free drafter d's chain
                        confidence at slot j (0 where the chain was shorter) [R, K_d]: host-known history, a
                        forecast that does not hinge on the one previous proposal. Absent: unknown.
    true_acc[d]         number of leading chain tokens the target will accept (int64 [R]). Only the `oracle`
                        policy may read them; engines that cannot know them leave it empty.
    true_verify_cost_ms[t] the verify time the engine will charge for t tokens this step (with this step's
                        context), where verify_cost_ms is the start-up table policies decide from. Oracle only.
    num_sampling_reqs   N: requests that sample a token this step, int: the R decoding requests plus the
                        prefill chunks that complete their prefill (prompt, or prompt + output after a
                        preemption) this step, as vLLM's adaptive verification counts them. None = R.
    max_draft_tokens    cap on the draft budget B, int: vLLM 0.33 verifies all logits in one fp32 chunk of
                        at most 2**30 // (vocab_size * 4) rows, one per bonus token and draft slot, so
                        B <= max(0, 2**30 // (vocab_size * 4) - number of scheduled requests). None = no cap.
    The policy's online state (Policy.online_state, kept by the engine from the run's outcomes), each kind in its
    own pair of fields, as of the previous step's outcomes and of the one before (stale_*, the HostView's: the
    host plans before the previous step's outcome is back); empty unless the policy keeps that state:
    recal, stale_recal  name -> the request's online recalibration offset of that drafter [R] (logits,
                        sim/core/drafters/recalibration.py; Policy.recal).
    estimator, stale_estimator  name -> vLLM's acceptance estimator's coefficients [1 + K_m] for that drafter (the
                        model drafter; Policy.online, `adaptive:online`, sim/core/drafters/acceptance_estimator.py).
    all_matched, stale_all_matched  name -> whether every decoding request's lookup of that drafter (the n-gram
                        one) matched (0-d bool; `ngram-mtp`, sim/core/policies/ngram_mtp.py).
    replay              a real engine's recorded decisions at these rows (Replay), or None: the policy decides.
    No field is named for a drafter: a policy reads batch.chains[name] (hot paths bind the entries they read once).
    """

    chains: dict = field(default_factory=dict)
    stale_chains: dict = field(default_factory=dict)
    num_nondraft_tokens: int = 0
    verify_cost_ms: Optional[torch.Tensor] = None
    draft_cost_ms: Union[float, torch.Tensor] = 0.0
    draft_ms_of: dict = field(default_factory=dict)
    means: dict = field(default_factory=dict)
    true_acc: dict = field(default_factory=dict)
    true_verify_cost_ms: Optional[torch.Tensor] = None
    num_sampling_reqs: Optional[int] = None
    max_draft_tokens: Optional[int] = None
    recal: dict = field(default_factory=dict)
    stale_recal: dict = field(default_factory=dict)
    estimator: dict = field(default_factory=dict)
    stale_estimator: dict = field(default_factory=dict)
    all_matched: dict = field(default_factory=dict)
    stale_all_matched: dict = field(default_factory=dict)
    replay: Optional[Replay] = None

    @property
    def num_reqs(self) -> int:
        return next(iter(self.chains.values()))[0].shape[0]

    def price(self, name: str) -> Union[float, torch.Tensor]:
        """Drafter `name`'s part of draft_cost_ms [ms] (draft_ms_of; 0 where the view gives none)."""
        return self.draft_ms_of.get(name, 0.0)

    @property
    def num_sampling(self) -> int:
        """N of the goodput: num_sampling_reqs, or R when the engine does not say."""
        return self.num_reqs if self.num_sampling_reqs is None else self.num_sampling_reqs


@dataclass
class HostView:
    """What the host knows of a step before any drafter runs: the input of `Policy.plan`. The fields have
    StepBatch's names and meanings (see there), so the shared helpers (sim.core.policies.common: goodput,
    best_budget, ...) read either. No current chain is here: it is not drafted yet.

    scheduled_len[d]    the chain length the step schedules for drafter d (int64 [R]), known before its pass: for
                        the model drafter min(K_m, output left, the step's draft cap) (vLLM masks its stale
                        survivals with it); the engines give the model drafter's, a lookup's length being known
                        only once it ran (host_view of a one-view batch gives every drafter's current length).
    recal, estimator, all_matched   the policy's online state one step older (StepBatch.stale_recal,
                        stale_estimator, stale_all_matched).
    replay              StepBatch.replay (host data: the recorded decisions are known before the step)."""

    stale_chains: dict = field(default_factory=dict)
    scheduled_len: dict = field(default_factory=dict)
    num_nondraft_tokens: int = 0
    verify_cost_ms: Optional[torch.Tensor] = None
    draft_cost_ms: Union[float, torch.Tensor] = 0.0
    draft_ms_of: dict = field(default_factory=dict)
    means: dict = field(default_factory=dict)
    num_sampling_reqs: Optional[int] = None
    max_draft_tokens: Optional[int] = None
    recal: dict = field(default_factory=dict)
    estimator: dict = field(default_factory=dict)
    all_matched: dict = field(default_factory=dict)
    replay: Optional[Replay] = None

    @property
    def num_reqs(self) -> int:
        return next(iter(self.stale_chains.values()))[0].shape[0]

    num_sampling = StepBatch.num_sampling
    price = StepBatch.price


def host_view(batch: StepBatch) -> HostView:
    """The HostView of a StepBatch (its host-known fields, no copies; the current chains' lengths are the scheduled
    ones)."""
    return HostView(stale_chains=batch.stale_chains, scheduled_len={d: c[1] for d, c in batch.chains.items()},
                    num_nondraft_tokens=batch.num_nondraft_tokens, verify_cost_ms=batch.verify_cost_ms,
                    draft_cost_ms=batch.draft_cost_ms, draft_ms_of=batch.draft_ms_of, means=batch.means,
                    num_sampling_reqs=batch.num_sampling_reqs, max_draft_tokens=batch.max_draft_tokens,
                    recal=batch.stale_recal, estimator=batch.stale_estimator, all_matched=batch.stale_all_matched,
                    replay=batch.replay)


@dataclass(frozen=True)
class Plan:
    """A policy's host-side decision for one step (phase 1, module docstring), made before any drafter runs.

    drafters      every drafter that runs this step, by registered name (sim/core/drafters/registry.py), a host
                  frozenset: the engine proposes and charges only those, without a device sync.
    budget        the step's draft budget B, total draft slots (0-d int64 host tensor), which sizes the
                  verify pass before it is launched; None: the policy's allocate sizes the step itself.
    own_drafters  where a recorded decision (HostView.replay) set `drafters`: the policy's own set (a host
                  frozenset), which the engine counts against it; None: `drafters` is the policy's own.
    """

    drafters: frozenset
    budget: Optional[torch.Tensor] = None
    own_drafters: Optional[frozenset] = None

    def runs(self, name: str) -> bool:
        """Whether drafter `name` runs this step."""
        return name in self.drafters


@dataclass
class Allocation:
    """A policy's decision: per request, which chain is verified and how many of its leading tokens.

    chain[r]     CHAIN_NONE, CHAIN_MODEL or CHAIN_NGRAM (int64 [R]).
    admitted[r]  number of draft tokens of that chain verified this step (int64 [R]); 0 when chain is NONE,
                 never more than that chain's length.
    second[r]    optional (tree policies): leading tokens of the *other* chain verified in the same pass as
                 a second branch of a two-branch tree (int64 [R]); 0 where chain is NONE. The request then
                 emits max(accepted of either branch) + 1 tokens. None for single-chain policies.
    second_chain[r]  optional: the chain id of the second branch (int64 [R]), where a run has more than two
                 drafters (sim/core/policies/multi.py's tree); None: the other of CHAIN_MODEL and CHAIN_NGRAM.
    ran          optional, drafter name -> 0-d bool: what `Policy.fn` reports of its Plan (Plan.drafters) so
                 that one-view callers (tests, fast forms) see the drafters the step ran; an engine reads the
                 Plan, not this. One exception: the `oracle`, a simulation-only bound that reads the true
                 accepted lengths, chooses after the proposals which drafters it is charged for; an engine reads
                 its `ran` on the host copy of the Allocation (the truth is host data). None, or a drafter
                 absent from it: as planned.
    steps        optional, drafter name -> 0-d int64: the sequential steps that drafter's pass ran where it is a
                 sequential head (an MTP or EAGLE-style profile: CostModel.draft_ms(R, steps)); vLLM main's
                 NgramMTPSpeculator skips the model drafter's decode steps after the first when every request's
                 n-gram lookup matched. Read on the host copy, as ran; only the numpy step reads it (a policy
                 reporting it keeps an online state, Policy.online, which takes that step), and only the model
                 drafter's entry today. None, or a drafter absent from it: the whole chain.
    verified     optional int64 [R]: the draft slots vLLM verifies in the row, >= admitted (the slots past the
                 chosen chain that vLLM's adaptive verification admits, hybrid-vllm's fill=vllm); the engine charges
                 them. None = admitted.
    past_chain   optional int64 [R] with `verified`: the chain id whose own tokens fill the slots past the admitted
                 chain (at the same depths; a filler past its length), accepted where the chain before them is
                 accepted whole and that chain's are (the trace's acceptance); CHAIN_NONE: fillers, never accepted.
                 The engine models only the model chain's tokens there (CHAIN_MODEL): any other chain id is a
                 SimulatorBug (sim.engine.engine.Engine._past_chain). None = fillers everywhere.
    own_chain    optional int64 [R], where the policy took recorded choices (StepBatch.replay): the chain it would
                 have chosen itself (the engine counts the rows where it differs from `chain`). None: no replay.
    chain ids beyond CHAIN_NGRAM name the run's other drafters (sim/core/drafters/registry.py: chain_id).
    """

    chain: torch.Tensor
    admitted: torch.Tensor
    second: Optional[torch.Tensor] = None
    ran: Optional[dict] = None
    second_chain: Optional[torch.Tensor] = None
    steps: Optional[dict] = None
    verified: Optional[torch.Tensor] = None
    past_chain: Optional[torch.Tensor] = None
    own_chain: Optional[torch.Tensor] = None

    def said(self, name: str) -> Optional[torch.Tensor]:
        """What the allocation reports of drafter `name` having run (`ran`; None: as planned)."""
        return None if self.ran is None else self.ran.get(name)

    def stepped(self, name: str) -> Optional[torch.Tensor]:
        """The sequential steps drafter `name`'s pass ran (`steps`, 0-d int64; None: the whole chain)."""
        return None if self.steps is None else self.steps.get(name)


class Decision(NamedTuple):
    """An allocation as host arrays, what the simulator's native step commits (sim.engine.engine.Engine.decide, the
    fast forms' `arrays` cores of sim/engine/policy_fast.py): chain and admitted (int64 [R]), second (int64 [R]
    or None), ran (drafter name -> host bool, as Allocation.ran; None: as planned)."""

    chain: Any
    admitted: Any
    second: Any = None
    ran: Optional[dict] = None
