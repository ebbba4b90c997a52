"""The one input layer: every data file a command reads (a recorded run's JSON, a cost table, a checkpoint's
config.json, a table of steps, anchors) is opened and checked here, so that a hostile file fails the same way
wherever it is given: one ConfigError naming the file, and the field where there is one; never a hang, a
traceback, or memory filled by a file that never ends.

    data = read_json(path, RECORD, FIDELITY_SCHEMA)     # bytes -> strict JSON -> schema, or one ConfigError

Opening (`read_bytes`): the path is stat'ed after following links and must be a regular file (a FIFO would block
a reader forever, /dev/zero or a link to it never ends, a socket cannot be read as data); it is then opened
with O_NONBLOCK, so that a file swapped for a FIFO between the check and the open still cannot block, checked
again on the open descriptor, and read to at most its kind's cap (`Kind`: a name and a size in bytes, both named
in the refusal; HYBRIDSPEC_MAX_INPUT_MB raises every cap). Text is UTF-8, strictly.
Parsing (`parse_json`): strict JSON. NaN, Infinity and numbers past the largest double (1e400) are refused unless
the caller allows them (a recorded run writes NaN for a figure it has no data for; its schema then says which
fields must be finite); an integer of thousands of digits, nesting deeper than Python's recursion limit and lone
surrogates are refused too.
Checking (`Spec` and its kinds Int, Num, Str, Bool, Maybe, Opt, List, Dict, Obj, Any): a small declarative
schema, field -> type and range. A failure names the file, the field's path (cells[3].real.tok_per_s) and what
was expected: "expected a finite number >= 0, got NaN". Integer bounds are printed as integers.
"""
from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any as _AnyType

from sim.infra.errors import ConfigError

MiB = 2**20
CAP_ENV = "HYBRIDSPEC_MAX_INPUT_MB"  # raises (or lowers) every kind's cap, in MiB


@dataclass(frozen=True)
class Kind:
    """What is read, for the messages (`name`), and the most bytes it may hold (`cap`)."""

    name: str
    cap: int

    def limit(self) -> int:
        mib = env_size(CAP_ENV, "MiB")
        return self.cap if mib is None else max(1, int(mib * MiB))


def env_size(name: str, unit: str) -> float | None:
    """The size the environment variable `name` sets, in `unit`s: None when unset or empty, else a finite number
    > 0 (ConfigError otherwise: nan, inf, -1, 0 or a word would switch a limit off or make it absurd)."""
    env = os.environ.get(name)
    if env is None or not env.strip():
        return None
    try:
        v = float(env)
    except ValueError:
        v = float("nan")
    if not (math.isfinite(v) and v > 0) or v > 2**50:
        raise ConfigError(f"{name}={env!r}: not a valid size; expected a finite number of {unit} > 0")
    return v


CONFIG = Kind("config file", 4 * MiB)             # settings, a checkpoint's config.json, anchors, a grid
# parsed whole, so a file costs several times its size in memory: the caps keep a case under 1 GB
RECORD = Kind("recorded run file", 64 * MiB)     # fidelity.json, a cost table, a cell's record (real ones: < 1 MiB)
TABLE = Kind("table of steps", 128 * MiB)        # a CSV of recorded steps (real ones: a few MiB)
WEIGHTS = Kind("weights file", 8192 * MiB)       # a drafter checkpoint (read whole by torch.load)
TOKENIZER = Kind("tokenizer file", 256 * MiB)     # a tokenizer.json (real ones: 2-35 MiB), parsed whole by tokenizers
CACHE = Kind("cache entry", 64 * MiB)            # a command's own cache file: a sweep or validate cell, a label shard
REQUEST = Kind("request file", 16 * MiB)          # the vLLM plugin's per-run request file
SIDECAR = Kind("checksum file", 4096)             # a `.sha256` beside a file: one digest and a name
REF = Kind("Hugging Face cache ref", 1024)        # a hub cache's refs/main: one commit id


def _size(n: float) -> str:
    return f"{n / MiB:.0f} MiB" if n >= MiB else f"{int(n)} bytes"


def _what_it_is(mode: int) -> str | None:
    """How a non-regular file is named in a refusal; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _label(path: Path, what: str | None) -> str:
    return f"{what} {path}" if what else str(path)


def check_regular(path: str | os.PathLike, what: str | None = None) -> os.stat_result:
    """`path`, links followed, is an existing regular file; ConfigError naming `what` (e.g. "--drafter") and
    what the path is otherwise (missing, a folder, a pipe, a device, unreadable). Opens nothing."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise ConfigError(f"{_label(p, what)}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{_label(p, what)}: {(exc.strerror or type(exc).__name__).lower()}") from None
    kind = _what_it_is(st.st_mode)
    if kind is not None:
        raise ConfigError(f"{_label(p, what)}: {kind}, not a regular file; give a file")
    return st


