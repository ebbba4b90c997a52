"""`python real/validate.py`: Check the simulator against a real engine: run a trace slice for real, simulate the same
run, compare.

A thin command over its library, real/validation/validate.py: the options, what it does, the Python API.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python real/validate.py`: import from the repository root, not real/ (whose
    # profile.py would shadow the standard library's `profile`)
    _here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(_here)]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from real.validation.validate import main  # noqa: E402
from sim.infra.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
