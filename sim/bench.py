"""`python -m sim.bench`: Simulator speed benchmark: simulated output tokens per wall second, this tree against a
previous commit.

A thin command over its library, sim/api/bench.py: the options, what it does, the Python API.
"""
from sim.api.bench import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
