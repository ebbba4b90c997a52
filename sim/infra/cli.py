"""Shared CLI plumbing: run a main function so that user errors print one line and exit non-zero; an argument
parser whose errors are that one line too; checks of input and output paths and of numbers made before any
work; and writing an output file or folder whole or not at all."""
from __future__ import annotations

import argparse
import math
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Callable

from sim.infra.errors import ConfigError, HybridSpecError, SimulatorBug
from sim.infra.fsio import atomic_dir  # noqa: F401 -- re-exported: folders written whole live in sim/infra/fsio.py


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad command line is one line `error: PROG: message` and exit 2, like every other input
    error (argparse's default prints the usage first)."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        print(f"error: {self.prog}: {message} (see {self.prog} -h)", file=sys.stderr)
        sys.exit(2)


def int_at_least(lo: int) -> Callable[[str], int]:
    """An argparse type: an integer >= lo, written in decimal (no floats, no thousands of digits)."""
    def parse(text: str) -> int:
        s = text.strip()
        if not s.lstrip("+-").isdigit() or len(s) > 30:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {text[:40]!r}")
        v = int(s)
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        return v
    parse.__name__ = f"integer >= {lo}"
    return parse


def finite_float(lo: float | None = None, strict: bool = False, hi: float | None = None) -> Callable[[str], float]:
    """An argparse type: a finite number, > lo (strict) or >= lo, and <= hi where given."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text[:40]!r}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text[:40]!r}")
        if lo is not None and (v <= lo if strict else v < lo):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {lo:g}, got {v:g}")
        if hi is not None and v > hi:
            raise argparse.ArgumentTypeError(f"must be <= {hi:g}, got {v:g}")
        return v
    parse.__name__ = "number"
    return parse


def check_in_file(path: str | os.PathLike, flag: str = "input") -> Path:
    """Before any work: `path` is a readable regular file (not missing, not a folder, not a device such as
    /dev/zero that never ends); ConfigError naming the flag otherwise."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ConfigError(f"{flag} {p}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{flag} {p}: {describe_os_error(exc)}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{flag} {p}: is a folder, expected a file")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{flag} {p}: not a regular file (a device or a pipe cannot be read as data)")
    try:
        with open(p, "rb") as f:
            f.read(1)
    except OSError as exc:
        raise ConfigError(f"{flag} {p}: {describe_os_error(exc)}") from None
    return p


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name the same file (through links, `..` and the like); False if either is missing."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def _probe_writable(folder: Path, what: str) -> None:
    """Create and remove a file in `folder`: the one sure test that it can be written (root ignores modes;
    read-only mounts and virtual file systems refuse only when asked)."""
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".hybridspec-probe-")
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise ConfigError(f"{what}: {folder} is not writable ({(exc.strerror or type(exc).__name__).lower()})") from None


def _nearest_existing(p: Path, what: str) -> Path:
    parent = Path(os.path.abspath(p))
    while not parent.exists():
        if parent.is_symlink():  # a dangling link
            raise ConfigError(f"{what}: {parent} is a broken link")
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{what}: {parent} is a file, not a folder")
    return parent


def check_out_file(path: str | os.PathLike, force: bool = False, flag: str = "--out",
                   inputs: tuple = (), hint: str = "pass --force to replace it") -> Path:
    """Before any work: `path` can be written as a file: not a folder, not under a file, in a writable folder,
    not one of `inputs`, and not an existing file unless force (ConfigError naming the flag otherwise)."""
    p = Path(path)
    what = f"{flag} {p}"
    if p.is_dir():
        raise ConfigError(f"{what}: is a folder, expected a file name")
    for i in inputs:
        if i is not None and same_file(p, i):
            raise ConfigError(f"{what} is the input file {i}; writing it would destroy the input: choose another output")
    if p.exists() and not p.is_file():  # a device or a pipe (/dev/null, /dev/full) is never replaced by a file
        raise ConfigError(f"{what}: not a regular file (a device or a pipe); choose a file name")
    if p.exists() and not force:
        raise ConfigError(f"{what} already exists; {hint}")
    _probe_writable(_nearest_existing(p.parent, what), what)
    return p


