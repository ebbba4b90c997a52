"""Allocation policies (one registry shared by the simulator and the real engines): get_policy('adaptive').
The step contract (plan on the host, propose the planned drafters, allocate on the device): sim/policies/base.py."""
from sim.policies.base import CHAIN_MODEL, CHAIN_NGRAM, CHAIN_NONE, Allocation, HostView, Plan, StepBatch
from sim.policies.catalog import describe_policies, get_policy, list_policies
from sim.policies.registry import Policy

__all__ = ["get_policy", "list_policies", "describe_policies", "Policy", "StepBatch", "HostView", "Plan",
           "Allocation", "CHAIN_NONE", "CHAIN_MODEL", "CHAIN_NGRAM"]
