"""Converters from the trace formats users have to hybridspec JSONL (see traces/README.md).

  sharegpt     ShareGPT JSON list [{"id", "conversations": [{"from": "human"|"gpt"|..., "value"}]}]:
               one request per assistant turn; the earlier turns, rendered with the ChatML chat template,
               are the prompt and the assistant text is the output (content trace). Empty assistant turns and
               assistant turns with no earlier turn are dropped and counted.
  vllm-custom  vLLM benchmark custom dataset JSONL, {"prompt": "..."} per line. The prompt text is kept;
               the output is length-only: "output_tokens" of the line if given, else --output-len (default 256,
               like vLLM's --custom-output-len). A line that also has an "output" text keeps it (content).
  azure        Azure LLM inference trace CSV (TIMESTAMP, ContextTokens, GeneratedTokens): length-only.
  burstgpt     BurstGPT CSV (Timestamp, Model, Request tokens, Response tokens, Total tokens, Log Type):
               length-only; failed requests (0 response tokens) are dropped and counted.
  mooncake     Mooncake JSONL ({"timestamp": ms, "input_length", "output_length", "hash_ids"}): length-only.

Timestamps become arrival_s in seconds relative to the earliest kept request. Requests with 0 output tokens
in the length-only formats are dropped and counted (they generate nothing). Every other bad row raises a
TraceError naming file, line and field, or with skip_bad=True is skipped and counted.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Iterator

from sim.errors import TraceError
from sim.trace.formats import ROLE_MAP, iter_json_list, read_text, render_chat, write_jsonl
from sim.trace.loader import nonneg_number

__all__ = ["FORMATS", "ConvertResult", "convert", "convert_rows"]


@dataclass
class ConvertResult:
    rows: list[dict]
    skipped: int = 0  # bad input rows skipped under skip_bad
    dropped: int = 0  # rows dropped by the format's rules (failed requests, empty turns)
    dropped_why: str = ""
    length_only: bool = False
    problems: list[str] = field(default_factory=list)


class _Ctx:
    def __init__(self, file: str, skip_bad: bool):
        self.file, self.skip_bad = file, skip_bad
        self.skipped, self.dropped, self.problems = 0, 0, []

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
        if not math.isfinite(v) or v != int(v):
            raise TraceError(f"must be an integer, got {v!r}", file, line, name)
        v = int(v)
    if not isinstance(v, int):
        raise TraceError(f"must be an integer, got {type(v).__name__}", file, line, name)
    if v < minimum:
        raise TraceError(f"must be >= {minimum}, got {v}", file, line, name)
    return v


def _float_field(v, file, line, name) -> float:
    """A finite number >= 0, also from CSV text."""
    if isinstance(v, str):
        try:
            v = float(v.strip())
        except ValueError:
            raise TraceError(f"must be a number, got {v.strip()!r}", file, line, name) from None
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
        raise TraceError(f"not a timestamp: {s!r}", file, line, name)
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

def _sharegpt(text: str, ctx: _Ctx, opts: dict) -> Iterator[dict]:
    file = ctx.file
    for index, (line, conv) in enumerate(iter_json_list(text, file)):
        try:
            if not isinstance(conv, dict):
                raise TraceError("expected a conversation object", file, line)
            cid = conv.get("id", f"conv{index}")
            if isinstance(cid, bool) or not isinstance(cid, (str, int)) or cid == "":
                raise TraceError("must be a non-empty string", file, line, "id")
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
                messages.append((ROLE_MAP[role.lower()], value))
        except TraceError as exc:
            ctx.bad(exc)
            continue
        for j, (role, value) in enumerate(messages):
            if role != "assistant":
                continue
            if not value.strip() or j == 0:
                ctx.dropped += 1
                continue
            yield {"id": f"{cid}/{j}", "prompt": render_chat(messages[:j]), "output": value}


def _jsonl_rows(text: str, ctx: _Ctx, parse: Callable[[dict, int], dict | None]) -> Iterator[dict]:
    """Rows of a JSONL input: parse(obj, line) turns each JSON object into a row (None: a row the format
    itself drops, counted). A bad line (not JSON, not an object, or rejected by parse) goes to ctx.bad."""
    for line, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        try:
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise TraceError(f"not valid JSON: {exc.msg}", ctx.file, line) from None
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


def _vllm_custom(text: str, ctx: _Ctx, opts: dict) -> Iterator[dict]:
    file = ctx.file
    default_len = opts.get("output_len", 256)

    def parse(obj: dict, line: int) -> dict:
        prompt = obj.get("prompt")
        if prompt is None:
            raise TraceError("missing field", file, line, "prompt")
        if not isinstance(prompt, str) or not prompt:
            raise TraceError("must be a non-empty string", file, line, "prompt")
        row = {"id": str(obj.get("id", f"vllm-{line}")), "prompt": prompt}
        if isinstance(obj.get("output"), str) and obj["output"]:
            row["output"] = obj["output"]
        elif "output_tokens" in obj:
            row["output_len"] = _int_field(obj["output_tokens"], file, line, "output_tokens", minimum=1)
        else:
            row["output_len"] = default_len
        return row

    return _jsonl_rows(text, ctx, parse)


def _csv_rows(text: str, ctx: _Ctx, required: list[str]) -> Iterator[tuple[int, dict]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise TraceError("empty file", ctx.file) from None
    header = [h.strip() for h in header]
    for col in required:
        if col not in header:
            raise TraceError(f"missing column (header has: {', '.join(header)})", ctx.file, 1, col)
    line = reader.line_num
    for row in reader:
        start, line = line + 1, reader.line_num
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            ctx.bad(TraceError(f"expected {len(header)} columns, got {len(row)}", ctx.file, start))
            continue
        yield start, dict(zip(header, row))


def _length_csv(prefix: str, ts_col: str, ts_parse: Callable, p_col: str, o_col: str) -> Callable:
    """A converter for a length-only CSV trace (timestamp, prompt tokens, output tokens per row). Rows with
    0 output tokens (failed requests) are dropped and counted."""
    def convert(text: str, ctx: _Ctx, opts: dict) -> Iterator[dict]:
        f = ctx.file
        for line, row in _csv_rows(text, ctx, [ts_col, p_col, o_col]):
            try:
                ts = ts_parse(row[ts_col], f, line, ts_col)
                p = _int_field(row[p_col], f, line, p_col, minimum=1)
                o = _int_field(row[o_col], f, line, o_col)
            except TraceError as exc:
                ctx.bad(exc)
                continue
            if o == 0:
                ctx.dropped += 1
                continue
            yield {"id": f"{prefix}-{line}", "prompt_len": p, "output_len": o, "_ts": ts}
    return convert


_azure = _length_csv("azure", "TIMESTAMP", _timestamp_s, "ContextTokens", "GeneratedTokens")
_burstgpt = _length_csv("burstgpt", "Timestamp", _float_field, "Request tokens", "Response tokens")


def _mooncake(text: str, ctx: _Ctx, opts: dict) -> Iterator[dict]:
    f = ctx.file

    def parse(obj: dict, line: int) -> dict | None:
        for key in ("timestamp", "input_length", "output_length"):
            if key not in obj:
                raise TraceError("missing field", f, line, key)
        ts = _float_field(obj["timestamp"], f, line, "timestamp") / 1000.0
        p = _int_field(obj["input_length"], f, line, "input_length", minimum=1)
        o = _int_field(obj["output_length"], f, line, "output_length")
        if "hash_ids" in obj and not isinstance(obj["hash_ids"], list):
            raise TraceError("must be a list", f, line, "hash_ids")
        if o == 0:  # nothing generated: dropped and counted
            return None
        return {"id": f"mooncake-{line}", "prompt_len": p, "output_len": o, "_ts": ts}

    return _jsonl_rows(text, ctx, parse)


FORMATS: dict[str, tuple[Callable, bool, str]] = {
    # name: (reader, length_only, what dropped rows are)
    "sharegpt": (_sharegpt, False, "empty or leading assistant turns"),
    "vllm-custom": (_vllm_custom, True, ""),
    "azure": (_azure, True, "requests with 0 generated tokens"),
    "burstgpt": (_burstgpt, True, "failed requests (0 response tokens)"),
    "mooncake": (_mooncake, True, "requests with 0 output tokens"),
}


def convert_rows(fmt: str, in_path: str | os.PathLike, skip_bad: bool = False, workload: str | None = None,
                 output_len: int = 256) -> ConvertResult:
    """Read IN in format `fmt` and return the hybridspec rows (not yet written)."""
    if fmt not in FORMATS:
        from sim.errors import ConfigError
        raise ConfigError(f"unknown format {fmt!r}; known formats: {', '.join(FORMATS)}")
    reader, length_only, why = FORMATS[fmt]
    file = str(in_path)
    text = read_text(in_path)
    if not text.strip():
        raise TraceError("empty file", file)
    ctx = _Ctx(file, skip_bad)
    rows = list(reader(text, ctx, {"output_len": output_len}))
    if not rows:
        extra = f"; {ctx.skipped} bad rows skipped" if ctx.skipped else ""
        extra += f"; {ctx.dropped} {why} dropped" if ctx.dropped else ""
        raise TraceError(f"no requests to convert{extra}", file)
    seen: set[str] = set()
    for r in rows:
        if r["id"] in seen:
            raise TraceError(f"duplicate id {r['id']!r}", file, None, "id")
        seen.add(r["id"])
    if rows and "_ts" in rows[0]:
        t0 = min(r["_ts"] for r in rows)
        for r in rows:
            r["arrival_s"] = round(r.pop("_ts") - t0, 6)
    if workload is not None:
        for r in rows:
            r["workload"] = workload
    return ConvertResult(rows, ctx.skipped, ctx.dropped, why, length_only, ctx.problems)


def convert(fmt: str, in_path, out_path, **kw) -> ConvertResult:
    res = convert_rows(fmt, in_path, **kw)
    write_jsonl(out_path, res.rows)
    return res
