"""`python real/vllm_smoke.py --out DIR`: A first run of the vLLM flow on an H100 with vLLM 0.33: versions, the
validation's dry run, the first-run checklist on 4 prompts, one `vllm bench forward`.

A thin command over its library, real/validation/vllm_smoke.py: the options, what it does, the Python API.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python real/vllm_smoke.py`: import from the repository root, not real/ (whose
    # profile.py would shadow the standard library's `profile`)
    _here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(_here)]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from real.validation.vllm_smoke import main  # noqa: E402
from sim.infra.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))
