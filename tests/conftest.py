"""Shared test helpers: a small linear cost model and random request/trace builders; and the session's own
behaviour: Ctrl-C stops the run at once and is never reported as a test's failure (_sigint_seen), and a missing C
compiler is said in one line at the start (pytest_sessionstart)."""
import os
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.core.cost.base import CostModel  # noqa: E402
from sim.core.trace.schema import Request  # noqa: E402


class LinearCost(CostModel):
    """A transparent cost model for engine tests: 5 ms + 0.02 ms/token + 1e-5 ms per KV token."""

    name = "linear"

    def __init__(self, kv_capacity: int = 10**7):
        self._cap = kv_capacity

    def verify_ms(self, num_tokens, kv_tokens, num_seqs, logit_rows=None):
        return 5.0 + 0.02 * np.asarray(num_tokens, dtype=float) + 1e-5 * kv_tokens

    def draft_ms(self, num_reqs, block):
        return 0.5 + 0.001 * num_reqs * block

    def ngram_ms(self, num_reqs, on_gpu=True):
        return 0.03 if on_gpu else 0.3 + 0.01 * num_reqs

    def alloc_ms(self, num_reqs, policy=None, adaptive=False):
        return 0.02

    def sample_ms(self, num_tokens):
        return 0.001 * num_tokens

    def cpu_ms(self, num_reqs, num_tokens):
        return 0.2 + 0.004 * num_reqs

    @property
    def kv_capacity_tokens(self):
        return self._cap


def random_requests(rng: np.random.Generator, n: int, vocab: int = 6, max_prompt: int = 40, max_out: int = 60,
                    copy: bool = True) -> list[Request]:
    """Requests over a tiny vocabulary (so n-grams match often), some outputs copying their prompt."""
    reqs = []
    for i in range(n):
        P = int(rng.integers(1, max_prompt))
        prompt = rng.integers(0, vocab, P).astype(np.int32)
        L = int(rng.integers(1, max_out))
        if copy and rng.random() < 0.5:
            out = np.resize(prompt, L).astype(np.int32)
        else:
            out = rng.integers(0, vocab, L).astype(np.int32)
        reqs.append(Request(id=f"r{i}", prompt_ids=prompt, output_ids=out, prompt_len=P, output_len=L))
    return reqs


def plausible_calibrator(cfg):
    """A fixed, plausible n-gram calibrator: acceptance rises with the match length, falls with depth."""
    from sim.core.drafters.calibration import KNOTS, NgramCalibrator

    w = np.zeros(len(KNOTS) + 11)
    w[0], w[1], w[1 + len(KNOTS)] = -0.5, 1.0, -0.3
    return NgramCalibrator(w, cfg)


# ------------------------------------------------------------------------------------------ Ctrl-C, compiler
_SIGINT: list[int] = []  # set when this process got SIGINT (Ctrl-C reaches pytest and every command a test runs)


def _sigint_seen(signum, frame):
    """Python's own Ctrl-C (KeyboardInterrupt), remembered: a command a test runs in process (run_cli_inprocess)
    turns it into exit 130 as it must for a user, and the test would then report `assert 130 == 0` as FAILED
    and the run go on."""
    _SIGINT.append(signum)
    signal.default_int_handler(signum, frame)


NATIVE_TESTS = ("test_bench_per_step", "test_engine_arrays", "test_engine_fast", "test_engine_stretch",
                "test_fast_forms", "test_native_private", "test_native_sums")  # what skips without a C compiler


def pytest_sessionstart(session):
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not when a debugger or plugin owns it
        signal.signal(signal.SIGINT, _sigint_seen)
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:  # said once, first, rather than as skips nobody reads under -q
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        line = (f"note: no C compiler ({cc} is not on PATH): the native step is not built and the tests of it skip "
                f"({', '.join(NATIVE_TESTS)}); the simulator runs its numpy definitions. Install one (apt-get "
                "install gcc) or set CC to test it")
        if tr is not None:
            tr.write_line(line)
        else:
            print(line, file=sys.stderr)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test during which Ctrl-C arrived ends the session as interrupted (pytest's KeyboardInterrupt), whatever
    the test made of it (a command's exit 130, a child killed by SIGINT, an assertion on either)."""
    try:
        return (yield)
    finally:
        if _SIGINT:
            raise KeyboardInterrupt


_TORCH_THREADS: list[int] = []  # torch's thread count before the first test's set-up: what every test must leave


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if not _TORCH_THREADS:  # before any fixture, a module-scoped one included, could change it
        import torch

        _TORCH_THREADS.append(torch.get_num_threads())


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Fails a test that leaves torch's thread count changed (a one-worker sweep once left every later test on
    one thread, and a test whose outcome hung on it failed only in the full run); the count is put back, so
    the leak fails that one test and not every test after it."""
    yield
    import torch

    now = torch.get_num_threads()
    if now != _TORCH_THREADS[0]:
        torch.set_num_threads(_TORCH_THREADS[0])
        pytest.fail(f"the test left torch.get_num_threads() at {now}, not {_TORCH_THREADS[0]}: restore what it sets",
                    pytrace=False)


@pytest.fixture
def linear_cost():
    return LinearCost()


class CliResult:
    """What a command printed and returned (the fields of subprocess.CompletedProcess the tests read)."""

    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


_CLI_MAIN = {"sim.core.trace": "sim.api.traces", "sim.core.cost": "sim.api.cost_tables"}


def run_cli_inprocess(module: str, *args, cwd=None, env: dict | None = None) -> CliResult:
    """`python -m module args...` in this process (the same error boundary, sim.infra.cli.run_cli; stdout and
    stderr captured as a pipe would, so not terminals): no interpreter start-up and no torch import per
    call, which is most of a subprocess's cost in these tests."""
    import contextlib
    import importlib
    import io
    import os

    from sim.infra.cli import run_cli

    main = importlib.import_module(_CLI_MAIN.get(module, module)).main
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    saved = {k: os.environ.get(k) for k in (env or {})}
    code = 0
    try:
        os.environ.update(env or {})  # read at call time by what these commands run (e.g. HYBRIDSPEC_CACHE_DIR)
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                run_cli(main, [str(a) for a in args])
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code == 130 and _SIGINT:  # the user's Ctrl-C, which the command's boundary made its exit code: stop now
            raise KeyboardInterrupt
    finally:
        os.chdir(old)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return CliResult(code, out.getvalue(), err.getvalue())


def vllm_modules(*names: str):
    """(modules, needs_vllm): the vLLM modules `names` imported, and a skip mark for tests that need them; where
    vLLM 0.33 is not importable, None for each module and the mark says why (the `-m vllm` set's environment:
    pip install -e '.[vllm]')."""
    import importlib

    try:
        mods = [importlib.import_module(n) for n in names]
    except Exception as e:  # noqa: BLE001 - any import failure means: no usable vLLM here
        why = f"vLLM 0.33 is not importable ({type(e).__name__}: {e}); pip install -e '.[vllm]'"
        return [None] * len(names), pytest.mark.skipif(True, reason=why)
    return mods, pytest.mark.skipif(False, reason="vLLM present")
