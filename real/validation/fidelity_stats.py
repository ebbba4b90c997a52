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
               reports/fidelity-verdicts-run3/4.md in git history). Pooling assumes the relative noise is alike across cells,
               and the F test keeps a cell that breaks that on its own. A cell measured under load stays out
               of the pool (another population) and is judged on its own scatter.
    u_p        the prediction's own relative standard uncertainty: the cost table is fitted on profile runs that
               are noisy too. real/validation/profile.py repeats every profile point (ABBA, default 2 runs); two runs of
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
                  then flipped between agrees and disagrees from run to run: git history's reports/fidelity-verdicts-run3/4.md,
                  ngram-fixed:32 at batch 1, 0.0% then 4.0% with a 1.3% band.)
A cell measured under load (real/validation/machine_load.py: other processes took cores the engine needed) keeps its
figures but cannot disagree: a large error under load is reported as "inconclusive (load)", since the load
alone can explain it. When the cost table itself was profiled under load, every cell is inconclusive: the
prediction then carries the profile's contention, whatever the real runs saw.
What the band leaves out: a drift of the machine's speed between the profile and the cells (real/validation/validate.py's
speed probe measures it; it is reported beside the verdict, not in it: one probe's own scatter, 2-6% here, is
larger than the drifts it would correct). But a cell whose probes (the median over its repeats, each run right
after a repeat) say the machine ran the profile's fixed forwards more than the margin slower or faster is
marked *drifted* and, like a loaded cell, cannot disagree: the prediction was priced at another machine speed,
so an error beyond the margin cannot be put on the simulator. This catches load the guard cannot see (another
tenant of the host: two quiet default-grid runs here, others 0.01 cores, saw the same forwards take 1.13-1.25x
the profile's time in one of them). The mark only ever turns "disagrees" into "inconclusive", so a probe's own
scatter can cost conclusiveness but never makes a verdict wrong.
Re-anchoring (interleaved speed probes; real/validation/profile.py and real/validation/validate.py). The drift above was the dominant
error of two quiet default-grid runs (the same fixed forwards 10-25% slower within minutes, the cells' errors
following them), so the machine's speed is measured beside every timed run and the comparison is made at one
speed. A probe p is the median ms of a few fixed forwards per shape (real.validation.profile.speed_probe); two probes compare
by their geometric mean ratio over the shapes both timed, ratio(p, P) = exp(mean_k log(p_k / P_k)) (> 1: slower).
    profile    a probe after the warm-up and after every profile run (ABBA order), p_0 .. p_n. The reference P is
               their per-shape geometric mean (reference_probe); run k is bracketed by p_{k-1} and p_k and ran at
               speed q_k = sqrt(ratio(p_{k-1}, P) ratio(p_k, P)) (bracket_speed); its step times are divided by
               q_k before the table is fitted, so the table prices the machine at speed P, not at whatever mean
               speed the profile happened to see (a profile whose last runs took 1.10-1.16x its first ones' time
               was fitted on a mixture before). The microbenchmarks are bracketed likewise.
    cell       every repeat r is bracketed by a probe before and after it (the one after a repeat is the one
               before the next), q_r = bracket_speed(before_r, after_r, P), and measured x_r tok/s. Its
               throughput at the reference speed is x'_r = x_r q_r (a run q_r times slower than at P produces
               tokens q_r times slower), so the error of repeat r against the prediction re-anchored to that
               moment, pred / q_r, is pred / (q_r x_r) - 1 = pred / x'_r - 1. The verdict above is applied to
               x'_1..x'_N (median, pooled scatter, band) in place of x: the probes' own noise is then inside the
               repeats' scatter u_r, and the profile's inside u_p (its runs' totals are the anchored ones).
    u_a        the reference's own uncertainty: 0 when the table was anchored (P cancels: the table and the cells
               are both expressed at speed P, so a different P scales both alike). A table fitted before probes
               were interleaved has one probe at the profile's end as its P, which need not be the speed its runs
               had; its uncertainty is taken as one probe's relative sd, s_1 = sqrt(mean_i d_i^2 / 2) over the
               repeats' bracket pairs d_i = log(after_i / before_i) (probe_pair_scatter; the pairs' real drift
               counted as noise, so conservative), with P degrees of freedom, and enters the band as a third
               independent variance: b = t_{0.95, nu} sqrt(u_r^2 + u_p^2 + u_a^2), nu by Welch-Satterthwaite over
               the three (nu = var^2 / sum_i u_i^4 / nu_i).
    drift mark what re-anchoring cannot explain: the machine's speed moving within a repeat. The bracket's mean is
               the speed of a linear drift; a repeat whose two probes differ by w_r = after / before is pinned to
               about |log w_r| / 2. A cell whose median over repeats of |log w_r| / 2 exceeds the margin is marked
               drifted and cannot disagree (as above). Without probes before the repeats (older recordings) the
               mark is the earlier one: the median ratio to the profile's probe off 1 by more than the margin.
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
PROBE_REPEAT = 3  # forwards per shape of a speed probe interleaved with the profile's runs and the cells' repeats
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
               pooled: tuple[float, int] | None = None, anchor_sd: float = 0.0, anchor_df: float = math.inf) -> float:
    """b: relative half-width of the two-sided 90% t interval of the error against a prediction whose relative
    standard uncertainty is pred_sd with pred_df degrees of freedom (module docstring; pred_sd = 0 and no pooled
    scatter: the interval of the mean of xs). pooled: (s_pool, dof) of the run's cells (pooled_scatter). anchor_sd,
    anchor_df: u_a, the speed reference's own uncertainty (re-anchoring, module docstring). inf when the noise is
    unknown (one repeat and nothing pooled) or the mean is not positive."""
    n = len(xs)
    if not n or not sum(xs) > 0:
        return math.inf
    s, nu_r = cell_scatter(xs, pooled)
    if not nu_r:
        return math.inf
    ur2, up2, ua2 = s * s / n, max(float(pred_sd), 0.0) ** 2, max(float(anchor_sd), 0.0) ** 2
    var = ur2 + up2 + ua2
    if var == 0.0:
        return 0.0
    denom = ur2 * ur2 / nu_r + sum(u * u / df for u, df in ((up2, pred_df), (ua2, anchor_df))
                                   if u and math.isfinite(df))  # Welch-Satterthwaite over the three variances
    nu = var * var / denom if denom > 0 else math.inf
    t = float(stats.t.ppf(0.95, nu)) if math.isfinite(nu) else float(stats.norm.ppf(0.95))
    return t * math.sqrt(var)


