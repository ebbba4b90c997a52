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
