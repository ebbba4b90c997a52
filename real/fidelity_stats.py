"""Repeated real measurements and the verdict they support: ABBA order, a noise band, agree / disagree / inconclusive.

One number from one run of a real engine on a shared machine cannot resolve a 3% fidelity target: two runs of
the same cell have differed by 10-30% here. So every cell (trace, policy, batch size) is measured N times, in
ABBA order across the cells (forward, then backward, then forward ...), so that a drift of the machine's load
over the run falls on every cell alike, and the simulator's prediction (deterministic for a given cost table)
is compared with the repeats as a sample, not with one draw.

The math, per cell (throughputs in output tokens per second of engine time):
    x_1..x_N   the real throughputs of the N repeats;  real = median(x)   (the cell's real figure)
    spread     (max(x) - min(x)) / median(x)           (kept for the report)
    band b     the relative half-width of the two-sided 90% Student-t interval of the mean:
                   b = t_{0.95, N-1} * sd(x) / (sqrt(N) * mean(x));   N = 1: b = inf (the noise is unknown)
    error e    predicted / real - 1                    (signed; |e| is the reported error)
    margin M   the fidelity target (default 0.03)
Verdict (in this order):
    disagrees     |e| - b > M: even the end of the 90% interval nearest the prediction lies outside the margin,
                  so the hypothesis "|true error| <= M" is rejected at the 5% level (the one-sided test that is
                  the mirror of TOST's equivalence test);
    inconclusive  b > M: the repeats scatter more than the margin, so the measurement cannot tell an error of M
                  from the machine's noise, whatever the point error;
    agrees        |e| <= M (with b <= M: the error is inside max(M, b) = M);
    disagrees     otherwise (M < |e| with a band narrow enough to resolve M).
A cell measured under load (real/machine_load.py: other processes took cores the engine needed) keeps its
figures but cannot disagree: a large error under load is reported as "inconclusive (load)", since the load
alone can explain it. When the cost table itself was profiled under load, every cell is inconclusive: the
prediction then carries the profile's contention, whatever the real runs saw.
The run's verdict: inconclusive when more than half of its cells are; otherwise agrees when every conclusive
cell agrees, else disagrees. Its error figures are the median and max |e| over the conclusive cells.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Hashable, Iterable, Sequence

from scipy import stats

DEFAULT_MARGIN = 0.03
VERDICTS = ("agrees", "disagrees", "inconclusive")


def abba_order(keys: Sequence[Hashable], repeats: int) -> list[tuple[Hashable, int]]:
    """The measurement order of `repeats` rounds over `keys`: round r visits the keys forward when r is even and
    backward when r is odd (A B C, C B A, A B C ...). Each key appears once per round; over an even number of
    rounds every key has the same mean position in time, so a linear drift of the machine cancels."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    order: list[tuple[Hashable, int]] = []
    for r in range(repeats):
        seq = keys if r % 2 == 0 else list(reversed(keys))
        order.extend((k, r) for k in seq)
    return order


def noise_band(xs: Sequence[float]) -> float:
    """b: relative half-width of the two-sided 90% t interval of the mean of xs (inf for fewer than 2 samples
    or a non-positive mean). Identical repeats give 0."""
    n = len(xs)
    if n < 2:
        return math.inf
    mean = sum(xs) / n
    if not mean > 0:
        return math.inf
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return float(stats.t.ppf(0.95, n - 1)) * sd / (math.sqrt(n) * mean)


@dataclass(frozen=True)
class CellVerdict:
    """One cell's repeated measurement against the simulator's prediction (module docstring for the math)."""
    repeats: int
    real: float            # median real throughput, tokens / s
    real_min: float
    real_max: float
    spread: float          # (max - min) / median
    band: float            # b, relative; inf with one repeat
    predicted: float
    error: float           # predicted / real - 1, signed
    margin: float
    loaded: bool
    verdict: str           # one of VERDICTS
    reason: str            # why, in a few words

    def to_json(self) -> dict:
        d = asdict(self)
        d["band"] = None if math.isinf(self.band) else self.band  # JSON has no inf
        return d

    @classmethod
    def from_json(cls, d: dict) -> "CellVerdict":
        return cls(**{**d, "band": math.inf if d.get("band") is None else d["band"]})


