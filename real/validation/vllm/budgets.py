"""Step-by-step agreement of adaptive verification's budgets: the draft slots a real vLLM run verified per step (its
recorded budgets, real/validation/vllm/recorder.py collect_budgets) against the prediction's (its step table).

Per step with drafts (vLLM budgets only those), in order:

    real   v_i = min(B_i, sum of the scheduled drafts d_i)           [slots]  (B_i >= sum d_i: all of them verified)
    sim    v_i = tokens_i - prefill_tokens_i - num_decode_i          [slots]  (steps with num_decode > 0;
                                                                             pipeline/predict.py verified_slots)

`agreement` counts the steps where the two equal and names the first that differs: where a prediction leaves the
real run (a budget from other confidences, another schedule, a request that finished a step apart), which the step
counts alone do not show. The simulator charges the slots vLLM verifies past a chosen chain only under
`hybrid-vllm:...:fill=vllm`; with `fill=cut` such steps differ by those slots.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def real_verified(budgets: Sequence[Sequence]) -> list[int]:
    """Draft slots verified per recorded step: min(B, sum of the scheduled drafts)."""
    return [int(min(int(b[3]), int(sum(b[2])))) for b in budgets]


def agreement(real: Sequence[int], sim: Sequence[int]) -> dict:
    """{"steps": real steps, "sim_steps": simulated steps, "agree": steps equal at the same index, "first_diff": the
    first index that differs (None: none, within the shorter)}."""
    n = min(len(real), len(sim))
    same = [int(real[i]) == int(sim[i]) for i in range(n)]
    first = next((i for i, s in enumerate(same) if not s), None)
    if first is None and len(real) != len(sim):
        first = n
    return {"steps": len(real), "sim_steps": len(sim), "agree": int(sum(same)), "first_diff": first}


def of_run(run: dict, sim: Sequence[int]) -> dict | None:
    """`agreement` of a real run's recorded budgets (its "budgets") with the prediction's verified slots per decoding
    step; None where the run recorded none (no adaptive verification)."""
    return agreement(real_verified(run["budgets"]), sim) if run.get("budgets") else None
