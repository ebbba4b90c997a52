"""load_trace: read a JSONL trace into typed Requests, with one-line errors naming file, line and field.

Accepted line forms (one JSON object per line; blank lines are ignored):
  text         {"id": "r1", "prompt": "...", "output": "..."}             tokenized with the served model's tokenizer
  token ids    {"id": "r1", "prompt_ids": [..], "output_ids": [..]}
  length-only  {"id": "r1", "prompt_len": 812, "output_len": 164}
  mixed        a prompt (text or ids) with "output_len" (e.g. from vLLM's custom dataset): length-only output
Optional on every form: "arrival_s" (seconds >= 0; absent or null: available at time 0), "workload" (string),
"temperature" (>= 0, default 0), "tokenizer" (string: what recorded its token ids, sim/core/trace/tokenizer.py).
Ids are strings (integers are accepted and turned into strings). Unknown keys are ignored. Each side takes exactly one of its three keys; an output with content needs a prompt
with content. Prompt and output must be non-empty; numbers finite; ids unique within the file.

Text is tokenized once per file content and tokenizer: the ids are cached in $HYBRIDSPEC_CACHE_DIR/tokens (see
tokenizer.py). Token ids are the model's own only if its tokenizer recorded them: given the model's tokenizer and
vocabulary, load_trace refuses (TraceError naming the line) ids marked with another tokenizer, and ids past the
vocabulary; such a trace needs its text to be re-tokenized.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.infra.errors import ConfigError, TraceError
from sim.core.trace.schema import Request, Trace

__all__ = ["load_trace", "parse_record", "check_ids", "sample_indices", "scan_trace"]

_MAX_ID = 2**31 - 1
MAX_TOKENS = 2**31 - 1  # longest prompt or output: past every context length, and the engine counts in int32/int64
MAX_ARRIVAL_S = 1e9  # latest arrival, seconds after the trace start (~32 years): past it a trace is not a workload
MAX_LINE_BYTES = 256 * 2**20  # longest line read (a file without newlines is not a JSONL trace)
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
    tokenizer: str | None = None  # what recorded its token ids (the line's "tokenizer"), if it says


def _typename(v) -> str:
    return "null" if v is None else {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(v), "number" if isinstance(v, (int, float)) else type(v).__name__)


def nonneg_number(v, file: str, line: int, key: str, hi: float | None = None) -> float:
    """v as a float; TraceError (file, line, key) unless it is a finite number >= 0 (booleans are not), and
    <= hi where given."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TraceError(f"must be a number, got {_typename(v)}", file, line, key)
    try:
        f = float(v)
    except OverflowError:  # an integer of hundreds of digits
        raise TraceError("must be a finite number, got an integer too large for a float", file, line, key) from None
    if not math.isfinite(f):
        raise TraceError(f"must be finite, got {v}", file, line, key)
    if f < 0:
        raise TraceError(f"must be >= 0, got {v}", file, line, key)
    if hi is not None and f > hi:
        raise TraceError(f"must be <= {hi:g}, got {f:g}", file, line, key)
    return f


def check_text(v: str, file: str, line: int | None, key: str) -> str:
    """v unless it holds a lone surrogate (JSON's \\ud800 escapes decode to one; it is not Unicode text and
    cannot be tokenized or written back as UTF-8): TraceError naming the field."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TraceError(f"not valid Unicode text: a lone surrogate {v[exc.start]!r} at character {exc.start}",
                         file, line, key) from None
    return v


def token_count(v, file: str, line: int | None, key: str, lo: int = 1) -> int:
    """A token count: an integer (not a boolean or a float) in [lo, MAX_TOKENS]; TraceError naming the field."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TraceError(f"must be an integer, got {_typename(v)}", file, line, key)
    if v < lo:
        raise TraceError(f"must be >= {lo}, got {v}", file, line, key)
    if v > MAX_TOKENS:
        raise TraceError(f"must be <= {MAX_TOKENS} tokens, got {v:.3g}", file, line, key)
    return v


def _number(obj: dict, key: str, file: str, line: int, default, hi: float | None = None):
    v = obj.get(key)
    return default if v is None else nonneg_number(v, file, line, key, hi)


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
        return check_text(v, file, line, key)
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
    if isinstance(v, int) and not isinstance(v, bool) and v == 0:  # length
        raise TraceError(f"empty {side} (0 tokens)", file, line, key)
    return token_count(v, file, line, key)


