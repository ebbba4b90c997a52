"""sim.api.bench --per-step: a step's CPU time at batch 4 split into the native calls and the rest, in the printed
table and the --json file."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.extended
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler: no native calls to time")
def test_per_step_split(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "-m", "sim.bench", "--against", "none", "--trace", "traces/chat.jsonl",
                           "--policy", "hybrid-price", "--policy", "none", "--batch-size", "4", "--repeat", "1",
                           "--per-step", "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "per step at batch 4" in done.stdout and "native +" in done.stdout
    rows = {r["policy"]: r for r in json.loads(out.read_text())["per_step"]}
    hp, none = rows["hybrid-price"], rows["none"]
    assert 0 < hp["after_us_native"] < hp["after_us_step"]  # the policy and engine step run in C
    assert hp["after_us_native"] > none["after_us_native"]  # `none` has no policy call in C
    assert hp["requests"] == 16 and hp["bs"] == 4
