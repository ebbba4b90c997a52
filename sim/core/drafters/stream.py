"""Streaming draft tables: a request's rows are built when the scheduler admits it and freed when it finishes,
so memory follows the running batch, not the trace.

`StreamingTables` is the recipe (the requests and the drafters; immutable, shared by every run of a
prepared trace, forked workers included); `StreamingTables.open()` gives one engine run a `TableArena`:
the same attributes the engine reads from a whole-trace DraftTables (sim.core.drafters.tables) -- per-request
offsets, out_len, prompt_len, length_only, tok_offsets and the row columns -- but the row columns hold only
the live requests' rows, at arena offsets. A request's rows are `request_rows(...)`, the very function
build_draft_tables calls, seeded by its id, so a run reads the same values either way (tests/test_stream.py).

Memory: a row (one output position) takes ROW_BYTES(K_m, K_n) = 8*4 (ng_len, ng_acc, ng_start, m_acc)
+ 4*K_n (ng_conf) + 4*K_m (m_conf) + 4*K_m (m_tok) + 2 (rec_chain, rec_skip) + 8 (the engine's emitted token) bytes, plus 8 bytes per
prompt or output token; the arena holds the live requests' rows and at most as many freed ones (it compacts
when half of it is dead, and doubles when the live rows do not fit).

`pick_streaming` decides for `--draft-tables auto`: stream when the whole-trace tables would exceed
WHOLE_TABLE_BUDGET bytes (the whole tables keep the on-disk cache of sim.core.drafters.cache, which makes
repeated runs of small traces fast).
"""
from __future__ import annotations

import numpy as np

from sim.core.drafters.calibration import NgramCalibrator
from sim.core.drafters.model import ModelDrafterProfile
from sim.core.drafters.ngram import NgramConfig
from sim.core.drafters.tables import ROW_COLUMNS, ROW_DTYPES, check_calibrator, request_rows, zero_past_length
from sim.infra.errors import ConfigError

WHOLE_TABLE_BUDGET = 1 << 30  # bytes: above this `auto` streams (1 GiB, half of the 2 GB target of docs/memory.md)
DRAFT_TABLE_MODES = ("auto", "whole", "stream")


def parse_draft_tables(text: str) -> str:
    """A --draft-tables value: one of DRAFT_TABLE_MODES (ConfigError otherwise)."""
    if text not in DRAFT_TABLE_MODES:
        raise ConfigError(f"--draft-tables must be one of {', '.join(DRAFT_TABLE_MODES)}, got {text!r}")
    return text


def row_bytes(k_model: int, k_ngram: int) -> int:
    """Bytes of one table row (module docstring), the engine's emitted-token slot included."""
    return 8 * 4 + 4 * k_ngram + 8 * k_model + 2 + 8


def whole_table_bytes(requests: list, k_model: int, k_ngram: int) -> int:
    """Bytes the whole-trace tables of `requests` would take: rows plus prompt and output tokens."""
    out = sum(r.output_len for r in requests)
    toks = out + sum(r.prompt_len for r in requests)
    return out * row_bytes(k_model, k_ngram) + 8 * toks


def pick_streaming(mode: str, requests: list, k_model: int, k_ngram: int) -> bool:
    """Whether to stream the draft tables: `mode` is 'stream', 'whole' or 'auto' (stream above the budget)."""
    if parse_draft_tables(mode) == "auto":
        return whole_table_bytes(requests, k_model, k_ngram) > WHOLE_TABLE_BUDGET
    return mode == "stream"


