"""The policy catalog: every registered family, and `get_policy`, which parses a spec such as `model-fixed:7` or
`hybrid-price:sweep` into a Policy (with its simulator fast form where one is written, sim/policies/fast.py).

The families register themselves (sim/policies/registry.py: `register`) when this module imports them; the
registry imports none of them, so the imports run one way: catalog -> families -> registry.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List

from sim.errors import ConfigError
from sim.policies import simple, adaptive, hybrid, tree  # noqa: F401,I001  (registration, in listing order)
from sim.policies.fast import sim_form
from sim.policies.registry import Policy, families


def list_policies() -> List[str]:
    """Usage strings of every registered family, e.g. ['none', 'model-fixed:K', ...]."""
    return [fam.usage for fam in families().values()]


def describe_policies() -> Dict[str, str]:
    """usage -> one-line summary, for CLI help."""
    return {fam.usage: fam.summary for fam in families().values()}


def get_policy(spec: str) -> Policy:
    """Build the policy named by `spec` ('family' or 'family:param[:param]'); ConfigError if unknown."""
    choices = ", ".join(list_policies())
    name, *params = str(spec).strip().split(":")
    fam = families().get(name)
    if fam is None:
        raise ConfigError(f"unknown policy '{spec}'; choose one of: {choices}")
    try:
        pol = fam.factory(params)
    except ValueError as exc:
        raise ConfigError(f"unknown policy '{spec}' ({exc}); choose one of: {choices}") from None
    fast = sim_form(spec)
    return pol if fast is None else dataclasses.replace(pol, sim_fn=fast, sim_for=pol.fn)
