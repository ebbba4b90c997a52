"""`python -m real.vllm_cpu`: Write the model directories vLLM loads on this CPU (smollm2, dspark, tiny-target).

A thin command over its library, real/validation/vllm_cpu/make_models.py: the options, what it does, the Python API.
"""
from real.validation.vllm_cpu.make_models import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
