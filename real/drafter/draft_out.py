"""What one drafter pass returns, shared by both drafter architectures (real/drafter/model.py,
real/drafter/qwen3_dspark.py) and the engine's cache (real/drafter/runtime.py)."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftOut:
    """One drafter pass over B anchors: tokens [B, K] (target ids), conf [B, K] calibrated conditional
    confidences c'_k, raw [B, K] the head's uncalibrated c_k."""
    tokens: torch.Tensor
    conf: torch.Tensor
    raw: torch.Tensor


__all__ = ["DraftOut"]
