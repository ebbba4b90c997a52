"""Parameter sweeps: run a grid of simulator cells in parallel and collect one tidy results table.

    python -m sim.sweep --trace traces/codeedit.jsonl --policy adaptive --policy hybrid-price \
        --batch-size 4 --batch-size 128 --ngram-k 16 --ngram-k 32 --out out/sweep
    python -m sim.sweep --grid my_grid.toml --workers 2
    python -m sim.sweep --preset paper --out out/paper        # the grid behind reports/paper.md
    python -m sim.sweep ... --ray [ADDRESS]                    # run the cells on Ray (pip install -e ".[ray]")

A *cell* is one simulation: (trace, model, gpu, cost, drafter, ngram_k, temperature, seed, limit, sample) -- the
*prepare key*, which fixes the draft tables -- plus (policy, batch_size, rate, kv_capacity_tokens,
max_num_batched_tokens). Every combination of the grid's lists is a cell. Cells are sent to the workers in
prepare-key order and each worker process keeps the draft tables it built, so the tables of a key are
built at most once per worker, however many policies and batch sizes run on them.

Outputs in --out (default out/sweep): results.parquet and results.csv (a row per cell: the grid keys,
`status` 'ok'/'error', `error`, `cell_id`, then sim.api.run's summary-row keys and `speedup_vs_baseline`),
requests.parquet/.csv (per-request prompt length, output length and decode time of every ok cell, for
the context-length view of `python -m sim.report`), grid.json, and cells/<cell_id>.json: the cache. A
cell's id hashes its config, the content of every file-valued input (trace, recorded drafts, --drafter,
--calibrator and --gpu files), the simulator's code and data (sim/, models/, and the folder
HYBRIDSPEC_MODELS_DIR points to when set), so
an interrupted sweep resumes where it stopped and a code change never serves stale numbers. Each cell
file carries a schema version and an unkeyed checksum of its content (against accidents, not forgery): a
partial, edited or foreign file is recomputed
with a warning, never served; the closing line counts only the cells that finished. A failing cell
is recorded with its error message and does not stop the others (failures are not cached: a rerun retries
them). Grid file (TOML): top-level keys give lists (or scalars) for the whole grid; optional [[grid]] tables
are sub-grids that override them, the sweep being the union of the sub-grids. See docs/sweeps.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
import time
import tomllib
from collections import OrderedDict
from dataclasses import asdict, dataclass
from itertools import product
from pathlib import Path

import pandas as pd

from sim.api.setups import join_setups, setup_values
from sim.core.config import PLUGIN_SETTINGS, WITH_SUFFIX
from sim.infra.cli import ArgumentParser, check_in_file, check_out_dir, finite_float, int_at_least
from sim.infra.fsio import clean_dead, commit_files, out_guard, own_path, refuse_in_the_way
from sim.infra.pool import one_thread, run_local
from sim.infra.errors import ConfigError
from sim.infra import paths

ROOT = paths.REPO
# The grid keys, their defaults, types and rules come from sim/core/config.py (one declaration per setting).
# PREP_KEYS fix the draft tables; RUN_KEYS vary per simulation. Order = column order of the results table.
from sim.core.config import BASELINE, FLOAT_KEYS as _FLOAT_KEYS, GRID_KEYS, INT_KEYS as _INT_KEYS  # noqa: E402
from sim.core.config import NONE_OK, PREP_KEYS, RUN_KEYS  # noqa: E402,F401


def _defaults() -> dict[str, list]:
    from sim.core.config import defaults

    return {k: (list(v) if isinstance(v, list) else [v]) for k in GRID_KEYS for v in [defaults(k)]}



# Preset grids (the same structure as a TOML grid file).
PAPER_BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
PAPER_POLICIES = ["adaptive", "hybrid", "hybrid-price", "hybrid-tree", "ngram-first", "ngram-threshold", "oracle",
                  "model-fixed:7", "ngram-fixed:32", "none", "vllm-ngram:32", *PLUGIN_SETTINGS]
# every verdict tier, the plugin's settings the verdict weighs included (sim/core/config.py PLUGIN_SETTINGS)
# run apart with the suffix drafter (PRESETS["paper"]): vLLM's suffix decoding, and vLLM main's suffix-adaptive (the
# tier "vLLM main, unreleased"; vLLM main's ngram-mtp needs a target with MTP layers, which qwen3-8b has not)
PAPER_SUFFIX_POLICIES = ["suffix", "suffix-adaptive"]
PRESETS: dict[str, dict] = {
    # reports/paper.md and reports/index.html: the bundled workloads (code editing as the copy-heavy bound and
    # with model-shaped outputs, chat) at temperature 0, qwen3-8b on H100.
    # `suffix` (vLLM's suffix decoding) and vLLM main's `suffix-adaptive` run with the live suffix drafter enabled,
    # apart: enabling it for every policy would hand the hybrids' over-drafters forms a third chain (sim.report
    # joins their rows to the workload).
    "paper": {"trace": ["traces/codeedit.jsonl", "traces/codeedit-model.jsonl", "traces/chat.jsonl"],
              "model": ["qwen3-8b"], "gpu": ["h100-sxm"], "temperature": [0.0], "batch_size": PAPER_BATCH_SIZES,
              "grid": [{"policy": PAPER_POLICIES}, {"policy": PAPER_SUFFIX_POLICIES, "drafters": [WITH_SUFFIX]}]},
    # Tuning of the hybrids' knobs (docs/simulator.md, "Knobs and where they come from"): general text only,
    # a seeded sample, never the traces the reports evaluate: the n-gram margin (shared by hybrid and
    # hybrid-price; default 1) over {0, 0.25, 0.5, 1, 1.5, 2}, the n-gram chain length k over {16, 32, 64},
    # and hybrid's n-gram forecast for its skip decision (avg, min, mean, stale).
    "tune": {"trace": ["traces/general.jsonl"], "sample": [400], "temperature": [0.0], "batch_size": [1, 4, 32, 128],
             "grid": [{"policy": ["hybrid:margin=0", "hybrid:margin=0.25", "hybrid:margin=0.5", "hybrid",
                                  "hybrid:margin=1.5", "hybrid:margin=2"], "ngram_k": [32]},
                      {"policy": ["hybrid"], "ngram_k": [16, 64]},
                      {"policy": ["hybrid:forecast=min", "hybrid:forecast=mean", "hybrid:forecast=stale"],
                       "ngram_k": [32]}]},
    # a one-minute smoke test of the whole pipeline
    "smoke": {"trace": ["traces/codeedit.jsonl", "traces/chat.jsonl"], "limit": [24], "temperature": [0.0],
              "policy": ["adaptive", "hybrid-price", "oracle"], "batch_size": [4, 16]},
}


# ------------------------------------------------------------------------------------------------ cells
@dataclass(frozen=True)
class Cell:
    """One simulation: a value of every grid key (sim/core/config.py's fields with a `grid` role)."""

    trace: str
    limit: int | None
    sample: int | None
    seed: int
    temperature: float | None
    model: str
    gpu: str
    cost: str
    drafter: str
    drafts: str | None
    calibrator: str
    ngram_k: int
    drafters: str
    drafter_config: str | None
    policy: str
    batch_size: int
    rate: float | None
    kv_capacity_tokens: int | None
    max_num_batched_tokens: int

    def prep_key(self) -> tuple:
        return tuple(getattr(self, k) for k in PREP_KEYS)

    def setup(self):
        from sim.api.run import SimSetup

        return SimSetup(**{k: getattr(self, k) for k in PREP_KEYS + RUN_KEYS[2:]})


assert tuple(f.name for f in dataclasses.fields(Cell)) == GRID_KEYS, "Cell must list sim/core/config.py's grid keys"


def _coerce(key: str, v):
    if key not in GRID_KEYS:
        raise ConfigError(f"unknown grid key '{key}' (valid: {', '.join(GRID_KEYS)})")
    if v is None or (isinstance(v, str) and v.lower() in ("none", "default", "") and key != "policy"):  # 'none' is a policy
        if key in NONE_OK:
            return None
        raise ConfigError(f"grid key '{key}' needs a value")
    if isinstance(v, bool):  # TOML true/false is not a number (Python would read it as 1/0)
        raise ConfigError(f"grid key '{key}': bad value {v!r} (true/false is not a number)")
    try:
        if key in _INT_KEYS:
            if isinstance(v, float) and not v.is_integer():
                raise ValueError
            return int(v)
        if key in _FLOAT_KEYS:
            if key == "rate" and isinstance(v, str):  # the command line's parser: 'inf' (vLLM's: all at t=0) is None
                from sim.core.vllm import parse_rate

                return parse_rate(v)
            return float(v)
    except (TypeError, ValueError):
        raise ConfigError(f"grid key '{key}': bad value {v!r}") from None
    if key == "model":
        from sim.core.models import llm_name

        return llm_name(str(v))  # a Hugging Face id ("Qwen/Qwen3-8B") -> the bundled name
    from sim.core.config import FIELDS

    parse = FIELDS[key].metadata["parse"]
    if parse is not None:  # the flag's own parser (drafters, drafter_config): a grid value is read as the flag is
        table = key == "drafter_config" and isinstance(v, dict)  # a TOML table: the object the flag's JSON gives
        if not (table or isinstance(v, str)):
            raise ConfigError(f"grid key '{key}': bad value {v!r} (expected a string"
                              + (", or a table such as {suffix = {max_depth = 24}}" if key == "drafter_config" else "")
                              + ")")
        try:
            return parse(v)
        except ConfigError as exc:
            raise ConfigError(f"grid key '{key}': {exc}") from None
    return str(v)


def _as_list(key: str, v) -> list:
    vals = v if isinstance(v, list) else [v]
    if not vals:
        raise ConfigError(f"grid key '{key}' has an empty list")
    return list(dict.fromkeys(_coerce(key, x) for x in vals))


def expand(grid: dict, add_baseline: bool = True) -> list[Cell]:
    """Cells of a grid: {key: value or list, ..., optional "grid": [sub-grid, ...]} -> the union of the
    sub-grids' Cartesian products (each sub-grid over the top-level keys over the defaults)."""
    top = {k: v for k, v in grid.items() if k != "grid"}
    subs = grid.get("grid") or [{}]
    if not isinstance(subs, list) or not all(isinstance(s, dict) for s in subs):
        raise ConfigError("'grid' must be an array of tables ([[grid]] in TOML)")
    cells: dict[Cell, None] = {}
    for sub in subs:
        spec = _defaults()
        for k, v in {**top, **sub}.items():
            spec[k] = _as_list(k, v)
        if add_baseline and BASELINE not in spec["policy"]:
            spec["policy"] = [BASELINE] + spec["policy"]
        for combo in product(*(spec[k] for k in GRID_KEYS)):
            cells[Cell(**dict(zip(GRID_KEYS, combo)))] = None
    return list(cells)


def validate(cells: list[Cell]) -> None:
    """Check every name up front (policies, models, GPUs, cost models, drafters, calibrators, traces) and
    the numbers, so a typo fails in a second with one line instead of in the middle of a sweep."""
    from sim.core.cost import make_cost_model
    from sim.core.drafters.calibration import NgramCalibrator
    from sim.core.drafters.model import load_drafter_profile
    from sim.core.policies import get_policy
    from sim.core.config import check
    from sim.engine.engine import EngineConfig
    from sim.core.scheduler import full_kv_need
    from sim.core.trace.loader import LIMIT_AND_SAMPLE, scan_trace

    seen: set = set()
    scanned: dict = {}  # (trace, limit) -> the longest request (tokens, a lower bound for text)
    blocks: dict = {}  # drafter -> its chain length

    def once(what, fn, *args):
        if (what, args) not in seen:
            seen.add((what, args))
            fn(*args)

    for c in cells:
        once("policy", get_policy, c.policy, c.drafters)
        once("cost", lambda cost, m, g: make_cost_model(cost, llm=m, gpu=g), c.cost, c.model, c.gpu)
        once("drafter", load_drafter_profile, c.drafter)
        once("calibrator", NgramCalibrator.load, c.calibrator)
        if c.limit is not None and c.sample is not None:
            raise ConfigError(LIMIT_AND_SAMPLE)
        for k in GRID_KEYS:  # the rules of sim/core/config.py
            check(k, getattr(c, k))
        if not Path(c.trace).is_file():
            raise ConfigError(f"trace not found: {c.trace}")
        # every line of every trace, before the first cell (untokenized: seconds for a million lines)
        key = (c.trace, None if c.sample is not None else c.limit)
        if key not in scanned:
            scanned[key] = scan_trace(*key)[1]
        if c.kv_capacity_tokens is not None:  # the engine's rule (sim.api.run.check_kv), on the longest request
            if c.drafter not in blocks:
                blocks[c.drafter] = load_drafter_profile(c.drafter).block
            bs = EngineConfig.block_size
            need = full_kv_need(scanned[key], max(blocks[c.drafter], c.ngram_k), bs)
            if need > c.kv_capacity_tokens:
                raise ConfigError(f"--kv-capacity-tokens {c.kv_capacity_tokens}: {c.trace} has a request that needs "
                                  f"at least {need} KV tokens; it could never run")
        if c.drafts is not None and not Path(c.drafts).is_file():
            raise ConfigError(f"recorded drafts not found: {c.drafts}")



_HASH_CACHE: dict = {}


def _file_digest(path: str) -> str:
    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key not in _HASH_CACHE:
        _HASH_CACHE[key] = hashlib.sha256(p.read_bytes()).hexdigest()
    return _HASH_CACHE[key]


def code_fingerprint() -> str:
    """Hash of what decides a cell's numbers: the simulator's sources (Python, and the C of its native policy
    forms) and its data files (models/). The sweep and report modules, and the setups they read results by, are left
    out (they do not change results)."""
    from sim.core.models import models_dir

    h = hashlib.sha256()
    files = sorted(p for p in (ROOT / "sim").rglob("*.py") if p.name not in ("sweep.py", "report.py", "setups.py"))
    files += sorted((ROOT / "sim").rglob("*.c"))
    files += sorted(p for p in (ROOT / "models").rglob("*") if p.is_file())
    for p in files:
        h.update(str(p.relative_to(ROOT)).encode())
        h.update(p.read_bytes())
    used = models_dir().resolve()  # HYBRIDSPEC_MODELS_DIR: the folder the names are actually read from
    if used != (ROOT / "models").resolve():
        h.update(b"models_dir\0")
        for p in sorted(q for q in used.rglob("*") if q.is_file()):
            h.update(str(p.relative_to(used)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def cell_id(cell: Cell, code: str) -> str:
    from sim.core.drafters.model import is_profile_path

    d = asdict(cell)
    d["trace_sha256"] = _file_digest(cell.trace)
    if cell.drafts:
        d["drafts_sha256"] = _file_digest(cell.drafts)
    if is_profile_path(cell.drafter):  # a profile file outside models/ (which code_fingerprint hashes)
        d["drafter_sha256"] = _file_digest(cell.drafter)
    for k, v in asdict(cell).items():  # every file-valued input by content: --calibrator FILE, --gpu TABLE, ...
        if isinstance(v, str) and k + "_sha256" not in d and Path(v).is_file():
            d[k + "_sha256"] = _file_digest(v)
    d["code"] = code
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:20]


# ------------------------------------------------------------------------------------------------ worker
_PREP_CACHE: OrderedDict = OrderedDict()
_PREP_CACHE_SIZE = 2  # draft tables kept per worker process (a few hundred MB at most for the bundled traces)


def _prepared(cell: Cell):
    from sim.api.run import prepare

    key = cell.prep_key()
    if key in _PREP_CACHE:
        _PREP_CACHE.move_to_end(key)
    else:
        try:
            _PREP_CACHE[key] = prepare(cell.setup())
        except Exception as exc:  # noqa: BLE001 -- recorded on every cell of this key
            _PREP_CACHE[key] = exc
        while len(_PREP_CACHE) > _PREP_CACHE_SIZE:
            _PREP_CACHE.popitem(last=False)
    got = _PREP_CACHE[key]
    if isinstance(got, Exception):
        raise got
    return got


def run_cell(cell: Cell) -> dict:
    """Run one cell; never raises for a cell's own failure (returns status 'error' and the message)."""
    from sim.api.run import run_one

    t0 = time.perf_counter()
    out: dict = {"cell": asdict(cell), "pid": os.getpid()}
    try:
        prep = _prepared(cell)
        prep = dataclasses.replace(prep, setup=dataclasses.replace(
            prep.setup, rate=cell.rate, kv_capacity_tokens=cell.kv_capacity_tokens,
            max_num_batched_tokens=cell.max_num_batched_tokens))
        row, res = run_one(prep, cell.policy, cell.batch_size)
        res.raise_if_lossy()  # a lossy cell is an error, never a result
        rq = res.requests
        out.update(status="ok", error="", row=row, requests={
            "prompt_len": [int(x) for x in rq["prompt_len"]], "output_len": [int(x) for x in rq["output_len"]],
            "decode_s": [None if math.isnan(x) else round(float(x), 9) for x in (rq["finish_s"] - rq["first_token_s"])],
        })
    except Exception as exc:  # noqa: BLE001 -- a failing cell must not stop the sweep
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        out.update(status="error", error=f"{type(exc).__name__}: {msg}"[:500], row={}, requests=None)
    out["cell_wall_s"] = time.perf_counter() - t0
    return out


# ------------------------------------------------------------------------------------------------ driver
def _order(cells: list[Cell]) -> list[Cell]:
    """Prepare keys in grid order; inside a key the slow cells (small batch sizes) first, so the tail of
    the sweep is made of short cells and the workers finish together."""
    keys = list(dict.fromkeys(c.prep_key() for c in cells))
    rank = {k: i for i, k in enumerate(keys)}
    return sorted(cells, key=lambda c: (rank[c.prep_key()], c.batch_size, c.policy))


CELL_SCHEMA = 1  # version of the cells/<cell_id>.json layout; a file of another version is recomputed


def _checksum(body: dict) -> str:
    """Unkeyed sha256 of the content: it catches accidents (a partial write, a hand edit, a bit flip), not
    forgery (anyone who can write cells/ can recompute it); cells/ is trusted like the rest of --out."""
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _save(cells_dir: Path, cid: str, result: dict) -> None:
    """Write a finished cell whole (temporary file + rename), with its schema version and a checksum of its
    content, so that a partial, stale or edited file is never served."""
    body = json.loads(json.dumps(dict(result, schema=CELL_SCHEMA), default=float))  # the JSON round trip
    tmp = own_path(cells_dir / f"{cid}.json", "tmp")
    try:
        tmp.write_text(json.dumps(dict(body, checksum=_checksum(body))))
        tmp.replace(cells_dir / f"{cid}.json")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_cell(path: Path, cid: str) -> tuple[dict | None, str]:
    """A cached cell, or (None, why it cannot be served): unreadable, another schema, a checksum that does
    not match its content (partial or edited), another cell's id, or not a finished ok result."""
    from sim.infra.inputs import CACHE, parse_json, read_bytes

    try:  # through the input layer: a regular file, capped (a planted gigabyte is not read), strict JSON
        d = parse_json(read_bytes(path, CACHE), str(path), finite=False)
    except (OSError, UnicodeError, ValueError, RecursionError, ConfigError) as exc:
        return None, f"unreadable ({type(exc).__name__})"
    if not isinstance(d, dict):
        return None, "not a JSON object"
    if d.get("schema") != CELL_SCHEMA:
        return None, f"schema {d.get('schema')!r}, expected {CELL_SCHEMA}"
    checksum = d.pop("checksum", None)
    if checksum != _checksum(d):
        return None, "checksum mismatch (partial or edited)"
    if d.get("cell_id") != cid:
        return None, f"holds cell {d.get('cell_id')!r}"
    if d.get("status") != "ok" or not isinstance(d.get("row"), dict) or not d["row"] \
            or not isinstance(d.get("requests"), dict):
        return None, "not a finished result"
    if d["row"].get("lossless") is not True:  # a lossy run is a simulator bug, never a result (sim.api.run refuses it)
        return None, "not a lossless result"
    return d, ""


def _run_local(todo: list[tuple[str, Cell]], workers: int, on_done) -> None:
    if workers <= 1:  # in this process: the worker's one-thread setting must not outlive the sweep
        import torch

        threads = torch.get_num_threads()
        one_thread()
        try:
            for cid, cell in todo:
                on_done(cid, run_cell(cell))
        finally:
            torch.set_num_threads(threads)
        return
    run_local(run_cell, todo, workers, on_done)


def _run_ray(todo: list[tuple[str, Cell]], address: str | None, on_done) -> None:
    try:
        import ray
    except ImportError:
        raise ConfigError('--ray needs Ray: pip install -e ".[ray]"  (or: pip install "ray>=2.30")') from None
    if not ray.is_initialized():
        env = {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}}
        ray.init(address=address or None, runtime_env=env, log_to_driver=False, include_dashboard=False)

    def task(cell: Cell) -> dict:
        one_thread()
        return run_cell(cell)

    remote = ray.remote(num_cpus=1)(task)
    pending = {remote.remote(cell): cid for cid, cell in todo}
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                on_done(pending.pop(ref), ray.get(ref))
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)


