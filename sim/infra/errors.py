"""Typed errors for bad user input; CLIs print them as one line and exit non-zero, never a traceback."""
from __future__ import annotations


class HybridSpecError(Exception):
    """Base class of every error caused by user input (a trace, a name, a config)."""


class ConfigError(HybridSpecError):
    """An impossible or unknown configuration: unknown policy/model/GPU name, bad numbers."""


class SimulatorBug(Exception):
    """A result the simulator itself got wrong (e.g. emitted tokens differ from the trace: not lossless).
    Not an input error: CLIs print it as one line naming it a bug in hybridspec and exit 1, not 2."""


class TraceError(HybridSpecError):
    """A malformed trace or input file. Carries where: file, line (1-based, or None) and field (or None)."""

    def __init__(self, message: str, file: str | None = None, line: int | None = None, field: str | None = None):
        self.file, self.line, self.field, self.reason = file, line, field, message
        where = file or "<input>"
        if line is not None:
            where += f":{line}"
        if field is not None:
            where += f": field '{field}'"
        super().__init__(f"{where}: {message}")


def did_you_mean(name: object, valid) -> str:
    """" (did you mean 'X'?)" when `name` is one slip (a typo, a letter swapped or missing) from one of the `valid`
    names (difflib's closest match, case ignored), else '': the tail of an unknown-name error."""
    import difflib

    names = {str(v).lower(): str(v) for v in valid}
    close = difflib.get_close_matches(str(name).strip().lower(), list(names), n=1, cutoff=0.75)
    return f" (did you mean '{names[close[0]]}'?)" if close else ""
