"""Step-cost models: analytic roofline and profiled tables behind one interface.

    make_cost_model("roofline", "qwen3-8b", "h100-sxm", gpu_memory_utilization=0.9, draft_layers=2)
    make_cost_model("profiled", "qwen3-8b", "h100-sxm", path="models/cost_tables/h100-sxm_qwen3-8b.json")

    make_cost_model("profiled", "smollm2-135m", gpu="runs/cpu_smollm2-135m.json")   # a table file as gpu

Keyword arguments are CostConfig fields (gpu_memory_utilization, drafter, draft_layers,
tensor_parallel_size, max_num_batched_tokens, max_num_seqs); "profiled" also takes `path` (a JSON or
CSV table; default models/cost_tables/<gpu>_<llm>.json). For "profiled", `gpu` may itself be a table
file (is_table_path: it ends in .json or .csv, or contains a path separator): that table's llm must match
`llm`, and parts it lacks fall back to the roofline model of `llm` on the table's gpu when both have
specs in models/ (otherwise asking for a missing part is a ConfigError). This is the one place that
resolves --gpu for sim.api.run, sim.api.sweep and sim.api.sensitivity. `python -m sim.cost` prints the anchor figures.

Kinds are registered (`@cost_kind("name")` on a builder `(llm, gpu, **kw) -> CostModel`), like policies and
drafters; a cost model prices what a policy declares (Policy.adaptive_verification), never its name.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from sim.core.cost.base import CostModel
from sim.core.cost.config import CostConfig
from sim.core.cost.profiled import (MACHINE_IDENTITY_KEYS, CostTable, ProfiledCost, StepTable, check_machine,
                               default_table_path, list_cost_tables, load_cost_table, roofline_fallback,
                               tables_from_cost_model, vllm_capture_sizes, write_cost_table)
from sim.core.cost.roofline import RooflineCost
from sim.infra.errors import ConfigError
from sim.infra.registry import Registry
from sim.core.models import DEFAULT_GPU, DEFAULT_LLM

DEFAULT_COST_KIND = "roofline"

_KINDS: Registry[Callable[..., CostModel]] = Registry("cost model")


def cost_kind(name: str):
    """Decorator: register `build(llm, gpu, **kw) -> CostModel` as the cost-model kind `name` (`--cost NAME`; the one
    registry idiom, sim/infra/registry.py). `build` validates its own arguments and raises ConfigError (one line) on a
    bad one."""
    return _KINDS.register(name)


def cost_kinds() -> tuple[str, ...]:
    """The registered cost-model kinds, in registration order."""
    return tuple(_KINDS)


def is_table_path(gpu) -> bool:
    """Whether a --gpu value names a cost-table file rather than a GPU spec."""
    g = str(gpu)
    return g.lower().endswith((".json", ".csv")) or "/" in g or os.sep in g


@cost_kind("roofline")
def _roofline(llm: str, gpu: str, **kw) -> CostModel:
    """The analytic roofline of `llm` on the GPU spec `gpu` (models/llms, models/gpus)."""
    if is_table_path(gpu):
        raise ConfigError(f"gpu '{gpu}' is a cost table; it needs cost model 'profiled', not 'roofline'")
    if "path" in kw:
        raise ConfigError("cost model 'roofline' takes no table path; use kind 'profiled'")
    return RooflineCost(CostConfig(llm=llm, gpu=gpu, **kw))


@cost_kind("profiled")
def _profiled(llm: str, gpu: str, **kw) -> CostModel:
    """A profiled table (python real/profile_costs.py) looked up as vLLM does: `gpu` itself a table file, or `path=`,
    or the default table of `llm` on `gpu` (models/cost_tables); parts a table lacks fall back to the roofline."""
    if is_table_path(gpu):
        if "path" in kw:
            raise ConfigError(f"give the cost table either as gpu ('{gpu}') or as path, not both")
        table = load_cost_table(gpu)
        if table.llm.strip().lower() != str(llm).strip().lower():
            raise ConfigError(f"cost table {gpu} was profiled for model {table.llm}, not {llm}")
        return ProfiledCost(table, fallback=roofline_fallback(llm, table.gpu, **kw))
    path = kw.pop("path", None)
    fallback = RooflineCost(CostConfig(llm=llm, gpu=gpu, **kw))  # validates names and memory first
    if path is None:
        path = default_table_path(fallback.config.llm.strip().lower(), fallback.config.gpu.strip().lower())
        if not Path(path).is_file():
            raise ConfigError(f"no cost table for {llm} on {gpu} ({path}); pass path=... or choose one of: "
                              f"{', '.join(list_cost_tables()) or '(none)'}")
    table = load_cost_table(path)
    if (table.llm.lower(), table.gpu.lower()) != (llm.strip().lower(), gpu.strip().lower()):
        raise ConfigError(f"cost table {path} is for {table.llm} on {table.gpu}, not {llm} on {gpu}")
    return ProfiledCost(table, fallback=fallback)


COST_KINDS = cost_kinds()  # the built-in kinds (a kind registered later is in cost_kinds())


def make_cost_model(kind: str = DEFAULT_COST_KIND, llm: str = DEFAULT_LLM, gpu: str = DEFAULT_GPU,
                    **kw) -> CostModel:
    """Build a cost model by kind name (the registry: cost_kind); ConfigError for unknown kinds, names or
    impossible configs."""
    k = kind.strip().lower() if isinstance(kind, str) else kind
    return _KINDS.lookup(k)(llm, gpu, **kw)  # an unknown kind: one line naming the registered ones


__all__ = ["CostModel", "CostConfig", "RooflineCost", "ProfiledCost", "CostTable", "StepTable", "make_cost_model",
           "COST_KINDS", "DEFAULT_COST_KIND", "load_cost_table", "tables_from_cost_model", "write_cost_table",
           "vllm_capture_sizes", "default_table_path", "list_cost_tables", "check_machine", "MACHINE_IDENTITY_KEYS",
           "roofline_fallback", "is_table_path", "cost_kind", "cost_kinds"]
