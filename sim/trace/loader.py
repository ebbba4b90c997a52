"""load_trace: read a JSONL trace into typed Requests, with one-line errors naming file, line and field.

Accepted line forms (one JSON object per line; blank lines are ignored):
  text         {"id": "r1", "prompt": "...", "output": "..."}             tokenized with the Qwen3 tokenizer
  token ids    {"id": "r1", "prompt_ids": [..], "output_ids": [..]}
  length-only  {"id": "r1", "prompt_len": 812, "output_len": 164}
  mixed        a prompt (text or ids) with "output_len" (e.g. from vLLM's custom dataset): length-only output
Optional on every form: "arrival_s" (seconds >= 0; absent or null: available at time 0), "workload" (string),
"temperature" (>= 0, default 0). Ids are strings (integers are accepted and turned into strings). Unknown
keys are ignored. Each side takes exactly one of its three keys; an output with content needs a prompt
with content. Prompt and output must be non-empty; numbers finite; ids unique within the file.

Text is tokenized once per file content: the ids are cached in $HYBRIDSPEC_CACHE_DIR/tokens (see tokenizer.py).
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.errors import ConfigError, TraceError
from sim.trace.schema import Request, Trace

__all__ = ["load_trace", "parse_record", "sample_indices"]

_MAX_ID = 2**31 - 1
_SIDES = {"prompt": ("prompt", "prompt_ids", "prompt_len"), "output": ("output", "output_ids", "output_len")}


@dataclass
class _Record:
    line: int
    id: str
    prompt: str | np.ndarray | int  # text, ids, or a length
    output: str | np.ndarray | int
    arrival_s: float | None
    workload: str | None
    temperature: float


def _typename(v) -> str:
    return "null" if v is None else {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(v), "number" if isinstance(v, (int, float)) else type(v).__name__)


def nonneg_number(v, file: str, line: int, key: str) -> float:
    """v as a float; TraceError (file, line, key) unless it is a finite number >= 0 (booleans are not)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TraceError(f"must be a number, got {_typename(v)}", file, line, key)
    if not math.isfinite(v):
        raise TraceError(f"must be finite, got {v}", file, line, key)
    if v < 0:
        raise TraceError(f"must be >= 0, got {v}", file, line, key)
    return float(v)


def _number(obj: dict, key: str, file: str, line: int, default):
    v = obj.get(key)
    return default if v is None else nonneg_number(v, file, line, key)


def _side(obj: dict, side: str, file: str, line: int):
    keys = _SIDES[side]
    present = [k for k in keys if k in obj]
    if not present:
        raise TraceError(f"missing field (give one of {', '.join(keys)})", file, line, keys[0])
    if len(present) > 1:
        raise TraceError(f"conflicting fields {', '.join(present)}: give only one", file, line, present[1])
    key = present[0]
    v = obj[key]
    if key == keys[0]:  # text
        if not isinstance(v, str):
            raise TraceError(f"must be a string, got {_typename(v)}", file, line, key)
        if not v:
            raise TraceError(f"empty {side}", file, line, key)
        return v
    if key == keys[1]:  # ids
        if not isinstance(v, list):
            raise TraceError(f"must be an array of token ids, got {_typename(v)}", file, line, key)
        if not v:
            raise TraceError(f"empty {side}", file, line, key)
        for j, x in enumerate(v):
            if type(x) is not int or not 0 <= x <= _MAX_ID:
                raise TraceError(f"element {j} must be a token id (integer in [0, {_MAX_ID}]), got {x!r}",
                                 file, line, key)
        return np.asarray(v, dtype=np.int32)
    if isinstance(v, bool) or not isinstance(v, int):  # length
        raise TraceError(f"must be an integer, got {_typename(v)}", file, line, key)
    if v < 1:
        raise TraceError(f"must be >= 1, got {v}" if v < 0 else f"empty {side} (0 tokens)", file, line, key)
    return v


