"""Speed work must not change results: every policy, on a seeded slice of each bundled trace, two seeds and
two batch sizes, gives the same steps (every integer step column exactly, every float column bit for bit),
the same per-request decode steps and preemptions, and the same tokens (the run is lossless, so the
emitted buffer is the trace's output) as the code before the speed work (issue 14); and runs with the live suffix drafter, as the code before its flat
tree (reference3.json).

The reference digests were recorded from that code by tests/fixtures/identity/record.py (a script, not
by hand): rerun it only when a change of results is intended, and say so in the commit."""
import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("identity_record", Path(__file__).parent / "fixtures/identity/record.py")
record = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record)
HERE, POLICIES, SIZES, cases, run_case = record.HERE, record.POLICIES, record.SIZES, record.cases, record.run_case

REFERENCE = json.loads((HERE / "reference.json").read_text())


def _marked(trace, seed):
    # the default run checks one slice (code editing, seed 0, ~20 s); the rest run with -m slow
    quick = seed == 0 and "codeedit" in trace
    return pytest.param(trace, seed, marks=() if quick else pytest.mark.slow)


@pytest.mark.parametrize("trace,seed", [_marked(t, s) for t, s in cases()])
def test_same_steps_and_tokens_as_the_reference(trace, seed):
    want = REFERENCE[f"{trace}#{seed}"]
    assert sorted(want) == sorted(f"{p}@{b}" for p in POLICIES for b in SIZES)
    got = run_case(trace, seed)
    bad = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    assert not bad, f"{len(bad)} run(s) differ from the reference, e.g. {next(iter(bad.items()))}"


REFERENCE3 = json.loads((HERE / "reference3.json").read_text())


@pytest.mark.parametrize("trace", [pytest.param(t, marks=() if "codeedit" in t else pytest.mark.slow)
                                   for t in record.THREE_TRACES])  # the default run checks code editing
def test_three_drafter_runs_as_the_reference(trace):
    """hybrid, hybrid-price, suffix and oracle over dspark,ngram,suffix: the same digests as the code before the
    suffix drafter's flat tree (record.py --three)."""
    want = REFERENCE3[trace]
    got = record.run_three(trace)
    assert sorted(got) == sorted(want)
    bad = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    assert not bad, f"{len(bad)} run(s) differ from the reference, e.g. {next(iter(bad.items()))}"
