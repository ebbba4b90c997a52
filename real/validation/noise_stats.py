"""How still a machine's speed holds, from a series of speed probes, and what that allows a fidelity verdict.

real/validation/machine_noise.py times the speed probe (real.validation.profile.speed_probe) back to back for a few minutes; these pure
functions turn the series into the figures a validation run would meet there, using the verdict math of
real/validation/fidelity_stats.py unchanged (its noise_band). No timing here.

The math. A probe p_i ends at t_i seconds (i = 0..n); its time per fixed shape is in ms.
    y_i        log ratio(p_i, G), G = reference_probe(p_0..p_n) the series' per-shape geometric mean, so
               y_i is the log of the machine's slowness at probe i against its mean (> 0: slower;
               dimensionless, ~ relative for small values).
    spread     median_i |y_i|, and exp of the 5th and 95th percentiles of y: the range of speeds, as ratios
               to the geometric mean, the machine ran at.
    Delta      (t_n - t_0) / n: seconds from one probe's end to the next's.
    lag        a span of L seconds is k(L) = max(1, round(L / Delta)) probe steps; a run lasting L seconds that
               is bracketed by a probe before and after it (real/validation/validate.py's cells, real/validation/profile.py's runs)
               has its brackets k_run(L) = max(2, round(L / Delta) + 1) steps apart, the probes between them
               covering the run's own time.
    drift      d_i(k) = y_{i+k} - y_i: how far the speed moves over k steps; reported as the median and 95th
               percentile of |d| (exp(|d|) - 1, relative), between the two probes around one profile run and
               around one cell repeat (k_run), and at a minute, two, and the series' span (k(L): the profile
               and the cells it predicts lie minutes apart; re-anchoring removes that drift as well as the
               probes measure it).
    residual   e_i(k) = mean(y_{i+1} .. y_{i+k-1}) - (y_i + y_{i+k}) / 2: how far the speed a run saw (the
               probes taken inside its span) is from the mean of its two brackets, the speed re-anchoring
               credits it with (fidelity_stats, re-anchoring: q = sqrt(ratio(before) ratio(after))). Its
               RMS over every window, s(k) = sqrt(mean_i e_i(k)^2), is the relative sd one re-anchored run
               keeps from the machine alone; conservative by the inner mean's own probe noise
               (sigma_probe^2 / (k - 1)). A grid's cells at several batch sizes (several lengths L_b) pool:
               s^2 = mean_b s(k_run(L_b))^2.
    band       for a run of N repeats per cell and R runs per profile point over C cells per trace
               (policies x batch sizes; the profile has one point per cell), fidelity_stats.noise_band with
               the cell scatter s_r = s(cell repeats) pooled over C (N - 1) degrees of freedom and the
               prediction's u_p = s_p / sqrt(R), s_p = s(profile runs), with C (R - 1):
                   b = t_{0.95, nu} sqrt(s_r^2 / N + s_p^2 / R),  nu Welch-Satterthwaite.
               A cell can agree only when b <= M (the margin), so b is the smallest margin the run can resolve;
               as N grows b falls to t s_p / sqrt(R), the profile's floor, which only more profile runs lower.
    drift mark a repeat whose brackets differ by |d| / 2 > M is what the verdict marks as drifted
               (fidelity_stats.within_drift); with p the fraction of cell-repeat windows above, a cell (the
               median over its N repeats) is marked with P = sum_{j > N/2} C(N, j) p^j (1 - p)^(N - j)
               (independent repeats).
What it leaves out: the engine's own run-to-run scatter on a machine whose speed holds still (the runs are
deterministic; small, not zero), so b is a lower bound on the band a run there would see, and the repeats it
asks for a lower bound too; and any change of the machine after the minutes measured.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from real.validation.fidelity_stats import noise_band, probe_ratio, reference_probe

MAX_CELL_REPEATS = 30    # the most repeats per cell the search for a resolving run considers
MAX_PROFILE_REPEATS = 12  # likewise, runs per profile point


def log_speeds(probes: Sequence[dict]) -> list[float]:
    """y_i: each probe's log ratio to the series' per-shape geometric mean (module docstring; > 0: slower).
    ValueError when a probe shares no shape with the others."""
    ref = reference_probe(probes)
    ys = []
    for i, p in enumerate(probes):
        r = probe_ratio(p, ref)
        if r is None:
            raise ValueError(f"probe {i} shares no shape with the series")
        ys.append(math.log(r))
    return ys


def _quantile(xs: Sequence[float], q: float) -> float:
    """The q-quantile of xs, linear between order statistics (numpy's default); nan for no xs."""
    return float(np.quantile(xs, q)) if len(xs) else math.nan


@dataclass(frozen=True)
class Spread:
    """The series' speeds as ratios to its geometric mean (> 1: slower)."""
    probes: int
    median_abs: float  # median |y|, relative (exp(.) - 1)
    p05: float         # ratio at the 5th percentile
    p95: float         # ratio at the 95th percentile
    lo: float          # fastest ratio
    hi: float          # slowest ratio


def spread(ys: Sequence[float]) -> Spread:
    """The spread of y (module docstring)."""
    if not ys:
        raise ValueError("a spread needs at least one probe")
    return Spread(len(ys), math.expm1(statistics.median(abs(y) for y in ys)), math.exp(_quantile(ys, 0.05)),
                  math.exp(_quantile(ys, 0.95)), math.exp(min(ys)), math.exp(max(ys)))


def lag_steps(seconds: float, step_s: float) -> int:
    """k(L): the probe steps spanning `seconds` (>= 1)."""
    if not step_s > 0:
        raise ValueError(f"the probe interval must be > 0 s, got {step_s}")
    return max(1, round(seconds / step_s))


def bracket_steps(seconds: float, step_s: float) -> int:
    """k_run(L): the steps between the two probes bracketing a run of `seconds` (>= 2: one probe inside)."""
    return max(2, lag_steps(seconds, step_s) + 1)


@dataclass(frozen=True)
class Drift:
    """|y_{i+k} - y_i| over the series at one lag, relative (exp(.) - 1); None where the series is too short."""
    label: str
    seconds: float
    steps: int
    pairs: int
    median: float | None
    p95: float | None


def drift_at(ys: Sequence[float], k: int, label: str = "", seconds: float = math.nan) -> Drift:
    """The drift over k steps (module docstring)."""
    ds = [abs(ys[i + k] - ys[i]) for i in range(len(ys) - k)] if k >= 1 else []
    if not ds:
        return Drift(label, seconds, k, 0, None, None)
    return Drift(label, seconds, k, len(ds), math.expm1(statistics.median(ds)), math.expm1(_quantile(ds, 0.95)))


def bracket_residual(ys: Sequence[float], k: int) -> tuple[float | None, int]:
    """(s(k), windows): the RMS of e_i(k), the gap between the speed inside a k-step window and the mean of its
    two ends (module docstring); (None, 0) when the series is shorter than one window. k >= 2."""
    if k < 2:
        raise ValueError(f"a bracket needs at least one probe inside, k >= 2, got {k}")
    es = []
    for i in range(len(ys) - k):
        inner = ys[i + 1:i + k]
        es.append(sum(inner) / len(inner) - (ys[i] + ys[i + k]) / 2.0)
    if not es:
        return None, 0
    return math.sqrt(sum(e * e for e in es) / len(es)), len(es)


def pooled_residual(ys: Sequence[float], seconds: Sequence[float], step_s: float) -> tuple[float | None, int]:
    """(s, windows): s^2 the mean of s(k_run(L))^2 over the run lengths L in `seconds` (a grid's batch sizes),
    windows the fewest any length had; (None, 0) when the series is shorter than the longest run's window."""
    got = [bracket_residual(ys, bracket_steps(L, step_s)) for L in seconds]
    if not got or any(s is None for s, _ in got):
        return None, 0
    return math.sqrt(sum(s * s for s, _ in got) / len(got)), min(n for _, n in got)


def drift_mark_probability(ys: Sequence[float], k: int, margin: float, repeats: int) -> float | None:
    """P that a cell of `repeats` repeats, each bracketed k steps apart, is marked drifted at `margin`
    (module docstring); None when the series is shorter than k + 1."""
    hs = [abs(ys[i + k] - ys[i]) / 2.0 for i in range(len(ys) - k)]
    if not hs:
        return None
    p = sum(h > margin for h in hs) / len(hs)
    return sum(math.comb(repeats, j) * p ** j * (1.0 - p) ** (repeats - j) for j in range(repeats // 2 + 1, repeats + 1))


def run_band(s_cell: float, s_profile: float, repeats: int, profile_repeats: int, cells: int,
             anchor_sd: float = 0.0, anchor_df: float = math.inf) -> float:
    """b: the noise band of a run with `repeats` per cell and `profile_repeats` per profile point, over `cells`
    cells per trace, on a machine whose re-anchored runs scatter by s_cell (a cell repeat) and s_profile (a
    profile run), relative sds: fidelity_stats.noise_band, exactly as a run's cells are judged (module docstring).
    anchor_sd, anchor_df: u_a of a table fitted before probes were interleaved (fidelity_stats; 0 otherwise)."""
    if repeats < 2 or profile_repeats < 2 or cells < 1:
        raise ValueError(f"a band needs >= 2 repeats, >= 2 profile runs and a cell, got {repeats}, "
                         f"{profile_repeats}, {cells}")
    up = s_profile / math.sqrt(profile_repeats)
    return noise_band([1.0] * repeats, up, cells * (profile_repeats - 1), (s_cell, cells * (repeats - 1)),
                      anchor_sd, anchor_df)


@dataclass(frozen=True)
class Resolution:
    """What a run needs here to resolve `margin`: the band of the default run, and the fewest repeats that bring
    the band to the margin (None: not within MAX_CELL_REPEATS / MAX_PROFILE_REPEATS)."""
    margin: float
    band_default: float        # b with the default repeats
    floor: float               # b's limit with MAX_CELL_REPEATS per cell at the default profile repeats
    repeats: int | None        # fewest repeats per cell at the default profile repeats, None if none
    profile_repeats: int | None  # when repeats alone cannot: the pair (repeats, profile_repeats) with the least cost
    pair_repeats: int | None
    verdict: str               # "resolvable", "needs repeats", "needs profile repeats", "cannot be resolved"

    def to_json(self) -> dict:
        return asdict(self)


def resolve(s_cell: float, s_profile: float, margin: float, cells: int, repeats: int = 3,
            profile_repeats: int = 2, cost=lambda n, r: n + r, anchor_sd: float = 0.0,
            anchor_df: float = math.inf) -> Resolution:
    """The smallest margin the default run resolves here (its band) and what it would take to resolve `margin`
    (module docstring): the fewest cell repeats at the default profile repeats, else the (cell, profile) repeats
    pair of least cost(n, r) (a run's minutes; default n + r) within the search limits. anchor_sd, anchor_df: the
    u_a of the table the band `band_default` describes (a recorded run's, fidelity_stats); the search assumes a
    table profiled with interleaved probes, as real/validation/profile.py makes now (u_a = 0)."""
    if not margin > 0:
        raise ValueError(f"margin must be > 0, got {margin}")
    b0 = run_band(s_cell, s_profile, repeats, profile_repeats, cells, anchor_sd, anchor_df)
    floor = run_band(s_cell, s_profile, MAX_CELL_REPEATS, profile_repeats, cells)
    if b0 <= margin:
        return Resolution(margin, b0, floor, repeats, None, None, "resolvable")
    n = next((n for n in range(repeats, MAX_CELL_REPEATS + 1)
              if run_band(s_cell, s_profile, n, profile_repeats, cells) <= margin), None)
    if n is not None:
        return Resolution(margin, b0, floor, n, None, None, "needs repeats")
    pairs = [(cost(n, r), n, r) for r in range(profile_repeats + 1, MAX_PROFILE_REPEATS + 1)
             for n in range(repeats, MAX_CELL_REPEATS + 1) if run_band(s_cell, s_profile, n, r, cells) <= margin]
    if pairs:
        _, n, r = min(pairs)
        return Resolution(margin, b0, floor, None, r, n, "needs profile repeats")
    return Resolution(margin, b0, floor, None, None, None, "cannot be resolved")
