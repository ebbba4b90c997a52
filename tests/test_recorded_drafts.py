"""Recorded model drafts (sidecar JSONL) are replayed exactly; bad sidecars get one clear error."""
import json
from pathlib import Path

import pytest

from sim.core.drafters.model import load_recorded_drafts
from sim.infra.errors import ConfigError, TraceError
from sim.api.run import SimSetup, prepare, run_one
from sim.core.trace import load_trace

TINY = str(Path(__file__).resolve().parent / "fixtures" / "sim" / "tiny.jsonl")


def _sidecar(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_replay_is_exact(tmp_path):
    reqs = load_trace(TINY).requests
    r0, r1 = reqs[0], reqs[1]
    L0, L1 = r0.output_len, r1.output_len
    side = _sidecar(tmp_path / "d.jsonl", [
        {"id": r0.id, "model_conf": [[0.9] * 7] * L0, "model_acc": [0] * L0},   # never accepted
        {"id": r1.id, "model_conf": [[0.9] * 7] * L1, "model_acc": [7] * L1},   # always all accepted
    ])
    prep = prepare(SimSetup(trace=TINY, drafts=side))
    tb = prep.tables
    assert tb.replayed_requests == 2
    assert (tb.m_acc[tb.offsets[0]:tb.offsets[1]] == 0).all()
    assert (tb.m_acc[tb.offsets[1]:tb.offsets[2]] == 7).all()
    _, res = run_one(prep, "model-fixed:7", 4)
    steps = res.requests["decode_steps"]
    assert steps[0] == L0 - 1               # one token per step after the prefill's first token
    assert steps[1] == -(-(L1 - 1) // 8)    # 7 accepted + 1 bonus per step


@pytest.mark.parametrize("row,field", [
    ({"model_conf": [[0.5] * 7], "model_acc": [1]}, "id"),
    ({"id": "t0", "model_conf": [[1.5] * 7], "model_acc": [1]}, "model_conf"),
    ({"id": "t0", "model_conf": [[0.5] * 6], "model_acc": [1]}, "model_conf"),
    ({"id": "t0", "model_conf": [[0.5] * 7], "model_acc": [8]}, "model_acc"),
    ({"id": "t0", "model_conf": [[0.5] * 7], "model_acc": [1, 2]}, "model_acc"),
    ({"id": "t0", "model_conf": [[0.5] * 7]}, "model_acc"),
])
def test_bad_sidecar_names_line_and_field(tmp_path, row, field):
    side = _sidecar(tmp_path / "d.jsonl", [row])
    with pytest.raises(TraceError) as ei:
        load_recorded_drafts(side, block=7)
    assert ei.value.line == 1 and ei.value.field == field


def test_sidecar_must_match_the_trace(tmp_path):
    side = _sidecar(tmp_path / "d.jsonl", [{"id": "nope", "model_conf": [[0.5] * 7], "model_acc": [1]}])
    with pytest.raises(ConfigError, match="not in the trace"):
        prepare(SimSetup(trace=TINY, drafts=side))
    r0 = load_trace(TINY).requests[0]
    side = _sidecar(tmp_path / "e.jsonl", [{"id": r0.id, "model_conf": [[0.5] * 7] * 2, "model_acc": [1, 1]}])
    with pytest.raises(ConfigError, match="positions"):
        prepare(SimSetup(trace=TINY, drafts=side))


@pytest.mark.parametrize("row,field", [
    ({"id": "t0", "model_conf": [[0.5] * 7], "model_acc": [1], "chosen": [2]}, "chosen"),  # without skipped
    ({"id": "t0", "model_conf": [[0.5] * 7], "model_acc": [1], "chosen": [0], "skipped": [0]}, "chosen"),
    ({"id": "t0", "model_conf": [[0.5] * 7], "model_acc": [1], "chosen": [2, 2], "skipped": [0, 0]}, "chosen"),
    ({"id": "t0", "model_conf": [[0.5] * 7], "model_acc": [1], "chosen": [2], "skipped": [2]}, "skipped"),
])
def test_bad_recorded_decisions_name_line_and_field(tmp_path, row, field):
    with pytest.raises(TraceError) as ei:
        load_recorded_drafts(_sidecar(tmp_path / "d.jsonl", [row]), block=7)
    assert ei.value.line == 1 and ei.value.field == field


def _decided(tmp_path, chosen: int, skipped: int, acc: int = 2):
    """Every request of TINY with recorded model chains (confidence 0.9, `acc` accepted) and the same recorded
    decision at every position."""
    rows = [{"id": r.id, "model_conf": [[0.9] * 7] * r.output_len, "model_acc": [acc] * r.output_len,
             "chosen": [chosen] * r.output_len, "skipped": [skipped] * r.output_len}
            for r in load_trace(TINY).requests]
    return prepare(SimSetup(trace=TINY, drafts=_sidecar(tmp_path / f"d{chosen}{skipped}.jsonl", rows)))


def test_hybrid_vllm_replays_the_recorded_chain_and_skip_and_counts_its_own_disagreements(tmp_path):
    """A recorded decision is data the policy takes (base.Replay): hybrid-vllm publishes the recorded chain and
    hybrid-vllm:skip runs the model pass as recorded; RunResult.replay counts where the policy's own rule differs."""
    free = prepare(SimSetup(trace=TINY))
    _, own = run_one(free, "hybrid-vllm", 4)
    assert own.replay is None and float(own.steps["accepted_model"].sum()) > 0
    _, res = run_one(_decided(tmp_path, 2, 0), "hybrid-vllm", 4)  # the n-gram chain published everywhere
    assert float(res.steps["accepted_model"].sum()) == 0 and res.replay["rows"] == int(res.steps["num_decode"].sum())
    assert 0 < res.replay["rows_disagree"] <= res.replay["rows"] and res.replay["steps"] == 0
    _, res = run_one(_decided(tmp_path, 1, 0), "hybrid-vllm", 4)  # the model chain published everywhere
    assert float(res.steps["accepted_ngram"].sum()) == 0 and float(res.steps["accepted_model"].sum()) > 0
    _, skip = run_one(_decided(tmp_path, 2, 1), "hybrid-vllm:skip", 4)  # the pass skipped at every recorded step
    assert float(skip.steps["accepted_model"].sum()) == 0 and skip.replay["steps"] > 0
    assert skip.replay["steps_disagree"] > 0  # 0.9-confident chains accepting 2: the rule itself would run the pass
    _, ran = run_one(_decided(tmp_path, 1, 0), "hybrid-vllm:skip", 4)
    assert ran.replay["steps"] > 0 and ran.replay["steps_disagree"] < ran.replay["steps"]
    assert float(ran.steps["accepted_model"].sum()) > 0


def test_sidecar_from_chains_writes_the_plugins_choices_and_marks_the_skip(tmp_path):
    """The recorder's chain_choices become `chosen` per position; a choice with no DSpark chain recorded there is a
    skip; the last choice at a position is kept; a position without one is -1."""
    from real.validation.pipeline.drafts import sidecar_from_chains

    ref = [[5, 6, 7, 8, 9]]
    chains = [("a-1f", 0, [5, 6], [0.9, 0.8]), ("a-1f", 2, [7, 1], [0.5, 0.4])]
    choices = [("a-1f", 0, False, 0), ("a-1f", 0, True, 3), ("a-1f", 2, False, 0), ("a", 3, True, 2)]
    path = sidecar_from_chains(["a"], ref, chains, 2, tmp_path / "s.jsonl", choices)
    (obj,) = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert obj["chosen"] == [2, -1, 1, 2, -1] and obj["skipped"] == [0, 0, 0, 1, 0]
    assert obj["model_acc"] == [2, 0, 1, 0, 0]
    assert "chosen" not in json.loads(sidecar_from_chains(["a"], ref, chains, 2, tmp_path / "t.jsonl").read_text())
    rec = load_recorded_drafts(str(path), block=2)["a"]
    assert rec.chosen.tolist() == [2, -1, 1, 2, -1] and rec.skipped.tolist() == [False] * 3 + [True, False]
