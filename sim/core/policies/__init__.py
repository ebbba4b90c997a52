"""Allocation policies (one registry shared by the simulator and the real engines): get_policy('adaptive').
The step contract (plan on the host, propose the planned drafters, allocate on the device): sim/core/policies/base.py.

The names below load on first use (PEP 562), so a module that needs one family (the vLLM plugin: hybrid.py) does not
load the whole catalog.
"""
from __future__ import annotations

import importlib

_WHERE = {"get_policy": "catalog", "list_policies": "catalog", "describe_policies": "catalog", "Policy": "registry",
          "StepBatch": "base", "HostView": "base", "Plan": "base", "Allocation": "base", "CHAIN_NONE": "base",
          "CHAIN_MODEL": "base", "CHAIN_NGRAM": "base"}
__all__ = list(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        value = globals()[name] = getattr(importlib.import_module(f"sim.core.policies.{_WHERE[name]}"), name)
        return value  # kept as a module global: the next access is a plain lookup
    raise AttributeError(f"module 'sim.core.policies' has no attribute {name!r}")
