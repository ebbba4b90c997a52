"""`python real/machine_noise.py`: Machine-noise preflight: is this machine's speed still enough for a fidelity
verdict, before a long validation?

A thin command over its library, real/validation/machine_noise.py: the options, what it does, the Python API.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python real/machine_noise.py` put real/ first on sys.path: this checkout's root
    sys.path[0] = str(Path(__file__).resolve().parents[1])  # instead: its own real, sim; not an installed copy

from real.validation.machine_noise import main  # noqa: E402
from sim.infra.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