def parse_record(obj, file: str, line: int) -> _Record:
    """Validate one decoded JSON value; raise TraceError naming the field on the first problem."""
    if not isinstance(obj, dict):
        raise TraceError(f"expected a JSON object, got {_typename(obj)}", file, line)
    if "id" not in obj:
        raise TraceError("missing field", file, line, "id")
    rid = obj["id"]
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise TraceError(f"must be a string, got {_typename(rid)}", file, line, "id")
    if isinstance(rid, int) and abs(rid) > 10**30:
        raise TraceError("an integer id of more than 30 digits", file, line, "id")
    rid = check_text(str(rid), file, line, "id")
    if not rid:
        raise TraceError("empty id", file, line, "id")
    prompt = _side(obj, "prompt", file, line)
    output = _side(obj, "output", file, line)
    if not isinstance(output, int) and isinstance(prompt, int):
        raise TraceError("an output with content needs a prompt with content (prompt or prompt_ids)",
                         file, line, "prompt_len")
    arrival = _number(obj, "arrival_s", file, line, None, MAX_ARRIVAL_S)
    temperature = _number(obj, "temperature", file, line, 0.0)
    workload = obj.get("workload")
    if workload is not None and not isinstance(workload, str):
        raise TraceError(f"must be a string, got {_typename(workload)}", file, line, "workload")
    if workload is not None:
        check_text(workload, file, line, "workload")
    tok = obj.get("tokenizer")
    if tok is not None and (not isinstance(tok, str) or not tok):
        raise TraceError(f"must be a tokenizer's name, got {_typename(tok)} {tok!r}", file, line, "tokenizer")
    return _Record(line, rid, prompt, output, arrival, workload, temperature, tok)


def check_ids(rec: _Record, file: str, tokenizer: str | None, vocab_size: int | None) -> None:
    """TraceError (file, line, field) when the line's token ids cannot be the model's: marked as recorded with
    another tokenizer than `tokenizer` (the model's; None or "": unknown, not checked), or an id >= vocab_size (the
    model's vocabulary; None: not checked). Ids of one vocabulary stand for other text in another."""
    sides = [(k, v) for k, v in (("prompt_ids", rec.prompt), ("output_ids", rec.output)) if isinstance(v, np.ndarray)]
    if not sides:
        return
    fix = "give the text (prompt, output) to tokenize it for this model, or ids of its tokenizer"
    if tokenizer and rec.tokenizer and rec.tokenizer.lower() != tokenizer.lower():
        raise TraceError(f"token ids recorded with the {rec.tokenizer} tokenizer, and the model's is {tokenizer}: "
                         f"{fix}", file, rec.line, "tokenizer")
    for key, ids in sides if vocab_size else ():
        top = int(ids.max())
        if top >= vocab_size:
            raise TraceError(f"token id {top} is past the model's vocabulary of {vocab_size} ids, so these ids were "
                             f"recorded with another tokenizer: {fix}", file, rec.line, key)


def raw_lines(path: Path, file: str, hasher=None, what: str = "(not a JSONL trace?)"):
    """(1-based line number, raw bytes with its newline) of every line, read one line at a time (nothing past
    the line the caller stops at is read; a BOM on the first line dropped); `hasher` (hashlib) is fed every
    byte read. A line over MAX_LINE_BYTES -> TraceError naming file and line."""
    with open(path, "rb") as f:
        lineno = 0
        while True:
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            lineno += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise TraceError(f"line longer than {MAX_LINE_BYTES >> 20} MiB {what}".rstrip(), file, lineno)
            if hasher is not None:
                hasher.update(raw)
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            yield lineno, raw


def file_lines(path: Path, file: str, hasher=None):
    """(1-based line number, raw bytes without the newline) of each non-blank line (raw_lines)."""
    for lineno, raw in raw_lines(path, file, hasher):
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        if raw.strip():
            yield lineno, raw


