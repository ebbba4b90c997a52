"""`python -m sim.suffix_calibrate`: The suffix drafter's calibrator: its tree frequencies turned into acceptance
estimates, fit on general text.

A thin command over its library, sim/api/suffix_calibrate.py: the options, what it does, the Python API.
"""
from sim.api.suffix_calibrate import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
