"""Profiled tables: vLLM-style lookup (monotone, step below the capture limit, interpolation above,
extrapolation past the end), JSON/CSV loading, the derived example table, and the registry."""
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.cost import (COST_KINDS, CostTable, ProfiledCost, RooflineCost, StepTable, check_machine, default_table_path,
                      load_cost_table, make_cost_model, tables_from_cost_model, vllm_capture_sizes,
                      write_cost_table)
from sim.infra.errors import ConfigError

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
    # every registered kind builds a cost model of the default target on the default GPU (a kind added later is
    # held to the same, without editing a list here)
    from sim.core.cost import DEFAULT_COST_KIND, CostModel, cost_kinds

    assert DEFAULT_COST_KIND in COST_KINDS and set(COST_KINDS) <= set(cost_kinds())
    for kind in cost_kinds():
        assert isinstance(make_cost_model(kind, "qwen3-8b", "h100-sxm"), CostModel)
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


# --- every step part in the table (format keys machine, seq_ms, logits_ms_per_row, ngram, alloc, sample,
# --- cpu, kv_capacity_tokens, vocab_size) ---------------------------------------------------------------

MACHINE = {"device": "cpu", "cpu": "Test CPU 9000", "torch": "2.5.1", "dtype": "float32", "threads": 2,
           "model": "HuggingFaceTB/SmolLM2-135M"}


def full_table(**kw) -> CostTable:
    """A hand-made table of a CPU engine (no roofline spec for 'cpu'), every part present."""
    args = dict(llm="smollm2-135m", gpu="cpu", verify_tokens=[1, 4, 16], verify_ms=[10.0, 12.0, 24.0],
                draft_reqs=[1, 4], draft_ms=[2.0, 5.0], draft_block=4, capture_sizes=[], kv_ms_per_token=0.001,
                source="hand-made", machine=dict(MACHINE), seq_ms=0.5, logits_ms_per_row=0.25,
                ngram=([1, 4], [0.1, 0.4]),
                alloc={"hybrid-price": ([1, 4], [0.2, 0.8]), "*": ([2], [0.05])},
                sample=([1, 8], [0.3, 1.0]), cpu={"base_ms": 1.0, "per_req_ms": 0.1, "per_token_ms": 0.01},
                kv_capacity_tokens=50_000, vocab_size=49152)
    args.update(kw)
    return CostTable(**args)


def test_round_trip_every_key(tmp_path):
    t = full_table()
    p = write_cost_table(t, tmp_path / "cpu.json")
    back = load_cost_table(p)
    assert back == t and back.path == str(p) and back.machine == MACHINE
    d = json.loads(p.read_text())
    assert d["format"] == "hybridspec-cost-table/1"
    assert {"machine", "seq_ms", "logits_ms_per_row", "ngram", "alloc", "sample", "cpu", "kv_capacity_tokens",
            "vocab_size"} <= set(d)
    # whole or nothing, never over an existing file unless asked; nothing left behind
    with pytest.raises(ConfigError, match="already exists"):
        write_cost_table(full_table(seq_ms=9.0), p)
    assert load_cost_table(p).seq_ms == 0.5
    write_cost_table(full_table(seq_ms=9.0), p, overwrite=True)
    assert load_cost_table(p).seq_ms == 9.0
    assert sorted(x.name for x in tmp_path.iterdir()) == ["cpu.json"]
    with pytest.raises(ConfigError, match="JSON"):
        write_cost_table(t, tmp_path / "cpu.csv")


