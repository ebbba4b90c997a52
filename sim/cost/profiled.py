"""Profiled step cost: measured tables looked up the way vLLM's adaptive verification does.

Table format (models/cost_tables/<gpu>_<llm>.json; real/profile.py writes the same):
    {"format": "hybridspec-cost-table/1", "llm": "qwen3-8b", "gpu": "h100-sxm",
     "source": "...", "derived": false,             # true when generated from a model, not measured
     "capture_sizes": [1, 2, 4, 8, ...],           # CUDA-graph capture sizes (tokens); [] = eager only
     "verify": {"num_tokens": [...], "ms": [...]},  # target forward pass (ms) by tokens per step,
                                                   # measured at short context
     "draft":  {"block": 7, "num_reqs": [...], "ms": [...]},   # model drafter (ms) by requests
     "kv_ms_per_token": 5.8e-05}                   # optional: ms per cached KV entry read
or the same as CSV: '# key: value' lines for llm, gpu, source, derived, capture_sizes (space separated),
draft_block, kv_ms_per_token, then a header 'table,x,ms' and rows 'verify,<tokens>,<ms>' / 'draft,<reqs>,<ms>'.

Lookup of a table (xs, ys) at x (vLLM-style):
  * ys forced monotone: running maximum over increasing xs;
  * 0 < x <= max(capture_sizes): the batch pads up to the next captured size c >= x, cost = f(c)
    (a step function);
  * above it: f(x) by linear interpolation between points; below the first point, the first value;
  * past the last point: linear extrapolation with the last segment's slope (>= 0).
  * x <= 0: 0 (nothing is launched).
verify_ms(T, K, S) = f_verify(T) + kv_ms_per_token * K   (S unused: the table already prices per-seq work)
draft_ms(R, block) = f_draft(ceil(R * block / table_block)) (same positions, the table's block length)
ngram/alloc/sample/cpu and the KV capacity come from `fallback` (by default the roofline model of the
table's llm and gpu), since a step profile does not measure them.
"""
from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sim.cost.base import CostModel
from sim.errors import ConfigError
from sim.models import models_dir, read_json_object

FORMAT = "hybridspec-cost-table/1"


def vllm_capture_sizes(max_size: int = 512) -> list[int]:
    """vLLM's default CUDA-graph capture sizes: 1, 2, 4, then steps of 8 to 256, of 16 to max_size."""
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_size + 1, 16))
    return [s for s in sizes if s <= max_size]


class StepTable:
    """One monotone lookup table (x -> ms) with the step/interpolate/extrapolate rule above."""

    def __init__(self, xs, ys, capture_sizes=(), what: str = "table") -> None:
        xs = np.asarray(xs, dtype=np.float64)
        ys = np.asarray(ys, dtype=np.float64)
        if xs.ndim != 1 or xs.size == 0 or xs.shape != ys.shape:
            raise ConfigError(f"{what}: needs matching, non-empty lists of points and ms values")
        if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))) or np.any(xs <= 0) or np.any(ys < 0):
            raise ConfigError(f"{what}: points must be positive and ms values finite and >= 0")
        order = np.argsort(xs, kind="stable")
        xs, ys = xs[order], ys[order]
        uniq, start = np.unique(xs, return_index=True)          # duplicates: keep the largest value
        ys = np.maximum.reduceat(ys, start)
        self.xs, self.ys = uniq, np.maximum.accumulate(ys)     # forced monotone
        caps = np.unique(np.asarray(list(capture_sizes), dtype=np.float64))
        if caps.size and np.any(caps <= 0):
            raise ConfigError(f"{what}: capture sizes must be positive")
        self.caps = caps
        self.cap_max = float(caps[-1]) if caps.size else 0.0
        if self.xs.size >= 2:
            self.tail_slope = float((self.ys[-1] - self.ys[-2]) / (self.xs[-1] - self.xs[-2]))
        else:
            self.tail_slope = 0.0
        self._cache = np.zeros(0)

    def _curve(self, x: np.ndarray) -> np.ndarray:
        """Interpolate inside the points, hold below the first, extrapolate past the last."""
        y = np.interp(x, self.xs, self.ys)
        past = x > self.xs[-1]
        if np.any(past):
            y = np.where(past, self.ys[-1] + self.tail_slope * (x - self.xs[-1]), y)
        return y

    def __call__(self, x):
        xa = np.asarray(x, dtype=np.float64)
        xp = xa
        if self.caps.size:
            inside = (xa > 0) & (xa <= self.cap_max)
            idx = np.minimum(np.searchsorted(self.caps, xa, side="left"), self.caps.size - 1)
            xp = np.where(inside, self.caps[idx], xa)
        out = np.where(xa > 0, self._curve(xp), 0.0)
        return out if out.ndim else float(out)

    def table(self, n: int) -> np.ndarray:
        """self(0..n-1), cached (the hot path of verify_table)."""
        if n > self._cache.size:
            self._cache = np.asarray(self(np.arange(max(n, 2 * self._cache.size, 1024))), dtype=np.float64)
        return self._cache[:n]


