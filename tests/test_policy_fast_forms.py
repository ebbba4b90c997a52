"""The simulator's faster policy forms (Policy.sim_fn: sim/policies/fast.py, sim/policies/native/) give the
same allocation as the torch definition (Policy.fn), exactly, for every registered policy: on thousands of
random batches (sizes across the exact and the two-stage sweep, step and smooth cost tables, logits caps,
prefill tokens) and on every batch of engine runs over slices of the bundled traces."""
import dataclasses
import shutil
import zlib

import numpy as np
import pytest
import torch

from sim.engine import Engine
from sim.policies import get_policy, list_policies
from sim.policies.fast import Arrays
from sim.policies.testing import random_batch, random_cost_table
from sim.run import SimSetup, prepare, run_one

SPECS = ["none", "model-fixed:7", "ngram-fixed:32", "adaptive", "adaptive:early-stop", "ngram-first",
         "suffix-threshold", "hybrid", "hybrid:forecast=min", "hybrid:hyst=0.2:margin=0.5", "hybrid:fixed-point",
         "hybrid-price", "hybrid-price:sweep", "hybrid-price:margin=0",
         "hybrid-price:margin=0.37", "hybrid-price:model-opt", "hybrid-price:fixed-point", "hybrid-price:current",
         "hybrid-tree", "oracle", "hybrid-vllm", "vllm-ngram:7"]
FAST = ["none", "model-fixed:7", "ngram-fixed:32", "ngram-first", "suffix-threshold", "hybrid-tree", "oracle", "adaptive", "hybrid",
        "hybrid:forecast=min", "hybrid:hyst=0.2:margin=0.5"] + [
    s for s in SPECS if s.startswith("hybrid-price") and s.split(":")[-1] not in ("model-opt", "fixed-point", "current")]


def _same(spec, pol, b, where):
    want = pol.fn(b)
    got = (pol.sim_fn or pol.fn)(b)
    for f in dataclasses.fields(want):
        w, g = getattr(want, f.name), getattr(got, f.name)
        assert (w is None and g is None) or torch.equal(w, g), f"{spec}: {f.name} differs on {where}: {w} vs {g}"


def test_every_family_is_covered():
    # `suffix` runs only with the suffix drafter (a live drafter: the numpy step, no fast form; tests/test_drafter_axis.py)
    assert {u.split(":")[0].split("[")[0] for u in list_policies()} - {"suffix"} <= {s.split(":")[0] for s in SPECS}


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler: the simulator runs the definitions")
def test_native_forms_are_built_here():
    for spec in FAST:
        assert get_policy(spec).sim_fn is not None, spec
    assert get_policy("hybrid-price:current").sim_fn is None and get_policy("hybrid:fixed-point").sim_fn is None


