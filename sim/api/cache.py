"""python -m sim.cache: how much the cache holds, per kind, and pruning it.

    python -m sim.cache                                   size and files of each kind under the cache folder
    python -m sim.cache --prune [--kind K ...] [--older-than DAYS]

Every cache of the project lives under one folder, sim.infra.fsio.cache_root() (HYBRIDSPEC_CACHE_DIR; default
~/.cache/hybridspec; HYBRIDSPEC_CACHE_DIR=off turns caching off). A kind is one folder at its top (draft-tables,
tokens, native, plotly, ...); whatever is removed is rebuilt on the next run that needs it, at that run's cost
(a pruned plotly copy: a report.html written with --plotly cached shows a notice until a page is written again).

The walk never follows a symbolic link: a link inside the cache counts as itself and is removed as itself, never
what it points to; nothing outside the cache folder is read, counted or removed.

--prune removes only from a folder the project made (a misspelt HYBRIDSPEC_CACHE_DIR must not empty ~/.cache, a
documents folder or a copy of models/): the folder must carry the project's mark (sim.infra.fsio.CACHE_MARK,
written when the project creates the cache folder), must not itself be a symbolic link, and may hold nothing but
the mark and the kinds the project writes (sim.infra.fsio.CACHE_KINDS, each a real folder). A cache folder made
before the mark existed is adopted (marked, then pruned) only when every entry in it is one of those kinds. A
folder that is the home folder, the file system's root, or holds the repository or the working folder is refused
whatever it holds. Any refusal is one line, exit 2, and nothing is removed.
"""
from __future__ import annotations

import os
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sim.infra.cli import ArgumentParser, finite_float
from sim.infra.errors import ConfigError, did_you_mean
from sim.infra.fsio import CACHE_KINDS, CACHE_MARK, ENV, cache_root, is_marked_cache, mark_cache, walk_entries
from sim.infra.paths import REPO

DAY_S = 86400.0


@dataclass(frozen=True)
class KindSize:
    """One kind of the cache: its folder name, bytes (as stored: links and files by their own size) and files."""

    kind: str
    bytes: int
    files: int


def sizes(root: Path) -> list[KindSize]:
    """The size of each kind under `root`, largest first; loose files at the top count as the kind '(loose)'."""
    out: dict[str, list[int]] = {}
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        if entry.name == CACHE_MARK:
            continue
        st = entry.lstat()
        kind = entry.name if stat.S_ISDIR(st.st_mode) else "(loose)"
        acc = out.setdefault(kind, [0, 0])
        found = [(entry, st)] if not stat.S_ISDIR(st.st_mode) else list(walk_entries(entry))
        for _, s in found:
            if not stat.S_ISDIR(s.st_mode):
                acc[0] += s.st_size
                acc[1] += 1
    return sorted((KindSize(k, b, n) for k, (b, n) in out.items()), key=lambda k: (-k.bytes, k.kind))


def check_prunable(root: Path) -> Path:
    """`root`, absolute, when every rule of the module docstring holds for it (a cache of the project's, marked
    or adopted); ConfigError naming the first rule it breaks otherwise. Nothing is resolved before the checks:
    a linked root is refused as itself, never followed to its target."""
    given = root
    root = Path(os.path.abspath(root))
    fix = f"set {ENV} to the cache folder the project made (default ~/.cache/hybridspec)"
    if root.is_symlink():
        raise ConfigError(f"{given}: refusing to prune it: the cache folder is a symbolic link (to "
                          f"{os.readlink(root)}); {fix}")
    if not root.is_dir():
        raise ConfigError(f"{given}: refusing to prune it: not a folder; {fix}")
    r = root.resolve()
    guarded = {Path("/").resolve(), Path.home().resolve()}
    if r in guarded or any(q.is_relative_to(r) for q in (REPO.resolve(), Path.cwd().resolve(), Path.home().resolve())):
        raise ConfigError(f"{given}: refusing to prune it as a cache ({ENV} names the root or a folder "
                          f"holding your home, the repository or the working folder); {fix}")
    foreign = []
    for e in sorted(os.scandir(root), key=lambda e: e.name):
        if e.name == CACHE_MARK and e.is_file(follow_symlinks=False):
            continue
        if e.name not in CACHE_KINDS or not e.is_dir(follow_symlinks=False):
            foreign.append(e.name + ("/" if e.is_dir(follow_symlinks=False) else ""))
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise ConfigError(f"{given}: refusing to prune it: it holds {shown}, which the project's cache never "
                          f"writes (its kinds: {', '.join(CACHE_KINDS)}); {fix}")
    if not is_marked_cache(root):
        mark_cache(root)  # only the project's kinds in it: a cache made before the mark existed, adopted
        if not is_marked_cache(root):
            raise ConfigError(f"{given}: refusing to prune it: it carries no {CACHE_MARK} mark and one cannot "
                              f"be written there; {fix}")
    return root


