"""The policy catalog: every registered family, and `get_policy`, which parses a spec such as `model-fixed:7` or
`hybrid-price:sweep` into a Policy: the definition, which every engine runs (the simulator attaches its fast forms:
sim/engine/policies.py, sim_policy).

The families register themselves (sim/core/policies/registry.py: `register`) when this module imports them; the
registry imports none of them, so the imports run one way: catalog -> families -> registry.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Dict, List

from sim.core.drafters.registry import DEFAULT_DRAFTERS, parse_drafters
from sim.infra.errors import ConfigError, did_you_mean
from sim.core.policies import simple, adaptive, hybrid, tree, multi, suffix_rules, ngram_mtp  # noqa: F401,I001  (registration, in listing order)
from sim.core.policies.registry import Policy, aliases, families


def list_policies() -> List[str]:
    """Usage strings of every registered family, e.g. ['none', 'model-fixed:K', ...]."""
    return [fam.usage for fam in families().values()]


def describe_policies() -> Dict[str, str]:
    """usage -> one-line summary, for CLI help."""
    return {fam.usage: fam.summary for fam in families().values()}


def get_policy(spec: str, drafters=DEFAULT_DRAFTERS) -> Policy:
    """Build the policy named by `spec` ('family' or 'family:param[:param]') for a run that enables `drafters`
    (registered names, sim/core/drafters/registry.py; default dspark and ngram). A family with a form over any
    drafters (registry.over_drafters: hybrid, hybrid-price, hybrid-tree, hybrid-vllm, oracle) uses all of them; any other policy must
    use only enabled ones. ConfigError (one line) if unknown or if it needs a drafter the run does not enable."""
    choices = ", ".join(list_policies())
    drafters = parse_drafters(drafters)
    name, params = split_spec(spec)
    fam = families().get(name)
    if fam is None:
        raise ConfigError(f"unknown policy '{spec}'{did_you_mean(name, families())}; choose one of: {choices}")
    general = over_drafters(name, drafters)
    try:
        pol = fam.over(params, drafters) if general else fam.factory(params)
    except ValueError as exc:
        raise ConfigError(f"unknown policy '{spec}' ({exc}); choose one of: {choices}") from None
    missing = [d for d in pol.drafters if d not in drafters]
    if missing:
        raise ConfigError(f"policy '{spec}' uses the drafter(s) {', '.join(missing)}, which this run does not enable "
                          f"(--drafters {','.join(drafters)}); add them to --drafters")
    return pol if pol.adaptive_verification == fam.adaptive_verification else \
        dataclasses.replace(pol, adaptive_verification=fam.adaptive_verification)


def split_spec(spec: str) -> tuple[str, list[str]]:
    """A spec's family name and its parameters; a deprecated spelling of a family (registry.deprecated_alias) is
    read as the family's name, with a FutureWarning once per process."""
    name, *params = str(spec).strip().split(":")
    keys = [q.split("=", 1)[0] for q in params]
    twice = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
    if twice is not None:  # which one would win is no rule anyone should have to know: refused
        raise ConfigError(f"policy '{spec}': option '{twice}' is given twice; give it once")
    if name in aliases():
        new = aliases()[name]
        if name not in _WARNED:
            _WARNED.add(name)
            warnings.warn(f"policy '{name}' is deprecated: it is now called '{new}'", FutureWarning, stacklevel=3)
        name = new
    return name, params


def over_drafters(name: str, drafters: tuple) -> bool:
    """Whether the (registered) family `name` builds its form over any drafters for a run enabling `drafters`: it
    has one, and the run's drafters are not the default two (which keep the family's own definition)."""
    return families()[name].over is not None and drafters != DEFAULT_DRAFTERS


_WARNED: set = set()  # deprecated names already warned about in this process
