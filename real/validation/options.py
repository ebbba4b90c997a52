"""The options of the validation commands as frozen dataclasses: what the command line gave, read once at the
command's boundary and handed down unchanged (a value the pipeline resolves, such as the engine's default limit, is
a local of the flow that resolves it, never written back).

    ValidateOptions   python real/validate.py   (real/validation/validate.py's parser)
    ProfileOptions    python real/profile_costs.py    (real/validation/profile.py's parser)

`vllm` holds the vLLM flags that were given, by VllmRunConfig field (real/validation/vllm/config.py: vllm_flags), so
the vLLM flows build their config from it (config.from_args) and the torch flow refuses it (config.given_flags).
None in a field means "the engine's default" (the torch engine, vLLM on GPU and on CPU each have their own).
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from real.validation.pipeline.lossless import DEFAULT_TIE_EPSILON


def _from_namespace(cls, ns: argparse.Namespace, argv, lists: tuple[str, ...]):
    """An instance of the options class `cls` from parsed flags: the fields the parser has, `lists` (repeatable
    flags) as tuples, the command line, and the vLLM flags given."""
    from real.validation.vllm.config import vllm_flags

    kw = {f.name: getattr(ns, f.name) for f in dataclasses.fields(cls) if f.name not in ("argv", "vllm")
          and hasattr(ns, f.name)}
    for k in lists:
        kw[k] = None if kw.get(k) is None else tuple(kw[k])
    return cls(**kw, argv=tuple(argv), vllm=vllm_flags(ns))


@dataclass(frozen=True)
class ValidateOptions:
    engine: str = "torch"
    policy: tuple[str, ...] | None = None
    drafters: str = "dspark,ngram"
    batch_size: tuple[int, ...] | None = None
    grid: str = "default"
    quick: bool = False
    trace: tuple[str, ...] | None = None
    limit: int | None = None
    max_tokens: int | None = None
    max_prompt: int | None = None
    seed: int = 0
    model: str = "smollm2-135m"
    random_weights: bool = False
    device: str = "cpu"
    drafter: str = "default"
    cost_table: str | None = None
    allow_other_machine: bool = False
    repeat: int | None = None
    margin: float = 3.0                  # percent
    load_guard: float = 0.25             # cores
    max_error: float | None = None       # percent
    skip_checks: bool = False
    tie_epsilon: float = DEFAULT_TIE_EPSILON  # nats (real/validation/pipeline/lossless.py)
    dry_run: bool = False
    from_verdict: str | None = None      # a sim.run --out folder: validate its verdict.json's setups (vLLM engine)
    out: str | None = None
    plotly: str = "inline"
    argv: tuple[str, ...] = ()
    vllm: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace, argv) -> "ValidateOptions":
        """The options of parsed flags (validate's parser) and the command line they came from."""
        return _from_namespace(cls, ns, argv, ("policy", "batch_size", "trace"))


@dataclass(frozen=True)
class ProfileOptions:
    model: str = "smollm2-135m"
    random_weights: bool = False
    device: str = "cpu"
    policy: tuple[str, ...] | None = None
    batch_size: tuple[int, ...] | None = None
    quick: bool = False
    repeat: int | None = None
    out: str | None = None
    force: bool = False
    engine: str = "torch"
    dry_run: bool = False
    gpu_spec: str | None = None          # models/gpus name or file; None: by the device's name
    argv: tuple[str, ...] = ()
    vllm: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace, argv) -> "ProfileOptions":
        """The options of parsed flags (profile's parser) and the command line they came from."""
        return _from_namespace(cls, ns, argv, ("policy", "batch_size"))
