"""real/validation/vllm_cpu/depth_calibration.py: the plugin's per-depth counters pooled as vLLM counted them, and the
calibrator's per-depth estimate over every n-gram proposal of a text (censored like the fit; no vLLM needed)."""
import json

import numpy as np
import pytest

from real.validation.vllm_cpu import depth_calibration as D
from sim.infra.errors import ConfigError


def _cell(path, reached, accepted, predicted):
    path.mkdir(parents=True)
    (path / "cell.json").write_text(json.dumps({"real": {"plugin": {
        "ngram_reached": reached, "ngram_accepted": accepted, "ngram_predicted": predicted}}}))


def test_plugin_depths_pools_counts_and_weights_the_calibrated_mean_by_reached(tmp_path):
    _cell(tmp_path / "a" / "codeedit" / "bs4" / "hybrid", [10, 4], [8, 2], [0.5, 0.7])
    _cell(tmp_path / "b" / "chat" / "bs4" / "hybrid", [30, 0], [15, 0], [0.9, None])
    rows, cells = D.plugin_depths([tmp_path / "a", tmp_path / "b"])
    assert len(cells) == 2
    d1, d2 = rows
    assert (d1["n"], d1["accepted"]) == (40, 23)
    assert d1["observed"] == pytest.approx(23 / 40)
    assert d1["calibrated"] == pytest.approx((0.5 * 10 + 0.9 * 30) / 40)
    assert d1["measured"] and not d2["measured"]  # 40 >= MIN_REACHED > 4
    assert d2["observed"] == pytest.approx(0.5)
    assert D.mean_gap(rows) == pytest.approx(abs(23 / 40 - 32 / 40))


def test_the_header_names_the_drafter_each_cell_recorded(tmp_path):
    a, b, c = (tmp_path / n for n in "abc")
    for d in (a, b, c):
        d.mkdir()
    spec = {"engine_kwargs": {"speculative_config": {"method": "dspark", "model": "/x/hf/dspark-smollm2-135m"}}}
    (a / "run.result.json").write_text(json.dumps(spec))
    (b / "run.result.json").write_text("not json")
    assert D.cell_drafters([str(a)]) == "`dspark-smollm2-135m`"
    assert D.cell_drafters([str(a), str(b), str(c)]) == "`dspark-smollm2-135m`, not recorded"


def test_slot_stats_counts_only_observed_slots_inside_the_output():
    # prompt "1 2 3 4 5 6 7 8" then the output repeats it: every n-gram proposal continues the copy exactly
    prompt = list(range(1, 9))
    seq = np.asarray(prompt + prompt[:6])
    rows = D._slot_stats([(seq, len(prompt))], 7)
    got = {r["depth"]: r for r in rows}
    # proposals at output positions 2..5 (the first bigram match is the output's own (1, 2)); a slot (i, j)
    # counts only when output position i + j - 1 < 6 exists (a slot past max_tokens has no label)
    assert [got[j]["n"] for j in range(1, 8)] == [4, 3, 2, 1, 0, 0, 0]
    for r in rows:
        if r["n"]:
            assert r["observed"] == 1.0
            assert 0.0 < r["calibrated"] < 1.0


def test_main_refuses_nothing_to_read_and_an_existing_report(tmp_path):
    with pytest.raises(ConfigError, match="nothing to read"):
        D.main([])
    with pytest.raises(ConfigError, match="go together"):
        D.main(["--out", str(tmp_path)])
    rep = tmp_path / "r.md"
    rep.write_text("x")
    with pytest.raises(ConfigError, match="exists"):
        D.main(["--run", str(tmp_path), "--report", str(rep)])
    with pytest.raises(ConfigError, match="no hybrid cell"):
        D.main(["--run", str(tmp_path)])


def test_noise_floor_and_pooled_gap():
    rows = [{"depth": 1, "n": 100.0, "observed": 0.7, "calibrated": 0.5, "stderr": 0.0, "measured": True},
            {"depth": 2, "n": 10.0, "observed": 0.5, "calibrated": 0.9, "stderr": 0.0, "measured": False}]
    assert D.noise_floor(rows) == pytest.approx(np.sqrt(2 / np.pi) * 0.05)  # only the measured depth
    pl = D.pooled(rows)
    assert pl["n"] == 110
    assert pl["observed"] == pytest.approx(75 / 110)
    assert pl["calibrated"] == pytest.approx(59 / 110)
    assert pl["se"] == pytest.approx(np.sqrt(100 * 0.25 + 10 * 0.09) / 110)
