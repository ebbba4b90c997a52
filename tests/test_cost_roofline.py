"""Roofline cost model: DESIGN section 6 anchors, monotonicity, KV capacity, config validation."""
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.cost import CostConfig, RooflineCost, make_cost_model
from sim.infra.errors import ConfigError
from sim.core.models import get_gpu, get_llm, GIB, list_gpus, list_llms

COSTS = {(l, g): RooflineCost(llm=l, gpu=g) for l in ("qwen3-8b", "llama-3.1-8b", "smollm2-135m", "qwen3-4b")
         for g in list_gpus()}
ALL = list(COSTS.values())


# ------------------------------------------------------------------------------------------ anchors
@pytest.mark.parametrize("llm", ["llama-3.1-8b", "qwen3-8b"])
def test_batch1_decode_step_h100(llm):
    ms = COSTS[(llm, "h100-sxm")].decode_step_ms(1, context=512)
    assert 7.5 * 0.85 <= ms <= 7.5 * 1.15, ms


@pytest.mark.parametrize("llm", ["llama-3.1-8b", "qwen3-8b"])
@pytest.mark.parametrize("gpu,knee,slope_us", [("h100-sxm", 128, 20.0), ("a100-80g", 64, 68.0)])
def test_non_attention_knee_and_slope(llm, gpu, knee, slope_us):
    c = COSTS[(llm, gpu)]
    assert knee * 0.8 <= c.knee_tokens <= knee * 1.2
    flat = c.linear_ms(1)
    # flat up to (just below) the knee, then rising at the per-token slope
    assert c.linear_ms(int(knee * 0.8)) == pytest.approx(flat)
    assert c.linear_ms(int(knee * 1.3)) > flat * 1.02
    t1, t2 = 4 * knee, 8 * knee
    slope = (c.linear_ms(t2) - c.linear_ms(t1)) / (t2 - t1) * 1e3
    assert slope_us * 0.8 <= slope <= slope_us * 1.2, slope
    # the full verify (overhead + attention at short context) shows the same slope
    v = (c.verify_ms(t2, 0, t2 // 8) - c.verify_ms(t1, 0, t1 // 8)) / (t2 - t1) * 1e3
    assert v == pytest.approx(slope, rel=0.01)


def test_h200_faster_memory_bound_same_compute():
    h100, h200 = COSTS[("qwen3-8b", "h100-sxm")], COSTS[("qwen3-8b", "h200")]
    assert h200.decode_step_ms(1) < h100.decode_step_ms(1)
    assert h200.ms_per_token == pytest.approx(h100.ms_per_token)
    assert h200.knee_tokens < h100.knee_tokens


def test_draft_and_small_kernels_magnitudes():
    c = COSTS[("qwen3-8b", "h100-sxm")]
    assert 0.3 < c.draft_ms(1, 7) < 2.0                       # 2 layers + LM head, memory-bound
    assert c.draft_ms(128, 7) > c.draft_ms(1, 7)
    assert c.draft_ms(1, 7) < 0.25 * c.decode_step_ms(1)
    assert 0.02 <= c.ngram_ms(1) <= c.ngram_ms(256) <= 0.1    # GPU n-gram: ~0.02-0.05 ms
    assert c.ngram_ms(64, on_gpu=False) > 5 * c.ngram_ms(64)   # CPU n-gram: host sync, per request
    assert c.ngram_ms(128, on_gpu=False) > c.ngram_ms(64, on_gpu=False)
    assert 0.02 <= c.alloc_ms(1) <= c.alloc_ms(256) < 0.05
    assert c.sample_ms(1) < 0.1 and c.sample_ms(1024) > c.sample_ms(1)
    assert c.cpu_ms(1, 1) == pytest.approx(0.204, abs=1e-3)
    assert c.cpu_ms(100, 100) == pytest.approx(0.2 + 0.4 + 0.002, abs=1e-3)
    for f in (lambda: c.draft_ms(0, 7), lambda: c.ngram_ms(0), lambda: c.alloc_ms(0), lambda: c.sample_ms(0),
              lambda: c.verify_ms(0, 0, 0), lambda: c.cpu_ms(0, 0)):
        assert f() == 0.0
    assert c.draft_ms(4, 7, kv_tokens=40000) > c.draft_ms(4, 7)


def test_draft_layers_override():
    a = RooflineCost(draft_layers=2)
    b = RooflineCost(draft_layers=4)
    assert b.draft_ms(1, 7) > a.draft_ms(1, 7)
    assert b.kv_capacity_tokens < a.kv_capacity_tokens


# ------------------------------------------------------------------------------------------ KV memory
def test_kv_capacity_qwen3_8b_h100():
    c = COSTS[("qwen3-8b", "h100-sxm")]
    cap = c.kv_capacity_tokens
    assert 300_000 < cap < 450_000
    need = 128 * 7000
    assert need * 147456 > 125e9            # ~130 GB of KV ...
    assert need > cap                       # ... does not fit on an 80 GB card
    assert 128 * 2000 < cap                 # but 128 x 2k-token chats do
    no_draft = RooflineCost(drafter=None)
    assert no_draft.kv_capacity_tokens > cap
    pool = no_draft.config.kv_pool_bytes
    assert pool == pytest.approx(79.65 * GIB * 0.9 - 8.19e9 * 2 - no_draft.config.activation_reserve_bytes)
    assert no_draft.kv_capacity_tokens == int(pool // 147456)
    assert RooflineCost(gpu_memory_utilization=0.95).kv_capacity_tokens > cap
    assert COSTS[("qwen3-8b", "h200")].kv_capacity_tokens > 1.8 * cap


@pytest.mark.parametrize("kw,match", [
    (dict(llm="qwen3-14b", gpu="a100-80g", gpu_memory_utilization=0.3), "does not fit"),
    (dict(tensor_parallel_size=3), "tensor_parallel_size"),
    (dict(tensor_parallel_size=2), "interconnect_gbps"),
    (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    (dict(gpu_memory_utilization=0), "gpu_memory_utilization"),
    (dict(draft_layers=-1), "draft_layers"),
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(llm="nope"), "unknown model 'nope'; choose one of: deepseek-v4-flash, glm-5.2, kimi-k2.5, llama-3.1-8b"),
    (dict(gpu="v100"), "unknown gpu 'v100'; choose one of: a100-80g, b300, gb200, h100-sxm, h200"),
    (dict(drafter="nope"), "unknown drafter cost spec"),
])
def test_impossible_configs(kw, match):
    with pytest.raises(ConfigError, match=match):
        CostConfig(**kw)
    with pytest.raises(ConfigError, match=match):
        make_cost_model("roofline", **{"llm": "qwen3-8b", "gpu": "h100-sxm", **kw})


def test_all_llm_gpu_pairs_fit():
    for l in list_llms():
        for g in list_gpus():
            if get_llm(l).is_moe:  # 154-427 GB of weights: one 288 GB card or a tensor-parallel group of 2-8
                if g.startswith(("a100", "h100", "h200")):
                    continue  # no interconnect stated for the Hopper/Ampere specs
                fits = []
                for tp in (1, 2, 4, 8):
                    try:
                        fits.append(RooflineCost(llm=l, gpu=g, tensor_parallel_size=tp).kv_capacity_tokens > 100_000)
                    except ConfigError:  # its weights leave no KV cache on this many GPUs
                        fits.append(False)
                assert fits[-1] and fits == sorted(fits), (l, g, fits)  # fits at TP8, and on more GPUs once it fits
                continue
            big = get_llm(l).weight_bytes > 0.6 * get_gpu(g).memory_gib * GIB  # qwen3-32b on an 80 GB card
            assert RooflineCost(llm=l, gpu=g).kv_capacity_tokens > (10_000 if big else 100_000), (l, g)


# ------------------------------------------------------------------------------------------ monotone
cost_st = st.sampled_from(ALL)
tok = st.integers(0, 20000)
kvs = st.integers(0, 2_000_000)
seqs = st.integers(1, 512)


@settings(max_examples=200, deadline=None)
@given(cost_st, tok, tok, kvs, seqs)
def test_verify_monotone_in_tokens(c, a, b, k, s):
    lo, hi = sorted((a, b))
    assert c.verify_ms(lo, k, s) <= c.verify_ms(hi, k, s)


@settings(max_examples=200, deadline=None)
@given(cost_st, tok, kvs, kvs, seqs)
def test_verify_monotone_in_kv(c, t, a, b, s):
    lo, hi = sorted((a, b))
    assert c.verify_ms(t, lo, s) <= c.verify_ms(t, hi, s)


@settings(max_examples=200, deadline=None)
@given(cost_st, st.integers(1, 64), st.integers(0, 16000), st.integers(1, 256), st.integers(1, 256))
def test_verify_monotone_in_seqs_with_their_share(c, q, ctx, a, b):
    """Adding sequences that bring their own tokens and context never makes a step cheaper."""
    lo, hi = sorted((a, b))
    assert c.verify_ms(q * lo, ctx * lo, lo) <= c.verify_ms(q * hi, ctx * hi, hi) + 1e-12


@settings(max_examples=200, deadline=None)
@given(cost_st, st.integers(0, 512), st.integers(0, 512), st.integers(0, 16), st.integers(0, 16), kvs)
def test_draft_monotone(c, r1, r2, b1, b2, k):
    (r1, r2), (b1, b2) = sorted((r1, r2)), sorted((b1, b2))
    assert c.draft_ms(r1, b1) <= c.draft_ms(r2, b1) <= c.draft_ms(r2, b2) <= c.draft_ms(r2, b2, k)


@settings(max_examples=200, deadline=None)
@given(cost_st, st.integers(0, 4096), st.integers(0, 4096), st.integers(0, 4096))
def test_small_kernels_monotone(c, a, b, t):
    lo, hi = sorted((a, b))
    assert c.ngram_ms(lo) <= c.ngram_ms(hi)
    assert c.ngram_ms(lo, on_gpu=False) <= c.ngram_ms(hi, on_gpu=False)
    assert c.alloc_ms(lo) <= c.alloc_ms(hi)
    assert c.sample_ms(lo) <= c.sample_ms(hi)
    assert c.cpu_ms(lo, t) <= c.cpu_ms(hi, t)
    assert c.cpu_ms(t, lo) <= c.cpu_ms(t, hi)


@settings(max_examples=50, deadline=None)
@given(cost_st, st.integers(0, 3000), kvs, seqs)
def test_verify_table_matches_verify_ms(c, n, k, s):
    tab = c.verify_table(n, k, s)
    assert tab.shape == (n + 1,)
    ref = np.array([c.verify_ms(t, k, s) for t in range(n + 1)])
    np.testing.assert_allclose(tab, ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(c.verify_ms(np.arange(n + 1), k, s), ref, rtol=1e-12, atol=1e-12)
    assert np.all(np.diff(tab) >= 0)


def test_verify_table_fast_and_fresh():
    c = COSTS[("qwen3-8b", "h100-sxm")]
    a = c.verify_table(1024, 100_000, 64)
    a[5] = -1.0                                  # callers may mutate the table they get
    assert c.verify_table(1024, 100_000, 64)[5] > 0
    t0 = time.perf_counter()
    for i in range(2000):
        c.verify_table(1024, 100_000 + i, 64)
        c.verify_ms(300 + i % 7, 100_000, 64)
    assert time.perf_counter() - t0 < 1.0        # ~10 us per call pair; generous on a loaded CI box


def test_verify_ms_int_fast_path_equals_the_scalar_path():
    """verify_ms(int, int, int) (the engine's per-step call) takes a path without conversions: the same floats as
    the general scalar path (numpy integers take that one), including T <= 0, no context and no sequences."""
    import numpy as np

    from sim.core.cost.roofline import RooflineCost

    c = RooflineCost()
    rng = np.random.default_rng(3)
    for _ in range(20000):
        T, kv, s = int(rng.integers(-2, 9000)), int(rng.integers(-5, 10 ** 8)), int(rng.integers(-1, 600))
        fast, general = c.verify_ms(T, kv, s), c.verify_ms(np.int64(T), np.int64(kv), np.int64(s))
        assert type(fast) is float and np.float64(fast).tobytes() == np.float64(general).tobytes(), (T, kv, s)
