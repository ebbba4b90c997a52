"""Converters (sharegpt, vllm-custom, azure, burstgpt, mooncake) on small fixtures, and their errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.errors import ConfigError
from sim.trace import TraceError, load_trace
from sim.trace.convert import FORMATS, convert, convert_rows
from sim.trace.formats import iter_json_list

FIX = Path(__file__).parent / "fixtures" / "trace"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDSPEC_CACHE_DIR", str(tmp_path / "cache"))


def test_sharegpt(tmp_path):
    out = tmp_path / "o.jsonl"
    res = convert("sharegpt", FIX / "sharegpt.json", out, workload="chat")
    ids = [r["id"] for r in res.rows]
    assert ids == ["c1/1", "c1/3", "c3/2"]
    assert res.dropped == 2  # c2's leading and empty assistant turns
    r = res.rows[1]
    assert r["output"] == "3+3 is 6."
    assert r["prompt"].startswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n2+2 is 4.")
    assert r["prompt"].endswith("<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n")
    assert res.rows[2]["prompt"].startswith("<|im_start|>system\nBe brief.")
    tr = load_trace(out)
    assert len(tr.requests) == 3 and not tr.length_only and tr.requests[0].workload == "chat"


def test_vllm_custom(tmp_path):
    out = tmp_path / "o.jsonl"
    res = convert("vllm-custom", FIX / "vllm_custom.jsonl", out, output_len=99)
    assert [r["output_len"] for r in res.rows] == [40, 99]
    tr = load_trace(out)
    assert tr.length_only and tr.requests[0].prompt_ids is not None and tr.requests[0].output_len == 40


def test_azure(tmp_path):
    out = tmp_path / "o.jsonl"
    res = convert("azure", FIX / "azure.csv", out)
    assert res.dropped == 1 and len(res.rows) == 3
    assert [r["prompt_len"] for r in res.rows] == [374, 396, 2048]
    arr = [r["arrival_s"] for r in res.rows]
    assert arr[0] == 0.0 and arr[1] == pytest.approx(4.314579) and arr[2] == pytest.approx(5.569410)
    tr = load_trace(out)
    assert tr.length_only and tr.requests[1].output_len == 109


def test_burstgpt(tmp_path):
    out = tmp_path / "o.jsonl"
    res = convert("burstgpt", FIX / "burstgpt.csv", out)
    assert res.dropped == 1 and "failed" in res.dropped_why
    assert [(r["prompt_len"], r["output_len"], r["arrival_s"]) for r in res.rows] == [(472, 18, 0.0), (417, 276, 113.0)]
    assert load_trace(out).length_only


def test_mooncake(tmp_path):
    out = tmp_path / "o.jsonl"
    res = convert("mooncake", FIX / "mooncake.jsonl", out)
    assert res.dropped == 1
    assert [(r["prompt_len"], r["output_len"], r["arrival_s"]) for r in res.rows] == [(6955, 52, 0.0), (6472, 26, 3.053)]
    assert len(load_trace(out).requests) == 2


def test_unknown_format():
    with pytest.raises(ConfigError, match="known formats: sharegpt, vllm-custom, azure, burstgpt, mooncake"):
        convert_rows("parquet", FIX / "azure.csv")
    assert set(FORMATS) == {"sharegpt", "vllm-custom", "azure", "burstgpt", "mooncake"}


def _w(tmp_path, text, name):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


@pytest.mark.parametrize("fmt,name,text,line,field,msg", [
    ("azure", "a.csv", "TIMESTAMP,ContextTokens\n1,2\n", 1, "GeneratedTokens", "missing column"),
    ("azure", "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,12,3\nyesterday,2,3\n", 3, "TIMESTAMP", "not a timestamp"),
    ("azure", "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1,12,-3\n", 2, "GeneratedTokens", ">= 0"),
    ("azure", "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1,12\n", 2, None, "columns"),
    ("burstgpt", "b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n1,M,x,3,3,API log\n", 2, "Request tokens", "integer"),
    ("burstgpt", "b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\nnan,M,2,3,5,API log\n", 2, "Timestamp", "finite"),
    ("mooncake", "m.jsonl", '{"timestamp": 1, "input_length": 2, "output_length": 3}\n{"timestamp": 1, "input_length": 2}\n', 2, "output_length", "missing"),
    ("mooncake", "m.jsonl", '{"timestamp": 1, "input_length": 2.5, "output_length": 3}\n', 1, "input_length", "integer"),
    ("mooncake", "m.jsonl", '{"timestamp": 1, "input_length": 2, "output_length": 3}\nnope\n', 2, None, "not valid JSON"),
    ("vllm-custom", "v.jsonl", '{"prompt": "a"}\n{"text": "b"}\n', 2, "prompt", "missing"),
    ("vllm-custom", "v.jsonl", '{"prompt": "a", "output_tokens": 0}\n', 1, "output_tokens", ">= 1"),
    ("sharegpt", "s.json", '[\n{"id": "a", "conversations": [{"from": "alien", "value": "x"}]}\n]', 2, "conversations[0].from", "unknown role"),
    ("sharegpt", "s.json", '[\n{"id": "a", "conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": 3}]}\n]', 2, "conversations[1].value", "string"),
    ("sharegpt", "s.json", '[\n{"id": "a"}\n]', 2, "conversations", "missing"),
    ("sharegpt", "s.json", '[\n{"id": "a", "conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}]},\n{"id": "b", "conv', 3, None, "truncated"),
    ("sharegpt", "s.json", '{"id": "a"}', 1, None, "expected a JSON list"),
])
def test_converter_errors(tmp_path, fmt, name, text, line, field, msg):
    p = _w(tmp_path, text, name)
    with pytest.raises(TraceError) as ei:
        convert_rows(fmt, p)
    e = ei.value
    assert msg in str(e) and e.file == str(p) and e.line == line and e.field == field


def test_converter_skip_bad_counts(tmp_path):
    p = _w(tmp_path, '{"timestamp": 1000, "input_length": 2, "output_length": 3}\nnope\n{"timestamp": -1}\n'
                     '{"timestamp": 3000, "input_length": 5, "output_length": 0}\n', "m.jsonl")
    res = convert_rows("mooncake", p, skip_bad=True)
    assert (len(res.rows), res.skipped, res.dropped) == (1, 2, 1)


def test_converter_empty_missing_and_bad_utf8(tmp_path):
    with pytest.raises(TraceError, match="empty file"):
        convert_rows("azure", _w(tmp_path, "", "e.csv"))
    with pytest.raises(TraceError, match="file not found"):
        convert_rows("azure", tmp_path / "missing.csv")
    p = tmp_path / "u.csv"
    p.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,\xff\n")
    with pytest.raises(TraceError, match="invalid UTF-8") as ei:
        convert_rows("azure", p)
    assert ei.value.line == 2
    with pytest.raises(TraceError, match="no requests to convert; 1 requests with 0 generated tokens dropped"):
        convert_rows("azure", _w(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,0\n", "z.csv"))


def test_streaming_list_recovers_before_truncation():
    text = '[{"a": 1}, {"a": 2},\n {"a": 3, "b": "unterminated'
    got = [o for _, o in iter_json_list(text, "f", stop_at_broken_tail=True)]
    assert got == [{"a": 1}, {"a": 2}]
    with pytest.raises(TraceError, match="truncated"):
        list(iter_json_list(text, "f"))
    assert [o for _, o in iter_json_list('[ ]', "f")] == []
    assert json.loads('[1]') == [o for _, o in iter_json_list('[1]', "f")]
