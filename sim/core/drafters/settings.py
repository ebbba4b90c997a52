"""A drafter's settings: a frozen dataclass whose fields declare their type, default, help and bounds, from which the
registry makes every command's flags and the one check of a value (sim/core/drafters/registry.py).

    @dataclass(frozen=True)
    class SuffixSettings:
        max_depth: int = setting(24, "tokens of a tree path", lo=2, hi=256)

A run carries every drafter's settings as one canonical JSON object, {"drafter": {"setting": value}} (the
`drafter_config` field of sim/core/config.py's DrafterConfig), so a setting is declared once, in the drafter's own
module. A drafter named D with a setting `max_depth` gets the flags `--D-max-depth VALUE` (one setting) and
`--D-config JSON` (several at once) on every command that takes the config's flags (sim.run, real/validate.py).
"""
from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

from sim.infra.errors import ConfigError


def setting(default: Any, help: str, *, lo: float | None = None, hi: float | None = None) -> Any:
    """A settings field: `default`, the help text, and the allowed range [lo, hi] (either may be None)."""
    return dataclasses.field(default=default, metadata={"help": help, "lo": lo, "hi": hi})


def setting_flag(drafter: str, name: str) -> str:
    """The command-line flag of one setting: --{drafter}-{name with dashes}."""
    return f"--{drafter}-{name.replace('_', '-')}"


def setting_types(cls) -> dict[str, type]:
    """name -> int, float, bool or str of every field of a settings class."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def check_value(drafter: str, cls, name: str, value: Any) -> Any:
    """`value` of setting `name` as its declared type, or ConfigError (one line, naming the flag) when it is of
    another type or out of its range. An int is accepted for a float setting."""
    typ = setting_types(cls)[name]
    meta = next(f for f in dataclasses.fields(cls) if f.name == name).metadata
    where = f"{setting_flag(drafter, name)}"
    if typ is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
    elif typ is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{where} must be a finite number, got {value!r}")
        value = float(value)
    elif not isinstance(value, typ):
        raise ConfigError(f"{where} must be a {typ.__name__}, got {value!r}")
    lo, hi = meta.get("lo"), meta.get("hi")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        span = f"in {lo:g}..{hi:g}" if lo is not None and hi is not None else f">= {lo:g}" if lo is not None \
            else f"<= {hi:g}"
        raise ConfigError(f"{where} must be {span}, got {value!r}")
    return value


def settings_from(drafter: str, cls, values: dict):
    """An instance of the settings class `cls` of `drafter` from a dict of some of its fields (the rest default);
    ConfigError (one line) for an unknown name or a bad value."""
    if not isinstance(values, dict):
        raise ConfigError(f"--{drafter}-config: expected a JSON object of settings, got {values!r}")
    known = setting_types(cls)
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"drafter {drafter}: unknown setting(s) {', '.join(unknown)} (known: {', '.join(known)})")
    return cls(**{k: check_value(drafter, cls, k, v) for k, v in values.items()})
