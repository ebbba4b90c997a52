"""Shared helpers of converters and builders: reading text with located errors (whole, or one line at a time),
streaming JSON lists, rendering chat turns, deterministic JSONL writing (whole or not at all)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

from sim.infra.errors import TraceError
from sim.infra.fsio import own_path

# Roles of ShareGPT-style turns, mapped to chat roles.
ROLE_MAP = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "assistant": "assistant",
            "bing": "assistant", "bard": "assistant", "system": "system"}


def read_text(path: str | os.PathLike) -> str:
    """The file as str; missing file, not a regular file, invalid UTF-8 -> TraceError naming file (and line)."""
    from sim.core.trace.loader import check_trace_file

    file = str(path)
    p = Path(path)
    check_trace_file(p, file)
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError("invalid UTF-8", file, data.count(b"\n", 0, exc.start) + 1) from None
    return text[1:] if text.startswith("\ufeff") else text


def text_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """(1-based line number, text with its newline) of every line, read one line at a time (a BOM on the first
    line dropped); not a regular file or invalid UTF-8 -> TraceError naming file and line."""
    from sim.core.trace.loader import check_trace_file, raw_lines

    file = str(path)
    p = Path(path)
    check_trace_file(p, file)
    for lineno, raw in raw_lines(p, file, what=""):
        try:
            yield lineno, raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(f"invalid UTF-8 at byte {exc.start} of the line", file, lineno) from None


class _LineCounter:
    """Incremental char offset -> 1-based line number (offsets must not decrease)."""

    def __init__(self, text: str):
        self.text, self.pos, self.line = text, 0, 1

    def __call__(self, pos: int) -> int:
        self.line += self.text.count("\n", self.pos, pos)
        self.pos = pos
        return self.line


def iter_json_list(text: str, file: str, stop_at_broken_tail: bool = False) -> Iterator[tuple[int, object]]:
    """Yield (line, element) of a top-level JSON list without parsing it whole.

    A broken element raises TraceError, or with stop_at_broken_tail=True ends the iteration (the bundled
    ShareGPT copy is truncated mid-element; everything before the break is recovered)."""
    dec = json.JSONDecoder()
    ws = " \t\r\n"
    n = len(text)
    pos = 0
    while pos < n and text[pos] in ws:
        pos += 1
    if pos >= n:
        raise TraceError("empty file", file)
    if text[pos] != "[":
        raise TraceError("expected a JSON list of conversations", file, _LineCounter(text)(pos))
    pos += 1
    where = _LineCounter(text)
    first = True
    while True:
        while pos < n and text[pos] in ws:
            pos += 1
        if pos < n and text[pos] == "]":
            return
        if not first:
            if pos < n and text[pos] == ",":
                pos += 1
                while pos < n and text[pos] in ws:
                    pos += 1
            elif stop_at_broken_tail:
                return
            else:
                raise TraceError("expected ',' or ']' between list elements (truncated file?)", file, where(pos))
        if pos >= n:
            if stop_at_broken_tail:
                return
            raise TraceError("unexpected end of file inside the list (truncated file?)", file, where(pos))
        line = where(pos)
        try:
            obj, end = dec.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            if stop_at_broken_tail:
                return
            raise TraceError(f"not valid JSON: {exc.msg} (truncated file?)", file, where(max(exc.pos, pos))) from None
        except ValueError as exc:  # an integer of more digits than Python converts
            raise TraceError(f"not valid JSON: {str(exc).split(';')[0]}", file, where(pos)) from None
        except RecursionError:
            raise TraceError("not valid JSON: nested too deeply", file, where(pos)) from None
        yield line, obj
        pos = end
        first = False


def iter_json_items(text: str, file: str) -> Iterator[tuple[int, object]]:
    """(line, element) of a top-level JSON list (iter_json_list), or of JSON Lines (one element per non-blank line)
    when the file is named .jsonl or .ndjson: ShareGPT comes as either."""
    if not str(file).lower().endswith((".jsonl", ".ndjson")):
        yield from iter_json_list(text, file)
        return
    for line, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            yield line, json.loads(raw)
        except ValueError as exc:  # bad JSON, or an integer of more digits than Python converts
            raise TraceError(f"not valid JSON: {str(exc).split(';')[0]}", file, line) from None
        except RecursionError:
            raise TraceError("not valid JSON: nested too deeply", file, line) from None


def render_chat(messages: list[tuple[str, str]]) -> str:
    """ChatML prompt (Qwen's chat template) for (role, text) turns, ending with the assistant's header."""
    parts = [f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in messages]
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def dumps_line(row: dict) -> str:
    return json.dumps(row, ensure_ascii=False, separators=(", ", ": "))


def write_jsonl(path: str | os.PathLike, rows) -> int:
    """Write rows as JSONL (UTF-8, '\\n' newlines, keys in insertion order), whole or not at all: into a
    temporary sibling renamed into place at the end, removed on any failure. Return the count."""
    p = Path(path)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    tmp = own_path(p, "tmp")
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            for row in rows:
                f.write(dumps_line(row))
                f.write("\n")
                n += 1
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return n
