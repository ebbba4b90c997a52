"""`python -m sim.suffix_report`: The suffix-tree drafter against the exact n-gram drafter on a trace, drafter only.

A thin command over its library, sim/api/suffix_report.py: the options, what it does, the Python API.
"""
from sim.api.suffix_report import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