def test_every_part_looked_up():
    c = ProfiledCost(full_table())
    assert c.fallback is None                                  # 'cpu' has no roofline spec
    assert c.machine == MACHINE and c.kv_capacity_tokens == 50_000 and c.vocab_size == 49152
    # verify = f(T) + kv*K + seq*S + logits*rows (rows default T)
    assert c.verify_ms(4, 1000, 2) == pytest.approx(12.0 + 1.0 + 1.0 + 0.25 * 4)
    assert c.verify_ms(10, 0, 1) == pytest.approx(18.0 + 0.5 + 2.5)
    assert c.verify_ms(4, 1000, 2, logit_rows=2) == pytest.approx(12.0 + 1.0 + 1.0 + 0.5)
    assert c.verify_ms(4, 1000, 2, 0) == pytest.approx(14.0)
    assert c.verify_ms(0, 1000, 2) == 0.0
    np.testing.assert_allclose(c.verify_ms(np.array([0, 4, 10]), 1000, 2, logit_rows=np.array([0, 1, 3])),
                               [0.0, 14.25, 18.0 + 2.0 + 0.75])
    np.testing.assert_allclose(c.verify_table(20, 1000, 2), [c.verify_ms(t, 1000, 2) for t in range(21)], rtol=1e-12)
    np.testing.assert_allclose(c.charged_verify_table(20, 7, 3), c.verify_table(20, 7, 3))  # eager: no padding
    # draft: ceil(R * block / table block) requests' worth of positions
    assert c.draft_ms(1, 4) == 2.0 and c.draft_ms(4, 4) == 5.0 and c.draft_ms(2, 4) == pytest.approx(3.0)
    assert c.draft_ms(1, 8) == c.draft_ms(2, 4) and c.draft_ms(0, 4) == 0.0
    # small parts interpolate (no capture sizes), extrapolate past the end, 0 at 0
    assert c.ngram_ms(1) == pytest.approx(0.1) and c.ngram_ms(2) == pytest.approx(0.2)
    assert c.ngram_ms(8) == pytest.approx(0.8) and c.ngram_ms(3, on_gpu=False) == pytest.approx(0.3)
    assert c.ngram_ms(0) == 0.0
    assert c.sample_ms(1) == pytest.approx(0.3) and c.sample_ms(8) == pytest.approx(1.0)
    assert c.sample_ms(15) == pytest.approx(1.7) and c.sample_ms(0) == 0.0
    assert c.cpu_ms(3, 20) == pytest.approx(1.0 + 0.3 + 0.2) and c.cpu_ms(0, 0) == 0.0
    assert c.cpu_ms(0, 5) == pytest.approx(1.05)


def test_alloc_per_policy_default_and_fallback():
    c = ProfiledCost(full_table())
    assert c.alloc_ms(2, "hybrid-price") == pytest.approx(0.4)   # its own table
    assert c.alloc_ms(2, "adaptive") == pytest.approx(0.05)      # "*" for any other policy
    assert c.alloc_ms(2) == pytest.approx(0.05)                   # and for an unnamed one
    assert c.alloc_ms(0, "hybrid-price") == 0.0
    only_named = ProfiledCost(full_table(alloc={"hybrid-price": ([1, 4], [0.2, 0.8])}), fallback=ROOF)
    assert only_named.alloc_ms(2, "hybrid-price") == pytest.approx(0.4)
    assert only_named.alloc_ms(2, "adaptive") == ROOF.alloc_ms(2) == only_named.alloc_ms(2)
    # no table and no fallback: asked for, a one-line ConfigError naming the missing key
    bare = ProfiledCost(full_table(alloc={}, ngram=None, sample=None, cpu=None, draft_reqs=[], draft_ms=[],
                                   kv_capacity_tokens=None))
    for call, key in [(lambda: bare.alloc_ms(2), "alloc"), (lambda: bare.ngram_ms(2), "ngram"),
                      (lambda: bare.sample_ms(2), "sample"), (lambda: bare.cpu_ms(1, 1), "cpu"),
                      (lambda: bare.draft_ms(1, 4), "draft"), (lambda: bare.kv_capacity_tokens, "kv_capacity_tokens")]:
        with pytest.raises(ConfigError, match=f"has no '{key}'.*no roofline model of smollm2-135m on cpu"):
            call()
    with pytest.raises(ConfigError, match="has no 'kv_ms_per_token'"):
        ProfiledCost(full_table(kv_ms_per_token=None))


def test_missing_parts_fall_back_to_roofline_as_before():
    t = full_table(llm="qwen3-8b", gpu="h100-sxm", ngram=None, alloc={}, sample=None, cpu=None,
                   kv_capacity_tokens=None, vocab_size=None, logits_ms_per_row=None, seq_ms=0.0)
    c = ProfiledCost(t)
    assert isinstance(c.fallback, RooflineCost)
    assert c.ngram_ms(8) == ROOF.ngram_ms(8) and c.ngram_ms(8, on_gpu=False) == ROOF.ngram_ms(8, on_gpu=False)
    assert c.alloc_ms(16, "hybrid") == ROOF.alloc_ms(16) and c.sample_ms(100) == ROOF.sample_ms(100)
    assert c.cpu_ms(4, 32) == ROOF.cpu_ms(4, 32) and c.kv_capacity_tokens == ROOF.kv_capacity_tokens
    assert c.vocab_size == ROOF.vocab_size
    # without logits_ms_per_row and seq_ms the table prices every row: logit_rows and num_seqs are unused
    assert c.verify_ms(4, 100, 1, logit_rows=0) == c.verify_ms(4, 100, 3) == pytest.approx(12.0 + 0.1)


