"""The plugin's cheap step: observe + propose compiled into a few fused kernels (HybridDrafter(compiled=True)), with
outputs bit-identical to the eager step, and the fusable forms the policy functions take while compiling
(sim.core.policies.common.prefix_sum / prefix_product / count_above) equal to the scans and binary search they replace.
The compiled checks take minutes on a loaded CPU: `python -m pytest -m slow tests/test_vllm_plugin_fused.py`."""
from pathlib import Path

import pytest
import torch

from sim.core.drafters.ngram_torch import propose_ngram
from real.vllm_plugin import checks
from sim.core.drafters.ngram import NgramConfig
from sim.core.policies import common

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_unrolled_scans_equal_cpu_cumsum_and_cumprod_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.rand(3, 50, 33, generator=g).to(dtype)
    assert torch.equal(common._unrolled_scan(x, torch.add), torch.cumsum(x, -1))
    assert torch.equal(common._unrolled_scan(x, torch.mul), torch.cumprod(x, -1))
    # and a float32 sum accumulated in float32 would differ: the test can fail
    acc = x[..., 0].clone()
    for j in range(1, 33):
        acc = acc + x[..., j]
    assert dtype == torch.float64 or not torch.equal(acc, torch.cumsum(x, -1)[..., -1])


def test_the_compare_and_sum_count_equals_searchsorted_on_survival_rows():
    g = torch.Generator().manual_seed(2)
    conf = torch.rand(2, 40, 9, generator=g)
    conf[0, :5] = 1.0  # ties: survival 1 repeated
    length = torch.randint(0, 10, (2, 40), generator=g)
    neg = -common.survival(conf, length)
    lam = torch.cat([torch.rand(2, 40, 30, generator=g), -neg[..., :3], torch.zeros(2, 40, 1)], -1)
    assert torch.equal(common._count_below(neg, -lam), torch.searchsorted(neg, (-lam).contiguous()))


def test_ext_is_the_leading_run_of_matches():
    """propose_ngram's ext (now a first-mismatch reduction) against a direct count on random repetitive rows."""
    g = torch.Generator().manual_seed(3)
    hist = torch.randint(0, 3, (64, 80), generator=g)
    t = torch.randint(0, 81, (64,), generator=g)
    p = propose_ngram(hist, t, NgramConfig(n_min=1, n_max=3, k=5, ext_max=40), features=True)
    for r in range(64):
        e, tt, want = int(p.start[r]), int(t[r]), 0
        while e >= 0 and want < 40 and e - 1 - want >= 0 and hist[r, tt - 1 - want] == hist[r, e - 1 - want]:
            want += 1
        assert int(p.ext[r]) == want, r


@pytest.mark.slow
@pytest.mark.parametrize("R,k,block,source", [(4, 7, 7, "random"), (40, 7, 7, "codeedit"), (3, 16, 7, "codeedit")])
def test_the_compiled_step_launches_at_most_8_kernels_and_equals_the_eager_step(R, k, block, source):
    """On the CPU a compiled half is one generated kernel (its loop nests run back to back inside it): observe +
    propose launch 2 kernels, no fallback op; every output and state buffer equals the eager step's, bit for bit,
    over several steps. R = 4 takes the exact price sweep, R = 40 the two-stage grid; W = 16 pads DSpark's block."""
    hist = None if source == "random" else checks.trace_histories(ROOT / "traces" / f"{source}.jsonl", 64, 512)
    a = checks.count_compiled_kernels(R, k=k, block=block, histories=hist, steps=3)
    assert a["observe"] + a["propose"] <= 8, a["launches"]
    assert all(n.startswith("cpp_fused") for half in a["launches"].values() for n in half), a["launches"]
    for s, (want, got) in enumerate(zip(a["eager"], a["compiled"])):
        for i, (w, g) in enumerate(zip(want, got)):
            assert w.dtype == g.dtype and torch.equal(w, g), (s, i, w, g)


@pytest.mark.slow
def test_the_compiled_step_with_online_recalibration_still_fuses_and_equals_the_eager_step():
    """runcal's grading (the first miss as an argmax) and its offsets fuse too: observe + propose stay generated
    kernels only, at most 8 launches, every output and state buffer (the offsets and precisions included) equal to
    the eager step's over several steps."""
    from real.vllm_plugin.config import HybridSpecConfig

    hist = checks.trace_histories(ROOT / "traces" / "codeedit.jsonl", 64, 512)
    a = checks.count_compiled_kernels(4, k=7, block=7, histories=hist, steps=3, cfg=HybridSpecConfig(runcal=64))
    assert a["observe"] + a["propose"] <= 8, a["launches"]
    assert all(n.startswith("cpp_fused") for half in a["launches"].values() for n in half), a["launches"]
    for s, (want, got) in enumerate(zip(a["eager"], a["compiled"])):
        for i, (w, g) in enumerate(zip(want, got)):
            assert w.dtype == g.dtype and torch.equal(w, g), (s, i, w, g)
