"""`python -m real.fidelity_report`: A fidelity report (markdown and an offline HTML page) from recorded validation
runs.

A thin command over its library, real/validation/report.py: the options, what it does, the Python API.
"""
import sys

from real.validation.report import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    sys.exit(run_cli(main))
