"""Converters from the trace formats users have to hybridspec JSONL (see traces/README.md).

Each builds, by default, the workload vLLM 0.33's benchmark (`vllm bench serve --dataset-name ...`) builds from
the same file; options give the other readings. Text stays text: `python -m sim.run` tokenizes it with the
served model's own tokenizer where one is available offline (Qwen3's; SmolLM2's with the real extra), else with
Qwen3's, and says which; ShareGPT's length filter counts with Qwen3's, and the summary says so.

  sharegpt     ShareGPT JSON list [{"id", "conversations": [{"from": "human"|"gpt"|..., "value"}]}].
               --turns first (vLLM): one request per conversation with >= 2 turns, turn 0 the prompt (raw
               text, as vLLM sends it to the completions endpoint) and turn 1 the output, kept only when
               vLLM's length filter passes (prompt 4..1024 tokens, output >= 4, prompt + output <= 2048);
               --sharegpt-output-len N: every output N tokens (length-only) and no output minimum.
               --turns all: one request per assistant turn; the earlier turns, rendered with the ChatML chat
               template, are the prompt and the assistant text is the output. Empty assistant turns and
               assistant turns with no earlier turn are dropped and counted.
  vllm-custom  vLLM benchmark custom dataset JSONL, {"prompt": "...", "output_tokens": N} per line.
               --custom-output-len N (vLLM's default 256) sets every output length, overriding output_tokens;
               -1 takes each line's output_tokens (required then, as in vLLM); --keep-output-tokens takes a
               line's output_tokens where given and N elsewhere. The prompt is wrapped in the chat template
               as one user turn with the generation prompt (vLLM's default; Qwen3's template is ChatML);
               --skip-chat-template keeps it raw. A line that also has an "output" text keeps it (content).
  azure        Azure LLM inference trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens): length-only. The
               workload (code or conversation: it picks the acceptance profile of length-only requests) comes
               from --workload, else from the file name (AzureLLMInferenceTrace_code / _conv), else an error.
  burstgpt     BurstGPT CSV (Timestamp, Model, Request tokens, Response tokens, Total tokens, Log Type):
               length-only; the rows of --model (vLLM keeps GPT-4; `all` keeps every model); failed requests
               (0 response tokens) are dropped and counted.
  mooncake     Mooncake JSONL ({"timestamp": ms, "input_length", "output_length", "hash_ids"}): length-only;
               hash_ids (the prompt's KV-block hashes) are kept in the trace, unused by the simulator until it
               models prefix caching.
  vidur        Vidur's trace CSVs: a request-length trace (num_prefill_tokens, num_decode_tokens, optional
               arrived_at seconds or arrival_time date-times) or a replay trace (Time, PromptTokenCount,
               CompletionTokenCount); length-only. Counts below 1 are raised to 1, as Vidur does.

Inputs are read one line at a time (ShareGPT, one JSON document, is read whole). Timestamps become arrival_s in
seconds relative to the earliest kept request (at most MAX_ARRIVAL_S after it); one file uses one timestamp
style (numbers or date-times, not both). Token counts are integers up to MAX_TOKENS. Requests with 0 output tokens
in the length-only formats (except vidur) are dropped and counted (they generate nothing). Every other bad row
raises a TraceError naming file, line and field, or with skip_bad=True is skipped and counted.
"""
from __future__ import annotations

import csv
import math
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterator

from sim.infra.errors import TraceError
from sim.core.trace.formats import ROLE_MAP, iter_json_items, read_text, render_chat, text_lines, write_jsonl
from sim.core.trace.loader import MAX_ARRIVAL_S, MAX_TOKENS, check_text, decode_json_line, nonneg_number, token_count

__all__ = ["FORMATS", "ConvertResult", "convert", "convert_rows"]


@dataclass
class ConvertResult:
    rows: list[dict]
    skipped: int = 0  # bad input rows skipped under skip_bad
    dropped: int = 0  # rows dropped by the format's rules (failed requests, empty turns)
    dropped_why: str = ""
    length_only: bool = False
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # summary lines: the reading taken, the tokenizer used


class _Ctx:
    def __init__(self, file: str, skip_bad: bool):
        self.file, self.skip_bad = file, skip_bad
        self.ts_style: tuple[str, int] | None = None  # (number | date-time, its first line): one style per file
        self.skipped, self.dropped, self.problems = 0, 0, []
        self.notes: list[str] = []
        self.dropped_why: str | None = None  # overrides the format's default reason

    def bad(self, exc: TraceError) -> None:
        if not self.skip_bad:
            raise exc
        self.skipped += 1
        self.problems.append(str(exc))


