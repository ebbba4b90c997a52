"""Training data for the drafter: the target's own greedy generations on general text, with its hidden states.

For each prompt of traces/general.jsonl (never the chat or code-editing evaluation traces) the target
(SmolLM2-135M-Instruct, real weights) prefills the prompt and decodes greedily up to `max_tokens`, and we
keep, for every token j it ran (forwarded):
  tokens t_j            prompt + generated output (int32)
  g_j                   the target's greedy next token after t_0..t_j (its argmax; int32)
  feats h_j             the outputs of the conditioning layers at j (fp16, [len(layers) * hidden])
On the generated part g_j = t_{j+1} by construction; on the prompt, g_j is the target's prediction given the
human text, and a drafter label there is valid only while the text agrees with the target (see
real/drafter/train.py, `label_mask`).

Collection runs in groups of `batch` prompts; each group is written as one shard file under the cache
directory as soon as it is done (whole or not at all), so an interrupted collection resumes at the next
missing shard. The shard names carry a hash of every setting, so a changed setting never mixes data.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from sim.infra.progress import progress_bar

from sim.infra.errors import ConfigError
from real.engine.greedy import greedy_group

GENERAL_TRACE = "traces/general.jsonl"


@dataclass(frozen=True)
class DataConfig:
    trace: str = GENERAL_TRACE
    num_prompts: int = 320        # prompts taken in trace order (after passing over long ones)
    max_prompt: int = 384         # tokens; longer prompts are passed over (counted)
    max_tokens: int = 192         # greedy output cap per prompt
    batch: int = 64               # prompts decoded together
    layers: tuple[int, ...] = (3, 15, 29)
    purpose: str = "train"        # "train" refuses the evaluation traces; "eval" builds references on any trace

    def validate(self) -> None:
        for name in ("num_prompts", "max_prompt", "max_tokens", "batch"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"data config: {name} must be a positive integer, got {v!r}")
        if self.purpose not in ("train", "eval"):
            raise ConfigError(f"data config: purpose must be 'train' or 'eval', got {self.purpose!r}")
        if self.purpose == "train" and Path(self.trace).name in ("chat.jsonl", "codeedit.jsonl"):
            raise ConfigError(f"{self.trace} is an evaluation trace: the drafter trains on general text only")

    def key(self) -> str:
        """Hash of the settings and of the trace file's bytes (an edited trace never reuses old shards)."""
        h = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode())
        h.update(hashlib.sha256(Path(self.trace).read_bytes()).digest() if Path(self.trace).is_file() else b"")
        return h.hexdigest()[:12]


@dataclass
class Sequence:
    tokens: np.ndarray   # [T] int32
    greedy: np.ndarray   # [F] int32, F = number of forwarded tokens (T - 1, or T when it stopped at EOS)
    feats: torch.Tensor  # [F, len(layers) * hidden] fp16
    prompt_len: int
    # teacher-forced labels only (real/drafter/labels.py): the target's top-k next tokens and probabilities [F, k]
    topk_ids: torch.Tensor | None = None
    topk_p: torch.Tensor | None = None


def data_dir() -> Path:
    from real.engine.weights import cache_dir

    root = cache_dir()
    if root is None:  # caching off: this run's data and checkpoints live in a private folder, removed at exit
        import atexit
        import shutil

        from sim.infra.fsio import private_tempdir

        global _OFF_DIR
        if _OFF_DIR is None:
            _OFF_DIR = private_tempdir("hybridspec-drafter-data-")
            atexit.register(shutil.rmtree, _OFF_DIR, True)
        return _OFF_DIR
    return root / "drafter_data"


_OFF_DIR: Path | None = None


def load_prompts(cfg: DataConfig, tok) -> tuple[list[str], list[np.ndarray], int]:
    """(ids, prompt token ids) of the first cfg.num_prompts prompts of the trace with at most cfg.max_prompt
    tokens (and at least 2, so that output[0] has a context to draft from), and how many were passed over."""
    from sim.core.trace.loader import prompt_texts as _prompts

    ids_out, out, passed = [], [], 0
    for rid, text in _prompts(cfg.trace, None, 0):
        ids = np.asarray(tok.encode(text), dtype=np.int64)
        if not 2 <= len(ids) <= cfg.max_prompt:
            passed += 1
            continue
        ids_out.append(rid)
        out.append(ids)
        if len(out) >= cfg.num_prompts:
            break
    return ids_out, out, passed


