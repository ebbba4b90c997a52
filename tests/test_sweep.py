"""python -m sim.sweep: the results table, resume from the cell cache, failing cells, bad names, grids."""
from pathlib import Path

import pandas as pd
import pytest
from conftest import run_cli_inprocess

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl")


def sweep(*args, cwd=ROOT):
    return run_cli_inprocess("sim.api.sweep", *args, "--no-progress", cwd=cwd)


SUMMARY_KEYS = {"requests", "output_tokens", "sim_time_s", "output_throughput_tok_s", "mean_tokens_per_step",
                "acceptance_rate", "ngram_share_verified", "ngram_share_accepted", "share_verify", "share_draft",
                "mean_step_ms", "lossless", "speedup_vs_baseline"}


def test_schema_and_resume(tmp_path):
    out = tmp_path / "sw"
    args = ["--trace", TINY, "--policy", "hybrid-price", "--policy", "oracle", "--batch-size", "2", "--batch-size", "8",
            "--ngram-k", "8", "--ngram-k", "16", "--out", str(out), "--workers", "2"]
    r = sweep(*args)
    assert r.returncode == 0, r.stderr
    assert "12 cells run (0 cached, 0 failed)" in r.stderr  # adaptive added as the baseline
    for name in ("results.parquet", "results.csv", "requests.parquet", "requests.csv", "grid.json"):
        assert (out / name).stat().st_size > 0
    df = pd.read_parquet(out / "results.parquet")
    from sim.api.sweep import GRID_KEYS

    assert list(df.columns[:len(GRID_KEYS) + 3]) == list(GRID_KEYS) + ["status", "error", "cell_id"]
    assert SUMMARY_KEYS <= set(df.columns)
    assert len(df) == 12 and (df["status"] == "ok").all() and df["lossless"].all()
    assert set(df["policy"]) == {"adaptive", "hybrid-price", "oracle"}
    assert set(df["ngram_k"]) == {8, 16} and set(df["batch_size"]) == {2, 8}
    assert (df.loc[df["policy"] == "adaptive", "speedup_vs_baseline"] == 1.0).all()
    csv = pd.read_csv(out / "results.csv")
    assert list(csv.columns) == list(df.columns) and len(csv) == 12
    req = pd.read_parquet(out / "requests.parquet")
    assert set(req["cell_id"]) == set(df["cell_id"]) and len(req) == 12 * 12

    cells = sorted((out / "cells").glob("*.json"))
    assert len(cells) == 12
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in cells}
    gone = cells[:3]
    for p in gone:  # as if the sweep had been interrupted before these finished
        p.unlink()
    r = sweep(*args)
    assert r.returncode == 0, r.stderr
    assert "3 cells run (9 cached, 0 failed)" in r.stderr
    after = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (out / "cells").glob("*.json")}
    assert set(after) == set(before)
    for name, v in before.items():
        if name not in {p.name for p in gone}:
            assert after[name] == v  # untouched: not recomputed
    df2 = pd.read_parquet(out / "results.parquet")
    cols = ["cell_id", "output_throughput_tok_s", "sim_time_s"]
    pd.testing.assert_frame_equal(df[cols].sort_values("cell_id").reset_index(drop=True),
                                  df2[cols].sort_values("cell_id").reset_index(drop=True))

    # a partial, tampered or foreign cell file is recomputed with a warning, never served
    import json

    cells = sorted((out / "cells").glob("*.json"))
    cells[0].write_text("{}")
    tampered = json.loads(cells[1].read_text())
    tampered["row"]["output_throughput_tok_s"] *= 2  # an edited number: the checksum no longer matches
    cells[1].write_text(json.dumps(tampered))
    cells[2].write_text(cells[2].read_text()[:100])  # cut mid-file
    r = sweep(*args)
    assert r.returncode == 0, r.stderr
    assert "3 cells run (9 cached, 0 failed)" in r.stderr
    assert r.stderr.count("recomputing the cell") == 3 and "checksum mismatch" in r.stderr
    df3 = pd.read_parquet(out / "results.parquet")
    pd.testing.assert_frame_equal(df[cols].sort_values("cell_id").reset_index(drop=True),
                                  df3[cols].sort_values("cell_id").reset_index(drop=True))


def test_a_kv_cache_too_small_for_a_request_is_refused_before_any_cell(tmp_path):
    out = tmp_path / "sw"
    r = sweep("--trace", TINY, "--policy", "adaptive", "--batch-size", "4", "--kv-capacity-tokens", "10",
              "--kv-capacity-tokens", "100000", "--out", str(out), "--workers", "1")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--kv-capacity-tokens 10" in r.stderr, r.stderr
    assert not (out / "cells").exists()


