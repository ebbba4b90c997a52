"""A gpt-fast-style decoder in plain PyTorch (Llama family and Qwen3) with a per-slot KV cache and a
varlen forward over a flat packed batch of requests.

    args = ModelArgs.from_llm("qwen3-8b")
    model = Transformer(args); model.setup_caches(max_slots=8, max_len=4096, device=..., dtype=...)
    logits = model(tokens[N], q_lens[R], cache_lens[R], slots[R], logit_idx[M])      # [M, vocab] fp32

Request r contributes q_lens[r] consecutive tokens of `tokens`; they sit at positions cache_lens[r] + 0..q_lens[r]-1
of KV slot slots[r], their K/V are written there, and each attends causally to its slot's cache [0, its position].
Rolling back rejected draft tokens needs nothing: the caller passes a smaller cache_len next time and the stale
entries are overwritten. Shapes: N flat tokens, R requests, M logit rows, D hidden size, H / KV query / key-value
heads, d head_dim, V vocab size.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from sim.infra.errors import ConfigError

# A query of at most this many tokens (decode, draft verification) joins the padded batched attention call;
# longer ones (prefill chunks) get their own SDPA call, where padding them to a common length would waste work.
SHORT_QUERY_MAX = 32

# Per-family constants that models/llms/*.json does not carry (it describes only the shapes the simulator needs).
# llama-3.1 uses plain RoPE with theta 5e5 here: its "llama3" frequency scaling only changes positions beyond the
# original 8192-token window, so contexts past 8K are approximate (irrelevant for random weights).
_FAMILY_DEFAULTS = {
    "qwen3": dict(rope_theta=1e6, rms_eps=1e-6, qk_norm=True, max_seq_len=40960),
    "llama-3": dict(rope_theta=5e5, rms_eps=1e-5, qk_norm=False, max_seq_len=131072),
    "smollm2": dict(rope_theta=1e5, rms_eps=1e-5, qk_norm=False, max_seq_len=8192),
}


@dataclass(frozen=True)
class ModelArgs:
    """Hyper-parameters of a dense Llama/Qwen3 decoder. rope_theta is the RoPE base; rms_eps the RMSNorm epsilon;
    qk_norm adds Qwen3's per-head RMSNorm on q and k; max_seq_len is the longest context the model supports
    (callers must refuse longer ones)."""

    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float
    rms_eps: float
    qk_norm: bool
    tied_embeddings: bool
    max_seq_len: int

    def __post_init__(self) -> None:
        for f in ("num_layers", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim",
                  "vocab_size", "max_seq_len"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"model '{self.name}': {f} must be a positive integer, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"model '{self.name}': num_heads ({self.num_heads}) must be a multiple of "
                              f"num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"model '{self.name}': head_dim must be even for RoPE, got {self.head_dim}")
        if not (self.rope_theta > 0 and 0 < self.rms_eps < 1):
            raise ConfigError(f"model '{self.name}': need rope_theta > 0 and 0 < rms_eps < 1, "
                              f"got {self.rope_theta!r}, {self.rms_eps!r}")

    @classmethod
    def from_llm(cls, name: str) -> "ModelArgs":
        """Shapes from models/llms/<name>.json (via sim.core.models.get_llm, which lists the known names if `name` is
        unknown) plus the family constants above, chosen by the name's prefix."""
        from sim.core.models import get_llm

        spec = get_llm(name)
        family = next((f for f in _FAMILY_DEFAULTS if spec.name.startswith(f)), None)
        if family is None:
            raise ConfigError(f"model '{spec.name}': unknown architecture family (RoPE base, norm epsilon); "
                              f"names must start with one of: {', '.join(_FAMILY_DEFAULTS)}")
        return cls(name=spec.name, num_layers=spec.num_layers, hidden_size=spec.hidden_size,
                   intermediate_size=spec.intermediate_size, num_heads=spec.num_attention_heads,
                   num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, vocab_size=spec.vocab_size,
                   tied_embeddings=spec.tied_embeddings, **_FAMILY_DEFAULTS[family])

    def replace(self, **kw) -> "ModelArgs":
        return dataclasses.replace(self, **kw)


# --------------------------------------------------------------------------------------------- layers
class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight over the last dim, computed in fp32 (bf16 squares lose precision)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in the HF "rotate half" layout: x [N, heads, d]; cos, sin [N, 1, d] fp32 (the d/2
    frequencies repeated twice). Computed in fp32, returned in x's dtype."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (xf * cos + rotated * sin).type_as(x)


