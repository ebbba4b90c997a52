"""The engine's per-step records, kept as compact numpy chunks instead of one Python tuple per step.

A run of a million requests takes hundreds of thousands of steps; a tuple of 21 Python numbers costs about
700 bytes, a row of 21 float64/int64 columns 168. `StepLog.append` takes the same tuple the engine used to
append to a list; every CHUNK rows the tuples become one array per column, with the dtype np.asarray infers
from them (so the columns equal, value and dtype, those of np.asarray over the whole list: chunks are joined by
np.concatenate, which promotes an int64 chunk and a float64 chunk as np.asarray does a mixed list).
"""
from __future__ import annotations

from functools import partial
from typing import NamedTuple

import numpy as np

CHUNK = 4096  # steps per chunk: large enough that the chunks' overhead is negligible


class StepRecord(NamedTuple):
    """One engine step's record (a row of the run's step table; sim.core.result names the columns' meanings).
    Times in ms (the step's time split as sim/engine/step_time.py charges it), counts in tokens or requests.
    Every path that records a step (Engine._finish_step, the fast-forward, steady stretches) builds one."""

    t_start_ms: float
    step_ms: float
    num_decode: int
    prefill_tokens: int
    verified_model: int
    verified_ngram: int
    accepted_model: int
    accepted_ngram: int
    emitted: int
    draft_ms: float
    ngram_ms: float
    alloc_ms: float
    verify_ms: float
    sample_ms: float
    cpu_ms: float
    bubble_ms: float
    kv_tokens: int
    preempted: int
    tokens: int
    logit_rows: int
    num_seqs: int


STEP_COLUMNS = StepRecord._fields
# StepRecord of a tuple of its fields in order, at C speed (StepRecord(...)'s Python-level __new__ costs about a
# microsecond: a few percent of a simulated step at small batches)
make_record = partial(tuple.__new__, StepRecord)


class StepLog:
    """Append-only table of step records (one tuple of len(columns) numbers per step)."""

    def __init__(self, columns: tuple[str, ...]):
        self.columns = columns
        self._rows: list[tuple] = []
        self._chunks: list[list[np.ndarray]] = []  # per chunk: one array per column
        self._n = 0

    def append(self, row: StepRecord) -> None:
        self._rows.append(row)
        self._n += 1
        if len(self._rows) >= CHUNK:
            self._flush()

    def __len__(self) -> int:
        return self._n

    def _flush(self) -> None:
        if self._rows:
            width = len(self.columns)
            bad = next((i for i, r in enumerate(self._rows) if len(r) != width), None)
            if bad is not None:  # a record of another shape would shift every later column
                raise ValueError(f"step record {self._n - len(self._rows) + bad} has {len(self._rows[bad])} fields, "
                                 f"the step table {width}")
            self._chunks.append([np.asarray(v) for v in zip(*self._rows)])
            self._rows = []

    def to_columns(self) -> dict[str, np.ndarray]:
        """{column: array over every step} (empty arrays when no step ran)."""
        self._flush()
        if not self._chunks:
            return {k: np.asarray(()) for k in self.columns}
        out = {k: np.concatenate([c[i] for c in self._chunks]) for i, k in enumerate(self.columns)}
        self._chunks = [list(out.values())]  # joined once; later calls reuse it
        return out
