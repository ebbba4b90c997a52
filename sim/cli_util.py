"""Shared CLI plumbing: run a main function so that user errors print one line and exit non-zero, and
write an output file whole or not at all."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

from sim.errors import ConfigError, HybridSpecError


def write_whole(path: Path, data: str | bytes, overwrite: bool = False, hint: str = "pass --force to replace it") -> Path:
    """Write `data` to `path` whole or not at all (a temporary file renamed into place, removed on failure);
    an existing file is a ConfigError unless overwrite. Creates the parent folder."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise ConfigError(f"{path} already exists; {hint}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def run_cli(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> None:
    """Call main(argv); a HybridSpecError (or a missing file) becomes 'error: ...' on stderr and exit 2."""
    try:
        code = main(argv)
    except HybridSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except FileNotFoundError as exc:
        print(f"error: file not found: {exc.filename}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)
