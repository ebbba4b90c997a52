"""`python real/vllm_smoke.py --out DIR`: A first run of the vLLM flow on an H100 with vLLM 0.33: versions, the
validation's dry run, the first-run checklist on 4 prompts, one `vllm bench forward`.

A thin command over its library, real/validation/vllm_smoke.py: the options, what it does, the Python API.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python real/vllm_smoke.py` put real/ first on sys.path: this checkout's root
    sys.path[0] = str(Path(__file__).resolve().parents[1])  # instead: its own real, sim; not an installed copy

from real.validation.vllm_smoke import main  # noqa: E402
from sim.infra.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