def is_input(path: str | os.PathLike) -> bool:
    """Whether `path` names something on disk (a file, or a pipe or device that read_* will refuse in one line):
    for arguments that are a file or else a name, so that `<(cat x)` is refused as a pipe, not looked up as a name."""
    try:
        os.stat(path)
        return True
    except (OSError, ValueError):
        return False


def read_bytes(path: str | os.PathLike, kind: Kind = CONFIG, what: str | None = None) -> bytes:
    """The bytes of a regular file, at most kind's cap (module docstring); ConfigError otherwise."""
    p = Path(path)
    check_regular(p, what)
    cap = kind.limit()
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(p, flags)
    except OSError as exc:
        raise ConfigError(f"{_label(p, what)}: {(exc.strerror or type(exc).__name__).lower()}") from None
    try:
        st = os.fstat(fd)
        swapped = _what_it_is(st.st_mode)
        if swapped is not None:  # replaced between the check and the open
            raise ConfigError(f"{_label(p, what)}: {swapped}, not a regular file; give a file")
        if st.st_size > cap:
            raise ConfigError(f"{_label(p, what)}: {_size(st.st_size)} is over the {_size(cap)} a {kind.name} may "
                              f"hold (set {CAP_ENV} to raise it)")
        chunks, got = [], 0
        while got <= cap:  # st_size may lie (a growing file, /proc): read to the cap and one byte past it
            b = os.read(fd, min(cap + 1 - got, 16 * MiB))
            if not b:
                break
            chunks.append(b)
            got += len(b)
    except BlockingIOError:
        raise ConfigError(f"{_label(p, what)}: cannot be read without blocking; give a regular file") from None
    except OSError as exc:
        raise ConfigError(f"{_label(p, what)}: {(exc.strerror or type(exc).__name__).lower()}") from None
    finally:
        os.close(fd)
    if got > cap:
        raise ConfigError(f"{_label(p, what)}: more than the {_size(cap)} a {kind.name} may hold (set {CAP_ENV} to "
                          "raise it)")
    return b"".join(chunks)


def iter_lines(path: str | os.PathLike, kind: Kind = REQUEST, what: str | None = None, limit: int | None = None):
    """The lines of a regular file as strict UTF-8 text (a file of requests, one JSON object a line), each at most
    kind's cap, the first `limit` only when given: for files read a line at a time, never whole. ConfigError naming
    the file and line otherwise (a pipe, a device, a line that never ends, bad UTF-8)."""
    p = Path(path)
    check_regular(p, what)
    cap = kind.limit()
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError(f"{_label(p, what)}: {(exc.strerror or type(exc).__name__).lower()}") from None
    with os.fdopen(fd, "rb") as f:
        if _what_it_is(os.fstat(fd).st_mode) is not None:  # swapped between the check and the open
            raise ConfigError(f"{_label(p, what)}: not a regular file; give a file")
        for n in range(1, (limit if limit is not None else 2**62) + 1):
            line = f.readline(cap + 1)
            if not line:
                return
            if len(line) > cap:
                raise ConfigError(f"{_label(p, what)}:{n}: a line over the {_size(cap)} a {kind.name} line may hold "
                                  f"(set {CAP_ENV} to raise it)")
            try:
                yield line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(f"{_label(p, what)}:{n}: not UTF-8 text (bad byte at offset {exc.start})") from None


def read_text(path: str | os.PathLike, kind: Kind = CONFIG, what: str | None = None) -> str:
    """read_bytes as strict UTF-8 text (a BOM is dropped); ConfigError naming the first bad byte otherwise."""
    data = read_bytes(path, kind, what)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{_label(Path(path), what)}: not UTF-8 text (bad byte at offset {exc.start})") from None


class _NonFinite(ValueError):
    pass


def _refuse_constant(name: str):
    raise _NonFinite(name)


def _finite_float(text: str) -> float:
    v = float(text)
    if math.isinf(v):
        raise _NonFinite(text)
    return v


class _Duplicate(ValueError):
    pass