def legacy_reference_sd(probe: tuple[float, int], profile_run: tuple[float, int]) -> tuple[float, float]:
    """(u_a, dof) of a reference that is one probe taken after a profile fitted without interleaved probes: the
    probe's own noise (probe_pair_scatter) and the distance of that moment's speed from the mean speed the table
    was fitted at, whose sd is one profile run's relative sd s_1 (profile_uncertainty's, before dividing by the
    runs per point), combined as independent variances with Welch-Satterthwaite degrees of freedom."""
    (sp, dp), (sr, dr) = probe, profile_run
    var = sp * sp + sr * sr
    den = sum(s ** 4 / d for s, d in ((sp, dp), (sr, dr)) if s and d)
    return math.sqrt(var), (var * var / den if den else math.inf)


def profile_uncertainty(run_totals: dict[Hashable, Sequence[float]], one_run: bool = False) -> tuple[float, int]:
    """(u_p, P): the relative standard uncertainty of a cost table's level from its profile's repeated runs
    (module docstring). run_totals: per profile point, the total measured time of each of its runs (>= 2 runs
    make it count). u_p = s_1 / sqrt(n_r), s_1 the one-run relative sd from the runs' spread about each point's
    mean (pooled), n_r the runs per point (the smallest count), P the pooled degrees of freedom. (0, 0) when no
    point has two runs. one_run: s_1 itself (legacy_reference_sd)."""
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
    return math.sqrt(ss / dof) / (1.0 if one_run else math.sqrt(n_r)), dof


def is_shape(key: str) -> bool:
    """A probe's timed shape key, "<R>x<q>" (not its "context" or "repeat" entries)."""
    r, sep, q = str(key).partition("x")
    return bool(sep) and r.isdigit() and q.isdigit()


def probe_ratio(probe: dict, reference: dict) -> float | None:
    """ratio(p, P): the geometric mean over the shapes both probes timed (keys "<R>x<q>") of p / P (> 1: slower
    than the reference); None when they share no shape."""
    ks = [k for k in probe if is_shape(k) and k in reference and reference[k] > 0 and probe[k] > 0]
    if not ks:
        return None
    return math.exp(sum(math.log(probe[k] / reference[k]) for k in ks) / len(ks))


def reference_probe(probes: Sequence[dict]) -> dict:
    """P: the per-shape geometric mean of the probes' times (each shape over the probes that timed it); the other
    keys (context, repeat) from the first probe. ValueError without a probe."""
    if not probes:
        raise ValueError("a reference needs at least one probe")
    shapes = sorted({k for p in probes for k in p if is_shape(k)})
    ref = {k: v for k, v in probes[0].items() if not is_shape(k)}
    for k in shapes:
        vs = [p[k] for p in probes if k in p and p[k] > 0]
        if vs:
            ref[k] = math.exp(sum(math.log(v) for v in vs) / len(vs))
    return ref


