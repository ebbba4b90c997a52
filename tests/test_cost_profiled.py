"""Profiled tables: vLLM-style lookup (monotone, step below the capture limit, interpolation above,
extrapolation past the end), JSON/CSV loading, the derived example table, and the registry."""
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cost import (COST_KINDS, CostTable, ProfiledCost, RooflineCost, StepTable, default_table_path,
                      load_cost_table, make_cost_model, tables_from_cost_model, vllm_capture_sizes,
                      write_cost_table)
from sim.errors import ConfigError

ROOF = RooflineCost(llm="qwen3-8b", gpu="h100-sxm")
PROF = make_cost_model("profiled", "qwen3-8b", "h100-sxm")


def test_capture_sizes():
    c = vllm_capture_sizes()
    assert c[:5] == [1, 2, 4, 8, 16] and c[-1] == 512 and 248 in c and 256 in c and 272 in c and 264 not in c
    assert vllm_capture_sizes(64)[-1] == 64


def test_step_table_rules():
    t = StepTable([1, 8, 16, 32, 64], [1.0, 2.0, 1.5, 4.0, 6.0], capture_sizes=[1, 8, 16, 32])
    assert list(t.ys) == [1.0, 2.0, 2.0, 4.0, 6.0]          # forced monotone (running max)
    assert t(0) == 0.0 and t(-3) == 0.0
    assert t(1) == 1.0
    assert t(2) == t(8) == 2.0                               # pads up to capture size 8
    assert t(17) == t(32) == 4.0                             # pads to 32, a step, not interpolated
    assert t(48) == pytest.approx(5.0)                       # above the capture range: interpolation
    assert t(96) == pytest.approx(6.0 + 2.0 / 32 * 32)       # extrapolation with the last slope
    assert t(1000) == pytest.approx(6.0 + (1000 - 64) / 16)
    np.testing.assert_allclose(t(np.array([0, 2, 17, 48])), [0, 2, 4, 5])
    # without capture sizes: pure interpolation, held below the first point
    u = StepTable([4, 8], [1.0, 3.0])
    assert u(1) == 1.0 and u(6) == pytest.approx(2.0) and u(10) == pytest.approx(4.0)
    # duplicates keep the largest value; one point extrapolates flat
    assert StepTable([4, 4], [1.0, 2.0])(100) == 2.0
    with pytest.raises(ConfigError):
        StepTable([], [])
    with pytest.raises(ConfigError):
        StepTable([1, 2], [1.0])
    with pytest.raises(ConfigError):
        StepTable([0, 2], [1.0, 2.0])


def test_example_table_is_derived_and_reproducible():
    path = default_table_path("qwen3-8b", "h100-sxm")
    on_disk = json.loads(path.read_text())
    assert on_disk["derived"] is True and "NOT MEASURED" in on_disk["source"]
    regenerated = tables_from_cost_model(ROOF).to_json()
    assert regenerated["verify"] == on_disk["verify"] and regenerated["draft"] == on_disk["draft"]
    assert regenerated["capture_sizes"] == on_disk["capture_sizes"]
    assert regenerated["kv_ms_per_token"] == pytest.approx(on_disk["kv_ms_per_token"])


def test_profiled_follows_roofline_with_padding():
    caps = vllm_capture_sizes(512)
    for t in [1, 3, 5, 100, 129, 130, 135, 136, 200, 257, 500, 512]:
        pad = next(c for c in caps if c >= t)
        assert PROF.verify_ms(t, 0, 1) == pytest.approx(ROOF.verify_ms(pad, 0, pad), abs=1e-5)
    assert PROF.verify_ms(129, 0, 1) == PROF.verify_ms(136, 0, 1) > PROF.verify_ms(128, 0, 1)
    # above 512: linear interpolation between profiled points (roofline is linear there: exact)
    for t in [600, 700, 1000, 5000]:
        assert PROF.verify_ms(t, 0, 1) == pytest.approx(ROOF.verify_ms(t, 0, t), rel=1e-6)
    # past the last point (8192): extrapolated along the last segment
    s = (PROF.verify_ms(8192, 0, 1) - PROF.verify_ms(6144, 0, 1)) / 2048
    assert PROF.verify_ms(10000, 0, 1) == pytest.approx(PROF.verify_ms(8192, 0, 1) + s * (10000 - 8192), rel=1e-9)
    # the KV term is added per cached entry
    assert PROF.verify_ms(64, 100_000, 8) - PROF.verify_ms(64, 0, 8) == pytest.approx(100_000 * ROOF.kv_ms_per_token,
                                                                                       rel=1e-4)
    # drafter: table at block 7; other blocks look up the same number of positions
    assert PROF.draft_ms(8, 7) == pytest.approx(ROOF.draft_ms(8, 7), abs=1e-5)
    assert PROF.draft_ms(8, 14) == pytest.approx(PROF.draft_ms(16, 7))
    assert PROF.draft_ms(0, 7) == 0.0
    # small kernels and memory come from the roofline of the same llm/gpu
    assert PROF.kv_capacity_tokens == ROOF.kv_capacity_tokens
    assert PROF.ngram_ms(8) == ROOF.ngram_ms(8) and PROF.cpu_ms(4, 8) == ROOF.cpu_ms(4, 8)


