"""A DSpark-style block drafter for a real target: a parallel one-layer backbone on the target's hidden states,
a sequential low-rank Markov head, and a confidence head with per-position sequential temperature scaling.

Notation. The target has run tokens t_0 .. t_{a-1} and emitted t_a (the bonus token, not yet run). h_j is the
concatenation of the outputs of the conditioning layers (`layers`) at position j, D = the target's hidden size.
The drafter proposes the next K tokens x_0 .. x_{K-1} (for positions a+1 .. a+K) in one pass:

  context     c_j = RMSNorm(W_f [N_1 h_j^1 ; ... ; N_L h_j^L ; N_E E[t_{j+1}]])   for j <= a-1, at RoPE position j+1
              (N: an RMSNorm per layer's block: the target's residual stream has outlier dimensions of
              1e3-1e4 that would otherwise drown the token embedding, whose RMS is ~0.1)
              (E is the target's own embedding, shared, not stored; c_j carries the token that followed j, so a
              query can find where the current token occurred before: the copy mechanism of code editing)
  block       z_k = c_{a-1} + P_k                                for k = 0..K-1, at RoPE position a+1+k
  backbone    one pre-norm transformer layer: block queries attend to every c_j (j <= a-1) and to the whole
              block (bidirectional inside it), then a SwiGLU MLP: u_k = Layer(z)_k        [D]
  base logits b_k = E_V RMSNorm(u_k)                             over a reduced vocabulary V (rows of the
              target's tied LM head, selected by `vocab_ids`; nothing stored twice)
  Markov head l_k = b_k + W2^T W1[x_{k-1}],  x_{-1} = t_a,  W1: [|V|+1, r], W2: [r, |V|]   (low rank r)
              x_k = argmax l_k (temperature 0): the only sequential part, K tiny GEMVs
  confidence  c_k = sigmoid(w . [u_k ; W1[x_{k-1}] ; log max softmax(l_k)] + b): P(x_k accepted | x_<k
              accepted); trained on the hard agreement 1{x_k = target's greedy token} at temperature 0
  STS         survival s_k = prod_{l<=k} c_l is rescaled per position, s'_k = sigmoid(logit(s_k) / T_k) with
              T_k fitted on held-out general text; the calibrated conditional confidence handed to the
              policies is c'_k = min(1, s'_k / s'_{k-1}) (s'_{-1} = 1), so prod c' = s' (clipped monotone).
Causality: the block for anchor a reads c_j only for j <= a-1, which depend on t_0..t_a: never on a token after
the anchor (tests/test_drafter.py checks this by perturbing later tokens).
Tokens outside V map to the index |V| (an "other" row of W1); the drafter never proposes them.

Units: logits in nats; confidences and survivals are probabilities in [0, 1].
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from sim.infra.errors import ConfigError
from real.drafter.draft_out import DraftOut
from real.drafter.target_tied import TargetTied, check_config
from real.engine.model import RMSNorm, apply_rope
from real.engine.weights import file_sha256
from sim.infra import paths

REPO = paths.REPO
DRAFTERS_DIR = REPO / "models" / "drafters"
DEFAULT_DRAFTER = DRAFTERS_DIR / "dspark-smollm2-135m-b7.pt"   # this module's architecture (reports/drafter.md)
# the trained drafter in vLLM's architecture (real/drafter/qwen3_dspark.py): the engines' default, since it has
# the higher tau and exports to vLLM (docs/drafter.md)
ENGINE_DRAFTER = DRAFTERS_DIR / "dspark-v-smollm2-135m-b7.pt"
FORMAT = "hybridspec-drafter-1"


@dataclass(frozen=True)
class DrafterConfig:
    target: str = "smollm2-135m"          # models/llms name of the target it was trained on
    target_sha256: str = ""               # the target's weights file (GGUF) it was trained on
    target_vocab: int = 49152
    hidden: int = 576                     # the target's hidden size D
    layers: tuple[int, ...] = (3, 15, 29)  # conditioning layers of the target (0-based, ascending)
    block: int = 7                        # K: tokens proposed per pass
    heads: int = 9
    kv_heads: int = 3
    head_dim: int = 64
    intermediate: int = 1536
    vocab: int = 8192                     # |V|: the reduced output vocabulary
    rank: int = 128                       # r: the Markov head's rank
    rope_theta: float = 100000.0
    rms_eps: float = 1e-5

    def validate(self) -> None:
        check_config(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DrafterConfig":
        known = {f for f in cls.__dataclass_fields__}
        extra = set(d) - known
        if extra:
            raise ConfigError(f"drafter config: unknown field(s) {sorted(extra)}")
        d = dict(d)
        if "layers" in d:
            d["layers"] = tuple(d["layers"])
        cfg = cls(**d)
        cfg.validate()
        return cfg


class DSparkDrafter(TargetTied, nn.Module):
    """The drafter (module docstring). Call attach_target(embedding) before use: it borrows the target's embedding
    for E and the LM-head rows of the reduced vocabulary."""

    FORMAT = FORMAT
    ctx_pos_offset = 1  # context entry j sits at RoPE position j + 1 (module docstring)

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        D, H, KV, hd, K = cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.block
        self.feat_norms = nn.ModuleList(RMSNorm(D, cfg.rms_eps) for _ in range(len(cfg.layers) + 1))
        self.fuse = nn.Linear((len(cfg.layers) + 1) * D, D, bias=False)
        self.fuse_norm = RMSNorm(D, cfg.rms_eps)
        self.pos = nn.Parameter(torch.zeros(K, D))
        self.attn_norm = RMSNorm(D, cfg.rms_eps)
        self.wq = nn.Linear(D, H * hd, bias=False)
        self.wkv = nn.Linear(D, 2 * KV * hd, bias=False)
        self.wo = nn.Linear(H * hd, D, bias=False)
        self.ffn_norm = RMSNorm(D, cfg.rms_eps)
        self.w13 = nn.Linear(D, 2 * cfg.intermediate, bias=False)
        self.w2 = nn.Linear(cfg.intermediate, D, bias=False)
        self.norm = RMSNorm(D, cfg.rms_eps)
        self.markov_in = nn.Embedding(cfg.vocab + 1, cfg.rank)
        self.markov_out = nn.Linear(cfg.rank, cfg.vocab, bias=False)
        self.conf = nn.Linear(D + cfg.rank + 1, 1)
        self.register_buffer("vocab_ids", torch.zeros(cfg.vocab, dtype=torch.int64))
        self.register_buffer("sts_temp", torch.ones(K))
        # non-persistent: derived from vocab_ids and the target's embedding at attach time
        self.register_buffer("to_reduced", torch.full((cfg.target_vocab,), cfg.vocab, dtype=torch.int64),
                             persistent=False)
        self.embed: torch.Tensor | None = None
        self.head: torch.Tensor | None = None
        self._rope_cache: tuple[int, torch.Tensor, torch.Tensor] | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for m in (self.fuse, self.wq, self.wkv, self.wo, self.w13, self.w2):
            nn.init.normal_(m.weight, std=0.02)
        nn.init.normal_(self.markov_in.weight, std=0.02)
        nn.init.zeros_(self.markov_out.weight)  # starts as the backbone alone
        nn.init.normal_(self.pos, std=0.02)
        nn.init.zeros_(self.conf.weight)
        nn.init.zeros_(self.conf.bias)

    # ------------------------------------------------------------------------------------------ setup
    @property
    def kv_entry_shape(self) -> tuple[int, ...]:
        """Shape of one context position's cached keys (and values): [KV, hd]."""
        return (self.cfg.kv_heads, self.cfg.head_dim)

    def init_from_target(self, target) -> None:
        """Training start: the output norm takes the target's final-norm weight, so that the shared LM head sees
        activations at the scale it was trained for (a cold random scale starts the loss far from chance)."""
        with torch.no_grad():
            # scaled down: a cold backbone's random direction through the full-scale head gives logits of
            # std ~6 and a starting loss near 18 nats (measured), most of the first epoch spent shrinking them
            self.norm.weight.copy_(0.25 * target.norm.weight.to(self.norm.weight))

    # ------------------------------------------------------------------------------------------ pieces
    def context(self, feats: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """c_j (module docstring): feats [..., L*D] (any float dtype), next_tokens [...] -> [..., D]."""
        if self.embed is None:
            raise ConfigError("drafter: attach_target(embedding) first")
        parts = list(feats.to(self.fuse.weight.dtype).split(self.cfg.hidden, dim=-1)) + [self.embed[next_tokens]]
        x = torch.cat([n(p) for n, p in zip(self.feat_norms, parts)], dim=-1)
        return self.fuse_norm(self.fuse(x))

    def context_kv(self, c: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (RoPE at `pos`) and values of context vectors c [..., D] -> [..., KV, hd] each."""
        cfg = self.cfg
        kv = self.wkv(self.attn_norm(c)).unflatten(-1, (2 * cfg.kv_heads, cfg.head_dim))
        k, v = kv[..., : cfg.kv_heads, :], kv[..., cfg.kv_heads:, :]
        cos, sin = self._rope(pos)
        return apply_rope(k, cos, sin), v

    def sequence_context(self, feats: torch.Tensor, next_tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A whole sequence's context, c_j at positions j+1, and its keys and values: feats [C, L*D],
        next_tokens [C] -> (c [C, D], ck, cv [C, KV, hd]). Anchor a sees entries j < a (`visible`)."""
        c = self.context(feats, next_tokens)
        ck, cv = self.context_kv(c, torch.arange(1, c.shape[0] + 1, device=c.device))
        return c, ck, cv

    @staticmethod
    def visible(C: int, anchors: torch.Tensor) -> torch.Tensor:
        """[B, C] bool: context entry j is visible to anchor a iff j <= a - 1 (causality)."""
        return torch.arange(C, device=anchors.device)[None, :] < anchors[:, None]

    def backbone(self, z: torch.Tensor, zpos: torch.Tensor, ck: torch.Tensor, cv: torch.Tensor,
                 mask: torch.Tensor) -> torch.Tensor:
        """One layer over block inputs z [B, K, D] at positions zpos [B, K]; keys/values are the context's
        ck, cv [B, C, KV, hd] followed by the block's own; mask [B, C] bool = context entry visible.
        Returns u [B, K, D]."""
        cfg = self.cfg
        B, K, _ = z.shape
        x = self.attn_norm(z)
        cos, sin = self._rope(zpos)
        q = apply_rope(self.wq(x).unflatten(-1, (cfg.heads, cfg.head_dim)), cos, sin)
        kv = self.wkv(x).unflatten(-1, (2 * cfg.kv_heads, cfg.head_dim))
        bk = apply_rope(kv[..., : cfg.kv_heads, :], cos, sin)
        bv = kv[..., cfg.kv_heads:, :]
        keys = torch.cat([ck, bk], dim=1).transpose(1, 2)   # [B, KV, C+K, hd]
        vals = torch.cat([cv, bv], dim=1).transpose(1, 2)
        full = torch.cat([mask, mask.new_ones(B, K)], dim=1)[:, None, None, :]  # block sees itself whole
        y = F.scaled_dot_product_attention(q.transpose(1, 2), keys, vals, attn_mask=full, enable_gqa=True)
        h = z + self.wo(y.transpose(1, 2).flatten(-2))
        gate, up = self.w13(self.ffn_norm(h)).split(cfg.intermediate, dim=-1)
        return h + self.w2(F.silu(gate) * up)

    def base_logits(self, u: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(u), self.head)

    def step_logits(self, base_k: torch.Tensor, prev_reduced: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Markov-corrected logits of one block position and the W1 row used: base_k [B, V], prev [B] reduced ids."""
        m = self.markov_in(prev_reduced)
        return base_k + self.markov_out(m), m

    def raw_confidence(self, u_k: torch.Tensor, m: torch.Tensor, logits_k: torch.Tensor) -> torch.Tensor:
        """The head's logit of P(x_k accepted | prefix accepted), from [u_k ; W1[x_{k-1}] ; log max softmax]."""
        top = logits_k.float().log_softmax(-1).max(-1).values.to(u_k.dtype)
        return self.conf(torch.cat([u_k, m, top[..., None]], dim=-1)).squeeze(-1)

    def calibrate(self, raw_logit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(c' calibrated conditional, c raw conditional) [B, K] from raw confidence logits [B, K] (STS)."""
        c = torch.sigmoid(raw_logit.float())
        s = torch.cumprod(c, dim=-1).clamp(1e-6, 1 - 1e-6)
        s2 = torch.sigmoid(torch.logit(s) / self.sts_temp.float())
        s2 = torch.cummin(s2, dim=-1).values
        prev = torch.cat([torch.ones_like(s2[:, :1]), s2[:, :-1]], dim=-1)
        return (s2 / prev).clamp(0.0, 1.0), c

    # ------------------------------------------------------------------------------------------ drafting
    def block_inputs(self, c_last: torch.Tensor, anchor_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """z_k = c_{a-1} + P_k at positions a+1+k: c_last [B, D], anchor_pos [B] -> z [B, K, D], zpos [B, K]."""
        K = self.cfg.block
        z = c_last[:, None, :] + self.pos[None]
        zpos = anchor_pos[:, None] + 1 + torch.arange(K, device=anchor_pos.device)[None, :]
        return z, zpos

    @torch.inference_mode()
    def draft(self, ck: torch.Tensor, cv: torch.Tensor, mask: torch.Tensor, c_last: torch.Tensor,
              anchor_pos: torch.Tensor, anchor_tok: torch.Tensor) -> DraftOut:
        """Greedy drafts for B anchors. ck, cv [B, C, KV, hd] context keys/values (entries j <= a-1 visible by
        mask [B, C]); c_last [B, D] = c_{a-1}; anchor_pos [B] = a; anchor_tok [B] = t_a (target ids)."""
        z, zpos = self.block_inputs(c_last, anchor_pos)
        u = self.backbone(z, zpos, ck, cv, mask)
        base = self.base_logits(u)
        prev = self.to_reduced[anchor_tok]
        toks, raws = [], []
        for k in range(self.cfg.block):
            lk, m = self.step_logits(base[:, k], prev)
            prev = lk.argmax(-1)
            toks.append(prev)
            raws.append(self.raw_confidence(u[:, k], m, lk))
        tokens = self.vocab_ids[torch.stack(toks, dim=1)]
        conf, raw = self.calibrate(torch.stack(raws, dim=1))
        return DraftOut(tokens, conf, raw)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


# ---------------------------------------------------------------------------------------------- files
def save_drafter(drafter: DSparkDrafter, path: Path, meta: dict) -> str:
    """Write the drafter (fp16 weights, config, metadata) whole to `path` and its sha256 beside it
    (`path`.sha256); returns the digest. Replaces `path`: the CLI refuses an existing one without --force."""
    import io

    sd = {k: (v.half() if v.is_floating_point() and k != "sts_temp" else v) for k, v in drafter.state_dict().items()}
    meta = json.loads(json.dumps(meta, default=float))  # plain types only: the file loads with weights_only
    buf = io.BytesIO()
    torch.save({"format": drafter.FORMAT, "config": asdict(drafter.cfg), "meta": meta, "state": sd}, buf)
    data = buf.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    from sim.infra.fsio import commit_files

    # one unit: a kill leaves the old weights with the old digest or the new with the new, never a mix
    commit_files(path.parent, {path.name: data, path.name + ".sha256": f"{digest}  {path.name}\n"}, unit=path.name)
    return digest


def check_state_shapes(where, model_cls, cfg, state) -> None:
    """ConfigError unless `state` (a checkpoint's weights) holds exactly the tensors, by name and shape, that
    `model_cls(cfg)` would: the model is built on torch's meta device (no memory), so a config asking for gigabytes
    beside a small state (or weights of another size) is refused before anything is allocated."""
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise ConfigError(f"{where}: not a drafter file (its state is not a mapping of names to tensors)")
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in model_cls(cfg).state_dict().items()}
    held = {k: tuple(v.shape) for k, v in state.items()}
    if shapes != held:
        implied = sum(math.prod(s) for s in shapes.values())
        got = sum(math.prod(s) for s in held.values())
        k = next((k for k in sorted(set(shapes) | set(held)) if shapes.get(k) != held.get(k)))
        raise ConfigError(f"{where}: its config implies {implied / 1e6:.1f} M weights ({implied * 4 / 1e9:.2f} GB in "
                          f"float32), the file holds {got / 1e6:.1f} M "
                          f"({k}: config {shapes.get(k)}, file {held.get(k)}); config and weights do not match")


def load_drafter(path: str | Path = DEFAULT_DRAFTER, target: str | None = None, block: int | None = None,
                 target_sha256: str | None = None, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> DSparkDrafter:
    """Load a drafter file, checking its sha256 (the `.sha256` file beside it), and that it was trained for
    `target` (models/llms name), `target_sha256` (the weights file) and block size `block` when given.
    Every mismatch is a one-line ConfigError."""
    p = Path(path)
    try:  # finish a save that was killed after it committed (sim.infra.fsio.commit_files)
        from sim.infra.fsio import recover

        recover(p.parent)
    except OSError:
        pass
    if not p.is_file():
        raise ConfigError(f"drafter weights not found: {p} (rebuild: python -m real.train_drafter, docs/drafter.md)")
    sha_file = Path(str(p) + ".sha256")
    if not sha_file.is_file():
        raise ConfigError(f"{p}: no {sha_file.name} beside it: cannot check the weights")
    from sim.infra.inputs import SIDECAR, read_text

    side = read_text(sha_file, SIDECAR, "checksum file")  # capped: one digest and a name, never gigabytes
    want = side.split()[0] if side.strip() else ""
    got = file_sha256(p)
    if got != want:
        raise ConfigError(f"{p}: sha256 {got[:12]}... does not match {sha_file.name} ({want[:12]}...): the file is "
                          "damaged or was replaced")
    from sim.infra.inputs import WEIGHTS, check_regular, dataclass_schema

    st = check_regular(p, "drafter")  # a pipe or a device: one line, never read
    if st.st_size > WEIGHTS.limit():
        raise ConfigError(f"{p}: {st.st_size >> 20} MiB is over the {WEIGHTS.limit() >> 20} MiB a {WEIGHTS.name} may hold")
    try:
        blob = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ConfigError(f"{p}: not a drafter file ({exc.__class__.__name__})") from None
    from real.drafter.qwen3_dspark import DSparkV, DSparkVConfig  # the other architecture (same layer)

    kinds = {FORMAT: (DrafterConfig, DSparkDrafter), DSparkV.FORMAT: (DSparkVConfig, DSparkV)}
    if not isinstance(blob, dict) or blob.get("format") not in kinds:
        raise ConfigError(f"{p}: not a drafter file (format {blob.get('format') if isinstance(blob, dict) else None!r}"
                          f", want one of {sorted(kinds)})")
    cfg_cls, model_cls = kinds[blob["format"]]
    # the config's types (sim/infra/inputs.py), then its ranges (from_dict validates them)
    dataclass_schema(cfg_cls, "a drafter config (an object)").check(blob.get("config"), "config", str(p))
    cfg = cfg_cls.from_dict(blob["config"])
    if target is not None and cfg.target != target:
        raise ConfigError(f"{p}: trained for target '{cfg.target}', not '{target}'")
    if target_sha256 and cfg.target_sha256 and cfg.target_sha256 != target_sha256:
        raise ConfigError(f"{p}: trained on target weights {cfg.target_sha256[:12]}..., these are "
                          f"{target_sha256[:12]}...")
    if block is not None and cfg.block != block:
        raise ConfigError(f"{p}: proposes blocks of {cfg.block} tokens, {block} were asked for")
    check_state_shapes(p, model_cls, cfg, blob.get("state"))  # before the model is built: no config asks for more
    d = model_cls(cfg)
    try:
        d.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in blob["state"].items()}, strict=True)
    except RuntimeError as exc:
        raise ConfigError(f"{p}: weights do not fit the config ({str(exc).splitlines()[0]})") from None
    d._remap()
    d.meta = blob.get("meta", {})
    return d.to(device=device, dtype=dtype).eval()


__all__ = ["DrafterConfig", "DSparkDrafter", "DraftOut", "load_drafter", "save_drafter", "DEFAULT_DRAFTER",
           "ENGINE_DRAFTER", "FORMAT"]
