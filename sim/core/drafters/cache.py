"""Draft tables cached on disk by content hash, so a repeated run skips the table build.

`cached_draft_tables` takes exactly the inputs of `build_draft_tables` and hashes everything that
determines its result: every request's id, token ids (or lengths and workload, for length-only requests),
and temperature; the n-gram config; the drafter profile (every field); the calibrator's weights and config;
the seed; recorded drafts (every array); the source of the code that builds tables (sim/core/drafters/*.py,
sim/core/trace/*.py), the numpy and scipy versions; and, when a request is length-only, the bundled traces
its statistical profile is drawn from. A hit loads the tables from `<cache dir>/draft-tables/<sha256>.npz`.

Cache dir: sim.infra.fsio.cache_root ($HYBRIDSPEC_CACHE_DIR if set, else $XDG_CACHE_HOME/hybridspec, else
~/.cache/hybridspec; HYBRIDSPEC_CACHE_DIR=off (or 0, none) disables every cache). Each file stores its own
key (`key` array): a file whose key differs from its name's (copied or planted under another key) is
refused and rebuilt with a warning, never served. Files are written atomically (a temporary file
in the same folder, then os.replace), so a concurrent reader sees the old file or the new one, never half
of one. A file that cannot be read back whole (truncated, bit flip: the zip's CRC-32 per array, a missing
or mis-shaped array) is rebuilt with a warning and replaced; it is never served.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import warnings
from dataclasses import fields
from pathlib import Path

import numpy as np

from sim.core.drafters.tables import REPO, DraftTables, build_draft_tables

ENV = "HYBRIDSPEC_CACHE_DIR"
FORMAT = "draft-tables/2"  # /2: the key is stored inside
_ARRAYS = tuple(f.name for f in fields(DraftTables) if f.name != "replayed_requests")
_CODE = ("sim/core/drafters", "sim/core/trace")


def cache_dir() -> Path | None:
    """The cache folder, or None when caching is off (sim.infra.fsio.cache_root: one setting for every cache)."""
    from sim.infra.fsio import cache_root

    return cache_root()


def _code_digest() -> str:
    h = hashlib.sha256()
    for folder in _CODE:
        for p in sorted((REPO / folder).glob("*.py")):
            h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def table_key(requests: list, ngram_cfg, profile, calibrator, seed: int, recorded: dict | None,
              synthetic: tuple[float, ...] | None = None) -> str:
    """sha256 (hex) of everything that determines build_draft_tables' result."""
    import scipy

    h = hashlib.sha256()

    def put(*parts) -> None:
        for x in parts:
            if isinstance(x, np.ndarray):
                a = np.ascontiguousarray(x)
                h.update(f"<{a.dtype.str}{a.shape}>".encode())
                h.update(a.tobytes())
            else:
                h.update(repr(x).encode())
            h.update(b"\x1f")

    put(FORMAT, np.__version__, scipy.__version__, _code_digest())
    put(ngram_cfg, profile, int(seed), calibrator.cfg, np.asarray(calibrator.weights, dtype=np.float64))
    length_only = False
    put(len(requests))
    for r in requests:
        put(r.id, float(r.temperature), int(r.prompt_len), int(r.output_len))
        if r.output_ids is None:
            length_only = True
            put(None, r.workload)
        else:
            put(np.asarray(r.prompt_ids), np.asarray(r.output_ids))
    if length_only:  # the statistical profile is built from the bundled traces
        for name in ("codeedit.jsonl", "chat.jsonl"):
            p = REPO / "traces" / name
            put(name, hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None)
    if recorded is not None:
        put(len(recorded))
        for rid in sorted(recorded):
            ch = recorded[rid]
            put(rid, np.asarray(ch.conf), np.asarray(ch.acc_len))
            if ch.chosen is not None:  # absent otherwise: keys of sidecars without decisions stay the same
                put("decisions", np.asarray(ch.chosen), np.asarray(ch.skipped))
    if synthetic is not None:  # absent otherwise: every key made before it stays the same
        put("synthetic", tuple(float(r) for r in synthetic))
    return h.hexdigest()


def _load(path: Path, key: str) -> DraftTables:
    with np.load(path, allow_pickle=False) as z:
        if str(z["format"]) != FORMAT:
            raise ValueError(f"format {z['format']!r}, expected {FORMAT!r}")
        if "key" not in z or str(z["key"]) != key:
            raise ValueError("it holds the tables of other inputs (its stored key differs from its name's)")
        cols = {k: z[k] for k in _ARRAYS}  # reads every member whole, so the zip CRC is checked
        replayed = int(z["replayed_requests"])
    n = len(cols["out_len"])
    rows = int(cols["offsets"][-1]) if len(cols["offsets"]) else -1
    if len(cols["offsets"]) != n + 1 or any(len(cols[k]) != rows for k in ("ng_len", "ng_conf", "m_conf", "m_tok")):
        raise ValueError("inconsistent table shapes")
    return DraftTables(replayed_requests=replayed, **cols)


def _save(path: Path, tables: DraftTables, key: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, format=np.asarray(FORMAT), key=np.asarray(key), replayed_requests=np.asarray(tables.replayed_requests),
                     **{k: getattr(tables, k) for k in _ARRAYS})
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def cached_draft_tables(requests: list, ngram_cfg, profile, calibrator, seed: int = 0, progress: bool = False,
                        recorded: dict | None = None, synthetic: tuple[float, ...] | None = None) -> DraftTables:
    """build_draft_tables(...), served from the on-disk cache when the same inputs were built before."""
    folder = cache_dir()
    if folder is None:
        return build_draft_tables(requests, ngram_cfg, profile, calibrator, seed=seed, progress=progress,
                                  recorded=recorded, synthetic=synthetic)
    key = table_key(requests, ngram_cfg, profile, calibrator, seed, recorded, synthetic)
    path = folder / "draft-tables" / f"{key}.npz"
    if path.exists():
        try:
            return _load(path, key)
        except Exception as exc:  # noqa: BLE001 -- any unreadable file is rebuilt, never served
            warnings.warn(f"draft-table cache {path} is unreadable ({type(exc).__name__}: {exc}); rebuilding it",
                          RuntimeWarning, stacklevel=2)
    tables = build_draft_tables(requests, ngram_cfg, profile, calibrator, seed=seed, progress=progress,
                                recorded=recorded, synthetic=synthetic)
    try:
        _save(path, tables, key)
    except OSError as exc:  # a read-only or full disk: run without the cache
        warnings.warn(f"could not write the draft-table cache {path} ({exc})", RuntimeWarning, stacklevel=2)
    return tables
