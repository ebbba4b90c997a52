"""`python -m real.depth_calibration`: Per-depth acceptance of the plugin's chosen n-gram chains in the vLLM CPU
engine.

A thin command over its library, real/validation/vllm_cpu/depth_calibration.py: the options, what it does, the
Python API.
"""
from real.validation.vllm_cpu.depth_calibration import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
