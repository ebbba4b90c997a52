"""`python -m sim.skip_audit`: whether DSpark's pass pays for itself under a plugin setting, and the most any skip
rule could gain.

A thin command over its library, sim/api/skip_audit.py: the options, what it does, the Python API.
"""
from sim.api.skip_audit import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
