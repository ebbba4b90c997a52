"""Allocation policies (one registry shared by the simulator and the real engines): get_policy('adaptive')."""
from sim.policies.base import CHAIN_MODEL, CHAIN_NGRAM, CHAIN_NONE, Allocation, StepBatch
from sim.policies.catalog import describe_policies, get_policy, list_policies
from sim.policies.registry import Policy

__all__ = ["get_policy", "list_policies", "describe_policies", "Policy", "StepBatch", "Allocation",
           "CHAIN_NONE", "CHAIN_MODEL", "CHAIN_NGRAM"]
