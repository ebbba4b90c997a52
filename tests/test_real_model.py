"""real/engine model side: varlen KV-cached forward == a plain no-cache forward, GGUF loading, errors, SmolLM2."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from real.engine.model import SHORT_QUERY_MAX, ModelArgs, Transformer
from real.engine.weights import build_model, find_smollm2_gguf, load_gguf, random_weights
from sim.infra.errors import ConfigError, HybridSpecError

ROOT = Path(__file__).resolve().parents[1]


def tiny_args(qk_norm: bool, tied: bool = False) -> ModelArgs:
    return ModelArgs(name="tiny-qwen3" if qk_norm else "tiny-llama", num_layers=2, hidden_size=64,
                     intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=512,
                     rope_theta=1e4, rms_eps=1e-6, qk_norm=qk_norm, tied_embeddings=tied, max_seq_len=256)


def tiny_model(args: ModelArgs, max_slots: int = 4, max_len: int = 160):
    """Random weights scaled up from std 0.02 to ~0.2 (and norms away from 1) so that attention is far from
    uniform and a wrong mask, position or slot shows up in the logits."""
    sd = random_weights(args, seed=1, device="cpu", dtype=torch.float32)
    g = torch.Generator().manual_seed(2)
    for k, v in sd.items():
        if k.endswith("norm.weight"):
            v.add_(0.2 * torch.randn(v.shape, generator=g))
        else:
            v.mul_(10.0)
    model = Transformer(args)
    model.load_state_dict(sd)
    model.setup_caches(max_slots, max_len)
    return model.eval(), sd


def reference_logits(sd: dict, a: ModelArgs, tokens: list[int]) -> torch.Tensor:
    """An independent, plain forward of one whole sequence (no cache, explicit softmax): logits [T, V]."""
    T, H, KV, d = len(tokens), a.num_heads, a.num_kv_heads, a.head_dim

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + a.rms_eps) * w

    pos = torch.arange(T, dtype=torch.float64)
    inv = 1.0 / a.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos[:, None] * inv[None]                                     # [T, d/2]
    cos, sin = ang.cos().float()[:, None], ang.sin().float()[:, None]  # [T, 1, d/2]

    def rope(x):  # pairs (i, i + d/2)
        x1, x2 = x[..., :d // 2], x[..., d // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    x = sd["tok_embeddings.weight"][torch.tensor(tokens)]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(a.num_layers):
        p = f"layers.{i}."
        h = norm(x, sd[p + "attention_norm.weight"])
        q, k, v = (h @ sd[p + "attention.wqkv.weight"].T).split([H * d, KV * d, KV * d], -1)
        q, k, v = q.view(T, H, d), k.view(T, KV, d), v.view(T, KV, d)
        if a.qk_norm:
            q, k = norm(q, sd[p + "attention.q_norm.weight"]), norm(k, sd[p + "attention.k_norm.weight"])
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
        att = s.masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + torch.einsum("hqk,khd->qhd", att, v).reshape(T, H * d) @ sd[p + "attention.wo.weight"].T
        h = norm(x, sd[p + "ffn_norm.weight"])
        gate, up = (h @ sd[p + "feed_forward.w13.weight"].T).split(a.intermediate_size, -1)
        x = x + (torch.nn.functional.silu(gate) * up) @ sd[p + "feed_forward.w2.weight"].T
    x = norm(x, sd["norm.weight"])
    return x @ sd["output.weight" if "output.weight" in sd else "tok_embeddings.weight"].T


class Driver:
    """Runs varlen steps on a model and checks every requested row against the reference of its sequence."""

    def __init__(self, model, sd, args, slots):
        self.model, self.sd, self.args, self.slots = model, sd, args, slots
        self.seqs = {r: [] for r in slots}
        self.rng = np.random.default_rng(0)

    def step(self, work: dict, only_last: bool = False):
        """work: request -> (cache_len, number of new tokens). Rolls back to cache_len, appends new random tokens."""
        toks, q_lens, cache_lens, slots, want = [], [], [], [], []
        for r, (clen, n) in work.items():
            assert clen <= len(self.seqs[r])
            new = self.rng.integers(0, self.args.vocab_size, n).tolist()
            self.seqs[r] = self.seqs[r][:clen] + new
            rows = list(range(len(toks), len(toks) + n))
            want += [(r, clen + j, row) for j, row in enumerate(rows)][-1 if only_last else 0:]
            toks += new
            q_lens.append(n), cache_lens.append(clen), slots.append(self.slots[r])
        L = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
        out = self.model(L(toks), L(q_lens), L(cache_lens), L(slots), L([row for _, _, row in want]))
        assert out.shape == (len(want), self.args.vocab_size) and out.dtype == torch.float32
        refs = {r: reference_logits(self.sd, self.args, self.seqs[r]) for r in work}  # one full forward each
        for i, (r, position, _) in enumerate(want):
            torch.testing.assert_close(out[i], refs[r][position], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("qk_norm,tied", [(False, False), (True, False), (False, True)])
def test_varlen_cached_forward_matches_full_forward(qk_norm, tied):
    args = tiny_args(qk_norm, tied)
    model, sd = tiny_model(args)
    drv = Driver(model, sd, args, slots={"a": 2, "b": 0, "c": 3, "d": 1})
    assert 40 > SHORT_QUERY_MAX >= 20
    # prefill chunks: a long query from an empty cache (is_causal path) next to short ones
    drv.step({"a": (0, 40), "b": (0, 10), "c": (0, 5)})
    # a long chunk on top of a cache prefix (explicit mask), short chunks padded together; last rows only
    drv.step({"a": (40, 20), "b": (10, 35), "c": (5, 3)}, only_last=True)
    for _ in range(3):  # decode, one token each
        drv.step({r: (len(s), 1) for r, s in drv.seqs.items()})
    # multi-token verify chunks of different lengths
    drv.step({"a": (len(drv.seqs["a"]), 5), "b": (len(drv.seqs["b"]), 4), "c": (len(drv.seqs["c"]), 6)})
    # rollback: reject some draft tokens (smaller cache_len), re-verify different ones; "b" rolls back fully
    drv.step({"a": (len(drv.seqs["a"]) - 3, 4), "b": (len(drv.seqs["b"]) - 4, 1), "c": (len(drv.seqs["c"]) - 6, 2)})
    # a subset of requests, one with a long query after rollback
    drv.step({"c": (len(drv.seqs["c"]) - 1, 40)})
    # a single short request (its slot sliced, not gathered): decode, then a verify chunk
    drv.step({"b": (len(drv.seqs["b"]), 1)})
    drv.step({"b": (len(drv.seqs["b"]), 7)})
    # decode steps at one context length (SDPA without a mask)
    drv.step({"d": (0, len(drv.seqs["b"]))})
    for _ in range(2):
        drv.step({"b": (len(drv.seqs["b"]), 1), "d": (len(drv.seqs["d"]), 1)})


def test_forward_rejects_batches_that_do_not_fit():
    args = tiny_args(False)
    model, _ = tiny_model(args, max_slots=2, max_len=16)
    L = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    with pytest.raises(ConfigError, match="does not fit"):
        model(L([1] * 4), L([4]), L([14]), L([0]), L([3]))       # 14 + 4 > max_len 16
    with pytest.raises(ConfigError, match="does not fit"):
        model(L([1]), L([1]), L([0]), L([2]), L([0]))            # slot 2 of 2
    with pytest.raises(ConfigError, match="sum"):
        model(L([1, 2]), L([1]), L([0]), L([0]), L([0]))
    with pytest.raises(ConfigError, match="max_seq_len"):
        Transformer(args).setup_caches(1, args.max_seq_len + 1)


def test_model_args_validation_and_from_llm():
    with pytest.raises(ConfigError, match="multiple"):
        tiny_args(False).replace(num_kv_heads=3)
    with pytest.raises(ConfigError, match="positive"):
        tiny_args(False).replace(num_layers=0)
    with pytest.raises(ConfigError, match="qwen3-8b"):  # lists the known names
        ModelArgs.from_llm("no-such-model")
    q = ModelArgs.from_llm("qwen3-8b")
    assert (q.qk_norm, q.rope_theta, q.rms_eps, q.max_seq_len, q.num_heads) == (True, 1e6, 1e-6, 40960, 32)
    l = ModelArgs.from_llm("llama-3.1-8b")
    assert (l.qk_norm, l.rope_theta, l.max_seq_len, l.tied_embeddings) == (False, 5e5, 131072, False)
    s = ModelArgs.from_llm("smollm2-135m")
    assert (s.rope_theta, s.rms_eps, s.max_seq_len, s.tied_embeddings) == (1e5, 1e-5, 8192, True)


def test_random_weights_deterministic_and_build_model_random(tmp_path, monkeypatch):
    a = tiny_args(True)
    w1, w2 = random_weights(a, 7, "cpu", torch.float32), random_weights(a, 7, "cpu", torch.float32)
    w3 = random_weights(a, 8, "cpu", torch.float32)
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert not torch.equal(w1["layers.0.attention.wqkv.weight"], w3["layers.0.attention.wqkv.weight"])
    assert abs(w1["tok_embeddings.weight"].std().item() - 0.02) < 0.002
    # build_model on a models/llms name: a tiny config in a private models dir
    (tmp_path / "llms").mkdir()
    h, I, H, KV, d, V, Lyr = 64, 128, 4, 2, 16, 512, 2
    params = Lyr * (h * H * d + 2 * h * KV * d + H * d * h + 3 * h * I) + V * h
    (tmp_path / "llms" / "qwen3-tiny.json").write_text(json.dumps(dict(
        num_layers=Lyr, hidden_size=h, intermediate_size=I, num_attention_heads=H, num_kv_heads=KV, head_dim=d,
        vocab_size=V, tied_embeddings=True, dtype_bytes=2, num_params=params)))
    monkeypatch.setenv("HYBRIDSPEC_MODELS_DIR", str(tmp_path))
    model, args = build_model("qwen3-tiny", "cpu", max_slots=2, max_len=64, seed=3)
    assert args.qk_norm and args.max_seq_len == 40960 and model.k_cache.shape == (2, 2, 2, 64, 16)
    assert model.k_cache.dtype == torch.float32
    L = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    out = model(L([1, 2, 3]), L([3]), L([0]), L([1]), L([2]))
    assert out.shape == (1, V) and torch.isfinite(out).all()


def test_cuda_without_cuda_is_a_config_error():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ConfigError, match="device 'cuda': torch .* sees no CUDA GPU"):
        build_model("smollm2-135m", device="cuda")


# --------------------------------------------------------------------------------------------- GGUF
def _llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """The row order llama.cpp's converter writes for llama q/k weights (interleaved RoPE pairs)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, arch: str = "llama", seed: int = 0) -> dict:
    """A 1-layer GGUF written with gguf.GGUFWriter in llama.cpp's conventions; returns the HF-layout weights."""
    import gguf

    rng = np.random.default_rng(seed)
    D, I, H, KV, d, V = 64, 96, 4, 2, 16, 128
    r = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    hf = {"emb": r(V, D), "q": r(H * d, D), "k": r(KV * d, D), "v": r(KV * d, D), "o": r(D, H * d),
          "gate": r(I, D), "up": r(I, D), "down": r(D, I), "attn_norm": r(D), "ffn_norm": r(D), "out_norm": r(D),
          "out": r(V, D)}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1), w.add_context_length(512), w.add_embedding_length(D), w.add_feed_forward_length(I)
    w.add_head_count(H), w.add_head_count_kv(KV), w.add_rope_freq_base(1e4), w.add_layer_norm_rms_eps(1e-5)
    q8 = gguf.quants.quantize(hf["emb"], gguf.GGMLQuantizationType.Q8_0)  # one quantised tensor
    hf["emb"] = gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0)  # what a reader can recover
    w.add_tensor("token_embd.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("output.weight", hf["out"])
    w.add_tensor("output_norm.weight", hf["out_norm"])
    w.add_tensor("blk.0.attn_q.weight", _llama_cpp_permute(hf["q"], H))
    w.add_tensor("blk.0.attn_k.weight", _llama_cpp_permute(hf["k"], KV))
    for name, key in [("attn_v", "v"), ("attn_output", "o"), ("ffn_gate", "gate"), ("ffn_up", "up"),
                      ("ffn_down", "down"), ("attn_norm", "attn_norm"), ("ffn_norm", "ffn_norm")]:
        w.add_tensor(f"blk.0.{name}.weight", hf[key])
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return hf


def test_tiny_gguf_round_trip_and_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDSPEC_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    hf = write_tiny_gguf(path)
    args, sd = load_gguf(path)
    assert (args.num_layers, args.hidden_size, args.num_heads, args.num_kv_heads, args.head_dim) == (1, 64, 4, 2, 16)
    assert (args.vocab_size, args.intermediate_size, args.max_seq_len) == (128, 96, 512)
    assert not args.tied_embeddings and not args.qk_norm and args.rope_theta == 1e4
    t = lambda *ks: torch.from_numpy(np.concatenate([hf[k] for k in ks]))  # noqa: E731
    expect = {"tok_embeddings.weight": t("emb"), "output.weight": t("out"), "norm.weight": t("out_norm"),
              "layers.0.attention.wqkv.weight": t("q", "k", "v"), "layers.0.attention.wo.weight": t("o"),
              "layers.0.feed_forward.w13.weight": t("gate", "up"), "layers.0.feed_forward.w2.weight": t("down"),
              "layers.0.attention_norm.weight": t("attn_norm"), "layers.0.ffn_norm.weight": t("ffn_norm")}
    assert set(sd) == set(expect)
    for k in expect:
        torch.testing.assert_close(sd[k], expect[k], rtol=0, atol=0, msg=k)
    cached = list((tmp_path / "cache" / "weights").glob("*.pt"))
    assert len(cached) == 1 and not list((tmp_path / "cache" / "weights").glob("*.tmp"))
    args2, sd2 = load_gguf(path)  # from the cache
    assert args2 == args and all(torch.equal(sd2[k], sd[k]) for k in sd)
    model, a3 = build_model(str(path), "cpu", max_slots=1, max_len=32)
    assert a3 == args and model.max_len == 32


def test_bad_gguf_files_are_config_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDSPEC_CACHE_DIR", str(tmp_path / "cache"))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"definitely not a gguf file" * 100)
    with pytest.raises(ConfigError, match="junk.gguf"):
        load_gguf(junk)
    good = tmp_path / "good.gguf"
    write_tiny_gguf(good)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ConfigError, match="cut.gguf"):
        load_gguf(cut)
    with pytest.raises(ConfigError, match="not found"):
        load_gguf(tmp_path / "absent.gguf")
    other = tmp_path / "gpt2.gguf"
    write_tiny_gguf(other, arch="gpt2")
    with pytest.raises(ConfigError, match="unsupported GGUF architecture 'gpt2'"):
        load_gguf(other)
    assert not list((tmp_path / "cache").rglob("*.pt"))  # nothing cached for failed loads


