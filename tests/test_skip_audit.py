"""`python -m sim.skip_audit`: the DSpark passes a plugin setting runs for nothing, counted from a step log, and the
bound on what any skip rule gains (sim/api/skip_audit.py)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from sim.api.skip_audit import audit, bound_tok_s, main


def _log(**cols):
    n = len(next(iter(cols.values())))
    base = {k: np.zeros(n) for k in ("step_ms", "num_decode", "draft_ms", "verified_model", "accepted_model",
                                     "accepted_ngram", "emitted")}
    base.update({k: np.asarray(v, dtype=float) for k, v in cols.items()})
    return base


def test_a_pass_counts_as_useful_only_where_a_dspark_token_was_verified():
    # steps: 0 prefill only (a pass there is not a decode pass); 1 DSpark chosen; 2 ran, n-gram chosen, nothing past;
    # 3 ran, n-gram chosen, one DSpark token accepted past the n-gram chain; 4 skipped; 5 ran for nothing after a
    # step whose n-gram chain accepted nothing
    log = _log(step_ms=[10, 9, 9, 9, 8, 9], num_decode=[0, 1, 1, 1, 1, 1], draft_ms=[1, 1, 1, 1, 0, 1.5],
               verified_model=[0, 4, 0, 0, 0, 0], accepted_model=[0, 3, 0, 0, 0, 0],
               accepted_ngram=[0, 0, 5, 5, 0, 0], emitted=[0, 4, 6, 7, 1, 1])
    a = audit(log, sim_time_s=0.054)
    assert (a["decode_steps"], a["ran"], a["useful"], a["wasted"]) == (5, 4, 2, 2)
    assert a["wasted_ms"] == pytest.approx(2.5)  # steps 2 and 5
    # both wasted passes follow a step whose n-gram chains accepted nothing (step 1: DSpark's chain; step 4)
    assert a["after_no_ngram"] == 2
    log["accepted_ngram"][1] = 2  # step 1's n-gram accepted: step 2's pass no longer counts there
    assert audit(log, 0.054)["after_no_ngram"] == 1


def test_the_bound_removes_the_wasted_time_only():
    a = {"sim_time_s": 2.0, "wasted_ms": 500.0}
    assert bound_tok_s(100.0, a) == pytest.approx(100.0 * 2.0 / 1.5)
    assert bound_tok_s(100.0, {"sim_time_s": 2.0, "wasted_ms": 0.0}) == 100.0


def test_a_run_prints_passes_that_add_up_and_a_bound_at_or_above_the_setting(capsys):
    assert main(["--trace", "traces/codeedit.jsonl", "--limit", "4", "--batch-size", "1"]) == 0
    out = capsys.readouterr().out
    row = next(l for l in out.splitlines() if l.startswith("| 1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    tok_s, bound = float(cells[2]), float(cells[7])
    ran, useful, wasted = (int(x) for x in cells[4].split(" of ")[0].split(" / "))
    assert ran == useful + wasted and ran > 0
    assert bound >= tok_s
    assert "Reference: batch 1 `vllm-ngram:32`" in out


@pytest.mark.parametrize("args, says", [
    (["--setting", "vllm-ngram:32"], "runs no DSpark pass"),
    (["--setting", "hybrid-vllm:tail=0.9"], "tail"),
    (["--against", "no-such-policy"], "no-such-policy"),
    (["--trace", "no/such.jsonl"], "no/such.jsonl"),
])
def test_bad_input_is_one_line_and_exit_2(args, says):
    p = subprocess.run([sys.executable, "-m", "sim.skip_audit", *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert says in p.stderr and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
