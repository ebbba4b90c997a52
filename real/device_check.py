"""`python real/device_check.py --out DIR`: The vLLM plugin's device code on one GPU without vLLM: n-gram kernels,
device == CPU, no host sync, step time and launches, CUDA-graph capture, `compile: true`.

A thin command over its library, real/validation/device/main.py: the options, what it does, the Python API.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python real/device_check.py` put real/ first on sys.path: this checkout's root
    sys.path[0] = str(Path(__file__).resolve().parents[1])  # instead: its own real, sim; not an installed copy

from real.validation.device.main import main  # noqa: E402
from sim.infra.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
