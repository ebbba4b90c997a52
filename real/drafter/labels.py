"""Drafter labels at prefill speed: teacher-forced distillation of the target over existing text.

Instead of generating with the target (one decode step per token), the target prefills existing text
t_0 .. t_{T-1} in chunks (one forward per `chunk` tokens) and we keep, at every position j:
  g_j           its greedy next token (argmax of its distribution given t_0..t_j; int32)
  topk_j        the `topk` most probable next tokens and their probabilities (int32, fp16): the distribution
                the drafter is distilled to (the rest of the mass, 1 - sum, is kept implicitly)
  h_j           the residual stream after each of `layers` (fp16, [len(layers) * hidden])
A drafter label for anchor a and block slot k is the target's greedy token after t_0..t_a, g_a, .., g_{a+k-1}:
it is read off the text only while the text agrees with the target (t_{a+1+i} = g_{a+i} for i < k;
real/drafter/train.py `prepare` masks the rest). Labelled positions = such valid (anchor, slot) pairs.

In-distribution labels (`generate` > 0): the target first continues the row's text greedily for `generate`
tokens (one KV slot per row of the shard, batched decode), and the prefill runs over text + continuation. On the
continuation every label is valid (the text is the target's own output), which is what a drafter meets when it
serves; human text gives labels only where it agrees with the target (about 58% of general-text positions).

Sources (`default_config`): traces/general.jsonl prompts (ShareGPT conversations, chat-formatted: never the chat
or code-editing evaluation traces) with the target's answers, and the code-editing tuning split
(real/tuning_split.py): its prompts with the target's own edits, and prompt + the expected output (the
copy-heavy text, valid where the target agrees). A row longer than `max_len` is cut (`cut`), or split into
windows of `max_len` tokens overlapping by a quarter (a continuation source keeps the prompt's last
`max_len - generate` tokens instead): no row is passed over for its length. Rows are processed in shards of
`shard` rows, each written whole (rename) as soon as it is done: an interrupted run resumes at the next missing
shard; shard names carry a hash of every setting and of the source file.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from sim.infra.errors import ConfigError
from real.drafter.data import Sequence, data_dir

EVAL_TRACES = ("chat.jsonl", "codeedit.jsonl", "codeedit-model.jsonl")


@dataclass(frozen=True)
class LabelSource:
    name: str            # short label (shard folder, reports)
    trace: str           # JSONL with a 'prompt' text (and an 'output' text appended when `with_output`)
    rows: int            # rows taken (in file order, after passing over too long ones)
    max_len: int         # tokens per sequence
    with_output: bool    # append the row's output text (code edits: the copied code)
    cut: bool            # cut long rows to max_len (else split them into overlapping windows)
    generate: int = 0    # the target's greedy continuation appended (tokens; 0: the text alone)


@dataclass(frozen=True)
class LabelConfig:
    sources: tuple[LabelSource, ...]
    layers: tuple[int, ...] = (1, 8, 15, 22, 29)
    topk: int = 16
    chunk: int = 512      # rows per target forward
    shard: int = 16       # sequences per shard file
    evaluation: bool = False  # measuring only: evaluation traces allowed (eval_config)

    def validate(self) -> None:
        for s in self.sources:
            if Path(s.trace).name in EVAL_TRACES and not self.evaluation:
                raise ConfigError(f"{s.trace} is an evaluation trace: the drafter never trains on it")
            if s.rows < 1 or s.max_len < 8:
                raise ConfigError(f"label source {s.name}: rows >= 1 and max_len >= 8 needed")
            if not 0 <= s.generate <= s.max_len - 8:
                raise ConfigError(f"label source {s.name}: generate must be in 0..max_len - 8, got {s.generate}")
        if self.topk < 1 or self.chunk < 1 or self.shard < 1:
            raise ConfigError("labels: topk, chunk and shard must be positive")

    def key(self, src: LabelSource) -> str:
        """Hash of what a shard's content depends on (not `rows`: shard i holds the same rows for any count)."""
        d = {k: v for k, v in asdict(src).items() if k not in ("rows", "name")}
        h = hashlib.sha256(json.dumps([d, list(self.layers), self.topk, self.shard], sort_keys=True).encode())
        h.update(hashlib.sha256(Path(src.trace).read_bytes()).digest())
        return h.hexdigest()[:12]


def windows(ids: np.ndarray, size: int) -> list[np.ndarray]:
    """`ids` split into windows of `size` tokens, each overlapping the previous by a quarter (the last one ends
    at the text's end): every position is labelled, and each window after the first starts with context."""
    if len(ids) <= size:
        return [ids]
    stride = size - size // 4
    starts = list(range(0, len(ids) - size, stride)) + [len(ids) - size]
    return [ids[s: s + size] for s in starts]


