"""`python real/profile.py`: Measure the real engine's step costs on this machine and write a profiled cost table.

A thin command over its library, real/validation/profile.py: the options, what it does, the Python API.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python real/profile.py`: import from the repository root, not real/ (where this
    # file would shadow the standard library's `profile`)
    _here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(_here)]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from real.validation.profile import main  # noqa: E402
from sim.infra.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
