"""ITL statistics of huge runs come from (gap, count) pairs instead of ~10^8 materialised samples
(sim.core.metrics._itl_stats_ms): the same median and p99 (order statistics, linear interpolation), the same mean
and std up to rounding, as the sample-array path on random step timelines."""
from types import SimpleNamespace

import numpy as np
import pytest

import sim.core.metrics as metrics


def _res(rng):
    S, n = int(rng.integers(2, 300)), int(rng.integers(1, 150))
    step = rng.exponential(20.0, S)
    t0 = np.concatenate([[0.0], np.cumsum(step)[:-1]])
    ends = (t0 + step) / 1000.0
    a = rng.integers(0, S, n)
    b = np.minimum(S - 1, a + rng.integers(0, S, n))
    first = np.where(rng.random(n) < 0.1, np.nan, ends[a])  # some requests never started: excluded
    return SimpleNamespace(steps={"t_start_ms": t0, "step_ms": step}, requests={"first_token_s": first, "finish_s": ends[b]})


@pytest.mark.parametrize("seed", range(5))
def test_counted_itl_stats_equal_the_sample_array(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    for _ in range(8):
        res = _res(rng)
        want = metrics._stats_ms("itl", metrics.itl_samples_s(res))
        monkeypatch.setattr(metrics, "ITL_SAMPLES_MAX", 0)
        got = metrics._itl_stats_ms(res)
        monkeypatch.undo()
        assert sorted(got) == sorted(want)
        for k in want:
            assert got[k] == pytest.approx(want[k], rel=1e-12, abs=1e-12), k
