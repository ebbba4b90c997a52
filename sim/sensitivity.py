"""`python -m sim.sensitivity`: What moves the headline: the code-editing ratios over `adaptive` when one assumption
changes at a time.

A thin command over its library, sim/api/sensitivity.py: the options, what it does, the Python API.
"""
from sim.api.sensitivity import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
