"""Profiled step cost: measured tables looked up the way vLLM's adaptive verification does.

Table format "hybridspec-cost-table/1" (models/cost_tables/<gpu>_<llm>.json; real/validation/profile.py writes the
same). All times are milliseconds; counts are tokens (positions) or requests. Only llm, gpu and verify
are required; every other key is optional and, when absent, its cost comes from `fallback` (below).
    {"format": "hybridspec-cost-table/1",            # optional; any other value is refused
     "llm": "qwen3-8b", "gpu": "h100-sxm",           # what was profiled (gpu may be any label, e.g. "cpu")
     "source": "...", "derived": false,              # derived: true when generated from a model, not measured
     "machine": {"device": "...", "cpu": "...", "torch": "2.5.1", "dtype": "bfloat16", "threads": 8, ...},
                                                    # where it was measured: free-form strings/numbers/bools
     "capture_sizes": [1, 2, 4, 8, ...],            # CUDA-graph capture sizes (tokens); [] = eager only
     "verify": {"num_tokens": [...], "ms": [...]},   # target forward pass by tokens per step, short context
     "kv_ms_per_token": 5.8e-05,                     # ms per cached KV entry read (summed over sequences)
     "seq_ms": 0.01,                                 # ms per sequence in the step (default 0)
     "attn_ms_per_row_kv": 1.5e-4,                   # ms per query row beyond each sequence's first, per cached
                                                    # KV entry of the mean sequence (default 0; see Costs)
     "short_query_max": 32,                          # present (> 0): the engine's attention is padded
                                                    # (sim/core/cost/padded.py); verify is then priced by the
                                                    # step's padded shape where the engine gives one
     "kv_view_ms_per_token": 1.7e-3,                 # padded form: ms per KV entry read in place (a lone
                                                    # short query, prefill chunks); kv_ms_per_token is
                                                    # then per gathered (padded) entry
     "logits_ms_per_row": 0.02,                      # present: verify was measured WITHOUT the LM head;
                                                    # each row that needs logits costs this much
     "draft":  {"block": 7, "num_reqs": [...], "ms": [...]},   # model drafter by requests (block tokens each)
     "ngram":  {"num_reqs": [...], "ms": [...]},     # n-gram drafter by requests
     "skip":   {"num_reqs": [...], "ms": [...]},     # the model drafter's step with its block pass skipped
                                                    # (the vLLM plugin's skip table: the context work stays)
     "alloc":  {"<policy>": {"num_reqs": [...], "ms": [...]}, "*": {...}},  # allocation by requests, per
                                                    # policy name; "*" = any policy not listed
     "sample": {"num_tokens": [...], "ms": [...]},   # sampling + rejection by verified tokens
     "cpu":    {"base_ms": a, "per_req_ms": b, "per_token_ms": c},  # host work (missing terms are 0)
     "plugin": {"a_ms": a, "b_ms_per_req": b, "steps": n,  # the vLLM plugin's own step by requests, measured
                "in_draft": {"a_ms": a2, "b_ms_per_req": b2, "steps": n2}},  # in its engine (steps: samples
                                                    # fitted); in_draft: the part "draft" already holds
     "kv_capacity_tokens": 400000,                   # KV-cache entries that fit (int)
     "vocab_size": 49152}                            # the target's vocabulary (int)
Lists are numbers, paired lists of equal length, points > 0, ms >= 0; scalars are finite numbers >= 0;
a bad value is a ConfigError naming the file and the key. Unknown top-level keys are ignored.

The CSV form holds verify and draft only: '# key: value' lines for llm, gpu, source, derived,
capture_sizes (space separated), draft_block, kv_ms_per_token, then a header 'table,x,ms' and rows
'verify,<tokens>,<ms>' / 'draft,<reqs>,<ms>'. The other keys above are JSON only (a CSV naming one in a
'# key:' line is refused rather than ignored).

Lookup of a table (xs, ys) at x (vLLM-style), StepTable:
  * ys forced monotone: running maximum over increasing xs;
  * 0 < x <= max(capture_sizes): the batch pads up to the next captured size c >= x, cost = f(c)
    (a step function); capture sizes apply to verify and draft only, the other tables interpolate;
  * above it: f(x) by linear interpolation between points; below the first point, the first value;
  * past the last point: linear extrapolation with the last segment's slope (>= 0).
  * x <= 0: 0 (nothing is launched).
Costs (T tokens, K cached KV entries, S sequences, R requests; 0 when T (resp. R; for cpu, R and T) is 0):
  verify_ms(T, K, S, logit_rows=None) = f_verify(T) + kv_ms_per_token*K + seq_ms*S
                                        + attn_ms_per_row_kv * max(T - S, 0) * K / S
                                        [+ logits_ms_per_row * logit_rows, logit_rows None = T]
      (without logits_ms_per_row the table includes the LM head of every row and logit_rows is unused).
      The attention term prices the query rows a step has beyond one per sequence -- draft tokens under
      verification, prefill chunks -- each attending to the cached entries of its sequence, K / S on average:
      kv_ms_per_token*K is what reading the cache costs (one query row per sequence), and every further row
      adds its attention's arithmetic over those entries: a small fraction per entry (on the CPU profiled here
      1.4-1.5e-4 against 7e-3 ms), but it grows with the square of a prefill chunk. Units: ms per (query row x
      KV entry). A step of one-token decodes (T = S) pays nothing; S = 0 pays nothing.
  verify_ms(T, K, S, logit_rows, shape) with a padded table (short_query_max > 0) and the step's padded shape
  (sim/core/cost/padded.py: kv_gather G, kv_view V, attn_rows_kv A, from the step's per-sequence queries and keys):
                        = f_verify(T) + kv_ms_per_token*G + kv_view_ms_per_token*V + seq_ms*S
                          + attn_ms_per_row_kv*A [+ logits_ms_per_row * logit_rows]
      The torch engine gathers its short queries' keys padded to the longest (G = Rs * Kmax), so a batch of
      one long and many short contexts pays for the long one in every row; reading one sequence in place
      costs less per entry (no copy). Without a shape (decision tables, other engines) the aggregate form
      above prices the step; with equal contexts the two agree.
  draft_ms(R, block)    = f_draft(ceil(R * block / table block))   (same positions, the table's block)
  ngram_ms(R, on_gpu)   = f_ngram(R)   (what the profiled engine ran; on_gpu is not used)
  alloc_ms(R, policy)   = f_alloc[policy](R), else f_alloc["*"](R), else the fallback's
  sample_ms(T)          = f_sample(T)
  cpu_ms(R, T)          = base_ms + per_req_ms*R + per_token_ms*T
  skip_residual_ms(R)   = f_skip(R): what the model drafter still costs on a step whose block pass is skipped
                          (its context K/V upkeep; the plugin's profiled skip table, `plan_skip` saves draft - it);
                          0 without the field
  plugin_ms(R)          = max(a_ms + b_ms_per_req*R - (a2 + b2*R), 0) for R > 0 (a2 = b2 = 0 without in_draft),
                          charged with alloc_ms to a policy that runs as the plugin (Policy.runs_plugin). in_draft: a
                          draft table vLLM profiled with the plugin's step inside its pass (a hybrid run's) holds
                          that step on padded rows; only the live step's excess is charged. No fallback: a table
                          without the field charges the plugin nothing.
Anything absent comes from `fallback`: by default the roofline model of the table's llm and gpu when
both are known specs (models/llms, models/gpus); otherwise there is none, and asking for a missing part
is a ConfigError (kv_ms_per_token then must be in the table, since every verify uses it).
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sim.core.cost.base import CostModel, vllm_capture_sizes  # noqa: F401  (vllm_capture_sizes: re-exported)
from sim.core.cost.config import CostConfig
from sim.core.cost.roofline import RooflineCost
from sim.infra.cli import write_whole
from sim.infra.errors import ConfigError
from sim.core.models import list_gpus, list_llms, models_dir, read_json_object

FORMAT = "hybridspec-cost-table/1"
# Past these a table's value is not a measurement (a verify of 1e308 ms, a KV cache of 1e30 tokens): refused where it
# is read, so that no price overflows the engine's clock or divides it to nothing.
MAX_MS = 3.6e6      # an hour [ms]: no step, and no price per token, row or request, reaches it
MAX_COUNT = 2**40   # tokens, requests, sizes (also sim/core/config.py's largest KV cache)


class StepTable:
    """One monotone lookup table (x -> ms) with the step/interpolate/extrapolate rule above."""

    def __init__(self, xs, ys, capture_sizes=(), what: str = "table") -> None:
        xs = np.asarray(xs, dtype=np.float64)
        ys = np.asarray(ys, dtype=np.float64)
        if xs.ndim != 1 or xs.size == 0 or xs.shape != ys.shape:
            raise ConfigError(f"{what}: needs matching, non-empty lists of points and ms values")
        if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))) or np.any(xs <= 0) or np.any(ys < 0):
            raise ConfigError(f"{what}: points must be positive and ms values finite and >= 0")
        if np.any(ys > MAX_MS):
            raise ConfigError(f"{what}: an ms value of {float(ys.max()):g} is not a measurement (at most {MAX_MS:g} ms, "
                              "an hour)")
        if np.any(xs > MAX_COUNT):
            raise ConfigError(f"{what}: a point at {float(xs.max()):g} is past any size (at most 2**40)")
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


Curve = tuple  # (points, ms): two equal-length lists of numbers

CPU_KEYS = ("base_ms", "per_req_ms", "per_token_ms")
# keys of the JSON format that the CSV form does not hold (refused there rather than ignored)
JSON_ONLY = ("machine", "seq_ms", "attn_ms_per_row_kv", "logits_ms_per_row", "ngram", "alloc", "sample", "cpu", "kv_capacity_tokens",
             "vocab_size", "plugin", "skip")
PLUGIN_KEYS = ("a_ms", "b_ms_per_req")  # a fit of the "plugin" field (and of its in_draft); optional: steps


@dataclass
class CostTable:
    """Parsed cost table (see module docstring). Optional parts are None / empty when absent."""

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
    machine: dict = field(default_factory=dict)        # where it was measured (free-form)
    seq_ms: float = 0.0                                 # ms per sequence in the step
    attn_ms_per_row_kv: float = 0.0                     # ms per (extra query row x mean KV entries per sequence)
    short_query_max: int = 0                            # > 0: padded attention (sim/core/cost/padded.py)
    kv_view_ms_per_token: float = 0.0                   # padded form: ms per KV entry read in place
    logits_ms_per_row: float | None = None              # set: verify excludes the LM head
    ngram: Curve | None = None                          # (num_reqs, ms)
    skip: Curve | None = None                           # (num_reqs, ms): the model drafter's skipped step
    alloc: dict[str, Curve] = field(default_factory=dict)  # policy name or "*" -> (num_reqs, ms)
    sample: Curve | None = None                         # (num_tokens, ms)
    cpu: dict[str, float] | None = None                 # base_ms, per_req_ms, per_token_ms
    kv_capacity_tokens: int | None = None
    vocab_size: int | None = None
    plugin: dict | None = None                          # a_ms, b_ms_per_req[, steps][, in_draft: the same keys]
    path: str = field(default="", compare=False)        # the file it was read from (not written)

    def to_json(self) -> dict:
        def curve(xkey, xs, ys):
            return {xkey: [_int_or_float(x) for x in xs], "ms": [round(float(y), 6) for y in ys]}

        d = {"format": FORMAT, "llm": self.llm, "gpu": self.gpu, "source": self.source, "derived": self.derived}
        if self.machine:
            d["machine"] = dict(self.machine)
        d["capture_sizes"] = [int(c) for c in self.capture_sizes]
        d["verify"] = curve("num_tokens", self.verify_tokens, self.verify_ms)
        if self.seq_ms:
            d["seq_ms"] = float(self.seq_ms)
        if self.attn_ms_per_row_kv:
            d["attn_ms_per_row_kv"] = float(f"{self.attn_ms_per_row_kv:.6g}")
        if self.short_query_max:
            d["short_query_max"] = int(self.short_query_max)
            d["kv_view_ms_per_token"] = float(f"{self.kv_view_ms_per_token:.6g}")
        if self.logits_ms_per_row is not None:
            d["logits_ms_per_row"] = float(self.logits_ms_per_row)
        if self.draft_reqs:
            d["draft"] = {"block": int(self.draft_block), **curve("num_reqs", self.draft_reqs, self.draft_ms)}
        if self.ngram is not None:
            d["ngram"] = curve("num_reqs", *self.ngram)
        if self.skip is not None:
            d["skip"] = curve("num_reqs", *self.skip)
        if self.alloc:
            d["alloc"] = {name: curve("num_reqs", *xy) for name, xy in self.alloc.items()}
        if self.sample is not None:
            d["sample"] = curve("num_tokens", *self.sample)
        if self.cpu is not None:
            d["cpu"] = {k: float(self.cpu.get(k, 0.0)) for k in CPU_KEYS}
        if self.kv_ms_per_token is not None:
            d["kv_ms_per_token"] = float(f"{self.kv_ms_per_token:.6g}")
        for k in ("kv_capacity_tokens", "vocab_size"):
            if getattr(self, k) is not None:
                d[k] = int(getattr(self, k))
        if self.plugin is not None:
            d["plugin"] = {k: dict(v) if isinstance(v, dict) else v for k, v in self.plugin.items()}
        return d


def _int_or_float(x) -> int | float:
    x = float(x)
    return int(x) if x.is_integer() else x


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _num_list(path, key, v) -> list[float]:
    if not isinstance(v, list) or not all(_is_num(x) for x in v):
        raise ConfigError(f"{path}: field '{key}' must be a list of numbers")
    return [float(x) for x in v]


def _number(path, key, v, integer: bool = False) -> float | int:
    """A finite number in 0..MAX_MS (integer: a whole number in 1..MAX_COUNT); ConfigError naming the file and key."""
    hi = MAX_COUNT if integer else MAX_MS
    ok = _is_num(v) and math.isfinite(v) and 0 <= v <= hi
    if integer:
        ok = ok and float(v).is_integer() and v >= 1
    if not ok:
        raise ConfigError(f"{path}: field '{key}' must be "
                          f"{f'an integer in 1..{MAX_COUNT}' if integer else f'a number in 0..{MAX_MS:g} (ms; an hour)'}, "
                          f"got {v!r}")
    return int(v) if integer else float(v)


def _curve(path, key, v, xkey) -> Curve:
    """{xkey: [...], "ms": [...]} -> (points, ms), checked the way StepTable reads it."""
    if not isinstance(v, dict) or xkey not in v or "ms" not in v:
        raise ConfigError(f"{path}: field '{key}' must be an object with '{xkey}' and 'ms'")
    xs, ys = _num_list(path, f"{key}.{xkey}", v[xkey]), _num_list(path, f"{key}.ms", v["ms"])
    StepTable(xs, ys, what=f"{path}: field '{key}'")
    return xs, ys


def load_cost_table(path: str | Path) -> CostTable:
    """Read a JSON or CSV cost table; ConfigError naming the file and field on any problem."""
    from sim.infra.inputs import check_regular

    p = Path(path)
    if not p.exists():
        raise ConfigError(f"cost table '{path}' not found")
    check_regular(p, "cost table")  # a pipe or a device: one line naming it, not "not found"
    if p.suffix.lower() == ".csv":
        return _load_csv(p)
    t = cost_table_from_dict(read_json_object(p, "cost table", finite=False), p)  # each field's check names it
    t.path = str(p)
    return t


# Every top-level field a JSON cost table may have (what cost_table_from_dict reads, plus documentation).
TABLE_KEYS = frozenset({"format", "llm", "gpu", "source", "derived", "capture_sizes", "verify", "draft",
                        "kv_ms_per_token", "logits_ms_per_row", "seq_ms", "attn_ms_per_row_kv", "short_query_max", "kv_view_ms_per_token", "kv_capacity_tokens", "vocab_size", "ngram",
                        "skip", "sample", "alloc", "cpu", "plugin", "machine", "name", "notes", "licence", "license",
                        "command"})


def cost_table_from_dict(d: dict, where: str | Path = "<cost table>") -> CostTable:
    """A cost table from its JSON object (the format above), validated as load_cost_table does; errors name
    `where` and the field."""
    p = where
    if d.get("format", FORMAT) != FORMAT:
        raise ConfigError(f"{p}: field 'format' is {d['format']!r}; this version reads '{FORMAT}'")
    for k in ("llm", "gpu", "verify"):
        if k not in d:
            raise ConfigError(f"{p}: missing field '{k}'")
    unknown = sorted(set(d) - TABLE_KEYS)
    if unknown:  # a misspelt field would otherwise be ignored silently (e.g. 'verfy', 'kv_ms_per_tok')
        raise ConfigError(f"{p}: unknown field '{unknown[0]}'; a cost table's fields are {', '.join(sorted(TABLE_KEYS))}")
    vt, vm = _curve(p, "verify", d["verify"], "num_tokens")
    t = CostTable(llm=str(d["llm"]), gpu=str(d["gpu"]), verify_tokens=vt, verify_ms=vm,
                  source=str(d.get("source", "")), derived=bool(d.get("derived", False)),
                  capture_sizes=[int(x) for x in _num_list(p, "capture_sizes", d.get("capture_sizes", []))])
    if "draft" in d:
        t.draft_reqs, t.draft_ms = _curve(p, "draft", d["draft"], "num_reqs")
        t.draft_block = _number(p, "draft.block", d["draft"].get("block", 7), integer=True)
    for k in ("kv_ms_per_token", "logits_ms_per_row"):
        if d.get(k) is not None:
            setattr(t, k, _number(p, k, d[k]))
    if "seq_ms" in d:
        t.seq_ms = _number(p, "seq_ms", d["seq_ms"])
    if "attn_ms_per_row_kv" in d:
        t.attn_ms_per_row_kv = _number(p, "attn_ms_per_row_kv", d["attn_ms_per_row_kv"])
    if "short_query_max" in d:
        t.short_query_max = _number(p, "short_query_max", d["short_query_max"], integer=True)
    if "kv_view_ms_per_token" in d:
        t.kv_view_ms_per_token = _number(p, "kv_view_ms_per_token", d["kv_view_ms_per_token"])
    for k in ("kv_capacity_tokens", "vocab_size"):
        if d.get(k) is not None:
            setattr(t, k, _number(p, k, d[k], integer=True))
    if "ngram" in d:
        t.ngram = _curve(p, "ngram", d["ngram"], "num_reqs")
    if "skip" in d:
        t.skip = _curve(p, "skip", d["skip"], "num_reqs")
    if "sample" in d:
        t.sample = _curve(p, "sample", d["sample"], "num_tokens")
    if "alloc" in d:
        if not isinstance(d["alloc"], dict):
            raise ConfigError(f"{p}: field 'alloc' must be an object of policy name -> {{'num_reqs', 'ms'}}")
        t.alloc = {name: _curve(p, f"alloc.{name}", v, "num_reqs") for name, v in d["alloc"].items()}
    if "cpu" in d:
        c = d["cpu"]
        if not isinstance(c, dict) or set(c) - set(CPU_KEYS):
            raise ConfigError(f"{p}: field 'cpu' must be an object with keys among {', '.join(CPU_KEYS)}")
        t.cpu = {k: _number(p, f"cpu.{k}", c.get(k, 0.0)) for k in CPU_KEYS}
    if "machine" in d:
        m = d["machine"]
        if not isinstance(m, dict) or not all(v is None or isinstance(v, (str, int, float, bool)) for v in m.values()):
            raise ConfigError(f"{p}: field 'machine' must be an object of strings and numbers")
        t.machine = dict(m)
    if "plugin" in d:
        t.plugin = _plugin(p, d["plugin"])
    return t


def _plugin(path, v, key: str = "plugin") -> dict:
    """The "plugin" field (or its in_draft), checked: a_ms and b_ms_per_req numbers >= 0, steps a positive integer
    when given, in_draft (top level only) an object of the same keys."""
    nested = ("in_draft",) if key == "plugin" else ()
    if not isinstance(v, dict) or any(k not in v for k in PLUGIN_KEYS) or set(v) - {*PLUGIN_KEYS, "steps", *nested}:
        raise ConfigError(f"{path}: field '{key}' must be an object with {' and '.join(PLUGIN_KEYS)} (optional: "
                          f"{', '.join(('steps',) + nested)})")
    out: dict = {k: _number(path, f"{key}.{k}", v[k]) for k in PLUGIN_KEYS}
    if "steps" in v:
        out["steps"] = _number(path, f"{key}.steps", v["steps"], integer=True)
    if "in_draft" in v and nested:
        out["in_draft"] = _plugin(path, v["in_draft"], f"{key}.in_draft")
    return out


def plugin_fit(samples) -> dict | None:
    """A fit of the "plugin" field from per-step samples [(R, ms), ...] of the plugin's own work: the least-squares
    line ms = a_ms + b_ms_per_req * R, kept non-decreasing and non-negative (b < 0: the mean, b = 0; a < 0: the line
    through the origin), with the number of samples (steps). None without a sample with R > 0."""
    pts = np.asarray([(float(r), float(ms)) for r, ms in samples if r > 0 and math.isfinite(ms)], dtype=np.float64)
    if pts.size == 0:
        return None
    R, ms = pts[:, 0], np.maximum(pts[:, 1], 0.0)
    b = float(np.polyfit(R, ms, 1)[0]) if np.unique(R).size > 1 else 0.0
    a = float(ms.mean() - b * R.mean())
    if b < 0.0:
        a, b = float(ms.mean()), 0.0
    elif a < 0.0:
        a, b = 0.0, float((R * ms).sum() / (R * R).sum())
    return {"a_ms": round(a, 6), "b_ms_per_req": round(b, 6), "steps": int(len(pts))}


def _load_csv(p: Path) -> CostTable:
    meta: dict[str, str] = {}
    from sim.infra.inputs import RECORD, read_text

    lines = read_text(p, RECORD, "cost table").splitlines()
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
            raise ConfigError(f"{p}: data row {i}: table must be 'verify' or 'draft', got '{r[0]}' "
                              f"(the other parts are JSON only)")
    for k in ("llm", "gpu"):
        if k not in meta:
            raise ConfigError(f"{p}: missing '# {k}: ...' line")
    for k in JSON_ONLY:
        if k in meta:
            raise ConfigError(f"{p}: '# {k}:' is not read from a CSV table; write a JSON table for it")

    def meta_num(k, default, integer=False):
        try:
            v = float(meta[k]) if meta.get(k) else default
        except ValueError:
            raise ConfigError(f"{p}: '# {k}:' must be a number, got {meta[k]!r}") from None
        return v if v is None else _number(p, k, v, integer)

    try:
        caps = [int(float(c)) for c in meta.get("capture_sizes", "").replace(",", " ").split()]
    except ValueError:
        raise ConfigError(f"{p}: '# capture_sizes:' must be numbers") from None
    StepTable(vt, vm, what=f"{p}: verify rows")
    if dt:
        StepTable(dt, dm, what=f"{p}: draft rows")
    return CostTable(llm=meta["llm"], gpu=meta["gpu"], verify_tokens=vt, verify_ms=vm, draft_reqs=dt, draft_ms=dm,
                     draft_block=meta_num("draft_block", 7, integer=True), capture_sizes=caps,
                     kv_ms_per_token=meta_num("kv_ms_per_token", None),
                     derived=meta.get("derived", "false").lower() == "true", source=meta.get("source", ""),
                     path=str(p))


def default_table_path(llm: str, gpu: str) -> Path:
    return models_dir() / "cost_tables" / f"{gpu}_{llm}.json"


def list_cost_tables() -> list[str]:
    d = models_dir() / "cost_tables"
    return sorted(p.name for p in d.glob("*") if p.suffix in (".json", ".csv")) if d.is_dir() else []


def roofline_fallback(llm: str, gpu: str, **kw) -> CostModel | None:
    """The roofline model of `llm` on `gpu` (CostConfig keywords in kw), or None when either name has no
    spec in models/ (a table profiled on a CPU, say): then a table must hold every part it is asked for."""
    if llm.strip().lower() not in list_llms() or gpu.strip().lower() not in list_gpus():
        return None
    return RooflineCost(CostConfig(llm=llm, gpu=gpu, **kw))


class ProfiledCost(CostModel):
    """Step cost from a measured table (see module docstring); parts it lacks from `fallback`
    (default: roofline_fallback of the table's llm and gpu; None there = no fallback)."""

    name = "profiled"

    def __init__(self, table: CostTable | str | Path, fallback: CostModel | None = None) -> None:
        if not isinstance(table, CostTable):
            table = load_cost_table(table)
        self.table = t = table
        self.fallback = fallback if fallback is not None else roofline_fallback(t.llm, t.gpu)
        self._what = f"cost table {t.path or f'{t.gpu}/{t.llm}'}"

        def curve(xy, key, caps=()):
            return StepTable(xy[0], xy[1], caps, what=f"{self._what}: {key}") if xy and len(xy[0]) else None

        self.verify_curve = curve((t.verify_tokens, t.verify_ms), "verify", t.capture_sizes)
        self.draft_curve = curve((t.draft_reqs, t.draft_ms), "draft", t.capture_sizes)
        self.ngram_curve = curve(t.ngram, "ngram")
        self.skip_curve = curve(t.skip, "skip")
        self.sample_curve = curve(t.sample, "sample")
        self.alloc_curves = {name: curve(xy, f"alloc.{name}") for name, xy in t.alloc.items()}
        kv = t.kv_ms_per_token
        if kv is None:
            kv = float(getattr(self._need("kv_ms_per_token"), "kv_ms_per_token", 0.0))
        if kv < 0:
            raise ConfigError("kv_ms_per_token must be >= 0")
        self.kv_ms_per_token = kv
        self.seq_ms = float(t.seq_ms)
        self.attn_ms_per_row_kv = float(t.attn_ms_per_row_kv)
        self.short_query_max = int(t.short_query_max)
        self.kv_view_ms_per_token = float(t.kv_view_ms_per_token)
        self.logits_ms_per_row = t.logits_ms_per_row
        self._logit_rows = np.zeros(0)   # logits_ms_per_row * arange(n), for verify_table
        self.verify_curve.table(1024)  # warm the lookup caches used by verify_ms / verify_table / draft_ms
        if self.draft_curve is not None:
            self.draft_curve.table(1024)

    def _need(self, key: str) -> CostModel:
        """The fallback for a part the table lacks; ConfigError when there is none."""
        if self.fallback is None:
            raise ConfigError(f"{self._what} has no '{key}', and there is no roofline model of "
                              f"{self.table.llm} on {self.table.gpu} to fall back on")
        return self.fallback

    @property
    def kv_capacity_tokens(self) -> int:
        if self.table.kv_capacity_tokens is not None:
            return int(self.table.kv_capacity_tokens)
        return self._need("kv_capacity_tokens").kv_capacity_tokens

    @property
    def vocab_size(self) -> int | None:
        if self.table.vocab_size is not None:
            return int(self.table.vocab_size)
        return None if self.fallback is None else self.fallback.vocab_size

    @property
    def machine(self) -> dict:
        return self.table.machine

    @property
    def capture_sizes(self) -> list[int]:
        """The table's capture sizes ([] = eager only)."""
        return [int(c) for c in self.table.capture_sizes]

    def _attn_per_row(self, kv_tokens: int, num_seqs: int) -> float:
        """attn_ms_per_row_kv * K / S: what each query row beyond one per sequence adds [ms] (0 when S = 0)."""
        s = max(int(num_seqs), 0)
        return self.attn_ms_per_row_kv * max(int(kv_tokens), 0) / s if s and self.attn_ms_per_row_kv else 0.0

    @property
    def padded(self) -> bool:
        """Whether the table prices the step's padded attention shape (sim/core/cost/padded.py) when given one."""
        return self.short_query_max > 0

    def verify_ms(self, num_tokens, kv_tokens: int, num_seqs: int, logit_rows=None, shape=None):
        """f_verify(T) + kv_ms_per_token*K + seq_ms*S + attn_ms_per_row_kv*max(T - S, 0)*K/S, plus
        logits_ms_per_row * logit_rows (None = T) when the table was measured without the LM head. With a padded
        table and the step's `shape` (sim.core.cost.padded.AttentionShape; scalar T only) the K and K/S terms are the
        shape's instead (module docstring)."""
        if shape is not None and self.short_query_max > 0 and isinstance(num_tokens, (int, np.integer)):
            t = int(num_tokens)
            if t <= 0:
                return 0.0
            cache = self.verify_curve._cache
            base = float(cache[t] if t < cache.size else self.verify_curve(t))
            if self.logits_ms_per_row is not None:
                base += self.logits_ms_per_row * (t if logit_rows is None else max(int(logit_rows), 0))
            return (base + self.kv_ms_per_token * shape[0] + self.kv_view_ms_per_token * shape[1]
                    + self.attn_ms_per_row_kv * shape[2] + max(int(num_seqs), 0) * self.seq_ms)
        add = max(int(kv_tokens), 0) * self.kv_ms_per_token + max(int(num_seqs), 0) * self.seq_ms
        per_row, s = self._attn_per_row(kv_tokens, num_seqs), max(int(num_seqs), 0)
        lg = self.logits_ms_per_row
        if isinstance(num_tokens, (int, np.integer)) and not isinstance(num_tokens, bool):
            t = int(num_tokens)
            if t <= 0:
                return 0.0
            cache = self.verify_curve._cache
            base = float(cache[t] if t < cache.size else self.verify_curve(t))
            if lg is not None:
                base += lg * (t if logit_rows is None else max(int(logit_rows), 0))
            return base + add + per_row * max(t - s, 0)
        t = np.asarray(num_tokens)
        out = np.asarray(self.verify_curve(t)) + add + per_row * np.maximum(t - s, 0)
        if lg is not None:
            out = out + lg * (t if logit_rows is None else np.maximum(np.asarray(logit_rows), 0))
        return np.where(t > 0, out, 0.0)

    def verify_table(self, max_tokens: int, kv_tokens: int, num_seqs: int) -> np.ndarray:
        n = int(max_tokens) + 1
        out = self.verify_curve.table(n) + (max(int(kv_tokens), 0) * self.kv_ms_per_token
                                            + max(int(num_seqs), 0) * self.seq_ms)
        per_row = self._attn_per_row(kv_tokens, num_seqs)
        if per_row:
            out = out + per_row * np.maximum(np.arange(n, dtype=np.float64) - max(int(num_seqs), 0), 0.0)
        if self.logits_ms_per_row is not None:
            if n > self._logit_rows.size:
                self._logit_rows = self.logits_ms_per_row * np.arange(max(n, 2 * self._logit_rows.size, 1024),
                                                                      dtype=np.float64)
            out += self._logit_rows[:n]
        if out.size:
            out[0] = 0.0
        return out

    def draft_ms(self, num_reqs: int, block: int, kv_tokens: int = 0) -> float:
        pos = max(int(num_reqs), 0) * max(int(block), 0)
        if pos == 0:
            return 0.0
        if self.draft_curve is None:
            return float(self._need("draft").draft_ms(num_reqs, block))
        x = math.ceil(pos / max(self.table.draft_block, 1))
        cache = self.draft_curve._cache
        return float(cache[x]) if x < cache.size else float(self.draft_curve(x))

    def ngram_ms(self, num_reqs: int, on_gpu: bool = True) -> float:
        if self.ngram_curve is None:
            return self._need("ngram").ngram_ms(num_reqs, on_gpu)
        return float(self.ngram_curve(int(num_reqs)))

    def alloc_ms(self, num_reqs: int, policy: str | None = None, adaptive: bool = False) -> float:
        """The policy's own alloc table, else the "*" one, else the fallback's."""
        c = self.alloc_curves.get(policy) if policy is not None else None
        if c is None:
            c = self.alloc_curves.get("*")
        if c is not None:
            return float(c(int(num_reqs)))
        fb = self._need("alloc")
        return fb.alloc_ms(num_reqs, policy, adaptive)

    def skip_residual_ms(self, num_reqs: int) -> float:
        """The table's "skip" curve at R requests (module docstring); 0 without it."""
        if self.skip_curve is None or int(num_reqs) <= 0:
            return 0.0
        return float(self.skip_curve(int(num_reqs)))

    def plugin_ms(self, num_reqs: int) -> float:
        """The table's "plugin" field at R requests, less its in_draft part (module docstring); 0 without it."""
        pl, r = self.table.plugin, max(int(num_reqs), 0)
        if pl is None or r == 0:
            return 0.0
        held = pl.get("in_draft") or {"a_ms": 0.0, "b_ms_per_req": 0.0}
        return max(pl["a_ms"] + pl["b_ms_per_req"] * r - (held["a_ms"] + held["b_ms_per_req"] * r), 0.0)

    def sample_ms(self, num_tokens: int) -> float:
        if self.sample_curve is None:
            return self._need("sample").sample_ms(num_tokens)
        return float(self.sample_curve(int(num_tokens)))

    def cpu_ms(self, num_reqs: int, num_tokens: int) -> float:
        c = self.table.cpu
        if c is None:
            return self._need("cpu").cpu_ms(num_reqs, num_tokens)
        r, t = max(int(num_reqs), 0), max(int(num_tokens), 0)
        if r == 0 and t == 0:
            return 0.0
        return c["base_ms"] + c["per_req_ms"] * r + c["per_token_ms"] * t

    def __repr__(self) -> str:
        return f"ProfiledCost(llm={self.table.llm!r}, gpu={self.table.gpu!r}, derived={self.table.derived})"


# Tokens-per-step points above the capture range that a profile measures (interpolated between).
EXTRA_VERIFY_POINTS = (576, 640, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)


def tables_from_cost_model(cost, capture_sizes=None, extra_points=EXTRA_VERIFY_POINTS, draft_block: int = 7,
                           max_reqs: int = 256) -> CostTable:
    """Sample a cost model (e.g. RooflineCost) the way real/validation/profile.py samples a GPU: verify at every
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
                            f"sim.core.cost.profiled.tables_from_cost_model (regenerate: python -m sim.cost --write-tables)")


def _dump(v, indent: int = 0) -> str:
    """JSON with one key per line and every list on one line (readable in a diff)."""
    if isinstance(v, dict) and v:
        pad = " " * (indent + 1)
        items = [f"{pad}{json.dumps(k)}: {_dump(x, indent + 1)}" for k, x in v.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    return json.dumps(v)


def write_cost_table(table: CostTable, path: str | Path, overwrite: bool = False) -> Path:
    """Write `table` as JSON, whole or not at all (a temporary file renamed into place). An existing file
    is a ConfigError unless overwrite=True."""
    p = Path(path)
    if p.suffix.lower() == ".csv":
        raise ConfigError(f"{p}: cost tables are written as JSON; give a .json path")
    return write_whole(p, _dump(table.to_json()) + "\n", overwrite=overwrite)


# What identifies the machine a table was measured on (check_machine compares these keys only).
MACHINE_IDENTITY_KEYS = ("device", "cpu", "torch", "dtype", "threads", "model")


def _same(a, b) -> bool:
    def norm(v):
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        return str(v).strip().lower()
    return norm(a) == norm(b)


def check_machine(table: CostTable | ProfiledCost, machine: dict, strict: bool = False) -> str:
    """Compare the machine a table was measured on with `machine` on MACHINE_IDENTITY_KEYS (values as
    trimmed, case-insensitive strings; 8 == 8.0 == "8"). Returns '' when they agree, else one line
    listing the differences. A key recorded on one side only counts as a difference when `strict`, and is
    skipped otherwise."""
    rec = getattr(table, "table", table).machine or {}
    diffs = []
    for k in MACHINE_IDENTITY_KEYS:
        a, b = rec.get(k), machine.get(k)
        if a is None and b is None:
            continue
        if a is None or b is None:
            if strict:
                diffs.append(f"{k} {'not recorded' if a is None else repr(a)} in the table, "
                             f"{'not given' if b is None else repr(b)} here")
        elif not _same(a, b):
            diffs.append(f"{k} {a!r} in the table, {b!r} here")
    return "" if not diffs else "machine differs from the cost table's: " + "; ".join(diffs)
