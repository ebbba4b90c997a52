"""Shared CLI plumbing: run a main function so that user errors print one line and exit non-zero, and
write an output file whole or not at all."""
from __future__ import annotations

import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

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


def check_out_dir(path: Path, force: bool = False, flag: str = "--out") -> None:
    """Before any work: `path` must be a folder this process can create or write, and a folder that already
    holds files is replaced only with force (ConfigError naming the flag otherwise)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{flag} {p}: exists and is not a folder")
    if p.is_dir() and any(p.iterdir()) and not force:
        raise ConfigError(f"{flag} {p} already holds files (an earlier run?); pass --force to replace them, or "
                          "choose another folder")
    parent = p.resolve()
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{flag} {p}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {p}: {parent} is not writable")


@contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Write a folder whole or not at all: yields a temporary sibling to fill; on success it takes the place
    of `path` (an older `path` is moved aside first and removed after the swap), on failure it is removed and
    `path` is left as it was. No temporary folder is left behind either way."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    old = path.with_name(f".{path.name}.{os.getpid()}.old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not path.exists():
            os.replace(old, path)  # put the earlier result back
        raise
    shutil.rmtree(old, ignore_errors=True)


def describe_os_error(exc: OSError) -> str:
    """One line for an operating-system error: what failed and on which path(s), e.g.
    "permission denied: out/summary.json" or "no space left on device: out/steps.csv"."""
    what = (exc.strerror or type(exc).__name__).lower()
    if isinstance(exc, FileNotFoundError):
        what = "file not found"
    paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
    return f"{what}: {' -> '.join(paths)}" if paths else f"{what} ({exc})"


def run_cli(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> None:
    """Call main(argv) behind the one error boundary of every command.

    Expected failures print one line `error: ...` on stderr and exit 2: a HybridSpecError (bad input: it
    names the file, line and field where there is one), any OSError (missing or unreadable input, an output
    path that is a file or a directory or read-only, a full disk: the path and the reason), input nested
    beyond Python's recursion limit, input too large for memory, undecodable text. Ctrl-C exits 130, a
    closed output pipe (`| head`) quietly. Anything else is a bug in hybridspec, not in the input: its
    traceback, then a line saying so, exit 1."""
    try:
        code = main(argv)
    except HybridSpecError as exc:
        _fail(str(exc))
    except BrokenPipeError:
        # the reader went away (`... | head`): nothing more to say, and no traceback at interpreter exit
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        sys.exit(0)
    except OSError as exc:
        _fail(describe_os_error(exc))
    except RecursionError:
        _fail("input nested too deeply to read (JSON or another structure deeper than Python's recursion limit)")
    except MemoryError:
        _fail("out of memory: the input (or a size it asks for) is too large for this machine")
    except UnicodeError as exc:
        _fail(f"input is not valid text ({type(exc).__name__}: {exc})")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the boundary: a bug, shown as one, never as an input error
        import traceback

        traceback.print_exc()
        print(f"error: internal error ({type(exc).__name__}): this is a bug in hybridspec, not in your input; "
              "please report it with the command line above", file=sys.stderr)
        sys.exit(1)
    sys.exit(code or 0)


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)
