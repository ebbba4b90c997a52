"""Run metrics: throughput, tokens per step, acceptance, latency percentiles and step-time breakdown.

Latency and throughput metrics carry the names and units `vllm bench serve` gives them in its result JSON
(`request_throughput` req/s, `output_throughput` and `total_token_throughput` tok/s; `mean_`, `median_`,
`std_` and `p99_` of `ttft`, `tpot`, `itl` and `e2el`, all in ms), with the same definitions: TTFT from
arrival to the first token, TPOT = (E2EL - TTFT) / (output tokens - 1) over requests with more than one
output token, ITL the gaps between a request's successive token deliveries (one delivery per engine step,
several tokens when drafts are accepted), E2EL from arrival to the last token."""
from __future__ import annotations

import numpy as np

from sim.core.result import BREAKDOWN, RunLike, extra_drafters, model_free  # the result schema, not the engine: any engine's result will do


def _steady(st: dict, batch_size: int | None) -> float:
    full = st["num_decode"] >= batch_size if batch_size else np.zeros(len(st["num_decode"]), dtype=bool)
    ms = float(st["step_ms"][full].sum())
    return float(st["emitted"][full].sum()) / (ms / 1000.0) if ms > 0 else float("nan")


LATENCIES = (("ttft", "TTFT", "Time to First Token"), ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
             ("itl", "ITL", "Inter-token Latency"), ("e2el", "E2EL", "End-to-end Latency"))
PERCENTILES = (99,)


ITL_SAMPLES_MAX = 1 << 24  # above this many ITL samples their statistics come from (gap, count) pairs (memory)


def _itl_gaps(res: RunLike) -> tuple[np.ndarray, np.ndarray]:
    """(gaps_s, count): the gap before each engine step's end (seconds, in end order) and how many requests
    it delivered a token to after their first; the ITL samples are each gap repeated count times."""
    rq, st = res.requests, res.steps
    ends = np.sort(np.asarray(st["t_start_ms"], dtype=np.float64) + np.asarray(st["step_ms"], dtype=np.float64)) / 1000.0
    if len(ends) == 0:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    gaps = np.diff(ends, prepend=ends[0])
    first, done = np.asarray(rq["first_token_s"], dtype=np.float64), np.asarray(rq["finish_s"], dtype=np.float64)
    ok = ~np.isnan(first) & ~np.isnan(done)
    eps = 1e-9  # both sides are the same float sums; eps only guards rounding
    lo = np.searchsorted(ends, first[ok] + eps, side="left")
    hi = np.searchsorted(ends, done[ok] + eps, side="left")
    count = np.zeros(len(ends) + 1, dtype=np.int64)
    np.add.at(count, lo, 1)
    np.add.at(count, hi, -1)
    return gaps, np.cumsum(count)[:-1]


def itl_samples_s(res: RunLike) -> np.ndarray:
    """Every inter-token latency of the run (seconds), as a streaming client would measure them: for each
    request, the gaps between the ends of the engine steps that delivered its tokens after the first.
    A request decodes in every step between its first token and its finish (continuous batching), so the
    gaps are those of the steps ending in (first token, finish]. A preempted request's pause counts as
    the steps it missed, not as one long gap (the engine does not record per-request delivery times)."""
    return np.repeat(*_itl_gaps(res))


def _itl_stats_ms(res: RunLike) -> dict:
    """_stats_ms("itl", itl_samples_s(res)), without materialising the samples when there are more than
    ITL_SAMPLES_MAX of them (a million-request run has ~10^8: gigabytes). Each step's gap g_i is one sample
    per request it delivered to (count c_i), so over N = sum c_i samples: mean = sum c_i g_i / N, std the same
    weighted, and median and p99 are order statistics of the sorted gaps repeated by count, interpolated
    linearly between neighbours at position (N - 1) q as np.percentile does (equal up to rounding)."""
    gaps, w = _itl_gaps(res)
    if int(w.sum()) <= ITL_SAMPLES_MAX:
        return _stats_ms("itl", np.repeat(gaps, w))
    x = gaps * 1000.0
    order = np.argsort(x, kind="stable")
    x, w = x[order], w[order]
    cum = np.cumsum(w)
    n = int(cum[-1])

    def kth(k: int) -> float:  # the k-th (0-based) of the sorted samples
        return float(x[np.searchsorted(cum, k, side="right")])

    def quantile(q: float) -> float:
        h = (n - 1) * q
        k = int(np.floor(h))
        a, b = kth(k), kth(min(k + 1, n - 1))
        return a + (h - k) * (b - a)

    mean = float((x * w).sum() / n)
    row = {"mean_itl_ms": mean, "median_itl_ms": quantile(0.5),
           "std_itl_ms": float(np.sqrt((w * (x - mean) ** 2).sum() / n))}
    for p in PERCENTILES:
        row[f"p{p}_itl_ms"] = quantile(p / 100)
    return row