def _unique_keys(pairs: list) -> dict:
    """An object's members as a dict; a key given twice is refused (json.loads would keep the last silently)."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k)
        out[k] = v
    return out


def parse_json(text: str | bytes, where: str, finite: bool = True) -> _AnyType:
    """Strict JSON (module docstring); ConfigError "WHERE: not valid JSON (...)" otherwise. Bytes are UTF-8 only
    (json.loads would guess UTF-16 or UTF-32 from them), and an object may not name a key twice. finite=False keeps
    NaN and Infinity as floats (a schema then says which fields must be finite)."""
    kw = {} if not finite else {"parse_constant": _refuse_constant, "parse_float": _finite_float}
    kw["object_pairs_hook"] = _unique_keys
    try:
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8-sig")
        data = json.loads(text, **kw)
    except _Duplicate as exc:
        raise ConfigError(f"{where}: key {_show(exc.args[0])} given twice in one object (which one is meant?)") from None
    except _NonFinite as exc:
        raise ConfigError(f"{where}: {exc.args[0]} is not a finite number (JSON numbers here must be finite)") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc.msg}, line {exc.lineno} column {exc.colno})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: not UTF-8 text (bad byte at offset {exc.start})") from None
    except ValueError as exc:  # an integer of thousands of digits
        raise ConfigError(f"{where}: not valid JSON ({str(exc).split(';')[0]})") from None
    except RecursionError:
        raise ConfigError(f"{where}: not valid JSON (nested too deeply)") from None
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{where}: a string holds a lone surrogate (not valid Unicode)") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply") from None
    return data


def read_json(path: str | os.PathLike, kind: Kind = CONFIG, schema: "Spec | None" = None, what: str | None = None,
              finite: bool = True) -> _AnyType:
    """A JSON file read through the layer: regular file, capped, strict JSON, checked against `schema` (module
    docstring); one ConfigError naming the file (and the field) otherwise."""
    where = _label(Path(path), what)
    data = parse_json(read_bytes(path, kind, what), where, finite)
    if schema is not None:
        schema.check(data, "", where)
    return data


# ------------------------------------------------------------------------------------------------ the schema
def _show(v) -> str:
    """A value as a refusal shows it: JSON's words, a short repr."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else "Infinity (or a number past 1.8e308)"
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, list):
        return f"a list of {len(v)}"
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def show_number(x) -> str:
    """A bound as a message prints it: an integer as an integer, never 1e+09."""
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) < 2**63):
        return str(int(x))
    return f"{x:g}"


def fail(where: str, at: str, expected: str, got) -> None:
    """The one refusal of a schema: WHERE: field 'AT': expected EXPECTED, got VALUE."""
    field = f"field '{at}'" if at else "the document"
    raise ConfigError(f"{where}: {field}: expected {expected}, got {_show(got)}")


def _join(at: str, key) -> str:
    return f"{at}[{key}]" if isinstance(key, int) else (f"{at}.{key}" if at else str(key))


class Spec:
    """One node of a schema: `check(value, at, where)` returns the value or raises ConfigError (fail)."""

    expected = "a value"

    def check(self, v, at: str, where: str):
        return v


class Any(Spec):
    """Any JSON value."""


def _range(lo, hi, strict_lo: bool = False) -> str:
    if lo is not None and hi is not None and not strict_lo:
        return f" in {show_number(lo)}..{show_number(hi)}"
    parts = []
    if lo is not None:
        parts.append(f"{'>' if strict_lo else '>='} {show_number(lo)}")
    if hi is not None:
        parts.append(f"<= {show_number(hi)}")
    return (" " + " and ".join(parts)) if parts else ""


class Int(Spec):
    """An integer (not a boolean, not 7.0) in [lo, hi]."""

    def __init__(self, lo: int | None = None, hi: int | None = None):
        self.lo, self.hi = lo, hi
        self.expected = "an integer" + _range(lo, hi)

    def check(self, v, at, where):
        if isinstance(v, bool) or not isinstance(v, int) or (self.lo is not None and v < self.lo) \
                or (self.hi is not None and v > self.hi):
            fail(where, at, self.expected, v)
        return v


class Num(Spec):
    """A number (an integer counts; not a boolean), finite unless nan=True (NaN then stands for "no data"; an
    infinity never passes), in [lo, hi] (strict_lo: > lo)."""

    def __init__(self, lo: float | None = None, hi: float | None = None, strict_lo: bool = False, nan: bool = False):
        self.lo, self.hi, self.strict_lo, self.nan = lo, hi, strict_lo, nan
        self.expected = ("a number (or NaN)" if nan else "a finite number") + _range(lo, hi, strict_lo)

    def check(self, v, at, where):
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        if ok and isinstance(v, float) and math.isnan(v):
            ok = self.nan
        elif ok:
            ok = math.isfinite(v) and not (self.lo is not None and (v <= self.lo if self.strict_lo else v < self.lo)) \
                and not (self.hi is not None and v > self.hi)
        if not ok:
            fail(where, at, self.expected, v)
        return v


