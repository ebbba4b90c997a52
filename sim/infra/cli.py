"""Shared CLI plumbing: run a main function so that user errors print one line and exit non-zero; an argument
parser whose errors are that one line too; checks of input and output paths and of numbers made before any
work; and writing an output file, folder or set of files whole or not at all.

The output half is one layer every writer goes through: check_out_file / check_out_files / check_out_dir before
any work (folders of their own, never the working folder or an ancestor; existing only with --force; a file git
tracks only when its option was given; then claimed against a second writer), and write_whole / write_files /
atomic_dir (sim/infra/fsio.py) to write, which release the claim; run_cli releases what a command left claimed."""
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
from sim.infra.fsio import atomic_dir, commit_files  # noqa: F401 -- re-exported: the writers live in sim/infra/fsio.py
from sim.infra.fsio import claim, is_internal, is_tracked, own_path, refuse_in_the_way, release_claim, release_claims, resolve_out

_GIVEN: set[str] = set()  # every spelling of each option the current command line gave (--out and -o alike)
_DEPTH = [0]  # parse_known_args nesting (subcommands): the outermost call starts a fresh _GIVEN


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad command line is one line `error: PROG: message` and exit 2, like every other input
    error (argparse's default prints the usage first). It notes which options the command line gave
    (`flag_given`): an output left at its default never replaces a file git tracks."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        print(f"error: {self.prog}: {message} (see {self.prog} -h)", file=sys.stderr)
        sys.exit(2)

    def parse_known_args(self, args=None, namespace=None):  # noqa: D102 - argparse's hook
        if _DEPTH[0] == 0:
            _GIVEN.clear()
        _DEPTH[0] += 1
        try:
            result = super().parse_known_args(args, namespace)
        finally:
            _DEPTH[0] -= 1
        self._note_given(sys.argv[1:] if args is None else list(args))
        return result

    def _note_given(self, tokens: list) -> None:
        for t in tokens:
            if not isinstance(t, str) or not t.startswith("-") or t == "-":
                continue
            if t == "--":
                break
            head = t.split("=", 1)[0]
            for action in self._actions:
                opts = action.option_strings
                if any(head == o or (len(o) == 2 and o[1] != "-" and t.startswith(o))
                       or (self.allow_abbrev and o.startswith("--") and len(head) > 2 and head.startswith("--")
                           and o.startswith(head)) for o in opts):
                    _GIVEN.update(opts)


def flag_given(flag: str) -> bool:
    """Whether the current command line gave the option `flag` (any of its spellings)."""
    return flag in _GIVEN


def refuse_tracked(path: str | os.PathLike, flag: str, named: bool | None = None) -> None:
    """ConfigError if writing `path` (a file, or a folder: any file under it) would replace a file git tracks
    and the user did not name the output (`named`; default: whether `flag` was on the command line). A
    command's default output never rewrites the repository's results; naming it does (e.g. -o reports/)."""
    if (flag_given(flag) if named is None else named):
        return
    if is_tracked(Path(path)):
        raise ConfigError(f"{flag} {path}: a file git tracks (a result of the repository); a default output never "
                          f"replaces it: name it with {flag} to replace it, or choose another output")


def int_at_least(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer >= lo (and <= hi where given), written in decimal (no floats, no thousands of
    digits)."""
    def parse(text: str) -> int:
        s = text.strip()
        if not s.lstrip("+-").isdigit() or len(s) > 30:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {text[:40]!r}")
        v = int(s)
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        if hi is not None and v > hi:
            raise argparse.ArgumentTypeError(f"must be <= {hi}, got {v}")
        return v
    parse.__name__ = f"integer >= {lo}"
    return parse


SEED = int_at_least(0, 2**63 - 1)  # the argparse type of every --seed: what numpy, torch and random all take


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
    from sim.infra.inputs import check_regular  # the one input layer: what a path is, named the same everywhere

    p = Path(path)
    check_regular(p, flag)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)  # swapped for a pipe since the check: still no block
        try:
            os.read(fd, 1)
        finally:
            os.close(fd)
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
                   inputs: tuple = (), hint: str = "pass --force to replace it", named: bool | None = None) -> Path:
    """Before any work: `path` can be written as a file: not a folder, not under a file, in a writable folder,
    not one of `inputs`, not an existing file unless force, not a tracked file unless named (refuse_tracked);
    ConfigError naming the flag otherwise. Then claims it (sim.infra.fsio.claim): a second writer is refused
    until this command has written it or ended."""
    p = Path(path)
    what = f"{flag} {p}"
    if p.name in ("", ".", "..") or str(p).rstrip("/") in ("", ".", ".."):
        raise ConfigError(f"{what}: names a folder, expected a file name")
    if p.is_dir():
        raise ConfigError(f"{what}: is a folder, expected a file name")
    for i in inputs:
        if i is not None and same_file(p, i):
            raise ConfigError(f"{what} is the input file {i}; writing it would destroy the input: choose another output")
    if p.exists() and not p.is_file():  # a device or a pipe (/dev/null, /dev/full) is never replaced by a file
        raise ConfigError(f"{what}: not a regular file (a device or a pipe); choose a file name")
    refuse_tracked(p, flag, named)
    if p.exists() and not force:
        raise ConfigError(f"{what} already exists; {hint}")
    _probe_writable(_nearest_existing(p.parent, what), what)
    claim(p, flag)
    return p


def check_out_files(folder: str | os.PathLike, names: tuple[str, ...] | list[str], force: bool = False,
                    flag: str = "--out", named: bool | None = None,
                    hint: str = "pass --force to replace it, or choose another folder", given_folder: bool = True) -> Path:
    """Before any work, for a command that writes the files `names` into `folder` (a folder that may hold other
    files, e.g. reports/): the folder is no ancestor of the working folder (resolve_out), not a file nor under
    one, can be written, and none of `names` exists there unless force, nor is tracked unless named
    (ConfigError naming the flag otherwise). Claims each name; write them as one unit (commit_files).
    given_folder=False: the flag named a file (`-o r.md`) and `folder` is only its parent, which may be the working
    folder (only the files are written; the folder is never replaced)."""
    p = Path(folder)
    what = f"{flag} {p}"
    if given_folder:
        resolve_out(p, flag)
    else:
        _nearest_existing(Path(os.path.abspath(p)), what)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{what}: exists and is not a folder")
    for n in names:
        refuse_tracked(p / n, flag, named)
    if p.is_dir():  # a folder of the user's where the command writes a file: never replaced, even with force
        refuse_in_the_way(p, [(n, False) for n in names], what)
    existing = [p / n for n in names if (p / n).exists()]
    if existing and not force:
        raise ConfigError(f"{what}: {existing[0]} already exists; {hint}")
    _probe_writable(_nearest_existing(p, what), what)
    for n in sorted(names):
        claim(p / n, flag)
    return p


def write_whole(path: Path, data: str | bytes, overwrite: bool = False, hint: str = "pass --force to replace it") -> Path:
    """Write `data` to `path` whole or not at all (a temporary file renamed into place, removed on failure);
    an existing file is a ConfigError unless overwrite. Creates the parent folder. An OS error without a
    path (a full disk) is raised again naming `path`."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise ConfigError(f"{path} already exists; {hint}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = own_path(path, "tmp")
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
    finally:
        release_claim(path)
    return path


def write_files(folder: Path, files: dict[str, str | bytes], overwrite: bool = False,
                hint: str = "pass --force to replace it", unit: str = "commit") -> list[Path]:
    """Write the files `files` (name -> content) into `folder` as one unit (commit_files: after a kill or a
    full disk a reader sees all the old files or all the new ones); an existing one is a ConfigError unless
    overwrite. OS errors name the folder."""
    folder = Path(folder)
    for name in files:
        if (folder / name).exists() and not overwrite:
            raise ConfigError(f"{folder / name} already exists; {hint}")
    try:
        return commit_files(folder, files, unit=unit)
    except OSError as exc:
        raise with_path(exc, folder) from None


def with_path(exc: OSError, path) -> OSError:
    """`exc`, or for one that names no file (ENOSPC from a buffered write, EIO) a copy naming `path`, so the
    one-line message says where (e.g. "no space left on device: out/steps.csv")."""
    if exc.filename is not None or exc.errno is None:
        return exc
    return type(exc)(exc.errno, exc.strerror or os.strerror(exc.errno), str(path))


def check_out_dir(path: Path, force: bool = False, flag: str = "--out", names: tuple[str, ...] | None = None,
                  named: bool | None = None) -> None:
    """Before any work: `path` must be a folder of its own (resolve_out: not `.`, `..`, the working folder,
    home, root or their ancestors) this process can create or write; a folder that already holds files is
    replaced only with force, and tracked files in it (`names`: those the command writes; default any) only
    when named (ConfigError naming the flag otherwise). Then claims it (a second writer is refused)."""
    p = Path(path)
    resolve_out(p, flag)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{flag} {p}: exists and is not a folder")
    for target in ([p / n for n in names] if names is not None else [p]):
        refuse_tracked(target, flag, named)
    if names is not None and p.is_dir():  # a folder of the user's where the command writes a file: never replaced
        refuse_in_the_way(p, [(n, False) for n in names], f"{flag} {p}")
    if p.is_dir() and any(n.name for n in p.iterdir() if not is_internal(n.name)) and not force:
        raise ConfigError(f"{flag} {p} already holds files (an earlier run?); pass --force to replace the files "
                          "this command writes (other files are kept), or choose another folder")
    what = f"{flag} {p}"
    # the folder is filled as a temporary sibling and renamed into place: its parent must be writable
    _probe_writable(_nearest_existing(Path(os.path.abspath(p)).parent, what), what)
    claim(p, flag)


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

    cache = _cache_before()
    try:
        with termination_as_interrupt():
            try:
                code = main(argv)
            finally:  # outputs claimed and never written (a refusal, an error, Ctrl-C): locks and lock files go
                release_claims()
                _GIVEN.clear()
            if not code:  # said after a command that worked: an error stays the one line it is
                _cache_note(cache)
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


def _cache_before() -> Path | None:
    """The cache folder (sim.infra.fsio.cache_root) when it does not exist yet, so a command that makes it can
    say so once (_cache_note); None when it exists already or caching is off."""
    from sim.infra.fsio import cache_root

    root = cache_root(create=False)  # only look: the command that needs it makes it (with the project's mark)
    return root if root is not None and not os.path.lexists(root) else None


def _cache_note(root: Path | None) -> None:
    """One line on stderr when a command that worked made the cache folder `root`: where it is, what it holds now,
    and the command that shows and prunes it (a user should not find hundreds of MB in ~/.cache by chance)."""
    if root is None or not root.is_dir():
        return
    from sim.infra.fsio import walk_entries

    size = sum(st.st_size for _, st in walk_entries(root) if not stat.S_ISDIR(st.st_mode))
    print(f"note: made the cache folder {root} ({size / 1e6:.1f} MB now: draft tables, token ids, compiled code; "
          "later runs reuse it); `python -m sim.cache` shows its size and prunes it, HYBRIDSPEC_CACHE_DIR=DIR moves "
          "it, HYBRIDSPEC_CACHE_DIR=off turns it off", file=sys.stderr)


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)
