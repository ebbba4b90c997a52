"""One config: a dataclass per component of a simulation, each field carrying its help text and its rules as
metadata. `python -m sim.run`'s flags, `python -m sim.sweep`'s grid keys and flags, and the checks of both
are generated from these classes, so a setting is declared once.

    TraceConfig    which requests: the trace, a first-N or seeded sample of it, temperature, context check
    ModelConfig    the served model, the GPU and the cost model
    DrafterConfig  the model-drafter profile (or recorded drafts), the n-gram calibrator and chain length,
                   whether the draft tables are built whole or per request (streamed), the drafters the run
                   enables and their settings (drafter_config; each drafter declares its own)
    ServingConfig  the engine: arrivals, token budget, KV-cache size, asynchronous scheduling, the budget's rule
                   and the vLLM release it models
    RunGrid        what a run compares: policies and batch sizes (lists)

Field metadata (`opt`): `help`; `flags`: extra option names (vLLM's spellings); `grid`: "prep" (fixes the draft
tables: one preparation per value), "run" (varies per simulation) or None (not a sweep key); `min` and
`strict`: the lowest allowed value (`strict`: exclusive); `max`: the highest (sizes past it are absurd, and would
reach numpy as allocations); `parse`: how one command-line value is read.
`BASELINE` is the one name of the policy every ratio is taken against.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from sim.core.cost import DEFAULT_COST_KIND, cost_kinds
from sim.core.cost.profiled import MAX_COUNT
from sim.core.drafters.calibration import DEFAULT_CALIBRATOR
from sim.core.drafters.registry import (add_drafter_flags, collect_drafter_flags, parse_drafter_config,
                                        parse_drafter_list)
from sim.core.drafters.stream import parse_draft_tables
from sim.core.drafters.recalibration import parse_runcal_start
from sim.core.drafters.synthetic import parse_rates
from sim.core.models import gpu_name
from sim.infra.errors import ConfigError
from sim.core.vllm import (DEFAULT_VLLM_VERSION, MIN_RATE, SCHEDULERS, VLLM_VERSIONS, parse_rate, parse_scheduler,
                           parse_vllm_version)

BASELINE = "adaptive"  # vLLM 0.33's adaptive verification: every speedup is taken against it
# the confidences the plugin publishes past its chosen chain (hybrid_spec.tail) in its tail settings, tuned on
# general text, not on the traces the reports evaluate, with `python -m sim.past_slots --limit 400 --batch-size 1
# --batch-size 4 --batch-size 32 --tail 0.02 --tail 0.05 --tail 0.1 --tail 0.2` and, at batch 1, `--tail 0.3 --tail
# 0.5`: 0.05 the best mean gain over tail 0 at batch 1 and 4, 0.2 where batch 1's gain levels off (0.2, 0.3, 0.5
# equal); every tail is below tail 0 at batch 32: settings of their own, not defaults
PLUGIN_TAILS = (0.05, 0.2)
PLUGIN_SKIP_SETTING = "hybrid-vllm:slots=32:skip:runcal=64"  # the setting the tail settings extend
PLUGIN_TAIL_SETTINGS = tuple(f"{PLUGIN_SKIP_SETTING}:tail={c:g}" for c in PLUGIN_TAILS)
# the plugin's settings the verdict weighs (sim.run's defaults and the paper preset alike, so that what the main job
# prints is paper.md's "What to serve"): W = 32 and W = 7, with and without online recalibration, W = 32 with the
# skip, and the tail settings
PLUGIN_SETTINGS = ("hybrid-vllm:slots=32", "hybrid-vllm:slots=32:runcal=64", "hybrid-vllm:runcal=64",
                   PLUGIN_SKIP_SETTING, *PLUGIN_TAIL_SETTINGS)
# every tier of the verdict (sim/core/deploy.py): what vLLM runs as released (none, model-fixed:7, vllm-ngram:32,
# adaptive), the plugin, simulated-only designs, tree attention and the bound
DEFAULT_POLICIES = ("none", "model-fixed:7", "vllm-ngram:32", "ngram-fixed:32", "adaptive", *PLUGIN_SETTINGS,
                    "ngram-first", "ngram-threshold", "hybrid", "hybrid-price", "hybrid-tree", "oracle")
DEFAULT_BATCH_SIZES = (4, 128)
DEFAULT_DRAFTERS = "dspark,ngram"  # what a run enables unless --drafters says otherwise
# the drafters a run of vLLM's suffix decoding (`suffix`, a live drafter) enables beside the default two; reports that
# compare it run it alone with them, as enabling it for every policy gives the hybrids' over-drafters forms a third chain
WITH_SUFFIX = DEFAULT_DRAFTERS + ",suffix"
MAX_BATCH_SIZE = 2**20  # the most running requests a run (or a recorded cell) can name


def opt(default: Any, help: str, *, flags: tuple[str, ...] = (), grid: str | None = "prep", min: float | None = None,
        strict: bool = False, max: float | None = None, parse: Callable | None = None,
        default_factory: Callable | None = None):
    """A config field: its default and its metadata (module docstring)."""
    meta = {"help": help, "flags": flags, "grid": grid, "min": min, "strict": strict, "max": max, "parse": parse}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class TraceConfig:
    trace: str = opt("traces/codeedit.jsonl", "JSONL trace (python -m sim.trace convert makes one from vLLM's "
                     "benchmark datasets)")
    limit: int | None = opt(None, "use the first N requests of the trace (they may all come from one part of it)",
                            min=1, max=10**9)
    sample: int | None = opt(None, "use N requests sampled across the whole trace (seeded by --seed, kept in trace "
                             "order); exclusive with --limit", flags=("--num-prompts",), min=1, max=10**9)
    seed: int = opt(0, "seed of the sample and of the drafters' draws", min=0, max=2**63 - 1)
    temperature: float | None = opt(None, "override every request's temperature", min=0, max=100)
    max_model_len: int | None = opt(None, "context length requests are checked against (default: the model's, "
                                    "models/llms/)", grid=None, min=1, max=2**31 - 1)


@dataclass
class ModelConfig:
    model: str = opt("qwen3-8b", "a models/llms name or its Hugging Face id (Qwen/Qwen3-8B), or a path: a spec .json, "
                     "a Hugging Face config.json or a model directory (docs/your-model.md)")
    tokenizer: str | None = opt(None, "what tokenizes the trace's text: a tokenizer.json, a Hugging Face id in the local "
                                "cache, or qwen3 / smollm2 standing in (default: the model's own, its spec's)", grid=None)
    gpu: str = opt("h100-sxm", "GPU name (models/gpus; a short name such as h100 is the spec models/gpu-aliases.json "
                   "maps it to), or with --cost profiled a cost-table file (.json/.csv) profiled for --model",
                   parse=gpu_name)
    cost: str = opt(DEFAULT_COST_KIND, f"cost model, one of the registered kinds: {', '.join(cost_kinds())}")
    tensor_parallel_size: int = opt(1, "GPUs the model is split over (tensor parallelism: weights and FLOPs split, "
                                    "all-reduces added; the GPU spec must state interconnect_gbps)",
                                    flags=("-tp",), grid=None, min=1, max=64)


@dataclass
class DrafterConfig:
    drafter: str = opt("dspark-qwen3-b7", "model-drafter profile: a name in models/drafters/ or a path to a "
                       "profile .json")
    drafts: str | None = opt(None, "recorded model drafts (JSONL sidecar) to replay exactly")
    synthetic_acceptance: str | None = opt(None, "vLLM's synthetic rejection sampling: unconditional per-position "
                                           "acceptance rates R1,R2,... (non-increasing, in [0, 1]; later positions 0) "
                                           "accept every drafter's chain by position, whatever it proposes "
                                           "(sim/core/drafters/synthetic.py)", grid=None, parse=parse_rates)
    runcal_start: str | None = opt(None, "the run-level recalibration's start (runcal=k policies): NAME=OFFSET/PRECISION "
                                   "per drafter, e.g. dspark=-0.19/89.4,ngram=0.02/74.3, instead of the prior (0, k): "
                                   "a real run's state after its warm-up (sim/core/drafters/recalibration.py)",
                                   grid=None, parse=parse_runcal_start)
    calibrator: str = opt(DEFAULT_CALIBRATOR, "n-gram calibrator in models/calibrators/ (or a file)")
    ngram_k: int = opt(32, "n-gram chain length", min=1, max=256)  # NgramConfig's bound (sim/core/drafters/ngram.py)
    draft_tables: str = opt("auto", "draft tables: whole (built for the whole trace up front, cached on disk), stream "
                            "(each request's built when it is admitted and freed when it finishes: memory follows the "
                            "running batch) or auto (stream when the whole tables would pass 1 GiB; docs/memory.md)",
                            grid=None, parse=parse_draft_tables)
    drafters: str = opt(DEFAULT_DRAFTERS, "the drafters the run enables, by name (sim/core/drafters/registry.py: dspark, ngram, "
                        "suffix); hybrid, hybrid-price, hybrid-tree, hybrid-vllm and oracle choose among all of "
                        "them, any other policy must use enabled ones", parse=parse_drafter_list)
    drafter_config: str | None = opt(None, "every drafter's settings as one JSON object, e.g. '{\"suffix\": "
                                     "{\"max_depth\": 24}}' (each drafter declares its settings: "
                                     "sim/core/drafters/registry.py; or the per-drafter flags below)",
                                     parse=parse_drafter_config)


@dataclass
class ServingConfig:
    rate: float | None = opt(None, "Poisson arrivals (req/s) instead of all at t=0 (inf: all at t=0, vLLM's default)",
                             flags=("--request-rate",), grid="run", min=MIN_RATE, parse=parse_rate)
    kv_capacity_tokens: int | None = opt(None, "override the KV-cache size (tokens)", grid="run", min=1, max=MAX_COUNT)
    max_num_batched_tokens: int = opt(8192, "token budget of one engine step (vLLM's max_num_batched_tokens)",
                                      grid="run", min=1, max=2**31 - 1)
    async_scheduling: bool = opt(True, "overlap the CPU work of step t+1 with the GPU work of step t (vLLM's async "
                                 "scheduling); --no-async-scheduling for engines whose steps are synchronous "
                                 "(the real torch engine)", grid=None)
    scheduler: str = opt("hybridspec", f"how the token budget charges draft slots: {SCHEDULERS[0]} (the project's "
                         "engines: the slots verified) or vllm (vLLM's scheduler: every proposed slot plus its "
                         "method's extra slots, KV lookahead; policies with no vLLM counterpart are refused; "
                         "hybrid-vllm and vllm-ngram always get it)", grid=None, parse=parse_scheduler)
    vllm_version: str = opt(DEFAULT_VLLM_VERSION, f"the vLLM release whose scheduling vLLM's charge models, one of "
                            f"{', '.join(VLLM_VERSIONS)}: DSpark's extra slots and whether a drafter pass no request "
                            "can use is skipped (sim/core/vllm.py)", grid=None, parse=parse_vllm_version)


@dataclass
class RunGrid:
    policy: list = opt(None, "policy (repeatable; every combination runs)", grid="run",
                       default_factory=lambda: list(DEFAULT_POLICIES))
    batch_size: list = opt(None, "max running requests (repeatable)", flags=("--max-num-seqs",),
                           grid="run", min=1, max=MAX_BATCH_SIZE, default_factory=lambda: list(DEFAULT_BATCH_SIZES))


COMPONENTS = (TraceConfig, ModelConfig, DrafterConfig, ServingConfig)


def fields_of(*classes) -> list[dataclasses.Field]:
    return [f for c in classes for f in dataclasses.fields(c)]


def _base_type(f: dataclasses.Field) -> type:
    """int, float, str or bool from the annotation (Optional stripped; RunGrid's lists: by field)."""
    if f.name == "policy":
        return str
    if f.name == "batch_size":
        return int
    hint = typing.get_type_hints(_OWNER[f.name])[f.name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


_OWNER = {f.name: c for c in COMPONENTS + (RunGrid,) for f in dataclasses.fields(c)}
PREP_KEYS = tuple(f.name for f in fields_of(*COMPONENTS, RunGrid) if f.metadata["grid"] == "prep")
RUN_KEYS = tuple(f.name for f in fields_of(RunGrid, *COMPONENTS) if f.metadata["grid"] == "run")
GRID_KEYS = PREP_KEYS + RUN_KEYS
FIELDS = {f.name: f for f in fields_of(*COMPONENTS, RunGrid)}
INT_KEYS = frozenset(k for k in FIELDS if _base_type(FIELDS[k]) is int)
FLOAT_KEYS = frozenset(k for k in FIELDS if _base_type(FIELDS[k]) is float)
NONE_OK = frozenset(k for k, f in FIELDS.items() if f.default is None and f.default_factory is dataclasses.MISSING)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def defaults(name: str):
    f = FIELDS[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def check(name: str, value) -> None:
    """ConfigError (one line, naming the flag) if `value` breaks the field's rules; None passes."""
    if value is None:
        return
    f = FIELDS[name]
    if isinstance(value, float) and (math.isnan(value) or (math.isinf(value) and f.metadata["parse"] is None)):
        raise ConfigError(f"{flag(name)} must be a finite number, got {value}")  # (--rate inf: all at t=0)
    from sim.infra.inputs import show_number  # an integer bound printed as one: <= 1000000000, not <= 1e+09

    lo, strict, hi = f.metadata["min"], f.metadata["strict"], f.metadata["max"]
    if lo is not None and (value <= lo if strict else value < lo):
        raise ConfigError(f"{flag(name)} must be {'>' if strict else '>='} {show_number(lo)}, got {value}")
    if hi is not None and value > hi:
        raise ConfigError(f"{flag(name)} must be <= {show_number(hi)}, got "
                          f"{value if isinstance(value, int) else format(value, '.6g')}")


GROUP_TITLES = {"RunGrid": "what runs", "TraceConfig": "workload", "ModelConfig": "model and hardware",
                "DrafterConfig": "speculation", "ServingConfig": "serving engine"}
GROUP_ORDER = ("what runs", "workload", "model and hardware", "speculation", "serving engine", "output")


def flag_group(ap: argparse.ArgumentParser, title: str):
    """The parser's argument group titled `title` (made on first use), so a command's own flags join the
    groups of the config fields (e.g. --speculative-config under "speculation")."""
    groups = ap.__dict__.setdefault("_hybridspec_groups", {})
    if title not in groups:
        groups[title] = ap.add_argument_group(title)
    return groups[title]


def _default_text(f: dataclasses.Field) -> str:
    """' (default: X)' for a field with a default worth printing (not None, not a flag that is off)."""
    v = defaults(f.name)
    if v is None or v is False:
        return ""
    if isinstance(v, bool):
        return f" (default: --{f.name.replace('_', '-')})"
    return f" (default: {' '.join(map(str, v)) if isinstance(v, list) else v})"


def add_flags(ap: argparse.ArgumentParser, classes, repeatable: bool = False, grid_only: bool = False) -> None:
    """One option per field of `classes`, in an argument group per class (GROUP_TITLES): its name, its vLLM
    aliases, its type and help (with its default, once). repeatable: every option appends to a list
    (sim.api.sweep's grid values) and has no default; grid_only: sweep keys only."""
    for cls in classes:
        group = flag_group(ap, GROUP_TITLES.get(cls.__name__, cls.__name__))
        for f in dataclasses.fields(cls):
            if grid_only and f.metadata["grid"] is None:
                continue
            names = [flag(f.name), *f.metadata["flags"]]
            help_ = f.metadata["help"]
            if f.metadata["flags"]:
                help_ += f" (vLLM's {', '.join(f.metadata['flags'])})"
            typ = _base_type(f)
            kw: dict = {"dest": f.name, "help": help_}
            if repeatable:
                kw.update(action="append", type=str if f.metadata["parse"] is not None else typ)
            elif typ is bool:
                kw.update(action=argparse.BooleanOptionalAction, default=defaults(f.name),
                          help=help_ + _default_text(f))
            elif f.default_factory is not dataclasses.MISSING:  # a list (RunGrid): repeatable, empty = the defaults
                kw.update(action="append", type=typ, default=None, help=help_ + _default_text(f))
            else:
                kw.update(type=f.metadata["parse"] or typ, default=defaults(f.name), help=help_ + _default_text(f))
            group.add_argument(*names, **kw)
        if cls is DrafterConfig and not repeatable:  # each drafter's declared settings as flags of their own
            add_drafter_flags(group)


def from_args(cls, ns: argparse.Namespace):
    """An instance of `cls` (a dataclass built from the components) from parsed flags, every field checked."""
    kw = {f.name: getattr(ns, f.name) for f in dataclasses.fields(cls) if hasattr(ns, f.name)}
    if "drafter_config" in kw:  # --D-config / --D-SETTING laid over --drafter-config
        kw["drafter_config"] = collect_drafter_flags(ns, kw["drafter_config"])
    for k, v in kw.items():
        if k in FIELDS and not isinstance(v, list):
            check(k, v)
    return cls(**kw)
