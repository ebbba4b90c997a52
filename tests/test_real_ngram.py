"""The real engine's batched torch n-gram drafter against the simulator's (brute force and precomputed tables)."""
from pathlib import Path

import numpy as np
import pytest
import torch

from sim.core.drafters.ngram_torch import PAD_TOKEN, HistoryBuffer, propose_ngram
from sim.core.drafters.ngram import NgramConfig, ngram_tables, propose_bruteforce
from sim.core.trace.loader import load_trace

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [NgramConfig(), NgramConfig(n_min=1, n_max=3, k=4)]


def _padded(contexts: list[np.ndarray], rng: np.random.Generator, extra: int = 0, vocab: int = 6):
    """[R, L] history with each context left-aligned and random garbage (same vocabulary) past its length."""
    lens = np.array([len(c) for c in contexts], dtype=np.int64)
    L = int(lens.max(initial=0)) + extra
    h = rng.integers(0, vocab, (len(contexts), L))
    for r, c in enumerate(contexts):
        h[r, :len(c)] = c
    return torch.as_tensor(h), torch.as_tensor(lens)


def _check_against_bruteforce(h: torch.Tensor, lens: torch.Tensor, cfg: NgramConfig) -> None:
    p = propose_ngram(h, lens, cfg)
    assert p.tokens.shape == (h.shape[0], cfg.k)
    for r in range(h.shape[0]):
        n, e, prop = propose_bruteforce(h[r, :int(lens[r])].numpy(), cfg)
        got = (int(p.n[r]), int(p.start[r]), int(p.length[r]))
        assert got == (n, e, len(prop)), f"row {r}: {got} != {(n, e, len(prop))}"
        assert p.tokens[r, :len(prop)].tolist() == prop
        assert (p.tokens[r, len(prop):] == PAD_TOKEN).all()


@pytest.mark.parametrize("cfg", CONFIGS, ids=["default", "n1-3k4"])
def test_matches_bruteforce_on_random_batches(cfg):
    rng = np.random.default_rng(7)
    rows = 0
    for _ in range(40):
        vocab = int(rng.integers(3, 7))
        R = int(rng.integers(1, 12))
        contexts = [rng.integers(0, vocab, int(rng.integers(1, 201))) for _ in range(R)]
        h, lens = _padded(contexts, rng, extra=int(rng.integers(0, 8)), vocab=vocab)
        _check_against_bruteforce(h, lens, cfg)
        rows += R
    assert rows >= 200


def test_edge_cases():
    cfg = NgramConfig(n_min=1, n_max=3, k=4)
    rng = np.random.default_rng(0)
    # empty contexts, contexts shorter than n + 1, a repeated token, a copy longer than k
    contexts = [np.array([], dtype=np.int64), np.array([5]), np.array([5, 5]), np.array([1, 2, 1, 2]),
                np.arange(10) % 5, np.array([3] * 20)]
    h, lens = _padded(contexts, rng, extra=3)
    _check_against_bruteforce(h, lens, cfg)
    # no columns at all
    p = propose_ngram(torch.zeros(3, 0, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), cfg)
    assert (p.start == -1).all() and (p.length == 0).all() and (p.tokens == PAD_TOKEN).all()
    # int32 histories give int64 proposals
    p32 = propose_ngram(h.to(torch.int32), lens.to(torch.int32), cfg)
    p64 = propose_ngram(h, lens, cfg)
    assert p32.tokens.dtype == torch.int64 and torch.equal(p32.tokens, p64.tokens)


def test_no_host_sync_meta_device():
    """On the meta device tensors have no values: any host sync or value-dependent shape would fail."""
    cfg = NgramConfig()
    h = torch.empty(5, 300, dtype=torch.int64, device="meta")
    p = propose_ngram(h, torch.empty(5, dtype=torch.int64, device="meta"), cfg)
    assert p.tokens.shape == (5, cfg.k) and p.start.shape == (5,) and p.tokens.device.type == "meta"
    buf = HistoryBuffer(4, 64, device="meta")
    meta = dict(dtype=torch.int64, device="meta")
    buf.append(torch.empty(2, **meta), torch.empty(7, **meta), torch.empty(2, **meta))
    hist, lens = buf.view(torch.empty(3, **meta))
    assert hist.shape == (3, 64) and lens.shape == (3,)


