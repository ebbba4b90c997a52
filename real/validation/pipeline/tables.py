"""An engine's own cost tables as a project cost table (sim/core/cost/profiled.py), so a prediction prices a step
the way the engine itself priced it.

vLLM's adaptive verification profiles two tables in every run that has it (0.33 on CUDA: CUDA-graph replays in
capture_model; the CPU build: the harness runs the same profiling loop on the wall clock):

    draft_ms[R]   the drafter's pass for R requests                      [ms], R = 0 .. max_num_seqs
    verify_ms[T]  the target's forward over T scheduled tokens           [ms], T = 0 .. max_num_batched_tokens

Index 0 is vLLM's "nothing launched" entry and is dropped. The run's CUDA-graph capture sizes go with them: the
simulator pads a step of T tokens up to the next captured size c >= T and charges verify_ms[c], as the engine
replays the graph of size c (an eager run, the CPU build's, captures nothing: []).

Everything vLLM's budget does not read (sampling, host work, KV reads beyond the profile's) is taken from a
complement table when one is given -- the GPU flow's `vllm bench forward` profile of the same machine -- and is 0
otherwise (then the prediction is the engine's own priced steps: exact for step counts, a lower bound for time).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from sim.infra.cli import write_whole
from sim.infra.errors import ConfigError

# the parts of a complement table that are not vLLM's two tables (sim/core/cost/profiled.py's keys)
COMPLEMENT_KEYS = ("kv_ms_per_token", "seq_ms", "attn_ms_per_row_kv", "logits_ms_per_row", "sample", "cpu", "ngram",
                   "alloc", "vocab_size")


def engine_table(tables: Mapping[str, Any], *, llm: str, label: str, block: int, capture_sizes: list[int],
                 machine: Mapping[str, Any], source: str, complement: Mapping[str, Any] | None = None,
                 extra: Mapping[str, Any] | None = None) -> dict:
    """The project cost table (JSON object) of an engine's recorded tables (module docstring). extra: further
    top-level keys the engine measured itself (e.g. the plugin's own step cost)."""
    from sim.core.cost.profiled import FORMAT

    if not tables or "verify_ms" not in tables or "draft_ms" not in tables:
        raise ConfigError(f"{source}: the run recorded no cost tables (adaptive verification off?)")
    v, d = list(tables["verify_ms"]), list(tables["draft_ms"])
    if len(v) < 2 or len(d) < 2:
        raise ConfigError(f"{source}: the recorded cost tables are empty")
    obj: dict[str, Any] = {
        "format": FORMAT, "llm": llm, "gpu": label, "derived": False, "source": source,
        "capture_sizes": sorted({int(c) for c in capture_sizes if int(c) > 0}),
        "verify": {"num_tokens": list(range(1, len(v))), "ms": [float(x) for x in v[1:]]},
        "draft": {"block": int(block), "num_reqs": list(range(1, len(d))), "ms": [float(x) for x in d[1:]]},
        "machine": dict(machine)}
    if complement:
        obj.update({k: complement[k] for k in COMPLEMENT_KEYS if k in complement})
    else:  # only vLLM's two tables: everything else costs nothing
        obj.update({"kv_ms_per_token": 0.0, "ngram": {"num_reqs": [1], "ms": [0.0]},
                    "alloc": {"*": {"num_reqs": [1], "ms": [0.0]}}, "sample": {"num_tokens": [1], "ms": [0.0]},
                    "cpu": {"base_ms": 0.0}})
    obj.update(dict(extra or {}))
    return obj


def write_engine_table(path: Path, obj: Mapping[str, Any]) -> Path:
    """The table written whole (a cell's own file under --out: rewritten when the cell is)."""
    return write_whole(path, json.dumps(obj) + "\n", overwrite=True)
