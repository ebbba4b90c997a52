"""Your own model (issue 62, point 5): a target no DSpark checkpoint is published for gets a verdict over what can be
served for it (`none`) and says so in words; the refusal of text without a tokenizer names the bundled stand-in;
a short GPU name resolves to the spec it means through the declared alias table (models/gpu-aliases.json)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli_inprocess

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl"
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
         "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256,
         "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}


def _config(tmp_path: Path) -> Path:
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA))
    return folder / "config.json"


def _run(tmp_path: Path, *args):
    return run_cli_inprocess("sim.api.run", "--workers", "1", "--no-progress", *args, cwd=ROOT,
                             env={"HYBRIDSPEC_CACHE_DIR": str(tmp_path / "cache")})


def test_a_model_without_a_drafter_checkpoint_is_judged_over_none(tmp_path):
    p = _run(tmp_path, "--trace", TINY, "--model", _config(tmp_path), "--batch-size", "4", "--policy", "none",
             "--policy", "vllm-ngram:8", "--policy", "hybrid-vllm:slots=32", "--out", tmp_path / "o")
    assert p.returncode == 0, p.stderr
    v = json.loads((tmp_path / "o" / "verdict.json").read_text())["verdicts"][0]
    rec = v["recommended"]
    assert v["reference"] == "none" and rec["policy"] in ("none", "vllm-ngram:8")  # never adaptive: not servable
    assert rec["serve"] and "dspark" not in rec["serve"] and "my-llama" in rec["serve"]
    rows = {r["policy"]: r for r in json.loads((tmp_path / "o" / "summary.json").read_text())}
    ratio = rows[rec["policy"]]["output_throughput_tok_s"] / rows["none"]["output_throughput_tok_s"]
    assert f"recommended {rec['policy']}, {ratio:.3f}x none," in p.stdout  # the figure is over none, not adaptive
    assert "x adaptive, in vLLM" not in p.stdout
    said = [ln for ln in p.stdout.splitlines() if ln.startswith("  over none")]
    assert len(said) == 1 and "adaptive cannot be served for this model" in said[0] and "dspark" in said[0]
    faster = next(ln for ln in p.stdout.splitlines() if "without vLLM flags" in ln)
    assert faster.count("no published dspark drafter checkpoint") == 1  # one reason, said once for its setups


def test_the_default_target_keeps_its_baseline(tmp_path):
    p = _run(tmp_path, "--trace", TINY, "--batch-size", "4", "--policy", "none", "--policy", "vllm-ngram:8")
    assert p.returncode == 0, p.stderr
    assert "x adaptive, in vLLM" in p.stdout and "  over none" not in p.stdout


def test_text_without_a_tokenizer_is_refused_naming_the_stand_in(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"id": "a", "prompt": "Hello there", "output": "how are you?"}) + "\n")
    p = _run(tmp_path, "--trace", trace, "--model", _config(tmp_path), "--batch-size", "1")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "--tokenizer qwen3" in p.stderr and "stand in" in p.stderr


@pytest.mark.parametrize("short,spec", [("h100", "h100-sxm"), ("H100", "h100-sxm"), ("a100", "a100-80g"),
                                        ("h100-sxm", "h100-sxm")])
def test_a_short_gpu_name_is_the_spec_it_means(short, spec):
    from sim.core.models import get_gpu, gpu_name

    assert gpu_name(short) == spec and get_gpu(short) == get_gpu(spec)


def test_every_alias_names_a_spec_and_no_spec_name_is_an_alias():
    from sim.core.models import get_gpu, gpu_aliases, list_gpus

    table = gpu_aliases()
    assert "h100" in table
    for short, spec in table.items():
        assert spec in list_gpus(), (short, spec)
        get_gpu(short)
    assert not set(table) & set(list_gpus())  # an alias never hides a spec of that name


def test_the_run_reports_the_spec_a_short_name_means(tmp_path):
    p = _run(tmp_path, "--trace", TINY, "--gpu", "h100", "--batch-size", "2", "--policy", "none", "--format", "json")
    assert p.returncode == 0, p.stderr
    assert {r["gpu"] for r in json.loads(p.stdout)} == {"h100-sxm"}
