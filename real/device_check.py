"""`python real/device_check.py --out DIR`: The vLLM plugin's device code on one GPU without vLLM: n-gram kernels,
device == CPU, no host sync, step time and launches, CUDA-graph capture, `compile: true`.

A thin command over its library, real/validation/device/main.py: the options, what it does, the Python API.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python real/device_check.py`: import from the repository root, not real/ (whose
    # profile.py would shadow the standard library's `profile`)
    _here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(_here)]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from real.validation.device.main import main  # noqa: E402
from sim.infra.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