class Str(Spec):
    """A string; one of `choices` where given."""

    def __init__(self, choices: tuple | None = None, max_len: int = 100_000):
        self.choices, self.max_len = choices, max_len
        self.expected = f"one of {', '.join(map(repr, choices))}" if choices else "a string"

    def check(self, v, at, where):
        if not isinstance(v, str) or len(v) > self.max_len or (self.choices and v not in self.choices):
            fail(where, at, self.expected, v)
        return v


class Bool(Spec):
    expected = "true or false"

    def check(self, v, at, where):
        if not isinstance(v, bool):
            fail(where, at, self.expected, v)
        return v


class Maybe(Spec):
    """null, or `spec`."""

    def __init__(self, spec: Spec):
        self.spec = spec
        self.expected = f"{spec.expected} or null"

    def check(self, v, at, where):
        return v if v is None else self.spec.check(v, at, where)


class Opt(Spec):
    """An object's field that may be absent; when present, `spec` (Obj reads it)."""

    def __init__(self, spec: Spec):
        self.spec = spec
        self.expected = spec.expected

    def check(self, v, at, where):
        return self.spec.check(v, at, where)


class List(Spec):
    """A list of `item`, with lo..hi elements (a tuple too: checkpoints loaded by torch keep Python tuples)."""

    def __init__(self, item: Spec, lo: int = 0, hi: int | None = None):
        self.item, self.lo, self.hi = item, lo, hi
        if hi is not None:
            self.expected = f"a list of {show_number(lo)}..{show_number(hi)} elements"
        else:
            self.expected = "a non-empty list" if lo == 1 else f"a list of at least {show_number(lo)} elements" if lo else "a list"

    def check(self, v, at, where):
        if not isinstance(v, (list, tuple)) or len(v) < self.lo or (self.hi is not None and len(v) > self.hi):
            fail(where, at, self.expected, v)
        for i, x in enumerate(v):
            self.item.check(x, _join(at, i), where)
        return v


class Dict(Spec):
    """An object of any keys, each value `value`."""

    def __init__(self, value: Spec):
        self.value = value
        self.expected = "an object"

    def check(self, v, at, where):
        if not isinstance(v, dict):
            fail(where, at, self.expected, v)
        for k, x in v.items():
            self.value.check(x, _join(at, k), where)
        return v


class Obj(Spec):
    """An object with `fields` (name -> Spec; Opt(...) for one that may be absent). extra: whether other keys
    may be present (their values are not checked), or a Spec they must each meet."""

    def __init__(self, fields: dict[str, Spec], extra: bool | Spec = True, expected: str = "an object"):
        self.fields, self.extra, self.expected = fields, extra, expected

    def check(self, v, at, where):
        if not isinstance(v, dict):
            fail(where, at, self.expected, v)
        for name, spec in self.fields.items():
            if name not in v:
                if not isinstance(spec, Opt):
                    raise ConfigError(f"{where}: field '{_join(at, name)}' is missing ({spec.expected})")
                continue
            spec.check(v[name], _join(at, name), where)
        if self.extra is not True:
            for k in v:
                if k not in self.fields:
                    if self.extra is False:
                        raise ConfigError(f"{where}: unknown field '{_join(at, k)}' (known: "
                                          f"{', '.join(self.fields)})")
                    self.extra.check(v[k], _join(at, k), where)
        return v


def dataclass_schema(cls, expected: str = "an object") -> Obj:
    """The schema of a dataclass's fields from their annotations (int -> Int, float -> Num, str -> Str, bool ->
    Bool, tuple[int, ...] -> a list of Int; a field with a default may be absent; no other key): the types of a
    config read from a file, before the dataclass's own checks of its ranges."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    simple = {int: Int(), float: Num(), str: Str(), bool: Bool()}
    fields = {}
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        origin, args = typing.get_origin(t), typing.get_args(t)
        if t in simple:
            spec = simple[t]
        elif origin in (tuple, list) and args and args[0] in simple:
            spec = List(simple[args[0]])
        else:
            spec = Any()
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        fields[f.name] = Opt(spec) if has_default else spec
    return Obj(fields, extra=False, expected=expected)
