"""`python -m real.label_drafter [LIMIT_S]`: label the drafter's training text at prefill speed (resumable).

A thin command over its library, real/drafter/labels.py.
"""
from real.drafter.labels import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