@pytest.fixture
def one_thread():
    """Intra-op threads only slow big CPU passes down when the cores are shared with other test runs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("cfg", CONFIGS, ids=["default", "n1-3k4"])
def test_matches_tables_on_bundled_traces(cfg, one_thread):
    """Every output position of real requests, several requests mixed in each batch: the same proposals
    as the simulator's precomputed tables."""
    reqs = load_trace(ROOT / "traces" / "codeedit.jsonl", limit=6).requests[3:6]
    reqs += load_trace(ROOT / "traces" / "chat.jsonl", limit=4).requests
    want = [ngram_tables(r.tokens(), r.prompt_len, cfg) for r in reqs]
    N = max(r.prompt_len + r.output_len for r in reqs)
    full = np.full((len(reqs), N), 3, dtype=np.int64)  # past each request's end: a common token id
    for q, r in enumerate(reqs):
        full[q, :len(r.tokens())] = r.tokens()
    # (request, output position) pairs interleaved across requests, in batches of mixed lengths
    qs = np.concatenate([np.full(r.output_len, q) for q, r in enumerate(reqs)])
    pos = np.concatenate([np.arange(r.output_len) for r in reqs])
    order = np.random.default_rng(0).permutation(len(qs))
    qs, pos = qs[order], pos[order]
    plen = np.array([r.prompt_len for r in reqs])
    exp = {f: np.concatenate([getattr(w, f) for w in want])[order] for f in ("start", "length", "n")}
    assert (exp["length"] > 0).sum() > 1000  # plenty of matches to compare
    j = np.arange(cfg.k)
    batch = 256
    for b0 in range(0, len(qs), batch):
        sl = slice(b0, b0 + batch)
        t = plen[qs[sl]] + pos[sl]
        W = min(int(t.max()) + 5, N)
        # rows hold the whole request, so the true continuation past t is there too: it must be ignored
        p = propose_ngram(torch.as_tensor(full[qs[sl], :W]), torch.as_tensor(t), cfg)
        for f in ("start", "length", "n"):
            np.testing.assert_array_equal(getattr(p, f).numpy(), exp[f][sl], err_msg=f"batch at {b0}: {f}")
        src = np.clip(exp["start"][sl, None] + j, 0, N - 1)
        exp_tok = np.where(j < exp["length"][sl, None], np.take_along_axis(full[qs[sl]], src, 1), PAD_TOKEN)
        np.testing.assert_array_equal(p.tokens.numpy(), exp_tok, err_msg=f"batch at {b0}: tokens")


def test_history_buffer_round_trip():
    rng = np.random.default_rng(3)
    buf = HistoryBuffer(max_reqs=6, max_len=50)
    ref: dict[int, list[int]] = {}
    for slot in (0, 2, 3, 5):
        prompt = rng.integers(0, 1000, int(rng.integers(1, 20))).tolist()
        buf.reset(slot, np.asarray(prompt))
        ref[slot] = list(prompt)
    for step in range(12):
        slots = rng.permutation(list(ref))[: int(rng.integers(1, 5))]
        counts = rng.integers(0, 4, len(slots))
        flat = rng.integers(0, 1000, int(counts.sum()))
        buf.append(torch.as_tensor(slots), torch.as_tensor(flat), torch.as_tensor(counts))
        o = 0
        for s, c in zip(slots, counts):
            ref[int(s)] += flat[o:o + c].tolist()
            o += c
        if step == 5:  # a slot reused by a new request
            buf.reset(2, [7, 8, 9])
            ref[2] = [7, 8, 9]
        order = list(ref)
        hist, lens = buf.view(order)
        assert hist.shape == (len(order), 50)
        for row, s in enumerate(order):
            want = ref[s][:50]
            assert int(lens[row]) == len(want)
            assert hist[row, :len(want)].tolist() == want
        width = max(len(ref[s]) for s in order)
        h2, l2 = buf.view(torch.tensor(order), width=width)
        assert h2.shape == (len(order), min(width, 50)) and torch.equal(l2, lens)
        # the drafter on the buffer's view sees exactly the contexts
        cfg = NgramConfig(n_min=1, n_max=3, k=4)
        p = propose_ngram(hist, lens, cfg)
        for row, s in enumerate(order):
            n, e, prop = propose_bruteforce(np.asarray(ref[s][:50]), cfg)
            assert (int(p.n[row]), int(p.start[row])) == (n, e) and p.tokens[row, :len(prop)].tolist() == prop


def test_history_buffer_capacity():
    buf = HistoryBuffer(max_reqs=2, max_len=5)
    with pytest.raises(ValueError):
        buf.reset(0, list(range(6)))
    buf.reset(1, [1, 2, 3])
    buf.append([1], [4, 5, 6, 7], [4])  # two tokens past capacity are dropped
    hist, lens = buf.view([1])
    assert lens.tolist() == [5] and hist[0].tolist() == [1, 2, 3, 4, 5]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_same_as_cpu_without_sync():
    """On the GPU: the same proposals as on the CPU, and no host synchronisation (sync debug mode errors)."""
    rng = np.random.default_rng(11)
    contexts = [rng.integers(0, 4, int(rng.integers(1, 300))) for _ in range(24)]
    h, lens = _padded(contexts, rng, extra=9, vocab=4)
    cfg = NgramConfig()
    want = propose_ngram(h, lens, cfg)
    dev = torch.device("cuda")
    hd, ld = h.to(dev), lens.to(dev)
    buf = HistoryBuffer(8, 64, device=dev)
    for s in range(8):
        buf.reset(s, [1, 2, 3])
    slots, flat, counts = (torch.tensor(x, device=dev) for x in ([1, 4, 6], [5, 6, 7, 8], [2, 0, 2]))
    propose_ngram(hd, ld, cfg)  # warm-up (cached constants)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = propose_ngram(hd, ld, cfg)
        buf.append(slots, flat, counts)
        hist, blens = buf.view(slots)
        p_buf = propose_ngram(hist, blens, cfg)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for f in ("start", "length", "n", "tokens"):
        assert torch.equal(getattr(got, f).cpu(), getattr(want, f)), f
    assert blens.tolist() == [5, 3, 5] and hist[:, :5].tolist()[0] == [1, 2, 3, 5, 6]
    assert p_buf.tokens.device.type == "cuda"
