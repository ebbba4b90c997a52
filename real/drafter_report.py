"""`python -m real.drafter_report`: Write reports/drafter.md: the trained drafter against the synthetic profile.

A thin command over its library, real/validation/drafter_report.py: the options, what it does, the Python API.
"""
from real.validation.drafter_report import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
