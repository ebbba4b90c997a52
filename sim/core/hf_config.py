"""A Hugging Face config.json translated into the simulator's model spec (LLMSpec), for `--model path/config.json`
or `--model MODEL_DIR` (sim.core.models.get_llm reads it; nothing is downloaded).

Field by field (Hugging Face -> LLMSpec):
  num_hidden_layers -> num_layers; hidden_size; intermediate_size; num_attention_heads; vocab_size
  num_key_value_heads -> num_kv_heads         (absent: num_attention_heads, plain multi-head attention)
  head_dim                                    (absent or null: hidden_size / num_attention_heads)
  tie_word_embeddings -> tied_embeddings      (absent: false, the Llama / Qwen / Mistral default)
  torch_dtype (or dtype) -> dtype_bytes       bfloat16, float16: 2; float32: 4; float8_*: 1 (absent: 2);
                                              quantization_config with quant_method fp8: 1
  max_position_embeddings -> max_model_len    (vLLM's default context length)
  _name_or_path "org/name" -> hf_id; a tokenizer.json beside the config.json -> tokenizer
  num_params = LLMSpec.architecture_params (the count its widths imply: layers + embedding + LM head unless tied)

Mixture of experts (params; h hidden, L layers, V vocabulary). Mixtral (num_local_experts) routes every layer's MLP,
its intermediate_size the expert width I_e; Qwen2/Qwen3-MoE (num_experts with moe_intermediate_size = I_e) route
every decoder_sparse_step-th layer not listed in mlp_only_layers, the others dense of intermediate_size I, plus a
shared expert of width I_s = shared_expert_intermediate_size (0 when absent). With E experts, k =
num_experts_per_tok, L_s routed layers and attn = h*H*d + 2*h*KV*d + H*d*h per layer:
  expert_params = L_s * E * 3*h*I_e
  num_params    = L*attn + (L - L_s)*3*h*I + L_s*(h*E + 3*h*I_s) + expert_params + V*h*(1 if tied else 2)
  active_params = num_params - expert_params + L_s * k * 3*h*I_e
and the spec's intermediate_size (its shared-expert width) is I_s, or I_e where there is none.

What the spec cannot describe is refused in one line naming the field (ConfigError): latent attention
(kv_lora_rank), sliding-window or linear-attention layers, encoder-decoder and multimodal configs, other quantised
weights, other expert layouts.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from sim.infra.errors import ConfigError

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float8_e4m3fn": 1,
                "float8_e5m2": 1, "float8_e4m3fnuz": 1}
_HINT = "write a spec of the fields in models/README.md instead"

# (field, present in a way the spec cannot describe, what it is)
_UNTRANSLATABLE: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("kv_lora_rank", bool, "multi-head latent attention"),
    ("text_config", lambda v: isinstance(v, dict), "a multimodal model; save its text_config as a config.json of its own"),
    ("is_encoder_decoder", lambda v: v is True, "an encoder-decoder model"),
    ("use_sliding_window", lambda v: v is True, "sliding-window attention"),
    ("layer_types", lambda v: isinstance(v, list) and any(t != "full_attention" for t in v),
     "layers of another attention kind (sliding-window or linear)"),
    ("n_routed_experts", bool, "a DeepSeek-style expert layout"),
    ("moe_num_experts", bool, "an expert layout other than Mixtral's or Qwen-MoE's"),
)


def is_hf_config(data: dict) -> bool:
    """A Hugging Face config.json (not a models/llms spec, whose layer count is `num_layers`)."""
    return "num_hidden_layers" in data or "model_type" in data or "architectures" in data


# The largest value each integer field may take: far above any real model (the largest today are ~1e5 wide, ~1e3
# deep, ~1e3 experts), low enough that every product of them stays an exact float, so an absurd integer (401 digits,
# 10**300) is refused in one line naming the field instead of overflowing the parameter count.
_MAX = {"num_hidden_layers": 2**16, "hidden_size": 2**22, "num_attention_heads": 2**16, "num_key_value_heads": 2**16,
        "head_dim": 2**16, "vocab_size": 2**26, "intermediate_size": 2**24, "moe_intermediate_size": 2**24,
        "shared_expert_intermediate_size": 2**24, "num_local_experts": 2**16, "num_experts": 2**16,
        "num_experts_per_tok": 2**16, "decoder_sparse_step": 2**16, "max_position_embeddings": 2**31,
        "num_nextn_predict_layers": 2**10}


def _int(cfg: dict, key: str, where: str, default: int | None = None, least: int = 1) -> int:
    """The integer field `key` of `cfg`, within [least, _MAX[key]]; `default` when absent or null (None: required)."""
    v = cfg.get(key)
    if v is None:
        if default is None:
            raise ConfigError(f"{where}: missing field '{key}' (a decoder-only transformer's config.json has it)")
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise ConfigError(f"{where}: field '{key}' must be {'a positive integer' if least == 1 else f'an integer >= {least}'}, "
                          f"got {_shown(v)}")
    if v > _MAX[key]:
        raise ConfigError(f"{where}: field '{key}' is {_shown(v)}, over the largest a model may have ({_MAX[key]})")
    return v


def _shown(v) -> str:
    """A value for a message, a number of hundreds of digits cut short."""
    text = repr(v)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def _dtype_bytes(cfg: dict, where: str) -> int:
    quant = cfg.get("quantization_config")
    if quant is not None and not isinstance(quant, dict):  # a string or a list: not ignored (it would cost as bf16)
        raise ConfigError(f"{where}: field 'quantization_config' must be an object (with quant_method), got "
                          f"{type(quant).__name__} {_shown(quant)}")
    if isinstance(quant, dict):
        method = quant.get("quant_method")
        if method != "fp8":
            raise ConfigError(f"{where}: quantization_config (quant_method {method!r}): quantised weights other than fp8 "
                              f"cannot be translated; {_HINT}")
        return 1
    key = "torch_dtype" if "torch_dtype" in cfg else "dtype"
    v = cfg.get(key)
    if v is None:
        return 2
    if not isinstance(v, str) or v.removeprefix("torch.") not in _DTYPE_BYTES:
        raise ConfigError(f"{where}: field '{key}' {v!r} is not one of {', '.join(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[v.removeprefix("torch.")]


def _moe(cfg: dict, where: str, L: int, h: int, I: int) -> dict | None:
    """(LLMSpec MoE fields, routed layers' extra params) per the module docstring; None for a dense config."""
    if cfg.get("num_local_experts"):  # Mixtral: every layer routed, intermediate_size is the expert width
        E, Ie, Is, sparse = _int(cfg, "num_local_experts", where), I, 0, L
    elif cfg.get("num_experts") and cfg.get("moe_intermediate_size"):  # Qwen2/Qwen3-MoE
        E, Ie = _int(cfg, "num_experts", where), _int(cfg, "moe_intermediate_size", where)
        Is = _int(cfg, "shared_expert_intermediate_size", where, default=0, least=0)  # 0: no shared expert
        step = _int(cfg, "decoder_sparse_step", where, default=1)
        dense_only = cfg.get("mlp_only_layers") or []
        if not isinstance(dense_only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense_only):
            raise ConfigError(f"{where}: field 'mlp_only_layers' must be a list of layer indices, got {dense_only!r}")
        sparse = sum(1 for i in range(L) if (i + 1) % step == 0 and i not in dense_only)
    elif cfg.get("num_experts"):
        raise ConfigError(f"{where}: num_experts without moe_intermediate_size: an expert layout other than "
                          f"Mixtral's or Qwen-MoE's cannot be translated; {_HINT}")
    else:
        return None
    k = _int(cfg, "num_experts_per_tok", where)
    if k > E:
        raise ConfigError(f"{where}: num_experts_per_tok {k} exceeds the {E} experts")
    expert = sparse * E * 3 * h * Ie
    return {"num_experts": E, "experts_per_token": k, "expert_params": float(expert),
            "active_expert_params": float(sparse * k * 3 * h * Ie),
            "extra": sparse * (h * E + 3 * h * Is) + expert - sparse * 3 * h * I,
            "intermediate_size": Is or Ie}


def from_hf_config(cfg: dict, path: Path, LLMSpec: Callable[..., Any]):  # noqa: N803 - the class itself
    """The LLMSpec of a Hugging Face config.json `cfg` read from `path` (module docstring), built by `LLMSpec`
    (sim.core.models passes its class: this module stays below it); ConfigError naming the file and field for
    what cannot be translated."""

    where = str(path)
    for key, bad, what in _UNTRANSLATABLE:
        if key in cfg and bad(cfg[key]):
            raise ConfigError(f"{where}: field '{key}' ({what}) cannot be translated into a model spec; {_HINT}")
    window = cfg.get("sliding_window")  # Mistral's: a window with no use_sliding_window switch (Qwen's says false)
    if isinstance(window, int) and not isinstance(window, bool) and "use_sliding_window" not in cfg:
        raise ConfigError(f"{where}: field 'sliding_window' ({window}: sliding-window attention) cannot be translated "
                          f"into a model spec; {_HINT}")
    L, h = _int(cfg, "num_hidden_layers", where), _int(cfg, "hidden_size", where)
    H, V = _int(cfg, "num_attention_heads", where), _int(cfg, "vocab_size", where)
    KV = _int(cfg, "num_key_value_heads", where, default=H)
    if h % H and cfg.get("head_dim") is None:
        raise ConfigError(f"{where}: hidden_size {h} is not a multiple of num_attention_heads {H}; give head_dim")
    d = _int(cfg, "head_dim", where, default=h // H)
    I = _int(cfg, "intermediate_size", where, default=cfg.get("moe_intermediate_size") or None)
    tied = cfg.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise ConfigError(f"{where}: field 'tie_word_embeddings' must be true or false, got {tied!r}")
    name_or_path = cfg.get("_name_or_path")
    hf_id = name_or_path if isinstance(name_or_path, str) and not name_or_path.startswith(("/", ".", "~")) \
        and name_or_path.count("/") == 1 else ""
    tok = path.parent / "tokenizer.json"
    max_len = cfg.get("max_position_embeddings")
    mtp = _int(cfg, "num_nextn_predict_layers", where, default=0, least=0)  # DeepSeek's MTP modules (vLLM's 'mtp')
    if isinstance(max_len, int) and not isinstance(max_len, bool) and max_len > 0:
        _int(cfg, "max_position_embeddings", where)  # bounded like every other integer
    common = dict(name=(path.parent.name if path.name == "config.json" else path.stem).lower(), num_layers=L,
                  hidden_size=h, num_attention_heads=H, num_kv_heads=KV, head_dim=d, vocab_size=V, tied_embeddings=tied,
                  dtype_bytes=_dtype_bytes(cfg, where), hf_id=hf_id, tokenizer=str(tok) if tok.is_file() else "",
                  max_model_len=max_len if isinstance(max_len, int) and not isinstance(max_len, bool) and max_len > 0
                  else None, mtp_layers=mtp, source=f"translated from the Hugging Face config {where} (sim/core/hf_config.py)")
    moe = _moe(cfg, where, L, h, I)
    attn_and_dense = L * (h * H * d + 2 * h * KV * d + H * d * h + 3 * h * I) + V * h * (1 if tied else 2)
    if moe is None:
        return LLMSpec(**common, intermediate_size=I, num_params=float(attn_and_dense))
    total = float(attn_and_dense + moe["extra"])
    return LLMSpec(**common, intermediate_size=moe["intermediate_size"], num_params=total,
                   num_experts=moe["num_experts"], experts_per_token=moe["experts_per_token"],
                   expert_params=moe["expert_params"],
                   active_params=total - moe["expert_params"] + moe["active_expert_params"])
