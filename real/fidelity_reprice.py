"""`python -m real.fidelity_reprice`: Re-price a recorded validation run with today's cost fits, offline: no model
runs, no timing.

A thin command over its library, real/validation/reprice.py: the options, what it does, the Python API.
"""
import sys

from real.validation.reprice import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    sys.exit(run_cli(main))
