"""Simulator speed benchmark: simulated output tokens per wall-clock second.

    python -m sim.bench [--trace traces/codeedit.jsonl] [--policy hybrid-price] [--batch-size 4 --batch-size 128]

Prints, for each batch size, the wall time of the engine run alone (draft tables are built once, before
timing, as `sim.run` does) and simulated output tokens per wall second. Targets (one core of the 2-core
dev machine): >= 30,000 at batch size 4 and >= 200,000 at batch size 128 on the code-editing trace.
"""
from __future__ import annotations

import argparse
import time

import torch

from sim.cli_util import run_cli
from sim.run import SimSetup, prepare, run_one

TARGETS = {4: 30_000, 128: 200_000}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default="traces/codeedit.jsonl")
    ap.add_argument("--policy", action="append")
    ap.add_argument("--batch-size", action="append", type=int)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 = one core)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    prep = prepare(SimSetup(trace=a.trace, limit=a.limit))
    print(f"draft tables for {a.trace}: {time.perf_counter() - t0:.1f} s (once per run, shared by all policies)")
    print(f"{'policy':<16}{'bs':>5}{'output tok':>12}{'wall s':>9}{'sim tok/wall s':>16}{'target':>10}")
    for b in a.batch_size or [4, 128]:
        for p in a.policy or ["hybrid-price", "adaptive"]:
            row, _ = run_one(prep, p, b)
            tgt = TARGETS.get(b)
            print(f"{p:<16}{b:>5}{row['output_tokens']:>12}{row['wall_s']:>9.2f}{row['sim_tok_per_wall_s']:>16,.0f}"
                  f"{(f'{tgt:,}' if tgt else '-'):>10}")
    return 0


if __name__ == "__main__":
    run_cli(main)
