"""The small slips of the crash-and-concurrency probe, each pinned: a full disk's message names the path; a
failed trace build leaves no empty folder; a lossless violation is a simulator bug (exit 1), not an input
error (exit 2); ngram_k's declared range is the one its check enforces."""
from __future__ import annotations

import errno
from pathlib import Path

import pytest
from conftest import run_cli_inprocess

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl")


def test_a_full_disk_names_the_output(tmp_path, monkeypatch):
    import pandas as pd

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")  # as a buffered write reports it: no path

    monkeypatch.setattr(pd.DataFrame, "to_csv", full)
    out = tmp_path / "o"
    r = run_cli_inprocess("sim.api.run", "--trace", TINY, "--policy", "oracle", "--batch-size", "2", "--no-progress",
                          "--workers", "1", "--out", out)
    errs = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2 and errs == [f"error: no space left on device: {out}"], r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing half-written left, not even the lock file


def test_write_whole_on_a_full_disk_names_the_file(tmp_path, monkeypatch):
    from sim.infra.cli import describe_os_error, write_whole

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    write_whole(tmp_path / "x.json", "fine")
    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError) as ei:
        write_whole(tmp_path / "y.json", "data")
    assert describe_os_error(ei.value) == f"no space left on device: {tmp_path / 'y.json'}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_a_failed_trace_build_leaves_no_empty_folder(tmp_path, monkeypatch):
    from sim.core.trace import build_sharegpt

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "new" / "chat.jsonl"))

    monkeypatch.setattr(build_sharegpt, "build_pair", full)
    r = run_cli_inprocess("sim.core.trace", "build", "chat", "--out-dir", tmp_path / "new" / "deeper", "--no-progress")
    assert r.returncode == 2 and "no space left" in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_lossy_run_is_a_bug_exit_1_not_an_input_error(monkeypatch):
    from sim.engine.engine import Engine

    monkeypatch.setattr(Engine, "check_lossless", lambda self: "request 0 output position 3: planted")
    r = run_cli_inprocess("sim.api.run", "--trace", TINY, "--policy", "oracle", "--batch-size", "2", "--no-progress",
                          "--workers", "1")
    assert r.returncode == 1, r.stderr
    assert "bug in hybridspec" in r.stderr and "planted" in r.stderr and "Traceback" not in r.stderr


def test_ngram_k_declared_range_is_the_checked_one():
    from sim.core.config import FIELDS, check
    from sim.core.drafters.ngram import NgramConfig
    from sim.infra.errors import ConfigError

    hi = FIELDS["ngram_k"].metadata["max"]
    NgramConfig(k=int(hi))  # the declared maximum is accepted by the drafter's own check
    with pytest.raises(ConfigError, match="ngram-k"):
        check("ngram_k", int(hi) + 1)


def test_memory_follows_the_trace_not_a_huge_batch_size():
    """A batch size far above the request count: the engine's per-step tables are sized by the requests
    (at most that many run), not by the batch size; the results do not depend on how far above it is."""
    import tracemalloc

    from sim.api.run import SimSetup, prepare, run_one

    prep = prepare(SimSetup(trace=TINY))
    n = len(prep.tables.out_len)
    big, _ = run_one(prep, "hybrid-price", 10**5)
    tracemalloc.start()
    huge, _ = run_one(prep, "hybrid-price", 10**6)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 100e6, f"{peak / 1e6:.0f} MB for {n} requests"
    for k in ("output_throughput_tok_s", "sim_time_s", "mean_tokens_per_step"):
        assert huge[k] == big[k], k


def test_an_unknown_field_in_a_cost_table_is_refused(tmp_path):
    import json

    from sim.core.cost.profiled import load_cost_table
    from sim.infra.errors import ConfigError

    raw = json.loads((ROOT / "models" / "cost_tables" / "h100-sxm_qwen3-8b.json").read_text())
    raw["kv_ms_per_tok"] = 0.001  # a misspelt kv_ms_per_token
    p = tmp_path / "t.json"
    p.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="unknown field 'kv_ms_per_tok'"):
        load_cost_table(p)