def texts(src: LabelSource, tok) -> tuple[list[np.ndarray], int]:
    """Token ids of the source's first `rows` usable rows (a windowed row gives several) and how many rows were
    passed over (only rows under 8 tokens)."""
    out, passed = [], 0
    from sim.infra.inputs import REQUEST, iter_lines

    for ln, line in enumerate(iter_lines(src.trace, REQUEST, "label source"), 1):  # each line capped
        try:
            row = json.loads(line)
            text = row["prompt"] + (row["output"] if src.with_output else "")
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"{src.trace}:{ln}: not a JSON object with a 'prompt'"
                              + (" and an 'output'" if src.with_output else "") + " text") from None
        ids = np.asarray(tok.encode(text), dtype=np.int64)
        if len(ids) < 8:
            passed += 1
            continue
        room = src.max_len - src.generate
        if src.generate:
            out.append(ids[-room:])             # the continuation needs the prompt's end
        elif src.cut:
            out.append(ids[: src.max_len])
        else:
            out.extend(windows(ids, src.max_len))
        if len(out) >= src.rows:
            break
    return out[: src.rows], passed


@torch.inference_mode()
def label_sequence(model, ids: np.ndarray, layers: tuple[int, ...], topk: int, chunk: int) -> Sequence:
    """One teacher-forced pass over `ids` (KV slot 0; chunks of `chunk` rows)."""
    dev = next(model.parameters()).device
    lt = lambda x: torch.tensor(x, dtype=torch.int64, device=dev)  # noqa: E731
    g, ti, tp, fs = [], [], [], []
    for c0 in range(0, len(ids), chunk):
        piece = torch.from_numpy(ids[c0: c0 + chunk]).to(dev)
        n = piece.shape[0]
        logits, h = model(piece, lt([n]), lt([c0]), lt([0]), torch.arange(n, device=dev), hidden_layers=layers)
        p = torch.softmax(logits.float(), dim=-1)
        v, i = p.topk(topk, dim=-1)
        g.append(i[:, 0].to(torch.int32).cpu())
        ti.append(i.to(torch.int32).cpu())
        tp.append(v.to(torch.float16).cpu())
        fs.append(h.to(torch.float16).cpu())
    return Sequence(ids.astype(np.int32), torch.cat(g).numpy(), torch.cat(fs), len(ids),
                    topk_ids=torch.cat(ti), topk_p=torch.cat(tp))


def _save(path: Path, seqs: list[Sequence]) -> None:
    tmp = path.with_name(path.name + f".part{os.getpid()}")
    torch.save([dict(tokens=torch.from_numpy(s.tokens), greedy=torch.from_numpy(s.greedy), feats=s.feats,
                     prompt_len=s.prompt_len, topk_ids=s.topk_ids, topk_p=s.topk_p) for s in seqs], tmp)
    os.replace(tmp, path)  # whole or not at all


def load_shard(path: Path) -> list[Sequence] | None:
    """A shard's sequences, or None (with the reason printed by the caller) when it is unreadable."""
    from sim.infra.inputs import WEIGHTS, check_regular

    try:
        if check_regular(path).st_size > WEIGHTS.limit():  # a shard past the weights cap is relabelled, never loaded
            return None
        raw = torch.load(path, weights_only=True)
        return [Sequence(d["tokens"].numpy(), d["greedy"].numpy(), d["feats"], int(d["prompt_len"]),
                         topk_ids=d["topk_ids"], topk_p=d["topk_p"]) for d in raw]
    except Exception:  # noqa: BLE001 -- a damaged shard is relabelled, never half-used
        return None


def agreement(seqs: list[Sequence]) -> float:
    """Share of positions j whose next text token equals the target's greedy token (t_{j+1} = g_j)."""
    hit = tot = 0
    for s in seqs:
        hit += int((s.tokens[1:] == s.greedy[:-1]).sum())
        tot += len(s.tokens) - 1
    return hit / max(tot, 1)