def _int_field(v, file, line, name, minimum=0) -> int:
    if isinstance(v, bool):
        raise TraceError(f"must be an integer, got {v!r}", file, line, name)
    if isinstance(v, str):
        s = v.strip()
        try:
            v = int(s) if re.fullmatch(r"[+-]?\d+", s) else float(s)
        except ValueError:
            raise TraceError(f"must be an integer, got {s!r}", file, line, name) from None
    if isinstance(v, float):
        if not math.isfinite(v) or v != int(v) or abs(v) > 2.0 * MAX_TOKENS:
            raise TraceError(f"must be an integer, got {v!r}", file, line, name)
        v = int(v)
    return token_count(v, file, line, name, lo=minimum)


def _float_field(v, file, line, name) -> float:
    """A finite number >= 0, also from CSV text."""
    if isinstance(v, str):
        try:
            v = float(v.strip())
        except ValueError:
            raise TraceError(f"must be a number, got {v.strip()[:40]!r}", file, line, name) from None
    return nonneg_number(v, file, line, name)


_TS_RE = re.compile(r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d+))?(Z|[+-]\d{2}:?\d{2})?$")


def _timestamp_s(v: str, file, line, name) -> float:
    """Seconds of a number or an ISO date-time (any number of fraction digits, as in the Azure trace)."""
    s = v.strip()
    try:
        return _float_field(s, file, line, name)
    except TraceError:
        pass
    m = _TS_RE.match(s)
    if not m:
        raise TraceError(f"not a timestamp: {s[:40]!r}", file, line, name)
    frac = (m.group(3) or "0")[:6].ljust(6, "0")
    tz = m.group(4) or ""
    tz = "+00:00" if tz == "Z" else tz
    try:
        dt = datetime.fromisoformat(f"{m.group(1)}T{m.group(2)}.{frac}{tz}")
    except ValueError as exc:
        raise TraceError(f"not a timestamp: {s!r} ({exc})", file, line, name) from None
    if dt.tzinfo is None:  # naive times are compared with each other only; fix them to UTC
        from datetime import timezone
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


# --- the formats --------------------------------------------------------------------------------------

# vLLM's ShareGPT length filter (the defaults of its benchmark's sequence check)
SHAREGPT_MIN_LEN, SHAREGPT_MAX_PROMPT, SHAREGPT_MAX_TOTAL = 4, 1024, 2048


def _sharegpt_conversations(text: str, ctx: _Ctx) -> Iterator[tuple[int, str, list]]:
    """(line, id, [(role, text)]) of every well-formed conversation; bad ones go to ctx.bad."""
    file = ctx.file
    for index, (line, conv) in enumerate(iter_json_items(text, file)):  # a JSON list or JSON Lines
        try:
            if not isinstance(conv, dict):
                raise TraceError("expected a conversation object", file, line)
            cid = conv.get("id", f"conv{index}")
            if isinstance(cid, bool) or not isinstance(cid, (str, int)) or cid == "":
                raise TraceError("must be a non-empty string", file, line, "id")
            check_text(str(cid), file, line, "id")
            turns = conv.get("conversations", conv.get("conversation"))
            if turns is None:
                raise TraceError("missing field", file, line, "conversations")
            if not isinstance(turns, list):
                raise TraceError("must be a list of turns", file, line, "conversations")
            messages = []
            for j, t in enumerate(turns):
                if not isinstance(t, dict):
                    raise TraceError("turn must be an object", file, line, f"conversations[{j}]")
                role, value = t.get("from", t.get("role")), t.get("value", t.get("content"))
                if not isinstance(role, str) or role.lower() not in ROLE_MAP:
                    raise TraceError(f"unknown role {role!r} (known: {', '.join(sorted(ROLE_MAP))})",
                                     file, line, f"conversations[{j}].from")
                if not isinstance(value, str):
                    raise TraceError("must be a string", file, line, f"conversations[{j}].value")
                check_text(value, file, line, f"conversations[{j}].value")
                messages.append((ROLE_MAP[role.lower()], value))
        except TraceError as exc:
            ctx.bad(exc)
            continue
        yield line, str(cid), messages


