"""`python -m sim.cost`: Print a cost model's step times, or write the start-up cost tables (--write-tables).

A thin command over its library, sim/api/cost_tables.py: the options, what it does, the Python API.
"""
from sim.api.cost_tables import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
