"""`python -m sim.run`: CLI and Python API: replay a trace through the simulated engine for every policy x batch size.

A thin command over its library, sim/api/run.py: the options, what it does, the Python API.
"""
from sim.api.run import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
