"""The drafter axis' held-out-style check: does `hybrid` over three drafters (dspark, ngram, suffix) keep up with
the better of two-drafter `hybrid` and the best single-drafter policy, and does the per-step oracle bound every
policy's step?

    python -m sim.drafter_axis --trace traces/codeedit.jsonl --trace traces/chat.jsonl \
        --batch-size 1 --batch-size 4 --batch-size 32 --batch-size 128 --batch-size 256 --sample 256

Per trace and batch size it runs, on the same requests and draft tables: `hybrid` with --drafters
dspark,ngram,suffix and with dspark,ngram; the single-drafter policies adaptive, model-fixed:7 (dspark),
ngram-fixed:32 (ngram) and suffix; the three-drafter `hybrid-price` and `oracle`. It prints each one's output
throughput and the ratio hybrid[3] / max(hybrid[2], best single) (target >= 0.99).
`--option OPT` (repeatable) adds hybrid:OPT over three and two drafters and its ratio hybrid:OPT[3] / max(hybrid[2],
hybrid:OPT[2], best single); an option with table=step (the step's own verify table) also adds `adaptive:table=step`
to the single-drafter policies, so that a single-drafter policy priced the same way is in every ratio.

Step bound: on every decode step of every three-drafter run the checking engine also computes the oracle
(sim/core/policies/multi.oracle_n) over the drafters whose chains the step holds, from the step's true accepted
lengths and the verify table the engine charges, and counts the steps whose realised goodput
(N + accepted draft tokens) / (price of the drafters that ran + verify_ms[T + admitted slots]) exceeds the
oracle's (target: 0). The oracle over three drafters is at least that over any of their subsets, so a step of a
two-drafter policy, bounded by the two-drafter oracle (tests/test_oracle_bound.py checks every policy's steps),
is bounded by the three-drafter one; those run on the plain engine.
Simulation only: no real run checks these figures (the suffix drafter's price is an assumption,
sim/core/drafters/suffix.py: LiveSuffixDrafter).
"""
from __future__ import annotations

import dataclasses
import sys

import torch

from sim.core.config import DEFAULT_DRAFTERS, WITH_SUFFIX
from sim.infra.cli import SEED, ArgumentParser, int_at_least
from sim.core.drafters.registry import live_drafters
from sim.engine.engine import Engine, EngineConfig
from sim.infra.errors import ConfigError
from sim.core.metrics import summarize
from sim.core.policies import get_policy
from sim.engine.policies import sim_policy
from sim.core.policies.base import Allocation, Plan, StepBatch
from sim.core.policies.common import goodput
from sim.core.policies.multi import oracle_n

THREE, TWO = WITH_SUFFIX, DEFAULT_DRAFTERS
RUNS = (("hybrid", THREE), ("hybrid", TWO), ("adaptive", TWO), ("model-fixed:7", TWO), ("ngram-fixed:32", TWO),
        ("suffix", THREE), ("hybrid-price", THREE), ("oracle", THREE))
SINGLES = ("adaptive", "model-fixed:7", "ngram-fixed:32", "suffix")
EPS = 1e-9


def step_goodput(batch: StepBatch, alloc: Allocation, ran: set) -> float:
    """Realised goodput of `alloc` on `batch` [tokens/ms]: accepted draft tokens by the true lengths, the drafters
    in `ran` priced (and the allocation kernel if any ran), verify at the engine's charged table."""
    acc = {1: batch.true_acc.get("dspark"), 2: batch.true_acc.get("ngram"), 3: batch.true_acc.get("suffix")}
    chain, adm = alloc.chain.numpy(), alloc.admitted.numpy()
    sec = None if alloc.second is None else alloc.second.numpy()
    got = 0
    for r in range(len(chain)):
        c = int(chain[r])
        if c == 0:
            continue
        a = min(int(adm[r]), int(acc[c][r]))
        if sec is not None and sec[r] > 0:
            a = max(a, min(int(sec[r]), int(acc[3 - c][r])))
        got += a
    slots = int(adm.sum()) + (0 if sec is None else int(sec.sum()))
    prices = batch.draft_ms_of
    alloc_ms = batch.draft_cost_ms
    for v in prices.values():
        alloc_ms = alloc_ms - v
    d = sum(float(batch.price(n)) for n in ran) + (float(alloc_ms) if ran else 0.0)
    t = dataclasses.replace(batch, verify_cost_ms=batch.true_verify_cost_ms)
    return float(goodput(t, torch.tensor(float(got), dtype=torch.float64), torch.tensor(slots), d))