@dataclass
class CostTable:
    """Parsed cost table (see module docstring)."""

    llm: str
    gpu: str
    verify_tokens: list[float]
    verify_ms: list[float]
    draft_reqs: list[float] = field(default_factory=list)
    draft_ms: list[float] = field(default_factory=list)
    draft_block: int = 7
    capture_sizes: list[int] = field(default_factory=list)
    kv_ms_per_token: float | None = None
    derived: bool = False
    source: str = ""

    def to_json(self) -> dict:
        d = {"format": FORMAT, "llm": self.llm, "gpu": self.gpu, "source": self.source, "derived": self.derived,
             "capture_sizes": [int(c) for c in self.capture_sizes],
             "verify": {"num_tokens": [int(x) for x in self.verify_tokens],
                        "ms": [round(float(y), 6) for y in self.verify_ms]}}
        if self.draft_reqs:
            d["draft"] = {"block": int(self.draft_block), "num_reqs": [int(x) for x in self.draft_reqs],
                          "ms": [round(float(y), 6) for y in self.draft_ms]}
        if self.kv_ms_per_token is not None:
            d["kv_ms_per_token"] = float(f"{self.kv_ms_per_token:.6g}")
        return d


def _num_list(path, key, v) -> list[float]:
    if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        raise ConfigError(f"{path}: field '{key}' must be a list of numbers")
    return [float(x) for x in v]


