"""`python -m sim.trace`: Convert public trace formats, build the bundled traces, print a trace's statistics.

A thin command over its library, sim/api/traces.py: the options, what it does, the Python API.
"""
from sim.api.traces import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
