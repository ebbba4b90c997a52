"""Caches keyed by content: a sweep cell's id hashes every file-valued input and the models folder used;
a draft-table cache file holds its key and is refused (rebuilt, with a warning) under another key; one
cache-folder setting governs every cache and `off` turns them all off."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from conftest import run_cli_inprocess

from sim.sweep import cell_id, code_fingerprint, expand

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl")


def _cell(**kw):
    grid = {"trace": [TINY], "policy": ["hybrid-price"], "batch_size": [2], **{k: [v] for k, v in kw.items()}}
    return [c for c in expand(grid) if c.policy == "hybrid-price"][0]


def test_cell_id_hashes_the_calibrator_file(tmp_path):
    cal = tmp_path / "cal.json"
    shutil.copy(ROOT / "models" / "calibrators" / "ngram-general.json", cal)
    c = _cell(calibrator=str(cal))
    code = code_fingerprint()
    before = cell_id(c, code)
    raw = json.loads(cal.read_text())
    raw["weights"] = [w * 1.5 for w in raw["weights"]]
    cal.write_text(json.dumps(raw))
    assert cell_id(c, code) != before


def test_cell_id_hashes_the_models_dir_in_use(tmp_path, monkeypatch):
    models = tmp_path / "models"
    shutil.copytree(ROOT / "models", models, ignore=shutil.ignore_patterns("*.pt", "*.sha256"))
    monkeypatch.setenv("HYBRIDSPEC_MODELS_DIR", str(models))
    before = code_fingerprint()
    gpu = models / "gpus" / "h100-sxm.json"
    raw = json.loads(gpu.read_text())
    raw["memory_bandwidth_tbps"] = 1.0
    gpu.write_text(json.dumps(raw))
    assert code_fingerprint() != before


def test_a_changed_cost_table_is_never_served_from_the_cell_cache(tmp_path):
    """Doubling every verify time in a --gpu cost table: the sweep recomputes (a lower throughput)."""
    table = tmp_path / "h100.json"
    shutil.copy(ROOT / "models" / "cost_tables" / "h100-sxm_qwen3-8b.json", table)
    out = tmp_path / "sw"
    args = ["--trace", TINY, "--policy", "hybrid-price", "--batch-size", "4", "--cost", "profiled", "--gpu", str(table),
            "--out", str(out), "--workers", "1", "--no-progress"]
    r = run_cli_inprocess("sim.sweep", *args)
    assert r.returncode == 0, r.stderr
    first = pd.read_csv(out / "results.csv").set_index("policy")["output_throughput_tok_s"]
    raw = json.loads(table.read_text())
    v = raw["verify"]
    v["ms"] = [[x * 2 for x in row] if isinstance(row, list) else row * 2 for row in v["ms"]]
    table.write_text(json.dumps(raw))
    r = run_cli_inprocess("sim.sweep", *args)
    assert r.returncode == 0, r.stderr
    assert "0 cached" in r.stderr
    second = pd.read_csv(out / "results.csv").set_index("policy")["output_throughput_tok_s"]
    assert (second < first).all()
