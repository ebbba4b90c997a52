"""The plugin's own cost per step, measured on the engine that runs it (no vLLM import; tested on CPU).

A live step of the hybrid speculator does its own work in up to three segments around vLLM's: observe (after the
verify pass), the skip decision (host, before DSpark's pass, only with hybrid_spec.skip) and the chain choice after
DSpark's pass. `StepClock` times each segment and keeps one sample per live step,

    ms(step) = sum over its segments of (end - start)                                   [ms], with R = its rows,

    on CUDA   a pair of timing events per segment, recorded on the current stream: the GPU's time between
              reaching the two, so host work in between (the skip decision) counts only where the GPU waited
              for it; the events are read when the samples are asked for (`samples`, over RPC, outside any
              step), so the step itself never waits on them;
    on CPU    time.perf_counter around each segment (the ops run synchronously there).

Live steps and profiling steps are kept apart: in vLLM's profiling runs the speculator runs the plugin's step on
padded rows inside DSpark's timed pass (HybridSpeculator.propose), so the draft cost vLLM profiles already holds
that much of it. The newest `capacity` steps of each kind are kept (a ring: a CUDA build reuses its events).
`table_field` reduces both to the cost table's "plugin" field (sim/core/cost/profiled.py: the live steps' fit
ms = a_ms + b_ms_per_req * R, and the profiling steps' as in_draft), from the hybrid_stats RPC's answer; the
simulator charges the plugin's policies the live fit less the in_draft one.
"""
from __future__ import annotations

import time
from collections import deque

import torch

SEGMENTS = 3  # observe, the skip decision, the chain choice
KINDS = ("live", "profiled")  # a live step; a profiling step of vLLM's (padded rows, inside the timed draft pass)
CAPACITY = 4096  # steps kept


class StepClock:
    """Per-step samples (R, ms) of the plugin's own work on `device`, by kind (module docstring)."""

    def __init__(self, device: torch.device | str, capacity: int = CAPACITY):
        self.cuda = torch.device(device).type == "cuda"
        self.capacity = int(capacity)
        # kind -> its kept steps: (R, [segment ms] on CPU or [event pair indices] on CUDA)
        self._steps: dict[str, deque] = {k: deque(maxlen=self.capacity) for k in KINDS}
        self._open: list = []  # this step's segments so far
        # CUDA, per kind: capacity * SEGMENTS event pairs (made on first use) and the next pair to record into; a
        # kind's last `capacity` steps use at most that many pairs, so its kept steps' pairs are never reused
        self._events: dict[str, list] = {k: [] for k in KINDS}
        self._next: dict[str, int] = {k: 0 for k in KINDS}

    def start(self, kind: str = "live"):
        """Open a segment of a step of `kind`: a token for `stop`."""
        if not self.cuda:
            return time.perf_counter()
        pool = self._events[kind]
        if not pool:
            pool += [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                     for _ in range(self.capacity * SEGMENTS)]
        i = self._next[kind]
        self._next[kind] = (i + 1) % len(pool)
        pool[i][0].record()
        return kind, i

    def stop(self, token) -> None:
        """Close the segment `start` opened; it counts toward the current step."""
        if self.cuda:
            kind, i = token
            self._events[kind][i][1].record()
            self._open.append(i)
        else:
            self._open.append((time.perf_counter() - token) * 1e3)

    def commit(self, num_reqs: int, kind: str = "live") -> None:
        """The current step, of `kind` (its segments' kind), had `num_reqs` rows: keep its sample."""
        if self._open:
            self._steps[kind].append((int(num_reqs), self._open))
        self._open = []

    def discard(self, kind: str = "live") -> None:
        """Drop the current step's segments, of `kind` (a live step's observe when no live propose follows: vLLM's
        own skip_drafts); on CUDA their pairs are reused next."""
        if self.cuda and self._open:
            self._next[kind] = self._open[0]
        self._open = []

    def samples(self, kind: str = "live") -> list[tuple[int, float]]:
        """[(R, ms)] of the kept steps of `kind`, oldest first. On CUDA this waits for the device: call it outside
        the step (the stats RPC)."""
        steps, pool = self._steps[kind], self._events[kind]
        if not self.cuda:
            return [(r, float(sum(seg))) for r, seg in steps]
        if steps:
            torch.cuda.synchronize()
        return [(r, float(sum(pool[i][0].elapsed_time(pool[i][1]) for i in seg))) for r, seg in steps]

    def stats(self) -> dict:
        """What the hybrid_stats RPC reports: per kind, the samples [[R, ms], ...] and their affine fit
        (sim.core.cost.profiled.plugin_fit; None without samples)."""
        from sim.core.cost.profiled import plugin_fit

        out = {}
        for kind in KINDS:
            s = self.samples(kind)
            out[kind] = {"samples": [[r, round(ms, 6)] for r, ms in s], "fit": plugin_fit(s)}
        return out


def table_field(hybrid_stats: dict | None) -> dict:
    """{"plugin": {...}} for a cost table of a run (module docstring), from its hybrid_stats RPC answer ({"workers":
    [stats, ...]}: the first worker's); in_draft from its profiling steps when it had any (a table vLLM profiled in
    a hybrid run); and {"skip": {...}}, the plugin's skip table (the skipped pass's cost by requests) where it had
    one. {} when the plugin did not run or timed no live step."""
    ws = (hybrid_stats or {}).get("workers") or []
    w0 = ws[0] if ws and isinstance(ws[0], dict) else {}
    skip = w0.get("skip_table") or []  # vLLM-style table by requests (index 0: none): the skipped pass's cost
    out = {"skip": {"num_reqs": list(range(1, len(skip))), "ms": [float(x) for x in skip[1:]]}} if len(skip) > 1 else {}
    pm = w0.get("plugin_ms") or {}
    live = (pm.get("live") or {}).get("fit")
    if not live:
        return out
    held = (pm.get("profiled") or {}).get("fit")
    return {**out, "plugin": dict(live, **({"in_draft": held} if held else {}))}
