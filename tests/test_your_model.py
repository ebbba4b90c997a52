"""Bringing your own model, tokenizer, trace and drafter (docs/your-model.md): a model spec by path, a Hugging Face
config.json translated, trace text tokenized for the served model's own tokenizer (offline, cached), token ids of
another tokenizer refused in one line, and the vLLM validation's drafter chosen per target (never another target's)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.infra.errors import ConfigError, TraceError
from tests.conftest import run_cli_inprocess

ROOT = Path(__file__).resolve().parents[1]
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
TINY = str(ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl")
OUTPUT = "Hello there, how are you? def add(a, b): return a + b"
TEXT = [{"id": "a", "prompt": "def add(a, b):\n    return a + b", "output": OUTPUT},
        {"id": "b", "prompt": "Hello there", "output": "how are you? Hello there, how are you?"}]


def _llama_tokenizer(path: Path, vocab_size: int = 400) -> Path:
    """A small byte-level BPE tokenizer.json with Llama 3's special tokens, trained here (no hub, no weights)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|begin_of_text|>", "<|eot_id|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([r["prompt"] + r["output"] for r in TEXT] * 10, trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A local Hugging Face cache holding Llama-3.1-8B-Instruct's tokenizer.json (a stand-in trained here), and a
    token cache of this test's own."""
    pytest.importorskip("tokenizers")
    root = tmp_path / "hub"
    repo = root / ("models--" + LLAMA.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    _llama_tokenizer(repo / "snapshots" / "abc123" / "tokenizer.json")
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HYBRIDSPEC_CACHE_DIR", str(tmp_path / "cache"))
    return repo / "snapshots" / "abc123" / "tokenizer.json"


def _trace(tmp_path: Path, rows: list[dict], name: str = "t.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _run(*args) -> tuple[int, list[dict] | None, str]:
    r = run_cli_inprocess("sim.api.run", "--policy", "adaptive", "--batch-size", "2", "--workers", "1", "--no-progress",
                          "--format", "json", *args)
    return r.returncode, json.loads(r.stdout) if r.returncode == 0 else None, r.stderr


# ------------------------------------------------------------------------------------------- the model spec
def test_a_model_spec_by_path(tmp_path):
    from sim.core.models import get_llm

    spec = json.loads((ROOT / "models" / "llms" / "llama-3.1-8b.json").read_text())
    mine = tmp_path / "my-llama.json"
    mine.write_text(json.dumps(dict(spec, name="my-llama", num_layers=16, num_params=4.54e9)))
    got = get_llm(str(mine))
    assert (got.name, got.num_layers, got.hidden_size) == ("my-llama", 16, 4096)
    assert got.kv_bytes_per_token == get_llm("llama-3.1-8b").kv_bytes_per_token // 2
    code, rows, err = _run("--trace", TINY, "--model", str(mine))
    assert code == 0, err
    assert rows[0]["model"] == str(mine)
    code, rows8, _ = _run("--trace", TINY, "--model", "llama-3.1-8b")
    assert rows[0]["output_throughput_tok_s"] > rows8[0]["output_throughput_tok_s"]  # half the layers: faster steps
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(dict(spec, num_layerz=3)))
    code, _, err = _run("--trace", TINY, "--model", str(bad))
    assert code == 2 and err.count("\n") == 1 and "num_layerz" in err and str(bad) in err
    code, _, err = _run("--trace", TINY, "--model", str(tmp_path / "missing.json"))
    assert code == 2 and err.count("\n") == 1 and "missing.json" in err and "Traceback" not in err


# ------------------------------------------------------------------------------------------- a Hugging Face config
LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
                "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
                "tie_word_embeddings": False, "torch_dtype": "bfloat16", "rope_theta": 500000.0}


