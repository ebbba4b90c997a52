"""What both DSpark drafters (real/drafter/model.py, the project's; real/drafter/qwen3_dspark.py, vLLM's
architecture) share with their target: the reduced-vocabulary map, the target's embedding (also its tied LM
head) and the RoPE tables; and the checks of a config both share (check_config).

A drafter class mixes `TargetTied` in before nn.Module and provides `cfg` (vocab, target_vocab, hidden, target,
head_dim, rope_theta), the int buffers `vocab_ids` [vocab] (reduced id -> target id) and `to_reduced`
[target_vocab] (target id -> reduced id, `vocab` where absent), and `_rope_cache = None`.
"""
from __future__ import annotations

import torch

from sim.infra.errors import ConfigError


SHAPE_INTS = ("target_vocab", "hidden", "block", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "rank")


def check_config(cfg, ints: tuple = SHAPE_INTS) -> None:
    """The one check of a DSpark drafter config's shape (both drafters' configs run it from their validate): the
    `ints` fields positive integers, heads a multiple of kv_heads, layers distinct ascending indices, the reduced
    vocabulary within the target's. ConfigError (one line, naming the field) otherwise."""
    for k in ints:
        v = getattr(cfg, k)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"drafter config: {k} must be a positive integer, got {v!r}")
    if cfg.heads % cfg.kv_heads:
        raise ConfigError(f"drafter config: heads {cfg.heads} must be a multiple of kv_heads {cfg.kv_heads}")
    if not cfg.layers or list(cfg.layers) != sorted(set(cfg.layers)) or min(cfg.layers) < 0:
        raise ConfigError(f"drafter config: layers must be distinct ascending layer indices, got {cfg.layers}")
    if cfg.vocab > cfg.target_vocab:
        raise ConfigError(f"drafter config: vocab {cfg.vocab} exceeds the target's {cfg.target_vocab}")


class TargetTied:
    def set_vocab(self, vocab_ids: torch.Tensor) -> None:
        if vocab_ids.shape != (self.cfg.vocab,) or len(set(vocab_ids.tolist())) != self.cfg.vocab:
            raise ConfigError(f"drafter: vocab_ids must be {self.cfg.vocab} distinct target ids")
        self.vocab_ids.copy_(vocab_ids.to(self.vocab_ids))
        self._remap()

    def _remap(self) -> None:
        self.to_reduced.fill_(self.cfg.vocab)
        self.to_reduced[self.vocab_ids] = torch.arange(self.cfg.vocab, device=self.to_reduced.device)

    def attach_target(self, embedding: torch.Tensor):
        """Share the target's token embedding [target_vocab, D] (also its tied LM head). Converted to the
        drafter's dtype/device once (a view when they already match)."""
        if tuple(embedding.shape) != (self.cfg.target_vocab, self.cfg.hidden):
            raise ConfigError(f"drafter: the target's embedding is {tuple(embedding.shape)}, the drafter was built for "
                              f"{(self.cfg.target_vocab, self.cfg.hidden)} ({self.cfg.target})")
        p = next(self.parameters())  # every parameter shares one dtype and device
        self.embed = embedding.detach().to(device=p.device, dtype=p.dtype)
        self._remap()
        self.head = self.embed[self.vocab_ids]
        return self

    def _rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [*, 1, head_dim] for integer positions `pos` (tables grown on demand, fp32)."""
        need = int(pos.max()) + 1 if pos.numel() else 1
        if self._rope_cache is None or self._rope_cache[0] < need or self._rope_cache[1].device != pos.device:
            n = max(need, 4096)
            hd = self.cfg.head_dim
            inv = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, hd, 2, device=pos.device, dtype=torch.float64) / hd))
            ang = torch.arange(n, device=pos.device, dtype=torch.float64)[:, None] * inv[None, :]
            ang = torch.cat((ang, ang), dim=-1)
            self._rope_cache = (n, ang.cos().float(), ang.sin().float())
        _, cos, sin = self._rope_cache
        return cos[pos].unsqueeze(-2), sin[pos].unsqueeze(-2)
