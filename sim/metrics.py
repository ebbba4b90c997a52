"""Run metrics: throughput, tokens per step, acceptance, latency percentiles and step-time breakdown."""
from __future__ import annotations

import numpy as np

from sim.engine import RunResult

BREAKDOWN = ("draft_ms", "ngram_ms", "alloc_ms", "verify_ms", "sample_ms", "cpu_ms", "bubble_ms")


def _pct(x: np.ndarray, q: float) -> float:
    x = x[~np.isnan(x)]
    return float(np.percentile(x, q)) if len(x) else float("nan")


def _steady(st: dict, batch_size: int | None) -> float:
    full = st["num_decode"] >= batch_size if batch_size else np.zeros(len(st["num_decode"]), dtype=bool)
    ms = float(st["step_ms"][full].sum())
    return float(st["emitted"][full].sum()) / (ms / 1000.0) if ms > 0 else float("nan")


def summarize(res: RunResult, batch_size: int | None = None) -> dict:
    """One summary row of a run (units in the key names: _s seconds, _ms milliseconds, tok tokens).

    output_throughput_tok_s counts the whole run: every output token over the time from the first
    arrival to the last completion, ramp-up and drain included (what a benchmark of the finite trace
    measures). steady_throughput_tok_s counts only the steps in which `batch_size` requests were
    decoding (the full-batch regime a long-running server sits in); NaN if there were none. On short
    traces at large batch sizes the drain tail, where the longest requests finish alone, can dominate
    the first figure."""
    rq, st = res.requests, res.steps
    out_tokens = int(rq["output_len"].sum())
    dec = st["num_decode"]
    req_steps = int(dec.sum())
    emitted_decode = int(st["emitted"].sum()) - int(np.count_nonzero(~np.isnan(rq["first_token_s"])))
    verified = st["verified_model"] + st["verified_ngram"]
    accepted = st["accepted_model"] + st["accepted_ngram"]
    n_dec_steps = int(np.count_nonzero(dec))
    total_ms = float(st["step_ms"].sum()) or 1.0
    row = {
        "requests": int(len(rq["output_len"])),
        "output_tokens": out_tokens,
        "sim_time_s": res.sim_time_s,
        "output_throughput_tok_s": out_tokens / res.sim_time_s if res.sim_time_s > 0 else float("nan"),
        "steady_throughput_tok_s": _steady(st, batch_size),
        "mean_tokens_per_step": emitted_decode / req_steps if req_steps else float("nan"),
        "verified_tokens_per_step": float(verified.sum() / n_dec_steps) if n_dec_steps else 0.0,
        "acceptance_rate": float(accepted.sum() / verified.sum()) if verified.sum() else float("nan"),
        "ngram_share_verified": float(st["verified_ngram"].sum() / verified.sum()) if verified.sum() else 0.0,
        "ngram_share_accepted": float(st["accepted_ngram"].sum() / accepted.sum()) if accepted.sum() else 0.0,
        "ttft_p50_s": _pct(rq["ttft_s"], 50), "ttft_p99_s": _pct(rq["ttft_s"], 99),
        "tpot_p50_ms": 1000 * _pct(rq["tpot_s"], 50), "tpot_p99_ms": 1000 * _pct(rq["tpot_s"], 99),
        "steps": int(len(dec)),
        "mean_step_ms": float(st["step_ms"].mean()) if len(dec) else float("nan"),
        "preemptions": int(rq["preemptions"].sum()),
        "lossless": bool(res.lossless),
    }
    for k in BREAKDOWN:
        row["share_" + k.removesuffix("_ms")] = float(st[k].sum()) / total_ms
    return row