def test_bundled_table_costs_unchanged():
    """Values computed with the bundled table before the format gained its optional keys."""
    for args, ms in [((1, 0, 1), 7.475088), ((7, 5000, 1), 7.7646715), ((136, 100000, 8), 13.419353000000001),
                     ((700, 123456, 64), 26.1354298652), ((9000, 10**6, 100), 244.04370234374997)]:
        assert PROF.verify_ms(*args) == ms
        assert PROF.verify_ms(*args, logit_rows=3) == ms
    for args, ms in [((1, 7), 1.04153), ((33, 7), 1.468464), ((8, 14), 1.04153), ((300, 7), 6.6735549999999995)]:
        assert PROF.draft_ms(*args) == ms
    assert (PROF.ngram_ms(8), PROF.ngram_ms(8, False), PROF.alloc_ms(16), PROF.alloc_ms(16, "hybrid")) == \
        (0.0216, 0.22, 0.0208, 0.0208)
    assert (PROF.sample_ms(100), PROF.cpu_ms(4, 32)) == (0.07774108405341712, 0.21664000000000003)
    assert (PROF.kv_capacity_tokens, PROF.vocab_size, PROF.table.machine) == (369528, 151936, {})
    assert float(PROF.verify_table(600, 5000, 3).sum()) == 6950.3893820625
    assert float(PROF.startup_verify_table(8192, 256, 8).sum()) == 1696645.309792783


def test_writer_reproduces_the_bundled_file(tmp_path):
    path = default_table_path("qwen3-8b", "h100-sxm")
    out = write_cost_table(load_cost_table(path), tmp_path / "copy.json")
    assert out.read_text() == path.read_text()


@pytest.mark.parametrize("key,value,needle", [
    ("machine", "cpu", "'machine'"),
    ("machine", {"threads": [1, 2]}, "'machine'"),
    ("seq_ms", "0.1", "'seq_ms'"),
    ("seq_ms", -1, "'seq_ms'"),
    ("logits_ms_per_row", True, "'logits_ms_per_row'"),
    ("kv_ms_per_token", "x", "'kv_ms_per_token'"),
    ("ngram", {"num_reqs": [1, 2], "ms": [0.1]}, "'ngram'"),
    ("ngram", {"num_reqs": [1, 2], "ms": [0.1, "y"]}, "'ngram.ms'"),
    ("ngram", [1, 2], "'ngram'"),
    ("sample", {"num_reqs": [1], "ms": [1]}, "'sample' must be an object with 'num_tokens'"),
    ("sample", {"num_tokens": [1, 2], "ms": [1, -2]}, "'sample'"),
    ("alloc", [1], "'alloc'"),
    ("alloc", {"hybrid": {"num_reqs": [0], "ms": [1]}}, "'alloc.hybrid'"),
    ("alloc", {"*": {"num_reqs": [1], "ms": [None]}}, "'alloc.\\*.ms'"),
    ("cpu", {"base_ms": 1, "per_tok_ms": 2}, "'cpu'"),
    ("cpu", {"base_ms": "1"}, "'cpu.base_ms'"),
    ("kv_capacity_tokens", 1.5, "'kv_capacity_tokens'"),
    ("kv_capacity_tokens", 0, "'kv_capacity_tokens'"),
    ("vocab_size", "49152", "'vocab_size'"),
    ("format", "hybridspec-cost-table/9", "'format'"),
])
def test_bad_new_keys(tmp_path, key, value, needle):
    d = full_table().to_json()
    d[key] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match=needle) as e:
        load_cost_table(bad)
    assert str(bad) in str(e.value) and "\n" not in str(e.value)