def check_out_files(folder: str | os.PathLike, names: tuple[str, ...] | list[str], force: bool = False,
                    flag: str = "--out") -> Path:
    """Before any work, for a command that writes the files `names` into `folder` (a folder that may hold other
    files, e.g. reports/): the folder is not a file nor under one, can be written, and none of `names` exists
    there unless force (ConfigError naming the flag otherwise). Each file is then written whole (write_whole)."""
    p = Path(folder)
    what = f"{flag} {p}"
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{what}: exists and is not a folder")
    existing = [p / n for n in names if (p / n).exists()]
    if existing and not force:
        raise ConfigError(f"{what}: {existing[0]} already exists; pass --force to replace it, or choose another folder")
    _probe_writable(_nearest_existing(p, what), what)
    return p


def write_whole(path: Path, data: str | bytes, overwrite: bool = False, hint: str = "pass --force to replace it") -> Path:
    """Write `data` to `path` whole or not at all (a temporary file renamed into place, removed on failure);
    an existing file is a ConfigError unless overwrite. Creates the parent folder. An OS error without a
    path (a full disk) is raised again naming `path`."""
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
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise with_path(exc, path) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def with_path(exc: OSError, path) -> OSError:
    """`exc`, or for one that names no file (ENOSPC from a buffered write, EIO) a copy naming `path`, so the
    one-line message says where (e.g. "no space left on device: out/steps.csv")."""
    if exc.filename is not None or exc.errno is None:
        return exc
    return type(exc)(exc.errno, exc.strerror or os.strerror(exc.errno), str(path))


def check_out_dir(path: Path, force: bool = False, flag: str = "--out") -> None:
    """Before any work: `path` must be a folder this process can create or write, and a folder that already
    holds files is replaced only with force (ConfigError naming the flag otherwise)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{flag} {p}: exists and is not a folder")
    if p.is_dir() and any(p.iterdir()) and not force:
        raise ConfigError(f"{flag} {p} already holds files (an earlier run?); pass --force to replace the files "
                          "this command writes (other files are kept), or choose another folder")
    what = f"{flag} {p}"
    # the folder is filled as a temporary sibling and renamed into place: its parent must be writable
    _probe_writable(_nearest_existing(Path(os.path.abspath(p)).parent, what), what)


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

    A SimulatorBug (a lossy run) prints one line naming it a bug in hybridspec and exits 1.
    Expected failures print one line `error: ...` on stderr and exit 2: a HybridSpecError (bad input: it
    names the file, line and field where there is one), any OSError (missing or unreadable input, an output
    path that is a file or a directory or read-only, a full disk: the path and the reason), input nested
    beyond Python's recursion limit, input too large for memory, undecodable text. Ctrl-C, SIGTERM and
    SIGHUP (timeout, Slurm, systemd, docker stop) unwind alike (temporaries removed, workers stopped) and
    exit 130; a closed output pipe (`| head`) quietly. Anything else is a bug in hybridspec, not in the input: its
    traceback, then a line saying so, exit 1."""
    from sim.infra.fsio import termination_as_interrupt

    try:
        with termination_as_interrupt():
            code = main(argv)
    except HybridSpecError as exc:
        _fail(str(exc))
    except SimulatorBug as exc:  # e.g. a lossy run: the simulator's fault, never the input's
        print(f"error: internal error ({type(exc).__name__}): {exc}; this is a bug in hybridspec, not in your "
              "input; please report it with the command line above", file=sys.stderr)
        sys.exit(1)
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
    except KeyboardInterrupt as exc:
        print(f"interrupted{f' ({exc.args[0]})' if exc.args else ''}", file=sys.stderr)
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