def _rows(results: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, reqs = [], []
    for res in results:
        r = dict(res["cell"])
        r["cell_id"] = res["cell_id"]
        r["status"], r["error"] = res["status"], res["error"]
        policy_name = res["row"].get("policy")
        for k, v in res["row"].items():
            if k not in r:
                r[k] = v
        r["policy_name"] = policy_name if policy_name is not None else r["policy"]
        r["cell_wall_s"] = res.get("cell_wall_s", float("nan"))
        rows.append(r)
        if res.get("requests"):
            q = pd.DataFrame(res["requests"])
            q.insert(0, "cell_id", res["cell_id"])
            reqs.append(q)
    df = pd.DataFrame(rows)
    if len(df):
        base_keys = [k for k in GRID_KEYS if k != "policy"]
        ok = df["status"] == "ok"
        key = pd.Series([repr(tuple(t)) for t in df[base_keys].itertuples(index=False)], index=df.index)
        for metric, out in (("output_throughput_tok_s", "speedup_vs_baseline"),
                            ("steady_throughput_tok_s", "steady_speedup_vs_baseline")):
            df[out] = float("nan")
            if metric in df:
                base = df[ok & (df["policy"] == BASELINE)].assign(_k=key).set_index("_k")[metric]
                base = base[~base.index.duplicated()]
                df[out] = df[metric] / key.map(base)
        for k in (k for k in GRID_KEYS if k in NONE_OK and (k in _INT_KEYS or k in _FLOAT_KEYS)):  # None -> NaN
            df[k] = pd.to_numeric(df[k], errors="coerce").astype(float)
        first = list(GRID_KEYS) + ["status", "error", "cell_id"]
        df = df[first + [c for c in df.columns if c not in first]]
    req = pd.concat(reqs, ignore_index=True) if reqs else pd.DataFrame(columns=["cell_id", "prompt_len", "output_len", "decode_s"])
    return df, req


# what a sweep writes in --out (name, is a folder): the only entries --force may replace there
WRITES = (*((f"{t}.{ext}", False) for t in ("results", "requests") for ext in ("csv", "parquet")), ("grid.json", False),
          ("cells", True))


def write_tables(out: Path, df: pd.DataFrame, req: pd.DataFrame, grid: str | None = None) -> list[str]:
    """results and requests, as .csv and .parquet, and grid.json, written as one unit (sim.infra.fsio.commit_files):
    a reader sees the earlier set or the new one, never a csv newer than its parquet or a table cut mid-row."""
    import io

    files: dict[str, bytes | str] = {}
    for name, frame in (("results", df), ("requests", req)):
        files[f"{name}.csv"] = frame.to_csv(index=False)
        try:
            buf = io.BytesIO()
            frame.to_parquet(buf, index=False)
            files[f"{name}.parquet"] = buf.getvalue()
        except ImportError:
            print(f"note: pyarrow is not installed; wrote {name}.csv only (pip install pyarrow)", file=sys.stderr)
            (out / f"{name}.parquet").unlink(missing_ok=True)  # an older parquet must not outlive its csv
    if grid is not None:
        files["grid.json"] = grid
    commit_files(out, files, unit="sweep")
    return list(files)


def run_sweep(cells: list[Cell], out: Path, workers: int | None = None, ray_address: str | None = None,
              use_ray: bool = False, fresh: bool = False, progress: bool = True,
              progress_every: float = 30.0) -> pd.DataFrame:
    """Run (or resume) the cells; write the results tables in `out`; return the results table. progress: a bar
    on a terminal, else a progress line every `progress_every` seconds (logs and pipes)."""
    from sim.infra.progress import Heartbeat, progress_bar

    out = Path(out)
    _PREP_CACHE.clear()  # tables of an earlier sweep in this process may come from files changed since
    cells_dir = out / "cells"
    cells_dir.mkdir(parents=True, exist_ok=True)
    for folder in (out, cells_dir):  # what a killed sweep left: finish its committed tables, drop temporaries
        clean_dead(folder)
    code = code_fingerprint()
    ids = [(cell_id(c, code), c) for c in _order(cells)]
    grid = json.dumps({"code": code, "cells": [dict(asdict(c), cell_id=i) for i, c in ids]}, indent=1) + "\n"
    results: dict[str, dict] = {}
    todo = []
    for cid, c in ids:
        f = cells_dir / f"{cid}.json"
        if not fresh and f.is_file():
            cached, why = load_cell(f, cid)
            if cached is not None:
                results[cid] = cached
                continue
            print(f"warning: {f}: {why}; recomputing the cell", file=sys.stderr)
        todo.append((cid, c))
    n_cached = len(results)
    tty = sys.stderr.isatty()
    bar = progress_bar(total=len(ids), leave=True, initial=n_cached, desc="cells", unit="cell", disable=not (progress and tty), smoothing=0.05)
    beat = Heartbeat("cells", len(ids), progress_every if progress and not tty else None)
    beat.done(n_cached)
    errors = []

    def on_done(cid: str, res: dict) -> None:
        res["cell_id"] = cid
        results[cid] = res
        if res["status"] == "ok":
            _save(cells_dir, cid, res)
        else:
            errors.append(res)
            bar.write(f"cell failed: {res['cell']['policy']} bs={res['cell']['batch_size']} "
                      f"{res['cell']['trace']}: {res['error']}")
        bar.update(1)
        beat.done()

    t0 = time.perf_counter()
    beat.__enter__()
    try:
        if todo:
            if use_ray:
                _run_ray(todo, ray_address, on_done)
            else:
                _run_local(todo, workers or os.cpu_count() or 1, on_done)
    finally:
        bar.close()
        beat.__exit__(None, None, None)
        df, req = _rows([results[cid] for cid, _ in ids if cid in results])
        # no cell finished (an interrupt before the first): no tables, rather than tables without a column
        written = write_tables(out, df, req, grid) if results else []
        ran = len(results) - n_cached  # cells that finished in this run (not those an interrupt left undone)
        left = len(todo) - ran
        print(f"{ran} cells run ({n_cached} cached, {len(errors)} failed{f', {left} not run' if left else ''}) in "
              f"{time.perf_counter() - t0:.1f} s; " + (f"wrote {out}/{', '.join(written)}" if written else
                                                  "wrote no table: no cell finished"), file=sys.stderr)
    return df


# ------------------------------------------------------------------------------------------------ CLI
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = ArgumentParser(prog="python -m sim.sweep", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Grid flags are repeatable; every combination runs. Flags override the keys "
                                        "of --grid/--preset.")
    from sim.api import console
    from sim.core.config import COMPONENTS, GROUP_ORDER, RunGrid, add_flags, flag_group

    for title in GROUP_ORDER[:-1] + ("the sweep", "output"):  # the help's sections, in this order
        flag_group(ap, title)
    add_flags(ap, (RunGrid, *COMPONENTS), repeatable=True, grid_only=True)  # grid values, from sim/core/config.py
    flag_group(ap, "speculation").add_argument(
        "--speculative-config", action="append", default=None, metavar="JSON",
        help="vLLM's speculative config, mapped onto a policy as in sim.api.run (repeatable; each adds a "
             "sub-grid of that policy, with its num_speculative_tokens as ngram_k for method ngram)")
    sw = flag_group(ap, "the sweep")
    sw.add_argument("--grid", type=Path, help="TOML grid file")
    sw.add_argument("--preset", choices=sorted(PRESETS), help="a built-in grid (paper: the grid of reports/)")
    sw.add_argument("--workers", type=int_at_least(1), default=None, help="local worker processes (default: CPU cores)")
    sw.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                    help="run on Ray: a local instance, or the cluster at ADDRESS (needs the 'ray' extra)")
    sw.add_argument("--fresh", action="store_true", help="ignore cached cells and recompute everything")
    sw.add_argument("--dry-run", action="store_true", help="list the cells and exit")
    out = flag_group(ap, "output")
    out.add_argument("--out", type=Path, default=Path("out/sweep"), help="output directory (default: out/sweep)")
    out.add_argument("--force", action="store_true",
                     help="write into an --out folder that holds files but is not a sweep's (no cells/ in it)")
    out.add_argument("--format", choices=console.FORMATS, default="table",
                     help="the results printed at the end: the narrow table and verdicts, every column as csv/json, "
                          "or vllm: one block per cell laid out as `vllm bench serve` prints its result (results.csv "
                          "and results.parquet in --out have every column either way) (default: table)")
    out.add_argument("--no-progress", action="store_true",
                     help="no progress bar (terminal) and no progress lines (stderr not a terminal)")
    out.add_argument("--progress-every", type=finite_float(0, strict=True), default=30.0, metavar="SECONDS",
                     help="when stderr is not a terminal (a log, a pipe): a progress line every SECONDS (default: 30)")
    return ap.parse_args(argv)