def _stats_ms(name: str, x_s: np.ndarray) -> dict:
    x = np.asarray(x_s, dtype=np.float64)
    x = x[~np.isnan(x)] * 1000.0
    if not len(x):  # vLLM reports 0 for an empty list
        x = np.zeros(1)
    row = {f"mean_{name}_ms": float(x.mean()), f"median_{name}_ms": float(np.median(x)), f"std_{name}_ms": float(x.std())}
    for p in PERCENTILES:
        row[f"p{p}_{name}_ms"] = float(np.percentile(x, p))
    return row


def serving_metrics(res: RunLike) -> dict:
    """The metrics of `vllm bench serve`'s result JSON, under its names and units (module docstring)."""
    rq = res.requests
    dur = res.sim_time_s
    n = int(len(rq["output_len"]))
    out_tok, in_tok = int(np.sum(rq["output_len"])), int(np.sum(rq["prompt_len"]))
    row = {"completed": n, "total_input_tokens": in_tok, "total_output_tokens": out_tok, "duration": dur,
           "request_throughput": n / dur if dur > 0 else float("nan"),
           "output_throughput": out_tok / dur if dur > 0 else float("nan"),
           "total_token_throughput": (in_tok + out_tok) / dur if dur > 0 else float("nan")}
    e2el = np.asarray(rq["finish_s"], dtype=np.float64) - np.asarray(rq["arrival_s"], dtype=np.float64)
    row.update(_stats_ms("ttft", rq["ttft_s"]))
    row.update(_stats_ms("tpot", rq["tpot_s"]))
    row.update(_itl_stats_ms(res))
    row.update(_stats_ms("e2el", e2el))
    return row


def spec_decode_metrics(res: RunLike) -> dict:
    """vLLM's speculative-decoding counts (what `vllm bench serve` prints under "Speculative Decoding"), from the
    run's drafts by accepted length (RunResult.accepted_hist: h[a] = drafts that accepted a tokens; a draft is
    a request-step that verifies at least one draft token):
      num_drafts = sum_a h[a]; draft_tokens, accepted_tokens = draft tokens verified, accepted (all chains);
      acceptance_length = 1 + accepted_tokens / num_drafts (tokens per draft, the bonus token included);
      acceptance_per_position[i] = sum_{a > i} h[a] / num_drafts (share of drafts whose position i was accepted).
    Empty when the engine did not record the histogram (or nothing was drafted)."""
    h = getattr(res, "accepted_hist", None)
    st = res.steps
    n = int(np.sum(h)) if h is not None else 0
    if not n:
        return {}
    h = np.asarray(h, dtype=np.int64)
    accepted = int(np.sum(st["accepted_model"]) + np.sum(model_free(st, "accepted")))
    tail = np.cumsum(h[::-1])[::-1]  # tail[a] = drafts that accepted >= a tokens
    return {"num_drafts": n, "draft_tokens": int(np.sum(st["verified_model"]) + np.sum(model_free(st, "verified"))),
            "accepted_tokens": accepted, "acceptance_length": 1.0 + accepted / n,
            "acceptance_per_position": [float(x) / n for x in tail[1:]]}


def summarize(res: RunLike, batch_size: int | None = None) -> dict:
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
    ver_free, acc_free = model_free(st, "verified"), model_free(st, "accepted")  # n-gram and live drafters'
    verified = st["verified_model"] + ver_free
    accepted = st["accepted_model"] + acc_free
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
        "ngram_share_verified": float(ver_free.sum() / verified.sum()) if verified.sum() else 0.0,
        "ngram_share_accepted": float(acc_free.sum() / accepted.sum()) if accepted.sum() else 0.0,
        "steps": int(len(dec)),
        "mean_step_ms": float(st["step_ms"].mean()) if len(dec) else float("nan"),
        "preemptions": int(rq["preemptions"].sum()),
        "lossless": bool(res.lossless),
    }
    for k in BREAKDOWN:  # share_ngram: the model-free drafters' together (sim/core/result.py)
        row["share_" + k.removesuffix("_ms")] = float((model_free(st, "ms") if k == "ngram_ms" else st[k]).sum()) / total_ms
    for d in extra_drafters(st):
        row["share_" + d] = float(st[f"{d}_ms"].sum()) / total_ms
    row.update(serving_metrics(res))
    row.update(spec_decode_metrics(res))
    return row
