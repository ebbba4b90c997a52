"""Data files in models/ loaded by name: LLM architectures, GPU specs and drafter cost shapes.

    get_llm("qwen3-8b") -> LLMSpec        models/llms/<name>.json (or its Hugging Face id, "Qwen/Qwen3-8B"), or
                                          a path: a spec .json of the same fields, a Hugging Face config.json
                                          or a model directory holding one (from_hf_config translates it)
    get_gpu("h100-sxm") -> GPUSpec        models/gpus/<name>.json, or a short name models/gpu-aliases.json
                                          declares ("h100" -> h100-sxm: gpu_name)
    get_drafter_cost("dspark-cost")        models/drafters/<name>.json  (-> DrafterCostSpec)
    list_llms(), list_gpus()

Every spec is a frozen, validated dataclass. Unknown names, missing or unknown fields and impossible
numbers raise ConfigError with one clear message (the valid names, or the file and field at fault).
Units: bytes, FLOPs, milliseconds (ms), microseconds (us) as the field names say; memory in GiB (2**30 B),
bandwidth in TB/s (1e12 B/s), compute in TFLOP/s (1e12 FLOP/s).
The directory can be overridden with the HYBRIDSPEC_MODELS_DIR environment variable (used by tests).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from sim.infra.errors import ConfigError, did_you_mean
from sim.infra import paths

GIB = 1 << 30

DEFAULT_LLM = "qwen3-8b"
DEFAULT_GPU = "h100-sxm"
DEFAULT_DRAFTER_COST = "dspark-cost"

# Fields every data file may carry that are documentation, not model inputs.
_DOC_FIELDS = {"name", "source", "licence", "license", "notes"}
_HF_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # a Hugging Face repository id, "org/name"


def models_dir() -> Path:
    """Root of the data files (repo/models unless HYBRIDSPEC_MODELS_DIR is set)."""
    env = os.environ.get("HYBRIDSPEC_MODELS_DIR")
    return Path(env) if env else paths.REPO / "models"


# --------------------------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class LLMSpec:
    """A dense decoder-only transformer (Llama/Qwen3 shape: GQA attention, SwiGLU MLP).

    Derived quantities (all exact for this architecture family; norms and biases are ignored in the
    per-step traffic because they are < 0.01% of the weights):
      layer_params          = h*(H*d) + 2*h*(KV*d) + (H*d)*h + 3*h*I      (q, k, v, o, gate, up, down)
      linear_params         = L*layer_params + V*h                        (every GEMM weight incl. LM head)
      weight_bytes_per_step = linear_params * dtype_bytes                 (read once per forward pass;
                              the input embedding is a row gather, negligible)
      flops_per_token       = 2 * linear_params                           (one multiply-add per weight)
      kv_bytes_per_token    = L * KV * d * 2 (K and V) * dtype_bytes      (qwen3-8b: 147456 B = 144 KiB)
      attn_flops_per_pair   = 4 * L * H * d                               (QK^T and PV for one query
                              position against one cached position)

    MoE (num_experts E > 0, experts_per_token k): the widths describe the attention, the shared expert
    (intermediate_size) and the vocabulary; the routed experts are given as totals, not derived:
      dense_params          = num_params - expert_params       read by every step whatever its tokens
      weight_bytes          = dense_params * dtype_bytes + expert_params * expert_dtype_bytes   (resident)
      weight_bytes_per_step = dense_params * dtype_bytes       (the routed experts' share is step-dependent:
                              expert_bytes * expert_fraction(T), priced by the cost model)
      expert_fraction(T)    = 1 - (1 - k/E)^T                  expected share of routed experts at least one
                              of T tokens picks, under uniform independent routing [0, 1]
      flops_per_token       = 2 * active_params
    The width-derived parameter check is skipped for MoE models (the totals come from the model card).
    """

    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    dtype_bytes: int
    num_params: float
    source: str = ""
    hf_id: str = ""  # the Hugging Face repository id; get_llm accepts it in place of the name
    tokenizer: str = ""  # what tokenizes its text (sim/core/trace/tokenizer.py): qwen3 or smollm2 (bundled), a
    # tokenizer.json path, or a Hugging Face id read from the local Hugging Face cache; empty: hf_id's
    max_model_len: int | None = None  # context length (tokens; vLLM's default max_model_len: the HF config's
    # max_position_embeddings); a request whose prompt + output exceeds it is refused. None: not checked
    # Mixture of experts (all 0/None: a dense model). See `MoE` in the class docstring.
    num_experts: int = 0                 # routed experts per MoE layer (E)
    experts_per_token: int = 0           # routed experts each token activates (k)
    expert_params: float = 0.0           # weights of all routed experts over all layers (params)
    active_params: float | None = None   # weights one token multiplies (dense part + k experts per layer)
    expert_dtype_bytes: float | None = None  # bytes per routed-expert weight (FP4 with per-32 E8M0 scales: 0.53125)
    mtp_layers: int = 0  # multi-token-prediction modules shipped with the model (vLLM's num_nextn_predict_layers;
    # its speculative method 'mtp' needs one: sim/core/vllm.py). 0: none

    def __post_init__(self) -> None:
        if not isinstance(self.tokenizer, str):
            raise ConfigError(f"llm '{self.name}': tokenizer must be a string, got {self.tokenizer!r}")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or isinstance(self.max_model_len, bool)
                                               or self.max_model_len <= 0):
            raise ConfigError(f"llm '{self.name}': max_model_len must be a positive integer, got {self.max_model_len!r}")
        for f in ("num_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_kv_heads",
                  "head_dim", "vocab_size"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"llm '{self.name}': {f} must be a positive integer, got {v!r}")
        if not isinstance(self.mtp_layers, int) or isinstance(self.mtp_layers, bool) or self.mtp_layers < 0:
            raise ConfigError(f"llm '{self.name}': mtp_layers must be an integer >= 0, got {self.mtp_layers!r}")
        if self.dtype_bytes not in (1, 2, 4):
            raise ConfigError(f"llm '{self.name}': dtype_bytes must be 1, 2 or 4, got {self.dtype_bytes!r}")
        if self.num_attention_heads % self.num_kv_heads:
            raise ConfigError(f"llm '{self.name}': num_attention_heads ({self.num_attention_heads}) must be a "
                              f"multiple of num_kv_heads ({self.num_kv_heads})")
        if not (isinstance(self.num_params, (int, float)) and self.num_params > 0):
            raise ConfigError(f"llm '{self.name}': num_params must be a positive number, got {self.num_params!r}")
        if self.num_experts or self.experts_per_token or self.expert_params:
            self._check_moe()
            return
        arch = self.architecture_params
        if abs(arch / self.num_params - 1.0) > 0.03:
            raise ConfigError(f"llm '{self.name}': num_params {self.num_params:.4g} disagrees with the "
                              f"architecture ({arch:.4g} parameters from its widths); check the data file")

    def _check_moe(self) -> None:
        E, k = self.num_experts, self.experts_per_token
        for f, v in (("num_experts", E), ("experts_per_token", k)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"llm '{self.name}': {f} must be a positive integer for a MoE model, got {v!r}")
        if k > E:
            raise ConfigError(f"llm '{self.name}': experts_per_token ({k}) exceeds num_experts ({E})")
        ep, ap, eb = self.expert_params, self.active_params, self.expert_dtype_bytes
        if isinstance(ep, bool) or not isinstance(ep, (int, float)) or not 0 < ep < self.num_params:
            raise ConfigError(f"llm '{self.name}': expert_params must be in (0, num_params), got {ep!r}")
        if isinstance(ap, bool) or not isinstance(ap, (int, float)) or not 0 < ap <= self.num_params:
            raise ConfigError(f"llm '{self.name}': active_params must be in (0, num_params], got {ap!r}")
        if ap < self.num_params - ep:
            raise ConfigError(f"llm '{self.name}': active_params ({ap:.4g}) is below the dense part "
                              f"num_params - expert_params ({self.num_params - ep:.4g})")
        if eb is not None and (isinstance(eb, bool) or not isinstance(eb, (int, float)) or not 0 < eb <= 4):
            raise ConfigError(f"llm '{self.name}': expert_dtype_bytes must be in (0, 4], got {eb!r}")

    # derived ------------------------------------------------------------------------------------
    @property
    def tokenizer_name(self) -> str:
        """What tokenizes its text: `tokenizer`, else hf_id where that is a repository id ("org/name"); "" when
        the spec names none (trace text is then refused; token ids are used as they are)."""
        if self.tokenizer:
            return self.tokenizer
        hf = self.hf_id.strip()
        return hf if _HF_ID.fullmatch(hf) else ""

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def dense_params(self) -> float:
        """Weights every step reads whatever its tokens (all of them for a dense model)."""
        return float(self.num_params) - float(self.expert_params)

    @property
    def expert_bytes(self) -> float:
        """Bytes of all routed experts (0 for a dense model)."""
        eb = self.dtype_bytes if self.expert_dtype_bytes is None else self.expert_dtype_bytes
        return float(self.expert_params) * eb

    def expert_fraction(self, num_tokens):
        """1 - (1 - k/E)^T: expected share of routed experts a step of T tokens reads (0 for dense)."""
        if not self.is_moe:
            return 0.0 * np.asarray(num_tokens, dtype=np.float64)
        t = np.maximum(np.asarray(num_tokens, dtype=np.float64), 0.0)
        return 1.0 - (1.0 - self.experts_per_token / self.num_experts) ** t

    @property
    def layer_params(self) -> int:
        h, d = self.hidden_size, self.head_dim
        return (h * self.num_attention_heads * d + 2 * h * self.num_kv_heads * d
                + self.num_attention_heads * d * h + 3 * h * self.intermediate_size)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def architecture_params(self) -> int:
        """Parameter count implied by the widths (layers + embeddings + LM head unless tied)."""
        head = 0 if self.tied_embeddings else self.embedding_params
        return self.num_layers * self.layer_params + self.embedding_params + head

    @property
    def linear_params(self) -> int:
        return self.num_layers * self.layer_params + self.embedding_params  # LM head (== embedding if tied)

    @property
    def weight_bytes(self) -> float:
        """Resident weights in GPU memory (bytes)."""
        if self.is_moe:
            return self.dense_params * self.dtype_bytes + self.expert_bytes
        return float(self.num_params) * self.dtype_bytes

    @property
    def weight_bytes_per_step(self) -> float:
        """Weights every step streams (MoE: the dense part only; the experts' part depends on the step)."""
        if self.is_moe:
            return self.dense_params * self.dtype_bytes
        return float(self.linear_params) * self.dtype_bytes

    @property
    def flops_per_token(self) -> float:
        if self.is_moe:
            return 2.0 * float(self.active_params)
        return 2.0 * self.linear_params

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        return self.num_kv_heads * self.head_dim * 2 * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self.num_layers * self.kv_bytes_per_token_per_layer

    @property
    def attn_flops_per_pair(self) -> float:
        return 4.0 * self.num_layers * self.num_attention_heads * self.head_dim


@dataclass(frozen=True)
class HostSpec:
    """Host (CPU) costs of one engine step. cpu_ms = cpu_sched_ms + R*cpu_sched_us_per_req/1e3 +
    T*cpu_sched_us_per_token/1e3; a host sync (CPU n-gram, CPU-side selection) costs host_sync_ms."""

    cpu_sched_ms: float
    cpu_sched_us_per_req: float
    cpu_sched_us_per_token: float
    host_sync_ms: float
    ngram_cpu_us_per_req: float


@dataclass(frozen=True)
class KernelSpec:
    """Small GPU kernels: n-gram lookup, allocation (survival + top-B), sampling/rejection.
    sample_ms(T) = sample_ms + T * vocab * 4 B * sample_logit_passes / achievable bandwidth."""

    ngram_gpu_ms: float
    ngram_gpu_us_per_req: float
    alloc_ms: float
    alloc_us_per_req: float
    sample_ms: float
    sample_logit_passes: float
    adaptive_ms: float = 0.0          # adaptive verification's own GPU work per step (policies that run in it)
    adaptive_us_per_req: float = 0.0  # ... and per request (see sim/core/cost/roofline.py, alloc_ms)
    adaptive_layer_us: float = 0.0    # ... and per target layer: its variable-length (flattened-query) attention path


@dataclass(frozen=True)
class GPUSpec:
    """One GPU: datasheet peaks plus fitted efficiencies (see models/README.md for the fit).

    memory_gib               capacity the driver reports (GiB)
    memory_bandwidth_tbps    peak HBM bandwidth (1e12 B/s)
    bf16_tflops              dense BF16 tensor-core peak (1e12 FLOP/s)
    bandwidth_efficiency     achievable fraction of the bandwidth when streaming weights / KV
    flops_efficiency         achievable fraction of bf16_tflops for large GEMMs (sets the per-token slope)
    attention_flops_efficiency  achievable fraction of bf16_tflops in attention kernels
    exposed_weight_fraction  fraction of the weight-streaming time still exposed once a step is
                             compute-bound (sets where the knee is)
    step_overhead_ms, layer_overhead_us  fixed per-step launch/overhead time: step + per layer
    non_torch_memory_gib     CUDA context, graphs, NCCL: memory outside the KV pool and the weights
    cuda_graph_max_tokens    largest CUDA-graph capture size (vLLM default capture sizes go up to 512)
    interconnect_gbps        per-GPU all-reduce bus bandwidth under tensor parallelism (GB/s; 0 = not given)
    allreduce_us             latency of one small all-reduce across the tensor-parallel group (us)
    piecewise_layer_us       extra time per target layer of a step above cuda_graph_max_tokens, which runs
                             without its full CUDA graph (vLLM: piecewise graphs, attention launched eagerly) (us;
                             0 = not given)
    """

    name: str
    memory_gib: float
    memory_bandwidth_tbps: float
    bf16_tflops: float
    bandwidth_efficiency: float
    flops_efficiency: float
    attention_flops_efficiency: float
    exposed_weight_fraction: float
    step_overhead_ms: float
    layer_overhead_us: float
    non_torch_memory_gib: float
    cuda_graph_max_tokens: int
    host: HostSpec
    kernels: KernelSpec
    source: str = ""
    interconnect_gbps: float = 0.0
    allreduce_us: float = 0.0
    piecewise_layer_us: float = 0.0

    def __post_init__(self) -> None:
        for f in ("interconnect_gbps", "allreduce_us", "piecewise_layer_us"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ConfigError(f"gpu '{self.name}': {f} must be a number >= 0, got {v!r}")
        for f in ("memory_gib", "memory_bandwidth_tbps", "bf16_tflops"):
            if not getattr(self, f) > 0:
                raise ConfigError(f"gpu '{self.name}': {f} must be > 0, got {getattr(self, f)!r}")
        for f in ("bandwidth_efficiency", "flops_efficiency", "attention_flops_efficiency"):
            v = getattr(self, f)
            if not 0.0 < v <= 1.0:
                raise ConfigError(f"gpu '{self.name}': {f} must be in (0, 1], got {v!r}")
        if not 0.0 <= self.exposed_weight_fraction < 1.0:
            raise ConfigError(f"gpu '{self.name}': exposed_weight_fraction must be in [0, 1), "
                              f"got {self.exposed_weight_fraction!r}")
        for f in ("step_overhead_ms", "layer_overhead_us", "non_torch_memory_gib"):
            if getattr(self, f) < 0:
                raise ConfigError(f"gpu '{self.name}': {f} must be >= 0, got {getattr(self, f)!r}")
        if not isinstance(self.cuda_graph_max_tokens, int) or self.cuda_graph_max_tokens < 0:
            raise ConfigError(f"gpu '{self.name}': cuda_graph_max_tokens must be a non-negative integer")
        for sub in (self.host, self.kernels):
            for f in dataclasses.fields(sub):
                if getattr(sub, f.name) < 0:
                    raise ConfigError(f"gpu '{self.name}': {f.name} must be >= 0")

    @property
    def bytes_per_ms(self) -> float:
        """Achievable memory bandwidth in bytes per millisecond."""
        return self.memory_bandwidth_tbps * 1e12 * self.bandwidth_efficiency / 1e3

    @property
    def flops_per_ms(self) -> float:
        """Achievable GEMM throughput in FLOPs per millisecond."""
        return self.bf16_tflops * 1e12 * self.flops_efficiency / 1e3

    @property
    def attn_flops_per_ms(self) -> float:
        return self.bf16_tflops * 1e12 * self.attention_flops_efficiency / 1e3


@dataclass(frozen=True)
class DrafterCostSpec:
    """Cost shape of a model-based block drafter (DSpark) relative to its target LLM.

    draft_layers      decoder layers of the target's own shape
    fusion_inputs     target hidden states concatenated into the drafter's input projection
                      (fusion_inputs*h x h weights; 0 = none)
    include_lm_head   the drafter evaluates a target-sized LM head (V x h) at every block position
    overhead_ms, layer_overhead_us   its own launch overhead: per step + per drafter layer
    caches_context_kv the drafter keeps K/V of the context for its layers (costs KV memory and reads)
    sequential        an EAGLE-style head: a chain of K tokens takes K passes, one after another, each over
                      one position per request (its cost grows with every draft token); False: DSpark's
                      block drafter, one pass over all K positions of every request
    """

    name: str
    draft_layers: int = 2
    fusion_inputs: int = 3
    include_lm_head: bool = True
    overhead_ms: float = 0.15
    layer_overhead_us: float = 30.0
    caches_context_kv: bool = True
    sequential: bool = False
    draft_vocab_size: int | None = None  # a reduced draft vocabulary for the LM head (EAGLE-3); None: the target's
    source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.sequential, bool):
            raise ConfigError(f"drafter '{self.name}': sequential must be true or false, got {self.sequential!r}")
        if not isinstance(self.draft_layers, int) or isinstance(self.draft_layers, bool) or self.draft_layers < 0:
            raise ConfigError(f"drafter '{self.name}': draft_layers must be a non-negative integer, "
                              f"got {self.draft_layers!r}")
        if not isinstance(self.fusion_inputs, int) or self.fusion_inputs < 0:
            raise ConfigError(f"drafter '{self.name}': fusion_inputs must be a non-negative integer")
        if self.overhead_ms < 0 or self.layer_overhead_us < 0:
            raise ConfigError(f"drafter '{self.name}': overheads must be >= 0")
        v = self.draft_vocab_size
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            raise ConfigError(f"drafter '{self.name}': draft_vocab_size must be a positive integer, got {v!r}")

    def params(self, llm: LLMSpec) -> int:
        """GEMM weights the drafter reads per forward pass (LM head included if it evaluates one)."""
        h = llm.hidden_size
        p = self.draft_layers * llm.layer_params + self.fusion_inputs * h * h
        if self.include_lm_head:
            p += (self.draft_vocab_size or llm.vocab_size) * h
        return p

    def resident_params(self, llm: LLMSpec) -> int:
        """Extra weights in GPU memory (the LM head is shared with the target, as EAGLE-style drafters do,
        unless the drafter has its own reduced-vocabulary head)."""
        h = llm.hidden_size
        own_head = (self.draft_vocab_size or 0) * h if self.include_lm_head else 0
        return self.draft_layers * llm.layer_params + self.fusion_inputs * h * h + own_head

    def kv_bytes_per_token(self, llm: LLMSpec) -> int:
        return self.draft_layers * llm.kv_bytes_per_token_per_layer if self.caches_context_kv else 0


# --------------------------------------------------------------------------------------------- loading
def _key(name: object) -> str:
    if not isinstance(name, str):
        raise ConfigError(f"a model/gpu/drafter name must be a string, got {name!r}")
    return name.strip().lower()


def _names(kind: str) -> list[str]:
    d = models_dir() / kind
    return sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []


def list_llms() -> list[str]:
    return _names("llms")


def list_gpus() -> list[str]:
    return _names("gpus")


def read_json_object(path: Path, what: str, finite: bool = True) -> dict[str, Any]:
    """A JSON data file that must hold one object, read through the input layer (sim/infra/inputs.py: a regular
    file, capped, strict JSON with finite numbers only); ConfigError naming the file (and `what` it was read as)
    otherwise. finite=False: NaN and Infinity are kept, for a caller whose field checks name the field."""
    from sim.infra.inputs import RECORD, Obj, read_json

    return read_json(path, RECORD, Obj({}, expected=f"a JSON object (a {what})"), what=what, finite=finite)


def _read(kind: str, what: str, name: str, valid: list[str]) -> tuple[Path, dict[str, Any]]:
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{what} name must be a non-empty string; choose one of: {', '.join(valid)}")
    key = name.strip().lower()
    path = models_dir() / kind / f"{key}.json"
    if not path.is_file():
        raise ConfigError(f"unknown {what} '{name}'{did_you_mean(name, valid)}; choose one of: "
                          f"{', '.join(valid) or '(none found)'}")
    data = read_json_object(path, f"{what} data file")
    data.setdefault("name", key)
    return path, data


def _build(cls, path: Path, data: dict[str, Any], nested: dict[str, type] | None = None):
    nested = nested or {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields) - _DOC_FIELDS
    if unknown:
        raise ConfigError(f"{path}: unknown field(s) {', '.join(sorted(unknown))}; "
                          f"expected: {', '.join(sorted(fields))}")
    kw: dict[str, Any] = {}
    for fname, f in fields.items():
        if fname in data:
            v = data[fname]
            if fname in nested:
                if not isinstance(v, dict):
                    raise ConfigError(f"{path}: field '{fname}' must be an object")
                v = _build(nested[fname], path, v)
            kw[fname] = v
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:  # type: ignore[misc]
            raise ConfigError(f"{path}: missing field '{fname}'")
    try:
        return cls(**kw)
    except TypeError as e:
        raise ConfigError(f"{path}: {e}") from None


@lru_cache(maxsize=None)
def _hf_ids(root: str, original_case: bool = False) -> dict[str, str]:
    """Hugging Face id (lower-cased unless original_case) -> models/llms name, for every bundled model with one."""
    out = {}
    for n in list_llms():
        try:
            hf = json.loads((models_dir() / "llms" / f"{n}.json").read_text()).get("hf_id")
        except (OSError, ValueError):
            continue  # get_llm names the broken file when it is asked for
        if isinstance(hf, str) and "/" in hf:
            out[hf.strip() if original_case else hf.strip().lower()] = n
    return out


def is_spec_path(name: str) -> bool:
    """`name` names a file rather than a bundled model: a .json (a spec of LLMSpec's fields or a Hugging Face
    config.json) or a directory (a Hugging Face model directory: its config.json)."""
    return name.strip().lower().endswith(".json") or Path(name.strip()).expanduser().is_dir()


def llm_name(name: str) -> str:
    """The models/llms name of `name`: itself (any case), or the model whose hf_id it is ("Qwen/Qwen3-8B" ->
    "qwen3-8b"); a path (is_spec_path) comes back as given, for get_llm to read. An unknown name comes back
    lower-cased (get_llm then lists the valid ones)."""
    key = _key(name)
    if key in list_llms():
        return key
    hf = _hf_ids(str(models_dir())).get(key)
    if hf is None and is_spec_path(name):
        return name.strip()
    return hf or key


def _llm_file(name: str) -> LLMSpec:
    """The model spec at the path `name` (a spec .json, a Hugging Face config.json, or a directory holding one)."""
    from sim.infra.inputs import check_regular

    p = Path(name).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not os.path.lexists(p):
        raise ConfigError(f"model spec {p} not found (a models/llms name, a Hugging Face id, a spec .json, a Hugging "
                          f"Face config.json or a model directory holding one)")
    st = check_regular(p, "model spec")  # a pipe, a device or a folder: named as what it is, never opened
    return _read_llm_file(str(p.resolve()), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=None)
def _read_llm_file(path: str, mtime_ns: int, size: int) -> LLMSpec:  # mtime and size: an edited file is re-read
    from sim.core.hf_config import from_hf_config, is_hf_config

    p = Path(path)
    data = read_json_object(p, "model spec")
    if is_hf_config(data):
        return from_hf_config(data, p, LLMSpec)
    data.setdefault("name", p.stem.lower())
    tok = data.get("tokenizer")
    if isinstance(tok, str) and tok.lower().endswith(".json") and not Path(tok).expanduser().is_absolute():
        data["tokenizer"] = str(p.parent / tok)  # a tokenizer.json named relative to the spec: found from anywhere
    return _build(LLMSpec, p, data)


@lru_cache(maxsize=None)
def _get_llm(name: str, root: str) -> LLMSpec:
    hf = sorted(f"{h} ({n})" for h, n in _hf_ids(root, original_case=True).items())
    valid = list_llms() + ([f"or a Hugging Face id: {', '.join(hf)}"] if hf else [])
    path, data = _read("llms", "model", name, valid + ["or a path: a spec .json, a Hugging Face config.json or a "
                                                        "model directory (docs/your-model.md)"])
    return _build(LLMSpec, path, data)


@lru_cache(maxsize=None)
def _get_gpu(name: str, root: str) -> GPUSpec:
    path, data = _read("gpus", "gpu", name, list_gpus())
    return _build(GPUSpec, path, data, nested={"host": HostSpec, "kernels": KernelSpec})


@lru_cache(maxsize=None)
def _get_drafter_cost(name: str, root: str) -> DrafterCostSpec:
    valid = [n for n in _names("drafters") if n.endswith("-cost")]
    path, data = _read("drafters", "drafter cost spec", name, valid)
    return _build(DrafterCostSpec, path, data)


def get_llm(name: str = DEFAULT_LLM) -> LLMSpec:
    """The LLM architecture `name` (models/llms/<name>.json, or the model whose `hf_id` is `name`, or a path:
    is_spec_path); ConfigError listing valid names if unknown."""
    key = llm_name(name)
    if key not in list_llms() and is_spec_path(key):
        return _llm_file(key)
    return _get_llm(key, str(models_dir()))


def gpu_aliases() -> dict[str, str]:
    """Short name -> models/gpus name, the table models/gpu-aliases.json declares ("h100" -> "h100-sxm")."""
    return dict(_gpu_aliases(str(models_dir())))


@lru_cache(maxsize=None)
def _gpu_aliases(root: str) -> tuple[tuple[str, str], ...]:
    path = Path(root) / "gpu-aliases.json"
    if not path.is_file():
        return ()
    table = read_json_object(path, "GPU alias table").get("aliases", {})
    if not isinstance(table, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in table.items()):
        raise ConfigError(f"{path}: 'aliases' must map short names to models/gpus names (strings)")
    return tuple((k.strip().lower(), v.strip().lower()) for k, v in table.items())


def gpu_name(name: str) -> str:
    """The models/gpus name `name` stands for: its alias's target (gpu_aliases: "H100" -> "h100-sxm"), else `name`
    as given (a spec name, or with --cost profiled a cost-table path, which get_gpu and the cost model judge)."""
    if not isinstance(name, str):
        return name
    return gpu_aliases().get(name.strip().lower(), name)


def get_gpu(name: str = DEFAULT_GPU) -> GPUSpec:
    """The GPU `name` (models/gpus/<name>.json, or a short name gpu_aliases maps to one); ConfigError listing
    valid names if unknown."""
    return _get_gpu(_key(gpu_name(name)), str(models_dir()))


def get_drafter_cost(name: str = DEFAULT_DRAFTER_COST) -> DrafterCostSpec:
    """The drafter cost shape `name` (models/drafters/<name>.json)."""
    return _get_drafter_cost(_key(name), str(models_dir()))


__all__ = ["LLMSpec", "GPUSpec", "HostSpec", "KernelSpec", "DrafterCostSpec", "get_llm", "get_gpu", "gpu_name", "gpu_aliases",
           "get_drafter_cost", "llm_name", "is_spec_path", "list_llms", "list_gpus", "models_dir", "GIB", "DEFAULT_LLM", "DEFAULT_GPU",
           "DEFAULT_DRAFTER_COST"]