def _sharegpt(path: str, ctx: _Ctx, opts: dict) -> Iterator[dict]:
    text = read_text(path)  # one JSON document: read whole
    if not text.strip():
        raise TraceError("empty file", ctx.file)
    if opts.get("turns", "first") == "all":
        ctx.notes.append("one request per assistant turn, the earlier turns in the ChatML template as its prompt "
                         "(--turns all; vLLM takes each conversation's first exchange)")
        for _, cid, messages in _sharegpt_conversations(text, ctx):
            for j, (role, value) in enumerate(messages):
                if role != "assistant":
                    continue
                if not value.strip() or j == 0:
                    ctx.dropped += 1
                    continue
                yield {"id": f"{cid}/{j}", "prompt": render_chat(messages[:j]), "output": value}
        return
    # --turns first, vLLM's reading: turn 0 is the prompt and turn 1 the output, whatever their roles
    from sim.core.trace.tokenizer import TOKENIZER_NAME, get_tokenizer

    fixed = opts.get("sharegpt_output_len")
    filt = opts.get("length_filter", True)
    tok = get_tokenizer() if filt else None
    rule = (f"prompt {SHAREGPT_MIN_LEN}..{SHAREGPT_MAX_PROMPT} tokens" + ("" if fixed else f", output >= {SHAREGPT_MIN_LEN}")
            + f", prompt + output <= {SHAREGPT_MAX_TOTAL}")
    ctx.dropped_why = "conversations with fewer than 2 turns" + (f" or outside vLLM's length filter ({rule})" if filt else "")
    ctx.notes.append("one request per conversation: turn 0 -> turn 1, raw text (--turns first, as vLLM)")
    if filt:
        ctx.notes.append(f"vLLM's length filter counted tokens with the {TOKENIZER_NAME} tokenizer (vLLM counts with "
                         "the served model's); --no-length-filter keeps every conversation")
    for _, cid, messages in _sharegpt_conversations(text, ctx):
        if len(messages) < 2:
            ctx.dropped += 1
            continue
        prompt, completion = messages[0][1], messages[1][1]
        if filt:
            p_len = tok.count(prompt)
            o_len = fixed if fixed else tok.count(completion)
            if (p_len < SHAREGPT_MIN_LEN or (not fixed and o_len < SHAREGPT_MIN_LEN) or p_len > SHAREGPT_MAX_PROMPT
                    or p_len + o_len > SHAREGPT_MAX_TOTAL):
                ctx.dropped += 1
                continue
        if not prompt or not (fixed or completion):  # nothing to send or nothing generated
            ctx.dropped += 1
            continue
        yield {"id": cid, "prompt": prompt, **({"output_len": fixed} if fixed else {"output": completion})}


def _jsonl_rows(path: str, ctx: _Ctx, parse: Callable[[dict, int], dict | None]) -> Iterator[dict]:
    """Rows of a JSONL input, read one line at a time: parse(obj, line) turns each JSON object into a row
    (None: a row the format itself drops, counted). A bad line (not JSON, not an object, or rejected by
    parse) goes to ctx.bad."""
    for line, raw in text_lines(path):
        if not raw.strip():
            continue
        try:
            obj = decode_json_line(raw.encode("utf-8"), ctx.file, line)
            if not isinstance(obj, dict):
                raise TraceError("expected a JSON object", ctx.file, line)
            row = parse(obj, line)
        except TraceError as exc:
            ctx.bad(exc)
            continue
        if row is None:
            ctx.dropped += 1
            continue
        yield row


def _vllm_custom(path: str, ctx: _Ctx, opts: dict) -> Iterator[dict]:
    file = ctx.file
    n = opts.get("custom_output_len", 256)
    keep = opts.get("keep_output_tokens", False)
    template = opts.get("chat_template", True)
    ctx.notes.append("prompts wrapped in the ChatML chat template, one user turn and the generation prompt (Qwen3's "
                     "template; vLLM applies the served model's)" if template else
                     "prompts kept raw (--skip-chat-template)")
    ctx.notes.append("output lengths: " + ("each line's output_tokens (--custom-output-len -1)" if n == -1 else
                     f"each line's output_tokens where given, else {n} (--keep-output-tokens)" if keep else
                     f"{n} for every line (--custom-output-len overrides output_tokens, as in vLLM; -1 takes them)"))

    def parse(obj: dict, line: int) -> dict:
        prompt = obj.get("prompt")
        if prompt is None:
            raise TraceError("missing field", file, line, "prompt")
        if not isinstance(prompt, str) or not prompt:
            raise TraceError("must be a non-empty string", file, line, "prompt")
        check_text(prompt, file, line, "prompt")
        if isinstance(obj.get("output"), str):
            check_text(obj["output"], file, line, "output")
        rid = obj.get("id", f"vllm-{line}")
        if isinstance(rid, bool) or not isinstance(rid, (str, int)) or (isinstance(rid, int) and abs(rid) > 10**30):
            raise TraceError("must be a string", file, line, "id")
        row = {"id": check_text(str(rid), file, line, "id"), "prompt": render_chat([("user", prompt)]) if template else prompt}
        given = _int_field(obj["output_tokens"], file, line, "output_tokens", minimum=1) if "output_tokens" in obj else None
        if isinstance(obj.get("output"), str) and obj["output"]:
            row["output"] = obj["output"]
        elif n == -1 or (keep and given is not None):
            if given is None:
                raise TraceError("missing field (--custom-output-len -1 takes each line's output_tokens)",
                                 file, line, "output_tokens")
            row["output_len"] = given
        else:
            row["output_len"] = n
        return row

    return _jsonl_rows(path, ctx, parse)


