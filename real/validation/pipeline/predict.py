"""The simulator's side of a cell, the same for every engine: its run summary (steps counted one way), the
`python -m sim.run` command that reproduces it, and prepared draft tables reused across cells.

Steps are counted as vLLM counts them (vllm:iteration_tokens_total observes the iterations that emitted tokens):

    steps      = #{engine steps that emitted >= 1 token}      (a chunked-prefill step that emitted none: not counted)
    steps_all  = #{engine steps}                              (kept beside it; step-time alignment uses every step)

on the simulated side and on every real engine's side (the torch engine's step records, vLLM's metric).
"""
from __future__ import annotations

import dataclasses
import functools
import shlex

import numpy as np


def emitting_steps(steps: dict) -> int:
    """The steps counted (module docstring) of a step record table (sim.core.result's columns)."""
    return int(np.sum(np.asarray(steps["emitted"]) > 0))


def verified_slots(steps: dict) -> np.ndarray:
    """Draft slots verified per decoding step of a step record table: tokens - prefill tokens - decoding requests."""
    dec = np.asarray(steps["num_decode"])
    return (np.asarray(steps["tokens"]) - np.asarray(steps["prefill_tokens"]) - dec)[dec > 0]


def run_summary(res, n_tokens: int) -> dict:
    """A run's summary in the report's terms, for a simulated run or the torch engine's (same step records):
    throughput [tok/s], steps (counted one way) and every step, tokens per engine step, latency, acceptance."""
    st = res.steps
    t = float(res.sim_time_s)
    lat = res.requests["finish_s"] - res.requests["arrival_s"]
    steps = emitting_steps(st)
    acc_m, acc_n = float(np.sum(st["accepted_model"])), float(np.sum(st["accepted_ngram"]))
    dec = int(np.sum(st["num_decode"]))
    return {"time_s": t, "tok_per_s": n_tokens / t if t > 0 else float("nan"), "steps": steps,
            "steps_all": int(len(st["step_ms"])),
            # engine-wide: all output tokens over the steps that decode (sim.api.run's tok/step is per request per step)
            "tokens_per_engine_step": n_tokens / max(1, int((st["num_decode"] > 0).sum())),
            "tokens_per_step": n_tokens / steps if steps else float("nan"),
            "mean_latency_s": float(np.nanmean(lat)), "lossless": bool(res.lossless), "violation": res.violation,
            "accepted_model": acc_m, "accepted_ngram": acc_n,
            "ngram_share_accepted": acc_n / (acc_m + acc_n) if acc_m + acc_n else 0.0,
            # accepted draft tokens per drafting request-step, as vLLM's spec-decode metrics count it
            "accepted_per_draft": (acc_m + acc_n) / dec if dec else float("nan"),
            "step_ms": [float(x) for x in st["step_ms"]],
            # draft slots verified per decoding step (real/validation/vllm/budgets.py compares them with vLLM's)
            "verified_slots": [int(x) for x in verified_slots(st)],
            # a real engine's recorded decisions the policy replayed, and where its own differ (RunResult.replay)
            "replay": getattr(res, "replay", None)}


def sim_command(setup, policy: str, bs: int) -> str:
    """The `python -m sim.run` command that computes run_one(prepare(setup), policy, bs): the trace, model,
    cost and gpu, then every other SimSetup field that differs from its default (flags named after the fields)."""
    from sim.api.run import SimSetup

    default = SimSetup()
    argv = ["python", "-m", "sim.run"]
    for f in dataclasses.fields(SimSetup):
        v = getattr(setup, f.name)
        if v is None or (v == getattr(default, f.name) and f.name not in ("trace", "model", "cost", "gpu")):
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(v, bool):
            argv.append(flag if v else "--no-" + flag[2:])
        else:
            argv += [flag, str(v)]
    return shlex.join(argv + ["--policy", policy, "--batch-size", str(bs)])


@functools.lru_cache(maxsize=16)
def _prepared_key(key: tuple):
    from sim.api.run import SimSetup, prepare

    return prepare(SimSetup(*key))


def clear_prepared() -> None:
    """Forget every prepared setup: a validation rewrites its references, so none may be served from an earlier
    call in the same process."""
    _prepared_key.cache_clear()


def prepared_setup(setup):
    """sim.api.run's prepare(setup) (a trace's draft tables), built once per distinct setup and reused by its cells."""
    return _prepared_key(dataclasses.astuple(setup))


def predict(setup, policy: str, bs: int, n_tokens: int | None = None) -> tuple[dict, str]:
    """The simulator's run of a cell: (run_summary, the command that reproduces it). n_tokens: the output tokens
    the throughput counts (default: every output token of the simulated requests)."""
    from sim.api.run import run_one

    res = run_one(prepared_setup(setup), policy, bs)[1]
    n = int(sum(res.requests["output_len"])) if n_tokens is None else int(n_tokens)
    return run_summary(res, n), sim_command(setup, policy, bs)
