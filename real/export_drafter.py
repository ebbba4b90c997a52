"""`python -m real.export_drafter`: Export the vLLM-architecture drafter to vLLM's DSpark checkpoint layout.

A thin command over its library, real/drafter/export_vllm.py: the options, what it does, the Python API.
"""
from real.drafter.export_vllm import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
