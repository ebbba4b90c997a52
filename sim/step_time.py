"""The engine's time model of one step (sim/engine.py's module docstring), written once for every path that
charges a step: Engine._finish_step, the fast-forward (sim/engine_ff.py) and steady stretches
(sim/engine_stretch.py).

    gpu  = draft + ngram + alloc + verify + sample        [ms], summed left to right (the step log's floats)
    step = gpu + cpu        where the host syncs: a policy or drafter that reads GPU results on the CPU, or
                            synchronous scheduling
    step = max(gpu, cpu)    otherwise (asynchronous scheduling overlaps step t+1's CPU work with step t's GPU)
    bubble = step - gpu     the time the GPU waits
"""
from __future__ import annotations


def host_syncs(policy, cfg) -> bool:
    """Whether the step's CPU work serialises with its GPU work: the policy needs a host sync, or the engine
    schedules synchronously (EngineConfig.async_scheduling False)."""
    return bool(policy.host_sync or not cfg.async_scheduling)


def step_time(draft: float, ngram: float, alloc: float, verify: float, sample: float, cpu: float,
              sync: bool) -> tuple[float, float]:
    """(gpu, step) [ms] of one step (module docstring)."""
    gpu = draft + ngram + alloc + verify + sample
    return gpu, (gpu + cpu if sync else max(gpu, cpu))
