"""How the hybrid speculator follows vLLM's adaptive-verification manager (no vLLM import; tested with fakes).

vLLM's Model Runner V2 builds the manager in initialize_kv_cache, which runs twice on a GPU: once while
profiling CUDA-graph memory (that manager is dropped) and once for real. Only the live one gets cost tables,
from `set_cost_curves` (called by `set_initial_cost_curves` after the capture, or by the CPU harness after
warm-up). So the speculator
  - takes every manager the runner builds, the newest replacing the older (`attach_manager`);
  - learns of the tables when they arrive: `set_cost_curves` is wrapped on that manager instance, and the
    owner's `on_cost_tables(draft_table, verify_table)` runs right after it, outside any step (upload to the
    device, warm the step's kernels), so no step copies host memory to the device.
"""
from __future__ import annotations

from typing import Any, Protocol


class TableOwner(Protocol):
    adaptive_manager: Any

    def on_cost_tables(self, draft_table, verify_table) -> None: ...


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