def decode_json_line(raw: bytes, file: str, lineno: int):
    """One JSONL line decoded; TraceError (file, line) for invalid UTF-8, invalid JSON, integers of thousands
    of digits and nesting deeper than Python's recursion limit."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(f"invalid UTF-8 at byte {exc.start} of the line", file, lineno) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"not valid JSON: {exc.msg} (column {exc.colno})", file, lineno) from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise TraceError(f"not valid JSON: {str(exc).split(';')[0]}", file, lineno) from None
    except RecursionError:
        raise TraceError("not valid JSON: nested too deeply", file, lineno) from None


def _tokenize(records: list[_Record], cache_key: bytes | None, complete: bool,
              tokenizer: str | None = None) -> dict[int, np.ndarray]:
    """Token ids of every text field, keyed by 2*line + (0 prompt | 1 output); cached on disk by the file's
    hash (`cache_key`: the whole file's sha256 state, None when only part of it was read: no cache)."""
    from sim.core.trace.tokenizer import get_tokenizer, token_cache_path

    wanted: list[tuple[int, str]] = []
    for r in records:
        if isinstance(r.prompt, str):
            wanted.append((2 * r.line, r.prompt))
        if isinstance(r.output, str):
            wanted.append((2 * r.line + 1, r.output))
    if not wanted:
        return {}
    from sim.core.trace.tokenizer import TOKENIZER_NAME

    tokenizer = TOKENIZER_NAME if tokenizer is None else tokenizer
    path = token_cache_path(cache_key, tokenizer) if cache_key is not None else None
    cached: dict[int, np.ndarray] = {}
    if path is not None and path.exists():
        try:
            with np.load(path, allow_pickle=False) as z:
                if str(z["key"]) != path.stem:  # copied or planted under another key: rebuilt, never served
                    raise ValueError("stored key differs")
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
    if complete and path is not None:
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
            np.savez(f, key=np.asarray(path.stem), keys=keys, offsets=offsets, flat=flat)
        os.replace(tmp, path)
    except OSError:  # an unwritable cache only costs speed
        pass


def check_trace_file(p: Path, file: str) -> None:
    """TraceError unless `p` is a regular file (a folder, a device such as /dev/zero or a pipe is refused
    before anything is read)."""
    import stat

    try:
        st = p.stat()
    except FileNotFoundError:
        from sim.infra.paths import missing_hint

        raise TraceError("file not found" + missing_hint(p), file) from None
    if stat.S_ISDIR(st.st_mode):
        raise TraceError("is a directory, expected a JSONL file", file)
    if not stat.S_ISREG(st.st_mode):
        raise TraceError("not a regular file (a device or a pipe is not a trace)", file)
    try:
        with open(p, "rb") as f:
            f.read(1)
    except OSError as exc:  # unreadable (permissions, or a file such as /proc/self/mem)
        raise TraceError(f"cannot read: {(exc.strerror or type(exc).__name__).lower()}", file) from None


# (format, what in the file's first 64 KiB shows it): raw files users pass to --trace before converting them
_RAW_FORMATS = (
    ("sharegpt", lambda h: h.lstrip()[:1] in (b"[", b"{") and b'"conversations"' in h),  # a JSON list or JSONL
    ("mooncake", lambda h: b'"input_length"' in h and b'"output_length"' in h),
    ("vllm-custom", lambda h: h.lstrip().startswith(b"{") and b'"prompt"' in h and b'"id"' not in h),
    ("burstgpt", lambda h: b"Request tokens" in h.split(b"\n", 1)[0] and b"Response tokens" in h.split(b"\n", 1)[0]),
    ("azure", lambda h: b"ContextTokens" in h.split(b"\n", 1)[0] and b"GeneratedTokens" in h.split(b"\n", 1)[0]),
    ("vidur", lambda h: any(c in h.split(b"\n", 1)[0] for c in (b"num_prefill_tokens", b"PromptTokenCount"))),
)


def raw_format(path: str | os.PathLike) -> str | None:
    """The raw format (a `python -m sim.trace convert --from` name) whose shape the file's first 64 KiB has, or
    None: for errors that tell a user to convert a file before passing it as a trace."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return None
    head = head.removeprefix(b"\xef\xbb\xbf")
    return next((name for name, looks in _RAW_FORMATS if looks(head)), None)


def with_convert_hint(exc: TraceError, path: str | os.PathLike) -> TraceError:
    """`exc` (the first line's error), naming the converter command when the file looks like a raw format."""
    fmt = raw_format(path)
    if fmt is None:
        return exc
    hint = (f"; this looks like a raw {fmt} file, not a hybridspec trace: convert it first with "
            f"python -m sim.trace convert --from {fmt} {path} -o OUT.jsonl")
    return TraceError(exc.reason + hint, exc.file, exc.line, exc.field)


def scan_trace(path: str | os.PathLike, limit: int | None = None) -> tuple[int, int]:
    """Check a trace line by line without tokenizing it (what a sweep does before its first cell): the first
    bad line is a TraceError (file, line, field), as load_trace would raise. Returns (requests read, at most
    `limit`; the largest prompt + output in tokens, counting a text field as 1 token: a lower bound)."""
    file = str(path)
    p = Path(path)
    check_trace_file(p, file)
    seen: dict[str, int] = {}
    longest = 0
    for lineno, raw in file_lines(p, file):
        try:
            rec = parse_record(decode_json_line(raw, file, lineno), file, lineno)
        except TraceError as exc:
            raise (exc if seen else with_convert_hint(exc, p)) from None
        if rec.id in seen:
            raise TraceError(f"duplicate id {rec.id!r} (first on line {seen[rec.id]})", file, lineno, "id")
        seen[rec.id] = lineno
        longest = max(longest, sum(len(x) if isinstance(x, np.ndarray) else (x if isinstance(x, int) else 1)
                                   for x in (rec.prompt, rec.output)))
        if limit is not None and len(seen) >= limit:
            break
    if not seen:
        raise TraceError("empty trace: no requests", file)
    return len(seen), longest


def _cache_hasher(tokenizer: str | None):
    """The sha256 state the token cache's key starts from (sim.core.trace.tokenizer.token_cache_path's prefix)."""
    from sim.core.trace.tokenizer import cache_key_hasher

    return cache_key_hasher(tokenizer)


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
               sample: int | None = None, seed: int = 0, tokenizer: str | None = None,
               vocab_size: int | None = None) -> Trace:
    """Load a JSONL trace. Raise TraceError (file, line, field) on the first bad line, or with
    skip_bad=True drop bad lines and count them in Trace.skipped. `limit` keeps the first N good requests;
    `sample` keeps a seeded sample of N good requests spread across the whole trace, in trace order
    (`sample_indices`; deterministic given `seed`). limit and sample are exclusive. `tokenizer`: the served
    model's (sim.core.trace.tokenizer names; None: qwen3 and no check of token ids; "": the model names none, so
    text is refused); `vocab_size`: its vocabulary. Token ids that cannot be the model's are refused (check_ids)."""
    file = str(path)
    if limit is not None and limit < 1:
        raise TraceError(f"limit must be >= 1, got {limit}", file)
    if limit is not None and sample is not None:
        raise ConfigError(LIMIT_AND_SAMPLE)
    if sample is not None and sample < 1:
        raise ConfigError(f"{file}: --sample must be >= 1, got {sample}")
    p = Path(path)
    check_trace_file(p, file)
    records: list[_Record] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    n_lines = 0
    complete = True  # every request of the file is used (the token cache may be written)
    whole = True  # the whole file was read (its hash, the token cache's key, is known)
    hasher = _cache_hasher(tokenizer)
    for lineno, raw in file_lines(p, file, hasher):
        n_lines += 1
        try:
            rec = parse_record(decode_json_line(raw, file, lineno), file, lineno)
            if rec.id in seen:
                raise TraceError(f"duplicate id {rec.id!r} (first on line {seen[rec.id]})", file, lineno, "id")
            check_ids(rec, file, tokenizer, vocab_size)
            seen[rec.id] = lineno
            records.append(rec)
        except TraceError as exc:
            if not skip_bad:
                raise (exc if records or problems else with_convert_hint(exc, p)) from None
            problems.append(str(exc))
        if limit is not None and len(records) >= limit:
            complete = whole = False  # stop here: nothing past this line is read
            break
    if n_lines == 0:
        raise TraceError("empty trace: no requests", file)
    if not records:
        raise with_convert_hint(TraceError(f"no valid requests ({len(problems)} bad lines skipped; first: {problems[0]})",
                                           file), p)
    if sample is not None:
        records = [records[i] for i in sample_indices(len(records), sample, seed, file)]
        complete = False  # tokenize (and cache) only what is used, as --limit does
    try:
        tokens = _tokenize(records, hasher if whole else None, complete, tokenizer)
    except ConfigError as exc:  # the tokenizer is not available: say which trace needed it
        raise ConfigError(f"{file}: {exc}") from None
    requests = []
    for r in records:
        p_ids = tokens[2 * r.line] if isinstance(r.prompt, str) else (r.prompt if isinstance(r.prompt, np.ndarray) else None)
        o_ids = tokens[2 * r.line + 1] if isinstance(r.output, str) else (r.output if isinstance(r.output, np.ndarray) else None)
        requests.append(Request(
            id=r.id, prompt_ids=p_ids, output_ids=o_ids,
            prompt_len=len(p_ids) if p_ids is not None else int(r.prompt),
            output_len=len(o_ids) if o_ids is not None else int(r.output),
            arrival_s=r.arrival_s, workload=r.workload, temperature=r.temperature, line=r.line))
    from sim.core.trace.tokenizer import TOKENIZER_NAME

    has_text = any(isinstance(r.prompt, str) or isinstance(r.output, str) for r in records)
    return Trace(path=file, requests=requests, skipped=len(problems), problems=problems,
                 tokenizer=(TOKENIZER_NAME if tokenizer is None else tokenizer) if has_text else None)


def prompt_texts(trace: str, sample, seed) -> list[tuple]:
    """(id, prompt text) of each line of a text trace, in order (or a seeded sample of `sample` lines); a line
    without a prompt text is a TraceError (real weights tokenize the text)."""
    p = Path(trace)
    check_trace_file(p, trace)
    recs = []
    for ln, raw in file_lines(p, trace):
        obj = decode_json_line(raw, trace, ln)
        rec = parse_record(obj, trace, ln)
        if not isinstance(rec.prompt, str):
            raise TraceError("real weights need the prompt's text (a 'prompt' field)", trace, ln, "prompt")
        recs.append((rec.id, rec.prompt))
    if sample:
        recs = [recs[i] for i in sample_indices(len(recs), sample, seed, trace)]
    return recs