def parse_record(obj, file: str, line: int) -> _Record:
    """Validate one decoded JSON value; raise TraceError naming the field on the first problem."""
    if not isinstance(obj, dict):
        raise TraceError(f"expected a JSON object, got {_typename(obj)}", file, line)
    if "id" not in obj:
        raise TraceError("missing field", file, line, "id")
    rid = obj["id"]
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise TraceError(f"must be a string, got {_typename(rid)}", file, line, "id")
    rid = str(rid)
    if not rid:
        raise TraceError("empty id", file, line, "id")
    prompt = _side(obj, "prompt", file, line)
    output = _side(obj, "output", file, line)
    if not isinstance(output, int) and isinstance(prompt, int):
        raise TraceError("an output with content needs a prompt with content (prompt or prompt_ids)",
                         file, line, "prompt_len")
    arrival = _number(obj, "arrival_s", file, line, None)
    temperature = _number(obj, "temperature", file, line, 0.0)
    workload = obj.get("workload")
    if workload is not None and not isinstance(workload, str):
        raise TraceError(f"must be a string, got {_typename(workload)}", file, line, "workload")
    return _Record(line, rid, prompt, output, arrival, workload, temperature)


def _iter_lines(data: bytes):
    """(1-based line number, raw bytes) of each non-blank line."""
    start = 0
    lineno = 0
    n = len(data)
    while start < n:
        end = data.find(b"\n", start)
        if end < 0:
            end = n
        lineno += 1
        raw = data[start:end]
        if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if raw.strip():
            yield lineno, raw
        start = end + 1


def _tokenize(records: list[_Record], data: bytes, complete: bool, tokenizer: str | None = None) -> dict[int, np.ndarray]:
    """Token ids of every text field, keyed by 2*line + (0 prompt | 1 output); cached on disk by file hash."""
    from sim.trace.tokenizer import get_tokenizer, token_cache_path

    wanted: list[tuple[int, str]] = []
    for r in records:
        if isinstance(r.prompt, str):
            wanted.append((2 * r.line, r.prompt))
        if isinstance(r.output, str):
            wanted.append((2 * r.line + 1, r.output))
    if not wanted:
        return {}
    from sim.trace.tokenizer import TOKENIZER_NAME

    tokenizer = tokenizer or TOKENIZER_NAME
    path = token_cache_path(data, tokenizer)
    cached: dict[int, np.ndarray] = {}
    if path.exists():
        try:
            with np.load(path) as z:
                keys, offs, flat = z["keys"], z["offsets"], z["flat"]
            cached = {int(k): flat[offs[i]:offs[i + 1]] for i, k in enumerate(keys)}
        except Exception:  # a corrupt cache is rebuilt, never fatal
            cached = {}
    missing = [(k, t) for k, t in wanted if k not in cached]
    if not missing:
        return cached
    ids = get_tokenizer(tokenizer).encode_batch([t for _, t in missing])
    for (k, _), toks in zip(missing, ids):
        cached[k] = np.asarray(toks, dtype=np.int32)
    if complete:
        _write_cache(path, cached)
    return cached