def test_failing_cell_recorded_others_finish(tmp_path):
    # text requests: the sweep's up-front check counts a text field as one token (it does not tokenize), so a
    # cache of 48 tokens passes it and fails in the cell, once the prompts are tokenized
    text = str(ROOT / "tests" / "fixtures" / "trace" / "text.jsonl")
    out = tmp_path / "sw"
    r = sweep("--trace", text, "--policy", "adaptive", "--policy", "oracle", "--batch-size", "4",
              "--kv-capacity-tokens", "48", "--kv-capacity-tokens", "100000", "--out", str(out), "--workers", "2")
    assert r.returncode == 0, r.stderr
    assert "2 of 4 cells failed" in r.stderr and "Traceback" not in r.stderr
    df = pd.read_csv(out / "results.csv")
    bad, good = df[df["kv_capacity_tokens"] == 48], df[df["kv_capacity_tokens"] == 100000]
    assert (bad["status"] == "error").all() and bad["error"].str.contains("KV tokens").all()
    assert bad["output_throughput_tok_s"].isna().all()
    assert (good["status"] == "ok").all() and (good["output_throughput_tok_s"] > 0).all()
    assert len(list((out / "cells").glob("*.json"))) == 2  # failures are not cached: a rerun retries them


@pytest.mark.parametrize("args,needle", [
    (["--policy", "bogus"], "unknown policy 'bogus'"),
    (["--model", "gpt-9"], "gpt-9"),
    (["--gpu", "tpu"], "tpu"),
    (["--drafter", "nope"], "unknown drafter profile"),
    (["--batch-size", "0"], "batch-size"),
    (["--trace", "no/such.jsonl"], "no/such.jsonl"),
    (["--workers", "0"], "workers"),
])
def test_bad_names_one_line(tmp_path, capsys, args, needle):
    from sim.infra.cli import run_cli
    from sim.api.sweep import main

    base = ["--trace", TINY] if "--trace" not in args else []
    with pytest.raises(SystemExit) as exc:
        run_cli(main, [*base, *args, "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert "Traceback" not in err and needle in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o" / "cells").exists()  # checked before any work


def test_toml_grid_and_subgrids(tmp_path):
    from sim.api.sweep import expand, grid_from_args, load_grid, parse_args

    g = tmp_path / "g.toml"
    g.write_text(f'trace = "{TINY}"\nbatch_size = [2, 4]\npolicy = ["hybrid-price"]\n'
                 '[[grid]]\nngram_k = [8, 16]\n[[grid]]\ntemperature = 0.5\nmodel = "qwen3-4b"\n')
    cells = expand(load_grid(g))
    # sub-grid 1: 2 ngram_k x 2 bs x 2 policies (adaptive added); sub-grid 2: 2 bs x 2 policies
    assert len(cells) == 12
    assert {c.model for c in cells} == {"qwen3-8b", "qwen3-4b"}
    assert {c.temperature for c in cells if c.model == "qwen3-4b"} == {0.5}
    # flags override the file (and its sub-grids)
    cells = expand(grid_from_args(parse_args(["--grid", str(g), "--ngram-k", "32", "--batch-size", "1"])))
    assert {c.ngram_k for c in cells} == {32} and {c.batch_size for c in cells} == {1}
    r = sweep("--grid", str(g), "--dry-run")
    assert r.returncode == 0 and "12 cells" in r.stdout
    g.write_text("bogus_key = 1\n")
    r = sweep("--grid", str(g), "--dry-run")
    assert r.returncode == 2 and "unknown grid key 'bogus_key'" in r.stderr


def test_paper_preset_grid():
    from sim.api.sweep import PRESETS, expand

    from sim.core.config import DEFAULT_DRAFTERS, WITH_SUFFIX

    cells = expand(PRESETS["paper"])
    # codeedit, codeedit-model, chat; suffix and vLLM main's suffix-adaptive apart with their drafter, with that
    # setup's baseline
    assert len(cells) == (17 + 3) * 9 * 3
    assert {"hybrid", "hybrid-price", "oracle", "ngram-fixed:32", "none", "vllm-ngram:32", "suffix",
            "hybrid-vllm:slots=32", "hybrid-vllm:slots=32:runcal=64"} <= {c.policy for c in cells}  # every tier
    # the verdict (sim.run's defaults) and the paper weigh the same plugin settings, so what the main job prints is
    # the paper's "What to serve" (README's copy-heavy rows)
    from sim.core.config import DEFAULT_POLICIES
    from sim.core.deploy import tier
    from sim.core.policies.catalog import get_policy

    assert set(DEFAULT_POLICIES) <= {c.policy for c in cells}
    plugin = {c.policy for c in cells if tier(get_policy(c.policy, c.drafters)) == "plugin"}
    assert len(plugin) == 6 and plugin <= set(DEFAULT_POLICIES)
    from sim.api.plugin_menu import PLUGIN

    assert plugin <= set(PLUGIN)  # and on reports/plugin-menu.md
    apart = {"suffix", "suffix-adaptive", "adaptive"}
    assert {c.policy for c in cells if c.drafters == WITH_SUFFIX} == apart
    assert all(c.drafters == DEFAULT_DRAFTERS for c in cells if c.policy not in apart)
    assert {c.batch_size for c in cells} == {1, 2, 4, 8, 16, 32, 64, 128, 256}


def test_prepare_once_per_key(tmp_path, monkeypatch):
    import sim.api.run
    import sim.api.sweep as sw

    calls = []
    real = sim.api.run.prepare

    def counting(setup, *a, **k):
        calls.append(setup.ngram_k)
        return real(setup, *a, **k)

    monkeypatch.setattr(sim.api.run, "prepare", counting)
    sw._PREP_CACHE.clear()
    cells = sw.expand({"trace": TINY, "policy": ["adaptive", "oracle"], "batch_size": [2, 4], "ngram_k": [8, 16]})
    df = sw.run_sweep(cells, tmp_path / "sw", workers=1, progress=False)
    assert len(df) == 8 and (df["status"] == "ok").all()
    assert sorted(calls) == [8, 16]  # the draft tables of a key are built once for its 4 cells


def test_ray_missing_one_line(tmp_path):
    try:
        import ray  # noqa: F401
        pytest.skip("ray is installed (see test_ray_local)")
    except ImportError:
        pass
    r = sweep("--trace", TINY, "--ray", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "pip install" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # starting a local Ray instance takes 10 s to minutes on a small machine
def test_ray_local(tmp_path):
    pytest.importorskip("ray")
    r = sweep("--trace", TINY, "--policy", "oracle", "--batch-size", "4", "--ray", "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(tmp_path / "o" / "results.csv")
    assert len(df) == 2 and (df["status"] == "ok").all()


def test_lossy_cell_is_an_error(monkeypatch):
    """A cell whose run fails the lossless check is recorded as an error, never as a result."""
    from sim.engine.engine import Engine
    from sim.api.sweep import expand, run_cell

    monkeypatch.setattr(Engine, "check_lossless", lambda self: "request 0 output position 3: planted")
    cell = expand({"trace": TINY, "policy": "adaptive", "batch_size": 2}, add_baseline=False)[0]
    res = run_cell(cell)
    assert res["status"] == "error" and "LosslessError" in res["error"] and "planted" in res["error"]


def test_sample_grid_key():
    from sim.infra.errors import ConfigError
    from sim.api.sweep import GRID_KEYS, expand, validate

    assert "sample" in GRID_KEYS
    cells = expand({"trace": TINY, "policy": "adaptive", "batch_size": 2, "sample": [3, "none"]}, add_baseline=False)
    assert sorted(c.sample or 0 for c in cells) == [0, 3] and all(c.limit is None for c in cells)
    assert {c.setup().sample for c in cells} == {3, None}
    assert len({c.prep_key() for c in cells}) == 2  # a different sample is a different set of draft tables
    validate(cells)
    with pytest.raises(ConfigError, match="not both"):
        validate(expand({"trace": TINY, "policy": "adaptive", "batch_size": 2, "sample": 3, "limit": 3}))
    with pytest.raises(ConfigError, match="--sample must be >= 1"):
        validate(expand({"trace": TINY, "policy": "adaptive", "batch_size": 2, "sample": 0}))


def test_a_sweep_stopped_before_any_cell_finished_writes_no_table(tmp_path, monkeypatch, capsys):
    """An interrupt before the first cell finishes leaves no results table (not one without columns, which a
    reader cannot parse); the rerun writes them whole."""
    import sim.api.sweep as sw

    cells = sw.expand({"trace": [TINY], "policy": ["adaptive"], "batch_size": [2]})

    def interrupted(todo, workers, on_done):
        raise KeyboardInterrupt

    monkeypatch.setattr(sw, "_run_local", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sw.run_sweep(cells, tmp_path / "sw", workers=1, progress=False)
    assert not (tmp_path / "sw" / "results.csv").exists() and not (tmp_path / "sw" / "grid.json").exists()
    assert "wrote no table: no cell finished" in capsys.readouterr().err
    monkeypatch.undo()
    df = sw.run_sweep(cells, tmp_path / "sw", workers=1, progress=False)
    assert len(pd.read_csv(tmp_path / "sw" / "results.csv")) == len(df) == 1