def generate_group(model, prompts: list[np.ndarray], max_tokens: int, eos_id: int | None,
                   layers: tuple[int, ...]) -> list[Sequence]:
    """Greedy decoding of one group (one KV slot per prompt) keeping every forwarded token's features
    (real/engine/greedy.py, the same loop as the engine's references)."""
    gens = greedy_group(model, prompts, [max_tokens] * len(prompts), eos_id, hidden_layers=layers)
    return [Sequence(np.concatenate([np.asarray(p, dtype=np.int64), g.output]).astype(np.int32), g.greedy, g.feats,
                     len(p)) for p, g in zip(prompts, gens)]


def _save_shard(path: Path, seqs: list[Sequence]) -> None:
    tmp = path.with_name(path.name + f".part{os.getpid()}")
    torch.save([dict(tokens=torch.from_numpy(s.tokens), greedy=torch.from_numpy(s.greedy), feats=s.feats,
                     prompt_len=s.prompt_len) for s in seqs], tmp)
    os.replace(tmp, path)  # whole or not at all


def _load_shard(path: Path) -> list[Sequence]:
    try:
        raw = torch.load(path, weights_only=True)
    except Exception:  # a shard cut short by a crash outside our rename: recollect it
        return []
    return [Sequence(d["tokens"].numpy(), d["greedy"].numpy(), d["feats"], int(d["prompt_len"])) for d in raw]


def collect(cfg: DataConfig, progress: bool = True, log=print) -> list[Sequence]:
    """All sequences of `cfg`, from the shard cache where present, generating the missing groups."""
    return collect_with_ids(cfg, progress, log)[1]


def collect_with_ids(cfg: DataConfig, progress: bool = True, log=print) -> tuple[list[str], list[Sequence]]:
    """(request ids, sequences) of `cfg` (see collect)."""
    from sim.core.trace.smollm2_tokenizer import SmolTokenizer
    from real.engine.weights import build_model

    cfg.validate()
    tok = SmolTokenizer.from_gguf()
    rids, prompts, passed = load_prompts(cfg, tok)
    if not prompts:
        raise ConfigError(f"{cfg.trace}: no prompt of at most {cfg.max_prompt} tokens")
    log(f"data: {len(prompts)} prompts from {cfg.trace} ({passed} longer than {cfg.max_prompt} tokens (or of one token) "
        "passed over), "
        f"greedy up to {cfg.max_tokens} tokens, layers {list(cfg.layers)}")
    d = data_dir() / cfg.key()
    d.mkdir(parents=True, exist_ok=True)
    groups = [list(range(g0, min(g0 + cfg.batch, len(prompts)))) for g0 in range(0, len(prompts), cfg.batch)]
    seqs: list[Sequence] = []
    model = None
    bar = progress_bar(total=len(prompts), leave=True, desc="collect (target greedy + hidden states)", unit="prompt", disable=not progress)
    for gi, group in enumerate(groups):
        shard = d / f"group{gi:04d}.pt"
        got = _load_shard(shard) if shard.exists() else []
        if len(got) != len(group):
            if model is None:
                need = max(len(p) for p in prompts) + cfg.max_tokens + 8
                model, _ = build_model("smollm2-135m-gguf", "cpu", torch.float32, max_slots=cfg.batch, max_len=need)
            got = generate_group(model, [prompts[i] for i in group], cfg.max_tokens, tok.eos_id, cfg.layers)
            _save_shard(shard, got)
        seqs.extend(got)
        bar.update(len(group))
    bar.close()
    return rids, seqs


__all__ = ["DataConfig", "Sequence", "collect", "collect_with_ids", "generate_group", "data_dir", "GENERAL_TRACE"]
