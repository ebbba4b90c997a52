"""The fast-forward over pure decode stretches (sim/engine/fast_forward.py) against the step-by-step engine
(HYBRIDSPEC_REFERENCE_ENGINE=1): every step and request column bit for bit, the emitted tokens and the
per-request state, with arrivals (--rate), preemption (a small KV cache), synchronous scheduling and
batch 1, 4 and 32; and that stretches really were skipped."""
import numpy as np
import pytest

import sim.engine.engine as engine_mod
from sim.engine.engine import Engine, EngineConfig
from sim.engine.policies import sim_policy
from sim.api.run import SimSetup, prepare

STATE = ("pos", "prev_pos", "model_pos", "n_steps", "emitted_tokens", "n_preempt", "fresh")


@pytest.fixture(scope="module")
def prep():
    return prepare(SimSetup(trace="traces/codeedit.jsonl", sample=8, seed=3))


def _run(prep, spec, cfg, monkeypatch, reference: bool):
    monkeypatch.setenv("HYBRIDSPEC_REFERENCE_ENGINE", "1" if reference else "0")
    skipped = []
    inner = engine_mod.fast_forward

    def counting(eng, now, nxt):
        out = inner(eng, now, nxt)
        skipped.append(len(out))
        return out

    monkeypatch.setattr(engine_mod, "fast_forward", counting)
    eng = Engine(prep.tables, prep.arrivals, sim_policy(spec), prep.cost, cfg)
    res = eng.run()
    return eng, res, sum(skipped)


def _cols_equal(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), what
    for k, v in a.items():
        v, w = np.asarray(v), np.asarray(b[k])
        assert v.dtype == w.dtype and v.shape == w.shape and v.tobytes() == w.tobytes(), f"{what}: column {k} differs"


def _kv_small(prep) -> int:
    tb = prep.tables
    return int((tb.prompt_len + tb.out_len).max()) + max(tb.k_model, tb.k_ngram) + 64


@pytest.mark.parametrize("batch,rate,small_kv,sync", [
    (1, None, False, False), (4, None, False, False), (32, None, False, False),
    (4, 3.0, False, False), (32, 20.0, False, False), (1, 0.5, False, True),
    (4, None, True, False), (32, 50.0, True, True),
])
def test_fast_forward_equals_step_by_step(prep, batch, rate, small_kv, sync, monkeypatch):
    cfg = EngineConfig(batch_size=batch, rate=rate, async_scheduling=not sync,
                       kv_capacity_tokens=_kv_small(prep) if small_kv else None)
    ea, ra, skipped = _run(prep, "none", cfg, monkeypatch, reference=False)
    eb, rb, none_skipped = _run(prep, "none", cfg, monkeypatch, reference=True)
    what = f"batch {batch} rate {rate} small_kv {small_kv} sync {sync}"
    assert ra.lossless and rb.lossless, what
    assert skipped > len(ra.steps["step_ms"]) // 4 and none_skipped == 0, what  # most steps were fast-forwarded
    _cols_equal(ra.steps, rb.steps, what)
    _cols_equal(ra.requests, rb.requests, what)
    assert ra.sim_time_s == rb.sim_time_s, what
    for k in STATE:
        assert np.array_equal(getattr(ea, k), getattr(eb, k)), f"{what}: {k} differs"
    assert ea.n_written == eb.n_written
    if small_kv:
        assert rb.requests["preemptions"].sum() > 0, what


def test_only_the_none_policy_and_engine_hooks(prep, monkeypatch):
    """A drafting policy, a subclass overriding a hook, and streamed tables step normally."""
    from sim.engine.choice import fast_forward_ok
    monkeypatch.setenv("HYBRIDSPEC_REFERENCE_ENGINE", "0")
    cfg = EngineConfig(batch_size=4)
    assert fast_forward_ok(Engine(prep.tables, prep.arrivals, sim_policy("none"), prep.cost, cfg))
    assert not fast_forward_ok(Engine(prep.tables, prep.arrivals, sim_policy("adaptive"), prep.cost, cfg))

    class Hooked(Engine):
        def _charge(self, *a, **kw):
            return super()._charge(*a, **kw)

    assert not fast_forward_ok(Hooked(prep.tables, prep.arrivals, sim_policy("none"), prep.cost, cfg))
    monkeypatch.setenv("HYBRIDSPEC_REFERENCE_ENGINE", "1")
    assert not fast_forward_ok(Engine(prep.tables, prep.arrivals, sim_policy("none"), prep.cost, cfg))


def test_step_by_step_clock_fallback(prep, monkeypatch):
    """The clock advanced one timeout per skipped step (the fallback when one total would round differently)
    gives the same run, and clock_delays' single total lands exactly on the sequential sum."""
    from sim.engine.fast_forward import clock_delays
    delays = [7.729180112, 7.72924003, 0.1, 1e-3]
    for now in (0.0, 104.23917121, 1e6 + 0.3):
        out = clock_delays(now, delays)
        end = now
        for d in delays:
            end = end + d
        t = now
        for d in out:
            t = t + d
        assert t == end and len(out) in (1, len(delays))
    cfg = EngineConfig(batch_size=4, rate=3.0)
    eb, rb, _ = _run(prep, "none", cfg, monkeypatch, reference=True)
    monkeypatch.setattr(engine_mod, "clock_delays", lambda now, d: list(d))
    ea, ra, skipped = _run(prep, "none", cfg, monkeypatch, reference=False)
    assert skipped > 0
    _cols_equal(ra.steps, rb.steps, "per-step clock")
    _cols_equal(ra.requests, rb.requests, "per-step clock")
