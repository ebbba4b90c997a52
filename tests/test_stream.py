"""Streaming draft tables (sim.core.drafters.stream): the same run as whole-trace tables, memory bounded by the live
requests, and the lossless check as strong."""
import dataclasses
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

import sim.engine.step_log
from conftest import LinearCost, plausible_calibrator, random_requests
from sim.core.drafters import stream
from sim.core.drafters.model import ModelDrafterProfile
from sim.core.drafters.ngram import NgramConfig
from sim.core.drafters.stream import StreamingTables, pick_streaming
from sim.core.drafters.tables import build_draft_tables
from sim.engine.engine import Engine, EngineConfig
from sim.infra.errors import ConfigError
from sim.engine.policies import sim_policy

CFG = NgramConfig(n_min=1, n_max=3, k=6, ext_max=16)
PROFILE = ModelDrafterProfile(name="t", block=4)
POLICIES = ["none", "model-fixed:3", "ngram-fixed:4", "adaptive", "ngram-first", "ngram-threshold", "hybrid",
            "hybrid-price", "hybrid-tree", "oracle"]

_spec = importlib.util.spec_from_file_location("identity_record", Path(__file__).parent / "fixtures/identity/record.py")
record = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record)


def _both(reqs, seed=0):
    cal = plausible_calibrator(CFG)
    return (build_draft_tables(reqs, CFG, PROFILE, cal, seed=seed),
            StreamingTables(reqs, CFG, PROFILE, cal, seed=seed))


def _same(a, b) -> None:
    assert a.lossless and b.lossless, (a.violation, b.violation)
    for k in a.steps:
        assert a.steps[k].dtype == b.steps[k].dtype, k
        assert np.array_equal(a.steps[k], b.steps[k]), k
    for k in a.requests:
        assert np.array_equal(a.requests[k], b.requests[k], equal_nan=True), k


@pytest.mark.parametrize("policy", [p if p in ("hybrid-price", "hybrid-tree", "oracle", "adaptive", "ngram-fixed:4")
                                    else pytest.param(p, marks=pytest.mark.slow) for p in POLICIES])
def test_streaming_equals_whole_tables_with_preemption_and_compaction(policy, monkeypatch):
    """Random traces under KV pressure (preempted requests keep their rows), a tiny arena (it grows and
    compacts many times) and tiny step chunks: every step column, dtype and request column is the same."""
    monkeypatch.setattr(sim.engine.step_log, "CHUNK", 7)
    monkeypatch.setattr(stream.TableArena.__init__, "__defaults__", (8, 8))
    preempted = 0
    for seed in range(2):
        rng = np.random.default_rng(seed)
        reqs = random_requests(rng, 14)
        whole, streamed = _both(reqs, seed)
        arrivals = np.sort(rng.uniform(0, 0.05, len(reqs)))
        cfg = EngineConfig(batch_size=4, kv_capacity_tokens=256, max_num_batched_tokens=48)
        a = Engine(whole, arrivals, sim_policy(policy), LinearCost(), cfg).run()
        eng = Engine(streamed, arrivals, sim_policy(policy), LinearCost(), cfg)
        b = eng.run()
        _same(a, b)
        preempted += int(a.requests["preemptions"].sum())
        assert eng.tb.built == len(reqs)  # each request built once, a resumed one keeps its rows
        assert not eng.tb.live.any() and eng.tb.live_rows == 0  # all freed at the end
    assert preempted > 0  # the KV pressure did preempt


@pytest.mark.parametrize("policy", ["hybrid-price", "adaptive", pytest.param("hybrid-tree", marks=pytest.mark.slow),
                                    pytest.param("oracle", marks=pytest.mark.slow)])
def test_streaming_matches_the_recorded_identity_reference(policy):
    """A slice of a bundled trace, streamed, gives the digests recorded from the code before (test_sim_identity)."""
    trace, seed = "traces/chat.jsonl", 0
    want = json.loads((record.HERE / "reference.json").read_text())[f"{trace}#{seed}"]
    from sim.api.run import SimSetup, prepare, run_one

    prep = prepare(SimSetup(trace=str(record.HERE.parents[2] / trace), sample=record.SAMPLE, seed=seed,
                            draft_tables="stream"))
    assert isinstance(prep.tables, StreamingTables)
    for b in record.SIZES:
        _, res = run_one(prep, policy, b)
        assert record.digest(res) == want[f"{policy}@{b}"]


