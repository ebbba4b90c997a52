"""The fidelity method's statistics and load probe: ABBA order, noise band, verdicts, run summary, load marks."""
from __future__ import annotations

import math

import pytest

from real.validation.fidelity_stats import abba_order, judge, noise_band, summarize
from real.validation.machine_load import LoadProbe, LoadSample, between


def test_abba_order_alternates_and_balances_positions():
    order = abba_order(["A", "B", "C"], 4)
    assert [k for k, _ in order] == list("ABCCBAABCCBA")
    assert [r for _, r in order] == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    pos = {k: [i for i, (kk, _) in enumerate(order) if kk == k] for k in "ABC"}
    means = {k: sum(v) / len(v) for k, v in pos.items()}
    assert len(set(means.values())) == 1  # over an even number of rounds a linear drift falls on all alike
    with pytest.raises(ValueError):
        abba_order(["A"], 0)


def test_noise_band_t_interval():
    assert noise_band([10.0]) == math.inf
    assert noise_band([10.0, 10.0, 10.0]) == 0.0
    xs = [9.0, 10.0, 11.0]  # mean 10, sd 1, t_{.95,2} = 2.919986
    assert noise_band(xs) == pytest.approx(2.919986 / math.sqrt(3) / 10, rel=1e-5)
    assert noise_band([0.0, 0.0]) == math.inf