class StreamingTables:
    """The recipe of a trace's draft tables, built per request on admission (module docstring)."""

    streaming = True

    def __init__(self, requests: list, ngram_cfg: NgramConfig, profile: ModelDrafterProfile,
                 calibrator: NgramCalibrator, seed: int = 0, recorded: dict | None = None,
                 synthetic: tuple[float, ...] | None = None):
        check_calibrator(ngram_cfg, calibrator)
        self.requests, self.ngram_cfg, self.profile, self.calibrator = requests, ngram_cfg, profile, calibrator
        self.seed, self.recorded, self.synthetic = seed, recorded, synthetic
        self.out_len = np.fromiter((r.output_len for r in requests), dtype=np.int64, count=len(requests))
        self.prompt_len = np.fromiter((r.prompt_len for r in requests), dtype=np.int64, count=len(requests))
        self.length_only = np.fromiter((r.output_ids is None or synthetic is not None for r in requests), dtype=bool,
                                       count=len(requests))  # synthetic acceptance: content not checked (synthetic.py)
        self.k_model, self.k_ngram = int(profile.block), int(ngram_cfg.k)
        self.replayed_requests = 0 if recorded is None else sum(
            1 for r in requests if r.output_ids is not None and r.id in recorded)

    def rows(self, r: int) -> dict:
        """Request r's rows (sim.core.drafters.tables.request_rows), checked against its declared lengths."""
        req = self.requests[r]
        rows = request_rows(req, self.ngram_cfg, self.profile, self.calibrator, self.seed, self.recorded, self.synthetic)
        L = len(rows["m_acc"])
        if L != self.out_len[r] or len(rows["tokens"]) != L + self.prompt_len[r]:
            raise ConfigError(f"request '{req.id}': its draft rows hold {L} outputs and {len(rows['tokens'])} tokens, "
                              f"the trace says {int(self.out_len[r])} and {int(self.out_len[r] + self.prompt_len[r])}")
        return rows

    def open(self) -> "TableArena":
        """A fresh arena for one engine run."""
        return TableArena(self)


