"""`python -m sim.policy_timing`: the per-call CPU time of each policy's definition on random batches (a markdown
table).

A thin command over sim/core/policies/testing.py (timing_table).
"""
from sim.core.policies.testing import timing_table

if __name__ == "__main__":
    print(timing_table())
