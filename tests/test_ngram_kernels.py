"""The plugin's torch n-gram match (real.vllm_plugin.ngram_kernels) against the simulator's precomputed tables:
every field at every output position, padded entries, tiny contexts, and first_token_hits vs acc_len >= 1."""
import numpy as np
import pytest
import torch

from real.vllm_plugin import ngram_kernels as nk
from real.vllm_plugin.ngram_kernels import PAD_TOKEN, first_token_hits, ngram_match, ngram_match_torch
from sim.core.drafters.ngram import NgramConfig, ngram_tables

# (n_min, n_max, k, ext_max): the default, a tight ext cap, ext_max == n_max, the smallest
CONFIGS = [NgramConfig(), NgramConfig(n_min=1, n_max=3, k=4, ext_max=5), NgramConfig(n_min=3, n_max=3, k=8, ext_max=3),
           NgramConfig(n_min=1, n_max=1, k=1, ext_max=1)]
IDS = ["default", "n1-3k4x5", "n3k8x3", "n1k1x1"]
FIELDS = ("start", "length", "n", "ext", "occ", "in_prompt")


def repetitive(rng: np.random.Generator, N: int, vocab: int) -> np.ndarray:
    """A sequence of N tokens over a small vocabulary built from random runs and copies of earlier spans
    (some with a mutated token), so matches of every n, long extensions and repeated n-grams are common."""
    out = list(rng.integers(0, vocab, int(rng.integers(1, 6))))
    while len(out) < N:
        if rng.random() < 0.5:
            a = int(rng.integers(0, len(out)))
            span = out[a: a + int(rng.integers(1, 40))]
            if rng.random() < 0.3:
                span = list(span)
                span[int(rng.integers(0, len(span)))] = int(rng.integers(0, vocab))
            out += span
        else:
            out += list(rng.integers(0, vocab, int(rng.integers(1, 8))))
    return np.asarray(out[:N], dtype=np.int64)


def _requests(rng: np.random.Generator, R: int) -> list[tuple[np.ndarray, int]]:
    reqs = []
    for _ in range(R):
        N = int(rng.integers(1, 160))
        reqs.append((repetitive(rng, N, int(rng.integers(2, 7))), int(rng.integers(0, N + 1))))
    return reqs


def _buffer(rng, reqs, extra: int, dtype) -> torch.Tensor:
    """[R, stride] history, each request left-aligned, garbage (same small vocabulary) past its end."""
    stride = max(len(s) for s, _ in reqs) + extra
    buf = rng.integers(0, 4, (len(reqs), stride))
    for r, (s, _) in enumerate(reqs):
        buf[r, :len(s)] = s
    return torch.as_tensor(buf).to(dtype)


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_torch_match_equals_tables(cfg):
    rng = np.random.default_rng(11)
    kw = dict(n_min=cfg.n_min, n_max=cfg.n_max, k=cfg.k, ext_max=cfg.ext_max)
    matched = capped = 0
    for it in range(6):
        reqs = _requests(rng, int(rng.integers(1, 7)))
        buf = _buffer(rng, reqs, extra=int(rng.integers(0, 5)), dtype=torch.int32 if it % 2 else torch.int64)
        # one entry per output position of every request, shuffled, with padded entries mixed in
        q = np.concatenate([np.full(len(s) - P, r) for r, (s, P) in enumerate(reqs)] + [np.full(5, -1)])
        pos = np.concatenate([np.arange(len(s) - P) for s, P in reqs] + [np.zeros(5, dtype=np.int64)])
        order = rng.permutation(len(q))
        q, pos = q[order], pos[order]
        plen = np.array([reqs[r][1] if r >= 0 else 0 for r in q])
        tables = [ngram_tables(s, P, cfg) for s, P in reqs]
        m = ngram_match_torch(buf, torch.as_tensor(q), torch.as_tensor(plen + pos), torch.as_tensor(plen), **kw)
        assert m.tokens.shape == (len(q), cfg.k) and m.tokens.dtype == torch.int64
        assert m.in_prompt.dtype == torch.bool and m.start.dtype == torch.int64
        for f in FIELDS:
            want = np.array([getattr(tables[r], f)[i] if r >= 0 else (-1 if f == "start" else 0)
                             for r, i in zip(q, pos)])
            np.testing.assert_array_equal(getattr(m, f).numpy(), want.astype(getattr(m, f).numpy().dtype),
                                          err_msg=f"iteration {it}: {f}")
        j = np.arange(cfg.k)
        start, length = m.start.numpy(), m.length.numpy()
        full = buf.numpy().astype(np.int64)[np.maximum(q, 0)]
        exp_tok = np.where(j < length[:, None],
                           np.take_along_axis(full, np.clip(start[:, None] + j, 0, full.shape[1] - 1), 1), PAD_TOKEN)
        np.testing.assert_array_equal(m.tokens.numpy(), exp_tok, err_msg=f"iteration {it}: tokens")
        matched += int((length > 0).sum())
        capped += int((m.ext.numpy() == cfg.ext_max).sum())
    assert matched > 300
    if cfg.ext_max < 50:
        assert capped > 50  # the cap is exercised


