"""Files that survive crashes, signals and a second process: the one cache folder setting, user-private
folders, output locks, atomic folder swaps, sets of files committed as one unit, crash leftovers, and
SIGTERM handled like Ctrl-C.

Cache folder (`cache_root`): $HYBRIDSPEC_CACHE_DIR if set (`off`, `0`, `none`, `false` or empty: no cache
at all, for every cache), else $XDG_CACHE_HOME/hybridspec, else ~/.cache/hybridspec. Every cache
(draft tables, token ids, native libraries, converted weights, drafter data and checkpoints) lives under it, one
folder per kind (CACHE_KINDS). The folder is marked (CACHE_MARK) when this module creates it, never otherwise:
`sim.cache --prune` prunes only a marked folder (sim/api/cache.py).

Invariants this module keeps:
- Every name this layer gives its locks, journals and temporaries carries a tag (`own_name`: a hash of the output's
  name, the pid and the kind). Only a matching tag makes an entry the layer's own (`is_internal`): only those are
  left out of a carried-over folder, rolled forward, or removed as leftovers. Anything else, of any name, is
  the user's and is kept.
- `private_dir` folders are created 0700 and refused (one-line ConfigError) unless owned by this user and
  closed to group and others, so nobody else can plant a file in them.
- `output_lock` holds an exclusive flock on `.<name>.<tag>.lock` beside an output for the whole command (`claim`:
  from the check before any work to the write): a second writer of the same output is refused at once with
  one line, never silently merged. The lock dies with the process (kill -9 included); the holder removes the
  lock file while still holding it, and a locker that got the lock of a file no longer at the path retries.
- `atomic_dir` replaces only the files the command wrote: every other entry of the old folder is carried over
  (every folder among them), and a folder of the user's at a name the command writes a file to is refused
  (`refuse_in_the_way`), never replaced.
- `is_tracked` asks git whether an output would replace a tracked file (sim/infra/cli.py refuses that unless
  the output's flag was given); `temp_dir` is a temporary folder removed whatever ends the block.
- `swap_dir` replaces a folder atomically: renameat2(RENAME_EXCHANGE) where the kernel and C library have it
  (the new folder and the old one trade places in one step), else a journal `.<name>.<tag>.swap` written before
  two renames and read back by `recover` (a kill between them rolls forward to the new folder).
- `commit_files` writes several files as one unit: every file whole under a temporary name, then a journal
  `.<unit>.<pid>.<tag>.commit` naming them, then the renames, then the journal is removed. `recover` (run before a
  read and at the start of every writer) finishes a committed unit and removes temporaries of one that was
  never committed, so a reader sees the old set or the new set, never a mix.
- `clean_leftovers` removes what an earlier killed run left beside an output (`.<name>.<pid>.<tag>.tmp`/`.old`
  folders and files whose process is gone, tag matching).
"""
from __future__ import annotations

import atexit
import ctypes
import errno
import json
import hashlib
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sim.infra.errors import ConfigError

ENV = "HYBRIDSPEC_CACHE_DIR"
_OFF = ("", "off", "0", "none", "false", "no")


# ------------------------------------------------------------------------------------------------ cache
# The cache's own mark: a file the project writes in the cache folder when it creates that folder. `sim.cache
# --prune` removes only under a folder that carries it (sim/api/cache.py), so a misspelt HYBRIDSPEC_CACHE_DIR that
# names a folder of the user's (~/.cache, a documents folder) is never emptied.
CACHE_MARK = ".hybridspec-cache"
CACHE_MARK_TEXT = ("hybridspec cache folder: made by hybridspec; python -m sim.cache --prune removes the cache kinds "
                   "under it\n")
# The kinds (top-level folders) the project writes under the cache folder, and what each holds: the registry
# `sim.cache` lists and prunes by, and the only entries (besides the mark) a prunable cache folder may hold.
CACHE_KINDS: dict[str, str] = {
    "draft-tables": "draft tables of a trace (sim.core.drafters.cache)",
    "tokens": "token ids of a trace file (sim.core.trace.tokenizer)",
    "native": "native libraries built from sim/engine/native (sim.engine.native)",
    "plotly": "the plotly.js copy pages load (sim.infra.html_page)",
    "weights": "converted weights and the SmolLM2 tokenizer (real.engine.weights)",
    "drafter_data": "drafter training data (real.drafter.data)",
    "wheels": "downloaded wheels of the codeedit trace build (sim.core.trace.build_codeedit)",
    "hf": "Hugging Face checkpoints of the vLLM CPU models (real.validation.vllm_cpu.checkpoints)",
}


