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
from contextlib import contextmanager
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


@contextmanager
def guarded(seconds: int = TIME_GUARD_S, headroom: int = MEMORY_HEADROOM):
    """Within the block: _TookTooLong after `seconds`, and MemoryError past `headroom` bytes of address space
    beyond what this process holds now (a size must be refused before it is allocated)."""
    def alarm(signum, frame):
        raise _TookTooLong()

    old_handler = signal.signal(signal.SIGALRM, alarm)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_vm_bytes() + headroom, hard))
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.signal(signal.SIGALRM, old_handler)


def run_case(case, tmp: Path):
    """Run one case; return (result, problems: a list of what went wrong)."""
    argv, protect, *rest = case.build(tmp)  # a case may add the environment it runs in (a cache folder, a limit)
    env = rest[0] if rest else None
    before = {p: _digest(p) for p in protect}
    saved = {p: p.read_bytes() for p in protect if p.is_file() and ROOT in p.resolve().parents}
    module, args = argv[0], argv[1:]
    problems = []
    try:
        with guarded():
            r = run_cli_inprocess(module, *args, cwd=tmp, env=env)
    except _TookTooLong:
        return None, [f"still running after {TIME_GUARD_S} s (accepted?)"]
    finally:
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
    for m in ("sim.api.run", "sim.api.sweep", "sim.api.report", "sim.api.calibrate", "sim.core.cost", "sim.core.trace", "sim.api.sensitivity",
              "sim.api.bench", "real.validation.validate", "real.validation.profile", "real.train_drafter", "real.validation.eval_drafter",
              "real.validation.drafter_report", "real.validation.gpu_check"):
        assert modules[m] >= 3, (m, modules[m])
    assert set(Counter(c.klass for c in CASES)) == {"parser", "os", "size", "type", "loss", "args"}


# ---------------------------------------------------------------------------------------- beyond refusals
def test_stats_limit_reads_only_the_lines_it_needs(tmp_path, monkeypatch):
    """`sim.core.trace stats --limit 1` stops after the first request: the second line is garbage (it would be an
    error if read) and the loader's line reader is asked for exactly one line."""
    import sim.core.trace.loader as loader

    f = tmp_path / "big.jsonl"
    with open(f, "w") as fh:
        fh.write('{"id": "a", "prompt_len": 3, "output_len": 4}\n')
        fh.write("\x00 not json at all\n")
        fh.write('{"id": "b", "prompt_len": 3, "output_len": 4}\n' * 20000)
    read = []
    real = loader.file_lines

    def counting(*a, **k):
        for item in real(*a, **k):
            read.append(item[0])
            yield item

    monkeypatch.setattr(loader, "file_lines", counting)
    r = run_cli_inprocess("sim.core.trace", "stats", str(f), "--limit", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert ": 1 requests" in r.stdout and read == [1]
    r = run_cli_inprocess("sim.core.trace", "stats", str(f), cwd=tmp_path)  # without --limit it reaches line 2
    assert r.returncode == 2 and f"{f}:2" in r.stderr and read[-1] == 2


def test_kv_need_is_refused_up_front_with_the_request_and_its_line(tmp_path):
    from hostile_cases import TINY

    r = run_cli_inprocess("sim.api.run", "--trace", TINY, "--policy", "adaptive", "--batch-size", "2", "--no-progress",
                          "--workers", "1", "--kv-capacity-tokens", "64", "--out", tmp_path / "o", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "request 't" in r.stderr and "tiny.jsonl:" in r.stderr and "--kv-capacity-tokens holds 64" in r.stderr
    assert not (tmp_path / "o").exists() and "tok/s" not in r.stdout  # nothing simulated, nothing written


def test_sweep_interrupted_counts_only_the_cells_that_ran(tmp_path, monkeypatch):
    """Ctrl-C after the first cell: the closing line says 1 run and the rest not run; the tables hold the one
    finished cell, written whole."""
    import pandas as pd

    import sim.api.sweep as sw
    from hostile_cases import TINY

    calls = []
    real = sw.run_cell

    def interrupt_second(cell):
        calls.append(cell)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(cell)

    monkeypatch.setattr(sw, "run_cell", interrupt_second)
    r = run_cli_inprocess("sim.api.sweep", "--trace", TINY, "--limit", "4", "--policy", "adaptive", "--policy", "oracle",
                          "--batch-size", "2", "--batch-size", "4", "--workers", "1", "--no-progress",
                          "--out", tmp_path / "sw", cwd=tmp_path)
    assert r.returncode == 130
    assert "1 cells run (0 cached, 0 failed, 3 not run)" in r.stderr, r.stderr
    df = pd.read_csv(tmp_path / "sw" / "results.csv")
    assert len(df) == 1 and (df["status"] == "ok").all()
    assert not [p for p in (tmp_path / "sw").rglob("*") if ".tmp" in p.name]


@pytest.mark.parametrize("damage", ["empty_object", "lossless_false", "binary", "cut", "deep", "huge_int", "other_id"])
def test_a_damaged_sweep_cell_is_recomputed_with_a_warning(tmp_path, damage):
    import json

    import pandas as pd

    from hostile_cases import TINY

    args = ["sim.api.sweep", "--trace", TINY, "--limit", "4", "--policy", "adaptive", "--batch-size", "2", "--workers", "1",
            "--no-progress", "--out", tmp_path / "sw"]
    assert run_cli_inprocess(*args, cwd=tmp_path).returncode == 0
    fresh = pd.read_csv(tmp_path / "sw" / "results.csv")
    (cell,) = (tmp_path / "sw" / "cells").glob("*.json")
    body = json.loads(cell.read_text())
    data = {"empty_object": b"{}", "binary": bytes(range(256)), "cut": cell.read_bytes()[:200],
            "deep": b"[" * 100000 + b"]" * 100000, "huge_int": b'{"schema": ' + b"9" * 5000 + b"}",
            "lossless_false": json.dumps(dict(body, status="ok", row=dict(body["row"], lossless=False))).encode(),
            "other_id": json.dumps(dict(body, cell_id="0" * 20)).encode()}[damage]
    cell.write_bytes(data)
    r = run_cli_inprocess(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "recomputing the cell" in r.stderr and "1 cells run (0 cached" in r.stderr
    again = pd.read_csv(tmp_path / "sw" / "results.csv")
    cols = ["cell_id", "output_throughput_tok_s", "sim_time_s"]
    pd.testing.assert_frame_equal(fresh[cols], again[cols])
