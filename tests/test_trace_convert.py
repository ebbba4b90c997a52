"""Converters (sharegpt, vllm-custom, azure, burstgpt, mooncake, vidur) on small fixtures in each real format, and
their errors. The default readings are vLLM 0.33's benchmark datasets' (vllm/benchmarks/datasets): the expected
values below follow its rules, restated in each test."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.infra.errors import ConfigError
from sim.core.trace import TraceError, load_trace
from sim.core.trace.convert import FORMATS, convert, convert_rows
from sim.core.trace.formats import iter_json_list

FIX = Path(__file__).parent / "fixtures" / "trace"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDSPEC_CACHE_DIR", str(tmp_path / "cache"))


def test_sharegpt(tmp_path):
    out = tmp_path / "o.jsonl"
    res = convert("sharegpt", FIX / "sharegpt.json", out, workload="chat", turns="all")
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


def test_sharegpt_first_turn_is_vllms_reading(tmp_path):
    """vLLM: conversations with >= 2 turns; turn 0 -> prompt, turn 1 -> output, whatever their roles, raw text;
    kept when prompt has 4..1024 tokens, output >= 4 and the sum <= 2048 (output minimum off with a fixed length)."""
    from sim.core.trace.tokenizer import get_tokenizer

    res = convert_rows("sharegpt", FIX / "sharegpt_vllm.json")
    assert [r["id"] for r in res.rows] == ["keep", "roles-ignored"]
    assert res.rows[0] == {"id": "keep", "prompt": "Explain what a hash map is.",
                           "output": "A hash map stores key-value pairs in buckets chosen by a hash of the key."}
    assert res.dropped == 5 and "length filter" in res.dropped_why
    assert any("qwen3 tokenizer" in n for n in res.notes)
    tok = get_tokenizer()
    assert tok.count("Hi.") < 4 <= tok.count("Explain what a hash map is.")  # what drops 'short-prompt'
    fixed = convert_rows("sharegpt", FIX / "sharegpt_vllm.json", sharegpt_output_len=3)
    assert {r["id"] for r in fixed.rows} == {"keep", "roles-ignored", "short-output", "long-total"}  # no output minimum; total 938 + 3
    assert all(r["output_len"] == 3 and "output" not in r for r in fixed.rows)
    every = convert_rows("sharegpt", FIX / "sharegpt_vllm.json", length_filter=False)
    assert len(every.rows) == 6 and every.dropped == 1  # only the one-turn conversation
    with pytest.raises(ConfigError, match="--turns"):
        convert_rows("sharegpt", FIX / "sharegpt_vllm.json", turns="last")


def test_vllm_custom(tmp_path):
    """vLLM: --custom-output-len (default 256) overrides output_tokens; -1 takes them (each line must have
    one); the prompt goes through the chat template unless --skip-chat-template."""
    out = tmp_path / "o.jsonl"
    res = convert("vllm-custom", FIX / "vllm_custom.jsonl", out)
    assert [r["output_len"] for r in res.rows] == [256, 256]
    assert res.rows[0]["prompt"] == "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n"
    assert [r["output_len"] for r in convert_rows("vllm-custom", FIX / "vllm_custom.jsonl", output_len=99).rows] == [99, 99]
    kept = convert_rows("vllm-custom", FIX / "vllm_custom.jsonl", output_len=99, keep_output_tokens=True)
    assert [r["output_len"] for r in kept.rows] == [40, 99]
    raw = convert_rows("vllm-custom", FIX / "vllm_custom.jsonl", chat_template=False)
    assert raw.rows[1]["prompt"] == "Summarise the plot of Hamlet."
    with pytest.raises(TraceError, match="output_tokens") as ei:
        convert_rows("vllm-custom", FIX / "vllm_custom.jsonl", output_len=-1)
    assert ei.value.line == 2
    p = tmp_path / "all.jsonl"
    p.write_text('{"prompt": "a b c", "output_tokens": 7}\n')
    assert convert_rows("vllm-custom", p, output_len=-1).rows[0]["output_len"] == 7
    with pytest.raises(ConfigError, match="custom-output-len"):
        convert_rows("vllm-custom", p, output_len=0)
    tr = load_trace(out)
    assert tr.length_only and tr.requests[0].prompt_ids is not None and tr.requests[0].output_len == 256


def test_azure(tmp_path):
    out = tmp_path / "o.jsonl"
    res = convert("azure", FIX / "azure.csv", out, workload="code")
    assert res.dropped == 1 and len(res.rows) == 3
    assert [r["prompt_len"] for r in res.rows] == [374, 396, 2048]
    assert {r["workload"] for r in res.rows} == {"codeedit"}
    arr = [r["arrival_s"] for r in res.rows]
    assert arr[0] == 0.0 and arr[1] == pytest.approx(4.314579) and arr[2] == pytest.approx(5.569410)
    tr = load_trace(out)
    assert tr.length_only and tr.requests[1].output_len == 109


def test_azure_workload_from_the_name_or_an_error(tmp_path):
    import shutil

    for name, want in (("AzureLLMInferenceTrace_code.csv", "codeedit"), ("AzureLLMInferenceTrace_conv_1week.csv", "chat")):
        shutil.copy(FIX / "azure.csv", tmp_path / name)
        assert {r["workload"] for r in convert_rows("azure", tmp_path / name).rows} == {want}
    with pytest.raises(ConfigError, match="--workload code or --workload conv"):
        convert_rows("azure", FIX / "azure.csv")
    assert {r["workload"] for r in convert_rows("azure", FIX / "azure.csv", workload="conv").rows} == {"chat"}


def test_burstgpt(tmp_path):
    """vLLM keeps the GPT-4 rows with > 0 response tokens."""
    out = tmp_path / "o.jsonl"
    res = convert("burstgpt", FIX / "burstgpt.csv", out)
    assert [(r["prompt_len"], r["output_len"]) for r in res.rows] == [(417, 276)]
    assert res.dropped == 2 and "GPT-4" in res.dropped_why
    res = convert("burstgpt", FIX / "burstgpt.csv", out, model="all")
    assert res.dropped == 1 and "failed" in res.dropped_why
    assert [(r["prompt_len"], r["output_len"], r["arrival_s"]) for r in res.rows] == [(472, 18, 0.0), (417, 276, 113.0)]
    assert load_trace(out).length_only
    assert len(convert_rows("burstgpt", FIX / "burstgpt.csv", model="ChatGPT").rows) == 1


def test_mooncake(tmp_path):
    out = tmp_path / "o.jsonl"
    res = convert("mooncake", FIX / "mooncake.jsonl", out)
    assert res.dropped == 1
    assert [(r["prompt_len"], r["output_len"], r["arrival_s"]) for r in res.rows] == [(6955, 52, 0.0), (6472, 26, 3.053)]
    assert [r["hash_ids"] for r in res.rows] == [[46, 47, 48], [46, 52]]  # kept for prefix caching
    assert any("prefix caching" in n for n in res.notes)
    assert len(load_trace(out).requests) == 2


def test_vidur(tmp_path):
    """Vidur's length trace (num_prefill_tokens, num_decode_tokens[, arrived_at]) and its replay trace (Time,
    PromptTokenCount, CompletionTokenCount): counts truncated to integers, then raised to >= 1."""
    res = convert("vidur", FIX / "vidur_lengths.csv", tmp_path / "v.jsonl")
    assert [(r["prompt_len"], r["output_len"]) for r in res.rows] == [(120, 300), (1, 1), (2048, 17)]
    assert "arrival_s" not in res.rows[0] and load_trace(tmp_path / "v.jsonl").length_only
    res = convert_rows("vidur", FIX / "vidur_replay.csv")
    assert [(r["prompt_len"], r["output_len"], r["arrival_s"]) for r in res.rows] == [(512, 64, 0.0), (900, 1, 1.5)]
    p = tmp_path / "arr.csv"
    p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n2.0,10,5\n0.5,20,6\n")
    assert [r["arrival_s"] for r in convert_rows("vidur", p).rows] == [1.5, 0.0]
    p.write_text("a,b\n1,2\n")
    with pytest.raises(TraceError, match="not a Vidur trace"):
        convert_rows("vidur", p)


def test_unknown_format():
    with pytest.raises(ConfigError, match="known formats: sharegpt, vllm-custom, azure, burstgpt, mooncake, vidur"):
        convert_rows("parquet", FIX / "azure.csv")
    assert set(FORMATS) == {"sharegpt", "vllm-custom", "azure", "burstgpt", "mooncake", "vidur"}


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
