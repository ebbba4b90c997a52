"""`python -m real.eval_drafter`: Measure the project's drafter on a trace: acceptance, calibration and cost against
SmolLM2-135M-Instruct.

A thin command over its library, real/validation/eval_drafter.py: the options, what it does, the Python API.
"""
from real.validation.eval_drafter import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