def _random_batches(n: int, seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        R = int(rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 16, 17, 32, 64, 128, 200]))
        km, kn = int(rng.choice([1, 3, 7])), int(rng.choice([1, 4, 8, 32]))
        b = random_batch(rng, R, km, kn, max_tokens=int(R * (1 + kn) * rng.uniform(0.5, 1.5)) + 2)
        if rng.random() < 0.3:
            b = dataclasses.replace(b, max_draft_tokens=int(rng.integers(0, 3 * R + 2)))
        if rng.random() < 0.3:
            b = dataclasses.replace(b, num_sampling_reqs=R + int(rng.integers(0, 4)),
                                    num_nondraft_tokens=R + int(rng.integers(0, 40)))
        if rng.random() < 0.2:  # stale model confidences exactly 1 (a fresh request), ties everywhere
            b.stale_model_conf[: R // 2] = 1.0
            b.model_conf[:, : km // 2] = 1.0
        if rng.random() < 0.1:
            b.ngram_len[:] = 0
        if rng.random() < 0.2:  # requests without a model chain (hybrid then takes the n-gram chain)
            b.model_len[: R // 2] = 0
        # hybrid's inputs: the model pass's share of the drafter cost, the mean n-gram chain
        b = dataclasses.replace(b, model_draft_ms=float(rng.uniform(0, b.draft_cost_ms)))
        if rng.random() < 0.7:
            b = dataclasses.replace(b, mean_ngram_conf=torch.tensor(rng.random((R, kn))))
        if rng.random() < 0.5:  # the oracle's inputs: the n-gram pass's share, the engine's charged table
            b = dataclasses.replace(b, ngram_draft_ms=float(rng.uniform(0, b.draft_cost_ms - b.model_draft_ms)),
                                    true_verify_cost_ms=random_cost_table(rng, b.verify_cost_ms.shape[0] - 1))
        yield b


def test_specs_without_a_form_run_their_definition():
    """The specs with no fast form (nothing to compare) have none: the simulator runs their definition."""
    for spec in sorted(set(SPECS) - set(FAST)):
        pol = get_policy(spec)
        assert pol.sim_fn is None and pol.sim_callable is pol, spec


@pytest.mark.parametrize("spec", FAST)
def test_random_batches(spec):
    pol = get_policy(spec)
    if pol.sim_fn is None:
        pytest.skip("no C compiler: the simulator runs the definitions")
    n = 600 if spec in ("adaptive", "hybrid", "hybrid-price", "hybrid-tree", "oracle", "suffix-threshold") else 200
    for i, b in enumerate(_random_batches(n, seed=zlib.crc32(spec.encode()))):
        _same(spec, pol, b, f"random batch {i} (R={b.num_reqs})")


class _Recorder(Engine):
    batches: list

    def _allocate(self, batch, plan):
        type(self).batches.append(batch)
        return super()._allocate(batch, plan)


@pytest.mark.slow  # 15 s per trace; the default run compares the forms on random batches
@pytest.mark.parametrize("trace", ["traces/codeedit.jsonl", "traces/chat.jsonl"])
def test_recorded_engine_batches(trace, monkeypatch):
    import sim.run

    prep = prepare(SimSetup(trace=trace, sample=24, seed=2))
    monkeypatch.setattr(sim.run, "Engine", _Recorder)
    for spec in FAST:
        pol = get_policy(spec)
        for bs in (4, 32):
            _Recorder.batches = []
            run_one(prep, spec, bs)
            assert len(_Recorder.batches) > 20
            for i, b in enumerate(_Recorder.batches):
                _same(spec, pol, b, f"{trace} bs={bs} step {i}")


@pytest.mark.parametrize("spec", ["hybrid-price", "hybrid", "hybrid-tree", "adaptive", "suffix-threshold"])
def test_tied_confidences(spec):
    """Confidences from a few values only: survivals tie across requests and chains, so the budget cuts
    through equal values (the top-B's selection must give ties to the lower flat index, as the merge does)."""
    pol = get_policy(spec)
    rng = np.random.default_rng(zlib.crc32(spec.encode()) + 1)
    for i in range(300):
        R = int(rng.choice([2, 4, 5, 9, 33, 128]))
        km, kn = int(rng.choice([3, 7])), int(rng.choice([4, 32]))
        b = random_batch(rng, R, km, kn, max_tokens=int(R * (1 + kn)) + 2)
        levels = torch.tensor([0.5, 0.75, 1.0])
        for name in ("model_conf", "ngram_conf", "stale_model_conf", "stale_ngram_conf"):
            t = getattr(b, name)
            t.copy_(levels[torch.from_numpy(rng.integers(0, 3, tuple(t.shape)))])
        if rng.random() < 0.5:
            b = dataclasses.replace(b, max_draft_tokens=int(rng.integers(0, 2 * R + 2)))
        _same(spec, pol, b, f"tied batch {i} (R={R})")


@pytest.mark.parametrize("spec", ["hybrid-price", "hybrid-price:margin=0.37", "hybrid", "hybrid-tree", "adaptive",
                                  "suffix-threshold"])
def test_out_of_range_confidences(spec):
    """Confidences outside [0, 1] (clamped by the survival) and signed zeros in some requests' chains: the
    native forms give the definition's answer. With NaN among them, the forms decline the batch (their
    transcription does not follow the definitions' NaN semantics) and the definition runs."""
    pol = get_policy(spec)
    rng = np.random.default_rng(zlib.crc32(spec.encode()) + 2)
    odd = torch.tensor([float("nan"), -0.25, 1.5, -0.0, 0.0, 1.0, float("inf")])
    for i in range(200):
        R = int(rng.choice([1, 3, 4, 9, 17, 64, 128]))
        km, kn = int(rng.choice([3, 7])), int(rng.choice([4, 9, 32]))
        b = random_batch(rng, R, km, kn, max_tokens=int(R * (1 + kn)) + 2)
        for name in ("model_conf", "ngram_conf", "stale_model_conf", "stale_ngram_conf"):
            t = getattr(b, name)
            hit = torch.from_numpy(rng.random(tuple(t.shape)) < rng.choice([0.02, 0.2]))
            if rng.random() < 0.5:  # no NaN: only the clamp and signed zeros
                t[hit] = odd[torch.from_numpy(rng.integers(1, len(odd), tuple(t.shape)))][hit].to(t.dtype)
            else:
                t[hit] = odd[torch.from_numpy(rng.integers(0, len(odd), tuple(t.shape)))][hit].to(t.dtype)
        _same(spec, pol, b, f"odd batch {i} (R={R})")
        if pol.sim_fn is not None:  # a form declines NaN (the definition runs) and takes the rest
            nan = any(bool(torch.isnan(getattr(b, n)).any()) for n in (
                "model_conf", "ngram_conf", "stale_model_conf", "stale_ngram_conf"))
            declined = pol.sim_fn.arrays(Arrays.of(b)) is None
            assert declined == nan, f"{spec}: odd batch {i}"


@pytest.mark.slow  # about a minute: a second build of the native forms and the random-batch checks on it
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler: the simulator runs the definitions")
def test_default_clone(tmp_path):
    """The lane functions' default clone (what a CPU without AVX2 runs; -DHP_NO_CLONES builds it alone) gives
    the definitions' allocations too: the random, tied and out-of-range batches of this file, rerun on it."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, HYBRIDSPEC_NATIVE_CFLAGS="-DHP_NO_CLONES")
    keys = "random_batches or tied or out_of_range or built_here"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__, "-k", keys],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
