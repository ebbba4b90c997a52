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

from sim.api.sweep import cell_id, code_fingerprint, expand

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
    r = run_cli_inprocess("sim.api.sweep", *args)
    assert r.returncode == 0, r.stderr
    first = pd.read_csv(out / "results.csv").set_index("policy")["output_throughput_tok_s"]
    raw = json.loads(table.read_text())
    v = raw["verify"]
    v["ms"] = [[x * 2 for x in row] if isinstance(row, list) else row * 2 for row in v["ms"]]
    table.write_text(json.dumps(raw))
    r = run_cli_inprocess("sim.api.sweep", *args)
    assert r.returncode == 0, r.stderr
    assert "0 cached" in r.stderr
    second = pd.read_csv(out / "results.csv").set_index("policy")["output_throughput_tok_s"]
    assert (second < first).all()


# ------------------------------------------------------------------------------------- draft-table cache
def test_tables_copied_under_another_key_are_refused_and_rebuilt(tmp_path, monkeypatch):
    """Another seed's tables (and another request count's) planted under this key: a warning, a rebuild,
    and exactly the fresh tables are served."""
    import numpy as np
    from conftest import plausible_calibrator, random_requests

    from sim.core.drafters import cache
    from sim.core.drafters.model import ModelDrafterProfile
    from sim.core.drafters.ngram import NgramConfig
    from sim.core.drafters.tables import build_draft_tables

    monkeypatch.setenv("HYBRIDSPEC_CACHE_DIR", str(tmp_path))
    cfg, prof = NgramConfig(n_min=1, n_max=3, k=6, ext_max=16), ModelDrafterProfile(name="t", block=4)
    cal = plausible_calibrator(cfg)
    reqs = random_requests(np.random.default_rng(0), 6)
    for other_reqs, other_seed in ((reqs, 5), (random_requests(np.random.default_rng(1), 9), 0)):
        for f in (tmp_path / "draft-tables").glob("*.npz"):
            f.unlink()
        cache.cached_draft_tables(other_reqs, cfg, prof, cal, seed=other_seed)
        (src,) = (tmp_path / "draft-tables").glob("*.npz")
        key = cache.table_key(reqs, cfg, prof, cal, 0, None)
        src.rename(src.with_name(f"{key}.npz"))
        with pytest.warns(RuntimeWarning, match="other inputs"):
            got = cache.cached_draft_tables(reqs, cfg, prof, cal, seed=0)
        want = build_draft_tables(reqs, cfg, prof, cal, seed=0)
        for name in ("out_len", "offsets", "ng_len", "m_conf"):
            assert np.array_equal(getattr(got, name), getattr(want, name)), name


def test_token_cache_under_another_key_is_not_served(tmp_path, monkeypatch):
    from sim.core.trace.loader import load_trace

    monkeypatch.setenv("HYBRIDSPEC_CACHE_DIR", str(tmp_path / "c"))
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"id": "x", "prompt": "hello there", "output": "general kenobi"}\n')
    b.write_text('{"id": "x", "prompt": "something else", "output": "entirely, and longer"}\n')
    want_a = load_trace(str(a)).requests[0].prompt_ids.tolist()
    (fa,) = (tmp_path / "c" / "tokens").glob("*.npz")
    load_trace(str(b))
    fb = next(f for f in (tmp_path / "c" / "tokens").glob("*.npz") if f != fa)
    fb.replace(fa)  # b's ids planted under a's key
    assert load_trace(str(a)).requests[0].prompt_ids.tolist() == want_a


# ------------------------------------------------------------------------------------- one cache setting
def test_xdg_cache_home_governs_every_cache(tmp_path, monkeypatch):
    from real.drafter.data import data_dir
    from real.engine.weights import cache_dir as weights_cache
    from sim.core.drafters.cache import cache_dir as tables_cache
    from sim.core.trace.tokenizer import token_cache_path

    monkeypatch.delenv("HYBRIDSPEC_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root = tmp_path / "xdg" / "hybridspec"
    assert tables_cache() == root and weights_cache() == root and data_dir() == root / "drafter_data"
    assert token_cache_path(b"abc").parent == root / "tokens"


def test_cache_off_means_off_for_every_cache(tmp_path, monkeypatch):
    from real.engine.weights import cache_dir as weights_cache
    from sim.core.drafters.cache import cache_dir as tables_cache
    from sim.core.trace.tokenizer import token_cache_path

    monkeypatch.setenv("HYBRIDSPEC_CACHE_DIR", "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    assert tables_cache() is None and weights_cache() is None and token_cache_path(b"abc") is None
    t = tmp_path / "t.jsonl"
    t.write_text('{"id": "x", "prompt": "hello there", "output": "general kenobi"}\n')
    r = run_cli_inprocess("sim.api.run", "--trace", t, "--policy", "hybrid-price", "--batch-size", "2", "--no-progress",
                          cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"], "a cache was written despite off"
