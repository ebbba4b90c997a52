"""The engine's time model of one step (sim/engine/engine.py's module docstring), written once for every path that
charges a step: Engine._finish_step, the fast-forward (sim/engine/fast_forward.py) and steady stretches
(sim/engine/stretch.py).

    gpu  = draft + ngram + alloc + verify + sample        [ms], summed left to right (the step log's floats)
    step = gpu + cpu        where the host syncs: a policy or drafter that reads GPU results on the CPU, or
                            synchronous scheduling
    step = max(gpu, cpu)    otherwise (asynchronous scheduling overlaps step t+1's CPU work with step t's GPU)
    bubble = step - gpu     the time the GPU waits
"""
from __future__ import annotations

from dataclasses import dataclass


def host_syncs(policy, cfg) -> bool:
    """Whether the step's CPU work serialises with its GPU work: the policy needs a host sync, or the engine
    schedules synchronously (EngineConfig.async_scheduling False)."""
    return bool(policy.host_sync or not cfg.async_scheduling)


def step_time(draft: float, ngram: float, alloc: float, verify: float, sample: float, cpu: float,
              sync: bool) -> tuple[float, float]:
    """(gpu, step) [ms] of one step (module docstring)."""
    gpu = draft + ngram + alloc + verify + sample
    return gpu, (gpu + cpu if sync else max(gpu, cpu))


@dataclass(slots=True)
class StepPrices:
    """The prices of a step's drafters and allocation kernel [ms]: quoted (as if every drafter the policy uses
    runs) for the policy's view, then 0 for each that did not run (Engine.drafters_ran) for the charge. Each drafter
    prices itself (sim/core/drafters/registry.py: DrafterSpec.price, Drafter.cost); these are the engine's internal
    columns of those indexed prices (the native step's and the step log's), the policy sees them by name
    (StepBatch.draft_ms_of)."""

    draft: float = 0.0  # the model drafter's pass
    ngram: float = 0.0  # the n-gram drafter
    alloc: float = 0.0  # the allocation kernel, paid whenever a drafter runs
    extra: float = 0.0  # the run's other drafters (sim/core/drafters/registry.py), charged with the model-free ones

    def total(self) -> float:
        """draft + ngram + alloc + extra, summed left to right (the policies' draft_cost_ms)."""
        return self.draft + self.ngram + self.alloc + self.extra

    def copy(self) -> "StepPrices":
        return StepPrices(self.draft, self.ngram, self.alloc, self.extra)


@dataclass(slots=True)
class StepCharge:
    """A step's time split [ms], what Engine._charge returns and the step record keeps: the drafters' and the
    allocation's (as run), the target's verification and sampling, and the host's CPU work."""

    draft: float
    ngram: float
    alloc: float
    verify: float
    sample: float
    cpu: float
    extra: float = 0.0  # the run's live drafters (sim/engine/live.py), each in its own step column

    def times(self, sync: bool) -> tuple[float, float]:
        """(gpu, step) [ms] of this charge (step_time; the live drafters' time with the model-free n-gram's)."""
        return step_time(self.draft, self.ngram + self.extra, self.alloc, self.verify, self.sample, self.cpu, sync)