def _csv_records(path: str, ctx: _Ctx) -> Iterator[tuple[int, list[str]]]:
    """(first line, fields) of every CSV record, read one line at a time; a record the csv module cannot read
    (a field over its 128 KiB limit, an unterminated quote) is a TraceError naming the line."""
    reader = csv.reader(text for _, text in text_lines(path))
    line = 0
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise TraceError(f"not readable as CSV: {exc}", ctx.file, line + 1) from None
        start, line = line + 1, reader.line_num
        yield start, row


def _csv_rows(path: str, ctx: _Ctx, required: list[str]) -> Iterator[tuple[int, dict]]:
    records = _csv_records(path, ctx)
    first = next(records, None)
    if first is None:
        raise TraceError("empty file", ctx.file)
    header = [h.strip() for h in first[1]]
    for col in required:
        if col not in header:
            raise TraceError(f"missing column (header has: {', '.join(h[:40] for h in header[:20])})", ctx.file, 1, col)
    for start, row in records:
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            ctx.bad(TraceError(f"expected {len(header)} columns, got {len(row)}", ctx.file, start))
            continue
        yield start, dict(zip(header, row))


def _length_csv(prefix: str, ts_col: str, ts_parse: Callable, p_col: str, o_col: str,
                keep: Callable[[dict, dict], bool] | None = None, extra: tuple[str, ...] = ()) -> Callable:
    """A converter for a length-only CSV trace (timestamp, prompt tokens, output tokens per row). Rows with
    0 output tokens (failed requests) are dropped and counted; so are (well-formed) rows keep(row, opts) rejects."""
    def convert(path: str, ctx: _Ctx, opts: dict) -> Iterator[dict]:
        f = ctx.file
        for line, row in _csv_rows(path, ctx, [ts_col, p_col, o_col, *extra]):
            try:
                ts = ts_parse(row[ts_col], f, line, ts_col)
                _one_style(row[ts_col], ctx, line, ts_col)
                p = _int_field(row[p_col], f, line, p_col, minimum=1)
                o = _int_field(row[o_col], f, line, o_col)
            except TraceError as exc:
                ctx.bad(exc)
                continue
            if o == 0 or (keep is not None and not keep(row, opts)):
                ctx.dropped += 1
                continue
            yield {"id": f"{prefix}-{line}", "prompt_len": p, "output_len": o, "_ts": ts, "_line": line}
    return convert


def _one_style(v: str, ctx: _Ctx, line: int, name: str) -> None:
    """TraceError when this timestamp's style (a number or a date-time) differs from the file's first one:
    mixed styles would put the requests on two unrelated clocks."""
    try:
        float(v.strip())
        style = "a number"
    except ValueError:
        style = "a date-time"
    if ctx.ts_style is None:
        ctx.ts_style = (style, line)
    elif ctx.ts_style[0] != style:
        raise TraceError(f"timestamp is {style} but line {ctx.ts_style[1]}'s is {ctx.ts_style[0]}: one file takes "
                         "one style", ctx.file, line, name)


BURSTGPT_MODEL = "GPT-4"  # the model vLLM's BurstGPT dataset keeps


def _burstgpt_keep(row: dict, opts: dict) -> bool:
    model = opts.get("model") or BURSTGPT_MODEL
    return model == "all" or row["Model"].strip() == model