class Attention(nn.Module):
    """GQA self-attention with fused q/k/v projection (one GEMM), optional Qwen3 per-head q/k RMSNorm."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        H, KV, d, D = args.num_heads, args.num_kv_heads, args.head_dim, args.hidden_size
        self.H, self.KV, self.d = H, KV, d
        self.wqkv = nn.Linear(D, (H + 2 * KV) * d, bias=False)  # rows: q (H*d), k (KV*d), v (KV*d)
        self.wo = nn.Linear(H * d, D, bias=False)
        self.q_norm = RMSNorm(d, args.rms_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(d, args.rms_eps) if args.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, plan: "_Plan") -> torch.Tensor:
        """x [N, D] -> [N, D]; writes this layer's K/V into k_cache, v_cache [slots, KV, max_len, d]."""
        N, H, KV = x.shape[0], self.H, self.KV
        qkv = self.wqkv(x).view(N, H + 2 * KV, self.d)
        v = qkv[:, H + KV:]
        if self.q_norm is not None:
            qk = torch.cat([self.q_norm(qkv[:, :H]), self.k_norm(qkv[:, H:H + KV])], dim=1)
        else:
            qk = qkv[:, :H + KV]
        qk = apply_rope(qk, cos, sin)  # q and k heads in one call: half the small ops of a decode step
        q, k = qk[:, :H], qk[:, H:]
        # Two advanced indices separated by a slice: the indexed view is [N, KV, d], matching k and v.
        k_cache[plan.tok_slot, :, plan.tok_pos] = k
        v_cache[plan.tok_slot, :, plan.tok_pos] = v
        out = None if plan.short is not None and plan.short.gather is None else q.new_empty(N, self.H, self.d)
        if plan.short is not None:
            s = plan.short
            qs = q if s.gather is None else q[s.gather]
            qs = qs.view(s.R, s.Qmax, self.H, self.d).transpose(1, 2)              # [Rs, H, Qmax, d]
            if s.slot is not None:  # one request: a view of its slot, no gather copy
                ks, vs = k_cache[s.slot:s.slot + 1, :, :s.Kmax], v_cache[s.slot:s.slot + 1, :, :s.Kmax]
            else:
                ks, vs = k_cache[s.slots, :, :s.Kmax], v_cache[s.slots, :, :s.Kmax]  # [Rs, KV, Kmax, d]
            ys = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=s.mask, enable_gqa=True)
            ys = ys.transpose(1, 2).reshape(s.R * s.Qmax, self.H, self.d)
            if s.gather is None:
                out = ys
            else:
                out[s.rows] = ys[s.valid]
        for start, qlen, slot, clen in plan.long:
            ql = q[start:start + qlen].transpose(0, 1).unsqueeze(0)                # [1, H, L, d]
            kl = k_cache[slot, :, :clen + qlen].unsqueeze(0)                        # [1, KV, T, d] (a view)
            vl = v_cache[slot, :, :clen + qlen].unsqueeze(0)
            if clen == 0:  # SDPA's is_causal is top-left aligned, right only when the query starts the context
                yl = F.scaled_dot_product_attention(ql, kl, vl, is_causal=True, enable_gqa=True)
            else:          # query i sits at position clen + i and sees keys [0, clen + i]
                mask = torch.ones(qlen, clen + qlen, dtype=torch.bool, device=x.device).tril(clen)
                yl = F.scaled_dot_product_attention(ql, kl, vl, attn_mask=mask, enable_gqa=True)
            out[start:start + qlen] = yl[0].transpose(0, 1)
        return self.wo(out.view(N, self.H * self.d))


