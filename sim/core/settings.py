"""Typed settings, declared once: a frozen dataclass whose fields say their type, default, help and range
(`setting`), and the one check and parse of a value from that declaration. Three kinds of settings use it:
a drafter's (sim/core/drafters/settings.py: the --D-NAME flags), a policy family's spec options
(sim/core/policies/registry.py: `name[:VALUE][:flag][:key=value]`, parse_spec; the canonical name, spec_name, is
made here) and the vLLM plugin's hybrid_spec (sim/core/plugin_settings.py: PluginSettings, which
real/vllm_plugin/config.py, --additional-config and real/validate.py's `hybrid:FIELD=V` all read).

    @dataclass(frozen=True)
    class SuffixSettings:
        max_depth: int = setting(24, "tokens of a tree path", lo=2, hi=256)

A field's type is its annotation (int, float, bool or str; `X | None` for a setting that may be absent). Its
range: lo/hi (inclusive; strict=True makes lo exclusive), choices (for str), and `off`: one value accepted outside
the range that means the setting is off (its meaning in `off_means`, e.g. runcal 0 = off; also what a default of
None means: suffix's K, the whole chain); `what`: the value's
noun in errors ('a prior precision', default 'an integer' / 'a finite number'). Any other keyword is
kept in the field's metadata for the declaration's own readers (the plugin's `counterpart`).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any

from sim.infra.errors import ConfigError

_NO_OFF = object()


def setting(default: Any, help: str, *, lo: float | None = None, hi: float | None = None, strict: bool = False,
            choices: tuple | None = None, off: Any = _NO_OFF, off_means: str = "off", metavar: str | None = None,
            **extra: Any) -> Any:
    """A settings field: `default`, the help text, its range (module docstring) and any other metadata."""
    meta = {"help": help, "lo": lo, "hi": hi, "strict": strict, "choices": None if choices is None else tuple(choices),
            "off": off, "off_means": off_means, "metavar": metavar, **extra}
    return dataclasses.field(default=default, metadata=meta)


@functools.lru_cache(maxsize=None)  # a class's declaration does not change: read its annotations once
def setting_types(cls) -> dict[str, type]:
    """name -> int, float, bool or str of every field of a settings class (`X | None` read as X)."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        typ = hints[f.name]
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        out[f.name] = args[0] if typing.get_origin(typ) in (typing.Union, types.UnionType) else typ
    return out


def meta(cls, name: str) -> dict:
    """The declaration of setting `name` of `cls` (its field's metadata)."""
    return next(f for f in dataclasses.fields(cls) if f.name == name).metadata


def defaults(cls) -> dict[str, Any]:
    """name -> default of every field."""
    return {f.name: f.default for f in dataclasses.fields(cls)}


def _num(x: float) -> str:
    return f"{x:g}"


def _span(m: dict) -> str:
    lo, hi, strict = m.get("lo"), m.get("hi"), m.get("strict")
    if lo is not None and hi is not None:
        return f"in {_num(lo)}..{_num(hi)}" if not strict else f"> {_num(lo)} and <= {_num(hi)}"
    if lo is not None:
        return f"{'>' if strict else '>='} {_num(lo)}"
    return "" if hi is None else f"<= {_num(hi)}"


def _off(m: dict) -> str:
    off = m.get("off", _NO_OFF)
    return "" if off is _NO_OFF else f"{off} ({m.get('off_means', 'off')}) or "


def rule(cls, name: str, off: bool = True) -> str:
    """What a value of `name` must be: 'an integer in 1..64', 'a finite number >= 0', 'one of a, b', 'true or
    false', with '0 (off) or ' before it where the setting has an off value (and `off`)."""
    typ, m = setting_types(cls)[name], meta(cls, name)
    if typ is bool:
        return "true or false"
    if m.get("choices"):
        return "one of " + ", ".join(map(str, m["choices"]))
    what = m.get("what") or ("an integer" if typ is int else "a finite number" if typ is float else f"a {typ.__name__}")
    span = _span(m)
    return (_off(m) if off else "") + what + (" " + span if span else "")


