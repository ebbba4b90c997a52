"""Drafter-only comparison of the suffix-tree drafter (sim/core/drafters/suffix.py) with the exact n-gram drafter on a
trace's requests, position by position (no engine, no policy: what each drafter proposes and what the target
accepts at every output position, at temperature 0):

    python -m sim.suffix_report --trace traces/codeedit.jsonl --sample 40

Per drafter: the share of positions with a proposal, the mean proposal length, the mean accepted tokens per
position (the tokens a step verifying the whole chain would gain besides its bonus token) and accepted per
proposed token. The suffix drafter runs twice: with its per-request tree only, and with the global tree of
finished outputs, fed in trace order (each request finishes before the next starts: a serial schedule; in a
batched engine fewer outputs are finished at any step, so this is its best case). Simulation only: no real
run checks these figures.
"""
from __future__ import annotations

import sys

import numpy as np

from sim.infra.cli import SEED, ArgumentParser, int_at_least
from sim.infra.errors import ConfigError
from sim.core.drafters.suffix import SuffixConfig, SuffixDrafter, accepted_length, check_memory

DEFAULT_SAMPLE = 40


def compare(tables, cfg: SuffixConfig, progress: bool = True) -> dict:
    """{drafter: (share of positions proposing, mean proposal length, mean accepted per position, accepted per
    proposed token)} over every output position of every request in `tables` (DraftTables). ConfigError before any
    tree is built when the drafter would not fit in memory (requests run one at a time: batch 1)."""
    tb = tables
    check_memory(cfg, np.asarray(tb.prompt_len) + np.asarray(tb.out_len), tb.out_len, 1)
    out = {}
    ng_len, ng_acc = np.asarray(tb.ng_len, dtype=np.int64), np.asarray(tb.ng_acc, dtype=np.int64)
    out["ngram"] = _summary(ng_len, ng_acc)
    for name, c in (("suffix (request tree)", SuffixConfig(**{**cfg.__dict__, "max_cached": 0})),
                    ("suffix (request + global tree)", cfg)):
        d = SuffixDrafter(c)
        lens, accs = [], []
        for r in range(len(tb.out_len)):
            base, P, L = int(tb.tok_offsets[r]), int(tb.prompt_len[r]), int(tb.out_len[r])
            seq = tb.tokens[base: base + P + L].tolist()
            d.start(r, seq[:P])
            for i in range(L):
                p = d.propose(r)
                lens.append(len(p))
                accs.append(accepted_length(p, seq[P + i:]))
                d.observe(r, [seq[P + i]])
            d.stop(r)
            if progress:
                print(f"\r{name}: request {r + 1}/{len(tb.out_len)}", end="", file=sys.stderr, flush=True)
        if progress:
            print(file=sys.stderr)
        out[name] = _summary(np.asarray(lens), np.asarray(accs))
    return out


def _summary(lens: np.ndarray, accs: np.ndarray) -> tuple:
    n = max(len(lens), 1)
    return (float((lens > 0).sum() / n), float(lens[lens > 0].mean()) if (lens > 0).any() else 0.0,
            float(accs.sum() / n), float(accs.sum() / max(lens.sum(), 1)))


def main(argv=None) -> int:
    from sim.api.run import SimSetup, prepare

    ap = ArgumentParser(prog="python -m sim.suffix_report", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", action="append", help="trace(s) (default: traces/codeedit.jsonl traces/chat.jsonl)")
    ap.add_argument("--sample", type=int_at_least(1), default=None,
                    help=f"requests sampled per trace (default {DEFAULT_SAMPLE}, or every request of a smaller trace)")
    ap.add_argument("--seed", type=SEED, default=0, help="seed of the sample (default 0)")
    a = ap.parse_args(argv)
    from sim.core.trace.loader import scan_trace

    traces = a.trace or ["traces/codeedit.jsonl", "traces/chat.jsonl"]
    samples = {}
    for trace in traces:  # before any work: every trace readable, and the sample each one takes
        n = scan_trace(trace)[0]
        samples[trace] = a.sample if a.sample is not None else (DEFAULT_SAMPLE if n > DEFAULT_SAMPLE else None)
    cfg = SuffixConfig()
    preps = {}
    for trace in traces:  # every trace checked before the table starts
        prep = preps[trace] = prepare(SimSetup(trace=trace, sample=samples[trace], seed=a.seed))
        if prep.length_only:  # its tokens would be drawn, not the trace's: a table of made-up proposals
            raise ConfigError(f"{trace}: a length-only trace (no prompt or output tokens): the drafters propose from "
                              "the request's tokens; give a trace with text or token ids")
        tb = prep.tables
        check_memory(cfg, np.asarray(tb.prompt_len) + np.asarray(tb.out_len), tb.out_len, 1)
    print(f"suffix drafter {cfg}; n-gram drafter as the tables' (exact, vLLM's rule)")
    print(f"{'trace':28} {'drafter':32} {'proposes':>9} {'mean len':>9} {'acc/pos':>8} {'acc/tok':>8}")
    for trace, prep in preps.items():
        for name, (share, mlen, acc, per_tok) in compare(prep.tables, cfg).items():
            print(f"{trace:28} {name:32} {share:9.1%} {mlen:9.2f} {acc:8.3f} {per_tok:8.3f}")
    return 0