class FeedForward(nn.Module):
    """SwiGLU MLP: w2(silu(gate) * up), with gate and up fused into one GEMM (w13 rows: gate, then up)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.I = args.intermediate_size
        self.w13 = nn.Linear(args.hidden_size, 2 * args.intermediate_size, bias=False)
        self.w2 = nn.Linear(args.intermediate_size, args.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).split(self.I, dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention_norm = RMSNorm(args.hidden_size, args.rms_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.hidden_size, args.rms_eps)
        self.feed_forward = FeedForward(args)

    def forward(self, x, cos, sin, k_cache, v_cache, plan):
        x = x + self.attention(self.attention_norm(x), cos, sin, k_cache, v_cache, plan)
        return x + self.feed_forward(self.ffn_norm(x))


# --------------------------------------------------------------------------------------------- varlen plan
@dataclass
class _Short:
    """The padded batch of short queries: Rs requests padded to Qmax query rows and Kmax cached positions."""
    R: int
    Qmax: int
    Kmax: int
    slots: torch.Tensor          # [Rs] KV slot of each request
    slot: int | None             # the slot when Rs == 1 (sliced as a view instead of gathered)
    gather: torch.Tensor | None  # [Rs*Qmax] flat token row of each padded query row (row 0 for padding);
                                 # None when the batch is all short queries of one length (no padding at all)
    valid: torch.Tensor | None   # [n] indices into the Rs*Qmax padded rows that are real tokens
    rows: torch.Tensor | None    # [n] their flat token rows
    mask: torch.Tensor | None    # [Rs, 1, Qmax, Kmax] bool: key j visible to padded query row i; None when
                                 # every row sees all Kmax keys (decode steps at one context length)


@dataclass
class _Plan:
    """Per-forward indexing shared by all layers (built once, so each layer does no host work)."""
    tok_slot: torch.Tensor   # [N] slot of each flat token
    tok_pos: torch.Tensor    # [N] position of each flat token
    short: _Short | None
    long: list               # [(start row, q_len, slot, cache_len)] python ints, one SDPA call each


def _make_plan(q_lens: torch.Tensor, cache_lens: torch.Tensor, slots: torch.Tensor, N: int, max_slots: int,
               max_len: int) -> _Plan:
    """Index tensors for one varlen forward. Needs one host sync (q_lens, cache_lens, slots to Python) to size
    the padding and split short from long queries; that is the only sync of the forward."""
    dev = q_lens.device
    ql, cl, sl = q_lens.tolist(), cache_lens.tolist(), slots.tolist()
    if sum(ql) != N or len(cl) != len(ql) or len(sl) != len(ql):
        raise ConfigError(f"varlen batch: sum(q_lens)={sum(ql)} must equal len(tokens)={N}, and q_lens, "
                          f"cache_lens, slots need one entry per request ({len(ql)}, {len(cl)}, {len(sl)})")
    for q, c, s in zip(ql, cl, sl):
        if q <= 0 or c < 0 or c + q > max_len or not 0 <= s < max_slots:
            raise ConfigError(f"varlen batch: request with q_len {q}, cache_len {c}, slot {s} does not fit the KV "
                              f"cache (q_len >= 1, cache_len + q_len <= {max_len}, 0 <= slot < {max_slots})")
    R = len(ql)
    req = torch.repeat_interleave(torch.arange(R, device=dev), q_lens, output_size=N)
    starts = torch.cumsum(q_lens, 0) - q_lens
    tok_pos = cache_lens[req] + torch.arange(N, device=dev) - starts[req]
    tok_slot = slots[req]

    start_py = [0] * R
    for r in range(1, R):
        start_py[r] = start_py[r - 1] + ql[r - 1]
    short_r = [r for r in range(R) if ql[r] <= SHORT_QUERY_MAX]
    long = [(start_py[r], ql[r], sl[r], cl[r]) for r in range(R) if ql[r] > SHORT_QUERY_MAX]
    short = None
    if short_r:
        Rs, Qmax = len(short_r), max(ql[r] for r in short_r)
        Kmax = max(cl[r] + ql[r] for r in short_r)
        gather, valid, rows = [], [], []
        for i, r in enumerate(short_r):
            for j in range(Qmax):
                if j < ql[r]:
                    gather.append(start_py[r] + j)
                    valid.append(i * Qmax + j)
                    rows.append(start_py[r] + j)
                else:
                    gather.append(0)
        as_t = lambda v: torch.tensor(v, dtype=torch.long, device=dev)  # noqa: E731
        if Qmax == 1 and all(cl[r] + 1 == Kmax for r in short_r):
            mask = None  # lets SDPA take its unmasked fast path
        else:
            qpos = as_t([cl[r] for r in short_r])[:, None] + torch.arange(Qmax, device=dev)
            # padding rows see keys up to cache_len + row: finite (zero or stale) entries, results discarded
            mask = (torch.arange(Kmax, device=dev)[None, None, :] <= qpos[:, :, None]).unsqueeze(1)
        if not long and len(valid) == Rs * Qmax:  # flat rows are already [Rs, Qmax] in order
            gather = valid = rows = None
        else:
            gather, valid, rows = as_t(gather), as_t(valid), as_t(rows)
        short = _Short(Rs, Qmax, Kmax, as_t([sl[r] for r in short_r]), sl[short_r[0]] if Rs == 1 else None,
                       gather, valid, rows, mask)
    return _Plan(tok_slot, tok_pos, short, long)


# --------------------------------------------------------------------------------------------- model
class Transformer(nn.Module):
    """Embedding -> num_layers x Block -> RMSNorm -> LM head (tied to the embedding or its own weight).

    Call setup_caches() before forward(); the KV cache and RoPE tables are allocated once there."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(Block(args) for _ in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_eps)
        self.output = None if args.tied_embeddings else nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.max_slots = self.max_len = 0

    def setup_caches(self, max_slots: int, max_len: int, device: torch.device | str | None = None,
                     dtype: torch.dtype | None = None) -> None:
        """Allocate the KV cache k, v [num_layers, max_slots, num_kv_heads, max_len, head_dim] (model dtype, on
        the model's device unless given) and the RoPE tables [max_len, head_dim] fp32. max_len tokens per slot."""
        a = self.args
        if not (isinstance(max_slots, int) and max_slots > 0 and isinstance(max_len, int) and max_len > 0):
            raise ConfigError(f"KV cache: max_slots and max_len must be positive integers, got {max_slots!r}, "
                              f"{max_len!r}")
        if max_len > a.max_seq_len:
            raise ConfigError(f"KV cache: max_len {max_len} exceeds model '{a.name}' max_seq_len {a.max_seq_len}")
        p = self.tok_embeddings.weight
        device = torch.device(device) if device is not None else p.device
        dtype = dtype or p.dtype
        shape = (a.num_layers, max_slots, a.num_kv_heads, max_len, a.head_dim)
        # zeros, not empty: padded query rows of the short batch read unwritten entries, which must be finite
        self.register_buffer("k_cache", torch.zeros(shape, device=device, dtype=dtype), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, device=device, dtype=dtype), persistent=False)
        inv_freq = 1.0 / (a.rope_theta ** (torch.arange(0, a.head_dim, 2, device=device, dtype=torch.float64)
                                           / a.head_dim))
        ang = torch.arange(max_len, device=device, dtype=torch.float64)[:, None] * inv_freq[None, :]
        ang = torch.cat((ang, ang), dim=-1)  # rotate-half layout: frequency i on dims i and i + d/2
        self.register_buffer("rope_cos", ang.cos().float(), persistent=False)
        self.register_buffer("rope_sin", ang.sin().float(), persistent=False)
        self.max_slots, self.max_len = max_slots, max_len

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, q_lens: torch.Tensor, cache_lens: torch.Tensor, slots: torch.Tensor,
                logit_idx: torch.Tensor, hidden_layers: tuple[int, ...] = ()):
        """Varlen forward of a flat packed batch.

        tokens [N] int64 token ids, requests' tokens concatenated in order r = 0..R-1
        q_lens [R] int64 tokens of request r in this forward (>= 1)
        cache_lens [R] int64 tokens already in request r's slot (its first token's position)
        slots [R] int64 KV slot of request r (distinct per request)
        logit_idx [M] int64 flat rows whose logits are wanted (e.g. a prefill chunk's last row only)
        hidden_layers: layer indices whose outputs (the residual stream after that block) are also returned
        returns [M, vocab_size] fp32 logits; with hidden_layers, (logits, feats [N, len(hidden_layers) *
        hidden_size] in the model dtype): the drafter's conditioning (real/drafter/model.py).
        """
        if self.max_len == 0:
            raise ConfigError("Transformer.forward: call setup_caches(max_slots, max_len) first")
        N = tokens.shape[0]
        plan = _make_plan(q_lens, cache_lens, slots, N, self.max_slots, self.max_len)
        cos = self.rope_cos[plan.tok_pos].unsqueeze(1)  # [N, 1, d]
        sin = self.rope_sin[plan.tok_pos].unsqueeze(1)
        x = self.tok_embeddings(tokens)
        feats = []
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, self.k_cache[i], self.v_cache[i], plan)
            if i in hidden_layers:
                feats.append(x)
        # Norm and LM head only on the wanted rows: the head (vocab x hidden) is the largest GEMM of a step.
        x = self.norm(x[logit_idx])
        w = self.tok_embeddings.weight if self.output is None else self.output.weight
        logits = F.linear(x, w).float()
        if hidden_layers:
            if len(feats) != len(hidden_layers):
                raise ConfigError(f"hidden_layers {hidden_layers} must be distinct layers in 0..{len(self.layers) - 1}")
            return logits, torch.cat(feats, dim=-1)
        return logits


__all__ = ["ModelArgs", "Transformer", "SHORT_QUERY_MAX", "apply_rope"]
