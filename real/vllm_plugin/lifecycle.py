"""How the hybrid speculator follows vLLM's adaptive-verification manager (no vLLM import; tested with fakes).

vLLM's Model Runner V2 builds the manager in initialize_kv_cache, which runs twice on a GPU: once while
profiling CUDA-graph memory (that manager is dropped) and once for real. Only the live one gets cost tables,
from `set_cost_curves` (called by `set_initial_cost_curves` after the capture, or by the CPU harness after
warm-up). So the speculator
  - takes every manager the runner builds, the newest replacing the older (`attach_manager`);
  - learns of the tables when they arrive: `set_cost_curves` is wrapped on that manager instance, and the
    owner's `on_cost_tables(draft_table, verify_table)` runs right after it, outside any step (upload to the
    device, warm the step's kernels), so no step copies host memory to the device.
With hybrid_spec.skip on CUDA the skipped pass needs its own cost, which vLLM does not profile: `attach_skip_profile`
has vLLM's profiling loop (capture_model: every batch of `batches_to_profile`, one timed dummy step each, then
`set_initial_cost_curves(samples)`) run its batches twice, the second time with the owner's skip_block set, and
splits the samples: the first round's go to vLLM, the second's to the owner (`on_skip_curve`). Both are public
methods of the manager, wrapped on the instance.
"""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class TableOwner(Protocol):
    adaptive_manager: Any

    def on_cost_tables(self, draft_table, verify_table) -> None: ...


class SkipOwner(Protocol):
    skip_block: bool

    def on_skip_curve(self, curve: list[tuple[int, float]], cudagraph_limit: int) -> None: ...


def attach_manager(owner: TableOwner, manager) -> None:
    """Make `manager` the owner's live manager and call owner.on_cost_tables whenever its tables are set
    (at once when it already has them)."""
    owner.adaptive_manager = manager
    if manager is None:
        return
    current = manager.set_cost_curves
    inner = getattr(current, "_hybridspec_inner", current)  # wrap once, even if attached twice

    def set_cost_curves(*args, **kwargs):
        out = inner(*args, **kwargs)
        if manager.cost_tables is not None and owner.adaptive_manager is manager:
            owner.on_cost_tables(*manager.cost_tables)
        return out

    set_cost_curves._hybridspec_inner = inner
    manager.set_cost_curves = set_cost_curves
    if manager.cost_tables is not None:
        owner.on_cost_tables(*manager.cost_tables)


def skip_curve(samples) -> list[tuple[int, float]]:
    """(R, median drafter ms) of the timed steps, by request count R, from CUDA-graph replays only (as vLLM prices its
    draft curve: an eager target step inflates the drafter's timing)."""
    by: dict[int, list[float]] = {}
    for s in samples:
        if getattr(s, "full_cudagraph", True):
            by.setdefault(int(s.num_reqs), []).append(float(s.drafter_ms))
    return [(r, float(np.median(v))) for r, v in sorted(by.items())]


def attach_skip_profile(owner: SkipOwner, manager) -> None:
    """Profile the skipped pass with vLLM's own profiling loop (module docstring); idempotent per manager. The split
    needs one timed step per batch (vLLM's collector times each dummy run that reaches the drafter): any other count
    is one RuntimeError, not a silently mixed draft curve."""
    if getattr(manager, "_hybridspec_skip_profile", False):
        return
    batches, initial = manager.batches_to_profile, manager.set_initial_cost_curves
    rounds: dict = {}

    def batches_to_profile(capture_sizes):
        first = list(batches(capture_sizes))
        rounds.update(n=len(first), limit=int(capture_sizes[-1]) if capture_sizes else 0)
        yield from first
        owner.skip_block = True
        try:
            yield from (dict(b) for b in first)
        finally:
            owner.skip_block = False

    def set_initial_cost_curves(samples):
        n = rounds.pop("n", None)
        if n is None or not samples:  # not a profile of ours (or nothing timed): vLLM's own
            return initial(samples)
        if len(samples) != 2 * n:
            raise RuntimeError(f"hybridspec: vLLM timed {len(samples)} profiling steps for 2 x {n} batches, so the "
                               "skipped pass's samples cannot be told apart; run without hybrid_spec.skip")
        out = initial(list(samples[:n]))
        owner.on_skip_curve(skip_curve(samples[n:]), rounds.get("limit", 0))
        return out

    manager.batches_to_profile = batches_to_profile
    manager.set_initial_cost_curves = set_initial_cost_curves
    manager._hybridspec_skip_profile = True
