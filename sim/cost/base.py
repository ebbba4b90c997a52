"""The step-cost interface every cost model implements (analytic roofline, profiled tables).

One engine step of speculative decoding costs, on the GPU,
    draft_ms + ngram_ms + alloc_ms + verify_ms + sample_ms
and, on the CPU, cpu_ms of scheduling work that overlaps the GPU under asynchronous scheduling.
All times are milliseconds. Token counts are positions processed by the target in one forward pass
(decode positions + verified draft slots + prefill chunk tokens). kv_tokens is the total context (KV
cache entries) the step's attention reads, summed over sequences.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class CostModel(ABC):
    """A step-cost model. Implementations must be monotone non-decreasing in every count."""

    name: str = "base"

    @abstractmethod
    def verify_ms(self, num_tokens: np.ndarray | int, kv_tokens: int, num_seqs: int) -> np.ndarray | float:
        """Target forward pass over `num_tokens` positions for `num_seqs` sequences reading `kv_tokens`
        cached entries. Vectorised over `num_tokens` (returns an array of the same shape)."""

    @abstractmethod
    def draft_ms(self, num_reqs: int, block: int) -> float:
        """Model-based drafter (DSpark) proposing a block of `block` tokens for each of `num_reqs` requests."""

    @abstractmethod
    def ngram_ms(self, num_reqs: int, on_gpu: bool = True) -> float:
        """Model-free n-gram drafter for `num_reqs` requests (GPU kernel, or CPU lookup if not on_gpu)."""

    @abstractmethod
    def alloc_ms(self, num_reqs: int) -> float:
        """Allocation kernel (survivals, selection) for `num_reqs` requests."""

    @abstractmethod
    def sample_ms(self, num_tokens: int) -> float:
        """Sampling and rejection over `num_tokens` verified positions."""

    @abstractmethod
    def cpu_ms(self, num_reqs: int, num_tokens: int) -> float:
        """Host-side scheduling and input preparation for one step."""

    @property
    @abstractmethod
    def kv_capacity_tokens(self) -> int:
        """KV-cache entries that fit in GPU memory (vLLM's rule: mem x utilisation - weights - activations)."""

    def verify_table(self, max_tokens: int, kv_tokens: int, num_seqs: int) -> np.ndarray:
        """verify_ms for every token count 0..max_tokens, the table adaptive verification ranks with."""
        return np.asarray(self.verify_ms(np.arange(max_tokens + 1), kv_tokens, num_seqs), dtype=np.float64)
