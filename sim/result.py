"""The result schema that metrics and reports read: what a simulated (or real) run must provide, independent
of the engine that produced it. sim.engine.RunResult satisfies it; so can any other engine's result."""
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
    "verified_ngram": "n-gram tokens verified (with --drafters suffix: and the suffix drafter's)",
    "accepted_model": "model-drafter tokens accepted",
    "accepted_ngram": "n-gram tokens accepted (with --drafters suffix: and the suffix drafter's)",
    **{k: f"time spent in {k.removesuffix('_ms')} (ms)" for k in BREAKDOWN},
}


class RunLike(Protocol):
    """A finished run: per-request and per-step columns (dicts of arrays), its makespan, its lossless flag."""

    requests: dict
    steps: dict
    sim_time_s: float
    lossless: bool