class TableArena:
    """The live requests' rows of one run (module docstring). offsets[r] / tok_offsets[r] are valid while r is
    live (between `admit` and `release`); `out_base[r]` = tok_offsets[r] + prompt_len[r] (where output[0] sits in
    `tokens`). Arrays the engine holds (offsets, tok_offsets, out_base, out_len, prompt_len, length_only) are
    updated in place; the row columns and `tokens` may be reallocated, so read them from the arena."""

    streaming = True

    def __init__(self, spec: StreamingTables, rows: int = 1024, tokens: int = 4096):
        self.spec = spec
        n = len(spec.out_len)
        self.out_len, self.prompt_len, self.length_only = spec.out_len, spec.prompt_len, spec.length_only
        self.k_model, self.k_ngram = spec.k_model, spec.k_ngram
        self.replayed_requests = spec.replayed_requests
        self.offsets = np.zeros(n, dtype=np.int64)
        self.tok_offsets = np.zeros(n + 1, dtype=np.int64)
        self.out_base = np.zeros(n, dtype=np.int64)
        self.live = np.zeros(n, dtype=bool)
        self._width = {"ng_conf": self.k_ngram, "m_conf": self.k_model, "m_tok": self.k_model}
        self._alloc_rows(rows)
        self.tokens = np.zeros(tokens, dtype=np.int64)
        self.top = self.ttop = 0  # first free row / token
        self.live_rows = self.live_tokens = 0
        self.peak_rows = self.peak_tokens = 0  # most rows / tokens live at once
        self.built = 0  # requests built (a preempted request keeps its rows: built once)
        self._ng_zero_past_len = True  # every live n-gram confidence past its chain's length is +0.0 (engine fast path)

    # --------------------------------------------------------------------------------------- storage
    def _alloc_rows(self, cap: int, keep: int = 0) -> None:
        old = {k: getattr(self, k) for k in ROW_COLUMNS + ("emitted",)} if keep else {}
        for k, dt in ROW_DTYPES.items():
            w = self._width.get(k)
            setattr(self, k, np.zeros((cap, w) if w else cap, dtype=dt))
        self.emitted = np.full(cap, -1, dtype=np.int64)  # the engine's emitted tokens (-1: not yet)
        for k, a in old.items():
            getattr(self, k)[:keep] = a[:keep]

    def _compact(self) -> None:
        """Move the live requests' rows and tokens to the front, in offset order (offsets updated)."""
        ids = np.nonzero(self.live)[0]
        for what in ("rows", "tokens"):
            off = self.offsets if what == "rows" else self.tok_offsets
            length = self.out_len[ids] if what == "rows" else self.out_len[ids] + self.prompt_len[ids]
            order = np.argsort(off[ids], kind="stable")
            ids_o, len_o = ids[order], length[order]
            new = np.concatenate([[0], np.cumsum(len_o)[:-1]]).astype(np.int64) if len(ids_o) else len_o
            total = int(len_o.sum())
            src = np.repeat(off[ids_o] - new, len_o) + np.arange(total)  # old index of each kept row
            if what == "rows":
                for k in ROW_COLUMNS + ("emitted",):
                    col = getattr(self, k)
                    col[:total] = col[src]
                self.top = total
            else:
                self.tokens[:total] = self.tokens[src]
                self.ttop = total
            off[ids_o] = new
        self.out_base[ids] = self.tok_offsets[ids] + self.prompt_len[ids]

    def _room(self, rows: int, tokens: int) -> None:
        """Make room for `rows` more rows and `tokens` more tokens at the top: compact when at least half of
        the arena is freed rows, else grow (doubling)."""
        cap, tcap = len(self.emitted), len(self.tokens)
        if self.top + rows <= cap and self.ttop + tokens <= tcap:
            return
        if 2 * self.live_rows <= self.top or 2 * self.live_tokens <= self.ttop:
            self._compact()
        if self.top + rows > cap:
            self._alloc_rows(max(2 * cap, self.top + rows), keep=self.top)
        if self.ttop + tokens > tcap:
            grown = np.zeros(max(2 * tcap, self.ttop + tokens), dtype=np.int64)
            grown[:self.ttop] = self.tokens[:self.ttop]
            self.tokens = grown

    # --------------------------------------------------------------------------------------- requests
    def admit(self, ids) -> None:
        """Build the rows of the requests `ids` that are not live yet (a resumed preempted request is)."""
        for r in ids:
            r = int(r)
            if self.live[r]:
                continue
            rows = self.spec.rows(r)
            L, T = int(self.out_len[r]), len(rows["tokens"])
            self._room(L, T)
            a, t = self.top, self.ttop
            for k in ROW_COLUMNS:
                getattr(self, k)[a:a + L] = rows[k]
            self.emitted[a:a + L] = -1
            self.tokens[t:t + T] = rows["tokens"]
            if self._ng_zero_past_len and L:
                self._ng_zero_past_len = zero_past_length(rows["ng_conf"], rows["ng_len"])
            self.offsets[r], self.tok_offsets[r] = a, t
            self.out_base[r] = t + self.prompt_len[r]
            self.top, self.ttop = a + L, t + T
            self.live[r] = True
            self.live_rows += L
            self.live_tokens += T
            self.built += 1
        self.peak_rows = max(self.peak_rows, self.live_rows)
        self.peak_tokens = max(self.peak_tokens, self.live_tokens)

    def release(self, ids) -> None:
        """Free the rows of finished requests (their space is reused after the next compaction)."""
        for r in ids:
            r = int(r)
            if self.live[r]:
                self.live[r] = False
                self.live_rows -= int(self.out_len[r])
                self.live_tokens -= int(self.out_len[r] + self.prompt_len[r])

    def output_violation(self, r: int, pos: int) -> str:
        """'' if live request r's emitted tokens are its output, each slot written, and pos is its output length;
        else the lossless check's one-line message (sim.engine.engine, item 3; the whole-table wording)."""
        L, a, b = int(self.out_len[r]), int(self.offsets[r]), int(self.out_base[r])
        got, expect = self.emitted[a:a + L], self.tokens[b:b + L]
        bad = np.nonzero(got != expect)[0]
        if len(bad):
            i = int(bad[0])
            return (f"request {r} output position {i}: "
                    + (f"emitted token {int(got[i])}, the target's is {int(expect[i])}" if got[i] >= 0 else "never emitted"))
        if pos != L:
            return f"request {r} ended at position {pos} of {L}"
        return ""
