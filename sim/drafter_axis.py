"""`python -m sim.drafter_axis`: The drafter axis' held-out-style check: `hybrid` over three drafters against two.

A thin command over its library, sim/api/drafter_axis.py: the options, what it does, the Python API.
"""
from sim.api.drafter_axis import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