def load_grid(path: Path) -> dict:
    """The TOML grid file; ConfigError naming it for anything that is not a readable UTF-8 TOML file."""
    from sim.infra.inputs import CONFIG, read_text

    check_in_file(path, "--grid")
    text = read_text(path, CONFIG, "--grid")  # capped, a regular file, strict UTF-8
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: bad TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: bad TOML: invalid UTF-8 at byte {exc.start}") from None
    except RecursionError:
        raise ConfigError(f"{path}: bad TOML: nested too deeply") from None


def grid_from_args(a: argparse.Namespace) -> dict:
    grid: dict = {}
    if a.preset:
        grid.update(json.loads(json.dumps(PRESETS[a.preset])))
    if a.grid:
        grid.update(load_grid(a.grid))
    subs = grid.get("grid")
    if subs is not None and (not isinstance(subs, list) or not all(isinstance(x, dict) for x in subs)):
        raise ConfigError("'grid' must be an array of tables ([[grid]] in TOML)")
    for k in GRID_KEYS:
        if getattr(a, k):
            grid[k] = getattr(a, k)
            for sub in grid.get("grid") or []:
                sub.pop(k, None)
    if getattr(a, "speculative_config", None):  # each vLLM config: a sub-grid of its policy (and n-gram k)
        from sim.core.config import defaults
        from sim.core.drafters.calibration import NgramCalibrator
        from sim.core.drafters.model import load_drafter_profile
        from sim.core.vllm import speculative_config

        cal = NgramCalibrator.load(_as_list("calibrator", grid.get("calibrator", defaults("calibrator")))[0])
        block = load_drafter_profile(_as_list("drafter", grid.get("drafter", defaults("drafter")))[0]).block
        subs = grid.get("grid") or ([{}] if (a.policy or a.preset or a.grid) else [])
        for text in a.speculative_config:
            m = speculative_config(text, (cal.cfg.n_min, cal.cfg.n_max), block)
            for note in m.notes:
                print(f"note: {note}", file=sys.stderr)
            subs.append({"policy": [m.policy], **({"ngram_k": [m.ngram_k]} if m.ngram_k else {}),
                         **({"drafter": [m.drafter]} if m.drafter else {})})  # eagle: its own drafter profile
        grid["grid"] = subs
    return grid


