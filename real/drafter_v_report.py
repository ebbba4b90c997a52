"""`python -m real.drafter_v_report`: Write the vLLM-architecture drafter's report (learning curve, held-out targets).

A thin command over its library, real/validation/drafter_v_report.py: the options, what it does, the Python API.
"""
from real.validation.drafter_v_report import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