def cache_root(create: bool = True) -> Path | None:
    """The one cache folder every cache lives under, or None when caching is off (for every cache). When the
    folder does not exist yet and `create`, it is made here (0700) with the project's mark in it (CACHE_MARK):
    only a folder the project made carries the mark; an existing folder is never marked here."""
    env = os.environ.get(ENV)
    if env is not None:
        if env.strip().lower() in _OFF:
            return None
        root = Path(env).expanduser()
    else:
        base = os.environ.get("XDG_CACHE_HOME") or ""
        if not base.strip() or not os.path.isabs(base):  # the XDG spec: a relative value is ignored
            base = str(Path.home() / ".cache")
        root = Path(base) / "hybridspec"
    if create and not os.path.lexists(root):
        try:
            root.mkdir(mode=0o700, parents=True)
        except OSError:  # made meanwhile by another process (it marks it), or not makeable: the caller's write says so
            return root
        mark_cache(root)
    return root


def walk_entries(folder: Path):
    """(path, lstat) of every file, link and folder under `folder`, children before their folder, links never
    followed: what the cache's sizes and its pruning walk."""
    for top, dirs, files in os.walk(folder, topdown=False, followlinks=False):
        for name in files + dirs:
            p = Path(top) / name
            try:
                yield p, p.lstat()
            except OSError:  # removed meanwhile (another process's cache write)
                continue


def mark_cache(root: Path) -> None:
    """Write the project's mark into the cache folder `root` (whole: a temporary then a rename)."""
    tmp = root / f"{CACHE_MARK}.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        tmp.write_text(CACHE_MARK_TEXT)
        os.replace(tmp, root / CACHE_MARK)
    except OSError:
        tmp.unlink(missing_ok=True)


def is_marked_cache(root: Path) -> bool:
    """Whether `root` carries the project's mark: a regular file CACHE_MARK (not a link) holding CACHE_MARK_TEXT."""
    mark = Path(root) / CACHE_MARK
    try:
        if not stat.S_ISREG(os.lstat(mark).st_mode):
            return False
        with open(mark, "rb") as f:
            return f.read(len(CACHE_MARK_TEXT) + 1) == CACHE_MARK_TEXT.encode()
    except OSError:
        return False


def private_dir(path: Path) -> Path:
    """`path`, created with owner-only permissions (0700) if missing, and checked: a real folder (not a
    link), owned by this user, not writable or readable by group or others. ConfigError otherwise."""
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{path}: expected a private folder, found a link or a file; remove it")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise ConfigError(f"{path}: owned by another user (uid {st.st_uid}); refusing to load code or data from it")
    if st.st_mode & 0o077:
        try:  # a folder of ours left open by an older version or a umask: close it
            os.chmod(path, 0o700)
        except OSError:
            raise ConfigError(f"{path}: open to other users (mode {stat.S_IMODE(st.st_mode):o}); "
                              f"run chmod 700 {path}") from None
    return path


