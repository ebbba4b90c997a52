"""The step-cost interface every cost model implements (analytic roofline, profiled tables).

One engine step of speculative decoding costs, on the GPU,
    draft_ms + ngram_ms + alloc_ms + verify_ms + sample_ms
(alloc_ms plus plugin_ms for a policy vLLM runs through this project's plugin: Policy.runs_plugin)
and, on the CPU, cpu_ms of scheduling work that overlaps the GPU under asynchronous scheduling.
All times are milliseconds. Token counts are positions processed by the target in one forward pass
(decode positions + verified draft slots + prefill chunk tokens). kv_tokens is the total context (KV
cache entries) the step's attention reads, summed over sequences.
"""
from __future__ import annotations

import bisect

from abc import ABC, abstractmethod

import numpy as np

# vLLM 0.33's VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN: cached tokens per dummy request when profiling
PROFILE_CONTEXT_LEN = 8192


def vllm_capture_sizes(max_size: int = 512) -> list[int]:
    """vLLM's default CUDA-graph capture sizes: 1, 2, 4, then steps of 8 to 256, of 16 to max_size."""
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_size + 1, 16))
    return [s for s in sizes if s <= max_size]


class CostModel(ABC):
    """A step-cost model. Implementations must be monotone non-decreasing in every count."""

    name: str = "base"

    @abstractmethod
    def verify_ms(self, num_tokens: np.ndarray | int, kv_tokens: int, num_seqs: int,
                  logit_rows: np.ndarray | int | None = None) -> np.ndarray | float:
        """Target forward pass over `num_tokens` positions for `num_seqs` sequences reading `kv_tokens`
        cached entries, `logit_rows` of which need the LM head and logits (None = all `num_tokens`, as in
        speculative verification; a model that does not price logits separately ignores it).
        Vectorised over `num_tokens` (returns an array of the same shape)."""

    @abstractmethod
    def draft_ms(self, num_reqs: int, block: int) -> float:
        """A neural drafter's pass proposing a block of `block` tokens for each of `num_reqs` requests. Named for
        the kind of work, not for a drafter: each drafter prices itself from it (DrafterSpec.price, DSpark's)."""

    @abstractmethod
    def ngram_ms(self, num_reqs: int, on_gpu: bool = True) -> float:
        """A model-free lookup over each of `num_reqs` requests' context (GPU kernel, or CPU lookup if not on_gpu):
        the kind of work the n-gram drafter (DrafterSpec.price) and the suffix drafter's host lookup price from."""

    @abstractmethod
    def alloc_ms(self, num_reqs: int, policy: str | None = None, adaptive: bool = False) -> float:
        """Allocation kernel (survivals, selection) for `num_reqs` requests of policy `policy` (its name: the key of
        a profiled table's per-policy measurement; None = unspecified); adaptive: the policy runs inside vLLM's
        adaptive verification and pays its per-step work (Policy.adaptive_verification)."""

    def skip_residual_ms(self, num_reqs: int) -> float:
        """What the model drafter still costs on a step of `num_reqs` requests whose block pass the vLLM plugin's skip
        left out [ms] (its context K/V upkeep), charged every step to a policy that runs as the plugin and taken off
        the pass's price, so a skip saves draft_ms - this. 0 here (the whole pass saved): a profiled table's "skip"
        field, the plugin's measured skip table, gives it (sim/core/cost/profiled.py)."""
        return 0.0

    def plugin_ms(self, num_reqs: int) -> float:
        """The vLLM plugin's own work in a step of `num_reqs` decoding requests [ms] (real/vllm_plugin: its observe,
        skip decision and chain choice around DSpark's pass), charged with alloc_ms for a policy that runs as the
        plugin. 0 here: a model that has no measurement of it charges nothing (a profiled table's "plugin" field
        does, sim/core/cost/profiled.py)."""
        return 0.0

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
        """verify_ms for every token count 0..max_tokens at this step's context (the true cost) [ms]."""
        return np.asarray(self.verify_ms(np.arange(max_tokens + 1), kv_tokens, num_seqs), dtype=np.float64)

    def graph_tokens(self, num_tokens: np.ndarray | int) -> np.ndarray | int:
        """Tokens a step of `num_tokens` really runs: up to the largest CUDA-graph capture size the batch
        is padded to the next captured size c >= num_tokens (vLLM replays that graph); above it, as is.
        The engine charges verify_ms at this count, so slots up to the bucket's end cost nothing more."""
        caps = getattr(self, "_caps_arr", None)
        if caps is None:
            caps = self._caps_arr = np.asarray(sorted({int(c) for c in self.capture_sizes if int(c) > 0}), dtype=np.int64)
        if isinstance(num_tokens, (int, np.integer)) and caps.size:  # one step's count: the same rule, no arrays
            cl = getattr(self, "_caps_list", None)
            if cl is None or len(cl) != caps.size:
                cl = self._caps_list = [int(c) for c in caps]
            t = int(num_tokens)
            return cl[min(bisect.bisect_left(cl, t), len(cl) - 1)] if 0 < t <= cl[-1] else t
        t = np.asarray(num_tokens, dtype=np.int64)
        if caps.size == 0:
            return num_tokens
        i = np.minimum(np.searchsorted(caps, t), caps.size - 1)
        out = np.where((t > 0) & (t <= caps[-1]), caps[i], t)
        return out if out.ndim else int(out)

    def charged_verify_table(self, max_tokens: int, kv_tokens: int, num_seqs: int) -> np.ndarray:
        """verify_ms[graph_tokens(t)] for t = 0..max_tokens at this step's context: what a step costs [ms]."""
        memo = self.__dict__.setdefault("_graph_idx", {})
        hit = memo.get(max_tokens)
        if hit is None:  # the padded counts depend only on max_tokens: kept for a bounded number of them
            idx = np.asarray(self.graph_tokens(np.arange(max_tokens + 1)))
            hit = (idx, int(idx.max(initial=0)))
            if len(memo) < 1024:
                memo[max_tokens] = hit
        return self.verify_table(hit[1], kv_tokens, num_seqs)[hit[0]]

    @property
    def vocab_size(self) -> int | None:
        """The target's vocabulary size (sizes vLLM's logits buffer), None if the model does not say."""
        return None

    @property
    def capture_sizes(self) -> list[int]:
        """CUDA-graph capture sizes (tokens) of the simulated deployment; vLLM's defaults up to 512."""
        return vllm_capture_sizes(512)

    def startup_verify_table(self, max_num_batched_tokens: int, max_num_reqs: int, query_per_req: int = 1,
                             context_len: int = PROFILE_CONTEXT_LEN, length: int | None = None) -> np.ndarray:
        """The verify table vLLM 0.33's adaptive verification decides with, profiled once at start-up [ms].

        vLLM (AdaptiveVerificationManager.batches_to_profile / build_cost_tables_from_curves) times dummy
        steps at profile points x = every capture size c <= max_num_batched_tokens, plus, above the
        largest one L, min(1.5 L, M) and L doubled until M = max_num_batched_tokens. A dummy step of x
        tokens has n(x) = min(x, max_num_reqs, M // query_per_req) requests, each with `context_len`
        cached tokens (VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN, 8192 by default): here
            y(x) = verify_ms(x, kv_tokens = n(x) * context_len, num_seqs = n(x))          [ms]
        (context_len = 0 gives a context-free table). The table over t = 0..length-1 is then
            y forced monotone (running maximum over increasing x);
            t <= L: y at the first profile point >= t (graph padding: a step function);
            t > L: linear interpolation between the points above L only (held at the first of them);
            t > last point: extrapolated with the last two points' slope;  floored at 1e-6 ms.
        With no capture sizes (eager), the points are 1, 2, 4, ... up to M, interpolated throughout.
        It does not depend on any step's real context: the engine charges the true cost separately.
        """
        M = max(int(max_num_batched_tokens), 1)
        n_out = M + 1 if length is None else max(int(length), 1)
        caps = sorted({int(c) for c in self.capture_sizes if 0 < int(c) <= M})
        limit = caps[-1] if caps else 0
        if caps:
            tail, size = {min(limit + limit // 2, M)}, limit
            while size < M:
                size = min(2 * size, M)
                tail.add(size)
            points = caps + sorted(tail - set(caps))
        else:
            points = sorted({min(2 ** i, M) for i in range(M.bit_length() + 1)})
        xs = np.asarray(points, dtype=np.float64)
        nreq = np.minimum(np.minimum(xs, max(int(max_num_reqs), 1)), max(M // max(int(query_per_req), 1), 1))
        ys = np.asarray([float(self.verify_ms(int(x), int(n) * int(context_len), int(n))) for x, n in zip(xs, nreq)])
        ys = np.maximum.accumulate(ys)
        t = np.arange(n_out, dtype=np.float64)
        out = ys[np.minimum(np.searchsorted(xs, t, side="left"), xs.size - 1)]
        above = xs > limit
        if above.any():
            smooth = t > limit
            out[smooth] = np.interp(t[smooth], xs[above], ys[above])
        if xs.size > 1:
            past = t > xs[-1]
            out[past] = ys[-1] + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * (t[past] - xs[-1])
        return np.maximum(out, 1e-6)
