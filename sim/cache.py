"""`python -m sim.cache`: how much the cache holds, per kind, and pruning it (`--prune`).

A thin command over its library, sim/api/cache.py: the options, what it does, the Python API.
"""
from sim.api.cache import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