_azure = _length_csv("azure", "TIMESTAMP", _timestamp_s, "ContextTokens", "GeneratedTokens")
_burstgpt_rows = _length_csv("burstgpt", "Timestamp", _float_field, "Request tokens", "Response tokens",
                             keep=_burstgpt_keep, extra=("Model",))


def _burstgpt(path: str, ctx: _Ctx, opts: dict) -> Iterator[dict]:
    model = opts.get("model") or BURSTGPT_MODEL
    ctx.notes.append("every model's rows (--model all)" if model == "all" else
                     f"only the {model} rows (--model; vLLM keeps GPT-4; all: every model)")
    if model != "all":
        ctx.dropped_why = f"rows of other models than {model} and failed requests (0 response tokens)"
    return _burstgpt_rows(path, ctx, opts)


AZURE_WORKLOADS = {"code": "codeedit", "conv": "chat", "conversation": "chat"}


def azure_workload(path: str, workload: str | None) -> str:
    """The workload of an Azure trace: --workload (code and conv are named codeedit and chat), else the file
    name's _code / _conv; ConfigError when neither tells."""
    from sim.infra.errors import ConfigError

    if workload:
        return AZURE_WORKLOADS.get(workload.lower(), workload)
    stem = os.path.basename(str(path)).lower()
    hits = {w for k, w in AZURE_WORKLOADS.items() if re.search(rf"(^|[^a-z]){k}([^a-z]|$)", stem)}
    if len(hits) == 1:
        return hits.pop()
    raise ConfigError(f"{path}: say which Azure trace this is with --workload code or --workload conv (the file name "
                      "does not tell; it picks the acceptance profile of the length-only requests)")


def _mooncake(path: str, ctx: _Ctx, opts: dict) -> Iterator[dict]:
    f = ctx.file

    def parse(obj: dict, line: int) -> dict | None:
        for key in ("timestamp", "input_length", "output_length"):
            if key not in obj:
                raise TraceError("missing field", f, line, key)
        ts = _float_field(obj["timestamp"], f, line, "timestamp") / 1000.0
        p = _int_field(obj["input_length"], f, line, "input_length", minimum=1)
        o = _int_field(obj["output_length"], f, line, "output_length")
        hashes = obj.get("hash_ids")
        if hashes is not None and not (isinstance(hashes, list) and all(
                isinstance(h, int) and not isinstance(h, bool) for h in hashes)):
            raise TraceError("must be a list of integers", f, line, "hash_ids")
        if o == 0:  # nothing generated: dropped and counted
            return None
        row = {"id": f"mooncake-{line}", "prompt_len": p, "output_len": o, "_ts": ts, "_line": line}
        if hashes is not None:
            row["hash_ids"] = hashes
        return row

    ctx.notes.append("hash_ids (KV-block hashes of each prompt) kept in the trace; the simulator does not use "
                     "them until it models prefix caching")

    return _jsonl_rows(path, ctx, parse)


def _vidur(path: str, ctx: _Ctx, opts: dict) -> Iterator[dict]:
    f = ctx.file
    first = next(_csv_records(path, ctx), None)
    head = [h.strip() for h in (first[1] if first else [])]
    if "num_prefill_tokens" in head:
        p_col, o_col = "num_prefill_tokens", "num_decode_tokens"
        ts_col = next((c for c in ("arrived_at", "arrival_time") if c in head), None)
    elif "PromptTokenCount" in head:
        p_col, o_col, ts_col = "PromptTokenCount", "CompletionTokenCount", "Time"
    else:
        raise TraceError("not a Vidur trace: expected columns num_prefill_tokens, num_decode_tokens (or Time, "
                         f"PromptTokenCount, CompletionTokenCount); the header has: {', '.join(h[:40] for h in head[:20])}",
                         f, 1)
    ctx.notes.append(f"Vidur columns {p_col}, {o_col}" + (f", {ts_col}" if ts_col else " (no arrival times: all at 0)")
                     + "; counts below 1 raised to 1, as Vidur does")
    for line, row in _csv_rows(path, ctx, [p_col, o_col] + ([ts_col] if ts_col else [])):
        try:
            out = {"id": f"vidur-{line}",  # Vidur truncates (scaled) counts to integers, then raises them to >= 1
                   "prompt_len": max(1, int(_float_field(row[p_col], f, line, p_col))),
                   "output_len": max(1, int(_float_field(row[o_col], f, line, o_col))), "_line": line}
            for col, key in ((p_col, "prompt_len"), (o_col, "output_len")):
                if out[key] > MAX_TOKENS:
                    raise TraceError(f"must be <= {MAX_TOKENS} tokens, got {out[key]:.3g}", f, line, col)
            if ts_col:
                out["_ts"] = _timestamp_s(row[ts_col], f, line, ts_col)
                _one_style(row[ts_col], ctx, line, ts_col)
        except TraceError as exc:
            ctx.bad(exc)
            continue
        yield out