def bracket_speed(before: dict, after: dict, reference: dict) -> float | None:
    """q: the speed of a run bracketed by two probes, relative to the reference (> 1: slower), the geometric mean
    of the two probes' ratios: the mean speed of a linear drift between them. None when a probe shares no shape
    with the reference."""
    a, b = probe_ratio(before, reference), probe_ratio(after, reference)
    return None if a is None or b is None else math.sqrt(a * b)


def probe_pair_scatter(pairs: Iterable[tuple[dict, dict]]) -> tuple[float, int]:
    """(s_1, P): one probe's relative sd from pairs of probes taken around one run each (module docstring,
    u_a): s_1 = sqrt(mean(d_i^2) / 2), d_i = log ratio(after_i, before_i), P the pairs that compare. (0, 0) when
    none compares."""
    ds = [math.log(r) for r in (probe_ratio(a, b) for b, a in pairs) if r]
    if not ds:
        return 0.0, 0
    return math.sqrt(sum(d * d for d in ds) / len(ds) / 2.0), len(ds)


def within_drift(pairs: Iterable[tuple[dict, dict]]) -> float | None:
    """The median over runs of |log(after / before)| / 2: how far a run's speed may be from its bracket's mean
    (module docstring, drift mark); None when no pair compares."""
    hs = [abs(math.log(r)) / 2.0 for r in (probe_ratio(a, b) for b, a in pairs) if r]
    return statistics.median(hs) if hs else None


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
    anchored: bool = False  # the repeats were re-anchored to the reference speed (real is then the x' median)
    speed: float = 1.0     # median q over the repeats (anchored; > 1: the machine ran slower than the reference)
    anchor_sd: float = 0.0  # u_a, the speed reference's relative standard uncertainty

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
          pooled: tuple[float, int] | None = None, drifted: bool = False, speeds: Sequence[float] | None = None,
          anchor_sd: float = 0.0, anchor_df: float = math.inf) -> CellVerdict:
    """The verdict of one cell: repeats xs of the real throughput against the simulator's `predicted` one, whose
    relative standard uncertainty is pred_sd (pred_df degrees of freedom; profile_uncertainty); pooled: the run's
    pooled repeat scatter (pooled_scatter over the trace's cells), None: the cell's own.
    table_loaded: the cost table behind the prediction was itself profiled under load, so the prediction
    carries that load's contention and no verdict but inconclusive is honest. drifted: the speed probes say the
    machine's speed moved from the profile's by more than the margin (module docstring): cannot disagree.
    speeds: q_r of each repeat (re-anchoring, module docstring): the verdict is then taken on x'_r = x_r q_r, with
    the reference's uncertainty anchor_sd (anchor_df degrees of freedom) in the band."""
    if not xs:
        raise ValueError("a cell needs at least one measurement")
    if speeds is not None:
        if len(speeds) != len(xs) or not all(q > 0 and math.isfinite(q) for q in speeds):
            raise ValueError(f"speeds must be one finite q > 0 per repeat, got {list(speeds)}")
        xs = [float(x) * float(q) for x, q in zip(xs, speeds)]
    if not (anchor_sd >= 0 and math.isfinite(anchor_sd)):
        raise ValueError(f"anchor_sd must be a finite number >= 0, got {anchor_sd}")
    if not margin > 0:
        raise ValueError(f"margin must be > 0, got {margin}")
    if not (pred_sd >= 0 and math.isfinite(pred_sd)):
        raise ValueError(f"pred_sd must be a finite number >= 0, got {pred_sd}")
    srt = sorted(float(x) for x in xs)
    n = len(srt)
    med = statistics.median(srt)
    band = noise_band(srt, pred_sd, pred_df, pooled, anchor_sd, anchor_df)
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
                       err, margin, loaded, verdict, reason, float(pred_sd), noise_band(srt), bool(drifted),
                       speeds is not None, statistics.median(speeds) if speeds is not None else 1.0, float(anchor_sd))


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
    anchored: int = 0      # cells whose repeats were re-anchored to the reference speed (interleaved probes)

    def to_json(self) -> dict:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}

    def line(self) -> str:
        err = (f"median |error| {100 * self.median_error:.1f}%, max {100 * self.max_error:.1f}% over the "
               f"{self.agrees + self.disagrees} conclusive cells" if self.agrees + self.disagrees else
               "no conclusive cell")
        load = f"; {self.loaded} measured under load" if self.loaded else ""
        load += (f"; {self.drifted} with the machine's speed moving within their repeats" if self.drifted and
                 self.anchored else f"; {self.drifted} at a machine speed off the profile's" if self.drifted else "")
        load += f"; {self.anchored} re-anchored to the profile's speed" if self.anchored else ""
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
                      med, mx, verdict, sum(v.drifted for v in vs), sum(v.anchored for v in vs))
