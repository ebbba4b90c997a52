"""The vLLM-CPU path records the machine's load around each engine process (real/validation/vllm/cells.run_cell), and
serves it back with a cached run; no vLLM needed (the process launch is replaced)."""
import types

import json

import real.validation.vllm.cells as V
import real.validation.vllm.engine as E


def test_run_cell_records_the_load_and_serves_it_cached(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_launch(spec, work, name, env):
        calls.append(name)
        work.mkdir(parents=True, exist_ok=True)
        (work / "run.spec.json").write_text(json.dumps(spec))
        res = {"outputs": [[1, 2]], "steps": 2}
        (work / "run.result.json").write_text(json.dumps(res))
        return res

    monkeypatch.setattr(E, "launch", fake_launch)
    cfg = types.SimpleNamespace(to_json=lambda: {"k": 1}, env=lambda: {})
    sl = types.SimpleNamespace(ids=["a"], prompts=[[1, 2, 3]], max_tokens=[2])
    res = V.run_cell(cfg, sl, "none", 1, tmp_path / "w")
    assert calls == ["run"]
    load = res["load"]
    assert load["wall_s"] >= 0 and "loaded" in load and "others_cores" in load
    again = V.run_cell(cfg, sl, "none", 1, tmp_path / "w")
    assert calls == ["run"] and again["load"] == json.loads(json.dumps(load)) and "cached" in capsys.readouterr().err


def test_a_damaged_or_oversized_cached_cell_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    """The cell cache is read through the input layer (issue 60): a cached result that is not JSON, or a spec file
    past the cache cap, is one ConfigError naming the file, never a JSONDecodeError or a 2 GiB read."""
    import pytest

    from sim.infra import inputs
    from sim.infra.errors import ConfigError

    def fake_launch(spec, work, name, env):
        work.mkdir(parents=True, exist_ok=True)
        (work / "run.spec.json").write_text(json.dumps(spec))
        (work / "run.result.json").write_text(json.dumps({"outputs": [[1]], "steps": 1}))
        return {"outputs": [[1]], "steps": 1}

    monkeypatch.setattr(E, "launch", fake_launch)
    cfg = types.SimpleNamespace(to_json=lambda: {"k": 1}, env=lambda: {})
    sl = types.SimpleNamespace(ids=["a"], prompts=[[1, 2, 3]], max_tokens=[2])
    V.run_cell(cfg, sl, "none", 1, tmp_path / "w")
    (tmp_path / "w" / "run.result.json").write_text("{not json")
    with pytest.raises(ConfigError, match="run.result.json"):
        V.run_cell(cfg, sl, "none", 1, tmp_path / "w")
    monkeypatch.setattr(inputs, "CACHE", inputs.Kind("cache entry", 8))  # a spec past the cap is refused unread
    monkeypatch.setattr(V, "CACHE", inputs.CACHE)
    with pytest.raises(ConfigError, match="run.spec.json"):
        V.run_cell(cfg, sl, "none", 1, tmp_path / "w")