def test_find_gguf_errors(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="not found"):
        find_smollm2_gguf(tmp_path / "nope.gguf")
    monkeypatch.setenv("HYBRIDSPEC_SMOLLM2_GGUF", str(tmp_path / "nope.gguf"))
    with pytest.raises(HybridSpecError, match="nope.gguf"):
        find_smollm2_gguf()


# --------------------------------------------------------------------------------------------- SmolLM2 (slow)
def _smollm2_or_skip() -> Path:
    try:
        return find_smollm2_gguf()
    except ConfigError as e:
        pytest.skip(str(e))


@pytest.mark.slow
def test_smollm2_greedy_answers_paris():
    from sim.core.trace.smollm2_tokenizer import SmolTokenizer

    _smollm2_or_skip()
    tok = SmolTokenizer.from_gguf()
    model, args = build_model("smollm2-135m-gguf", "cpu", max_slots=1, max_len=256)
    assert (args.num_layers, args.vocab_size, args.tied_embeddings, args.max_seq_len) == (30, 49152, True, 8192)
    ids = tok.encode("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    L = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    out, cur, clen = [], ids, 0
    for _ in range(20):
        nxt = int(model(L(cur), L([len(cur)]), L([clen]), L([0]), L([len(cur) - 1]))[0].argmax())
        clen += len(cur)
        if nxt == tok.eos_id:
            break
        out.append(nxt)
        cur = [nxt]
    assert "Paris" in tok.decode(out), tok.decode(out)


@pytest.mark.slow
def test_smollm2_tokenizer_round_trip_on_traces():
    from sim.core.trace.smollm2_tokenizer import SmolTokenizer

    _smollm2_or_skip()
    tok = SmolTokenizer.from_gguf()
    ids = tok.encode("<|im_start|>user\n")
    assert ids[0] == tok._tok.token_to_id("<|im_start|>") and tok.decode(ids[:1]) == "<|im_start|>"
    assert tok.eos_id == tok._tok.token_to_id("<|im_end|>")
    for trace in ("chat.jsonl", "codeedit.jsonl"):
        with open(ROOT / "traces" / trace) as f:
            rows = [json.loads(line) for _, line in zip(range(20), f)]
        for row in rows:
            for text in (row["prompt"], row["output"]):
                assert tok.decode(tok.encode(text)) == text
        assert all(tok.encode(row["prompt"]).count(tok.bos_id) >= 1 for row in rows)  # markers are single ids
