"""`python -m sim.memory_bench`: Memory benchmark: seeded large traces, and the peak RSS of `python -m sim.run` over
them (docs/memory.md).

A thin command over its library, sim/api/memory_bench.py: the options, what it does, the Python API.
"""
from sim.api.memory_bench import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
