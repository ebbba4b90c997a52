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

Shapes: R running requests that decode this step, K_m model-chain length, K_n n-gram chain length.
Units: costs in milliseconds, probabilities in [0, 1].
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional, Union

import torch

CHAIN_NONE = 0
CHAIN_MODEL = 1  # the registry's chain ids (sim/core/drafters/registry.py): dspark, ngram, suffix, ...
CHAIN_NGRAM = 2


@dataclass
class StepBatch:
    """Everything a policy may look at for one decode step.

    model_conf[r, j]    current conditional acceptance estimate of model-chain token j (float, [R, K_m]);
                        the DSpark confidence head's output, calibrated.
    model_len[r]        valid length of the model chain (int64, [R]); slots j >= model_len are absent.
    ngram_conf[r, j]    calibrated conditional acceptance estimate of n-gram token j (float, [R, K_n]),
                        produced by the n-gram calibrator from the proposal's features.
    ngram_len[r]        length of the n-gram chain (int64, [R]); 0 means no match this step.
    stale_model_conf    the model confidences of the previous step (one step old), [R, K_m]; adaptive
                        verification chooses its budget from these on the CPU, as vLLM does.
    stale_ngram_conf    likewise for the n-gram chain, [R, K_n].
    stale_model_len, stale_ngram_len   the chain lengths that go with the stale confidences.
    num_nondraft_tokens T: tokens in the step that are not draft slots (one per decoding request plus any
                        prefill tokens batched with it), int.
    verify_cost_ms[t]   target verify time of a step with t tokens in total, t = 0..len-1 (float [T_max+1]).
                        Monotone. Policies must clamp indices to the table's last entry.
    draft_cost_ms       time of the drafters this step if every drafter the policy uses runs, plus the
                        allocation kernel [ms] (float scalar tensor or python float).
    model_draft_ms      the model drafter's pass, the part of draft_cost_ms a policy may skip for the
                        whole step (Plan.model = False) [ms]; 0 when the policy does not use it.
    ngram_draft_ms      likewise the n-gram drafter's part of draft_cost_ms [ms]. What is left,
                        draft_cost_ms - model_draft_ms - ngram_draft_ms, is the allocation kernel, paid
                        whenever a drafter runs.
    true_model_acc[r], true_ngram_acc[r]: number of leading chain tokens the target will accept (int64 [R]).
                        Only the `oracle` policy may read them; engines that cannot know them pass None.
    mean_ngram_conf[r, j] the mean, over the request's earlier decode steps, of its n-gram chain's confidence
                        at slot j (0 where the chain was shorter) [R, K_n]: host-known history, a forecast
                        of the n-gram chain that does not hinge on the one previous proposal. None: unknown.
    true_verify_cost_ms[t] the verify time the engine will charge for t tokens this step (with this step's
                        context), where verify_cost_ms is the start-up table policies decide from. Oracle only.
    num_sampling_reqs   N: requests that sample a token this step, int: the R decoding requests plus the
                        prefill chunks that complete their prefill (prompt, or prompt + output after a
                        preemption) this step, as vLLM's adaptive verification counts them. None = R.
    max_draft_tokens    cap on the draft budget B, int: vLLM 0.33 verifies all logits in one fp32 chunk of
                        at most 2**30 // (vocab_size * 4) rows, one per bonus token and draft slot, so
                        B <= max(0, 2**30 // (vocab_size * 4) - number of scheduled requests). None = no cap.
    extra               the chains of the run's other drafters (sim/core/drafters/registry.py), name -> (conf [R, K_d],
                        len [R]); empty in a two-drafter run. `chains` is every drafter's, dspark and ngram included.
    stale_extra, mean_extra   their host-known history, name -> (conf, len) of the last proposal, and name ->
                        mean confidence per slot [R, K_d] (as mean_ngram_conf).
    extra_draft_ms      name -> that drafter's part of draft_cost_ms [ms] (as ngram_draft_ms).
    true_extra_acc      name -> true accepted length [R] (oracle only, as true_ngram_acc).
    recal, stale_recal  name -> the request's online recalibration offset of that drafter [R] (logits,
                        sim/core/drafters/recalibration.py), as of the previous step's outcomes (recal) and of the one
                        before (stale_recal, the HostView's: the host plans before the previous step's outcome is
                        back); empty unless the policy recalibrates (Policy.recal). Under vLLM's acceptance
                        estimator (Policy.online, `adaptive:online`) the model drafter's entry holds the estimator's
                        coefficients [1 + K_m] instead (sim/core/drafters/acceptance_estimator.py).
    """

    model_conf: torch.Tensor
    model_len: torch.Tensor
    ngram_conf: torch.Tensor
    ngram_len: torch.Tensor
    stale_model_conf: torch.Tensor
    stale_model_len: torch.Tensor
    stale_ngram_conf: torch.Tensor
    stale_ngram_len: torch.Tensor
    num_nondraft_tokens: int
    verify_cost_ms: torch.Tensor
    draft_cost_ms: float
    true_model_acc: Optional[torch.Tensor] = None
    true_ngram_acc: Optional[torch.Tensor] = None
    true_verify_cost_ms: Optional[torch.Tensor] = None
    mean_ngram_conf: Optional[torch.Tensor] = None
    num_sampling_reqs: Optional[int] = None
    max_draft_tokens: Optional[int] = None
    model_draft_ms: Union[float, torch.Tensor] = 0.0
    ngram_draft_ms: Union[float, torch.Tensor] = 0.0
    extra: dict = field(default_factory=dict)
    stale_extra: dict = field(default_factory=dict)
    mean_extra: dict = field(default_factory=dict)
    extra_draft_ms: dict = field(default_factory=dict)
    true_extra_acc: dict = field(default_factory=dict)
    recal: dict = field(default_factory=dict)
    stale_recal: dict = field(default_factory=dict)

    @property
    def num_reqs(self) -> int:
        return self.model_conf.shape[0]

    @property
    def chains(self) -> dict:
        """Every drafter's current chain, name -> (conf [R, K_d], len [R]) (a drafter that did not run: len 0)."""
        return {"dspark": (self.model_conf, self.model_len), "ngram": (self.ngram_conf, self.ngram_len), **self.extra}

    @property
    def stale_chains(self) -> dict:
        """Every drafter's host-known (stale) chain, name -> (conf, len)."""
        return {"dspark": (self.stale_model_conf, self.stale_model_len),
                "ngram": (self.stale_ngram_conf, self.stale_ngram_len), **self.stale_extra}

    @property
    def draft_ms_of(self) -> dict:
        """Every drafter's part of draft_cost_ms, name -> ms."""
        return {"dspark": self.model_draft_ms, "ngram": self.ngram_draft_ms, **self.extra_draft_ms}

    @property
    def means(self) -> dict:
        """Every model-free drafter's mean confidence per slot over the request's earlier steps, name -> [R, K_d]
        (absent where unknown)."""
        mean = {} if self.mean_ngram_conf is None else {"ngram": self.mean_ngram_conf}
        return {**mean, **self.mean_extra}

    @property
    def num_sampling(self) -> int:
        """N of the goodput: num_sampling_reqs, or R when the engine does not say."""
        return self.num_reqs if self.num_sampling_reqs is None else self.num_sampling_reqs


