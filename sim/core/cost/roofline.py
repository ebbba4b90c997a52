"""Analytic roofline step cost: an LLM's shape on a GPU's peaks, with fitted efficiencies.

Notation (units): T tokens (positions) in the forward pass, K cached KV entries read (summed over
sequences), S sequences; BW = achievable bandwidth (bytes/ms) = peak * bandwidth_efficiency;
F = achievable GEMM rate (FLOPs/ms) = peak * flops_efficiency; F_a the attention kernels' rate.

Target forward pass (verify_ms, ms):
    verify(T, K, S) = overhead + linear(T) + attention(T, K, S)          (T >= 1; verify(0) = 0)
    overhead        = step_overhead_ms + num_layers * layer_overhead_us / 1e3
    linear(T)       = max(t_w, beta * t_w + T * s)                       the non-attention layers
        t_w  = weight_bytes_per_step / BW     weights are read once per step        (ms)
        s    = 2 * linear_params / F           ms per token of GEMM work            (ms/token)
        beta = exposed_weight_fraction: once the step is compute-bound, this share of the weight stream is
               still exposed (GEMM prologues, wave tails), so the cost grows as beta*t_w + T*s.
    Flat up to the knee T_k = (1 - beta) * t_w / s, then linear with slope s. The pure roofline
    (beta = 0) puts the knee at the ridge point (about 290 tokens on H100 at 76%/76%); profiled vLLM
    layers turn earlier (about 128 on H100, 64 on A100) with the same slope, which beta ~0.55 reproduces.
    attention(T, K, S) = max(K * kv_bytes_per_token / BW,                KV read once per sequence
                             attn_flops_per_pair * T * (K / S) / F_a)    queries x mean context
    The compute term assumes T's queries spread evenly over the S sequences; at fixed (T, K) more
    sequences mean shorter contexts per query, so this term (and only it) falls as S grows: verify is
    monotone in T and K, and in S whenever the added sequence brings its own context share.

Mixture of experts and tensor parallelism (TP = tensor_parallel_size GPUs, each holding 1/TP of every
weight matrix; these terms are 0 for a dense model on one GPU, and the formulas above are then unchanged):
    t_w(T)  = (dense_bytes + expert_bytes * f(T)) / TP / BW      f(T) = 1 - (1 - k/E)^T (LLMSpec.expert_fraction):
              the routed experts some token of the step picks are streamed, so a MoE step's weight traffic
              grows with its tokens until every expert is read
    s       = 2 * active_params / TP / F                         ms per token
    linear(T) = max(t_w(T), beta * t_w(T) + T * s)
    allreduce(T) = 2 * L * (allreduce_us / 1e3 + T * h * 2 B * 2 (TP-1)/TP / link)   (TP > 1; one all-reduce after
              attention and one after the MLP of every layer, ring all-reduce of bf16 activations,
              link = interconnect_gbps in bytes/ms)
    gather(N) = N * vocab * 2 B * (TP-1)/TP / link   the vocab-parallel LM head's bf16 logits all-gathered for the N
              logit rows of the step (every verified position: fixed K = 7 gathers 8 rows a request)
    attention: KV reads and attention FLOPs split over min(TP, num_kv_heads) and TP GPUs (KV heads fewer than
              TP are replicated, as vLLM does)
    The drafter's weights and FLOPs are split over TP too.

Steps without a full CUDA graph: vLLM captures full graphs up to cuda_graph_max_tokens tokens (L); a larger step
(fixed K = 7 at 256 requests runs 2048) runs piecewise graphs with attention launched eagerly in every layer:
    verify(T, K, S) += piecewise(T) = num_layers * piecewise_layer_us / 1e3   if T > L, else 0
0 in GPU specs that do not state piecewise_layer_us. Start-up profiling prices it as vLLM's does (its points
above L run piecewise), so adaptive verification's budget sees the step up.

Model drafter (draft_ms, ms), a DSpark-like block drafter run once over P = R * block positions:
    draft(R, block, K=0) = d_overhead + max(t_wd, beta * t_wd + P * s_d) + K * kv_d / BW
  an EAGLE-style sequential head (DrafterCostSpec.sequential) runs `block` passes of R positions each:
    draft_seq(R, block, K=0) = block * (d_overhead + max(t_wd, beta * t_wd + R * s_d) + K * kv_d / BW)
        t_wd = drafter_params * dtype / BW,  s_d = 2 * drafter_params / F,  kv_d = drafter KV bytes/token
        d_overhead = overhead_ms + draft_layers * layer_overhead_us / 1e3
Small kernels: ngram(R) = ngram_gpu_ms + R*ngram_gpu_us_per_req/1e3 (GPU) or host_sync_ms +
R*ngram_cpu_us_per_req/1e3 (CPU, blocking); alloc(R) = alloc_ms + R*alloc_us_per_req/1e3, plus, for the
policies that run inside vLLM's adaptive verification (Policy.adaptive_verification, declared by each family:
adaptive, the hybrids, ngram-first, ngram-threshold, the oracle; never read from a name),
adaptive_ms + R*adaptive_us_per_req/1e3 + num_layers*adaptive_layer_us/1e3: its own per-step work
(publishing confidences and copying them to the host, the host-to-device copies of budgets and query lengths, the ranking kernel, the cumsums
that rebuild query_start_loc and cu_num_logits; per layer, the variable-length (flattened-query) attention
path its varlen decode graphs run instead of the uniform decode one; vllm/v1/worker/gpu/spec_decode/
adaptive_verification.py and model_runner.py in vLLM 0.33), 0 in GPU specs that do not state it;
sample(T) = sample_ms + T * vocab * 4 B * passes / BW; cpu(R, T) = cpu_sched_ms + R*us/1e3 + T*us/1e3.
All of these are 0 when their count is 0 (nothing is launched).
"""
from __future__ import annotations

