"""`python -m sim.report`: HTML reports (plotly) of simulated runs: throughput per policy, speedup, step-time
breakdown.

A thin command over its library, sim/api/report.py: the options, what it does, the Python API.
"""
from sim.api.report import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
