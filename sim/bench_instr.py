"""`python -m sim.bench_instr`: Instructions of one simulator run, counted by callgrind: a figure that does not move
with the machine's load.

A thin command over its library, sim/api/bench_instr.py: the options, what it does, the Python API.
"""
from sim.api.bench_instr import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