@dataclass
class HostView:
    """What the host knows of a step before any drafter runs: the input of `Policy.plan`. The fields have
    StepBatch's names and meanings (see there), so the shared helpers (sim.core.policies.common: goodput,
    best_budget, ...) read either. No current chain is here: it is not drafted yet.

    model_len[r]        the model chain length the step schedules (int64 [R]; min(K_m, output left)),
                        known before the pass (vLLM masks its stale survivals with it)."""

    stale_model_conf: torch.Tensor
    stale_model_len: torch.Tensor
    stale_ngram_conf: torch.Tensor
    stale_ngram_len: torch.Tensor
    model_len: torch.Tensor
    num_nondraft_tokens: int
    verify_cost_ms: torch.Tensor
    draft_cost_ms: float
    mean_ngram_conf: Optional[torch.Tensor] = None
    num_sampling_reqs: Optional[int] = None
    max_draft_tokens: Optional[int] = None
    model_draft_ms: Union[float, torch.Tensor] = 0.0
    ngram_draft_ms: Union[float, torch.Tensor] = 0.0
    stale_extra: dict = field(default_factory=dict)
    mean_extra: dict = field(default_factory=dict)
    extra_draft_ms: dict = field(default_factory=dict)
    recal: dict = field(default_factory=dict)  # name -> recalibration offset [R] (StepBatch.stale_recal)

    @property
    def num_reqs(self) -> int:
        return self.stale_model_conf.shape[0]

    stale_chains = StepBatch.stale_chains
    draft_ms_of = StepBatch.draft_ms_of
    means = StepBatch.means

    @property
    def num_sampling(self) -> int:
        return self.num_reqs if self.num_sampling_reqs is None else self.num_sampling_reqs


