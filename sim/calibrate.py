"""`python -m sim.calibrate`: Fit the n-gram calibrator on general text and show how it transfers.

A thin command over its library, sim/api/calibrate.py: the options, what it does, the Python API.
"""
from sim.api.calibrate import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