def judge(xs: Sequence[float], predicted: float, margin: float = DEFAULT_MARGIN, loaded: bool = False,
          table_loaded: bool = False) -> CellVerdict:
    """The verdict of one cell: repeats xs of the real throughput against the simulator's `predicted` one.
    table_loaded: the cost table behind the prediction was itself profiled under load, so the prediction
    carries that load's contention and no verdict but inconclusive is honest."""
    if not xs:
        raise ValueError("a cell needs at least one measurement")
    if not margin > 0:
        raise ValueError(f"margin must be > 0, got {margin}")
    srt = sorted(float(x) for x in xs)
    n = len(srt)
    med = statistics.median(srt)
    band = noise_band(srt)
    err = predicted / med - 1.0 if med > 0 else math.inf
    ae = abs(err)
    if ae - band > margin:
        verdict, reason = "disagrees", f"|error| {100 * ae:.1f}% beyond margin {100 * margin:.0f}% + band {100 * band:.1f}%"
    elif band > margin:
        verdict, reason = "inconclusive", (f"noise band {100 * band:.1f}% wider than margin {100 * margin:.0f}%"
                                           if n > 1 else "one repeat: noise unknown")
    elif ae <= margin:
        verdict, reason = "agrees", f"|error| {100 * ae:.1f}% within margin {100 * margin:.0f}%"
    else:
        verdict, reason = "disagrees", f"|error| {100 * ae:.1f}% outside margin {100 * margin:.0f}% (band {100 * band:.1f}%)"
    if loaded and verdict == "disagrees":
        verdict, reason = "inconclusive", "measured under load: " + reason
    if table_loaded:
        verdict, reason = "inconclusive", "cost table profiled under load: " + reason
    return CellVerdict(n, med, srt[0], srt[-1], (srt[-1] - srt[0]) / med if med > 0 else math.inf, band, float(predicted),
                       err, margin, loaded, verdict, reason)


@dataclass(frozen=True)
class RunSummary:
    """Counts of each verdict over a run's cells and the error figures of its conclusive cells."""
    cells: int
    agrees: int
    disagrees: int
    inconclusive: int
    loaded: int
    median_error: float    # over conclusive cells, |e|; nan when none is conclusive
    max_error: float
    verdict: str

    def to_json(self) -> dict:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}

    def line(self) -> str:
        err = (f"median |error| {100 * self.median_error:.1f}%, max {100 * self.max_error:.1f}% over the "
               f"{self.agrees + self.disagrees} conclusive cells" if self.agrees + self.disagrees else
               "no conclusive cell")
        load = f"; {self.loaded} measured under load" if self.loaded else ""
        return (f"verdict: {self.verdict.upper()} ({self.agrees} agree, {self.disagrees} disagree, "
                f"{self.inconclusive} inconclusive of {self.cells}{load}); {err}")


def summarize(verdicts: Iterable[CellVerdict]) -> RunSummary:
    vs = list(verdicts)
    count = {k: sum(v.verdict == k for v in vs) for k in VERDICTS}
    concl = sorted(abs(v.error) for v in vs if v.verdict != "inconclusive")
    med, mx = (statistics.median(concl), concl[-1]) if concl else (math.nan, math.nan)
    if not vs or 2 * count["inconclusive"] > len(vs):
        verdict = "inconclusive"
    else:
        verdict = "agrees" if count["disagrees"] == 0 else "disagrees"
    return RunSummary(len(vs), count["agrees"], count["disagrees"], count["inconclusive"], sum(v.loaded for v in vs),
                      med, mx, verdict)
