"""Builders of the bundled traces: byte-identical rebuilds, disjoint chat/general, codeedit edit logic."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sim.core.trace import load_trace
from sim.core.trace import build_codeedit as bc
from sim.core.trace import build_sharegpt as bs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDSPEC_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def conversations():
    return bs.load_conversations()


def test_sharegpt_stream_recovers_complete_conversations(conversations):
    assert len(conversations) > 17000
    assert conversations == sorted(conversations)


def test_chat_general_deterministic_and_disjoint(tmp_path, conversations):
    for d in ("a", "b"):
        for spec in (bs.CHAT, bs.GENERAL):
            bs.build(spec, tmp_path / d / f"{spec.name}.jsonl", limit=25, conversations=conversations, progress=False)
    for name in ("chat", "general"):
        a, b = (tmp_path / d / f"{name}.jsonl" for d in ("a", "b"))
        assert a.read_bytes() == b.read_bytes()
        tr = load_trace(a)
        assert len(tr.requests) == 25 and all(r.workload == name for r in tr.requests)
        assert all(bs.CHAT.out_min <= r.output_len <= 1500 for r in tr.requests)
    conv = {name: {json.loads(l)["id"].split("/")[0] for l in (tmp_path / "a" / f"{name}.jsonl").open()}
            for name in ("chat", "general")}
    assert not conv["chat"] & conv["general"]


def test_build_pair_asserts_disjoint(tmp_path):
    res = bs.build_pair(tmp_path, limit=10, progress=False)
    assert res["chat"]["n"] == 10 and res["general"]["n"] == 10
    assert not set(res["chat"]["ids"]) & set(res["general"]["ids"])


def _tree(n_funcs: int, edit: bool) -> str:
    parts = ['"""A synthetic module."""\nimport os\n\n']
    for i in range(n_funcs):
        body = f"    return value * {i} + len(os.sep)\n"
        if edit and i % 7 == 3:
            body = f"    result = value * {i}\n    return result + len(os.sep)  # edited\n"
        parts.append(f"\ndef function_number_{i}(value: int) -> int:\n    \"\"\"Doc of function {i}.\"\"\"\n{body}\n")
    return "".join(parts)


def _count(text: str) -> int:
    from sim.core.trace.tokenizer import get_tokenizer
    return len(get_tokenizer().encode(text))


def test_codeedit_synthetic_pair_deterministic():
    old = {"pkg/small.py": _tree(20, False), "pkg/big.py": _tree(200, False), "pkg/same.py": "x = 1\n"}
    new = {"pkg/small.py": _tree(20, True), "pkg/big.py": _tree(200, True), "pkg/same.py": "x = 1\n"}
    rows1 = bc.project_edits("synth 1->2", old, new, _count)
    rows2 = bc.project_edits("synth 1->2", dict(reversed(old.items())), new, _count)
    assert rows1 == rows2 and rows1
    small = [r for r in rows1 if "small.py" in r["id"]]
    big = [r for r in rows1 if "big.py" in r["id"]]
    assert len(small) == 1 and small[0]["output"] == new["pkg/small.py"]  # whole file, <= 4 hunk groups
    assert big and all(r["output"].count("# edited") >= 1 for r in big)
    assert all(_count(r["output"]) <= bc.MAX_TOKENS for r in big)
    # each windowed output equals the old window with its hunks applied: it is a contiguous slice of a file
    # holding exactly those edits, and the request's diff shows only '# edited' insertions
    for r in big:
        assert "Requested change (unified diff)" in r["prompt"] and "lines " in r["prompt"]
        assert r["prompt"].endswith("<|im_start|>assistant\n")
    sel = bc.select(rows1, _count, target=3, cap=2)
    assert sel == bc.select(list(reversed(rows1)), _count, target=3, cap=2)
    assert len(sel) <= 3


def test_fetch_wheel_checks_sha256(tmp_path):
    rel = bc.Release("1.0", "fake-1.0-py3-none-any.whl", "0" * 64)
    (tmp_path / rel.filename).write_bytes(b"not a wheel")
    with pytest.raises(bc.DownloadError, match="sha256 mismatch"):
        bc.fetch_wheel(bc.Project("fake", "MIT", rel, rel), rel, tmp_path)


def test_projects_pinned():
    assert len({p.name for p in bc.PROJECTS}) >= 5
    for p in bc.PROJECTS:
        assert p.license and len(p.old.sha256) == 64 and len(p.new.sha256) == 64


@pytest.mark.slow
def test_codeedit_full_rebuild_is_identical(tmp_path):
    """Needs the network (PyPI) unless the wheels are in $HYBRIDSPEC_CACHE_DIR/wheels."""
    wheels = Path(os.environ.get("HYBRIDSPEC_WHEELS", Path.home() / ".cache" / "hybridspec" / "wheels"))
    out = tmp_path / "codeedit.jsonl"
    res = bc.build(out, cache=wheels, progress=False)
    assert res["n"] >= 300 and len(res["per_project"]) >= 5
    assert out.read_bytes() == (ROOT / "traces" / "codeedit.jsonl").read_bytes()


@pytest.mark.slow
def test_codeedit_model_full_rebuild_is_identical(tmp_path):
    """The model-shaped trace rebuilds byte-identically from the same wheels (seeded by request id)."""
    wheels = Path(os.environ.get("HYBRIDSPEC_WHEELS", Path.home() / ".cache" / "hybridspec" / "wheels"))
    out = tmp_path / "codeedit-model.jsonl"
    bc.build(out, cache=wheels, progress=False, shape="model")
    assert out.read_bytes() == (ROOT / "traces" / "codeedit-model.jsonl").read_bytes()
