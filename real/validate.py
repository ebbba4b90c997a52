"""`python real/validate.py`: Check the simulator against a real engine: run a trace slice for real, simulate the same
run, compare.

A thin command over its library, real/validation/validate.py: the options, what it does, the Python API.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python real/validate.py` put real/ first on sys.path: this checkout's root
    sys.path[0] = str(Path(__file__).resolve().parents[1])  # instead: its own real, sim; not an installed copy

from real.validation.validate import main  # noqa: E402
from sim.infra.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
