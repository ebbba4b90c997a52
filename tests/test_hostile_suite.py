"""The generated hostile-input suite (issue 12; cases in tests/hostile_cases.py): every case is refused with
exactly one stderr line `error: ...`, exit 2, no traceback, no out-of-memory (a size must be refused before it
is allocated), the files it was given unchanged, and no temporary file left behind. Commands run in-process
(tests/conftest.py run_cli_inprocess), each under a time guard and a memory ceiling so that a case that is
wrongly accepted fails quickly instead of running a simulation or filling the machine's memory."""
from __future__ import annotations

import hashlib
import os
import resource
import signal
from collections import Counter
from pathlib import Path

import pytest
from conftest import run_cli_inprocess
from hostile_cases import CASES, MODULES, ROOT

TIME_GUARD_S = 20
MEMORY_HEADROOM = 3 * 2**30  # address space a case may add to this process before it gets MemoryError


class _TookTooLong(BaseException):
    """Raised by the time guard; a BaseException so that no error boundary turns it into a clean line."""


def _digest(p: Path) -> str | None:
    try:
        return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ("dir" if p.is_dir() else None)
    except OSError:
        return None


def _vm_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def run_case(case, tmp: Path):
    """Run one case; return (result, problems: a list of what went wrong)."""
    argv, protect = case.build(tmp)
    before = {p: _digest(p) for p in protect}
    saved = {p: p.read_bytes() for p in protect if p.is_file() and ROOT in p.resolve().parents}
    module, args = argv[0], argv[1:]

    def alarm(signum, frame):
        raise _TookTooLong()

    old_handler = signal.signal(signal.SIGALRM, alarm)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_vm_bytes() + MEMORY_HEADROOM, hard))
    signal.alarm(TIME_GUARD_S)
    problems = []
    try:
        r = run_cli_inprocess(module, *args, cwd=tmp)
    except _TookTooLong:
        return None, [f"still running after {TIME_GUARD_S} s (accepted?)"]
    finally:
        signal.alarm(0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.signal(signal.SIGALRM, old_handler)
        for p, data in saved.items():  # never leave the checkout damaged, whatever the command did
            if not p.is_file() or p.read_bytes() != data:
                p.write_bytes(data)
    lines = r.stderr.strip().splitlines()
    if r.returncode != 2:
        problems.append(f"exit {r.returncode}")
    if "Traceback" in r.stderr:
        problems.append("traceback")
    if len(lines) != 1 or not lines[0].startswith("error: "):
        problems.append(f"{len(lines)} stderr lines")
    if "out of memory" in r.stderr:
        problems.append("out of memory instead of a refusal")
    changed = [str(p) for p, d in before.items() if _digest(p) != d]
    if changed:
        problems.append(f"changed {changed}")
    left = [str(p) for p in tmp.rglob("*") if ".tmp" in p.name]
    if left:
        problems.append(f"left {left}")
    return r, problems


@pytest.fixture(scope="module", autouse=True)
def _imported():
    """Import every command once, outside the time guard (torch and friends take seconds on a busy machine)."""
    import importlib

    for m in MODULES:
        importlib.import_module(m)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_case(case, tmp_path):
    r, problems = run_case(case, tmp_path)
    assert not problems, f"{case.id} ({case.klass}): {problems}\n{r.stderr if r else ''}"


def test_the_suite_is_large_and_covers_every_command_and_class():
    assert len(CASES) >= 250
    modules = Counter(c.module for c in CASES)
    for m in ("sim.run", "sim.sweep", "sim.report", "sim.calibrate", "sim.cost", "sim.trace", "sim.sensitivity",
              "sim.bench", "real.validate", "real.profile", "real.train_drafter", "real.eval_drafter",
              "real.drafter_report", "real.gpu_check"):
        assert modules[m] >= 3, (m, modules[m])
    assert set(Counter(c.klass for c in CASES)) == {"parser", "os", "size", "type", "loss", "args"}