class BoundCheckingEngine(Engine):
    """The simulator's engine (numpy step) that also checks each decode step against the per-step oracle."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.checked = self.beaten = 0
        self.worst = 0.0

    def _step_batch(self, reqs, rows, chains, *args) -> StepBatch:
        b = super()._step_batch(reqs, rows, chains, *args)
        if not b.true_acc:  # the truth every step (the oracle's), whatever the policy
            tb, T, kv, n_seqs = self.tb, args[2], args[3], args[4]
            truth = {"dspark": torch.from_numpy(tb.m_acc[rows]), "ngram": torch.from_numpy(tb.ng_acc[rows]),
                     **{k: torch.from_numpy(c[3]) for k, c in chains.get("live", {}).items()}}
            b = dataclasses.replace(b, true_acc=truth,
                                    true_verify_cost_ms=torch.from_numpy(self._true_table(T, len(reqs), kv, n_seqs)))
        return b

    def _allocate(self, batch: StepBatch, plan: Plan) -> Allocation:
        alloc = super()._allocate(batch, plan)
        ran = {n for n in plan.drafters if alloc.said(n) is None or bool(alloc.said(n))}
        names = tuple(batch.chains)
        g_pol = step_goodput(batch, alloc, ran)
        o = oracle_n(batch, names)
        g_or = step_goodput(batch, o, {n for n in names if bool(o.ran[n])})
        self.checked += 1
        if g_pol > g_or * (1 + EPS):
            self.beaten += 1
            self.worst = max(self.worst, g_pol / g_or - 1)
        return alloc


def run(prep, policy: str, drafters: str, batch_size: int) -> tuple[float, int, int]:
    """(output tokens/s, steps checked, steps where the policy beat the oracle) of one run (sim.api.run.run_one's
    engine and settings, on the bound-checking engine)."""
    s = prep.setup
    pol = sim_policy(policy, drafters)
    live = live_drafters(pol.uses_extra, s.drafter_config)
    cfg = EngineConfig(batch_size=batch_size, max_num_batched_tokens=s.max_num_batched_tokens,
                       kv_capacity_tokens=s.kv_capacity_tokens, rate=s.rate, seed=s.seed,
                       async_scheduling=s.async_scheduling)
    # a two-drafter policy's steps are bounded by the oracle over its two drafters (tests/test_oracle_bound.py,
    # every policy's steps on random traces): it runs on the plain engine, with its fast forms
    cls = BoundCheckingEngine if drafters == THREE else Engine
    eng = cls(prep.tables, prep.arrivals, pol, prep.cost, cfg, live=live)
    res = eng.run().raise_if_lossy(f"{policy} [{drafters}] at batch {batch_size}")
    return summarize(res, batch_size)["output_throughput_tok_s"], getattr(eng, "checked", 0), getattr(eng, "beaten", 0)


def main(argv=None) -> int:
    from sim.api.run import SimSetup, prepare

    ap = ArgumentParser(prog="python -m sim.drafter_axis", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", action="append", help="trace(s) (default: traces/codeedit.jsonl traces/chat.jsonl)")
    ap.add_argument("--batch-size", action="append", type=int_at_least(1), help="(default: 1 4 32 128 256)")
    ap.add_argument("--sample", type=int_at_least(1), default=None, help="requests sampled per trace (default: all)")
    ap.add_argument("--seed", type=SEED, default=0, help="seed of the sample and the drafters' draws (default 0)")
    ap.add_argument("--targets-only", action="store_true",
                    help="skip the runs the targets do not need (three-drafter hybrid-price and oracle)")
    ap.add_argument("--recal", type=float, action="append", metavar="K",
                    help="also run hybrid:recal=K over three and two drafters (online recalibration, prior precision "
                         "K > 0; sim/core/drafters/recalibration.py; repeatable) and print its ratio, rK = "
                         "hybrid:recal=K[3] / max(hybrid[2], hybrid:recal=K[2], best single)")
    ap.add_argument("--option", action="append", metavar="OPT",
                    help="also run hybrid:OPT over three and two drafters (an option of hybrid's, e.g. table=step; "
                         "repeatable) and print its ratio, r:OPT = hybrid:OPT[3] / max(hybrid[2], hybrid:OPT[2], "
                         "best single)")
    a = ap.parse_args(argv)
    for k in a.recal or []:
        if not k > 0:
            raise ConfigError(f"--recal must be > 0, got {k:g}")
    opts = [f"recal={k:g}" for k in a.recal or []] + list(a.option or [])
    for o in opts:
        get_policy(f"hybrid:{o}", THREE)  # a bad option: one line before anything runs
    runs = [r for r in RUNS if not (a.targets_only and r[0] in ("hybrid-price", "oracle"))]
    singles = SINGLES
    if any("table=step" in o.split(":") for o in opts):  # a single-drafter policy priced the same way
        runs.append(("adaptive:table=step", TWO))
        singles += ("adaptive:table=step",)
    for o in opts:
        runs += [(f"hybrid:{o}", THREE), (f"hybrid:{o}", TWO)]
    sizes = a.batch_size or [1, 4, 32, 128, 256]
    ok, rok = True, {}
    print(f"{'trace':24} {'batch':>5} " + " ".join(f"{p + ('[3]' if d == THREE and p.split(':')[0] == 'hybrid' else '[2]' if p.split(':')[0] == 'hybrid' else ''):>14}"
                                              for p, d in runs) + f" {'ratio':>7}"
          + "".join(f" {'r:' + o:>9}" for o in opts) + f" {'beaten':>9}")
    for trace in a.trace or ["traces/codeedit.jsonl", "traces/chat.jsonl"]:
        prep = prepare(SimSetup(trace=trace, sample=a.sample, seed=a.seed, drafters=THREE))
        n = len(prep.arrivals)
        for b in sizes:
            if b > n:
                print(f"{trace:24} {b:>5} skipped: {n} requests (runs as batch {n})", file=sys.stderr)
                continue
            tput, checked, beaten = {}, 0, 0
            for p, d in runs:
                print(f"\r{trace} batch {b}: {p} [{d}]" + " " * 20, end="", file=sys.stderr, flush=True)
                t, c, k = run(prep, p, d, b)
                tput[(p, d)] = t
                checked, beaten = checked + c, beaten + k
            print("\r" + " " * 80 + "\r", end="", file=sys.stderr)
            best = max([tput[("hybrid", TWO)]] + [tput[(p, d)] for p, d in runs if p in singles])
            ratio = tput[("hybrid", THREE)] / best
            ok = ok and ratio >= 0.99 and beaten == 0
            rtext = ""
            for o in opts:
                rc = f"hybrid:{o}"
                rratio = tput[(rc, THREE)] / max(best, tput[(rc, TWO)])
                rok[o] = rok.get(o, True) and rratio >= 0.99
                rtext += f"{rratio:>9.3f} "
            print(f"{trace:24} {b:>5} " + " ".join(f"{tput[k]:>14,.0f}" for k in runs) + f" {ratio:>7.3f} " + rtext
                  + f"{beaten:>4}/{checked}", flush=True)
    print(f"targets (ratio >= 0.99, no step beats the oracle): {'met' if ok else 'NOT met'}")
    for o in opts:
        print(f"with hybrid:{o} (r:{o} >= 0.99): {'met' if rok.get(o, True) else 'NOT met'}")
    return 0