def load_cost_table(path: str | Path) -> CostTable:
    """Read a JSON or CSV cost table; ConfigError naming the file and field on any problem."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"cost table '{path}' not found")
    if p.suffix.lower() == ".csv":
        return _load_csv(p)
    d = read_json_object(p, "cost table")
    for k in ("llm", "gpu", "verify"):
        if k not in d:
            raise ConfigError(f"{p}: missing field '{k}'")
    v = d["verify"]
    if not isinstance(v, dict) or "num_tokens" not in v or "ms" not in v:
        raise ConfigError(f"{p}: field 'verify' must be an object with 'num_tokens' and 'ms'")
    t = CostTable(llm=str(d["llm"]), gpu=str(d["gpu"]), verify_tokens=_num_list(p, "verify.num_tokens", v["num_tokens"]),
                  verify_ms=_num_list(p, "verify.ms", v["ms"]), source=str(d.get("source", "")),
                  derived=bool(d.get("derived", False)),
                  capture_sizes=[int(x) for x in _num_list(p, "capture_sizes", d.get("capture_sizes", []))])
    if "draft" in d:
        dr = d["draft"]
        if not isinstance(dr, dict) or "num_reqs" not in dr or "ms" not in dr:
            raise ConfigError(f"{p}: field 'draft' must be an object with 'num_reqs' and 'ms'")
        t.draft_reqs = _num_list(p, "draft.num_reqs", dr["num_reqs"])
        t.draft_ms = _num_list(p, "draft.ms", dr["ms"])
        t.draft_block = int(dr.get("block", 7))
    if d.get("kv_ms_per_token") is not None:
        t.kv_ms_per_token = float(d["kv_ms_per_token"])
    return t


def _load_csv(p: Path) -> CostTable:
    meta: dict[str, str] = {}
    rows: list[list[str]] = []
    try:
        lines = p.read_text().splitlines()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read cost table: {e}") from None
    body = []
    for line in lines:
        s = line.strip()
        if s.startswith("#"):
            k, _, val = s[1:].partition(":")
            meta[k.strip()] = val.strip()
        elif s:
            body.append(s)
    reader = list(csv.reader(body))
    if not reader or [c.strip() for c in reader[0]] != ["table", "x", "ms"]:
        raise ConfigError(f"{p}: expected a header line 'table,x,ms'")
    rows = reader[1:]
    vt, vm, dt, dm = [], [], [], []
    for i, r in enumerate(rows, start=2):
        if len(r) != 3:
            raise ConfigError(f"{p}: data row {i}: expected 3 columns table,x,ms")
        try:
            x, y = float(r[1]), float(r[2])
        except ValueError:
            raise ConfigError(f"{p}: data row {i}: x and ms must be numbers") from None
        if r[0] == "verify":
            vt.append(x), vm.append(y)
        elif r[0] == "draft":
            dt.append(x), dm.append(y)
        else:
            raise ConfigError(f"{p}: data row {i}: table must be 'verify' or 'draft', got '{r[0]}'")
    for k in ("llm", "gpu"):
        if k not in meta:
            raise ConfigError(f"{p}: missing '# {k}: ...' line")
    caps = [int(float(c)) for c in meta.get("capture_sizes", "").replace(",", " ").split()]
    kv = meta.get("kv_ms_per_token")
    return CostTable(llm=meta["llm"], gpu=meta["gpu"], verify_tokens=vt, verify_ms=vm, draft_reqs=dt, draft_ms=dm,
                     draft_block=int(float(meta.get("draft_block", 7))), capture_sizes=caps,
                     kv_ms_per_token=float(kv) if kv else None,
                     derived=meta.get("derived", "false").lower() == "true", source=meta.get("source", ""))


def default_table_path(llm: str, gpu: str) -> Path:
    return models_dir() / "cost_tables" / f"{gpu}_{llm}.json"


def list_cost_tables() -> list[str]:
    d = models_dir() / "cost_tables"
    return sorted(p.name for p in d.glob("*") if p.suffix in (".json", ".csv")) if d.is_dir() else []


class ProfiledCost(CostModel):
    """Step cost from a measured table (see module docstring); small kernels from `fallback`."""

    name = "profiled"

    def __init__(self, table: CostTable | str | Path, fallback: CostModel | None = None) -> None:
        if not isinstance(table, CostTable):
            table = load_cost_table(table)
        self.table = table
        if fallback is None:
            from sim.cost.roofline import RooflineCost
            fallback = RooflineCost(llm=table.llm, gpu=table.gpu)
        self.fallback = fallback
        self.verify_curve = StepTable(table.verify_tokens, table.verify_ms, table.capture_sizes,
                                      what=f"cost table {table.gpu}/{table.llm}: verify")
        self.draft_curve = (StepTable(table.draft_reqs, table.draft_ms, table.capture_sizes,
                                      what=f"cost table {table.gpu}/{table.llm}: draft")
                            if table.draft_reqs else None)
        kv = table.kv_ms_per_token
        if kv is None:
            kv = float(getattr(fallback, "kv_ms_per_token", 0.0))
        if kv < 0:
            raise ConfigError("kv_ms_per_token must be >= 0")
        self.kv_ms_per_token = kv
        self.verify_curve.table(1024)  # warm the lookup caches used by verify_ms / verify_table / draft_ms
        if self.draft_curve is not None:
            self.draft_curve.table(1024)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.fallback.kv_capacity_tokens

    @property
    def vocab_size(self) -> int | None:
        return self.fallback.vocab_size

    @property
    def capture_sizes(self) -> list[int]:
        """The table's capture sizes ([] = eager only)."""
        return [int(c) for c in self.table.capture_sizes]

    def verify_ms(self, num_tokens, kv_tokens: int, num_seqs: int):
        add = max(int(kv_tokens), 0) * self.kv_ms_per_token
        if isinstance(num_tokens, (int, np.integer)) and not isinstance(num_tokens, bool):
            t = int(num_tokens)
            if t <= 0:
                return 0.0
            cache = self.verify_curve._cache
            base = cache[t] if t < cache.size else float(self.verify_curve(t))
            return float(base) + add
        t = np.asarray(num_tokens)
        return np.where(t > 0, np.asarray(self.verify_curve(t)) + add, 0.0)

    def verify_table(self, max_tokens: int, kv_tokens: int, num_seqs: int) -> np.ndarray:
        out = self.verify_curve.table(int(max_tokens) + 1) + max(int(kv_tokens), 0) * self.kv_ms_per_token
        if out.size:
            out[0] = 0.0
        return out

    def draft_ms(self, num_reqs: int, block: int, kv_tokens: int = 0) -> float:
        pos = max(int(num_reqs), 0) * max(int(block), 0)
        if pos == 0:
            return 0.0
        if self.draft_curve is None:
            return float(self.fallback.draft_ms(num_reqs, block))
        x = math.ceil(pos / max(self.table.draft_block, 1))
        cache = self.draft_curve._cache
        return float(cache[x]) if x < cache.size else float(self.draft_curve(x))

    def ngram_ms(self, num_reqs: int, on_gpu: bool = True) -> float:
        return self.fallback.ngram_ms(num_reqs, on_gpu)

    def alloc_ms(self, num_reqs: int) -> float:
        return self.fallback.alloc_ms(num_reqs)

    def sample_ms(self, num_tokens: int) -> float:
        return self.fallback.sample_ms(num_tokens)

    def cpu_ms(self, num_reqs: int, num_tokens: int) -> float:
        return self.fallback.cpu_ms(num_reqs, num_tokens)

    def __repr__(self) -> str:
        return f"ProfiledCost(llm={self.table.llm!r}, gpu={self.table.gpu!r}, derived={self.table.derived})"


