"""Trace statistics: request count, token-length percentiles and the n-gram copy fraction.

copy fraction = share of output positions (pooled over all content requests) where the n-gram
(prompt-lookup) drafter's proposal has its first token equal to the next output token, i.e.
mean(acc_len >= 1) with the exact drafter of sim.core.drafters.ngram and its default NgramConfig.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.core.trace.schema import Trace

PCTS = (10, 50, 90, 99)


@dataclass
class TraceStats:
    path: str
    n: int
    n_length_only: int
    skipped: int
    prompt: dict[str, float]
    output: dict[str, float]
    copy_fraction: float | None  # None: no content requests, or the n-gram drafter is unavailable
    mean_ngram_accept: float | None  # mean accepted length per output position (incl. zeros)
    workloads: dict[str | None, int]  # None: requests without a workload field

    def _workloads(self) -> str:
        """`code=3, chat=2`, requests with no workload field counted as `no workload field=N`."""
        named = ", ".join(f"{k}={v}" for k, v in sorted((k, v) for k, v in self.workloads.items() if k is not None))
        unnamed = self.workloads.get(None, 0)
        if not named:
            return "none named (no request has a workload field)"
        return named + (f", no workload field={unnamed}" if unnamed else "")

    def format(self) -> str:
        def row(name, d):
            return f"  {name:<14}" + "  ".join(f"{k}={v:.0f}" if k != "mean" else f"mean={v:.1f}" for k, v in d.items())
        lines = [f"{self.path}: {self.n} requests"
                 + (f" ({self.n_length_only} length-only)" if self.n_length_only else "")
                 + (f", {self.skipped} bad lines skipped" if self.skipped else ""),
                 "  workloads     " + self._workloads(),
                 row("prompt tokens", self.prompt), row("output tokens", self.output)]
        if self.copy_fraction is None:
            lines.append("  ngram copy fraction: n/a (no output content, or sim.core.drafters.ngram unavailable)")
        else:
            lines.append(f"  ngram copy fraction: {self.copy_fraction:.3f} "
                         f"(mean accepted tokens per position {self.mean_ngram_accept:.2f})")
        return "\n".join(lines)


def _pct(x: np.ndarray) -> dict[str, float]:
    out = {f"p{p}": float(np.percentile(x, p)) for p in PCTS}
    out["mean"] = float(x.mean())
    return out


def trace_stats(trace: Trace) -> TraceStats:
    reqs = trace.requests
    try:
        from sim.core.drafters.ngram import NgramConfig, ngram_tables  # the exact drafter (imported lazily)
    except ImportError:
        ngram_tables = None
    p = np.array([r.prompt_len for r in reqs], dtype=np.float64)
    o = np.array([r.output_len for r in reqs], dtype=np.float64)
    cfg = NgramConfig() if ngram_tables is not None else None
    hits = acc = positions = 0
    for r in reqs:
        if ngram_tables is None or r.length_only or r.prompt_ids is None:
            continue
        table = ngram_tables(r.tokens(), r.prompt_len, cfg)
        hits += int((table.acc_len >= 1).sum())
        acc += int(table.acc_len.sum())
        positions += len(table.acc_len)
    workloads: dict[str | None, int] = {}  # None: requests without a workload field
    for r in reqs:
        workloads[r.workload or None] = workloads.get(r.workload or None, 0) + 1
    return TraceStats(trace.path, len(reqs), sum(r.length_only for r in reqs), trace.skipped, _pct(p), _pct(o),
                      hits / positions if positions else None, acc / positions if positions else None, workloads)