def print_results(df: pd.DataFrame, fmt: str = "table") -> None:
    """The sweep's ok cells on stdout: the narrow table (with a column for each setup key that varies) and a
    verdict per setup and batch size, or every column as csv/json."""
    from sim.api import console

    if not len(df):
        return
    ok = df[df["status"] == "ok"]
    if fmt != "table":
        console.emit(ok.to_dict("records"), fmt, BASELINE)
        return
    n_ok = len(ok)
    keys = [k for k in PREP_KEYS + RUN_KEYS if k not in ("policy", "batch_size") and k in ok]
    ok = join_setups(ok, keys)  # a policy run apart with its own drafter is read in its workload (one baseline)
    vary = [k for k in keys if setup_values(ok, k).nunique() > 1]
    rows = ok.drop(columns="_setup").to_dict("records")
    for r in rows:
        if "trace" in r:
            r["trace_name"] = Path(str(r["trace"])).stem
    lead = [("trace_name" if k == "trace" else k, k) for k in vary]
    console.emit(rows, "table", BASELINE, header=f"{n_ok} of {len(df)} cells ok; baseline {BASELINE}",
                 lead=lead, group=tuple(vary))


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.dry_run:
        return _main(a)
    with out_guard(a.out) as out:  # --out's real folder, locked against a second sweep for the whole run
        a.out = out
        return _main(a)


