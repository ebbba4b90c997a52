"""`python -m sim.past_slots`: what vLLM verifies past the plugin's chosen chains and what its stale budget loses.

A thin command over its library, sim/api/past_slots.py: the options, what it does, the Python API.
"""
from sim.api.past_slots import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
