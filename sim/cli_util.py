"""Shared CLI plumbing: run a main function so that user errors print one line and exit non-zero."""
from __future__ import annotations

import sys
from typing import Callable

from sim.errors import HybridSpecError


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
