"""Repeated real measurements and the verdict they support: ABBA order, a noise band, agree / disagree / inconclusive.

One number from one run of a real engine on a shared machine cannot resolve a 3% fidelity target: two runs of
the same cell have differed by 10-30% here. So every cell (trace, policy, batch size) is measured N times, in
ABBA order across the cells (forward, then backward, then forward ...), so that a drift of the machine's load
over the run falls on every cell alike, and the simulator's prediction (deterministic for a given cost table)
is compared with the repeats as a sample, not with one draw.

The math, per cell (throughputs in output tokens per second of engine time):
    x_1..x_N   the real throughputs of the N repeats;  real = median(x)   (the cell's real figure)
    spread     (max(x) - min(x)) / median(x)           (kept for the report)
    u_r        the relative standard error of the repeats' mean: s / sqrt(N), s the relative sd of one repeat.
               s is POOLED over the run's cells of a trace (the machine's run-to-run noise, one sd relative to
               each cell's mean, sum of squares over sum of N - 1 degrees of freedom: 2 per cell with 3 repeats,
               30 over a trace's 15 cells), unless the cell's own scatter is significantly larger (F test,
               s_own^2 / s_pool^2 > F_{0.95}(N - 1, dof_pool)): then its own, with N - 1 dof. Why pooled: with
               3 repeats a cell's own sd has 2 dof, so its band scatters by a factor of 3 from run to run and
               t_{0.95,2} = 2.92 inflates it; the verdict then flipped on the noise of the noise estimate (two
               quiet runs of one grid: bands 4.6-5.6% at batch 4 in one, 1.6-2.9% in the other,
               reports/fidelity-verdicts-run3/4.md). Pooling assumes the relative noise is alike across cells,
               and the F test keeps a cell that breaks that on its own. A cell measured under load stays out
               of the pool (another population) and is judged on its own scatter.
    u_p        the prediction's own relative standard uncertainty: the cost table is fitted on profile runs that
               are noisy too. real/profile.py repeats every profile point (ABBA, default 2 runs); two runs of
               the same point differ by d_i (relative, i = 1..P pairs), so one run's relative sd is
               s_1 = sqrt(mean(d_i^2) / 2) with P degrees of freedom, and the table's level, a mean over n_r
               runs per point, is uncertain by u_p = s_1 / sqrt(n_r) (conservatively: the points' errors are
               taken as fully correlated, a common speed level of the profile's session, so averaging over
               points buys nothing). 0 when the profile's runs are not known (a table given by the user).
    band b     the relative half-width of the two-sided 90% Student-t interval of the error
               e = predicted / real - 1, whose relative variance is u_r^2 + u_p^2 (independent samples):
                   b = t_{0.95, nu} * sqrt(u_r^2 + u_p^2),  nu = Welch-Satterthwaite
                       (u_r^2 + u_p^2)^2 / (u_r^4 / nu_r + u_p^4 / P), nu_r the dof of s;
               N = 1 with no pooled s: b = inf (noise unknown). With u_p = 0 and the cell's own s this is the
               repeats' interval, t_{0.95, N-1} sd / (sqrt(N) mean).
    error e    predicted / real - 1                    (signed; |e| is the reported error)
    margin M   the fidelity target (default 0.03)
Verdict (in this order):
    disagrees     |e| - b > M: even the end of the 90% interval nearest zero lies outside the margin, so the
                  hypothesis "|true error| <= M" is rejected at the 5% level (the one-sided test that is the
                  mirror of TOST's equivalence test);
    inconclusive  b > M: the noise scatters more than the margin, so the measurement cannot tell an error of M
                  from the machine's noise, whatever the point error;
    agrees        |e| <= M (with b <= M: the error is inside max(M, b) = M);
    inconclusive  otherwise: M < |e| <= M + b, the point error is outside the margin but the interval reaches
                  back inside it, so "|true error| <= M" is not rejected. (Before, such a cell was called
                  "disagrees"; that is no test at the 5% level, and a cell whose true error sits near the margin
                  then flipped between agrees and disagrees from run to run: reports/fidelity-verdicts-run3/4.md,
                  ngram-fixed:32 at batch 1, 0.0% then 4.0% with a 1.3% band.)
A cell measured under load (real/machine_load.py: other processes took cores the engine needed) keeps its
figures but cannot disagree: a large error under load is reported as "inconclusive (load)", since the load
alone can explain it. When the cost table itself was profiled under load, every cell is inconclusive: the
prediction then carries the profile's contention, whatever the real runs saw.
What the band leaves out: a drift of the machine's speed between the profile and the cells (real/validate.py's
speed probe measures it; it is reported beside the verdict, not in it: one probe's own scatter, 2-6% here, is
larger than the drifts it would correct). But a cell whose probes (the median over its repeats, each run right
after a repeat) say the machine ran the profile's fixed forwards more than the margin slower or faster is
marked *drifted* and, like a loaded cell, cannot disagree: the prediction was priced at another machine speed,
so an error beyond the margin cannot be put on the simulator. This catches load the guard cannot see (another
tenant of the host: two quiet default-grid runs here, others 0.01 cores, saw the same forwards take 1.13-1.25x
the profile's time in one of them). The mark only ever turns "disagrees" into "inconclusive", so a probe's own
scatter can cost conclusiveness but never makes a verdict wrong.
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


def rel_scatter(xs: Sequence[float]) -> tuple[float, int]:
    """(s, dof): the relative sd of one measurement of xs (sd about the mean over the mean) and its degrees of
    freedom, N - 1; (nan, 0) for fewer than 2 samples or a non-positive mean."""
    n = len(xs)
    if n < 2:
        return math.nan, 0
    mean = sum(xs) / n
    if not mean > 0:
        return math.nan, 0
    return math.sqrt(sum((x / mean - 1.0) ** 2 for x in xs) / (n - 1)), n - 1


def pooled_scatter(samples: Iterable[Sequence[float]]) -> tuple[float, int]:
    """(s_pool, dof): the relative sd of one repeat pooled over cells (module docstring); (nan, 0) without any
    cell of 2 or more repeats."""
    ss, dof = 0.0, 0
    for xs in samples:
        s, d = rel_scatter(xs)
        if d:
            ss += s * s * d
            dof += d
    return (math.sqrt(ss / dof), dof) if dof else (math.nan, 0)


def cell_scatter(xs: Sequence[float], pooled: tuple[float, int] | None) -> tuple[float, int]:
    """(s, dof) a cell's band uses: the pooled one unless the cell's own is significantly larger (F test at 5%),
    else its own (module docstring)."""
    own = rel_scatter(xs)
    if pooled is None or not pooled[1] or math.isnan(pooled[0]):
        return own
    if own[1] and pooled[0] > 0 and own[0] ** 2 / pooled[0] ** 2 > float(stats.f.ppf(0.95, own[1], pooled[1])):
        return own
    if own[1] and pooled[0] == 0:
        return own
    return pooled


def noise_band(xs: Sequence[float], pred_sd: float = 0.0, pred_df: float = math.inf,
               pooled: tuple[float, int] | None = None) -> float:
    """b: relative half-width of the two-sided 90% t interval of the error against a prediction whose relative
    standard uncertainty is pred_sd with pred_df degrees of freedom (module docstring; pred_sd = 0 and no pooled
    scatter: the interval of the mean of xs). pooled: (s_pool, dof) of the run's cells (pooled_scatter). inf when
    the noise is unknown (one repeat and nothing pooled) or the mean is not positive."""
    n = len(xs)
    if not n or not sum(xs) > 0:
        return math.inf
    s, nu_r = cell_scatter(xs, pooled)
    if not nu_r:
        return math.inf
    ur2, up2 = s * s / n, max(float(pred_sd), 0.0) ** 2
    var = ur2 + up2
    if var == 0.0:
        return 0.0
    denom = ur2 * ur2 / nu_r + (up2 * up2 / pred_df if up2 and math.isfinite(pred_df) else 0.0)
    nu = var * var / denom if denom > 0 else math.inf
    t = float(stats.t.ppf(0.95, nu)) if math.isfinite(nu) else float(stats.norm.ppf(0.95))
    return t * math.sqrt(var)


def profile_uncertainty(run_totals: dict[Hashable, Sequence[float]]) -> tuple[float, int]:
    """(u_p, P): the relative standard uncertainty of a cost table's level from its profile's repeated runs
    (module docstring). run_totals: per profile point, the total measured time of each of its runs (>= 2 runs
    make it count). u_p = s_1 / sqrt(n_r), s_1 the one-run relative sd from the runs' spread about each point's
    mean (pooled), n_r the runs per point (the smallest count), P the pooled degrees of freedom. (0, 0) when no
    point has two runs."""
    ss, dof, n_r = 0.0, 0, None
    for ts in run_totals.values():
        ts = [float(t) for t in ts if t > 0]
        if len(ts) < 2:
            continue
        m = sum(ts) / len(ts)
        ss += sum((t / m - 1.0) ** 2 for t in ts)
        dof += len(ts) - 1
        n_r = len(ts) if n_r is None else min(n_r, len(ts))
    if not dof:
        return 0.0, 0
    return math.sqrt(ss / dof) / math.sqrt(n_r), dof


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
    pred_sd: float = 0.0   # u_p, the prediction's relative standard uncertainty (its profile's repeats)
    band_real: float = math.inf  # the repeats' band alone (u_p = 0); inf with one repeat
    drifted: bool = False  # the machine's speed moved from the profile's by more than the margin (speed probes)

    def to_json(self) -> dict:
        d = asdict(self)
        for k in ("band", "band_real"):
            d[k] = None if math.isinf(d[k]) else d[k]  # JSON has no inf
        return d

    @classmethod
    def from_json(cls, d: dict) -> "CellVerdict":
        inf = {k: math.inf for k in ("band", "band_real") if d.get(k) is None}
        return cls(**{**d, **inf})


def judge(xs: Sequence[float], predicted: float, margin: float = DEFAULT_MARGIN, loaded: bool = False,
          table_loaded: bool = False, pred_sd: float = 0.0, pred_df: float = math.inf,
          pooled: tuple[float, int] | None = None, drifted: bool = False) -> CellVerdict:
    """The verdict of one cell: repeats xs of the real throughput against the simulator's `predicted` one, whose
    relative standard uncertainty is pred_sd (pred_df degrees of freedom; profile_uncertainty); pooled: the run's
    pooled repeat scatter (pooled_scatter over the trace's cells), None: the cell's own.
    table_loaded: the cost table behind the prediction was itself profiled under load, so the prediction
    carries that load's contention and no verdict but inconclusive is honest. drifted: the speed probes say the
    machine's speed moved from the profile's by more than the margin (module docstring): cannot disagree."""
    if not xs:
        raise ValueError("a cell needs at least one measurement")
    if not margin > 0:
        raise ValueError(f"margin must be > 0, got {margin}")
    if not (pred_sd >= 0 and math.isfinite(pred_sd)):
        raise ValueError(f"pred_sd must be a finite number >= 0, got {pred_sd}")
    srt = sorted(float(x) for x in xs)
    n = len(srt)
    med = statistics.median(srt)
    band = noise_band(srt, pred_sd, pred_df, pooled)
    err = predicted / med - 1.0 if med > 0 else math.inf
    ae = abs(err)
    if ae - band > margin:
        verdict, reason = "disagrees", f"|error| {100 * ae:.1f}% beyond margin {100 * margin:.0f}% + band {100 * band:.1f}%"
    elif band > margin:
        verdict, reason = "inconclusive", (f"noise band {100 * band:.1f}% wider than margin {100 * margin:.0f}%"
                                           if math.isfinite(band) else "one repeat: noise unknown")
    elif ae <= margin:
        verdict, reason = "agrees", f"|error| {100 * ae:.1f}% within margin {100 * margin:.0f}%"
    else:
        verdict, reason = "inconclusive", (f"|error| {100 * ae:.1f}% outside margin {100 * margin:.0f}% but within "
                                           f"margin + band {100 * band:.1f}%: not rejected at the 5% level")
    if loaded and verdict == "disagrees":
        verdict, reason = "inconclusive", "measured under load: " + reason
    if drifted and verdict == "disagrees":
        verdict, reason = "inconclusive", "machine speed moved from the profile's: " + reason
    if table_loaded:
        verdict, reason = "inconclusive", "cost table profiled under load: " + reason
    return CellVerdict(n, med, srt[0], srt[-1], (srt[-1] - srt[0]) / med if med > 0 else math.inf, band, float(predicted),
                       err, margin, loaded, verdict, reason, float(pred_sd), noise_band(srt), bool(drifted))


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
    drifted: int = 0       # cells whose machine speed moved from the profile's by more than the margin

    def to_json(self) -> dict:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}

    def line(self) -> str:
        err = (f"median |error| {100 * self.median_error:.1f}%, max {100 * self.max_error:.1f}% over the "
               f"{self.agrees + self.disagrees} conclusive cells" if self.agrees + self.disagrees else
               "no conclusive cell")
        load = f"; {self.loaded} measured under load" if self.loaded else ""
        load += f"; {self.drifted} at a machine speed off the profile's" if self.drifted else ""
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
                      med, mx, verdict, sum(v.drifted for v in vs))