def test_verify_table_and_vector_paths_agree():
    for n, k, s in [(0, 0, 1), (10, 5000, 2), (700, 123_456, 64), (3000, 1, 1)]:
        tab = PROF.verify_table(n, k, s)
        ref = np.array([PROF.verify_ms(t, k, s) for t in range(n + 1)])
        np.testing.assert_allclose(tab, ref, rtol=1e-12)
        np.testing.assert_allclose(PROF.verify_ms(np.arange(n + 1), k, s), ref, rtol=1e-12)
        assert np.all(np.diff(tab) >= 0)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 20000), st.integers(0, 20000), st.integers(0, 10**6), st.integers(0, 10**6),
       st.integers(1, 300), st.integers(1, 300), st.integers(0, 16))
def test_profiled_monotone(a, b, k1, k2, r1, r2, blk):
    (a, b), (k1, k2), (r1, r2) = sorted((a, b)), sorted((k1, k2)), sorted((r1, r2))
    assert PROF.verify_ms(a, k1, 4) <= PROF.verify_ms(b, k1, 4) <= PROF.verify_ms(b, k2, 4)
    assert PROF.draft_ms(r1, blk) <= PROF.draft_ms(r2, blk) <= PROF.draft_ms(r2, blk + 1)


def test_csv_table_equals_json(tmp_path):
    t = CostTable(llm="qwen3-8b", gpu="h100-sxm", verify_tokens=[1, 8, 16, 64], verify_ms=[5, 5, 6, 9],
                  draft_reqs=[1, 8], draft_ms=[1, 2], draft_block=5, capture_sizes=[1, 8, 16],
                  kv_ms_per_token=1e-4)
    js = write_cost_table(t, tmp_path / "t.json")
    csv = tmp_path / "t.csv"
    csv.write_text("# llm: qwen3-8b\n# gpu: h100-sxm\n# capture_sizes: 1 8 16\n# draft_block: 5\n"
                   "# kv_ms_per_token: 1e-4\ntable,x,ms\nverify,1,5\nverify,8,5\nverify,16,6\nverify,64,9\n"
                   "draft,1,1\ndraft,8,2\n")
    a, b = ProfiledCost(js), ProfiledCost(csv)
    for x in [1, 3, 9, 17, 40, 64, 100]:
        assert a.verify_ms(x, 10, 1) == b.verify_ms(x, 10, 1)
    assert a.verify_ms(9, 0, 1) == 6.0 and a.verify_ms(40, 0, 1) == pytest.approx(7.5)
    assert a.draft_ms(2, 5) == b.draft_ms(2, 5) == 2.0
    p = make_cost_model("profiled", "qwen3-8b", "h100-sxm", path=str(csv))
    assert p.verify_ms(64, 0, 1) == 9.0


def test_bad_tables(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"llm": "qwen3-8b", "gpu": "h100-sxm"}))
    with pytest.raises(ConfigError, match="missing field 'verify'"):
        load_cost_table(bad)
    bad.write_text(json.dumps({"llm": "qwen3-8b", "gpu": "h100-sxm", "verify": {"num_tokens": [1], "ms": ["x"]}}))
    with pytest.raises(ConfigError, match="verify.ms"):
        load_cost_table(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_cost_table(tmp_path / "missing.json")
    c = tmp_path / "bad.csv"
    c.write_text("# llm: qwen3-8b\n# gpu: h100-sxm\ntable,x,ms\nprefill,1,2\n")
    with pytest.raises(ConfigError, match="row 2"):
        load_cost_table(c)
    with pytest.raises(ConfigError, match="is for qwen3-8b on h100-sxm"):
        make_cost_model("profiled", "llama-3.1-8b", "h100-sxm", path=default_table_path("qwen3-8b", "h100-sxm"))


def test_registry():
    assert COST_KINDS == ("roofline", "profiled")
    assert isinstance(make_cost_model(), RooflineCost)
    assert make_cost_model().config.llm == "qwen3-8b" and make_cost_model().config.gpu == "h100-sxm"
    assert isinstance(make_cost_model("Profiled", "qwen3-8b", "h100-sxm"), ProfiledCost)
    with pytest.raises(ConfigError, match="unknown cost model 'vidur'; choose one of: roofline, profiled"):
        make_cost_model("vidur")
    with pytest.raises(ConfigError, match="no cost table for qwen3-4b on a100-80g"):
        make_cost_model("profiled", "qwen3-4b", "a100-80g")
    with pytest.raises(ConfigError, match="unknown model"):
        make_cost_model("profiled", "qwen9", "h100-sxm")
    assert make_cost_model("roofline", "qwen3-4b", "a100-80g", gpu_memory_utilization=0.8,
                           draft_layers=1).config.draft_layers == 1