def test_csv_refuses_json_only_keys(tmp_path):
    c = tmp_path / "t.csv"
    c.write_text("# llm: qwen3-8b\n# gpu: h100-sxm\n# seq_ms: 0.1\ntable,x,ms\nverify,1,5\n")
    with pytest.raises(ConfigError, match="seq_ms.*JSON"):
        load_cost_table(c)
    c.write_text("# llm: qwen3-8b\n# gpu: h100-sxm\n# kv_ms_per_token: lots\ntable,x,ms\nverify,1,5\n")
    with pytest.raises(ConfigError, match="kv_ms_per_token"):
        load_cost_table(c)


def test_check_machine():
    t = full_table()
    assert check_machine(t, dict(MACHINE), strict=True) == ""
    assert check_machine(ProfiledCost(t), {**MACHINE, "threads": "2", "dtype": "Float32 "}, strict=True) == ""
    assert check_machine(t, {**MACHINE, "hostname": "other"}, strict=True) == ""   # not an identity key
    msg = check_machine(t, {**MACHINE, "threads": 8, "torch": "2.4.0"}, strict=False)
    assert "threads 2 in the table, 8 here" in msg and "torch" in msg and "\n" not in msg
    partial = {"device": "cpu", "threads": 2}
    assert check_machine(t, partial, strict=False) == ""
    assert "cpu 'Test CPU 9000' in the table, not given here" in check_machine(t, partial, strict=True)
    assert check_machine(full_table(machine={}), partial, strict=False) == ""
    assert "not recorded in the table" in check_machine(full_table(machine={}), partial, strict=True)


def test_make_cost_model_with_a_table_path(tmp_path):
    p = str(write_cost_table(full_table(), tmp_path / "cpu_smollm2.json"))
    c = make_cost_model("profiled", "smollm2-135m", gpu=p)
    assert isinstance(c, ProfiledCost) and c.table.machine == MACHINE and c.fallback is None
    assert make_cost_model("Profiled", "SmolLM2-135M", gpu=p).verify_ms(4, 0, 1) == pytest.approx(13.5)
    with pytest.raises(ConfigError, match=f"cost table {p} was profiled for model smollm2-135m, not qwen3-8b"):
        make_cost_model("profiled", "qwen3-8b", gpu=p)
    with pytest.raises(ConfigError, match="needs cost model 'profiled'"):
        make_cost_model("roofline", "smollm2-135m", gpu=p)
    with pytest.raises(ConfigError, match="not found"):
        make_cost_model("profiled", "smollm2-135m", gpu=str(tmp_path / "nope.json"))
    # a table of a GPU with a spec: missing parts come from that GPU's roofline of the model
    q = write_cost_table(full_table(llm="qwen3-8b", gpu="h100-sxm", ngram=None), tmp_path / "h100.json")
    g = make_cost_model("profiled", "qwen3-8b", gpu=str(q), gpu_memory_utilization=0.8)
    assert isinstance(g.fallback, RooflineCost) and g.fallback.config.gpu_memory_utilization == 0.8
    assert g.ngram_ms(8) == ROOF.ngram_ms(8)


def _sim_run(*args):
    from conftest import run_cli_inprocess

    root = Path(__file__).resolve().parents[1]
    return run_cli_inprocess("sim.api.run", "--trace", str(root / "tests/fixtures/sim/tiny.jsonl"), "--limit", "3",
                             "--batch-size", "2", "--workers", "1", "--no-progress", *args, cwd=root)


def test_sim_run_with_a_table_path(tmp_path):
    p = str(write_cost_table(full_table(), tmp_path / "cpu_smollm2.json"))
    r = _sim_run("--model", "smollm2-135m", "--cost", "profiled", "--gpu", p, "--policy", "hybrid-price",
                 "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert {x["policy"] for x in rows} == {"adaptive", "hybrid-price"} and all(x["lossless"] for x in rows)
    assert all(x["gpu"] == p and x["cost"] == "profiled" for x in rows)
    for args, needle in [(("--model", "qwen3-8b", "--cost", "profiled"),
                          "profiled for model smollm2-135m, not qwen3-8b"),
                         (("--model", "smollm2-135m"), "needs cost model 'profiled'")]:
        r = _sim_run(*args, "--gpu", p, "--policy", "adaptive")
        assert r.returncode != 0 and "Traceback" not in r.stderr
        assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
