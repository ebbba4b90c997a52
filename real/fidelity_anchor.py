"""`python -m real.fidelity_anchor`: Re-assemble a recorded validation run's verdicts re-anchored to the machine's
speed, offline: no model runs.

A thin command over its library, real/validation/anchor.py: the options, what it does, the Python API.
"""
import sys

from real.validation.anchor import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    sys.exit(run_cli(main))
