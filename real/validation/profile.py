"""Measure the real engine's step costs on the machine at hand and write a profiled cost table
(sim/core/cost/profiled.py format) that the simulator loads with `--cost profiled --gpu PATH`.

    python -m real.profile_costs [--model smollm2-135m] [--random-weights] [--device cpu|cuda] [--out FILE]
                           [--policy P ...] [--batch-size B ...] [--quick]
    python real/profile_costs.py --engine vllm [--vllm-model HF_ID] [--vllm-drafter HF_ID] [--batch-size B ...]
                           [--out FILE] [--quick] [--dry-run]      (vLLM 0.33 on a CUDA GPU: real/validation/vllm/bench.py)

The rest of this docstring is the torch engine's (--engine torch, the default).

It runs the real engine (each --policy at each --batch-size) on a slice of traces/general.jsonl -- the
tuning trace, never an evaluated one -- and fits every part of the table to the steps it measured:
  verify   verify_ms = f(T) + seq_ms * S + attn_ms_per_row_kv * max(T - S, 0) * K / S
                       + kv_ms_per_token * K + logits_ms_per_row * M over all steps
           (decode verifies, prefill chunks and mixes), f piecewise linear in the step's tokens T, S its
           sequences, K the KV tokens read, M the logit rows; a least-squares fit with every term >= 0
           (`fit_verify`), the last two terms timed apart by microbenchmarks. The attention term prices the
           query rows beyond one per sequence (draft tokens, prefill chunks) against their sequence's cache:
           without it the table priced the validation grid's prefill steps 4.5% low, 6.8% on its longer
           prompts (docs/real.md, "Where the time goes");
  ngram(R), alloc[policy](R): means of the steps with R decoding requests that ran them;
  draft(R): the mean draft_ms of the steps with R decoding requests on which the model drafter's pass ran
           (the engine's draft_pass column: the pass and that step's context upkeep, in ms), because the
           simulator charges draft only on those steps; a step without the pass (`hybrid` skipping it) still
           pays the drafter's context upkeep (1-2 ms here), and averaging it in priced the pass 10-30% low
           at one request (reports/fidelity-verdicts.md in git history; docs/real.md, "Where the time goes");
  sample(T): means by the step's tokens, in power-of-two buckets;
  cpu(R, T) = a + b R + c T: least-squares fit (the host's share: scheduling, batch building, emission).
It then times the target forward alone on decode-shaped batches (R requests x 8 tokens, every row's
logits, context 512; medians of repeats) and prints them beside the table's prediction and, where the
model and device have one (a GPU in models/gpus), the roofline model's. The table records the machine
(device, cpu, torch, dtype, threads, model) so that a table from elsewhere is refused
(sim.core.cost.profiled.check_machine).
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from real.validation.machine import gpu_models_name, machine_info  # noqa: F401 (profile's callers read them here too)
from real.engine.model import SHORT_QUERY_MAX
from real.validation.fidelity_stats import PROBE_REPEAT, bracket_speed, probe_ratio, reference_probe  # noqa: F401
from real.validation.workload import Workload, build_engine_model, run_real
from sim.infra.cli import ArgumentParser, check_out_file, write_files
from sim.infra.fsio import temp_dir
from sim.core.cost.profiled import CostTable, cost_table_from_dict, write_cost_table
from sim.infra.errors import ConfigError
from sim.core.models import llm_name
from sim.core.policies import get_policy



def median_ms(fn, repeat: int, device: torch.device) -> float:
    fn()  # warm-up
    ts = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(ts)


@torch.inference_mode()
def time_decode_grid(model, reqs=(1, 2, 4, 8, 16), q: int = 8, context: int = 512, repeat: int = 5) -> list[tuple]:
    """Forward alone on decode-shaped batches: R requests x q tokens, every row's logits, `context` tokens
    cached each. Returns (R, T, K, M, median ms) per R that fits the cache."""
    dev = next(model.parameters()).device
    lt = lambda x: torch.tensor(x, dtype=torch.int64, device=dev)  # noqa: E731
    ctx = min(context, model.max_len - q - 1)
    rows = []
    for R in reqs:
        if R > model.max_slots:
            continue
        T = R * q
        toks = torch.randint(0, model.args.vocab_size, (T,), generator=torch.Generator().manual_seed(R)).to(dev)
        args = (toks, lt([q] * R), lt([ctx] * R), lt(list(range(R))), torch.arange(T, device=dev))
        rows.append((R, T, R * (ctx + q), T, median_ms(lambda: model(*args), repeat, dev)))
    return rows


PROBE_SHAPES = ((1, 1), (1, 8), (4, 2))  # (requests, tokens each): a decode, a draft verify, a small batched verify
PROBE_CONTEXT = 256


@torch.inference_mode()
def speed_probe(model, repeat: int = 9) -> dict:
    """The model instance's speed on fixed inputs, to compare a trace's instance with the profile's: for each
    PROBE_SHAPES (R requests x q tokens, PROBE_CONTEXT cached tokens each, random token ids, every row's logits),
    the median ms of `repeat` forwards, the shapes alternated in ABBA order so that a drift falls on all alike.
    Returns {"<R>x<q>": ms, ..., "context": PROBE_CONTEXT, "repeat": repeat}. Interleaved with the profile's runs
    and the cells' repeats, it re-anchors both to one machine speed (real/validation/fidelity_stats.py, re-anchoring); each
    costs about 1.4 s at repeat 3 on this 2-core CPU (SmolLM2-135M: 1 + 2 x repeat forwards of each shape)."""
    from real.validation.fidelity_stats import abba_order

    dev = next(model.parameters()).device
    lt = lambda x: torch.tensor(x, dtype=torch.int64, device=dev)  # noqa: E731
    ctx = min(PROBE_CONTEXT, model.max_len - 9)
    fns = {}
    for R, q in PROBE_SHAPES:
        if R > model.max_slots:
            continue
        toks = torch.randint(0, model.args.vocab_size, (R * q,), generator=torch.Generator().manual_seed(R * 100 + q))
        args = (toks.to(dev), lt([q] * R), lt([ctx] * R), lt(list(range(R))), torch.arange(R * q, device=dev))
        fns[f"{R}x{q}"] = (lambda a=args: model(*a))
    ts: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():
        f()  # warm-up
    for k, _ in abba_order(list(fns), repeat):
        ts[k].append(median_ms(fns[k], 1, dev))
    return {**{k: statistics.median(v) for k, v in ts.items()}, "context": ctx, "repeat": repeat}



def anchor_steps(st: dict, q: float) -> dict:
    """A run's steps at the reference speed: every *_ms column divided by its bracket speed q (fidelity_stats,
    re-anchoring), and q recorded per step in `speed_q` (raw ms = anchored ms x speed_q)."""
    out = {k: (np.asarray(v, dtype=np.float64) / q if k.endswith("_ms") else v) for k, v in st.items()}
    out["speed_q"] = np.full(len(np.asarray(st["tokens"])), q, dtype=np.float64)
    return out


def fit_step_parts(steps: list[dict], policies: list[str]) -> dict:
    """Tables of the engine's non-verify parts from recorded steps (module docstring). `steps`: one dict
    per run with 'policy' and the steps.csv columns as arrays (num_decode, draft_ms, ngram_ms, alloc_ms,
    sample_ms, cpu_ms, logit_rows, tokens; draft_pass where the real engine recorded it: the draft table is
    then the mean over the steps whose model pass ran)."""
    def by_r(part: str, runs: list[dict]) -> dict | None:
        R = np.concatenate([r["num_decode"] for r in runs])
        v = np.concatenate([r[part] for r in runs])
        keep = (R > 0) & (v > 0)
        if not keep.any():
            return None
        xs = sorted(set(R[keep].tolist()))
        return {"num_reqs": [int(x) for x in xs], "ms": [float(np.mean(v[keep & (R == x)])) for x in xs]}

    out: dict = {}
    # the model pass's price: only the steps where it ran (draft_pass; legacy recordings without that column:
    # every step with draft time, which mixes in upkeep-only steps)
    passed = [dict(s, draft_ms=np.where(np.asarray(s["draft_pass"]) > 0, s["draft_ms"], 0.0)) if "draft_pass" in s
              else s for s in steps]
    out["draft"] = by_r("draft_ms", passed)
    out["ngram"] = by_r("ngram_ms", steps)
    out["alloc"] = {}
    for p in policies:
        t = by_r("alloc_ms", [s for s in steps if s["policy"] == p])
        if t:
            out["alloc"][p] = t
    # sample: means by the step's tokens, in power-of-two buckets (argmax over rows x vocab, plus its copy)
    # (the simulator prices sampling by the step's tokens: sample_ms(T))
    rows = np.concatenate([s["tokens"] for s in steps]).astype(np.int64)
    smp = np.concatenate([s["sample_ms"] for s in steps])
    keep = rows > 0
    bucket = 2 ** np.ceil(np.log2(np.maximum(rows, 1))).astype(np.int64)
    xs = sorted(set(bucket[keep].tolist()))
    out["sample"] = {"num_tokens": [int(x) for x in xs],
                     "ms": [max(float(np.mean(smp[keep & (bucket == x)])), 1e-6) for x in xs]} if xs else None
    # cpu: a linear least-squares fit (of the mean: a run's time is the sum of its steps, hiccups included)
    from scipy.optimize import least_squares

    R = np.concatenate([s["num_decode"] for s in steps]).astype(np.float64)
    Tt = np.concatenate([s["tokens"] for s in steps]).astype(np.float64)
    cpu = np.concatenate([s["cpu_ms"] for s in steps])
    A = np.stack([np.ones_like(R), R, Tt], axis=1)
    x0 = np.maximum(np.linalg.lstsq(A, cpu, rcond=None)[0], 0.0)
    fit = least_squares(lambda w: A @ w - cpu, x0, bounds=(0.0, np.inf))
    coef = fit.x
    out["cpu"] = {"base_ms": float(coef[0]), "per_req_ms": float(coef[1]), "per_token_ms": float(coef[2])}
    return out


VERIFY_FIT_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
PROFILE_TRACE = "traces/general.jsonl"  # the tuning trace, never an evaluated one


def profile_repeats(quick: bool) -> int:
    """Runs per (policy, batch size) point by default (--repeat): 2, --quick 1."""
    return 1 if quick else 2


PROFILE_REQUESTS = 10  # the profile slice's requests at least (--quick: 6)


def profile_slice(quick: bool, batch_sizes: tuple[int, ...] | list[int] = ()) -> dict:
    """The profile's slice of PROFILE_TRACE (Workload.build's keywords): PROFILE_REQUESTS requests, or the largest
    batch size when that is more, so that the fitted steps reach every batch the table will price. A slice smaller
    than the batch leaves the verify fit extrapolating in the step's sequences S: a 10-request slice
    priced chat's 16-sequence verifies 4-7% high (docs/real.md, "The runs so far"). --quick keeps 6 (it checks the
    pipeline). Without batch_sizes: the slice of the recordings made before (real/validation/reprice.py rebuilds it)."""
    base = 6 if quick else PROFILE_REQUESTS
    limit = base if quick else max([base, *batch_sizes])
    return dict(limit=limit, sample=None, seed=0, max_tokens=16 if quick else 24, max_prompt=512)


@torch.inference_mode()
def time_logits_per_row(model, T: int = 64, context: int = 256, repeat: int = 7) -> float:
    """ms per logit row: one request's T-token forward with every row's logits minus with its last row's,
    over T - 1 (medians of alternating repeats; the LM head is the step's largest GEMM on a CPU)."""
    dev = next(model.parameters()).device
    lt = lambda x: torch.tensor(x, dtype=torch.int64, device=dev)  # noqa: E731
    ctx = min(context, model.max_len - T - 1)
    toks = torch.randint(0, model.args.vocab_size, (T,), generator=torch.Generator().manual_seed(0)).to(dev)
    base = (toks, lt([T]), lt([ctx]), lt([0]))
    every, one = torch.arange(T, device=dev), lt([T - 1])
    ts = {"all": [], "last": []}
    for _ in range(repeat):  # alternately, so that a drift of the machine's speed cancels
        ts["all"].append(median_ms(lambda: model(*base, every), 1, dev))
        ts["last"].append(median_ms(lambda: model(*base, one), 1, dev))
    full, last = statistics.median(ts["all"]), statistics.median(ts["last"])
    return max(0.0, (full - last) / (T - 1))


@torch.inference_mode()
def time_kv_per_token(model, reqs: int = 8, repeat: int = 9) -> float:
    """ms per cached KV token a step reads: `reqs` one-token decodes at a short and at a long context,
    timed alternately (so that a drift of the machine's speed cancels), (long - short) / extra KV tokens."""
    dev = next(model.parameters()).device
    R = min(reqs, model.max_slots)
    lt = lambda x: torch.tensor(x, dtype=torch.int64, device=dev)  # noqa: E731
    lo, hi = 16, max(17, model.max_len - 2)
    toks = torch.randint(0, model.args.vocab_size, (R,), generator=torch.Generator().manual_seed(1)).to(dev)
    fns = {c: (lambda c=c: model(toks, lt([1] * R), lt([c] * R), lt(list(range(R))), torch.arange(R, device=dev)))
           for c in (lo, hi)}
    ts = {lo: [], hi: []}
    for _ in range(repeat):
        for c in (lo, hi):
            ts[c].append(median_ms(fns[c], 1, dev))
    return max(0.0, (statistics.median(ts[hi]) - statistics.median(ts[lo])) / (R * (hi - lo)))


def fit_verify(steps: list[dict], logits_ms_per_row: float, kv_ms_per_token: float, short_query_max: int = 0) -> dict:
    """The verify part of the table fitted on the engine's own steps (every shape it runs: decode verifies,
    prefill chunks, mixes), by least squares with all terms >= 0 (the mean, not a typical step: a run's
    time is the sum of its steps, the machine's hiccups included).

    Padded form (short_query_max > 0 and every run recorded the forward's shape, the real engine's kv_gather,
    kv_view and attn_rows_kv columns; sim/core/cost/padded.py):
        verify_ms - logits_ms_per_row * M - kv_ms_per_token * G = f(T) + seq_ms * S + attn * A + kv_view * V
    G the KV entries the batched short-query call gathers, padded to the longest sequence (Rs * Kmax), V the
    entries read in place (a lone short query, prefill chunks), A the query rows beyond one per sequence x the
    keys they score (padded likewise). kv_ms_per_token, per gathered entry, is timed apart (`time_kv_per_token`:
    equal contexts, so there G = K); kv_view is fitted (the bs = 1 steps' contexts vary on their own).
    Aggregate form (otherwise: legacy recordings):
        verify_ms - logits_ms_per_row * M - kv_ms_per_token * K = f(T) + seq_ms * S + attn * max(T - S, 0) * K / S
    with K the KV tokens the step reads.
    Both: f piecewise linear in the step's tokens T on VERIFY_FIT_GRID (a hat-function basis, i.e. exactly the
    table's interpolation), S its sequences (decode requests and prefill chunks: the per-request attention and
    bookkeeping), M its logit rows, attn (attn_ms_per_row_kv) ms per query row x KV entry. f(T) alone cannot
    price these: a step of T tokens costs more the longer (padded) its contexts, and the profile's contexts are
    not the evaluated traces'. The aggregate form charged the sum of contexts K where the engine pays the padded
    Rs * Kmax, so the profile's mixed-length batches taught f and seq_ms the padding, which equal-length batches
    (codeedit's prompts) then paid without having it (docs/real.md, "Where the time goes").
    logits_ms_per_row is measured apart (`time_logits_per_row`): on decode steps M = T, so the steps alone
    cannot separate it."""
    from scipy.optimize import least_squares

    cat = lambda c: np.concatenate([np.asarray(s[c]) for s in steps]).astype(np.float64)  # noqa: E731
    T, K, M, S, y = cat("tokens"), cat("kv_tokens"), cat("logit_rows"), cat("num_seqs"), cat("verify_ms")
    padded = short_query_max > 0 and all(all(c in s for c in ("kv_gather", "kv_view", "attn_rows_kv")) for s in steps)
    if padded:
        G, V, A2 = cat("kv_gather"), cat("kv_view"), cat("attn_rows_kv")
        y = y - logits_ms_per_row * M - kv_ms_per_token * G
        known = logits_ms_per_row * M + kv_ms_per_token * G
    else:
        y = y - logits_ms_per_row * M - kv_ms_per_token * K
        known = logits_ms_per_row * M + kv_ms_per_token * K
    keep = T > 0
    T, K, M, S, y, known = T[keep], K[keep], M[keep], S[keep], y[keep], known[keep]
    grid = [g for g in VERIFY_FIT_GRID if g <= 2 * T.max()] or [1]
    if grid[-1] < T.max():
        grid.append(int(2 ** np.ceil(np.log2(T.max()))))
    xs = np.asarray(grid, dtype=np.float64)
    H = np.zeros((len(T), len(xs)))
    for i, t in enumerate(T):  # hat basis: linear interpolation between the two neighbouring grid points
        j = int(np.searchsorted(xs, t))
        if j == 0:
            H[i, 0] = 1.0
        elif j >= len(xs):
            H[i, -1] = 1.0
        else:
            w = (t - xs[j - 1]) / (xs[j] - xs[j - 1])
            H[i, j - 1], H[i, j] = 1.0 - w, w
    used = H.sum(axis=0) > 0  # grid points no step reached are filled by interpolation afterwards
    if padded:
        extra = [A2[keep][:, None], V[keep][:, None]]
    else:
        extra = [(np.maximum(T - S, 0.0) * K / np.maximum(S, 1.0))[:, None]]  # (rows beyond one per seq) x K / S
    A = np.concatenate([H[:, used], S[:, None], *extra], axis=1)
    scale = np.maximum(np.abs(A).max(axis=0), 1e-12)  # columns on one scale: counts of 1e5 beside hat weights
    x0 = np.maximum(np.linalg.lstsq(A / scale, y, rcond=None)[0], 0.0)
    fit = least_squares(lambda w: (A / scale) @ w - y, x0, bounds=(0.0, np.inf))
    w = fit.x / scale
    nf = int(used.sum())
    f_used = w[:nf]
    ms = np.interp(xs, xs[used], f_used)
    ms = np.maximum.accumulate(np.maximum(ms, 1e-6))
    resid = (A @ w - y) / (y + known)
    out = {"num_tokens": [int(x) for x in xs], "ms": [float(v) for v in ms], "kv_ms_per_token": float(kv_ms_per_token),
           "seq_ms": float(w[nf]), "attn_ms_per_row_kv": float(w[nf + 1]),
           "logits_ms_per_row": float(logits_ms_per_row), "fit_median_abs_rel_error": float(np.median(np.abs(resid))),
           "fit_steps": int(len(y))}
    if padded:
        out.update(short_query_max=int(short_query_max), kv_view_ms_per_token=float(w[nf + 2]))
    return out


def build_table(model_name: str, verify: dict, parts: dict, machine: dict, kv_capacity: int, vocab: int,
                source: str, gpu: str | None = None) -> CostTable:
    """The profiled table from the fitted parts (module docstring); gpu: its models/gpus spec (default: the device's,
    real/validation/machine.py)."""
    gpu = gpu if gpu is not None else gpu_models_name(machine.get("device", "cpu"))
    obj = {"format": "hybridspec-cost-table/1", "llm": model_name, "gpu": gpu,
           "source": source,
           "derived": False, "capture_sizes": [],
           "verify": {"num_tokens": verify["num_tokens"], "ms": verify["ms"]},
           "logits_ms_per_row": verify["logits_ms_per_row"], "kv_ms_per_token": verify["kv_ms_per_token"],
           "seq_ms": verify.get("seq_ms", 0.0), "attn_ms_per_row_kv": verify.get("attn_ms_per_row_kv", 0.0),
           **({"short_query_max": verify["short_query_max"], "kv_view_ms_per_token": verify["kv_view_ms_per_token"]}
              if verify.get("short_query_max") else {}),
           "machine": machine, "kv_capacity_tokens": int(kv_capacity), "vocab_size": int(vocab)}
    for k in ("draft", "ngram", "sample", "cpu"):
        if parts.get(k):
            obj[k] = dict(parts[k], block=7) if k == "draft" else parts[k]
    if parts.get("alloc"):
        obj["alloc"] = parts["alloc"]
    if "draft" not in obj:
        obj["draft"] = {"block": 7, "num_reqs": [1], "ms": [1e-6]}
    return cost_table_from_dict(obj, f"the table profiled for {model_name}")


def profile(model_name: str, random_weights: bool, device: str, policies: list[str], batch_sizes: list[int],
            quick: bool, out: Path | None, overwrite: bool = False, progress: bool = True,
            repeats: int | None = None, gpu_spec: str | None = None) -> tuple[CostTable, Path | None, list]:
    """Measure and (if `out`) write the table; returns it. See the module docstring. Every (policy, batch size)
    run is made `repeats` times (default 2, --quick 1) in ABBA order after one discarded warm-up run, and the
    part fits pool their steps; the machine's load over the whole profile is measured (real/validation/machine_load.py)
    and a loaded profile says so in the table's source and on stderr."""
    from real.validation.fidelity_stats import abba_order
    from real.validation.machine_load import LoadProbe

    repeats = repeats if repeats is not None else profile_repeats(quick)

    wl = Workload.build(PROFILE_TRACE, model_name, random_weights, device, **profile_slice(quick, batch_sizes),
                        progress=progress)
    model = build_engine_model(wl, max(batch_sizes))
    raw = []
    machine = machine_info(wl.device, wl.dtype, wl.model_label)
    gpu = gpu_models_name(machine["device"], gpu_spec)  # an unknown GPU fails before the measurements
    prep = 1 if quick else PROBE_REPEAT
    with LoadProbe(machine["threads"]) as probe:
        run_real(wl, model, policies[0], batch_sizes[0], cost=None, progress=False)  # warm-up, discarded
        probes = [speed_probe(model, repeat=prep)]  # interleaved: one before the first run and one after each
        order = abba_order([(p, b) for p in policies for b in batch_sizes], repeats)
        for i, ((pol, bs), _) in enumerate(order):
            res = run_real(wl, model, pol, bs, cost=None, progress=False)
            probes.append(speed_probe(model, repeat=prep))
            st = dict(res.steps)
            st["policy"] = pol
            st["batch_size"] = np.full(len(res.steps["tokens"]), bs, dtype=np.int64)  # the run's point (repeats pair by it)
            st["logit_rows"] = res.steps["logit_rows"]
            st["tokens"] = res.steps["tokens"]
            raw.append(st)
            if progress:
                print(f"profile run {i + 1}/{len(order)}: {pol} bs={bs}", file=sys.stderr)
        logits_ms = time_logits_per_row(model, repeat=3 if quick else 11)
        kv_ms = time_kv_per_token(model, repeat=3 if quick else 9)
        probes.append(speed_probe(model, repeat=prep))  # after the microbenchmarks, which the last two bracket
    load = probe.record
    # re-anchoring (real/validation/fidelity_stats.py): the table prices the machine at the reference speed P, the geometric
    # mean of the interleaved probes; run k (and the microbenchmarks) divided by its bracket's speed q_k
    ref = reference_probe(probes)
    qs = [bracket_speed(probes[i], probes[i + 1], ref) or 1.0 for i in range(len(probes) - 1)]
    steps = [anchor_steps(st, q) for st, q in zip(raw, qs)]
    parts = fit_step_parts(steps, policies)
    verify = fit_verify(steps, logits_ms / qs[-1], kv_ms / qs[-1], SHORT_QUERY_MAX)
    speed = dict(ref, anchored=True, probes=probes, speeds=qs)  # validate's reference (profile_load(...)["speed_probe"])
    if progress:
        print(f"profile: machine speed over its runs {min(qs):.3f}-{max(qs):.3f}x the reference (probes "
              f"interleaved; the table is fitted at the reference speed)", file=sys.stderr)
    src = (f"real/validation/profile.py on {machine['cpu']} ({machine['device']}, {machine['threads']} threads, torch "
           f"{machine['torch']}); every part fitted on engine runs of {', '.join(policies)} "
           f"at batch {', '.join(map(str, batch_sizes))} on traces/general.jsonl ({len(wl.requests)} requests), "
           f"{repeats} run(s) each after a "
           f"warm-up, re-anchored to the geometric mean of {len(probes)} interleaved speed probes (runs at "
           f"{min(qs):.3f}-{max(qs):.3f}x); verify fit over {verify['fit_steps']} steps, median |error| "
           f"{100 * verify['fit_median_abs_rel_error']:.1f}%; {load.note()}"
           + ("; MEASURED UNDER LOAD" if load.loaded else ""))
    if load.loaded:
        print(f"warning: the profile was measured under load ({load.note()}): its step times include other "
              "processes' contention", file=sys.stderr)
    table = build_table(wl.model_label, verify, parts, machine, kv_capacity=10**9, vocab=model.args.vocab_size, source=src,
                        gpu=gpu)
    path = None
    if out is not None:  # the table, the load it was measured under (validate's verdicts, profile_load, and the
        # profile's model instance's speed probe, for validate's trace / profile ratio) and the measured steps it was
        # fitted on (refits, plots): one unit, so a table never stands beside another run's steps
        import pandas as pd

        path = Path(out)
        if path.exists() and not overwrite:
            raise ConfigError(f"{path} already exists; pass --force to replace it")
        frames = [pd.DataFrame({k: v for k, v in st.items() if k != "policy"}).assign(policy=st["policy"]) for st in steps]
        with temp_dir("hybridspec-profile-") as d:  # the table as write_cost_table writes it
            text = write_cost_table(table, d / path.name).read_text()
        write_files(path.parent, {path.name: text,
                                  path.name + ".load.json": json.dumps({**load.to_json(), "speed_probe": speed}) + "\n",
                                  path.name + ".steps.csv": pd.concat(frames).to_csv(index=False)},
                    overwrite=True, unit=path.name)
    grid = time_decode_grid(model, repeat=3 if quick else 5)
    return table, path, grid


def profile_uncertainty_of(table_path: Path, one_run: bool = False) -> tuple[float, int]:
    """(u_p, P) of a table profiled here (real.validation.fidelity_stats.profile_uncertainty): its recorded profile runs
    (`<table>.steps.csv`; a run starts where t_start_ms returns to 0) grouped by point (policy, batch size;
    recordings made before the batch_size column: policy, step count and largest step batch, the same for runs
    of one point since profile runs decide with one provisional cost), each run's total step time. (0, 0) when
    the steps were not recorded (a table given by the user). one_run: one run's relative sd s_1 instead of u_p.
    A table profiled with interleaved probes records its steps re-anchored (anchor_steps), so these are the
    anchored runs' totals."""
    import pandas as pd

    from real.validation.fidelity_stats import profile_uncertainty

    side = Path(str(table_path) + ".steps.csv")
    if not side.is_file():
        return 0.0, 0
    df = pd.read_csv(side)
    if not {"t_start_ms", "step_ms", "policy", "num_seqs"} <= set(df.columns):
        return 0.0, 0  # steps without run boundaries (hand-made recordings): the runs cannot be paired
    run = (df["t_start_ms"] == 0).cumsum()
    totals: dict = {}
    for _, g in df.groupby(run, sort=True):
        key = ((str(g["policy"].iloc[0]), int(g["batch_size"].iloc[0])) if "batch_size" in g else
               (str(g["policy"].iloc[0]), len(g), int(g["num_seqs"].max())))
        totals.setdefault(key, []).append(float(g["step_ms"].sum()))
    return profile_uncertainty(totals, one_run)


def profile_load(table_path: Path) -> dict | None:
    """The load record written beside a table profiled here (real/validation/machine_load.py), or None (a table given by
    the user, or profiled before loads were recorded)."""
    from sim.infra.inputs import RECORD, Any, Dict, read_json

    side = Path(str(table_path) + ".load.json")
    if not side.exists():
        return None
    return read_json(side, RECORD, Dict(Any()), finite=False)  # a pipe or a damaged record: one line, not a hang


def format_grid(rows: list[tuple], table: CostTable, roofline=None) -> str:
    """The decode-shaped measurements beside the table's and (if any) the roofline model's predictions."""
    from sim.core.cost.profiled import ProfiledCost

    cost = ProfiledCost(table, fallback=None)
    head = "reqs  tokens  measured_ms  table_ms" + ("  roofline_ms" if roofline is not None else "")
    lines = [head]
    for R, T, K, M, ms in rows:
        line = f"{R:4d}  {T:6d}  {ms:11.2f}  {float(cost.verify_ms(T, K, R, logit_rows=M)):8.2f}"
        if roofline is not None:
            line += f"  {float(roofline.verify_ms(T, K, R)):11.2f}"
        lines.append(line)
    return "\n".join(lines)


def parse_args(argv):
    ap = ArgumentParser(prog="python -m real.profile_costs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", type=llm_name,
                    help="a models/llms name or its Hugging Face id, as in sim.api.run (real weights: smollm2-135m only)")
    ap.add_argument("--random-weights", action="store_true", help="random weights, teacher-forced (any models/llms name)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--policy", action="append", help="policies whose allocation cost to profile (repeatable)")
    ap.add_argument("--batch-size", action="append", type=int, help="batch sizes of the engine runs (repeatable)")
    ap.add_argument("--quick", action="store_true", help="fewer points and repeats (tests)")
    ap.add_argument("--repeat", type=int, default=None, help="engine runs per (policy, batch size), ABBA order after "
                                                             "a warm-up (default 2, --quick 1)")
    ap.add_argument("--out", default=None, help="table file to write (JSON); refuses to overwrite without --force")
    ap.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    ap.add_argument("--engine", default="torch", help="torch or vllm (vllm: `vllm bench forward` on a CUDA GPU; "
                                                      "--out defaults to out/cost_table_vllm.json)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands it would run and exit (vLLM engine)")
    from real.validation.machine import add_gpu_spec_flag
    from real.validation.vllm.config import add_arguments

    add_gpu_spec_flag(ap)
    add_arguments(ap, hybrid=False)
    a = ap.parse_args(argv)
    if a.engine not in ("torch", "vllm"):
        raise ConfigError(f"--engine must be one of torch, vllm, got '{a.engine}'")
    if a.repeat is not None and a.repeat < 1:
        raise ConfigError(f"--repeat must be >= 1, got {a.repeat}")
    if a.gpu_spec is not None:
        from real.validation.machine import given_gpu_spec

        given_gpu_spec(a.gpu_spec)  # an unknown name fails before any work
    return a


def main(argv: list[str] | None = None) -> int:
    from real.validation.options import ProfileOptions

    a = ProfileOptions.from_namespace(parse_args(argv), argv if argv is not None else sys.argv[1:])
    if a.engine == "vllm":
        from real.validation.vllm.flow import profile_vllm

        return profile_vllm(a)
    from real.validation.vllm.config import given_flags

    given = given_flags(a.vllm) + (["--dry-run"] if a.dry_run else [])
    if given:
        raise ConfigError(f"{given[0]} is for --engine vllm")
    pols = a.policy or ["none", "adaptive", "hybrid-price", "ngram-fixed:32"]
    bss = a.batch_size or [1, 16]
    if any(b < 1 for b in bss):
        raise ConfigError(f"--batch-size must be >= 1, got {min(bss)}")
    for p in pols:
        get_policy(p)  # unknown names fail before any work
    if a.out:  # before minutes of profiling, not after: writable, a file name, existing only with --force
        check_out_file(a.out, a.force, "--out")
    table, path, grid = profile(a.model, a.random_weights, a.device, pols, bss, a.quick,
                          Path(a.out) if a.out else None, overwrite=a.force, repeats=a.repeat, gpu_spec=a.gpu_spec)
    roof = None
    try:
        from sim.core.cost import make_cost_model
        if a.device == "cuda":
            roof = make_cost_model("roofline", llm=a.model, gpu=table.gpu)
    except Exception:  # noqa: BLE001 -- no roofline spec for this device: print the measurements alone
        roof = None
    print(format_grid(grid, table, roof))
    print(f"fit: logits_ms_per_row {table.logits_ms_per_row:.4f}  kv_ms_per_token {table.kv_ms_per_token:.2e}  "
          f"attn_ms_per_row_kv {table.attn_ms_per_row_kv:.2e}")
    if path:
        print(f"wrote {path}")
    return 0
