"""Settings under which vLLM's charge could never schedule a token are refused up front (one line, exit 2), not run
forever: a token budget no larger than the extra slots vLLM 0.32 charges DSpark per request, and a W past the
plugin's bound."""
import subprocess
import sys

import numpy as np
import pytest

from sim.core.scheduler import SCHEDULED, Scheduler, SlotCharge
from sim.infra.errors import ConfigError


def test_a_budget_that_holds_no_request_is_refused_and_one_more_token_runs():
    charge = SlotCharge(rule=SCHEDULED, drafts=7, extra=6, lookahead=7)
    with pytest.raises(ConfigError, match="at least 7"):
        Scheduler(np.array([5, 5]), 2, 6, 16, 10**6, 7, charge=charge)
    s = Scheduler(np.array([5, 5]), 2, 7, 16, 10**6, 7, charge=charge)
    s.add(0)
    assert s.budget == 7


@pytest.mark.parametrize("command,args,msg", [
    ("sim.run", ["--policy", "hybrid-vllm:slots=10000"], "slots must be an integer in 1..64, got 10000"),
    ("sim.run", ["--policy", "adaptive", "--scheduler", "vllm", "--max-num-batched-tokens", "6", "--vllm-version",
                 "0.32"], "give at least 7"),
    ("sim.run", ["--policy", "hybrid-vllm", "--max-num-batched-tokens", "6", "--vllm-version", "0.32"], "give at least 7"),
    ("sim.run", ["--policy", "model-fixed:7", "--scheduler", "vllm", "--max-num-batched-tokens", "4", "--vllm-version",
                 "0.32"], "give at least 7"),
    ("sim.sweep", ["--policy", "hybrid-vllm:slots=10000", "--workers", "1"], "slots must be an integer in 1..64"),  # the "in sweeps"
])
def test_the_cli_says_so_in_one_line(command, args, msg, tmp_path):
    out = ["--out", str(tmp_path / "sw")] if command == "sim.sweep" else []
    p = subprocess.run([sys.executable, "-m", command, "--trace", "traces/codeedit.jsonl", "--sample", "2", *args, *out],
                       capture_output=True, text=True, timeout=120)
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(errors) == 1 and msg in errors[0], p.stderr


def test_a_small_budget_vllm_033_charges_nothing_extra_for_runs_to_its_end():
    """vLLM 0.33 charges DSpark no extra slot (sim/core/vllm.py): the issue's budget of 6 then schedules, and the run
    ends with a result instead of looping (the sweeps, which model 0.33 only, are in this case)."""
    p = subprocess.run([sys.executable, "-m", "sim.run", "--trace", "traces/codeedit.jsonl", "--sample", "2", "--policy",
                        "hybrid-vllm", "--max-num-batched-tokens", "6", "--batch-size", "2", "--no-baseline",
                        "--format", "json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = [r for r in __import__("json").loads(p.stdout) if r.get("policy") == "hybrid-vllm"]
    assert rows and rows[0]["output_throughput_tok_s"] > 0
