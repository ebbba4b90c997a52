"""load_trace: every accepted line form, every error case (file, line, field), skip_bad, limit, token cache."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sim.infra.errors import ConfigError
from sim.core.trace import Request, Trace, TraceError, load_trace
from sim.core.trace.tokenizer import get_tokenizer, token_cache_path

FIX = Path(__file__).parent / "fixtures" / "trace"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDSPEC_CACHE_DIR", str(tmp_path / "cache"))


def _write(tmp_path, lines, name="t.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(l if isinstance(l, str) else json.dumps(l) for l in lines) + "\n", encoding="utf-8")
    return p


def test_tokenizer_roundtrip_and_vocab():
    tok = get_tokenizer()
    assert tok is get_tokenizer()
    ids = tok.encode("def f(x):\n    return x * 2\n")
    assert tok.decode(ids) == "def f(x):\n    return x * 2\n"
    assert tok.n_vocab >= 151643
    assert tok.encode("<|im_end|>") == [151645]


def test_text_form(tmp_path):
    tr = load_trace(FIX / "text.jsonl")
    assert isinstance(tr, Trace) and tr.skipped == 0 and not tr.length_only
    r = tr.requests[0]
    assert isinstance(r, Request) and r.id == "t1" and r.workload == "codeedit" and r.arrival_s == 0.5
    assert r.prompt_ids.dtype == np.int32 and r.output_ids.dtype == np.int32
    assert r.prompt_len == len(r.prompt_ids) and r.output_len == len(r.output_ids)
    assert get_tokenizer().decode(r.output_ids) == "def add(a, b):\n    return a + b  # sum\n"
    assert r.temperature == 0.0 and not r.length_only
    assert tr.requests[1].temperature == 0.7 and tr.requests[1].arrival_s is None


def test_ids_form():
    tr = load_trace(FIX / "ids.jsonl")
    a, b = tr.requests
    assert a.prompt_ids.tolist() == [1, 2, 3, 4] and a.output_ids.tolist() == [5, 6]
    assert (a.prompt_len, a.output_len, a.arrival_s, a.workload) == (4, 2, 1.25, "chat")
    assert b.id == "7" and b.tokens().tolist() == [9, 9, 9, 9]


def test_length_only_form():
    tr = load_trace(FIX / "lengths.jsonl")
    assert tr.length_only
    r = tr.requests[0]
    assert r.length_only and r.prompt_ids is None and r.output_ids is None
    assert (r.prompt_len, r.output_len, r.arrival_s) == (812, 164, 0.0)


def test_prompt_text_with_output_len_is_length_only(tmp_path):
    tr = load_trace(_write(tmp_path, [{"id": "a", "prompt": "hi there", "output_len": 5}]))
    r = tr.requests[0]
    assert r.length_only and r.prompt_ids is not None and r.output_len == 5


BAD = [
    ("{not json", None, "not valid JSON"),
    ("[1, 2]", None, "expected a JSON object"),
    ({"prompt": "a", "output": "b"}, "id", "missing"),
    ({"id": ["x"], "prompt": "a", "output": "b"}, "id", "must be a string"),
    ({"id": "", "prompt": "a", "output": "b"}, "id", "empty id"),
    ({"id": "a", "output": "b"}, "prompt", "missing"),
    ({"id": "a", "prompt": "x"}, "output", "missing"),
    ({"id": "a", "prompt": 3, "output": "b"}, "prompt", "must be a string"),
    ({"id": "a", "prompt": "x", "output": ""}, "output", "empty output"),
    ({"id": "a", "prompt": "", "output": "y"}, "prompt", "empty prompt"),
    ({"id": "a", "prompt_ids": [1], "output_ids": []}, "output_ids", "empty output"),
    ({"id": "a", "prompt_ids": [1, -2], "output_ids": [3]}, "prompt_ids", "element 1"),
    ({"id": "a", "prompt_ids": [1, 2.5], "output_ids": [3]}, "prompt_ids", "element 1"),
    ({"id": "a", "prompt_ids": "1 2", "output_ids": [3]}, "prompt_ids", "array"),
    ({"id": "a", "prompt_len": -3, "output_len": 4}, "prompt_len", ">= 1"),
    ({"id": "a", "prompt_len": 3, "output_len": 0}, "output_len", "empty output"),
    ({"id": "a", "prompt_len": 3.5, "output_len": 4}, "prompt_len", "integer"),
    ({"id": "a", "prompt_len": True, "output_len": 4}, "prompt_len", "integer"),
    ({"id": "a", "prompt_len": 3, "output": "x"}, "prompt_len", "needs a prompt with content"),
    ({"id": "a", "prompt": "x", "prompt_len": 3, "output": "y"}, "prompt_len", "conflicting"),
    ('{"id": "a", "prompt": "x", "output": "y", "arrival_s": NaN}', "arrival_s", "finite"),
    ('{"id": "a", "prompt": "x", "output": "y", "arrival_s": Infinity}', "arrival_s", "finite"),
    ({"id": "a", "prompt": "x", "output": "y", "arrival_s": -1}, "arrival_s", ">= 0"),
    ({"id": "a", "prompt": "x", "output": "y", "arrival_s": "1"}, "arrival_s", "number"),
    ({"id": "a", "prompt": "x", "output": "y", "temperature": -0.1}, "temperature", ">= 0"),
    ({"id": "a", "prompt": "x", "output": "y", "workload": 5}, "workload", "string"),
]


@pytest.mark.parametrize("line,field,msg", BAD)
def test_bad_line_names_file_line_field(tmp_path, line, field, msg):
    good = {"id": "ok", "prompt": "p", "output": "o"}
    p = _write(tmp_path, [good, line])
    with pytest.raises(TraceError) as ei:
        load_trace(p)
    e = ei.value
    assert e.file == str(p) and e.line == 2 and e.field == field
    assert msg in str(e) and str(p) in str(e) and ":2" in str(e)
    tr = load_trace(p, skip_bad=True)
    assert tr.skipped == 1 and [r.id for r in tr.requests] == ["ok"]


def test_duplicate_id(tmp_path):
    p = _write(tmp_path, [{"id": "a", "prompt": "x", "output": "y"}, "", {"id": "a", "prompt_len": 1, "output_len": 2}])
    with pytest.raises(TraceError, match="duplicate id 'a' \\(first on line 1\\)") as ei:
        load_trace(p)
    assert (ei.value.line, ei.value.field) == (3, "id")


def test_invalid_utf8(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(b'{"id": "a", "prompt": "x", "output": "y"}\n{"id": "b", "prompt": "\xff\xfe", "output": "y"}\n')
    with pytest.raises(TraceError, match="invalid UTF-8") as ei:
        load_trace(p)
    assert ei.value.line == 2
    assert load_trace(p, skip_bad=True).skipped == 1


def test_empty_and_missing_file(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("\n  \n")
    with pytest.raises(TraceError, match="empty trace"):
        load_trace(p)
    with pytest.raises(TraceError, match="file not found"):
        load_trace(tmp_path / "nope.jsonl")
    with pytest.raises(TraceError, match="directory"):
        load_trace(tmp_path)


def test_all_bad_with_skip_bad(tmp_path):
    p = _write(tmp_path, ["{", "[]"])
    with pytest.raises(TraceError, match="no valid requests \\(2 bad lines skipped"):
        load_trace(p, skip_bad=True)


def test_skip_bad_counts(tmp_path):
    p = _write(tmp_path, [{"id": "a", "prompt": "x", "output": "y"}, "{", {"id": "b"}, {"id": "a", "prompt_len": 1, "output_len": 1},
                          {"id": "c", "prompt_ids": [1], "output_ids": [2]}])
    tr = load_trace(p, skip_bad=True)
    assert tr.skipped == 3 and [r.id for r in tr.requests] == ["a", "c"] and len(tr.problems) == 3


def test_limit(tmp_path):
    p = _write(tmp_path, [{"id": str(i), "prompt": f"p{i}", "output": f"o{i}"} for i in range(5)])
    assert [r.id for r in load_trace(p, limit=2).requests] == ["0", "1"]
    with pytest.raises(TraceError, match="limit"):
        load_trace(p, limit=0)


def test_token_cache_written_and_used(tmp_path):
    p = _write(tmp_path, [{"id": "a", "prompt": "hello world", "output": "bye world"}])
    first = load_trace(p)
    cache = token_cache_path(p.read_bytes())
    assert cache.exists() and str(tmp_path / "cache") in str(cache)
    second = load_trace(p)
    assert np.array_equal(first.requests[0].prompt_ids, second.requests[0].prompt_ids)
    assert np.array_equal(first.requests[0].output_ids, second.requests[0].output_ids)
    cache.write_bytes(b"garbage")  # a corrupt cache is rebuilt
    assert np.array_equal(load_trace(p).requests[0].output_ids, first.requests[0].output_ids)


def test_bom_and_crlf(tmp_path):
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"id": "a", "prompt_len": 2, "output_len": 3}\r\n{"id": "b", "prompt_len": 2, "output_len": 3}\r\n')
    assert [r.id for r in load_trace(p).requests] == ["a", "b"]


def _many(tmp_path, n=40):
    return _write(tmp_path, [{"id": str(i), "prompt_len": 3 + i, "output_len": 2 + i} for i in range(n)])


def test_sample_is_seeded_and_in_trace_order(tmp_path):
    p = _many(tmp_path)
    ids = [int(r.id) for r in load_trace(p, sample=10, seed=3).requests]
    assert ids == [int(r.id) for r in load_trace(p, sample=10, seed=3).requests]  # deterministic
    assert ids == sorted(ids) and len(set(ids)) == 10                                # trace order, no repeats
    assert ids != [int(r.id) for r in load_trace(p, sample=10, seed=4).requests]    # the seed matters
    assert [r.id for r in load_trace(p, sample=40).requests] == [str(i) for i in range(40)]


def test_sample_spreads_across_the_trace(tmp_path):
    p = _many(tmp_path)
    for seed in range(5):
        ids = [int(r.id) for r in load_trace(p, sample=8, seed=seed).requests]
        assert min(ids) < 20 <= max(ids)  # both halves of the trace, unlike limit=8 (ids 0..7)


@pytest.mark.parametrize("kw,needle", [({"sample": 41}, "exceeds the trace's 40 requests"),
                                       ({"sample": 0}, "must be >= 1"),
                                       ({"sample": 5, "limit": 5}, "not both")])
def test_bad_sample_one_line(tmp_path, kw, needle):
    with pytest.raises(ConfigError, match=needle) as ei:
        load_trace(_many(tmp_path), **kw)
    assert "\n" not in str(ei.value)
