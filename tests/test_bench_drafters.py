"""sim.api.bench --drafters: the policies are checked against the drafters the run enables (a single-drafter policy of
a drafter that only --drafters enables, such as `suffix`, is accepted with it and refused in one line without)."""
from argparse import Namespace

import pytest

from sim.api.bench import TRACES, check_args
from sim.infra.errors import ConfigError


def test_policies_are_checked_against_the_enabled_drafters():
    args = dict(json=None, force=False, against="none")
    check_args(Namespace(drafters="dspark,ngram,suffix", **args), list(TRACES), ["suffix", "hybrid"])
    with pytest.raises(ConfigError, match="suffix"):
        check_args(Namespace(drafters=None, **args), list(TRACES), ["suffix"])


@pytest.mark.extended
def test_phases_split_a_three_drafter_step(tmp_path):
    """--phases: each run's CPU ms per step = the live drafters' + the policy's + the rest, all >= 0; a run without
    a live drafter spends none in it."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "-m", "sim.bench", "--against", "none", "--trace", "traces/chat.jsonl",
                           "--policy", "hybrid", "--policy", "suffix", "--drafters", "dspark,ngram,suffix",
                           "--batch-size", "4", "--repeat", "1", "--phases", "--json", str(out)],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r["policy"]: r["after_ms_per_step"] for r in json.loads(out.read_text())["results"]}
    for ms in rows.values():
        assert ms["step"] > 0 and min(ms.values()) >= 0
        assert abs(ms["drafters"] + ms["policy"] + ms["rest"] - ms["step"]) < 1e-9
    assert rows["suffix"]["drafters"] > 0 and rows["hybrid"]["policy"] > 0
