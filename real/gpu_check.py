"""`python real/gpu_check.py`: The one prepared run for a borrowed CUDA machine: the project's torch engine (not
vLLM) on random-weight Qwen3-8B: preflight, plugin device checks, profile, timing grid against the roofline, validation.

A thin command over its library, real/validation/gpu_check.py: the options, what it does, the Python API.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python real/gpu_check.py`: import from the repository root, not real/ (whose
    # profile.py would shadow the standard library's `profile`)
    _here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(_here)]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from real.validation.gpu_check import main  # noqa: E402
from sim.infra.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
