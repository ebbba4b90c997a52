"""The machine-noise preflight: its statistics on synthetic probe series (real/validation/noise_stats.py: a steady machine
resolves a 3% margin, a drifting one does not; a linear drift is what re-anchoring removes), the CLI end to end on
the 2-layer test model for a few seconds, its bad input, and validate's pointer to it."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from scipy import stats

from real.validation import noise_stats as ns
from tests.conftest import run_cli_inprocess

ROOT = Path(__file__).resolve().parents[1]


def _probes(ys):
    """Probe dicts whose every shape is slowed by exp(y) (the speed_probe format)."""
    return [{"1x1": 10.0 * math.exp(y), "1x8": 25.0 * math.exp(y), "4x2": 40.0 * math.exp(y), "context": 256,
             "repeat": 3} for y in ys]


def _series(ys, step=1.5):
    return [{"t": step * (i + 1), "probe": p, "load": {}} for i, p in enumerate(_probes(ys))]


def _steady(n=200, sd=0.004, seed=0):
    rng = random.Random(seed)
    return [rng.gauss(0.0, sd) for _ in range(n)]


def _drifting(n=200, step_sd=0.04, seed=0):
    rng = random.Random(seed)
    y, out = 0.0, []
    for _ in range(n):
        y += rng.gauss(0.0, step_sd)  # a random walk: the speed wanders, as an outside tenant comes and goes
        out.append(y)
    return out


def test_log_speeds_and_spread_are_against_the_geometric_mean():
    ys = ns.log_speeds(_probes([0.1, -0.1, 0.0]))
    assert ys == pytest.approx([0.1, -0.1, 0.0])
    sp = ns.spread(ys)
    assert sp.median_abs == pytest.approx(math.expm1(0.1)) and sp.lo == pytest.approx(math.exp(-0.1))
    assert sp.p05 < 1.0 < sp.p95
    with pytest.raises(ValueError):
        ns.log_speeds([{"1x1": 1.0}, {"context": 256}])  # a probe that timed nothing


def test_linear_drift_moves_the_speed_but_leaves_no_residual():
    """Re-anchoring credits a run with its brackets' mean: exact for a linear drift, so the residual is 0 and the
    band too, although the speed moves 1% per probe."""
    ys = [0.01 * i for i in range(60)]
    assert ns.drift_at(ys, 10).median == pytest.approx(math.expm1(0.1))
    s, n = ns.bracket_residual(ys, 8)
    assert s == pytest.approx(0.0, abs=1e-12) and n == 52
    assert ns.resolve(0.0, 0.0, 0.03, 15).verdict == "resolvable"


def test_steady_series_gives_a_small_band_and_a_drifting_one_a_large_band():
    from real.validation.machine_noise import analyse

    out = {}
    for name, ys in (("steady", _steady()), ("drifting", _drifting())):
        out[name] = a = analyse(_series(ys), 0.03, 3, [12.0, 18.0], [6.0], 15)
        assert a["probes"] == 200 and a["probe_interval_s"] == pytest.approx(1.5)
        assert a["resolution"] is not None
    st, dr = out["steady"], out["drifting"]
    assert st["residual"]["cell"] < 0.01 and st["spread"]["median_abs"] < 0.01
    assert st["resolution"]["band_default"] < 0.03 and st["resolution"]["verdict"] == "resolvable"
    assert st["drift_mark_probability"] < 0.01
    assert dr["residual"]["cell"] > 0.03 and dr["resolution"]["band_default"] > 0.05
    assert dr["resolution"]["verdict"] in ("needs profile repeats", "cannot be resolved")
    assert dr["drift_mark_probability"] > 0.3
    # the drift grows with the lag on the random walk, not on the steady series
    d = {x["label"]: x["median"] for x in dr["drift"]}
    assert d["1 minute"] > d["around a cell repeat"] > d["next probe"]
    assert "5 minutes" not in d and d["the series' span"] > d["2 minutes"]  # 300 s: beyond the 298 s series


def test_run_band_is_the_verdicts_noise_band():
    s_r, s_p, n, r, c = 0.05, 0.04, 3, 2, 15
    ur2, up2 = s_r ** 2 / n, s_p ** 2 / r
    nu = (ur2 + up2) ** 2 / (ur2 ** 2 / (c * (n - 1)) + up2 ** 2 / (c * (r - 1)))  # Welch-Satterthwaite
    assert ns.run_band(s_r, s_p, n, r, c) == pytest.approx(stats.t.ppf(0.95, nu) * math.sqrt(ur2 + up2), rel=1e-9)
    assert ns.run_band(s_r, s_p, 10, r, c) < ns.run_band(s_r, s_p, 3, r, c)
    with pytest.raises(ValueError):
        ns.run_band(s_r, s_p, 1, r, c)


def test_resolve_names_what_a_margin_needs():
    assert ns.resolve(0.01, 0.005, 0.03, 15).verdict == "resolvable"
    r = ns.resolve(0.06, 0.005, 0.03, 15)  # cell noise only: more repeats per cell
    assert r.verdict == "needs repeats" and r.repeats > 3
    assert ns.run_band(0.06, 0.005, r.repeats, 2, 15) <= 0.03 < ns.run_band(0.06, 0.005, r.repeats - 1, 2, 15)
    p = ns.resolve(0.02, 0.04, 0.03, 15)  # the profile's floor t s_p / sqrt(2) > 3%: more profile runs too
    assert p.verdict == "needs profile repeats" and p.profile_repeats > 2 and p.floor > 0.03
    assert ns.resolve(0.3, 0.3, 0.03, 15).verdict == "cannot be resolved"
    with pytest.raises(ValueError):
        ns.resolve(0.01, 0.01, 0.0, 15)


def test_drift_mark_probability():
    alt = [0.1 if i % 2 else -0.1 for i in range(40)]
    assert ns.drift_mark_probability(alt, 2, 0.03, 3) == 0.0   # brackets two steps apart: equal
    assert ns.drift_mark_probability(alt, 3, 0.03, 3) == 1.0   # odd: 20% apart, half of it above 3%
    assert ns.drift_mark_probability(alt, 99, 0.03, 3) is None
    ys = [0.0] * 10 + [0.2] + [0.0] * 9  # p = 2 / 19 of the windows jump
    p = 2 / 19
    assert ns.drift_mark_probability(ys, 1, 0.03, 3) == pytest.approx(3 * p * p * (1 - p) + p ** 3)


def test_short_series_reports_not_measured():
    from real.validation.machine_noise import analyse, conclusion

    a = analyse(_series(_steady(n=4)), 0.03, 3, [30.0], [10.0], 15)
    assert a["resolution"] is None and a["residual"]["cell"] is None
    assert "not measured" in conclusion(None, 0.03, 3)


def test_cli_on_the_test_model(tmp_path):
    out = tmp_path / "noise.json"
    argv = ["--model", "qwen3-tiny", "--random-weights", "--minutes", "0.02", "--cell-seconds", "0.05",
            "--profile-run-seconds", "0.05", "--out", str(out)]
    r = run_cli_inprocess("real.validation.machine_noise", *argv, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("machine-noise preflight: python -m real.machine_noise")
    assert "=> with this noise" in r.stdout and "load:" in r.stdout and "noise band of" in r.stdout
    rec = json.loads(out.read_text())
    assert len(rec["series"]) >= 3 and all(s["ratio"] > 0 and "others_cores" in s["load"] for s in rec["series"])
    assert rec["analysis"]["resolution"]["verdict"] in ("resolvable", "needs repeats", "needs profile repeats",
                                                        "cannot be resolved")
    assert rec["conclusion"].startswith("=>")
    r2 = run_cli_inprocess("real.validation.machine_noise", *argv, cwd=ROOT)  # never overwrites by default
    assert r2.returncode == 2 and "already exists" in r2.stderr and len(r2.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("argv,msg", [
    (["--minutes", "-1"], "--minutes"),
    (["--minutes", "0"], "--minutes"),
    (["--margin", "abc"], "--margin"),
    (["--repeats", "1"], "--repeats"),
    (["--grid", "huge"], "--grid"),
    (["--model", "smollm2-135m", "--cell-seconds", "nan"], "--cell-seconds"),
])
def test_bad_input_is_one_line(argv, msg):
    r = run_cli_inprocess("real.validation.machine_noise", *argv, cwd=ROOT)
    assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_validate_points_to_the_preflight_when_mostly_inconclusive():
    from real.validation.validate import PREFLIGHT_COMMAND, verdict_lines

    ver = {"cells": 4, "agrees": 0, "disagrees": 1, "inconclusive": 3, "loaded": 0, "median_error": 0.1,
           "max_error": 0.1, "verdict": "inconclusive"}
    lines = verdict_lines({"verdicts": ver}, quick=False)
    assert len(lines) == 2 and PREFLIGHT_COMMAND in lines[1]
    assert len(verdict_lines({"verdicts": ver}, quick=True)) == 1  # --quick checks the pipeline only
    assert len(verdict_lines({"verdicts": dict(ver, inconclusive=1, agrees=2, verdict="disagrees")}, False)) == 1
    assert verdict_lines({}, False) == []


def test_from_run_reproduces_the_bands_the_cells_were_judged_with(tmp_path, monkeypatch):
    """--from-run on a run recorded by validate's own loop (tests/test_validate_report.py's fake engines, the
    machine's speed moving between repeats): the band it computes from the run's pooled scatter and profile is the
    band the cells' verdicts used."""
    import real.validation.profile as P
    from real.validation.machine_noise import recorded_noise
    from tests.test_validate_report import _record_run

    s1 = 0.02
    monkeypatch.setattr(P, "profile_uncertainty_of",
                        lambda table, one_run=False: (s1 if one_run else s1 / math.sqrt(2), 2))
    run = tmp_path / "run"
    cells = _record_run(run, monkeypatch)
    rec = recorded_noise(run, 0.03, 3)
    t = rec["traces"]["traces/chat.jsonl"]
    assert rec["profile_run_sd"] == s1 and t["repeat_dof"] == 4
    assert t["resolution"]["band_default"] == pytest.approx(cells[0]["verdict"]["band"], rel=1e-9)
    r = run_cli_inprocess("real.validation.machine_noise", "--from-run", str(run), cwd=ROOT)
    assert r.returncode == 0 and "band with 3 repeats per cell, as its cells are judged" in r.stdout and "=> with this noise" in r.stdout
    r = run_cli_inprocess("real.validation.machine_noise", "--from-run", str(tmp_path / "none"), cwd=ROOT)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
