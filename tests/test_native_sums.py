"""The C transcriptions of torch's float32 sums (sim/engine/native/hybrid_price.c: hp_sum_requests, the
sum over requests of [S, R, C]; st_expected, the sum along a survival row) against torch.sum itself, bit for
bit, over many shapes and magnitudes; and the width check that decides whether the simulator may use them."""
import shutil

import numpy as np
import pytest
import torch

from sim.engine import policy_fast as fast
from sim.engine.native import load

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler: the simulator runs the definitions")


@pytest.fixture(autouse=True)
def one_thread():
    """torch's sums on one thread, as the simulator's engine runs them; the caller's count put back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def native():
    return load("hybrid_price")


def _bits(x):
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def test_sum_over_requests_matches_torch(native):
    ffi, lib = native
    V = fast._sum_width(native, 2, 4, (157,))
    assert V in (4, 8, 16)
    rng = np.random.default_rng(0)
    shapes = [(S, R, C) for S in (1, 2, 4) for R in (1, 2, 3, 4, 5, 8, 15, 16, 17, 31, 33, 64, 100, 128, 129, 256)
              for C in (2, 3, 7, 8, 9, 31, 32, 33, 49, 65, 157, 235)]
    for S, R, C in shapes:
        x = (rng.random((S, R, C)) * 10.0 ** rng.integers(-5, 5, (S, R, C))).astype(np.float32)
        x[rng.random(x.shape) < 0.2] = 0.0  # gains of requests whose chains are empty
        got = np.empty((S, C), np.float32)
        lib.hp_sum_requests(S, R, C, V, ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", got))
        assert np.array_equal(_bits(got), _bits(torch.from_numpy(x).sum(1).numpy())), (S, R, C)


def test_sum_along_rows_matches_torch(native):
    ffi, lib = native
    V = fast._inner_sum_width(native)
    assert V in (4, 8, 16)
    rng = np.random.default_rng(1)
    for R in (1, 3, 4, 9, 128, 257):
        for K in (1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33, 40, 64, 70):
            conf = (rng.random((R, K)) ** rng.uniform(0.01, 1.0)).astype(np.float32)
            ln = rng.integers(0, K + 1, R).astype(np.int64)
            surv, cs, got = np.empty((R, K), np.float32), np.empty((R, K + 1), np.float32), np.empty(R, np.float32)
            lib.st_expected(R, K, V, ffi.from_buffer("float[]", conf), ffi.from_buffer("int64_t[]", ln),
                            ffi.from_buffer("float[]", surv), ffi.from_buffer("float[]", cs), ffi.from_buffer("float[]", got))
            assert np.array_equal(_bits(got), _bits(torch.from_numpy(surv).sum(1).numpy())), (R, K)


def test_a_wrong_width_is_refused(native):
    """The check that gates the C sums fails on a summation order other than torch's (a wrong vector width
    puts columns in the wrong order class), so a machine whose kernels differ runs the definitions."""
    V = fast._sum_width(native, 2, 4, (157,))
    wrong = 4 if V != 4 else 16
    assert fast._sum_checked(native, V, fast._SUM_SHAPES)
    assert not fast._sum_checked(native, wrong, fast._SUM_SHAPES)


def test_no_width_runs_the_definition(monkeypatch):
    """Where the C sum cannot reproduce torch's, the fast forms return None and fn(batch) runs the definition."""
    from sim.engine.policies import sim_policy
    from sim.core.policies.testing import random_batch

    monkeypatch.setattr(fast, "_sum_width", lambda *a, **k: None)
    monkeypatch.setattr(fast, "_CONST", {})
    rng = np.random.default_rng(3)
    for spec in ("hybrid-price", "hybrid", "hybrid-tree"):
        pol = sim_policy(spec)
        b = random_batch(rng, 16, 7, 32)
        assert pol.sim_fn.arrays(fast.Arrays.of(b)) is None
        want, got = pol.fn(b), pol.sim_fn(b)
        assert torch.equal(want.chain, got.chain) and torch.equal(want.admitted, got.admitted)
