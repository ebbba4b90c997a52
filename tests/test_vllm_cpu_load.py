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
