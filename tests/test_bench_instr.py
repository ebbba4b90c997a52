"""sim.api.bench_instr: one run's instructions under callgrind (slow: the run is ~50x slower under valgrind)."""
import shutil

import pytest

from sim.api.bench_instr import REPO, count

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("cc") is None,
                                 reason="needs valgrind and a C compiler")]


def test_counts_one_run_and_repeats():
    """The same cell twice: a positive count over the run's steps, the same within 0.1% (the figure is meant to
    compare commits without repeats); a larger sample of the trace costs more."""
    a = count(REPO, "traces/chat.jsonl", "hybrid-price", 4, 8)
    b = count(REPO, "traces/chat.jsonl", "hybrid-price", 4, 8)
    assert a["steps"] > 10 and a["tokens"] > a["steps"]
    assert a["instructions"] > 1000 * a["steps"]
    assert abs(a["instructions"] - b["instructions"]) <= 1e-3 * a["instructions"], (a, b)
    big = count(REPO, "traces/chat.jsonl", "hybrid-price", 4, 16)
    assert big["steps"] > a["steps"] and big["instructions"] > a["instructions"]
