"""`python -m real.train_drafter`: train the project's DSpark-style drafter for SmolLM2-135M-Instruct on a CPU
(real/drafter/).

A thin command over its library, real/drafter/train_job.py: the options, what it does, the Python API.
"""
from real.drafter.train_job import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
