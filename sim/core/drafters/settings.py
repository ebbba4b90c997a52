"""A drafter's settings: a frozen dataclass whose fields declare their type, default, help and bounds (the core's
one declaration, sim/core/settings.py `setting`), from which the registry makes the flags and the one check of a
value (sim/core/drafters/registry.py). This module only names a drafter's settings as its flags do.

    @dataclass(frozen=True)
    class SuffixSettings:
        max_depth: int = setting(24, "tokens of a tree path", lo=2, hi=256)

A run carries every drafter's settings as one canonical JSON object, {"drafter": {"setting": value}} (the
`drafter_config` field of sim/core/config.py's DrafterConfig), so a setting is declared once, in the drafter's own
module. A drafter named D with a setting `max_depth` gets the flags `--D-max-depth VALUE` (one setting) and
`--D-config JSON` (several at once) on every command that takes DrafterConfig's flags (sim.run; real/validate.py
takes --drafters only, each drafter at its declared defaults).
"""
from __future__ import annotations

from typing import Any

from sim.core import settings as _settings
from sim.core.settings import setting, setting_types  # noqa: F401 (the drafters' import of the declaration)


def setting_flag(drafter: str, name: str) -> str:
    """The command-line flag of one setting: --{drafter}-{name with dashes}."""
    return f"--{drafter}-{name.replace('_', '-')}"


def check_value(drafter: str, cls, name: str, value: Any) -> Any:
    """`value` of setting `name` as its declared type, or ConfigError (one line, naming the flag) when it is of
    another type or out of its range. An int is accepted for a float setting."""
    return _settings.check(cls, name, value, setting_flag(drafter, name))


def settings_from(drafter: str, cls, values: dict):
    """An instance of the settings class `cls` of `drafter` from a dict of some of its fields (the rest default);
    ConfigError (one line, naming the flag) for an unknown name or a bad value."""
    return _settings.build(cls, values, f"--{drafter}-config", named=lambda k: setting_flag(drafter, k))
