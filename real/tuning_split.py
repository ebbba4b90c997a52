"""`python -m real.tuning_split`: Build the drafter's copy-heavy code-editing tuning split.

A thin command over its library, real/drafter/tuning_split.py: the options, what it does, the Python API.
"""
from real.drafter.tuning_split import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