def _write_cache(path: Path, table: dict[int, np.ndarray]) -> None:
    keys = np.array(sorted(table), dtype=np.int64)
    lens = np.array([len(table[int(k)]) for k in keys], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    flat = np.concatenate([table[int(k)] for k in keys]).astype(np.int32) if len(keys) else np.zeros(0, np.int32)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp.npz")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, keys=keys, offsets=offsets, flat=flat)
        os.replace(tmp, path)
    except OSError:  # an unwritable cache only costs speed
        pass


LIMIT_AND_SAMPLE = "use --limit (the first N requests) or --sample (N spread across the trace), not both"


def sample_indices(n_total: int, n: int, seed: int, file: str = "<input>") -> np.ndarray:
    """Indices of a seeded sample of n of n_total requests, without replacement, in increasing (trace)
    order: default_rng(seed).choice(n_total, n, replace=False), sorted. Every subset of size n is equally
    likely, so the sample spreads across the trace (unlike the first n); the same seed gives the same one."""
    if n < 1:
        raise ConfigError(f"{file}: --sample must be >= 1, got {n}")
    if n > n_total:
        raise ConfigError(f"{file}: --sample {n} exceeds the trace's {n_total} requests")
    return np.sort(np.random.default_rng(seed).choice(n_total, size=n, replace=False))


def load_trace(path: str | os.PathLike, limit: int | None = None, skip_bad: bool = False,
               sample: int | None = None, seed: int = 0, tokenizer: str | None = None) -> Trace:
    """Load a JSONL trace. Raise TraceError (file, line, field) on the first bad line, or with
    skip_bad=True drop bad lines and count them in Trace.skipped. `limit` keeps the first N good requests;
    `sample` keeps a seeded sample of N good requests spread across the whole trace, in trace order
    (`sample_indices`; deterministic given `seed`). limit and sample are exclusive."""
    file = str(path)
    if limit is not None and limit < 1:
        raise TraceError(f"limit must be >= 1, got {limit}", file)
    if limit is not None and sample is not None:
        raise ConfigError(LIMIT_AND_SAMPLE)
    if sample is not None and sample < 1:
        raise ConfigError(f"{file}: --sample must be >= 1, got {sample}")
    p = Path(path)
    if not p.exists():
        raise TraceError("file not found", file)
    if p.is_dir():
        raise TraceError("is a directory, expected a JSONL file", file)
    data = p.read_bytes()
    records: list[_Record] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    n_lines = 0
    complete = True
    for lineno, raw in _iter_lines(data):
        if limit is not None and len(records) >= limit:
            complete = False
            break
        n_lines += 1
        try:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceError(f"invalid UTF-8 at byte {exc.start} of the line", file, lineno) from None
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceError(f"not valid JSON: {exc.msg} (column {exc.colno})", file, lineno) from None
            rec = parse_record(obj, file, lineno)
            if rec.id in seen:
                raise TraceError(f"duplicate id {rec.id!r} (first on line {seen[rec.id]})", file, lineno, "id")
            seen[rec.id] = lineno
            records.append(rec)
        except TraceError as exc:
            if not skip_bad:
                raise
            problems.append(str(exc))
    if n_lines == 0:
        raise TraceError("empty trace: no requests", file)
    if not records:
        raise TraceError(f"no valid requests ({len(problems)} bad lines skipped; first: {problems[0]})", file)
    if sample is not None:
        records = [records[i] for i in sample_indices(len(records), sample, seed, file)]
        complete = False  # tokenize (and cache) only what is used, as --limit does
    tokens = _tokenize(records, data, complete, tokenizer)  # tokenizer: sim.trace.tokenizer's name (default qwen3)
    requests = []
    for r in records:
        p_ids = tokens[2 * r.line] if isinstance(r.prompt, str) else (r.prompt if isinstance(r.prompt, np.ndarray) else None)
        o_ids = tokens[2 * r.line + 1] if isinstance(r.output, str) else (r.output if isinstance(r.output, np.ndarray) else None)
        requests.append(Request(
            id=r.id, prompt_ids=p_ids, output_ids=o_ids,
            prompt_len=len(p_ids) if p_ids is not None else int(r.prompt),
            output_len=len(o_ids) if o_ids is not None else int(r.output),
            arrival_s=r.arrival_s, workload=r.workload, temperature=r.temperature, line=r.line))
    from sim.trace.tokenizer import TOKENIZER_NAME

    has_text = any(isinstance(r.prompt, str) or isinstance(r.output, str) for r in records)
    return Trace(path=file, requests=requests, skipped=len(problems), problems=problems,
                 tokenizer=(tokenizer or TOKENIZER_NAME) if has_text else None)
