"""`python real/gpu_check.py`: The one prepared run for a borrowed CUDA machine: the project's torch engine (not
vLLM) on random-weight Qwen3-8B: preflight, plugin device checks, profile, timing grid against the roofline, validation.

A thin command over its library, real/validation/gpu_check.py: the options, what it does, the Python API.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python real/gpu_check.py` put real/ first on sys.path: this checkout's root
    sys.path[0] = str(Path(__file__).resolve().parents[1])  # instead: its own real, sim; not an installed copy

from real.validation.gpu_check import main  # noqa: E402
from sim.infra.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