# ------------------------------------------------------------------------------------------------ signals
def _raise_interrupt(signum, frame):  # noqa: ARG001 - signal handler signature
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextmanager
def termination_as_interrupt() -> Iterator[None]:
    """For the block: SIGTERM and SIGHUP (what timeout, Slurm, systemd, docker stop and a closed terminal
    send) raise KeyboardInterrupt in the main thread, so they unwind exactly as Ctrl-C does (temporaries
    removed, workers stopped, exit 130). The earlier handlers are put back after."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {}
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            saved[sig] = signal.signal(sig, _raise_interrupt)
    try:
        yield
    finally:
        for sig, h in saved.items():
            signal.signal(sig, h if h is not None else signal.SIG_DFL)


_STOP_SIGNALS = {s for s in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGHUP", None)) if s is not None}


@contextmanager
def forking_workers() -> Iterator[None]:
    """Around the creation of worker processes (fork): SIGTERM, SIGINT and SIGHUP are blocked, so a worker
    starts with them blocked and the parent's Python handlers inherited; die_with_parent sets the worker's
    own and unblocks them. A signal sent in between is then delivered to the worker's own disposition
    instead of being lost (a worker that missed its SIGTERM would idle forever, and its pool's join with it)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def die_with_parent() -> None:
    """In a worker process: be killed when the parent dies (Linux prctl PR_SET_PDEATHSIG), so that a killed
    command never leaves workers running; SIGTERM in a worker ends it at once and SIGINT is left to the
    parent (the parent decides what to keep). Unblocks what forking_workers blocked. prctl: Linux only."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent handles it
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):
            return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


# ------------------------------------------------------------------------------------------------ locks
class _Held:
    """One lock this process holds: its file, descriptor, holders in this process, and the folders it made."""

    def __init__(self, lock: Path, fd: int, made: list[Path]):
        self.lock, self.fd, self.made, self.count, self.pid = lock, fd, made, 1, os.getpid()
        self.guards = 0  # holds by output_lock (a command's guard), which a second guard may not re-enter


_HELD: dict[str, _Held] = {}  # lock file -> held lock; re-entered by the same process (a command and its checks)
_CLAIMS: set[str] = set()  # locks taken by a check_out_* call, released by the write of that output or run_cli


def _lock_path(path: Path) -> Path:
    path = Path(os.path.realpath(path))
    return path.parent / own_name(path.name, "lock")


def _make_folders(folder: Path) -> list[Path]:
    """mkdir -p `folder`; the folders it created, deepest first (removed again if the lock is refused)."""
    made = []
    p = folder
    while not p.exists() and p != p.parent:
        made.append(p)
        p = p.parent
    folder.mkdir(parents=True, exist_ok=True)
    return made


def _remove_empty(folders: list[Path]) -> None:
    for d in folders:  # deepest first; one that now holds anything (the output itself) stays
        try:
            d.rmdir()
        except OSError:
            break


def _refused(flag: str, path: Path, who: str) -> ConfigError:
    return ConfigError(f"{flag} {path}: another process{f' (pid {who})' if who else ''} is writing it; "
                       "wait for it to finish or choose another output")


def _acquire(path: Path, flag: str, reenter: bool = True) -> _Held:
    """The exclusive lock of output `path`; if this process holds it, re-entered (a check or a writer inside the
    command that holds it) unless `reenter` is false and a guard holds it (a second command run in this process:
    refused; a claim left by a command that ended without run_cli does not count). Lockers race with a
    holder that removes the lock file on release: a locker that got the lock of a file no longer at the path
    (removed after it opened it) drops it and tries again, so two processes can never both hold `path`."""
    import fcntl

    lock = _lock_path(path)
    held = _HELD.get(str(lock))
    if held is not None and held.pid == os.getpid():
        if not reenter and held.guards:
            raise _refused(flag, path, str(held.pid))
        held.count += 1
        return held
    made = _make_folders(lock.parent)
    for _ in range(1000):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:  # its folder was removed by a refused locker that had made it: make it again
            made += [d for d in _make_folders(lock.parent) if d not in made]
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            try:
                who = os.pread(fd, 64, 0).decode(errors="replace").strip()
            except OSError:
                who = ""
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            _remove_empty(made)
            raise _refused(flag, path, who) from None
        st = os.fstat(fd)
        try:
            now = os.stat(lock)
        except FileNotFoundError:
            now = None
        if now is None or (now.st_ino, now.st_dev) != (st.st_ino, st.st_dev):
            os.close(fd)  # the holder removed this file while we opened it: lock the one at the path now
            continue
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        held = _Held(lock, fd, made)
        _HELD[str(lock)] = held
        return held
    raise ConfigError(f"{flag} {path}: could not lock it (its lock file keeps changing); try again")


def _release(held: _Held) -> None:
    """Drop one hold; the last one removes the lock file while still holding the lock (so no locker can be
    holding it), then closes it. A forked worker that inherited the lock leaves it to its parent."""
    if held.pid != os.getpid():
        return
    held.count -= 1
    if held.count > 0:
        return
    _HELD.pop(str(held.lock), None)
    try:
        held.lock.unlink(missing_ok=True)
    finally:
        os.close(held.fd)
    _remove_empty(held.made)


@contextmanager
def output_lock(path: Path, flag: str = "--out") -> Iterator[None]:
    """Hold an exclusive lock on the output `path` (file or folder) for the block; ConfigError at once if
    another process holds it (or another command of this process: a command's own checks and writers re-enter
    it). The lock file `.<name>.lock` is removed when the lock is released."""
    held = _acquire(Path(os.path.abspath(path)), flag, reenter=False)
    held.guards += 1
    try:
        yield
    finally:
        held.guards -= 1
        _release(held)


def claim(path: Path, flag: str = "--out") -> None:
    """Lock the output `path` until it is written (release_claim, called by the writers) or the command ends
    (release_claims, called by run_cli and at exit): what check_out_* take before any work, so a second writer
    of the same output is refused for the whole command."""
    key = str(_lock_path(Path(os.path.abspath(path))))
    if key in _CLAIMS and key in _HELD:
        return
    _acquire(Path(os.path.abspath(path)), flag)
    _CLAIMS.add(key)


def release_claim(path: Path) -> None:
    """Release the claim on `path` (its output is written, or the check that took it failed)."""
    key = str(_lock_path(Path(os.path.abspath(path))))
    if key in _CLAIMS:
        _CLAIMS.discard(key)
        held = _HELD.get(key)
        if held is not None:
            _release(held)


def release_claims() -> None:
    """Release every claim this process still holds (the command ended, written or not)."""
    for key in list(_CLAIMS):
        _CLAIMS.discard(key)
        held = _HELD.get(key)
        if held is not None:
            _release(held)


atexit.register(release_claims)


# ------------------------------------------------------------------------------------------------ tracked
def is_tracked(path: Path) -> bool:
    """Whether git tracks the file `path` (or, for a folder, any file under it): `git ls-files`, a few ms.
    False where git is missing or `path` is outside a git checkout."""
    p = Path(os.path.abspath(path))
    d = p if p.is_dir() else p.parent
    while not d.is_dir() and d != d.parent:
        d = d.parent
    try:
        r = subprocess.run(["git", "-C", str(d), "ls-files", "-z", "--", str(p)], capture_output=True, timeout=20,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0 and bool(r.stdout.strip(b"\0"))


# ------------------------------------------------------------------------------------------------ temporaries
@contextmanager
def temp_dir(prefix: str = "hybridspec-") -> Iterator[Path]:
    """A private temporary folder (mkdtemp: 0700) removed when the block ends, whatever ends it (an error,
    Ctrl-C, SIGTERM through termination_as_interrupt)."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ own names
# Every name this layer gives its temporaries, journals and locks carries a tag of its own: the first 12 hex digits of
# sha256(_OWN_KEY, name, pid, kind). A leftover is removed, and an entry is left out of a carried-over folder, only
# when its tag matches: a user's `.report.2023.old`, `.session.lock` or a folder `.D.99999.tmp` never does (one chance
# in 2**48), so nothing of the user's is taken for the layer's own, whatever its name.
_OWN_KEY = b"hybridspec output layer, own names v1"
_PID_KINDS = ("tmp", "old", "part", "jtmp", "commit")  # one per writing process: .<name>.<pid>.<tag>.<kind>
_FIXED_KINDS = ("lock", "swap")  # one per output, whoever writes it: .<name>.<tag>.<kind>
_OWN_PID = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.(?P<tag>[0-9a-f]{12})\.(?P<kind>tmp|old|part|jtmp|commit)$")
_OWN_FIXED = re.compile(r"^\.(?P<name>.+)\.(?P<tag>[0-9a-f]{12})\.(?P<kind>lock|swap)$")


def _tag(name: str, pid: int | None, kind: str) -> str:
    parts = [_OWN_KEY, os.fsencode(name), str(pid).encode(), kind.encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:12]


def own_name(name: str, kind: str, pid: int | None = None) -> str:
    """The name this layer gives its `kind` of entry for the output `name`: `.<name>.<pid>.<tag>.<kind>` for a
    temporary or journal of one process (pid: this one by default), `.<name>.<tag>.<kind>` for a lock or swap
    journal (one per output)."""
    if kind in _FIXED_KINDS:
        return f".{name}.{_tag(name, None, kind)}.{kind}"
    if kind not in _PID_KINDS:
        raise ValueError(f"no such kind of the layer's own entries: {kind}")
    pid = os.getpid() if pid is None else pid
    return f".{name}.{pid}.{_tag(name, pid, kind)}.{kind}"


def own_path(path: Path, kind: str) -> Path:
    """`path`'s sibling named own_name(path.name, kind): where a writer puts its temporary of `path`."""
    path = Path(path)
    return path.with_name(own_name(path.name, kind))


def _own(name: str) -> dict | None:
    """The output name, pid (None for a lock or swap journal) and kind of one of this layer's own entries; None
    for any other name (the tag must match: a name that only looks like one is the user's)."""
    m = _OWN_PID.match(name)
    if m and m["tag"] == _tag(m["name"], int(m["pid"]), m["kind"]):
        return {"name": m["name"], "pid": int(m["pid"]), "kind": m["kind"]}
    m = _OWN_FIXED.match(name)
    if m and m["tag"] == _tag(m["name"], None, m["kind"]):
        return {"name": m["name"], "pid": None, "kind": m["kind"]}
    return None


def _leftover(name: str) -> dict | None:
    """_own(name) when it is a temporary of a process (what a killed writer leaves), else None."""
    own = _own(name)
    return own if own is not None and own["kind"] in ("tmp", "old", "part", "jtmp") else None


# ------------------------------------------------------------------------------------------------ leftovers


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_leftovers(path: Path) -> list[Path]:
    """Remove `.<name>.<pid>.tmp|old|part` siblings of `path` whose process is gone (an earlier run that was
    killed), after `recover` has finished any committed swap. Returns what was removed."""
    path = Path(os.path.abspath(path))
    recover(path.parent)
    gone = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return gone
    for e in entries:
        m = _leftover(e.name)
        if not m or m["name"] != path.name or _alive(m["pid"]):
            continue
        p = Path(e.path)
        if e.is_dir(follow_symlinks=False):
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        gone.append(p)
    return gone


# ------------------------------------------------------------------------------------------------ swaps
_RENAME_EXCHANGE = 2
_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def _renameat2(a: Path, b: Path, flags: int) -> bool:
    """renameat2(a, b, flags); False where the system has no renameat2 (or the file system refuses it)."""
    if not sys.platform.startswith("linux") or os.environ.get("HYBRIDSPEC_NO_RENAMEAT2"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EPERM, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _journal_write(path: Path, data: dict) -> None:
    tmp = own_path(path, "jtmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def swap_dir(new: Path, path: Path) -> None:
    """Put the filled folder `new` in the place of `path` (a sibling), atomically; an older `path` is removed
    afterwards. A kill at any moment leaves `path` old or new (via `recover` where the journal is used)."""
    new, path = Path(os.path.abspath(new)), Path(os.path.abspath(path))
    if path.is_dir() and not path.is_symlink():
        if _renameat2(new, path, _RENAME_EXCHANGE):
            shutil.rmtree(new, ignore_errors=True)  # `new` now holds the old folder
            return
        old = own_path(path, "old")
        journal = path.with_name(own_name(path.name, "swap"))
        _journal_write(journal, {"path": path.name, "new": new.name, "old": old.name})
        os.replace(path, old)
        os.replace(new, path)
        journal.unlink()
        shutil.rmtree(old, ignore_errors=True)
        return
    if path.exists() or path.is_symlink():
        raise ConfigError(f"{path}: exists and is not a folder")
    if not _renameat2(new, path, _RENAME_NOREPLACE):
        os.rename(new, path)


def _carry_over(src: Path, dst: Path, keep) -> None:
    """Hard-link (copy where links fail) into `dst` the entries of folder `src` that `dst` does not hold: every
    folder, and the files for which keep(name) (a file the command no longer writes may be dropped; a folder is
    never the command's to drop)."""
    for e in os.scandir(src):
        if os.path.lexists(dst / e.name) or is_internal(e.name):
            continue
        if not keep(e.name) and not e.is_dir(follow_symlinks=False):
            continue
        s, d = Path(e.path), dst / e.name
        if e.is_dir(follow_symlinks=False):
            shutil.copytree(s, d, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(s, d)


def refuse_in_the_way(folder: Path, names, what: str = "") -> None:
    """ConfigError when an entry of `folder` named like a file the command writes (`names`) is a folder (not a
    link), or like a folder it writes is not one: the user's, which --force never replaces (it replaces files
    the command writes, nothing else)."""
    for name, is_dir in names:
        try:
            st = os.lstat(Path(folder) / name)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) != is_dir:
            found = "a folder" if stat.S_ISDIR(st.st_mode) else "a file"
            raise ConfigError(f"{what + ': ' if what else ''}{Path(folder) / name} is {found} this command does "
                              f"not write (it writes {'a folder' if is_dir else 'a file'} of that name); move it "
                              "away or choose another folder")


def _link_or_copy(s, d) -> None:
    try:
        os.link(s, d, follow_symlinks=False)
    except OSError:
        shutil.copy2(s, d, follow_symlinks=False)


def is_internal(name: str) -> bool:
    """Whether an entry of an output folder is this layer's own bookkeeping (a lock, a journal, a temporary),
    proved by the tag in its name (own_name): a user's `poetry.lock`, `.notes`, `.session.lock` or
    `.draft.7.tmp` is not."""
    return _own(name) is not None


def _not_internal(name: str) -> bool:
    return not is_internal(name)


@contextmanager
def atomic_dir(path: Path, keep=None, flag: str = "--out") -> Iterator[Path]:
    """Write a folder whole or not at all: yields a temporary sibling to fill; on success it takes the place
    of `path` (swap_dir), on failure it is removed and `path` is left as it was. `path` is resolve_out's
    (links followed; the working folder, home, root and their ancestors refused) and locked for the block.
    Leftovers of earlier killed runs beside `path` are cleaned first. Every entry of an existing `path` that
    the block did not write is carried into the new folder (hard links), so only the command's own files are
    replaced; `keep(name)` narrows what is carried (an earlier output the command no longer writes: dropped)."""
    path = resolve_out(path, flag)
    keep = keep or _not_internal
    held = _acquire(path, flag)  # re-entered: the command's out_guard or check_out_dir holds it already
    try:
        clean_leftovers(path)
        tmp = own_path(path, "tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            yield tmp
            if path.is_dir():
                refuse_in_the_way(path, [(e.name, e.is_dir(follow_symlinks=False)) for e in os.scandir(tmp)],
                                  f"{flag} {path}")
                _carry_over(path, tmp, keep)
                shutil.copystat(path, tmp)  # the folder keeps its mode (a private results folder stays private)
            swap_dir(tmp, path)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if exc.filename is None and exc.errno is not None:  # a full disk mid-write: name the output
                raise type(exc)(exc.errno, exc.strerror or os.strerror(exc.errno), str(path)) from None
            raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        _release(held)
        release_claim(path)


# ------------------------------------------------------------------------------------------------ units
def commit_files(folder: Path, files: dict[str, bytes | str], unit: str = "commit") -> list[Path]:
    """Write `files` (name -> content) into `folder` as one unit: a reader (after `recover`) sees all the
    old files or all the new ones. Returns the paths written."""
    folder = Path(folder)
    try:
        _commit_files(folder, files, unit)
    finally:
        for name in files:
            release_claim(folder / name)
    return [folder / n for n in files]


def _commit_files(folder: Path, files: dict[str, bytes | str], unit: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    recover(folder)
    refuse_in_the_way(folder, [(n, False) for n in files])
    pid = os.getpid()
    tmps = {}
    where = folder  # what a full disk names: the file being written, else the folder
    try:
        for name, data in files.items():
            where = folder / name
            tmp = folder / own_name(name, "part", pid)
            with open(tmp, "wb") as f:
                f.write(data.encode() if isinstance(data, str) else data)
                f.flush()
                os.fsync(f.fileno())
            tmps[name] = tmp.name
        where = folder
        journal = folder / own_name(unit, "commit", pid)
        _journal_write(journal, {"files": tmps})
    except BaseException as exc:
        for t in tmps.values():
            (folder / t).unlink(missing_ok=True)
        for name in files:  # the one being written when it failed
            (folder / own_name(name, "part", pid)).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
            raise type(exc)(exc.errno, exc.strerror or os.strerror(exc.errno), str(where)) from None
        raise
    _roll_forward(folder, journal)


def _roll_forward(folder: Path, journal: Path) -> None:
    try:
        data = json.loads(journal.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(data, dict):
        return
    if isinstance(data.get("files"), dict):
        for name, tmp in data["files"].items():
            if not isinstance(tmp, str) or (_own(tmp) or {}).get("kind") != "part" or _own(tmp)["name"] != name:
                continue  # only a temporary this layer named for that file is ever moved
            try:
                os.replace(folder / tmp, folder / name)
            except FileNotFoundError:  # already renamed (by us before a kill, or by a concurrent recover)
                pass
    elif "new" in data:  # a folder swap of the journal fallback
        if not all(isinstance(data.get(k), str) for k in ("path", "new", "old")) or \
                (_own(data["new"]) or {}).get("kind") != "tmp" or (_own(data["old"]) or {}).get("kind") != "old":
            return
        path, new, old = folder / data["path"], folder / data["new"], folder / data["old"]
        if new.is_dir():
            if path.is_dir() and not old.exists():
                os.replace(path, old)
            if not path.exists():
                os.replace(new, path)
        if old.is_dir() and path.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    journal.unlink(missing_ok=True)


def recover(folder: Path) -> None:
    """Finish what a killed writer committed in `folder` (journals `.*.commit`, `.*.swap`): roll forward.
    Temporaries of a unit never committed are removed by clean_leftovers / the next writer."""
    folder = Path(folder)
    try:
        entries = [e for e in os.scandir(folder) if (_own(e.name) or {}).get("kind") in ("commit", "swap")
                   and e.is_file(follow_symlinks=False)]
    except OSError:
        return
    for e in entries:
        _roll_forward(folder, Path(e.path))


def clean_dead(folder: Path) -> list[Path]:
    """In `folder`: finish committed units (`recover`), then remove every `.<name>.<pid>.tmp|old|part`
    temporary whose process is gone (a killed writer's uncommitted files). Returns what was removed."""
    folder = Path(folder)
    recover(folder)
    gone = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return gone
    for e in entries:
        m = _leftover(e.name)
        if m and not _alive(m["pid"]):
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path, ignore_errors=True)
            else:
                Path(e.path).unlink(missing_ok=True)
            gone.append(Path(e.path))
    return gone


# ------------------------------------------------------------------------------------------------ out paths
def resolve_out(path: Path, flag: str = "--out") -> Path:
    """The real folder an output path names, checked before any work: a symlink is followed (the link keeps
    pointing at the new result); `.`, `..`, the working folder, an ancestor of it, or the file system root
    are refused (replacing them would move the user's files away)."""
    p = Path(path)
    if p.name in ("", ".", "..") or str(p).rstrip("/") in ("", ".", ".."):
        raise ConfigError(f"{flag} {path}: names the current folder or its parent; give a folder name, e.g. {flag} out/run")
    real = Path(os.path.realpath(p))
    cwd = Path(os.path.realpath(os.getcwd()))
    home = Path.home().resolve()
    if real == cwd or real in cwd.parents or real == Path(real.anchor) or real == home or real in home.parents:
        raise ConfigError(f"{flag} {path}: resolves to {real}, the working folder, your home or one of their "
                          "ancestors; give a folder of its own, e.g. {flag} out/run".replace("{flag}", flag))
    for up in real.parents:  # an output under a file: one line naming it, before the lock tries to make folders
        if up.exists():
            if not up.is_dir():
                raise ConfigError(f"{flag} {path}: {up} is a file, not a folder")
            break
    return real


@contextmanager
def out_guard(path, flag: str = "--out") -> Iterator[Path | None]:
    """For a command writing the output `path` (None: no output): before any work, the real path (resolve_out:
    links followed, the working folder and its ancestors refused), held under output_lock for the block so a
    second writer is refused rather than merged. Check the path's content inside the block, under the lock."""
    if path is None:
        yield None
        return
    real = resolve_out(path, flag)
    with output_lock(real, flag):
        yield real


def private_tempdir(prefix: str = "hybridspec-") -> Path:
    """A fresh folder only this user can open (mkdtemp: 0700, unpredictable name), for when caching is off; it
    lives as long as the process and is removed at its exit (a block's scratch: temp_dir)."""
    import multiprocessing.util

    d = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, d, True)
    # a forked pool worker leaves through os._exit, which skips atexit; multiprocessing runs its finalizers there
    # (and only in the process that registered them)
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(d, True), exitpriority=0)
    return d


__all__ = ["cache_root", "private_dir", "private_tempdir", "termination_as_interrupt", "forking_workers", "die_with_parent", "output_lock",
           "claim", "release_claim", "release_claims", "is_tracked", "temp_dir", "clean_leftovers", "swap_dir", "own_name", "own_path", "is_internal", "refuse_in_the_way", "atomic_dir", "commit_files", "recover", "clean_dead", "resolve_out", "out_guard", "file_sha256"]


def file_sha256(path: Path) -> str:
    """The sha256 hex digest of a file's bytes, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()
