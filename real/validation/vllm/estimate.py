"""The GPU time and disk a `real/validate.py --engine vllm` run needs, printed by its --dry-run plan (flow.plan_text).

A planning figure, not a measurement: what it rests on is printed beside it.

GPU time (seconds; CUDA only: the CPU build's harness runs interpreted kernels, which no cost model prices), summed
over the run's vLLM processes:
    processes  2 checklist processes, the complement profile's 2 `vllm bench forward` processes (CUDA, when no
               cost table is given or already in --out), one process per cell (traces x batch sizes x policies)
    start-up   STARTUP_S per process: loading the weights from the local cache, torch.compile and CUDA-graph
               capture (an assumption for an 8B target on one GPU, not measured by this project)
    a cell     warm-up (engine.py's WARMUP_TOKENS decode steps of one batch) + the timed generate, modelled without
               speculation, which bounds the steps from above:
                   steps    = waves x max_tokens,  waves = ceil(requests / B)
                   step_ms  = roofline verify_ms(B tokens, B x (mean prompt + max_tokens / 2) KV tokens, B seqs)
                   prefill  = ceil(prompt tokens / budget) x roofline verify_ms(budget tokens) (budget: the run's
                              max_num_batched_tokens)
               on the target's roofline at DEFAULT_GPU (sim/core/models.py; sim/core/cost/roofline.py)
    checklist  each of its 2 processes: CHECK_PROMPTS prompts x CHECK_MAX_TOKENS steps at batch CHECK_PROMPTS
    profile    PROFILE_S per bench process beside its start-up (the bench's cases at a few repeats each)
Disk (bytes): the target's weights (models/llms: num_params x dtype_bytes) and the DSpark drafter's (the cost
shape sim/core/cost models it with, models/drafters/dspark-cost.json: draft_layers layers of the target's shape,
a fusion projection of fusion_inputs x hidden -> hidden, and a target-sized LM head, at the target's dtype),
downloaded once into the Hugging Face cache (CUDA; the CPU build reads local directories), plus the run's
records under --out: per cell its outputs and DSpark's chains, RECORD_BYTES_PER_TOKEN x (K + 1) per output
token at most.
"""
from __future__ import annotations

import math

STARTUP_S = 90.0          # one vLLM process's start-up on one GPU (assumption, module docstring)
PROFILE_S = 120.0         # one `vllm bench forward` process's cases beside its start-up (assumption)
RECORD_BYTES_PER_TOKEN = 24  # JSON of a token id and its confidence in the records (ids, chains), about


def _roofline(llm: str):
    from sim.core.cost import make_cost_model
    from sim.core.models import DEFAULT_GPU

    return make_cost_model("roofline", llm=llm, gpu=DEFAULT_GPU), DEFAULT_GPU


def cell_seconds(cost, n: int, bs: int, max_tokens: int, mean_prompt: float, prompt_total: int, budget: int) -> float:
    """One cell's modelled GPU seconds beside its start-up (module docstring: steps x step_ms + prefill + warm-up)."""
    from real.validation.vllm.engine import WARMUP_TOKENS

    waves = math.ceil(n / bs)
    kv = int(bs * (mean_prompt + max_tokens / 2))
    step_ms = float(cost.verify_ms(bs, kv, bs))
    prefill_ms = math.ceil(prompt_total / budget) * float(cost.verify_ms(budget, 0, min(n, bs)))
    return ((waves * max_tokens + WARMUP_TOKENS) * step_ms + prefill_ms) / 1000.0


def drafter_bytes(llm) -> float:
    """The DSpark drafter's weights in bytes: the GEMM weights of the cost shape the simulator prices it with
    (sim/core/models.py DrafterCostSpec.params), at the target's dtype."""
    from sim.core.models import get_drafter_cost

    return float(get_drafter_cost().params(llm)) * llm.dtype_bytes


def estimate(v, slices) -> dict:
    """{gpu_s, startup_s, run_s, processes, weights_bytes, records_bytes, gpu}: the run's estimate (module
    docstring); `v` a flow.VllmValidation, `slices` its traces' slices."""
    from real.validation.vllm.checks import CHECK_MAX_TOKENS, CHECK_PROMPTS
    from sim.core.models import get_llm

    cfg = v.cfg
    llm = get_llm(cfg.sim_model())
    cost, gpu = _roofline(llm.name)
    run_s, cells, rec = 0.0, 0, 0.0
    budget = cfg.max_num_batched_tokens
    for sl in slices:
        n = len(sl.ids)
        prompts = [len(p) for p in sl.prompts]
        mean_p, total_p = (sum(prompts) / n if n else 0.0), sum(prompts)
        for bs in v.batch_sizes:
            for pol in v.policies_at(bs):
                cells += 1
                run_s += cell_seconds(cost, n, bs, v.max_tokens, mean_p, total_p, budget)
                rec += sum(sl.max_tokens) * (cfg.cell(pol).num_speculative_tokens + 1) * RECORD_BYTES_PER_TOKEN
    first = slices[0]
    cn = min(CHECK_PROMPTS, len(first.ids))
    mean0 = sum(len(p) for p in first.prompts[:cn]) / max(cn, 1)
    run_s += 2 * cell_seconds(cost, cn, cn, CHECK_MAX_TOKENS, mean0, int(mean0 * cn), budget)
    profiles = 2 if v.build.profile_complement and v.cost_table is None and not v.table.exists() else 0
    run_s += profiles * PROFILE_S
    procs = cells + 2 + profiles
    weights = llm.weight_bytes + drafter_bytes(llm)
    return {"gpu_s": procs * STARTUP_S + run_s, "startup_s": procs * STARTUP_S, "run_s": run_s, "processes": procs,
            "cells": cells, "weights_bytes": weights, "records_bytes": rec, "gpu": gpu, "model": llm.name}


def estimate_lines(v, slices) -> list[str]:
    """The plan's estimate section: GPU time on CUDA (the CPU harness's clock is not modelled) and disk."""
    e = estimate(v, slices)
    out = ["== estimate (real/validation/vllm/estimate.py: what it rests on)"]
    if v.build.timed:
        profile = ", the profile" if e["processes"] > e["cells"] + 2 else ""
        out.append(f"  GPU time about {e['gpu_s'] / 60:.0f} min: {e['processes']} vLLM processes ({e['cells']} cells, "
                   f"the checklist's 2{profile}) x {STARTUP_S:.0f} s start-up (assumed) + {e['run_s'] / 60:.1f} min of "
                   f"steps modelled without speculation (an upper bound on the steps) on the {e['model']} roofline at "
                   f"{e['gpu']}")
    else:  # the CPU harness: interpreted kernels, which no cost model prices
        out.append(f"  time: {e['processes']} vLLM processes ({e['cells']} cells, the checklist's 2) through the CPU "
                   "harness, whose interpreted kernels no cost model prices: not estimated")
    where = "downloaded once into the Hugging Face cache" if v.build.device == "cuda" else \
        "read from the local directories (the CPU build)"
    out.append(f"  disk about {(e['weights_bytes'] + e['records_bytes']) / 1e9:.1f} GB: weights "
               f"{e['weights_bytes'] / 1e9:.1f} GB (target and DSpark drafter, {where}) + records under --out "
               f"{e['records_bytes'] / 1e6:.0f} MB at most")
    return out
