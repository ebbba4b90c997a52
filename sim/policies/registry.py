"""The policy registry: parse a policy spec such as `model-fixed:7` or `hybrid-price:sweep` into a Policy.

A family registers itself with `@register(name, usage, summary)` on a factory that takes the spec's
parameters (the strings after the first ':') and returns a `Policy`. Factories raise ValueError on a bad
parameter; `get_policy` turns that into a one-line ConfigError naming the valid choices.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from sim.errors import ConfigError
from sim.policies.base import Allocation, StepBatch


@dataclass(frozen=True)
class Policy:
    """An allocation policy: a pure batched-tensor function StepBatch -> Allocation, plus what it needs.

    uses_model / uses_ngram: which drafters must run this step (the engine charges their cost).
    needs_truth: reads true_model_acc / true_ngram_acc (only the oracle).
    host_sync: needs a device-to-host copy of current-step values (False for every policy here).
    tree: may verify both chains as two branches (Allocation.second); engines that verify chains only
        (the real torch engine) refuse it.
    sim_fn: a faster form of `fn` that the simulator runs instead (sim.policies.fast, checked against `fn`
        by tests/test_policy_fast_forms.py); None = the simulator runs `fn`. Real engines always run `fn`.
    sim_for: the `fn` that sim_fn is a form of; a copy whose fn was replaced (dataclasses.replace(pol,
        fn=...), as tests do to inject a bug) no longer matches it, and the simulator then runs that fn.
    """

    name: str
    fn: Callable[[StepBatch], Allocation] = field(repr=False, compare=False)
    uses_model: bool
    uses_ngram: bool
    needs_truth: bool = False
    host_sync: bool = False
    tree: bool = False
    sim_fn: Optional[Callable[[StepBatch], Allocation]] = field(default=None, repr=False, compare=False)
    sim_for: Optional[Callable[[StepBatch], Allocation]] = field(default=None, repr=False, compare=False)

    @property
    def sim_callable(self) -> Callable[[StepBatch], Allocation]:
        """What the simulator runs: sim_fn while it is the form of this policy's fn, else the policy itself."""
        return self.sim_fn if self.sim_fn is not None and self.sim_for is self.fn else self

    def __call__(self, batch: StepBatch) -> Allocation:
        if self.needs_truth and (batch.true_model_acc is None or batch.true_ngram_acc is None):
            raise ConfigError(f"policy '{self.name}' needs the true accepted lengths, which this engine "
                              "does not provide")
        return self.fn(batch)


@dataclass(frozen=True)
class _Family:
    usage: str
    summary: str
    factory: Callable[[List[str]], Policy]


_REGISTRY: Dict[str, _Family] = {}


def register(name: str, usage: str, summary: str):
    """Decorator: register `factory(params: list[str]) -> Policy` under the family `name`."""

    def deco(factory: Callable[[List[str]], Policy]):
        if name in _REGISTRY:
            raise RuntimeError(f"policy family '{name}' registered twice")
        _REGISTRY[name] = _Family(usage, summary, factory)
        return factory

    return deco


def _load() -> None:
    # The families register themselves on import.
    from sim.policies import simple, adaptive, hybrid, tree  # noqa: F401,I001  (listing order)


def list_policies() -> List[str]:
    """Usage strings of every registered family, e.g. ['none', 'model-fixed:K', ...]."""
    _load()
    return [fam.usage for fam in _REGISTRY.values()]


def describe_policies() -> Dict[str, str]:
    """usage -> one-line summary, for CLI help."""
    _load()
    return {fam.usage: fam.summary for fam in _REGISTRY.values()}


def get_policy(spec: str) -> Policy:
    """Build the policy named by `spec` ('family' or 'family:param[:param]'); ConfigError if unknown."""
    _load()
    choices = ", ".join(list_policies())
    name, *params = str(spec).strip().split(":")
    fam = _REGISTRY.get(name)
    if fam is None:
        raise ConfigError(f"unknown policy '{spec}'; choose one of: {choices}")
    try:
        pol = fam.factory(params)
    except ValueError as exc:
        raise ConfigError(f"unknown policy '{spec}' ({exc}); choose one of: {choices}") from None
    from sim.policies.fast import sim_form

    fast = sim_form(spec)
    return pol if fast is None else dataclasses.replace(pol, sim_fn=fast, sim_for=pol.fn)


def parse_int(text: str, what: str, lo: int = 0) -> int:
    """Parse an integer parameter >= lo, ValueError otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{what} must be an integer, got '{text}'") from None
    if value < lo:
        raise ValueError(f"{what} must be >= {lo}, got {value}")
    return value


def parse_float(text: str, what: str, lo: float = 0.0) -> float:
    """Parse a finite float parameter >= lo, ValueError otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what} must be a number, got '{text}'") from None
    if not (value >= lo and value < float("inf")):
        raise ValueError(f"{what} must be a finite number >= {lo}, got {text}")
    return value


def no_params(name: str, params: List[str]) -> None:
    if params:
        raise ValueError(f"'{name}' takes no parameter")