def host_view(batch: StepBatch) -> HostView:
    """The HostView of a StepBatch (its host-known fields, no copies)."""
    return HostView(stale_model_conf=batch.stale_model_conf, stale_model_len=batch.stale_model_len,
                    stale_ngram_conf=batch.stale_ngram_conf, stale_ngram_len=batch.stale_ngram_len,
                    model_len=batch.model_len, num_nondraft_tokens=batch.num_nondraft_tokens,
                    verify_cost_ms=batch.verify_cost_ms, draft_cost_ms=batch.draft_cost_ms,
                    mean_ngram_conf=batch.mean_ngram_conf, num_sampling_reqs=batch.num_sampling_reqs,
                    max_draft_tokens=batch.max_draft_tokens, model_draft_ms=batch.model_draft_ms,
                    ngram_draft_ms=batch.ngram_draft_ms, stale_extra=batch.stale_extra, mean_extra=batch.mean_extra,
                    extra_draft_ms=batch.extra_draft_ms, recal=batch.stale_recal)


@dataclass(frozen=True)
class Plan:
    """A policy's host-side decision for one step (phase 1, module docstring), made before any drafter runs.

    model, ngram  whether the model (DSpark) and the n-gram drafter run this step (Python bools: the engine
                  proposes and charges only those, without a device sync).
    budget        the step's draft budget B, total draft slots (0-d int64 host tensor), which sizes the
                  verify pass before it is launched; None: the policy's allocate sizes the step itself.
    extra         the run's other drafters that run this step (names, sim/core/drafters/registry.py).
    """

    model: bool
    ngram: bool
    budget: Optional[torch.Tensor] = None
    extra: frozenset = frozenset()

    @property
    def drafters(self) -> frozenset:
        """Every drafter that runs this step, by name."""
        return frozenset(("dspark",) * self.model + ("ngram",) * self.ngram) | self.extra


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
    model_ran    optional 0-d bool, what `Policy.fn` reports of its Plan (Plan.model) so that one-view
                 callers (tests, fast forms) see the drafters the step ran; an engine reads the Plan, not
                 this. One exception: the `oracle`, a simulation-only bound that reads the true accepted
                 lengths, chooses after the proposals which drafters it is charged for; an engine reads
                 its model_ran / ngram_ran on the host copy of the Allocation (the truth is host data).
                 None = as planned.
    ngram_ran    likewise for the n-gram drafter.
    extra_ran    likewise for the run's other drafters: name -> 0-d bool (None = as planned).
    model_steps  optional 0-d int64: the sequential steps the model drafter's pass ran where it is a sequential
                 head (an MTP or EAGLE-style profile: CostModel.draft_ms(R, steps)); vLLM main's NgramMTPSpeculator
                 skips the decode steps after the first when every request's n-gram lookup matched. Read on the
                 host copy, as model_ran; only the numpy step reads it (a policy reporting it keeps an online
                 state, Policy.online, which takes that step). None = the whole chain.
    chain ids beyond CHAIN_NGRAM name the run's other drafters (sim/core/drafters/registry.py: chain_id).
    """

    chain: torch.Tensor
    admitted: torch.Tensor
    second: Optional[torch.Tensor] = None
    model_ran: Optional[torch.Tensor] = None
    ngram_ran: Optional[torch.Tensor] = None
    extra_ran: Optional[dict] = None
    second_chain: Optional[torch.Tensor] = None
    model_steps: Optional[torch.Tensor] = None


class Decision(NamedTuple):
    """An allocation as host arrays, what the simulator's native step commits (sim.engine.engine.Engine.decide, the
    fast forms' `arrays` cores of sim/engine/policy_fast.py): chain and admitted (int64 [R]), second (int64 [R]
    or None), model_ran / ngram_ran (host bools, or None: as planned)."""

    chain: Any
    admitted: Any
    second: Any = None
    model_ran: Optional[bool] = None
    ngram_ran: Optional[bool] = None
