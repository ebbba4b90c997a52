"""Typed trace objects: one Request per JSONL line, a Trace per file (see traces/README.md).

A request carries token ids when its content is known (text lines are tokenized by the loader) and only
lengths when the source trace has no content (Azure, BurstGPT, Mooncake). A request is `length_only` when
its output ids are unknown: the simulator then draws acceptance from a per-workload statistical profile
instead of replaying the output exactly, and says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sim.infra.errors import TraceError

__all__ = ["Request", "Trace", "TraceError", "TEXT_KEYS", "ID_KEYS", "LEN_KEYS"]

TEXT_KEYS = ("prompt", "output")
ID_KEYS = ("prompt_ids", "output_ids")
LEN_KEYS = ("prompt_len", "output_len")


@dataclass
class Request:
    """One request. `output_ids` is the target model's output: acceptance at temperature 0 replays it.

    prompt_ids / output_ids: int32 arrays, or None when the trace gives only lengths.
    prompt_len / output_len: always set (>= 1); equal to the array lengths when the arrays are set.
    arrival_s: seconds since the trace start, or None when the trace gives no arrivals (all at time 0).
    """

    id: str
    prompt_ids: np.ndarray | None
    output_ids: np.ndarray | None
    prompt_len: int
    output_len: int
    arrival_s: float | None = None
    workload: str | None = None
    temperature: float = 0.0
    line: int | None = None  # 1-based line of the trace file it came from (for error messages)

    @property
    def length_only(self) -> bool:
        return self.output_ids is None

    def tokens(self) -> np.ndarray:
        """prompt + output ids as one int32 array (content requests only)."""
        if self.prompt_ids is None or self.output_ids is None:
            raise TraceError("request has no token ids (length-only)", field="output_ids")
        return np.concatenate([self.prompt_ids, self.output_ids])


@dataclass
class Trace:
    """A loaded trace. `skipped` counts bad lines dropped under skip_bad=True (their messages in `problems`)."""

    path: str
    requests: list[Request]
    skipped: int = 0
    problems: list[str] = field(default_factory=list)
    tokenizer: str | None = None  # what tokenized its text fields (None: no text, ids or lengths only)

    @property
    def length_only(self) -> bool:
        return any(r.length_only for r in self.requests)

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self):
        return iter(self.requests)
