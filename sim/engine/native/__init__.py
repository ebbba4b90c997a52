"""Native (C) forms of policies and of the engine step for the simulator, compiled on first use and cached
on disk (hybrid_price.c: the policy forms, sim/engine/policy_fast.py; engine_step.c: the engine's per-step
bookkeeping, sim/engine/native_step.py).

The C source sits next to this file; `load()` compiles it with the system C compiler (`$CC`, else `cc`)
into `<cache dir>/native/<name>-<sha256 of source, flags and compiler>.so` (written atomically; the cache
folder is sim.infra.fsio.cache_root, HYBRIDSPEC_CACHE_DIR) and opens it with cffi. Nothing foreign is ever
loaded: the `native` folder is private (created 0700, checked to be this user's and closed to others before
use; with the cache off, a fresh private folder removed at exit, never a shared temporary path), the
library's sha256 is recorded beside it at build (`.so.sha256`) and checked on the bytes before the library
is opened; a library that does not match its record (planted, replaced, damaged) is refused with one
warning line and rebuilt. Where
there is no compiler or no cffi, `load()` returns None and the simulator runs the torch definitions
(slower, same results). Flags: -O2 -ffp-contract=off and no fast-math, so each float operation is one
IEEE single-precision operation, as in torch's elementwise kernels (sim/engine/policy_fast.py);
HYBRIDSPEC_NATIVE_CFLAGS adds flags (whitespace-separated; part of the cache key), e.g. -DHP_NO_CLONES,
which builds hybrid_price.c without its AVX2 clones.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
FLAGS = ["-O2", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-std=c99"]


def _flags() -> list[str]:
    """FLAGS and HYBRIDSPEC_NATIVE_CFLAGS's extra flags."""
    return FLAGS + os.environ.get("HYBRIDSPEC_NATIVE_CFLAGS", "").split()


# The exported functions: every definition at column 0 that is not `static`; cffi gets their prototypes
# from the source itself, so a signature is written once. Likewise the struct types they take
# (`typedef struct { ... } name;` at column 0).
_EXPORTED = re.compile(r"^(?:void|int64_t|double|float) \w+\([^)]*\)", re.M)
_STRUCTS = re.compile(r"^typedef struct \{[^}]*\} \w+;", re.M)


def cdef(source: str) -> str:
    """The cffi declarations of a C source's struct types and exported functions (their definitions' heads,
    as prototypes)."""
    return "".join(m.group(0) + "\n" for m in _STRUCTS.finditer(source)) + "".join(
        m.group(0) + ";\n" for m in _EXPORTED.finditer(source))


_LIBS: dict = {}


def compile_library(src: Path, out: Path, cc: str) -> None:
    """Compile the C source `src` into the shared library `out` with `cc` and FLAGS, written atomically,
    and record its sha256 in `out`.sha256 (RuntimeError naming the compiler's last line on failure)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.stem + ".", suffix=".so.tmp", dir=out.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, *_flags(), "-o", tmp, str(src)], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            err = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise RuntimeError(f"{cc} failed on {src.name} (exit {done.returncode}): {err}")
        digest = hashlib.sha256(Path(tmp).read_bytes()).hexdigest()
        os.replace(tmp, out)
        _record(out).write_text(digest + "\n")  # after the library: a kill between leaves it unrecorded (rebuilt)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _record(so: Path) -> Path:
    return so.with_name(so.name + ".sha256")


@contextlib.contextmanager
def _build_lock(so: Path):
    """An exclusive, blocking lock on `so`'s build in its private folder: without it a second process could
    see a library renamed into place before its record was written, take it for a planted one and delete it."""
    import fcntl

    fd = os.open(so.with_name(so.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def verified(so: Path) -> bool:
    """Whether `so` exists and its bytes match the sha256 recorded when it was built here."""
    from sim.infra.errors import ConfigError
    from sim.infra.inputs import SIDECAR, read_text

    try:
        want = read_text(_record(so), SIDECAR).strip()  # capped: a digest, never a planted gigabyte
        got = hashlib.sha256(so.read_bytes()).hexdigest()
    except (OSError, ConfigError):
        return False
    return len(want) == 64 and got == want


_PRIVATE: list[Path] = []


def native_dir() -> Path:
    """The private folder the libraries are built in: <cache dir>/native, or, with the cache off, a fresh
    folder of this process (0700, unpredictable name) removed at exit."""
    from sim.infra.fsio import cache_root, private_dir, private_tempdir

    root = cache_root()
    if root is not None:
        return private_dir(root / "native")
    if not _PRIVATE:
        _PRIVATE.append(private_tempdir("hybridspec-native-"))  # removed at exit, by workers too
    return private_dir(_PRIVATE[0])


def library_path(name: str, cc: str | None = None) -> Path:
    """Where the library of `name`.c is built: native_dir()/<name>-<sha256 of source, flags, compiler>.so."""
    cc = cc or os.environ.get("CC") or "cc"
    src = HERE / f"{name}.c"
    ver = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256(src.read_bytes() + " ".join(_flags()).encode() + ver.encode()).hexdigest()[:24]
    return native_dir() / f"{name}-{key}.so"


def load(name: str = "hybrid_price"):
    """(ffi, lib) of the compiled C source `name`.c, or None where it cannot be built or opened."""
    if name in _LIBS:
        return _LIBS[name]
    lib = None
    try:
        import cffi

        cc = os.environ.get("CC") or "cc"
        if shutil.which(cc) is None:
            raise RuntimeError(f"no C compiler ({cc})")
        src = HERE / f"{name}.c"
        so = library_path(name, cc)
        with _build_lock(so):  # processes starting together (sweep workers, tests) build and check one at a time
            if so.exists() and not verified(so):
                why = ("it does not match the sha256 recorded when it was built (planted, replaced or damaged)"
                       if _record(so).exists() else "it has no build record (built by an older hybridspec, or planted)")
                warnings.warn(f"refusing native library {so}: {why}; rebuilding it", RuntimeWarning, stacklevel=2)
                so.unlink()
            if not so.exists():
                compile_library(src, so, cc)
            if not verified(so):
                raise RuntimeError(f"{so} changed between its build and its check")
        ffi = cffi.FFI()
        ffi.cdef(cdef(src.read_text()))
        lib = (ffi, ffi.dlopen(str(so)))
    except Exception as exc:  # noqa: BLE001 -- any failure: the simulator runs the torch definitions
        warnings.warn(f"native policy forms unavailable ({type(exc).__name__}: {exc}); the simulator runs the "
                      "torch definitions (slower, same results)", RuntimeWarning, stacklevel=2)
    _LIBS[name] = lib
    return lib