def check(cls, name: str, value: Any, where: str) -> Any:
    """`value` of setting `name` as its declared type, or ConfigError (one line: `where`, the rule, the value) when
    it is of another type or out of its range. An int is accepted for a float setting."""
    typ, m = setting_types(cls)[name], meta(cls, name)
    off = m.get("off", _NO_OFF)
    bad = ConfigError(f"{where} must be {rule(cls, name)}, got {value!r}")
    if off is not _NO_OFF and value == off and not isinstance(value, bool):
        return value
    if typ is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
    elif typ is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise bad
        value = float(value)
    elif not isinstance(value, typ):
        raise bad
    if m.get("choices") and value not in m["choices"]:
        raise bad
    lo, hi = m.get("lo"), m.get("hi")
    if (lo is not None and (value <= lo if m.get("strict") else value < lo)) or (hi is not None and value > hi):
        raise ConfigError(f"{where} must be {_off(m)}{_span(m)}, got {value!r}")  # the type was right: the range
    return value


def parse_text(cls, name: str, text: str, where: str, off: bool = True) -> Any:
    """A setting's value from command-line text (a spec option's value, real/validate.py's FIELD=V): true/false
    (or 1/0) for a bool, an integer, a number, the field's own `parse` (metadata) or the text itself, then `check`;
    off=False: the off value is refused (a spec leaves an option out to turn it off). ConfigError (one line: `where`,
    the rule, the text) otherwise."""
    typ, m = setting_types(cls)[name], meta(cls, name)
    value: Any = text
    shown = text if typ in (int, float) else repr(text)  # a number out of range as typed; text quoted
    bad = ConfigError(f"{where} must be {rule(cls, name, off)}, got {shown}")
    if m.get("parse") is not None:  # a value with a grammar of its own (dyn=START-END@K,...): its own one line
        try:
            return m["parse"](text)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    try:
        if typ is bool:
            if text not in ("true", "false", "1", "0"):
                raise ValueError
            value = text in ("true", "1")
        elif typ is int:
            value = int(text)
        elif typ is float:
            value = float(text)
    except ValueError:
        raise ConfigError(f"{where} must be {rule(cls, name, off)}, got {text!r}") from None
    if not off and m.get("off", _NO_OFF) is not _NO_OFF and value == m["off"]:
        raise bad
    try:
        return check(cls, name, value, where)
    except ConfigError:
        raise bad from None


def build(cls, values: dict, where: str, what: str = "setting", named=None):
    """An instance of `cls` from a dict of some of its fields (the rest default), each checked (`check`, named
    `named(NAME)`, default `where`.NAME); ConfigError (one line) for an unknown name or a bad value."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a JSON object of settings, got {values!r}")
    known = setting_types(cls)
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown {what}(s) {', '.join(unknown)} (known: {', '.join(known)})")
    named = named or (lambda k: f"{where}.{k}")
    return cls(**{k: check(cls, k, v, named(k)) for k, v in values.items()})


def describe(cls) -> list[str]:
    """One line per setting: `name (rule; default D): help`, for --help and docs."""
    return [f"{f.name} ({rule(cls, f.name)}; default {f.default!r}): {f.metadata.get('help', '')}"
            for f in dataclasses.fields(cls)]


def is_positional(f) -> bool:
    """Whether the settings field `f` is the spec's positional one (written bare: `hybrid:sweep`)."""
    return bool(f.metadata.get("positional"))


def spec_written(cls, given: dict) -> list:
    """The settings a canonical name writes, in declaration order: the positional one when given, a flag when true,
    any other when it differs from its default: [(name, value)]."""
    out = []
    for f in dataclasses.fields(cls):
        if f.name in given and (is_positional(f) or given[f.name] != f.default):
            out.append((f.name, given[f.name]))
    return out


def spec_name(family: str, cls, given: dict) -> str:
    """The canonical name of a spec of `family` giving `given` (spec_written): `family:METHOD:flag:key=V`, a
    number as %g."""
    types, parts = setting_types(cls), [family]
    for name, v in spec_written(cls, given):
        f = next(f for f in dataclasses.fields(cls) if f.name == name)
        text = f"{v:g}" if types[name] is float else str(v)
        parts.append(text if is_positional(f) else name if types[name] is bool else f"{name}={text}")
    return ":".join(parts)