@pytest.mark.parametrize("xs,pred,loaded,verdict", [
    ([100.0, 100.5, 99.5], 102.0, False, "agrees"),        # band ~0.8%, error 2%
    ([100.0, 100.5, 99.5], 104.0, False, "disagrees"),     # band ~0.8%, error 4% (> 3% + 0.8%)
    ([100.0, 100.5, 99.5], 103.5, False, "inconclusive"),  # 3.5%: outside the margin, but 3.5 - 0.8 < 3: not rejected
    ([100.0, 100.1, 99.9], 103.5, False, "disagrees"),     # 3.5% with a 0.2% band: rejected
    ([90.0, 100.0, 110.0], 101.0, False, "inconclusive"),  # band ~17%: cannot resolve 3%
    ([90.0, 100.0, 110.0], 150.0, False, "disagrees"),     # 50% is beyond margin + band
    ([90.0, 100.0, 110.0], 150.0, True, "inconclusive"),   # ... but not when measured under load
    ([100.0], 100.0, False, "inconclusive"),               # one repeat: the noise is unknown
])
def test_verdicts(xs, pred, loaded, verdict):
    v = judge(xs, pred, 0.03, loaded)
    assert v.verdict == verdict, v.reason
    assert v.real == sorted(xs)[len(xs) // 2]
    assert v.error == pytest.approx(pred / v.real - 1)
    assert v.loaded is loaded
    j = v.to_json()
    assert j["band"] is None or j["band"] >= 0


def test_band_includes_the_predictions_uncertainty():
    xs = [99.0, 100.0, 101.0]
    assert noise_band(xs, 0.0) == pytest.approx(noise_band(xs))
    ur = 1.0 / math.sqrt(3) / 100.0
    up = 0.02
    nu = (ur ** 2 + up ** 2) ** 2 / (ur ** 4 / 2 + up ** 4 / 6)  # Welch-Satterthwaite
    from scipy import stats
    assert noise_band(xs, up, 6) == pytest.approx(stats.t.ppf(0.95, nu) * math.sqrt(ur ** 2 + up ** 2), rel=1e-9)
    assert noise_band([100.0, 100.0], 0.01, math.inf) == pytest.approx(1.6448536 * 0.01, rel=1e-6)  # normal limit
    assert noise_band([100.0, 100.0]) == 0.0
    # a 2.5% error agrees with a certain prediction and is inconclusive when the prediction is 2% uncertain
    assert judge([100.0, 100.1, 99.9], 102.5).verdict == "agrees"
    v = judge([100.0, 100.1, 99.9], 102.5, pred_sd=0.02, pred_df=6)
    assert v.verdict == "inconclusive" and v.band > 0.03 and v.band_real < 0.01 and v.pred_sd == 0.02
    assert type(v).from_json(v.to_json()) == v
    with pytest.raises(ValueError):
        judge([100.0, 101.0], 100.0, pred_sd=float("nan"))


def test_profile_uncertainty_pools_the_repeats():
    from real.validation.fidelity_stats import profile_uncertainty

    assert profile_uncertainty({"a": [10.0]}) == (0.0, 0)
    u, dof = profile_uncertainty({"a": [99.0, 101.0], "b": [198.0, 202.0], "c": [5.0]})
    # each pair is +-1% about its mean: s_1 = sqrt((2 * 0.01^2 * 2) / 2) = 1.414%, two runs per point
    assert dof == 2 and u == pytest.approx(math.sqrt(4 * 1e-4 / 2) / math.sqrt(2))


def test_summary_counts_and_run_verdict():
    agree = judge([100, 100.2, 99.8], 101)
    dis = judge([100, 100.2, 99.8], 110)
    inc = judge([80, 100, 120], 100)
    s = summarize([agree, agree, dis, inc])
    assert (s.cells, s.agrees, s.disagrees, s.inconclusive) == (4, 2, 1, 1)
    assert s.verdict == "disagrees"
    assert s.median_error == pytest.approx(abs(agree.error))
    assert s.max_error == pytest.approx(abs(dis.error))
    assert "1 inconclusive of 4" in s.line()
    assert summarize([agree, agree]).verdict == "agrees"
    assert summarize([agree, inc, inc]).verdict == "inconclusive"  # more than half inconclusive
    none = summarize([inc])
    assert none.verdict == "inconclusive" and math.isnan(none.median_error) and none.to_json()["median_error"] is None


def _s(wall, busy, steal, own):
    return LoadSample(wall, (busy, steal), own, (1.0, 1.0, 1.0), 2000.0)


def test_load_record_marks_others_taking_the_engines_cores():
    # 10 s, machine busy 20 core-seconds, the engine used 19.5 of them: others 0.05 cores -> quiet
    quiet = between(_s(0, 0, 0, 0), _s(10, 20, 0, 19.5), engine_threads=2, cores=2)
    assert quiet.others_cores == pytest.approx(0.05) and not quiet.loaded
    # the engine got 10 of 20 busy core-seconds: others took a core it needed -> loaded
    loaded = between(_s(0, 0, 0, 0), _s(10, 20, 0, 10), engine_threads=2, cores=2)
    assert loaded.others_cores == pytest.approx(1.0) and loaded.loaded
    # steal time counts as contention too
    stolen = between(_s(0, 0, 0, 0), _s(10, 10, 5, 10), engine_threads=2, cores=2)
    assert stolen.steal_cores == pytest.approx(0.5) and stolen.loaded
    # an engine on 1 thread of 4 cores leaves 3 free: 2 cores of others do not disturb it
    roomy = between(_s(0, 0, 0, 0), _s(10, 30, 0, 10), engine_threads=1, cores=4)
    assert not roomy.loaded
    unknown = between(LoadSample(0, None, 0, None, None), LoadSample(1, None, 1, None, None), 2, cores=2)
    assert unknown.others_cores is None and not unknown.loaded and "unknown" in unknown.note()


def test_probe_reads_this_machine():
    with LoadProbe(engine_threads=1) as p:
        sum(i * i for i in range(200_000))  # some CPU work of this process
    r = p.record
    assert r is not None and r.wall_s > 0 and r.own_cpu_s > 0
    assert r.to_json()["engine_threads"] == 1


def _fake_run(tps: float, loaded: bool = False) -> dict:
    load = {"loaded": loaded, "others_cores": 1.5 if loaded else 0.0, "steal_cores": 0.0, "engine_threads": 2,
            "cores": 2}
    return {"time_s": 1.0, "tok_per_s": tps, "steps": 3, "tokens_per_step": 2.0, "mean_latency_s": 0.5,
            "lossless": True, "violation": None, "step_ms": [10.0, 10.0, 10.0], "outputs_equal_reference": True,
            "wall_s": 1.0, "load": load, "cpu_tok_per_s": tps, "steps_csv": "a\n1\n"}


def test_measure_trace_runs_repeats_abba_caches_them_and_judges(tmp_path, monkeypatch, capsys):
    """The validation loop without a model: repeats in ABBA order, one cache file per repeat, one prediction per
    cell, the median and verdict assembled; a rerun serves every repeat from the cache."""
    import types

    import real.validation.validate as V
    from real.validation.options import ValidateOptions

    calls = []
    speeds = {("none", 1): [100.0, 101.0, 99.0], ("adaptive", 1): [200.0, 150.0, 250.0]}

    def fake_measure(wl, t_dir, table, pol, bs, guard, drafters):
        assert drafters == "dspark,ngram"
        calls.append((pol, bs))
        n = sum(1 for c in calls if c == (pol, bs)) - 1
        return dict(_fake_run(speeds[(pol, bs)][n], loaded=pol == "adaptive"), speed_probe={"1x1": 40.0 + len(calls)})

    def fake_predict(wl, t_dir, table, pol, bs, seed, drafters):
        calls.append(("predict", pol))
        pred = dict(_fake_run(101.5 if pol == "none" else 300.0), step_ms=[10.0, 10.0, 10.0])
        return {"predicted": pred, "synthetic": pred, "steps_predicted_csv": "a\n1\n", "sim_command": "python -m sim.run"}

    monkeypatch.setattr(V, "measure_real", fake_measure)
    monkeypatch.setattr(V, "predict_cell", fake_predict)
    probes = iter([{"1x1": 30.0, "1x8": 60.0}, {"1x1": 31.0, "1x8": 62.0}] * 2)
    monkeypatch.setattr(V, "speed_probe_of", lambda wl, bss, repeat=9: next(probes))
    wl = types.SimpleNamespace(trace="traces/chat.jsonl", requests=[types.SimpleNamespace(output_len=10)])
    a = ValidateOptions(load_guard=0.25, seed=0, margin=3.0, drafters="dspark,ngram")
    cells, sp, _ = V.measure_trace(wl, tmp_path, tmp_path / "t.json", ["none", "adaptive"], [1], {"k": 1}, 3, a)
    assert calls == [("none", 1), ("adaptive", 1), ("adaptive", 1), ("none", 1), ("none", 1), ("adaptive", 1),
                     ("predict", "none"), ("predict", "adaptive")]
    none, adap = cells
    assert none["real"]["tok_per_s"] == 100.0 and [r["tok_per_s"] for r in none["repeats"]] == [100.0, 101.0, 99.0]
    assert none["verdict"]["verdict"] == "agrees" and not none["loaded"]
    assert adap["loaded"] and adap["verdict"]["verdict"] == "inconclusive"  # noisy and measured under load
    assert "measured under load" in capsys.readouterr().err
    assert (tmp_path / "cells" / "chat__none__bs1" / "real.r2.json").is_file()
    # interleaved: each repeat's probe before is the trace's first probe or the previous repeat's probe after
    order = [none["repeats"][0], adap["repeats"][0], adap["repeats"][1], none["repeats"][1], none["repeats"][2],
             adap["repeats"][2]]
    assert order[0]["speed_probe_before"] == {"1x1": 30.0, "1x8": 60.0}
    assert all(b["speed_probe_before"] == a_["speed_probe"] for a_, b in zip(order, order[1:]))
    # sp: the trace's speed-probe record; no profile probe beside this table: drift only
    assert sp["vs_profile"] is None and sp["drift"] == pytest.approx((31 / 30 * 62 / 60) ** 0.5)
    calls.clear()
    again, _, _ = V.measure_trace(wl, tmp_path, tmp_path / "t.json", ["none", "adaptive"], [1], {"k": 1}, 3, a)
    assert calls == [] and [c["verdict"] for c in again] == [c["verdict"] for c in cells]
    assert capsys.readouterr().err.count("cached  ") == 6
    agg = V.write_reports(tmp_path, again, {"command": "x", "machine": {}, "model": "m", "mode": "real",
                                            "max_tokens": 8, "max_prompt": 9, "repeats": 3})
    assert agg["verdicts"]["agrees"] == 1 and agg["verdicts"]["inconclusive"] == 1
    md = (tmp_path / "fidelity.md").read_text()
    assert "| 3 (99.0-101.0) |" in md and "inconclusive (load)" in md and "verdict: AGREES (1 agree" in md


def test_a_table_profiled_under_load_makes_every_verdict_inconclusive():
    quiet = [100.0, 100.2, 99.8]
    assert judge(quiet, 101.0).verdict == "agrees"
    assert judge(quiet, 150.0).verdict == "disagrees"
    for pred in (101.0, 150.0):
        v = judge(quiet, pred, table_loaded=True)
        assert v.verdict == "inconclusive" and v.reason.startswith("cost table profiled under load")


def test_profile_load_sidecar(tmp_path):
    import json

    from real.validation.profile import profile_load

    t = tmp_path / "cost_table.json"
    assert profile_load(t) is None
    (tmp_path / "cost_table.json.load.json").write_text(json.dumps({"loaded": True, "others_cores": 1.5}))
    assert profile_load(t)["loaded"] is True


def test_speed_probe_and_its_ratios():
    """The fixed-forward probe of a model instance (diagnostic), and the trace / profile ratios validate reports."""
    from real.engine.weights import build_model
    from real.validation.profile import probe_ratio, speed_probe
    from real.validation.validate import probe_record

    model, _ = build_model("qwen3-tiny", "cpu", max_slots=2, max_len=300)
    p = speed_probe(model, repeat=2)
    assert set(p) == {"1x1", "1x8", "context", "repeat"} and p["context"] == 256  # 4 requests need 4 slots
    assert all(p[k] > 0 for k in ("1x1", "1x8"))
    assert probe_ratio({"1x1": 2.0, "1x8": 8.0}, {"1x1": 1.0, "1x8": 2.0}) == pytest.approx(8 ** 0.5)
    assert probe_ratio({"1x1": 2.0}, {"4x2": 1.0}) is None
    rec = probe_record([{"1x1": 1.1}, {"1x1": 1.2}], {"1x1": 1.0, "context": 256})
    assert rec["vs_profile"] == [pytest.approx(1.1), pytest.approx(1.2)] and rec["drift"] == pytest.approx(1.2 / 1.1)
    assert "1.100x / 1.200x the profile's time" in rec["note"]


def test_drift_corrected_error_from_the_speed_probes(tmp_path):
    """A run that ran its fixed forwards 5% slower than the profile did has its prediction divided by 1.05 in the
    drift-corrected column; the verdict stays the wall clock's, but a 5% drift (beyond the 3% margin) marks the
    cell drifted: its 5% error cannot disagree."""
    import types

    import real.validation.validate as V

    wl = types.SimpleNamespace(trace="traces/chat.jsonl", requests=[types.SimpleNamespace(output_len=10)])
    reps = [dict(_fake_run(x), speed_probe={"1x1": 31.5, "1x8": 63.0}) for x in (100.0, 100.5, 99.5)]
    pred = dict(_fake_run(105.0), step_ms=[10.0, 10.0, 10.0])
    prediction = {"predicted": pred, "synthetic": pred, "sim_command": "x"}
    c = V.assemble_cell(wl, "none", 1, reps, prediction, 0.03, profile_probe={"1x1": 30.0, "1x8": 60.0, "context": 256})
    assert c["drift"]["speed_vs_profile"] == pytest.approx(1.05)
    assert c["drift"]["error"] == pytest.approx(105.0 / 1.05 / 100.0 - 1.0, abs=1e-12)
    assert c["verdict"]["verdict"] == "inconclusive" and c["verdict"]["drifted"]  # 5% off, at 5% drift
    assert c["repeats"][0]["speed_probe"]["1x1"] == 31.5 and "speed_probe" not in c["real"]
    bare = V.assemble_cell(wl, "none", 1, reps, prediction, 0.03)   # no profile probe: no correction
    assert "drift" not in bare
    agg = V.write_reports(tmp_path, [c], {"command": "x", "machine": {}, "model": "m", "mode": "real",
                                          "max_tokens": 8, "max_prompt": 9, "repeats": 3})
    assert agg["drift_corrected"]["median_error"] == pytest.approx(0.0, abs=1e-12)
    md = (tmp_path / "fidelity.md").read_text()
    assert "| 0.952x | +0.0% |" in md and "Drift-corrected (diagnostic" in md


def test_profile_uncertainty_of_a_recorded_profile(tmp_path):
    import pandas as pd

    from real.validation.profile import profile_uncertainty_of

    t = tmp_path / "table.json"
    assert profile_uncertainty_of(t) == (0.0, 0)  # nothing recorded beside it
    rows = []
    for pol, bs, total in (("none", 1, 99.0), ("none", 4, 50.0), ("none", 1, 101.0), ("none", 4, 50.0)):
        for i, ms in enumerate((total / 2, total / 2)):  # two steps a run; a run starts at t_start_ms 0
            rows.append({"t_start_ms": i * ms, "step_ms": ms, "num_seqs": 1, "policy": pol, "batch_size": bs})
    pd.DataFrame(rows).to_csv(str(t) + ".steps.csv", index=False)
    u, dof = profile_uncertainty_of(t)
    assert dof == 2 and u == pytest.approx(math.sqrt(2 * 1e-4 / 2) / math.sqrt(2))


def test_pooled_scatter_steadies_the_band_and_a_noisy_cell_keeps_its_own():
    from real.validation.fidelity_stats import cell_scatter, pooled_scatter, rel_scatter

    cells = [[100.0, 101.0, 99.0], [50.0, 50.5, 49.5], [20.0, 20.2, 19.8]]  # 1% relative sd each
    s, dof = pooled_scatter(cells)
    assert dof == 6 and s == pytest.approx(0.01)
    assert math.isnan(pooled_scatter([[1.0]])[0]) and pooled_scatter([[1.0]])[1] == 0
    # a cell whose 3 repeats happen to agree closely gets the run's scatter, not a band of ~0
    lucky = [100.0, 100.01, 99.99]
    assert cell_scatter(lucky, (s, dof)) == (s, dof)
    from scipy import stats
    assert noise_band(lucky, pooled=(s, dof)) == pytest.approx(stats.t.ppf(0.95, 6) * 0.01 / math.sqrt(3), rel=1e-9)
    # a cell far noisier than the pool (F test at 5%) keeps its own scatter
    noisy = [90.0, 100.0, 110.0]
    assert cell_scatter(noisy, (s, dof)) == rel_scatter(noisy)
    assert judge(noisy, 101.0, pooled=(s, dof)).verdict == "inconclusive"
    # one repeat with a pooled scatter has a finite band; without, the noise is unknown
    assert math.isfinite(noise_band([100.0], pooled=(s, dof))) and noise_band([100.0]) == math.inf
    assert judge([100.0], 101.0, pooled=(s, dof)).verdict == "agrees"


def test_a_cell_at_another_machine_speed_cannot_disagree():
    """The speed probes say the machine ran the profile's forwards 20% slower during the cell: an error of 25%
    beyond margin + band is then inconclusive (drifted), not disagrees; the same error without drift disagrees,
    and drift never turns an agreeing cell into anything else."""
    import real.validation.fidelity_stats as F

    xs = [100.0, 100.5, 99.5]
    plain = F.judge(xs, 125.0)
    assert plain.verdict == "disagrees" and not plain.drifted
    drift = F.judge(xs, 125.0, drifted=True)
    assert drift.verdict == "inconclusive" and drift.drifted and "machine speed" in drift.reason
    assert F.judge(xs, 101.0, drifted=True).verdict == "agrees"
    s = F.summarize([drift, plain])
    assert s.drifted == 1 and "machine speed off the profile's" in s.line()


def test_assemble_cell_marks_drift_from_the_repeats_probes():
    """assemble_cell marks a cell drifted when the median of its repeats' probe ratios to the profile's probe is
    off 1 by more than the margin, and not when it is within."""
    import types

    import real.validation.validate as V

    wl = types.SimpleNamespace(trace="traces/chat.jsonl", requests=[types.SimpleNamespace(output_len=10)])
    pred = dict(_fake_run(125.0), step_ms=[10.0, 10.0, 10.0])
    prediction = {"predicted": pred, "synthetic": pred, "sim_command": "x"}
    prof = {"1x1": 30.0, "1x8": 60.0, "context": 256}
    slow = [dict(_fake_run(x), speed_probe={"1x1": 36.0, "1x8": 72.0}) for x in (100.0, 100.5, 99.5)]
    same = [dict(_fake_run(x), speed_probe={"1x1": 30.3, "1x8": 60.6}) for x in (100.0, 100.5, 99.5)]
    c = V.assemble_cell(wl, "none", 1, slow, prediction, 0.03, profile_probe=prof)
    assert c["verdict"]["drifted"] and c["verdict"]["verdict"] == "inconclusive"
    c = V.assemble_cell(wl, "none", 1, same, prediction, 0.03, profile_probe=prof)
    assert not c["verdict"]["drifted"] and c["verdict"]["verdict"] == "disagrees"


def test_probe_math_shapes_reference_bracket_and_pair_scatter():
    """Re-anchoring's probe arithmetic (real/validation/fidelity_stats.py): only "<R>x<q>" keys are shapes (a probe's
    "context" entry, equal in both, once diluted every ratio by a quarter), the reference is the per-shape
    geometric mean, a bracket is the geometric mean of its two ratios, one probe's sd comes from pairs."""
    import real.validation.fidelity_stats as F

    ref = {"1x1": 30.0, "1x8": 60.0, "4x2": 80.0, "context": 256, "repeat": 9}
    slow = {"1x1": 36.0, "1x8": 72.0, "4x2": 96.0, "context": 256, "repeat": 3}
    assert F.probe_ratio(slow, ref) == pytest.approx(1.2)  # not 1.2 ** 0.75 (context counted as a shape)
    assert not F.is_shape("context") and F.is_shape("4x2") and not F.is_shape("x")
    assert F.reference_probe([ref, slow]) == pytest.approx({"1x1": (30 * 36) ** .5, "1x8": (60 * 72) ** .5,
                                                            "4x2": (80 * 96) ** .5, "context": 256, "repeat": 9})
    assert F.bracket_speed(ref, slow, ref) == pytest.approx(1.2 ** 0.5)
    assert F.bracket_speed({"9x9": 1.0}, slow, ref) is None
    # two pairs: d = log 1.2 and log 1.0 -> s_1 = sqrt((log(1.2)^2 + 0) / 2 / 2)
    s1, dof = F.probe_pair_scatter([(ref, slow), (ref, ref)])
    assert dof == 2 and s1 == pytest.approx(math.sqrt(math.log(1.2) ** 2 / 4))
    assert F.probe_pair_scatter([]) == (0.0, 0)
    assert F.within_drift([(ref, slow), (ref, ref), (slow, slow)]) == pytest.approx(0.0)
    assert F.within_drift([(ref, slow)]) == pytest.approx(math.log(1.2) / 2)
    u, nu = F.legacy_reference_sd((0.03, 10), (0.04, 15))
    assert u == pytest.approx(0.05) and nu == pytest.approx(0.05 ** 4 / (0.03 ** 4 / 10 + 0.04 ** 4 / 15))
    with pytest.raises(ValueError):
        F.reference_probe([])


def test_judge_reanchors_the_repeats_to_the_reference_speed():
    """Repeats that scatter only because the machine's speed moved (q_r measured by the probes) agree once
    re-anchored (x' = x q), and are inconclusive without; the reference's own uncertainty u_a widens the band by
    Welch-Satterthwaite; a bad speed is refused."""
    from scipy import stats

    xs, qs = [100.0, 90.0, 110.0], [1.0, 10 / 9, 10 / 11]
    assert judge(xs, 101.0).verdict == "inconclusive"
    v = judge(xs, 101.0, speeds=qs)
    assert v.anchored and v.verdict == "agrees" and v.real == pytest.approx(100.0) and v.band == pytest.approx(0.0)
    assert v.speed == pytest.approx(1.0) and v.error == pytest.approx(0.01)
    # the same with a reference uncertain by 1% (10 dof): the band is the t interval of u_a alone; by 2%, wider
    # than the margin: inconclusive
    w = judge(xs, 101.0, speeds=qs, anchor_sd=0.01, anchor_df=10)
    assert w.band == pytest.approx(stats.t.ppf(0.95, 10) * 0.01) and w.verdict == "agrees" and w.anchor_sd == 0.01
    assert judge(xs, 101.0, speeds=qs, anchor_sd=0.02, anchor_df=10).verdict == "inconclusive"
    # and with the repeats' own scatter too: nu = (a + b)^2 / (a^2 / nu_r + b^2 / nu_a)
    ys = [99.0, 100.0, 101.0]
    ur2, ua2 = 0.01 ** 2 / 3, 0.02 ** 2
    nu = (ur2 + ua2) ** 2 / (ur2 ** 2 / 2 + ua2 ** 2 / 10)
    assert noise_band(ys, anchor_sd=0.02, anchor_df=10) == pytest.approx(stats.t.ppf(0.95, nu) * math.sqrt(ur2 + ua2))
    # repeats whose wall clock ran 25% slow while the probes ran 25% slow agree with the prediction at the
    # reference speed; not re-anchored they disagree, and so does a prediction 20% off at the reference speed
    assert judge([80.0, 80.0, 80.0], 100.0, speeds=[1.25, 1.25, 1.25]).verdict == "agrees"
    assert judge([80.0, 80.0, 80.0], 100.0).verdict == "disagrees"
    assert judge([80.0, 80.0, 80.0], 120.0, speeds=[1.25, 1.25, 1.25]).verdict == "disagrees"
    with pytest.raises(ValueError):
        judge(xs, 101.0, speeds=[1.0, 0.0, 1.0])
    with pytest.raises(ValueError):
        judge(xs, 101.0, speeds=[1.0])


def test_profile_runs_are_anchored_before_the_fit():
    """real.validation.profile.anchor_steps divides every *_ms column of a run by its bracket speed and records it."""
    import numpy as np

    from real.validation.profile import anchor_steps

    st = {"t_start_ms": np.array([0.0, 10.0]), "step_ms": np.array([10.0, 12.0]), "verify_ms": np.array([8.0, 9.0]),
          "tokens": np.array([1, 2]), "policy": "none"}
    out = anchor_steps(st, 1.25)
    assert out["step_ms"] == pytest.approx([8.0, 9.6]) and out["verify_ms"] == pytest.approx([6.4, 7.2])
    assert list(out["tokens"]) == [1, 2] and out["policy"] == "none" and list(out["speed_q"]) == [1.25, 1.25]
    assert out["t_start_ms"][0] == 0.0  # run boundaries (t_start_ms == 0) survive


def test_assemble_cell_reanchors_and_marks_speed_moving_within_repeats():
    """With a reference and probes before and after every repeat, assemble_cell judges x' = x q: a cell whose
    wall clock ran 10% slow while the probes ran 10% slow agrees; the wall-clock error stays beside it. Probes
    that move 8% within each repeat (|log w| / 2 = 3.8% > 3%) mark it drifted: its 25% error cannot disagree."""
    import types

    import real.validation.validate as V

    wl = types.SimpleNamespace(trace="traces/chat.jsonl", requests=[types.SimpleNamespace(output_len=10)])
    pred = dict(_fake_run(100.0), step_ms=[10.0, 10.0, 10.0])
    prediction = {"predicted": pred, "synthetic": pred, "sim_command": "x"}
    ref = {"1x1": 30.0, "1x8": 60.0, "context": 256, "anchored": True}
    anchor = V.trace_anchor({"speed_probe": ref}, [])
    assert anchor["sd"] == 0.0 and anchor["table_anchored"]
    slow = {"1x1": 33.0, "1x8": 66.0}
    reps = [dict(_fake_run(x), speed_probe=slow, speed_probe_before=slow) for x in (90.5, 91.0, 90.8)]
    c = V.assemble_cell(wl, "none", 1, reps, prediction, 0.03, profile_probe=ref, pooled=(0.005, 30), anchor=anchor)
    v = c["verdict"]
    assert v["anchored"] and v["speed"] == pytest.approx(1.1) and v["real"] == pytest.approx(90.8 * 1.1)
    assert v["verdict"] == "agrees" and not v["drifted"]
    assert c["anchor"]["error_wall"] == pytest.approx(100.0 / 90.8 - 1.0) and c["real"]["tok_per_s"] == 90.8
    assert c["repeats"][0]["speed_probe_before"] == slow and "drift" not in c
    # step times too: steps 10% long on a machine running 10% slow are the predicted ones at the reference speed
    long = [dict(r, step_ms=[11.0, 11.0, 11.0]) for r in reps]
    s = V.assemble_cell(wl, "none", 1, long, prediction, 0.03, pooled=(0.005, 30), anchor=anchor)
    assert s["step_error_median"] == pytest.approx(0.0, abs=1e-12)
    assert s["step_error_median_wall"] == pytest.approx(1.0 / 11.0)
    moving = [dict(r, speed_probe_before={"1x1": 31.7, "1x8": 63.4}, speed_probe={"1x1": 34.3, "1x8": 68.6},
                   tok_per_s=r["tok_per_s"] * 0.8) for r in reps]
    m = V.assemble_cell(wl, "none", 1, moving, prediction, 0.03, pooled=(0.005, 30), anchor=anchor)["verdict"]
    assert m["drifted"] and m["verdict"] == "inconclusive" and abs(m["error"]) > 0.2
    # a legacy table (one probe after an un-anchored profile): u_a from the pairs and the profile's run sd
    legacy = V.trace_anchor({"speed_probe": {"1x1": 30.0}}, [({"1x1": 30.0}, {"1x1": 33.0})], (0.04, 15))
    assert not legacy["table_anchored"] and legacy["sd"] == pytest.approx(math.hypot(math.log(1.1) / 2 ** .5, 0.04))
    assert V.trace_anchor(None, []) is None
    # no probe before the repeats (older recordings): the earlier path, no re-anchoring
    old = V.assemble_cell(wl, "none", 1, [dict(r, speed_probe_before=None) for r in reps], prediction, 0.03,
                          profile_probe=ref, anchor=anchor)
    assert not old["verdict"]["anchored"] and "anchor" not in old and "drift" in old