# Tokens-per-step points above the capture range that a profile measures (interpolated between).
EXTRA_VERIFY_POINTS = (576, 640, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)


def tables_from_cost_model(cost, capture_sizes=None, extra_points=EXTRA_VERIFY_POINTS, draft_block: int = 7,
                           max_reqs: int = 256) -> CostTable:
    """Sample a cost model (e.g. RooflineCost) the way real/profile.py samples a GPU: verify at every
    capture size and at `extra_points` (short context: kv_tokens = 0), the drafter at every capture size
    up to `max_reqs` requests with `draft_block` tokens each. The result is marked derived, not measured."""
    cfg = getattr(cost, "config", None)
    llm = getattr(cfg, "llm", "unknown")
    gpu = getattr(cfg, "gpu", "unknown")
    if capture_sizes is None:
        max_cap = getattr(getattr(cost, "gpu", None), "cuda_graph_max_tokens", 512)
        capture_sizes = vllm_capture_sizes(max_cap)
    caps = sorted({int(c) for c in capture_sizes})
    top = getattr(cfg, "max_num_batched_tokens", max(extra_points, default=0))
    vt = caps + [p for p in extra_points if p > (caps[-1] if caps else 0) and p <= top]
    vm = [float(cost.verify_ms(int(t), 0, int(t))) for t in vt]
    dr = [c for c in caps if c <= max_reqs]
    dm = [float(cost.draft_ms(int(r), draft_block)) for r in dr]
    return CostTable(llm=llm, gpu=gpu, verify_tokens=vt, verify_ms=vm, draft_reqs=dr, draft_ms=dm,
                     draft_block=draft_block, capture_sizes=caps,
                     kv_ms_per_token=getattr(cost, "kv_ms_per_token", None), derived=True,
                     source=f"DERIVED, NOT MEASURED: sampled from {cost!r} by "
                            f"sim.cost.profiled.tables_from_cost_model (regenerate: python -m sim.cost --write-tables)")


def write_cost_table(table: CostTable, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(table.to_json(), indent=1)
    # keep number lists on one line: one key per line, readable in a diff
    text = re.sub(r"\[\s*([-0-9.,eE\s]*?)\s*\]", lambda m: "[" + ", ".join(m.group(1).split()).replace(",,", ",") + "]",
                  text)
    p.write_text(text + "\n")
    return p
