"""`python -m sim.anchors`: The simulator against measurements vLLM's developers published, side by side.

A thin command over its library, sim/api/anchors.py: the options, what it does, the Python API.
"""
from sim.api.anchors import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
