"""SmolLM2 as a Hugging Face directory (real/validation/vllm_cpu/checkpoints.py) against the project's torch engine, and the
DSpark export's checks. Marked vllm_cpu: run in the [vllm-cpu] environment (transformers comes with vLLM):
    python -m pytest -m vllm_cpu tests/test_vllm_cpu_checkpoints.py
The SmolLM2 directory is written into a temporary folder (about 50 s), or taken from $HYBRIDSPEC_SMOLLM2_HF."""
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.vllm_cpu
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    from real.validation.vllm_cpu.checkpoints import write_smollm2

    given = os.environ.get("HYBRIDSPEC_SMOLLM2_HF")
    if given:
        return Path(given)
    from sim.core.trace.gguf import find_smollm2_gguf
    from sim.infra.errors import ConfigError

    try:  # the one missing dependency that skips: the SmolLM2 GGUF (its package, or $HYBRIDSPEC_SMOLLM2_GGUF), not here
        find_smollm2_gguf()
    except ConfigError as exc:
        pytest.skip(f"cannot write SmolLM2 here: {exc}")
    return write_smollm2(tmp_path_factory.mktemp("hf") / "smollm2")  # any other failure is a failure, never a skip


def test_greedy_parity_with_the_torch_engine(smollm2):
    """transformers' Llama on the written directory decodes greedily what the project's engine decodes from the
    GGUF (fp32, same weights), token for token."""
    from real.engine.greedy import greedy_generate
    from sim.core.trace.smollm2_tokenizer import SmolTokenizer
    from real.engine.weights import build_model

    tok = SmolTokenizer.from_gguf()
    texts = ["<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
             "<|im_start|>user\nWrite a Python function that adds two numbers.<|im_end|>\n<|im_start|>assistant\n"]
    prompts = [np.asarray(tok.encode(t), dtype=np.int64) for t in texts]
    n = 20
    model, _ = build_model("smollm2-135m-gguf", "cpu", torch.float32, max_slots=len(prompts),
                           max_len=max(len(p) for p in prompts) + n + 1)
    ours = [list(map(int, o)) for o in greedy_generate(model, prompts, [n] * len(prompts), None)]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32)
    for p, want in zip(prompts, ours):
        with torch.no_grad():
            got = hf.generate(torch.as_tensor(p)[None], max_new_tokens=n, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, len(p):].tolist()
        assert got == want


def test_tokenizer_and_chat_template(smollm2):
    from sim.core.trace.smollm2_tokenizer import SmolTokenizer

    hf = transformers.AutoTokenizer.from_pretrained(str(smollm2))
    ours = SmolTokenizer.from_gguf()
    text = "<|im_start|>user\nfix the bug in foo()<|im_end|>\n"
    assert hf.encode(text, add_special_tokens=False) == ours.encode(text)
    chat = hf.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert chat.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nHi<|im_end|>" in chat
    assert hf.eos_token == "<|im_end|>"


def test_dspark_export_checks(tmp_path):
    from real.validation.vllm_cpu.checkpoints import check_pair, write_random_dspark, write_tiny_target
    from sim.infra.errors import ConfigError

    t = write_tiny_target(tmp_path / "t")
    d = write_random_dspark(tmp_path / "d", t, num_speculative_tokens=7)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["block_size"] == 7
    check_pair(t, d, 7)
    for args, msg in (((t, tmp_path / "nope", 7), "not a model directory"), ((t, d, 5), "block_size 7"),
                      ((d, d, 7), "target_layer_ids")):
        with pytest.raises(ConfigError, match=msg):
            check_pair(*args)
