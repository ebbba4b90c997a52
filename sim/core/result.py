"""The result schema that metrics and reports read: what a simulated (or real) run must provide, independent
of the engine that produced it. sim.engine.engine.RunResult satisfies it; so can any other engine's result."""
from __future__ import annotations

from typing import Protocol

BREAKDOWN = ("draft_ms", "ngram_ms", "alloc_ms", "verify_ms", "sample_ms", "cpu_ms", "bubble_ms")

# column -> meaning; one entry per request
REQUEST_COLUMNS = {
    "prompt_len": "prompt tokens", "output_len": "output tokens",
    "arrival_s": "arrival time (s)", "first_token_s": "time of the first output token (s)",
    "finish_s": "time of the last output token (s)", "ttft_s": "first_token_s - arrival_s",
    "tpot_s": "(finish_s - first_token_s) / (output_len - 1); NaN for one-token outputs",
    "preemptions": "times the request was preempted",
}
# column -> meaning; one entry per engine step
STEP_COLUMNS = {
    "t_start_ms": "step start (ms)", "step_ms": "step duration (ms)", "num_decode": "decoding requests",
    "emitted": "tokens emitted", "verified_model": "model-drafter tokens verified",
    "verified_ngram": "n-gram tokens verified",
    "accepted_model": "model-drafter tokens accepted",
    "accepted_ngram": "n-gram tokens accepted",
    **{k: f"time spent in {k.removesuffix('_ms')} (ms)" for k in BREAKDOWN},
}
# A run that enables a live drafter D (--drafters ...,suffix) has three more step columns: verified_D and
# accepted_D (its tokens) and D_ms (its time, ms; ngram_ms and the n-gram columns are the n-gram drafter's alone).
# The summary (sim.core.metrics.summarize) counts them with the model-free drafters: its ngram figures and share_ngram
# are the n-gram and live drafters' together, as before they had columns of their own, and share_D each one's.


def extra_drafters(steps: dict) -> list[str]:
    """The live drafters with columns of their own in `steps` (verified_D present; not model or ngram)."""
    return [k.removeprefix("verified_") for k in steps
            if k.startswith("verified_") and k not in ("verified_model", "verified_ngram")]


def model_free(steps: dict, what: str):
    """The model-free drafters' `what` column ("verified", "accepted" or "ms") summed: the n-gram drafter's and
    every live drafter's (extra_drafters)."""
    col = (lambda d: f"{d}_ms") if what == "ms" else (lambda d: f"{what}_{d}")
    total = steps[col("ngram")]
    for d in extra_drafters(steps):
        total = total + steps[col(d)]
    return total


class RunLike(Protocol):
    """A finished run: per-request and per-step columns (dicts of arrays), its makespan, its lossless flag."""

    requests: dict
    steps: dict
    sim_time_s: float
    lossless: bool