def collect_labels(cfg: LabelConfig, log=print, limit_s: float | None = None) -> dict[str, list[Sequence]]:
    """{source name: sequences}, labelling the missing shards (progress lines with positions per second).
    With `limit_s`, stops starting new shards after that many seconds (what is done stays; rerun resumes)."""
    from sim.core.trace.smollm2_tokenizer import SmolTokenizer
    from real.engine.weights import build_model

    cfg.validate()
    tok = SmolTokenizer.from_gguf()
    model = None
    t_start = time.perf_counter()
    out: dict[str, list[Sequence]] = {}
    for src in cfg.sources:
        ids, passed = texts(src, tok)
        d = data_dir() / "labels" / f"{src.name}-{cfg.key(src)}"
        d.mkdir(parents=True, exist_ok=True)
        log(f"labels {src.name}: {len(ids)} sequences from {src.trace} ({passed} passed over), up to {src.max_len} "
            f"tokens, layers {list(cfg.layers)}, top-{cfg.topk}; cache {d}")
        seqs: list[Sequence] = []
        for s0 in range(0, len(ids), cfg.shard):
            path = d / f"shard{s0 // cfg.shard:04d}.pt"
            got = load_shard(path) if path.exists() else None
            if got is not None and len(got) == len(ids[s0: s0 + cfg.shard]):
                for sq, r in zip(got, ids[s0: s0 + cfg.shard]):
                    sq.prompt_len = len(r)      # where the target's continuation starts (the whole text without)
                seqs.extend(got)
                continue
            if got is None and path.exists():
                log(f"labels {src.name}: {path.name} is damaged: labelling it again")
            if limit_s is not None and time.perf_counter() - t_start > limit_s:
                log(f"labels {src.name}: time limit reached; {len(seqs)} sequences so far (rerun to resume)")
                break
            if model is None:
                model, _ = build_model("smollm2-135m-gguf", "cpu", torch.float32, max_slots=cfg.shard,
                                       max_len=max(s.max_len for s in cfg.sources) + 8)
            t0 = time.perf_counter()
            rows = ids[s0: s0 + cfg.shard]
            if src.generate:
                from real.engine.greedy import greedy_group

                gens = greedy_group(model, rows, [src.generate] * len(rows), tok.eos_id, cfg.chunk)
                rows = [np.concatenate([r, g.output]) for r, g in zip(rows, gens)]
            group = [label_sequence(model, x, cfg.layers, cfg.topk, cfg.chunk) for x in rows]
            for sq, r in zip(group, ids[s0: s0 + cfg.shard]):
                sq.prompt_len = len(r)
            _save(path, group)
            n = sum(len(s.tokens) for s in group)
            dt = time.perf_counter() - t0
            seqs.extend(group)
            log(f"labels {src.name}: shard {s0 // cfg.shard + 1}/{-(-len(ids) // cfg.shard)}: {n} tokens in "
                f"{dt:.0f} s = {n / dt:.0f} tok/s; agreement with the target {agreement(group):.1%}; "
                f"load {os.getloadavg()[0]:.2f}", )
        out[src.name] = seqs
    return out


__all__ = ["LabelSource", "LabelConfig", "collect_labels", "label_sequence", "agreement", "load_shard"]


def tuning_trace_path() -> Path:
    """Where the code-editing tuning split lives (built on first use: real/tuning_split.py)."""
    p = data_dir() / "codeedit-tune.jsonl"
    if not p.is_file():
        from real.drafter.tuning_split import build_tuning_split

        build_tuning_split(p, progress=False)
    return p


def default_config(general_rows: int = 160, code_rows: int = 110, code_gen_rows: int = 32, generate: int = 192,
                   code_generate: int = 192) -> LabelConfig:
    """The labels the drafter is trained on: general text (prompts up to 576 - `generate` tokens, their last
    tokens kept) with the target's greedy answers, and the code-editing tuning split twice: its prompts with the
    target's own edits (`code_gen_rows` prompts, `code_generate` tokens each), and prompt + the expected output
    (the copy-heavy text, windows of 3072 tokens). A source given 0 rows is left out (the copy-data ablation:
    `code_rows=0`)."""
    if min(general_rows, code_rows, code_gen_rows) < 0 or general_rows + code_rows + code_gen_rows == 0:
        raise ConfigError(f"labels: rows must be >= 0 and not all 0, got general {general_rows}, code {code_rows}, "
                          f"code continuations {code_gen_rows}")
    code = str(tuning_trace_path()) if code_rows or code_gen_rows else ""
    srcs = []  # cheapest first: a budget-limited run (--label-seconds) has some of each kind early
    if general_rows:
        srcs.append(LabelSource("general", "traces/general.jsonl", general_rows, 384 + generate if generate else 512,
                                with_output=False, cut=True, generate=generate))
    if code_rows:
        srcs.append(LabelSource("codeedit-tune", code, code_rows, 3072, with_output=True, cut=False))
    if code_gen_rows:
        srcs.append(LabelSource("codeedit-tune-gen", code, code_gen_rows, 3072, with_output=False, cut=False,
                                generate=code_generate))
    return LabelConfig(sources=tuple(srcs))


def eval_config(rows: int = 16, generate: int = 256) -> LabelConfig:
    """Held-out code edits for measuring a drafter (never for training): the first `rows` prompts of
    traces/codeedit.jsonl with the target's greedy edits, labelled as the training text is."""
    return LabelConfig(sources=(LabelSource("eval-codeedit", "traces/codeedit.jsonl", rows, 3072, with_output=False,
                                            cut=False, generate=generate),), evaluation=True)


def main(argv: list[str] | None = None) -> int:
    """python -m real.label_drafter [LIMIT_S]: label the drafter's training text (resumable), print the totals."""
    import sys

    argv = sys.argv[1:] if argv is None else argv
    got = collect_labels(default_config(), limit_s=float(argv[0]) if argv else None)
    for k, v in got.items():
        print(f"{k}: {len(v)} sequences, {sum(len(s.tokens) for s in v)} tokens, agreement {agreement(v):.1%}")
    return 0
