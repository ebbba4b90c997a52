"""CLI and Python API: replay a trace through the simulated engine for every policy x batch size.

    python -m sim.run --trace traces/codeedit.jsonl [--policy P ...] [--batch-size B ...] [--out DIR]

With no --policy it compares every registered policy against the baseline (`adaptive`) and prints one
table. The draft tables (what each drafter proposes at every output position) are computed once per
trace and shared by all runs, so every policy sees identical draws.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from sim.cli_util import run_cli
from sim.cost import make_cost_model
from sim.drafters.calibration import DEFAULT_CALIBRATOR, NgramCalibrator
from sim.drafters.model import ModelDrafterProfile, load_drafter_profile, load_recorded_drafts
from sim.drafters.ngram import NgramConfig
from sim.drafters.cache import cached_draft_tables
from sim.drafters.tables import DraftTables
from sim.engine import Engine, EngineConfig, RunResult
from sim.errors import ConfigError
from sim.metrics import summarize
from sim.policies import get_policy

BASELINE = "adaptive"
DEFAULT_POLICIES = ("none", "model-fixed:7", "ngram-fixed:32", "adaptive", "ngram-first", "suffix-threshold",
                    "hybrid", "hybrid-price", "hybrid-tree", "oracle")
DEFAULT_BATCH_SIZES = (4, 128)


@dataclass
class SimSetup:
    """What stays fixed across the policies and batch sizes of one run."""

    trace: str = "traces/codeedit.jsonl"
    model: str = "qwen3-8b"
    gpu: str = "h100-sxm"
    cost: str = "roofline"
    drafter: str = "dspark-qwen3-b7"
    calibrator: str = DEFAULT_CALIBRATOR
    ngram_k: int = 32
    seed: int = 0
    limit: int | None = None  # the first N requests
    sample: int | None = None  # a seeded sample of N requests spread across the trace (exclusive with limit)
    temperature: float | None = None
    max_num_batched_tokens: int = 8192
    rate: float | None = None
    kv_capacity_tokens: int | None = None
    drafts: str | None = None  # recorded model drafts (sidecar JSONL), replayed instead of the profile
    async_scheduling: bool = True  # False: a step is CPU + GPU in series (the real torch engine's steps)


@dataclass
class Prepared:
    setup: SimSetup
    tables: DraftTables
    arrivals: np.ndarray
    cost: object
    length_only: bool
    skipped: int


def prepare(setup: SimSetup, progress: bool = False, profile: ModelDrafterProfile | None = None) -> Prepared:
    """Load the trace, the cost model and the drafters, and build the draft tables once (or load them from
    the on-disk cache, sim.drafters.cache). `profile` overrides the named drafter profile (for fitting it)."""
    from sim.trace import load_trace

    cost = make_cost_model(setup.cost, llm=setup.model, gpu=setup.gpu)
    profile = profile or load_drafter_profile(setup.drafter)
    calib = NgramCalibrator.load(setup.calibrator)
    ngram_cfg = NgramConfig(n_min=calib.cfg.n_min, n_max=calib.cfg.n_max, k=setup.ngram_k, ext_max=calib.cfg.ext_max)
    trace = load_trace(setup.trace, limit=setup.limit, sample=setup.sample, seed=setup.seed)
    reqs = trace.requests
    if not reqs:
        raise ConfigError(f"{setup.trace}: the trace has no requests")
    if setup.temperature is not None:
        if setup.temperature < 0:
            raise ConfigError(f"--temperature must be >= 0, got {setup.temperature}")
        for r in reqs:
            r.temperature = setup.temperature
    recorded = load_recorded_drafts(setup.drafts, profile.block) if setup.drafts else None
    if recorded is not None:
        unknown = sorted(set(recorded) - {r.id for r in reqs})
        if unknown:
            raise ConfigError(f"{setup.drafts}: recorded drafts for {len(unknown)} request(s) not in the trace, e.g. '{unknown[0]}'")
    tables = cached_draft_tables(reqs, ngram_cfg, profile, calib, seed=setup.seed, progress=progress, recorded=recorded)
    arrivals = np.asarray([r.arrival_s or 0.0 for r in reqs], dtype=np.float64)
    return Prepared(setup, tables, arrivals, cost, bool(trace.length_only), trace.skipped)


def run_one(prep: Prepared, policy: str, batch_size: int, progress: bool = False) -> tuple[dict, RunResult]:
    """Simulate one (policy, batch size) and return its summary row and the raw result."""
    s = prep.setup
    pol = get_policy(policy)
    cfg = EngineConfig(batch_size=batch_size, max_num_batched_tokens=s.max_num_batched_tokens,
                       kv_capacity_tokens=s.kv_capacity_tokens, rate=s.rate, seed=s.seed,
                       async_scheduling=s.async_scheduling)
    t0 = time.perf_counter()
    res = Engine(prep.tables, prep.arrivals, pol, prep.cost, cfg, progress=progress).run()
    wall = time.perf_counter() - t0
    row = {"policy": pol.name, "batch_size": batch_size, "trace": s.trace, "model": s.model, "gpu": s.gpu,
           "cost": s.cost, "drafter": s.drafter, "ngram_k": s.ngram_k, "seed": s.seed}
    row.update(summarize(res, batch_size))
    row["wall_s"] = wall
    row["sim_tok_per_wall_s"] = row["output_tokens"] / wall if wall > 0 else float("nan")
    row["length_only"] = prep.length_only
    return row, res


_PREP: Prepared | None = None  # the parent's tables, inherited by forked workers


def _run_combo(combo: tuple[str, int]) -> tuple[dict, RunResult]:
    return run_one(_PREP, *combo)


def run_many(prep: Prepared, combos: list[tuple[str, int]], workers: int | None = None,
             progress: bool = False) -> list[tuple[dict, RunResult]]:
    """run_one for every (policy, batch size), in parallel on forked processes that inherit the draft
    tables (no copy). Slow runs (small batches, no speculation) start first. Results keep `combos` order."""
    global _PREP
    workers = min(workers or os.cpu_count() or 1, len(combos))
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [run_one(prep, p, b, progress=progress) for p, b in combos]
    order = sorted(range(len(combos)), key=lambda i: (combos[i][1], combos[i][0] != "none"))
    _PREP = prep
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            it = pool.imap(_run_combo, [combos[i] for i in order], chunksize=1)
            done = list(tqdm(it, total=len(combos), desc="runs", unit="run", disable=not progress, leave=False))
    finally:
        _PREP = None
    out: list = [None] * len(combos)
    for i, res in zip(order, done):
        out[i] = res
    return out


def add_speedups(rows: list[dict], baseline: str = BASELINE) -> None:
    """speedup_vs_baseline = throughput / the baseline's throughput at the same batch size and setup;
    steady_speedup_vs_baseline the same for the full-batch (steady-state) throughput."""
    keys = ("batch_size", "trace", "model", "gpu", "cost", "drafter", "ngram_k", "seed")
    base = {tuple(r[k] for k in keys): (r["output_throughput_tok_s"], r["steady_throughput_tok_s"])
            for r in rows if r["policy"] == baseline}
    for r in rows:
        b = base.get(tuple(r[k] for k in keys))
        r["speedup_vs_baseline"] = r["output_throughput_tok_s"] / b[0] if b else float("nan")
        r["steady_speedup_vs_baseline"] = r["steady_throughput_tok_s"] / b[1] if b else float("nan")


TABLE_COLUMNS = [
    ("policy", "policy", "{}"), ("batch_size", "bs", "{}"), ("output_throughput_tok_s", "tok/s", "{:.0f}"),
    ("speedup_vs_baseline", "x adaptive", "{:.3f}"), ("steady_speedup_vs_baseline", "x adapt. steady", "{:.3f}"),
    ("mean_tokens_per_step", "tok/req-step", "{:.2f}"),
    ("verified_tokens_per_step", "verified/step", "{:.1f}"), ("acceptance_rate", "accept", "{:.2f}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.2f}"), ("ttft_p99_s", "TTFT p99 s", "{:.2f}"),
    ("tpot_p50_ms", "TPOT p50 ms", "{:.2f}"), ("tpot_p99_ms", "TPOT p99 ms", "{:.2f}"),
    ("share_draft", "draft%", "{:.0%}"), ("share_ngram", "ngram%", "{:.0%}"), ("share_alloc", "alloc%", "{:.0%}"),
    ("share_verify", "verify%", "{:.0%}"), ("share_sample", "sample%", "{:.0%}"), ("share_cpu", "cpu%", "{:.0%}"),
    ("share_bubble", "bubble%", "{:.0%}"),
]


def format_table(rows: list[dict]) -> str:
    cells = [[h for _, h, _ in TABLE_COLUMNS]]
    for r in rows:
        cells.append([("nan" if isinstance(r.get(k), float) and np.isnan(r.get(k)) else f.format(r.get(k)))
                      for k, _, f in TABLE_COLUMNS])
    widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c[i].rjust(widths[i]) if i else c[i].ljust(widths[i]) for i in range(len(c))) for c in cells]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def write_outputs(out: Path, rows: list[dict], results: list[tuple[dict, RunResult]]) -> None:
    """summary.json, requests.csv, steps.csv and report.html in `out`."""
    from sim.report import write_run_report

    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(rows, indent=1, default=float) + "\n")
    reqs, steps = [], []
    for row, res in results:
        for frame, dest in ((res.requests, reqs), (res.steps, steps)):
            df = pd.DataFrame(frame)
            df.insert(0, "batch_size", row["batch_size"])
            df.insert(0, "policy", row["policy"])
            dest.append(df)
    pd.concat(reqs).to_csv(out / "requests.csv", index=False)
    pd.concat(steps).to_csv(out / "steps.csv", index=False)
    write_run_report(rows, [(r, res.steps) for r, res in results], out / "report.html")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m sim.run", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--trace", default="traces/codeedit.jsonl", help="JSONL trace")
    ap.add_argument("--policy", action="append", help=f"policy (repeatable); default: {' '.join(DEFAULT_POLICIES)}")
    ap.add_argument("--batch-size", action="append", type=int, help="max running requests (repeatable); default: 4 and 128")
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--gpu", default="h100-sxm",
                    help="GPU name, or with --cost profiled a cost-table file (.json/.csv) profiled for --model")
    ap.add_argument("--cost", default="roofline", help="cost model: roofline or profiled")
    ap.add_argument("--drafter", default="dspark-qwen3-b7", help="model-drafter profile: a name in models/drafters/ or a path to a profile .json")
    ap.add_argument("--drafts", default=None, help="recorded model drafts (JSONL sidecar) to replay exactly")
    ap.add_argument("--calibrator", default=DEFAULT_CALIBRATOR, help="n-gram calibrator in models/calibrators/")
    ap.add_argument("--ngram-k", type=int, default=32, help="n-gram chain length")
    ap.add_argument("--temperature", type=float, default=None, help="override every request's temperature")
    ap.add_argument("--rate", type=float, default=None, help="Poisson arrivals (req/s) instead of all at t=0")
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--kv-capacity-tokens", type=int, default=None, help="override the KV-cache size (tokens)")
    ap.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True,
                    help="overlap the CPU work of step t+1 with the GPU work of step t (vLLM's async scheduling); "
                         "--no-async-scheduling for engines whose steps are synchronous (the real torch engine)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, default=None,
                    help="use the first N requests of the trace (they may all come from one part of it)")
    ap.add_argument("--sample", type=int, default=None,
                    help="use N requests sampled across the whole trace (seeded by --seed, kept in trace order); "
                         "exclusive with --limit")
    ap.add_argument("--out", type=Path, default=None, help="write summary.json, requests.csv, steps.csv, report.html")
    ap.add_argument("--workers", type=int, default=None, help="parallel runs (default: CPU cores)")
    ap.add_argument("--no-progress", action="store_true")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    policies = list(dict.fromkeys(a.policy or DEFAULT_POLICIES))
    for p in policies:
        get_policy(p)  # fail fast on a bad name, before any work
    if BASELINE not in policies:
        policies.insert(0, BASELINE)
        print(f"note: running the baseline '{BASELINE}' too, for speedup_vs_baseline", file=sys.stderr)
    sizes = list(dict.fromkeys(a.batch_size or DEFAULT_BATCH_SIZES))
    for b in sizes:
        if b < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {b}")
    if a.workers is not None and a.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {a.workers}")
    if a.limit is not None and a.limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {a.limit}")
    setup = SimSetup(trace=a.trace, model=a.model, gpu=a.gpu, cost=a.cost, drafter=a.drafter, calibrator=a.calibrator,
                     ngram_k=a.ngram_k, seed=a.seed, limit=a.limit, sample=a.sample, temperature=a.temperature,
                     max_num_batched_tokens=a.max_num_batched_tokens, rate=a.rate, kv_capacity_tokens=a.kv_capacity_tokens,
                     drafts=a.drafts, async_scheduling=a.async_scheduling)
    progress = not a.no_progress and sys.stderr.isatty()
    prep = prepare(setup, progress=progress)
    if prep.tables.replayed_requests:
        print(f"note: {prep.tables.replayed_requests} of {len(prep.tables.out_len)} requests replay recorded drafts; "
              "the rest use the drafter profile", file=sys.stderr)
    if prep.length_only:
        print("note: length-only requests: acceptance drawn from the bundled traces' statistical profile", file=sys.stderr)
    combos = [(p, b) for b in sizes for p in policies]
    results = run_many(prep, combos, workers=a.workers, progress=progress)
    for row, res in results:  # a lossy run is a simulator bug: its numbers must not be reported
        res.raise_if_lossy(f"policy {row['policy']} at batch size {row['batch_size']}")
    rows = [row for row, _ in results]
    add_speedups(rows)
    print(f"trace {a.trace}: {rows[0]['requests']} requests, {rows[0]['output_tokens']} output tokens; "
          f"{a.model} on {a.gpu} ({a.cost}); baseline {BASELINE}")
    print(format_table(rows))
    if a.out:
        write_outputs(a.out, rows, results)
        print(f"wrote {a.out}/summary.json, requests.csv, steps.csv, report.html")
    return 0


if __name__ == "__main__":
    run_cli(main)
