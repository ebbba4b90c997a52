"""`python -m real.train_drafter_v`: train the SmolLM2 drafter in vLLM's DSpark architecture
(real/drafter/qwen3_dspark.py) on teacher-forced labels.

A thin command over its library, real/drafter/train_v_job.py: the options, what it does, the Python API.
"""
from real.drafter.train_v_job import main
from sim.infra.cli import run_cli

if __name__ == "__main__":
    run_cli(main)