def prune(root: Path, kinds: list[str] | None = None, older_than_days: float | None = None,
          now: float | None = None) -> tuple[int, int]:
    """Remove the files (and links, as themselves) of `kinds` (default: all) under `root` whose modification
    time is older than `older_than_days` days (default: every one), then the folders left empty under each kind
    (the kind's own folder too when all of it went). Returns (files removed, bytes freed)."""
    root = check_prunable(root)
    have = {k.kind for k in sizes(root)}
    for k in kinds or []:
        if k not in have:
            raise ConfigError(f"--kind {k}: no such kind in {root}{did_you_mean(k, have)}; it holds: "
                              f"{', '.join(sorted(have)) or 'nothing'}")
    cutoff = None if older_than_days is None else (time.time() if now is None else now) - older_than_days * DAY_S
    removed = freed = 0
    for entry in sorted(root.iterdir()):
        st = entry.lstat()
        is_dir = stat.S_ISDIR(st.st_mode)
        if entry.name not in CACHE_KINDS or not is_dir:  # the mark (check_prunable refused anything else)
            continue
        if kinds and entry.name not in kinds:
            continue
        for p, s in (list(walk_entries(entry)) + [(entry, st)]) if is_dir else [(entry, st)]:
            try:
                if stat.S_ISDIR(s.st_mode):
                    if p != entry or cutoff is None:  # a kind's own folder goes only when all of it goes
                        p.rmdir()  # only when empty: OSError otherwise, and it stays
                elif cutoff is None or s.st_mtime < cutoff:
                    p.unlink()
                    removed, freed = removed + 1, freed + s.st_size
            except OSError:
                continue
    return removed, freed


def human(n: float) -> str:
    """Bytes as B, KB, MB, GB (powers of 1000, as du --si prints them)."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} GB"


def report(root: Path) -> str:
    """What `python -m sim.cache` prints: each kind's size and files, the total, and how to prune."""
    ks = sizes(root)
    w = max([len(k.kind) for k in ks] + [5])
    lines = [f"cache {root} ({ENV}; {ENV}=off turns caching off)"]
    lines += [f"  {k.kind:<{w}}  {human(k.bytes):>9}  {k.files} files" for k in ks] or ["  (empty)"]
    lines.append(f"  {'total':<{w}}  {human(sum(k.bytes for k in ks)):>9}  {sum(k.files for k in ks)} files")
    lines.append("python -m sim.cache --prune removes it (--kind K: one kind; --older-than DAYS: what was not "
                 "written for DAYS days); what is removed is rebuilt when a run needs it")
    return "\n".join(lines)


def parse_args(argv: list[str] | None):
    ap = ArgumentParser(prog="python -m sim.cache", description=__doc__.split("\n\n")[0])
    ap.add_argument("--prune", action="store_true", help="remove what the cache holds (all of it, or --kind / "
                                                         "--older-than's part)")
    ap.add_argument("--kind", action="append", default=None, metavar="K",
                    help="with --prune: only this kind (repeatable; the names the listing shows)")
    ap.add_argument("--older-than", type=finite_float(0), default=None, metavar="DAYS",
                    help="with --prune: only files last written more than DAYS days ago")
    a = ap.parse_args(argv)
    if (a.kind or a.older_than is not None) and not a.prune:
        raise ConfigError("--kind and --older-than go with --prune (without it the command only lists the cache)")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    root = cache_root(create=False)  # listing or pruning never makes (nor marks) a cache folder
    if root is None:
        print(f"caching is off ({ENV}={os.environ.get(ENV)}): nothing is cached")
        return 0
    if not root.exists():
        print(f"cache {root}: empty (nothing cached yet)")
        return 0
    if a.prune:
        n, b = prune(root, a.kind, a.older_than)
        print(f"removed {n} files, {human(b)}", file=sys.stderr)
    print(report(root))
    return 0
