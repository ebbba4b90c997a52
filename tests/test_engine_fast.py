"""The engine's native step (sim/engine/native_step.py, sim/engine/native/engine_step.c) against the numpy step it
transcribes (HYBRIDSPEC_REFERENCE_ENGINE=1): the same step columns bit for bit, the same emitted tokens and
host-side history, under preemption, tree policies and n-gram confidences that are not 0 past their length."""
import dataclasses
import shutil

import numpy as np
import pytest

from sim.engine.engine import Engine, EngineConfig
from sim.engine.policies import sim_policy
from sim.api.run import SimSetup, prepare

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler: the engine runs the numpy step")

STATE = ("pos", "prev_pos", "model_pos", "m_conf_sum", "m_conf_cnt", "ng_conf_sum", "ng_conf_cnt", "n_steps",
         "emitted_tokens", "n_preempt")


@pytest.fixture(scope="module")
def prep():
    return prepare(SimSetup(trace="traces/chat.jsonl", sample=10, seed=5))


def _run(tables, prep, spec, cfg, monkeypatch, reference: bool):
    monkeypatch.setenv("HYBRIDSPEC_REFERENCE_ENGINE", "1" if reference else "0")
    eng = Engine(tables, prep.arrivals, sim_policy(spec), prep.cost, cfg)
    res = eng.run()
    assert (eng._fast is None) == reference
    return eng, res


def _same(a, b, what):
    (ea, ra), (eb, rb) = a, b
    assert ra.lossless == rb.lossless and ra.violation == rb.violation, what
    for k, v in ra.steps.items():
        w = rb.steps[k]
        assert np.asarray(v).dtype == np.asarray(w).dtype and np.asarray(v).tobytes() == np.asarray(w).tobytes(), \
            f"{what}: step column {k} differs"
    for k in STATE:
        x, y = getattr(ea, k), getattr(eb, k)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), f"{what}: {k} differs"  # NaN: the same bits
    assert ea.n_written == eb.n_written and len(ra.steps["emitted"]) > 10


@pytest.mark.parametrize("spec", ["none", "adaptive", "hybrid", "hybrid-price", "hybrid-tree", "oracle", "ngram-fixed:32"])
def test_native_step_equals_numpy_step(prep, spec, monkeypatch):
    tb = prep.tables
    need = int((tb.prompt_len + tb.out_len).max()) + max(tb.k_model, tb.k_ngram) + 32
    # a KV cache of about the longest request: admissions wait and growing requests are preempted
    cfg = EngineConfig(batch_size=4, kv_capacity_tokens=need)
    native = _run(tb, prep, spec, cfg, monkeypatch, reference=False)
    ref = _run(tb, prep, spec, cfg, monkeypatch, reference=True)
    _same(native, ref, spec)
    assert ref[1].requests["preemptions"].sum() > 0


@pytest.mark.parametrize("fill", [0.25, -0.0, float("nan")])
def test_ngram_confidences_past_their_length(prep, monkeypatch, fill):
    """Not the calibrator's +0.0 past the chains' lengths: the host history must mask them, and the native step
    must read the whole rows (it reads them up to their length only where the rest is +0.0, sign included)."""
    tb = prep.tables
    assert tb.ng_len.min() < tb.k_ngram
    past = np.arange(tb.k_ngram)[None, :] >= tb.ng_len[:, None]
    ng_conf = tb.ng_conf.copy()
    ng_conf[past] = fill
    dirty = dataclasses.replace(tb, ng_conf=ng_conf)
    cfg = EngineConfig(batch_size=4)
    for spec in ("hybrid", "hybrid-price"):
        native = _run(dirty, prep, spec, cfg, monkeypatch, reference=False)
        assert native[0]._ng_clean is False
        _same(native, _run(dirty, prep, spec, cfg, monkeypatch, reference=True), spec)


def test_subclass_overriding_a_hook_keeps_the_numpy_step(prep, monkeypatch):
    class Hooked(Engine):
        def _emit(self, *args):
            return super()._emit(*args)

    monkeypatch.delenv("HYBRIDSPEC_REFERENCE_ENGINE", raising=False)
    eng = Hooked(prep.tables, prep.arrivals, sim_policy("none"), prep.cost, EngineConfig(batch_size=4))
    assert eng.run().lossless and eng._fast is None


def test_zero_past_length_is_bitwise():
    from sim.core.drafters.tables import zero_past_length

    conf = np.array([[0.5, 0.0, 0.0], [0.5, 0.25, 0.0], [1.0, 1.0, 1.0]], dtype=np.float32)
    length = np.array([1, 2, 3])
    assert zero_past_length(conf, length)
    for bad in (-0.0, np.nan, 1e-30):
        dirty = conf.copy()
        dirty[0, 2] = bad
        assert not zero_past_length(dirty, length), bad
    assert zero_past_length(conf, np.array([0, 0, 0])) is False  # the first row's 0.5 is past a length of 0


def test_native_scans_equal_the_scheduler_numpy():
    """The scheduler's scans in C (NativeScans) against its numpy on random states: kv_used, the decoding /
    prefilling split, the finished requests (and the running order kept) and the full-context need."""
    from sim.engine.native_step import NativeScans
    from sim.engine.native import load
    from sim.core.scheduler import SMALL, Scheduler

    native = load("engine_step")
    rng = np.random.default_rng(7)
    for trial in range(200):
        n = int(rng.integers(1, 400))
        prompt_len = rng.integers(0, 3000, n)
        out_len = rng.integers(1, 500, n)
        block = int(rng.choice([1, 16, 64]))
        kmax = int(rng.integers(0, 40))
        pair = []
        for scans in (False, True):
            s = Scheduler(prompt_len, batch_size=n, max_num_batched_tokens=8192, block_size=block,
                          kv_capacity_tokens=10 ** 9, kmax=kmax, out_len=out_len)
            st = np.random.default_rng(trial)
            st.shuffle(ids := np.arange(n))
            s.running = ids[:int(st.integers(SMALL + 1, n + 1)) if n > SMALL else n].tolist()
            s.state.pos[:] = st.integers(0, out_len + 1)
            s.state.prefilled[:] = st.integers(0, prompt_len + 2)
            if scans:
                s.scans = NativeScans(s, native)
            run = s._running_array()
            if scans:  # the split against schedule's numpy, before pop_finished compacts `run`
                pend = s.state.prefill_target[run] - s.state.prefilled[run]
                dec, pre = s.scans.split(run)
                assert dec.tolist() == run[pend <= 0].tolist()
                assert pre == list(zip(run[pend > 0].tolist(), pend[pend > 0].tolist()))
            pair.append((s.kv_used(), s._fits_to_the_end(), s.pop_finished(out_len), list(s.running)))
            assert s._running_array().tolist() == s.running
        (kv0, fit0, done0, run0), (kv1, fit1, done1, run1) = pair
        assert (kv0, fit0, done0, run0) == (kv1, fit1, done1, run1), trial