def test_a_hugging_face_config_is_translated(tmp_path):
    from sim.core.models import get_llm

    d = tmp_path / "Llama-3.1-8B-Instruct"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    ours, theirs = get_llm("llama-3.1-8b"), get_llm(str(d))
    for f in ("num_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_kv_heads", "head_dim",
              "vocab_size", "tied_embeddings", "dtype_bytes", "max_model_len", "kv_bytes_per_token",
              "weight_bytes_per_step", "flops_per_token"):
        assert getattr(theirs, f) == getattr(ours, f), f
    assert abs(theirs.num_params / ours.num_params - 1) < 0.001  # the widths' count against the card's 8.03B
    assert get_llm(str(d / "config.json")) == theirs and theirs.tokenizer == ""
    code, rows, err = _run("--trace", TINY, "--model", str(d / "config.json"))
    assert code == 0, err
    code, rows8, _ = _run("--trace", TINY, "--model", "llama-3.1-8b")
    assert rows[0]["output_throughput_tok_s"] == pytest.approx(rows8[0]["output_throughput_tok_s"], rel=2e-3)


def test_a_mixture_of_experts_config_is_translated(tmp_path):
    """Qwen-MoE's layout: E experts of width I_e on every layer (decoder_sparse_step 1) but the mlp_only_layers,
    which keep a dense MLP of intermediate_size; the counts by hand (hf_config.py's docstring)."""
    from sim.core.models import get_llm

    h, L, H, KV, d, V, E, k, Ie, I = 64, 4, 4, 2, 16, 1000, 8, 2, 32, 128
    cfg = {"model_type": "qwen3_moe", "hidden_size": h, "num_hidden_layers": L, "num_attention_heads": H,
           "num_key_value_heads": KV, "head_dim": d, "vocab_size": V, "num_experts": E, "num_experts_per_tok": k,
           "moe_intermediate_size": Ie, "intermediate_size": I, "mlp_only_layers": [0], "tie_word_embeddings": True}
    p = tmp_path / "moe.json"
    p.write_text(json.dumps(cfg))
    m = get_llm(str(p))
    attn = h * H * d + 2 * h * KV * d + H * d * h
    experts = 3 * E * 3 * h * Ie  # three routed layers
    total = L * attn + 3 * h * I + 3 * h * E + experts + V * h
    assert (m.num_experts, m.experts_per_token, m.expert_params) == (E, k, experts)
    assert m.num_params == total and m.active_params == total - experts + 3 * k * 3 * h * Ie


@pytest.mark.parametrize("field, value, says", [
    ("kv_lora_rank", 512, "latent attention"),
    ("layer_types", ["sliding_attention", "full_attention"], "attention kind"),
    ("quantization_config", {"quant_method": "awq", "bits": 4}, "awq"),
    ("torch_dtype", "int3", "torch_dtype"),
])
def test_what_a_spec_cannot_describe_is_refused_in_one_line(tmp_path, field, value, says):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(dict(LLAMA_CONFIG, **{field: value})))
    code, _, err = _run("--trace", TINY, "--model", str(p))
    assert code == 2 and err.count("\n") == 1 and field in err and says in err and str(p) in err


def test_a_config_without_a_required_field_names_it(tmp_path):
    from sim.core.models import get_llm

    p = tmp_path / "config.json"
    p.write_text(json.dumps({k: v for k, v in LLAMA_CONFIG.items() if k != "num_attention_heads"}))
    with pytest.raises(ConfigError, match="missing field 'num_attention_heads'"):
        get_llm(str(p))


# ------------------------------------------------------------------------------------------- the model's tokenizer
def test_text_is_tokenized_for_the_served_model_and_cached(tmp_path, hub, monkeypatch):
    from tokenizers import Tokenizer

    from sim.core.trace import tokenizer as T
    from sim.core.trace.loader import load_trace

    t = _trace(tmp_path, TEXT)
    code, rows, err = _run("--trace", t, "--model", "llama-3.1-8b")
    assert code == 0, err
    want = Tokenizer.from_file(str(hub)).encode(OUTPUT, add_special_tokens=False).ids
    notes = [ln for ln in err.splitlines() if ln.startswith("note:") and "made the cache folder" not in ln]
    assert rows[0]["tokenizer"] == LLAMA and not notes, notes  # no stand-in named (the new cache is said, once)
    qwen = T.get_tokenizer("qwen3").count(OUTPUT)
    assert len(want) != qwen  # the two tokenizers disagree, so the count below says which one ran
    first = load_trace(str(t), tokenizer=LLAMA)
    assert first.requests[0].output_ids.tolist() == want
    cached = list((tmp_path / "cache" / "tokens").glob("*.npz"))
    assert len(cached) == 1
    with monkeypatch.context() as m:  # served from the cache: the tokenizer is not asked again
        m.setattr(T, "get_tokenizer", lambda name: pytest.fail(f"re-tokenized with {name}"))
        again = load_trace(str(t), tokenizer=LLAMA)
    assert [r.output_ids.tolist() for r in again.requests] == [r.output_ids.tolist() for r in first.requests]
    # keyed on the tokenizer: Qwen3's ids of the same file are another entry, and a changed tokenizer.json another
    assert len(load_trace(str(t), tokenizer="qwen3").requests[0].output_ids) == qwen
    _llama_tokenizer(hub, vocab_size=290)  # a new download under the same name: never served the old ids
    newer = Tokenizer.from_file(str(hub)).encode(OUTPUT, add_special_tokens=False).ids
    assert newer != want and load_trace(str(t), tokenizer=LLAMA).requests[0].output_ids.tolist() == newer
    assert len(list((tmp_path / "cache" / "tokens").glob("*.npz"))) == 3