FORMATS: dict[str, tuple[Callable, bool, str]] = {
    # name: (reader, length_only, what dropped rows are)
    "sharegpt": (_sharegpt, False, "empty or leading assistant turns"),
    "vllm-custom": (_vllm_custom, True, ""),
    "azure": (_azure, True, "requests with 0 generated tokens"),
    "burstgpt": (_burstgpt, True, "failed requests (0 response tokens)"),
    "mooncake": (_mooncake, True, "requests with 0 output tokens"),
    "vidur": (_vidur, True, ""),
}


def convert_rows(fmt: str, in_path: str | os.PathLike, skip_bad: bool = False, workload: str | None = None,
                 output_len: int = 256, **opts) -> ConvertResult:
    """Read IN in format `fmt` and return the hybridspec rows (not yet written). `output_len` is the custom
    dataset's --custom-output-len; `opts`: turns, sharegpt_output_len, length_filter (sharegpt),
    keep_output_tokens, chat_template (vllm-custom), model (burstgpt); the module docstring says what each does."""
    from sim.infra.errors import ConfigError

    if fmt not in FORMATS:
        raise ConfigError(f"unknown format {fmt!r}; known formats: {', '.join(FORMATS)}")
    if opts.get("turns", "first") not in ("first", "all"):
        raise ConfigError(f"--turns must be first or all, got {opts['turns']!r}")
    if output_len == 0 or output_len < -1:
        raise ConfigError(f"--custom-output-len must be >= 1 or -1 (each line's output_tokens), got {output_len}")
    if opts.get("sharegpt_output_len") is not None and opts["sharegpt_output_len"] < 1:
        raise ConfigError(f"--sharegpt-output-len must be >= 1, got {opts['sharegpt_output_len']}")
    reader, length_only, why = FORMATS[fmt]
    file = str(in_path)
    from sim.core.trace.loader import check_trace_file

    check_trace_file(Path(in_path), file)
    if os.path.getsize(in_path) == 0:
        raise TraceError("empty file", file)
    ctx = _Ctx(file, skip_bad)
    rows = list(reader(file, ctx, {"custom_output_len": output_len, **opts}))
    why = ctx.dropped_why if ctx.dropped_why is not None else why
    if not rows:
        extra = f"; {ctx.skipped} bad rows skipped" if ctx.skipped else ""
        extra += f"; {ctx.dropped} {why} dropped" if ctx.dropped else ""
        raise TraceError(f"no requests to convert{extra}", file)
    if fmt == "azure":  # after the rows, so that a malformed file is reported as such first
        workload = azure_workload(file, workload)
    seen: set[str] = set()
    for r in rows:
        if r["id"] in seen:
            raise TraceError(f"duplicate id {r['id']!r}", file, None, "id")
        seen.add(r["id"])
    if rows and "_ts" in rows[0]:
        t0 = min(r["_ts"] for r in rows)
        for r in rows:
            r["arrival_s"] = round(r.pop("_ts") - t0, 6)
            if r["arrival_s"] > MAX_ARRIVAL_S:
                raise TraceError(f"arrives {r['arrival_s']:.3g} s after the first request, more than {MAX_ARRIVAL_S:g} s "
                                 "(a timestamp in other units?)", file, r.get("_line"))
    for r in rows:
        r.pop("_line", None)
    if workload is not None:
        for r in rows:
            r["workload"] = workload
    if fmt == "azure":
        ctx.notes.append(f"workload {workload} (the acceptance profile of its length-only requests)")
    if any("prompt" in r or "output" in r for r in rows):
        from sim.core.trace.tokenizer import TOKENIZER_NAME

        ctx.notes.append(f"text is tokenized by python -m sim.run with the served model's own tokenizer where one is "
                         f"available offline (Qwen3's; SmolLM2's with the real extra), else with {TOKENIZER_NAME}'s")
    return ConvertResult(rows, ctx.skipped, ctx.dropped, why, length_only, ctx.problems, ctx.notes)


def convert(fmt: str, in_path, out_path, **kw) -> ConvertResult:
    res = convert_rows(fmt, in_path, **kw)
    write_jsonl(out_path, res.rows)
    return res