def test_live_state_is_bounded_by_the_running_requests(monkeypatch):
    """Arena rows, live requests and K-wide history rows follow the batch, not the trace: with 10x the
    requests they stay within the same bounds (set by the 3 longest outputs), far below the trace's rows."""
    monkeypatch.setattr(stream.TableArena.__init__, "__defaults__", (8, 8))
    for n in (12, 120):
        rng = np.random.default_rng(1)
        reqs = random_requests(rng, n, max_out=40)
        _, streamed = _both(reqs)
        eng = Engine(streamed, np.zeros(n), sim_policy("hybrid-price"), LinearCost(), EngineConfig(batch_size=3))
        assert eng.run().lossless
        arena = eng.tb
        longest3 = int(np.sort(arena.out_len)[-3:].sum())
        assert arena.peak_rows <= longest3  # no preemption here: at most 3 requests live at once
        # compaction at half dead and doubling only when the live rows do not fit: capacity <= 4 x peak live
        assert len(arena.emitted) <= 4 * longest3
        assert len(eng.m_conf_sum) == len(eng.ng_conf_sum) == 64  # history slots: 3 used, one block allocated
    assert len(arena.emitted) < arena.out_len.sum() / 4  # the 120-request trace: a fraction of its rows


def _overstate(rows_fn, rid):
    """Wrap a rows function so that request `rid`'s model chain claims one more accepted token than it has."""
    def wrapped(req, *a, **k):
        rows = rows_fn(req, *a, **k)
        if req.id == rid:
            rows = dict(rows, m_acc=np.minimum(np.asarray(rows["m_acc"]) + 1, np.arange(len(rows["m_acc"]))[::-1] + 1))
        return rows
    return wrapped


def test_streaming_lossless_check_catches_what_the_whole_check_catches(monkeypatch):
    """An over-stated model acceptance emits a wrong token: both forms flag it, with the same message."""
    import sim.core.drafters.tables as tables

    rng = np.random.default_rng(3)
    reqs = [r for r in random_requests(rng, 6, copy=False) if r.output_len >= 4]
    monkeypatch.setattr(tables, "request_rows", _overstate(tables.request_rows, reqs[1].id))
    monkeypatch.setattr(stream, "request_rows", tables.request_rows)
    whole, streamed = _both(reqs)
    cfg = EngineConfig(batch_size=2)
    a = Engine(whole, np.zeros(len(reqs)), sim_policy("model-fixed:3"), LinearCost(), cfg).run()
    b = Engine(streamed, np.zeros(len(reqs)), sim_policy("model-fixed:3"), LinearCost(), cfg).run()
    assert not a.lossless and not b.lossless
    assert a.violation == b.violation and "request 1 " in a.violation


def test_auto_streams_only_above_the_budget(monkeypatch):
    reqs = random_requests(np.random.default_rng(0), 5)
    assert not pick_streaming("auto", reqs, 4, 6)
    assert pick_streaming("stream", reqs, 4, 6) and not pick_streaming("whole", reqs, 4, 6)
    monkeypatch.setattr(stream, "WHOLE_TABLE_BUDGET", 10)
    assert pick_streaming("auto", reqs, 4, 6)
    with pytest.raises(ConfigError, match="--draft-tables"):
        pick_streaming("sometimes", reqs, 4, 6)


def test_draft_tables_flag_is_checked_at_the_boundary(capsys):
    from sim.api.run import main

    with pytest.raises(ConfigError, match="--draft-tables must be one of auto, whole, stream"):
        main(["--trace", "traces/chat.jsonl", "--limit", "2", "--draft-tables", "half"])


def test_the_real_engine_refuses_streaming_tables():
    pytest.importorskip("real.engine.engine")
    from real.engine.engine import RealEngine

    _, streamed = _both(random_requests(np.random.default_rng(0), 2))
    with pytest.raises(ConfigError, match="whole draft tables"):
        RealEngine(streamed, np.zeros(2), sim_policy("adaptive"), LinearCost(),
                   EngineConfig(async_scheduling=False), model=None, ngram_cfg=CFG)
