"""python -m sim.trace: one-line errors with non-zero exit and no traceback; convert, stats, build."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli_inprocess
from sim.core.trace import load_trace
from sim.api.traces import main

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "trace"


def _run(*args, tmp_path):
    return run_cli_inprocess("sim.core.trace", *args, cwd=ROOT, env={"HYBRIDSPEC_CACHE_DIR": str(tmp_path / "cache")})


def _one_line_error(proc, *needles):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for n in needles:
        assert n in lines[0]


def test_cli_convert_and_stats(tmp_path):
    out = tmp_path / "a.jsonl"
    p = _run("convert", "--from", "burstgpt", FIX / "burstgpt.csv", "-o", out, "--burstgpt-model", "all", tmp_path=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "wrote 2 requests (length-only)" in p.stdout and "dropped 1 failed requests" in p.stdout
    p = _run("stats", out, tmp_path=tmp_path)
    assert p.returncode == 0 and "2 requests (2 length-only)" in p.stdout and "n/a" in p.stdout


def test_cli_stats_copy_fraction(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HYBRIDSPEC_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "t.jsonl"
    f.write_text('{"id": "copy", "prompt": "alpha beta gamma delta epsilon zeta eta theta", '
                 '"output": "alpha beta gamma delta epsilon zeta eta theta"}\n')
    assert main(["stats", str(f)]) == 0
    out = capsys.readouterr().out
    assert "1 requests" in out and "ngram copy fraction" in out
    from sim.core.trace.stats import trace_stats
    st = trace_stats(load_trace(f))
    assert 0.5 < st.copy_fraction <= 1.0  # the output copies the prompt: most positions are predicted


def test_cli_convert_skip_bad_prints_count(tmp_path):
    bad = tmp_path / "m.jsonl"
    bad.write_text('{"timestamp": 1, "input_length": 2, "output_length": 3}\n{oops\n')
    p = _run("convert", "--from", "mooncake", bad, "-o", tmp_path / "o.jsonl", "--skip-bad", tmp_path=tmp_path)
    assert p.returncode == 0 and "skipped 1 bad rows" in p.stdout
    p = _run("convert", "--from", "mooncake", bad, "-o", tmp_path / "o.jsonl", "--force", tmp_path=tmp_path)
    _one_line_error(p, f"{bad}:2", "not valid JSON")


def test_cli_stats_skip_bad_prints_count(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"id": "a", "prompt_len": 3, "output_len": 2}\n{"id": "b", "prompt_len": 3, "output_len": -2}\n')
    p = _run("stats", f, "--skip-bad", tmp_path=tmp_path)
    assert p.returncode == 0 and "skipped 1 bad lines" in p.stdout
    _one_line_error(_run("stats", f, tmp_path=tmp_path), f"{f}:2", "field 'output_len'")


@pytest.mark.parametrize("args,needles", [
    (["convert", "--from", "parquet", "x", "-o", "y"], ["unknown format 'parquet'", "sharegpt, vllm-custom, azure, burstgpt, mooncake"]),
    (["convert", "--from", "azure", "missing.csv", "-o", "y"], ["file not found"]),
    (["stats", "missing.jsonl"], ["missing.jsonl", "file not found"]),
    (["build", "poetry"], ["unknown trace 'poetry'"]),
    (["frobnicate"], ["invalid choice"]),
])
def test_cli_errors_are_one_line(tmp_path, args, needles):
    _one_line_error(_run(*args, tmp_path=tmp_path), *needles)


def test_cli_bad_trace_line(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"id": "a", "prompt": "x", "output": "y"}\n{"id": "b", "prompt": "x", "output": ""}\n')
    _one_line_error(_run("stats", f, tmp_path=tmp_path), f"{f}:2: field 'output'", "empty output")


def test_cli_build_chat_small_is_deterministic(tmp_path):
    for d in ("a", "b"):
        p = _run("build", "chat", "--limit", "5", "--out-dir", tmp_path / d, tmp_path=tmp_path)
        assert p.returncode == 0, p.stderr
        assert "chat: 5 requests" in p.stdout
    assert (tmp_path / "a" / "chat.jsonl").read_bytes() == (tmp_path / "b" / "chat.jsonl").read_bytes()


def test_bundled_traces_load():
    for name, n_min in (("codeedit", 300), ("chat", 500), ("general", 2000)):
        tr = load_trace(ROOT / "traces" / f"{name}.jsonl")
        assert len(tr.requests) >= n_min and not tr.length_only
        assert {r.workload for r in tr.requests} == {name}