def test_edge_cases():
    kw = dict(n_min=2, n_max=4, k=3, ext_max=6)
    buf = torch.tensor([[1, 2, 1, 2, 1, 2, 9], [7, 7, 7, 7, 7, 7, 7]])
    # ctx 0 and 1, shorter than n_min + 1, exactly n_min + 1, past the row (clamped), padded rows
    rows = torch.tensor([0, 0, 0, 0, 1, -1, -1, 1, 0])
    ctx = torch.tensor([0, 1, 2, 3, 3, 5, 0, 7, 99])
    m = ngram_match_torch(buf, rows, ctx, torch.tensor([0, 0, 0, 0, 1, 0, 0, 1, 0]), **kw)
    assert m.start.tolist() == [-1, -1, -1, -1, 2, -1, -1, 6, -1]
    assert m.n.tolist() == [0, 0, 0, 0, 2, 0, 0, 4, 0]
    assert m.length.tolist() == [0, 0, 0, 0, 1, 0, 0, 1, 0]
    assert m.occ.tolist() == [0, 0, 0, 0, 1, 0, 0, 3, 0]
    assert m.ext.tolist() == [0, 0, 0, 0, 2, 0, 0, 6, 0]
    assert m.in_prompt.tolist() == [False] * 4 + [False, False, False, False, False]
    assert m.tokens[4].tolist() == [7, PAD_TOKEN, PAD_TOKEN] and (m.tokens[:4] == PAD_TOKEN).all()
    # B = 0, no columns, no rows
    for b, rows_, ctx_ in ((buf, torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)),
                           (buf[:, :0], torch.tensor([0, 1]), torch.tensor([0, 0])),
                           (buf[:0], torch.tensor([-1, -1]), torch.tensor([3, 3]))):
        e = ngram_match_torch(b, rows_, ctx_, torch.zeros_like(rows_), **kw)
        B = rows_.shape[0]
        assert e.tokens.shape == (B, 3) and (e.start == -1).all() and (e.length == 0).all() and not e.in_prompt.any()
    h = first_token_hits(buf, torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64),
                         torch.zeros(0, dtype=torch.int64), 4, torch.zeros(0, dtype=torch.int64), n_min=1, n_max=2)
    assert h.shape == (0, 4) and h.dtype == torch.bool
    with pytest.raises(Exception, match="ext_max"):
        ngram_match_torch(buf, rows, ctx, ctx, n_min=2, n_max=4, k=3, ext_max=3)


def test_no_host_sync_meta_device():
    """On the meta device tensors have no values: any host sync or value-dependent shape would fail."""
    meta = dict(dtype=torch.int64, device="meta")
    m = ngram_match(torch.empty(6, 300, dtype=torch.int32, device="meta"), torch.empty(5, **meta),
                    torch.empty(5, **meta), torch.empty(5, **meta), n_min=2, n_max=5, k=7, ext_max=1024)
    assert m.tokens.shape == (5, 7) and m.ext.shape == (5,) and m.in_prompt.device.type == "meta"
    h = first_token_hits(torch.empty(6, 300, **meta), torch.empty(5, **meta), torch.empty(5, **meta),
                         torch.empty(5, **meta), 4, torch.empty(5, **meta), n_min=2, n_max=5)
    assert h.shape == (5, 4) and h.dtype == torch.bool


@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=IDS[:2])
def test_first_token_hits_equals_tables(cfg):
    rng = np.random.default_rng(5)
    kmax = 6
    hits = 0
    for it in range(5):
        reqs = _requests(rng, int(rng.integers(1, 8)))
        buf = _buffer(rng, reqs, extra=int(rng.integers(0, 4)), dtype=torch.int32)
        tables = [ngram_tables(s, P, cfg) for s, P in reqs]
        rows, base, count, want = [], [], [], []
        for r, (s, P) in enumerate(reqs):
            for _ in range(4):
                if len(s) == P:
                    base0, c = P, 0
                else:
                    base0 = int(rng.integers(P, len(s)))
                    c = int(rng.integers(0, min(kmax, len(s) - base0) + 1))
                w = np.zeros(kmax, dtype=bool)
                w[:c] = tables[r].acc_len[base0 - P: base0 - P + c] >= 1
                rows.append(r), base.append(base0), count.append(c), want.append(w)
        rows.append(-1), base.append(0), count.append(3), want.append(np.zeros(kmax, dtype=bool))
        rows, base, count = (torch.as_tensor(np.array(x)) for x in (rows, base, count))
        plen = torch.as_tensor(np.array([reqs[r][1] if r >= 0 else 0 for r in rows.tolist()]))
        got = first_token_hits(buf, rows, base, count, kmax, plen, n_min=cfg.n_min, n_max=cfg.n_max)
        assert got.dtype == torch.bool
        np.testing.assert_array_equal(got.numpy(), np.stack(want), err_msg=f"iteration {it}")
        hits += int(got.sum())
    assert hits > 50


def test_triton_entry_point_without_triton():
    if nk.HAS_TRITON:
        pytest.skip("Triton is importable here: tests/test_vllm_ngram_kernels.py checks the kernels")
    z = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="Triton"):
        nk.ngram_match_triton(torch.zeros(1, 4, dtype=torch.int64), z, z, z, n_min=1, n_max=2, k=2, ext_max=2)
    # the dispatcher falls back to torch
    m = ngram_match(torch.tensor([[1, 1, 1]]), z, z + 3, z, n_min=1, n_max=2, k=2, ext_max=2)
    assert m.start.tolist() == [2] and m.n.tolist() == [2]