import numpy as np

from sim.core.cost.base import CostModel, vllm_capture_sizes
from sim.core.cost.config import CostConfig


class RooflineCost(CostModel):
    """Roofline cost of one engine step for `config` (a CostConfig, or keyword arguments for one)."""

    name = "roofline"

    def __init__(self, config: CostConfig | None = None, gpu_spec=None, **kw) -> None:
        """gpu_spec (a sim.core.models.GPUSpec) replaces the named GPU's spec: a variant built in memory, as
        sim.api.anchors does while it fits a knob; None: config.gpu's."""
        if config is None:
            config = CostConfig(**kw)
        elif kw:
            config = CostConfig(**{**config.__dict__, **kw})
        self.config = config
        m, g, d = config.llm_spec, gpu_spec or config.gpu_spec, config.drafter_spec
        self.llm, self.gpu, self.drafter = m, g, d
        bw, f = g.bytes_per_ms, g.flops_per_ms
        beta = g.exposed_weight_fraction
        self.beta = beta
        tp = int(config.tensor_parallel_size)
        self.tp = tp
        kv_split = min(tp, m.num_kv_heads)  # KV heads fewer than TP are replicated
        # target -----------------------------------------------------------------------------------
        self.overhead_ms = g.step_overhead_ms + m.num_layers * g.layer_overhead_us / 1e3
        # a step above the largest captured size runs without its full CUDA graph (piecewise)
        self.graph_limit = int(g.cuda_graph_max_tokens)
        self.piecewise_ms = m.num_layers * g.piecewise_layer_us / 1e3
        self.weight_ms = m.weight_bytes_per_step / tp / bw              # t_w (MoE: the dense part)
        self.expert_ms = m.expert_bytes / tp / bw                      # all routed experts (0: dense)
        self.ms_per_token = m.flops_per_token / tp / f                 # s
        self.kv_ms_per_token = m.kv_bytes_per_token / kv_split / bw    # per cached entry read
        self.attn_ms_per_pair = m.attn_flops_per_pair / tp / g.attn_flops_per_ms
        if tp > 1:
            link = g.interconnect_gbps * 1e9 / 1e3  # bytes/ms (> 0: CostConfig checks it)
            self.allreduce_fixed_ms = 2 * m.num_layers * g.allreduce_us / 1e3
            self.allreduce_ms_per_token = 2 * m.num_layers * m.hidden_size * 2 * 2 * (tp - 1) / tp / link
            # the vocab-parallel LM head's logits are all-gathered (bf16), one row per logit position
            self.gather_ms_per_row = m.vocab_size * 2 * (tp - 1) / tp / link
        else:
            self.allreduce_fixed_ms = self.allreduce_ms_per_token = self.gather_ms_per_row = 0.0
        self._plain = self.expert_ms == 0.0 and tp == 1 and self.piecewise_ms == 0.0  # the dense one-GPU formulas
        # drafter ----------------------------------------------------------------------------------
        if d is not None:
            p = d.params(m)
            self.draft_overhead_ms = d.overhead_ms + d.draft_layers * d.layer_overhead_us / 1e3
            self.draft_weight_ms = p * m.dtype_bytes / tp / bw
            self.draft_ms_per_position = 2.0 * p / tp / f
            self.draft_kv_ms_per_token = d.kv_bytes_per_token(m) / kv_split / bw
            self.draft_sequential = bool(d.sequential)
        else:
            self.draft_sequential = False
            self.draft_overhead_ms = self.draft_weight_ms = 0.0
            self.draft_ms_per_position = self.draft_kv_ms_per_token = 0.0
        # small kernels ----------------------------------------------------------------------------
        k, h = g.kernels, g.host
        self.sample_ms_per_token = m.vocab_size * 4.0 * k.sample_logit_passes / bw
        self._kern, self._host = k, h
        self._kv_capacity = config.kv_capacity_tokens
        # verify_table cache: overhead + linear(T) for T = 0..n-1 (index 0 unused), and T as float
        self._tab_base = np.zeros(0)
        self._tab_t = np.zeros(0)

    # ------------------------------------------------------------------------------------ derived
    @property
    def knee_tokens(self) -> float:
        """Tokens per step where the non-attention layers turn compute-bound: (1 - beta) * t_w / s (MoE: with
        the dense part of t_w only)."""
        return (1.0 - self.beta) * self.weight_ms / self.ms_per_token

    @property
    def kv_capacity_tokens(self) -> int:
        return self._kv_capacity

    @property
    def vocab_size(self) -> int:
        return int(self.llm.vocab_size)

    @property
    def capture_sizes(self) -> list[int]:
        """vLLM's default capture sizes up to the GPU spec's cuda_graph_max_tokens."""
        return vllm_capture_sizes(int(self.gpu.cuda_graph_max_tokens))

    def linear_ms(self, num_tokens):
        """Non-attention layers (GEMMs incl. LM head) for `num_tokens` positions, ms (no overhead); with
        tensor parallelism, their all-reduces too."""
        t = np.asarray(num_tokens, dtype=np.float64)
        if self._plain:
            out = np.maximum(self.weight_ms, self.beta * self.weight_ms + t * self.ms_per_token)
            return out if out.ndim else float(out)
        tw = self.weight_ms + self.expert_ms * self.llm.expert_fraction(t)
        out = np.maximum(tw, self.beta * tw + t * self.ms_per_token)
        if self.tp > 1:
            out = out + self.allreduce_fixed_ms + t * self.allreduce_ms_per_token
        return out if out.ndim else float(out)

    def eager_ms(self, num_tokens):
        """What a step of `num_tokens` positions pays for running without its full CUDA graph: piecewise(T) =
        num_layers * piecewise_layer_us / 1e3 when T > cuda_graph_max_tokens, else 0 (ms)."""
        t = np.asarray(num_tokens, dtype=np.float64)
        out = np.where(t > self.graph_limit, self.piecewise_ms, 0.0)
        return out if out.ndim else float(out)

    def decode_step_ms(self, batch: int, context: int = 512, tokens_per_req: int = 1) -> float:
        """A plain step's GPU time (verify + sampling) for `batch` requests of `context` tokens each."""
        t = batch * tokens_per_req
        return float(self.verify_ms(t, batch * context, batch)) + self.sample_ms(t)

    # ------------------------------------------------------------------------------------ interface
    def verify_ms(self, num_tokens, kv_tokens: int, num_seqs: int, logit_rows=None):
        """linear(T) prices the LM head of every position; under tensor parallelism logit_rows (None: T) sets
        the logits all-gather, logit_rows * vocab * 2 B * (TP-1)/TP / link."""
        if not self._plain:
            t = np.asarray(num_tokens, dtype=np.float64)
            kv = max(int(kv_tokens), 0)
            att = np.maximum(kv * self.kv_ms_per_token, t * (self.attn_ms_per_pair * kv / max(int(num_seqs), 1)))
            rows = t if logit_rows is None else np.minimum(np.asarray(logit_rows, dtype=np.float64), t)
            out = np.where(t > 0, self.overhead_ms + self.linear_ms(t) + att + self.eager_ms(t)
                           + rows * self.gather_ms_per_row, 0.0)
            return float(out) if out.ndim == 0 else out
        if type(num_tokens) is int and type(kv_tokens) is int and type(num_seqs) is int:
            # the engine's per-step call: the scalar path below, without its conversions
            if num_tokens <= 0:
                return 0.0
            kv = kv_tokens if kv_tokens > 0 else 0
            t = float(num_tokens)
            lin = self.beta * self.weight_ms + t * self.ms_per_token
            att = t * (self.attn_ms_per_pair * kv / (num_seqs if num_seqs > 1 else 1))
            kv_ms = kv * self.kv_ms_per_token
            lin = lin if lin > self.weight_ms else self.weight_ms
            return self.overhead_ms + lin + (att if att > kv_ms else kv_ms)
        kv = max(int(kv_tokens), 0)
        coef = self.attn_ms_per_pair * kv / max(int(num_seqs), 1)
        kv_ms = kv * self.kv_ms_per_token
        if isinstance(num_tokens, (int, np.integer, float)) and not isinstance(num_tokens, bool):
            t = float(num_tokens)
            if t <= 0:
                return 0.0
            lin = max(self.weight_ms, self.beta * self.weight_ms + t * self.ms_per_token)
            return self.overhead_ms + lin + max(kv_ms, t * coef)
        t = np.asarray(num_tokens, dtype=np.float64)
        out = (self.overhead_ms + np.maximum(self.weight_ms, self.beta * self.weight_ms + t * self.ms_per_token)
               + np.maximum(kv_ms, t * coef))
        return np.where(t > 0, out, 0.0)

    def verify_table(self, max_tokens: int, kv_tokens: int, num_seqs: int) -> np.ndarray:
        """verify_ms for T = 0..max_tokens: cached overhead + linear(T), plus this step's attention term."""
        n = int(max_tokens) + 1
        if n > self._tab_base.size:
            size = max(n, 2 * self._tab_base.size, 1024)
            self._tab_t = np.arange(size, dtype=np.float64)
            self._tab_base = (self.overhead_ms + np.asarray(self.linear_ms(self._tab_t)) + self.eager_ms(self._tab_t)
                              + self._tab_t * self.gather_ms_per_row)  # every position a logit row
        kv = max(int(kv_tokens), 0)
        coef = self.attn_ms_per_pair * kv / max(int(num_seqs), 1)
        out = self._tab_base[:n] + np.maximum(kv * self.kv_ms_per_token, self._tab_t[:n] * coef)
        if n:
            out[0] = 0.0
        return out

    def draft_ms(self, num_reqs: int, block: int, kv_tokens: int = 0) -> float:
        positions = max(int(num_reqs), 0) * max(int(block), 0)
        if positions <= 0 or self.drafter is None:
            return 0.0
        w = self.draft_weight_ms
        if self.draft_sequential:  # `block` passes, one position per request each
            one = (self.draft_overhead_ms + max(w, self.beta * w + int(num_reqs) * self.draft_ms_per_position)
                   + max(int(kv_tokens), 0) * self.draft_kv_ms_per_token)
            return int(block) * one
        return (self.draft_overhead_ms + max(w, self.beta * w + positions * self.draft_ms_per_position)
                + max(int(kv_tokens), 0) * self.draft_kv_ms_per_token)

    def ngram_ms(self, num_reqs: int, on_gpu: bool = True) -> float:
        r = max(int(num_reqs), 0)
        if r == 0:
            return 0.0
        if on_gpu:
            return self._kern.ngram_gpu_ms + r * self._kern.ngram_gpu_us_per_req / 1e3
        return self._host.host_sync_ms + r * self._host.ngram_cpu_us_per_req / 1e3

    def alloc_ms(self, num_reqs: int, policy: str | None = None, adaptive: bool = False) -> float:
        """The allocation kernel, plus adaptive verification's own work where the policy runs inside it
        (`adaptive`: Policy.adaptive_verification)."""
        r = max(int(num_reqs), 0)
        if r == 0:
            return 0.0
        k = self._kern
        out = k.alloc_ms + r * k.alloc_us_per_req / 1e3
        if (k.adaptive_ms or k.adaptive_us_per_req or k.adaptive_layer_us) and adaptive:
            out += k.adaptive_ms + r * k.adaptive_us_per_req / 1e3 + self.llm.num_layers * k.adaptive_layer_us / 1e3
        return out

    def sample_ms(self, num_tokens: int) -> float:
        t = max(int(num_tokens), 0)
        return 0.0 if t == 0 else self._kern.sample_ms + t * self.sample_ms_per_token

    def cpu_ms(self, num_reqs: int, num_tokens: int) -> float:
        r, t = max(int(num_reqs), 0), max(int(num_tokens), 0)
        if r == 0 and t == 0:
            return 0.0
        h = self._host
        return h.cpu_sched_ms + r * h.cpu_sched_us_per_req / 1e3 + t * h.cpu_sched_us_per_token / 1e3

    def host_sync_ms(self) -> float:
        """Cost of one blocking device-to-host synchronisation (a policy that needs the CPU mid-step)."""
        return self._host.host_sync_ms

    def __repr__(self) -> str:
        c = self.config
        return f"RooflineCost(llm={c.llm!r}, gpu={c.gpu!r}, drafter={c.drafter!r})"