def test_a_tokenizer_json_by_path_and_a_model_directory(tmp_path, hub):
    t = _trace(tmp_path, TEXT)
    code, rows, err = _run("--trace", t, "--model", "llama-3.1-8b", "--tokenizer", str(hub))
    assert code == 0, err
    assert rows[0]["tokenizer"] == str(hub) and "in place of" in err
    d = tmp_path / "my-model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    (d / "tokenizer.json").write_bytes(hub.read_bytes())
    code, rows_dir, err = _run("--trace", t, "--model", str(d))
    assert code == 0, err
    assert rows_dir[0]["tokenizer"] == str(d / "tokenizer.json")
    assert rows_dir[0]["output_tokens"] == rows[0]["output_tokens"]


def test_a_missing_tokenizer_is_one_line_saying_what_to_provide(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    t = _trace(tmp_path, TEXT)
    code, _, err = _run("--trace", t, "--model", "llama-3.1-8b")
    assert code == 2 and err.count("\n") == 1
    assert str(t) in err and f"hf download {LLAMA} tokenizer.json" in err and "Traceback" not in err
    code, _, err = _run("--trace", t, "--model", "qwen3-tiny")  # a test architecture: its spec names no tokenizer
    assert code == 2 and err.count("\n") == 1 and "names none" in err
    code, _, err = _run("--trace", t, "--tokenizer", str(tmp_path / "nope.json"))
    assert code == 2 and err.count("\n") == 1 and "nope.json" in err


# ------------------------------------------------------------------------------------------- token ids of another
def test_qwen_token_ids_with_a_llama_model_are_refused_in_one_line(tmp_path):
    from sim.core.trace.tokenizer import get_tokenizer

    q = get_tokenizer("qwen3")
    rows = [{"id": r["id"], "prompt_ids": q.encode("<|im_start|>user\n" + r["prompt"]), "output_ids": q.encode(r["output"])}
            for r in TEXT]
    unmarked = _trace(tmp_path, rows, "unmarked.jsonl")  # ChatML's <|im_start|> = 151644: past Llama's 128256
    code, _, err = _run("--trace", unmarked, "--model", "llama-3.1-8b")
    assert code == 2 and err.count("\n") == 1 and "unmarked.jsonl:1" in err and "128256" in err and "prompt_ids" in err
    marked = _trace(tmp_path, [dict(r, prompt_ids=r["prompt_ids"][1:], tokenizer="qwen3") for r in rows], "marked.jsonl")
    code, _, err = _run("--trace", marked, "--model", "llama-3.1-8b")
    assert code == 2 and err.count("\n") == 1 and "marked.jsonl:1" in err and "qwen3" in err and LLAMA in err
    for p in (unmarked, marked):  # the model they were recorded for takes them
        code, out, err = _run("--trace", p, "--model", "qwen3-8b")
        assert code == 0, err


def test_a_trace_with_text_is_re_tokenized_not_refused(tmp_path, hub):
    t = _trace(tmp_path, TEXT)
    for model in ("qwen3-8b", "llama-3.1-8b"):
        code, rows, err = _run("--trace", t, "--model", model)
        assert code == 0, err
    from sim.core.trace.loader import load_trace

    with pytest.raises(TraceError, match="recorded with the qwen3 tokenizer"):
        load_trace(str(_trace(tmp_path, [{"id": "x", "prompt_ids": [1, 2], "output_ids": [3], "tokenizer": "qwen3"}],
                              "ids.jsonl")), tokenizer=LLAMA, vocab_size=128256)


# ------------------------------------------------------------------------------------------- the vLLM validation
def _validate(*args) -> tuple[int, str, str]:
    r = run_cli_inprocess("real.validation.validate", "--engine", "vllm", "--vllm-device", "cuda", "--dry-run", *args)
    return r.returncode, r.stdout, r.stderr


def test_validate_llama_dry_run_the_exact_command_exits_cleanly():
    r = subprocess.run([sys.executable, "-m", "real.validate", "--engine", "vllm", "--vllm-model", LLAMA, "--dry-run"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 2) and "Traceback" not in r.stderr, r.stderr
    if r.returncode == 2:
        assert r.stderr.count("\n") == 1 and "--vllm-drafter" in r.stderr


def test_validate_refuses_a_target_without_a_drafter_and_plans_one_with():
    code, _, err = _validate("--vllm-model", LLAMA)
    assert code == 2 and err.count("\n") == 1 and "no DSpark drafter" in err and "--vllm-drafter" in err
    assert "python -m sim.run --model llama-3.1-8b --policy vllm-ngram:7" in err


def test_validate_plans_llama_with_its_own_drafter_and_tokenizer(hub):
    code, plan, err = _validate("--vllm-model", LLAMA, "--vllm-drafter", "me/dspark-llama3.1-8b", "--quick")
    assert code == 0, err
    assert f"target {LLAMA} (simulator: --model llama-3.1-8b), drafter me/dspark-llama3.1-8b" in plan
    assert '"model":"me/dspark-llama3.1-8b"' in plan and "dspark_qwen3" not in plan


def test_qwen3_14b_never_gets_the_8b_drafter():
    code, _, err = _validate("--vllm-model", "Qwen/Qwen3-14B")
    assert code == 2 and err.count("\n") == 1 and "no DSpark drafter" in err and "qwen3-14b" in err
    code, _, err = _validate("--vllm-model", "Qwen/Qwen3-14B", "--vllm-drafter", "deepseek-ai/dspark_qwen3_8b_block7")
    assert code == 2 and err.count("\n") == 1 and "checkpoint of qwen3-8b" in err
    code, plan, err = _validate("--vllm-model", "Qwen/Qwen3-8B", "--quick")  # the table's pair still plans
    assert code == 0, err
    assert "drafter deepseek-ai/dspark_qwen3_8b_block7" in plan


def test_the_drafter_table_is_keyed_by_target():
    from real.validation.vllm.config import DSPARK_DRAFTERS, VllmRunConfig, default_drafter

    assert VllmRunConfig().drafter == DSPARK_DRAFTERS["qwen3-8b"] == default_drafter("Qwen/Qwen3-8B")
    assert default_drafter("qwen/qwen3-8b") == DSPARK_DRAFTERS["qwen3-8b"]  # hub ids are case-insensitive
    for target in ("Qwen/Qwen3-14B", "Qwen/Qwen3-4B", LLAMA):
        cfg = VllmRunConfig(model=target)
        assert cfg.drafter == "" and cfg.engine_kwargs("none", 2)["model"] == target  # `none` drafts nothing
        with pytest.raises(ConfigError, match="--vllm-drafter"):
            cfg.engine_kwargs("adaptive", 2)


def test_a_mistral_style_sliding_window_is_refused_and_qwens_switched_off_one_is_not(tmp_path):
    import json

    from sim.core.models import get_llm
    from sim.infra.errors import ConfigError

    base = {"model_type": "x", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100, "torch_dtype": "bfloat16"}
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(dict(base, sliding_window=4096)))
    with pytest.raises(ConfigError, match="field 'sliding_window'"):
        get_llm(str(tmp_path / "m" / "config.json"))
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "config.json").write_text(json.dumps(dict(base, sliding_window=4096, use_sliding_window=False)))
    assert get_llm(str(tmp_path / "q" / "config.json")).num_layers == 2
