"""CostConfig: which LLM on which GPU, how much memory the KV cache gets, which drafter; validated once.

KV capacity follows vLLM's rule, per GPU of the tensor-parallel group of TP GPUs (weights split TP ways, KV
heads min(TP, num_kv_heads) ways; every GPU holds the same tokens):
    kv_pool_bytes = memory_gib * 2**30 * gpu_memory_utilization
                    - (target weights + drafter weights) / TP - activation reserve
    kv_capacity_tokens = floor(kv_pool_bytes / ((target KV bytes/token + drafter KV bytes/token) / min(TP, KV heads)))
activation reserve (an estimate of what vLLM's profiling run measures as peak non-KV memory):
    non_torch_memory_gib * 2**30                                   (CUDA context, graphs, NCCL)
  + max_num_batched_tokens * dtype * (3*I + (H + 2*KV)*d + 4*h)    (MLP, qkv, residual activations)
  + max_num_seqs * vocab * 4                                       (fp32 logits of the sampler warm-up)
For qwen3-8b on h100-sxm at 0.9: about 54 GiB of KV, about 390k tokens, so 128 requests of 7k tokens
(about 130 GB at 144 KiB/token) do not fit and must queue or preempt.
"""
from __future__ import annotations

from dataclasses import dataclass

from sim.infra.errors import ConfigError
from sim.core.models import (DEFAULT_DRAFTER_COST, DEFAULT_GPU, DEFAULT_LLM, GIB, DrafterCostSpec, GPUSpec, LLMSpec,
                        get_drafter_cost, get_gpu, get_llm)


@dataclass(frozen=True)
class CostConfig:
    """One deployment: target LLM, GPU, memory share, drafter. Impossible configs raise ConfigError."""

    llm: str = DEFAULT_LLM
    gpu: str = DEFAULT_GPU
    gpu_memory_utilization: float = 0.9
    drafter: str | None = DEFAULT_DRAFTER_COST   # drafter cost spec name; None = no model drafter
    draft_layers: int | None = None               # override the drafter spec's draft_layers
    tensor_parallel_size: int = 1
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256

    def __post_init__(self) -> None:
        u = self.gpu_memory_utilization
        if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0.0 < u <= 1.0:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {u!r}")
        tp = self.tensor_parallel_size
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1 or tp & (tp - 1):
            raise ConfigError(f"tensor_parallel_size must be a power of two >= 1, got {tp!r}")
        for f in ("max_num_batched_tokens", "max_num_seqs"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(f"{f} must be a positive integer, got {v!r}")
        d = self.draft_layers
        if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 0):
            raise ConfigError(f"draft_layers must be a non-negative integer, got {d!r}")
        # resolve names now so unknown ones fail at the boundary
        self.llm_spec, self.gpu_spec, self.drafter_spec  # noqa: B018
        if tp > 1 and self.gpu_spec.interconnect_gbps <= 0:
            raise ConfigError(f"gpu '{self.gpu}' states no interconnect_gbps; tensor_parallel_size={tp} needs it "
                              f"(models/gpus/{self.gpu}.json)")
        if self.kv_pool_bytes <= 0 or self.kv_capacity_tokens <= 0:
            need = ((self.llm_spec.weight_bytes + self.drafter_resident_bytes) / self.tensor_parallel_size
                    + self.activation_reserve_bytes) / GIB
            have = self.gpu_spec.memory_gib * self.gpu_memory_utilization
            raise ConfigError(
                f"{self.llm} does not fit on {self.gpu} at gpu_memory_utilization={self.gpu_memory_utilization}: "
                f"weights + activations need {need:.1f} GiB of the {have:.1f} GiB available, leaving no room "
                f"for the KV cache; choose a smaller model, a larger GPU or a higher utilisation")

    # resolved specs --------------------------------------------------------------------------------
    @property
    def llm_spec(self) -> LLMSpec:
        return get_llm(self.llm)

    @property
    def gpu_spec(self) -> GPUSpec:
        return get_gpu(self.gpu)

    @property
    def drafter_spec(self) -> DrafterCostSpec | None:
        if self.drafter is None:
            return None
        spec = get_drafter_cost(self.drafter)
        if self.draft_layers is not None and self.draft_layers != spec.draft_layers:
            spec = DrafterCostSpec(**{**spec.__dict__, "draft_layers": self.draft_layers})
        return spec

    # memory ----------------------------------------------------------------------------------------
    @property
    def activation_reserve_bytes(self) -> float:
        m, g = self.llm_spec, self.gpu_spec
        per_tok = m.dtype_bytes * (3 * m.intermediate_size
                                   + (m.num_attention_heads + 2 * m.num_kv_heads) * m.head_dim
                                   + 4 * m.hidden_size)
        return (g.non_torch_memory_gib * GIB + self.max_num_batched_tokens * per_tok
                + self.max_num_seqs * m.vocab_size * 4)

    @property
    def drafter_resident_bytes(self) -> float:
        d = self.drafter_spec
        return 0.0 if d is None else float(d.resident_params(self.llm_spec)) * self.llm_spec.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per context token on one GPU: the target's, plus the drafter's own layers if it caches
        context, split over min(TP, KV heads) GPUs."""
        d = self.drafter_spec
        total = self.llm_spec.kv_bytes_per_token + (0 if d is None else d.kv_bytes_per_token(self.llm_spec))
        return total // min(self.tensor_parallel_size, self.llm_spec.num_kv_heads)

    @property
    def kv_pool_bytes(self) -> float:
        return (self.gpu_spec.memory_gib * GIB * self.gpu_memory_utilization
                - (self.llm_spec.weight_bytes + self.drafter_resident_bytes) / self.tensor_parallel_size
                - self.activation_reserve_bytes)

    @property
    def kv_capacity_tokens(self) -> int:
        return max(0, int(self.kv_pool_bytes // self.kv_bytes_per_token))
