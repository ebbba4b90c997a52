"""`python -m sim.sweep`: Parameter sweeps: run a grid of simulator cells in parallel and collect one tidy results
table.

A thin command over its library, sim/api/sweep.py: the options, what it does, the Python API.
"""
from sim.api.sweep import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
