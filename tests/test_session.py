"""The test session itself (tests/conftest.py): Ctrl-C stops pytest at once and no test reports it as a failure;
a missing C compiler is said in one line at the start of the run."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CASE = ROOT / "tests" / "fixtures" / "interrupt" / "interrupted_case.py"


def _default_sigint() -> None:
    # a suite started in the background (`cmd &`, nohup) inherits SIGINT ignored, and Python then keeps it ignored:
    # the child gets a terminal's default, so that its Ctrl-C is what a user's is
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _pytest(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    # its own session (process group): its Ctrl-C, sent to the group, never reaches this run
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, start_new_session=True,
                          env={**os.environ, **(env or {})}, preexec_fn=_default_sigint)


@pytest.mark.parametrize("test", ["test_ctrl_c_during_an_in_process_command", "test_ctrl_c_during_a_child_command"])
def test_ctrl_c_stops_the_run_and_fails_no_test(test):
    r = _pytest(f"{CASE}::{test}", f"{CASE}::test_never_reached", "-v")
    out = r.stdout + r.stderr
    assert r.returncode == 2, out  # pytest's "interrupted"
    assert "KeyboardInterrupt" in out and "FAILED" not in out and "130" not in out, out
    assert "test_never_reached PASSED" not in out and " passed" not in out, out


def test_a_missing_c_compiler_is_said_once_at_the_start(tmp_path):
    env = {"PATH": str(tmp_path), "CC": ""}  # an empty folder: no cc on PATH
    r = _pytest("--collect-only", "-q", "tests/test_native_sums.py", env=env)
    lines = [ln for ln in r.stdout.splitlines() if "no C compiler" in ln]
    assert len(lines) == 1 and r.stdout.index(lines[0]) < r.stdout.index("test_native_sums"), r.stdout
    assert "apt-get install gcc" in lines[0] and "test_native_sums" in lines[0]
    with_cc = _pytest("--collect-only", "-q", "tests/test_native_sums.py")
    assert "no C compiler" not in with_cc.stdout or not __import__("shutil").which("cc")