def _main(a: argparse.Namespace) -> int:
    if not a.dry_run:  # before any work: a folder that can be written, and not someone else's files
        check_out_dir(a.out, force=True)
        refuse_in_the_way(a.out, WRITES, f"--out {a.out}")  # a user's folder (or file) at a name the sweep writes
        if a.out.is_dir() and any(a.out.iterdir()) and not (a.out / "cells").is_dir() and not a.force:
            raise ConfigError(f"--out {a.out} holds files but no sweep (no cells/ folder); choose another folder, or "
                              "pass --force to write the sweep's tables next to them")
    if a.ray is not None:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ConfigError('--ray needs Ray, which is not installed: pip install -e ".[ray]"') from None
    cells = expand(grid_from_args(a))
    validate(cells)
    if a.dry_run:
        for c in _order(cells):
            print(" ".join(f"{k}={getattr(c, k)}" for k in GRID_KEYS))
        print(f"{len(cells)} cells")
        return 0
    progress = not a.no_progress
    df = run_sweep(cells, a.out, workers=a.workers, use_ray=a.ray is not None, ray_address=a.ray or None,
                   fresh=a.fresh, progress=progress, progress_every=a.progress_every)
    n_err = int((df["status"] != "ok").sum()) if len(df) else 0
    print_results(df, a.format)
    if n_err:
        print(f"warning: {n_err} of {len(df)} cells failed; see the status and error columns of {a.out}/results.csv",
              file=sys.stderr)
    return 0
