"""`python -m real.offline_bundle --out DIR`: what a GPU box without network needs for the vLLM flow (a wheelhouse
for vLLM 0.33 and this project, the target's config and tokenizer, optionally weights) and the steps on the box.

A thin command over its library, real/validation/offline.py: the options, what it does, the Python API.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python real/offline_bundle.py` put real/ first on sys.path: this checkout's root
    sys.path[0] = str(Path(__file__).resolve().parents[1])  # instead: its own real, sim; not an installed copy

from real.validation.offline import main  # noqa: E402
from sim.infra.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
