"""Crashes, signals and a second process: SIGKILL and SIGTERM at random moments of sim.api.run and sim.api.sweep
(tiny settings) leave every output old or new as a whole, no worker behind, and nothing the next run does
not clean; two writers on one output are serialised or refused, never merged; --out edge cases are refused
or handled before any work; folder swaps and multi-file units survive a kill at every step.

The default run keeps the in-process checks (every step of a folder swap or a multi-file unit, two writers, --out
edge cases); the kills of a running sim.api.run / sim.api.sweep process (a few seeded moments, and many random ones) are
in the slow tier (about 30 s of subprocesses even seeded):
    python -m pytest tests/test_crash_safety.py -m slow
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import run_cli_inprocess

from sim.infra import fsio

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl")
RUN = [sys.executable, "-m", "sim.run", "--trace", TINY, "--no-progress", "--workers", "2", "--steps"]
SWEEP = [sys.executable, "-m", "sim.sweep", "--trace", TINY, "--no-progress", "--workers", "2"]


def _start(cmd: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "HYBRIDSPEC_CACHE_DIR": "off", **(env or {})})


def _group_gone(pgid: int, wait_s: float = 10.0) -> bool:
    """Whether every process of the group (the command and its workers) has exited within wait_s."""
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    os.killpg(pgid, signal.SIGKILL)  # do not leave them to the next test
    return False


def _kill_at(cmd: list[str], sig: int, after_s: float, after_first_line: bool = False) -> subprocess.CompletedProcess:
    """Run `cmd`, send `sig` to it after_s seconds after its start (or after its first stderr line: inside
    the work rather than Python's start-up), and wait for it and its workers."""
    p = _start(cmd)
    head = p.stderr.readline() if after_first_line else ""
    try:
        out, err = p.communicate(timeout=after_s)
    except subprocess.TimeoutExpired:
        os.kill(p.pid, sig)  # the command only, as timeout(1) or a scheduler does: workers must follow
        out, err = p.communicate(timeout=60)
    err = head + err
    assert _group_gone(p.pid), f"worker processes outlived the command ({signal.Signals(sig).name})"
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _leftovers(folder: Path) -> list[str]:
    return [e.name for e in folder.iterdir() if fsio.is_internal(e.name)]


# ---------------------------------------------------------------------------------------------- sim.api.run
def _run_result(out: Path) -> tuple[str, ...] | None:
    """The policies of the result in `out`, checked whole: the six files present and telling one story."""
    if not out.exists():
        return None
    from sim.api.run import steps_file

    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(["report.html", "requests.csv", steps_file(), "summary.json", "verdict.json",
                            "verdict.md"]), names
    pols = tuple(sorted({r["policy"] for r in json.loads((out / "summary.json").read_text())}))
    assert {v["recommended"]["policy"] for v in json.loads((out / "verdict.json").read_text())["verdicts"]} <= set(pols)
    assert tuple(sorted(set(pd.read_csv(out / "requests.csv")["policy"]))) == pols
    read = pd.read_parquet if steps_file().endswith(".parquet") else pd.read_csv
    assert tuple(sorted(set(read(out / steps_file())["policy"]))) == pols
    return pols


OLD = ("adaptive", "oracle")
NEW = ("adaptive", "hybrid-price")


def _run_trials(tmp_path: Path, moments: list[tuple[int, float, bool]]) -> None:
    for i, (sig, t, in_work) in enumerate(moments):
        out = tmp_path / f"o{i}"
        assert subprocess.run(RUN + ["--policy", "oracle", "--batch-size", "2", "--out", str(out)], cwd=ROOT,
                              capture_output=True).returncode == 0
        r = _kill_at(RUN + ["--policy", "hybrid-price", "--out", str(out), "--force"]
                     + [x for b in (1, 2, 4, 8, 16) for x in ("--batch-size", str(b))], sig, t, in_work)
        got = _run_result(out)
        assert got in (OLD, NEW), f"{signal.Signals(sig).name} at {t:.2f} s: {got}"
        if sig == signal.SIGTERM and r.returncode not in (0, -signal.SIGTERM):
            assert r.returncode == 130 and "interrupted" in r.stderr and "Traceback" not in r.stderr, r.stderr
            assert not _leftovers(tmp_path), _leftovers(tmp_path)
        if r.returncode == -signal.SIGTERM:  # only before the command started (Python still importing) or
            assert r.stderr == "" or "wrote" in r.stdout + r.stderr, r.stderr  # after it finished (at exit)
        # the next run cleans whatever the kill left, and writes the new result whole
        again = subprocess.run(RUN + ["--policy", "hybrid-price", "--batch-size", "2", "--out", str(out), "--force"],
                               cwd=ROOT, capture_output=True, text=True)
        assert again.returncode == 0, again.stderr
        assert _run_result(out) == NEW and not _leftovers(tmp_path), _leftovers(tmp_path)


@pytest.mark.slow
def test_sim_run_killed_at_random_moments(tmp_path):
    rng = random.Random(32)
    _run_trials(tmp_path, [(signal.SIGTERM, rng.uniform(0.0, 2.0), True), (signal.SIGKILL, rng.uniform(0.0, 3.0), True)])


@pytest.mark.slow
def test_sim_run_killed_at_many_random_moments(tmp_path):
    rng = random.Random()
    _run_trials(tmp_path, [(rng.choice([signal.SIGTERM, signal.SIGKILL]), rng.uniform(0.0, 4.0), rng.random() < 0.7)
                           for _ in range(16)])


# ---------------------------------------------------------------------------------------------- sim.api.sweep
def _sweep_tables(out: Path) -> set[str] | None:
    """cell ids of the results in `out`, checked as one unit (csv, parquet and grid agree)."""
    if not (out / "results.csv").exists():
        assert not (out / "results.parquet").exists() and not (out / "grid.json").exists()
        return None
    csv = set(pd.read_csv(out / "results.csv")["cell_id"])
    assert set(pd.read_parquet(out / "results.parquet")["cell_id"]) == csv
    grid = {c["cell_id"] for c in json.loads((out / "grid.json").read_text())["cells"]}
    assert csv <= grid
    return csv


def _sweep_trials(tmp_path: Path, moments: list[tuple[int, float]]) -> None:
    grid = ["--policy", "hybrid-price", "--policy", "oracle", "--batch-size", "2", "--batch-size", "8"]
    for i, (sig, t) in enumerate(moments):
        out = tmp_path / f"s{i}"
        r = _kill_at(SWEEP + grid + ["--out", str(out)], sig, t)
        _sweep_tables(out)
        if r.returncode == -signal.SIGTERM:  # only before the command started (Python still importing) or
            assert r.stderr == "" or "wrote" in r.stdout + r.stderr, r.stderr  # after it finished (at exit)
        elif sig == signal.SIGTERM and r.returncode != 0:
            assert r.returncode == 130 and "Traceback" not in r.stderr, r.stderr
            if list((out / "cells").glob("*.json")):
                assert (out / "results.csv").exists(), "an interrupted sweep writes the tables of the cells it finished"
        again = subprocess.run(SWEEP + grid + ["--out", str(out)], cwd=ROOT, capture_output=True, text=True)
        assert again.returncode == 0, again.stderr
        assert len(_sweep_tables(out)) == 6
        assert not _leftovers(out) and not _leftovers(out / "cells")


@pytest.mark.slow
def test_sim_sweep_killed_at_random_moments(tmp_path):
    rng = random.Random(33)
    _sweep_trials(tmp_path, [(signal.SIGTERM, rng.uniform(3.0, 6.0)), (signal.SIGKILL, rng.uniform(3.0, 6.0))])


@pytest.mark.slow
def test_sim_sweep_killed_at_many_random_moments(tmp_path):
    rng = random.Random()
    _sweep_trials(tmp_path, [(rng.choice([signal.SIGTERM, signal.SIGKILL]), rng.uniform(0.5, 9.0)) for _ in range(12)])


# ---------------------------------------------------------------------------------------------- two writers
def test_two_runs_on_one_out_never_both_succeed(tmp_path):
    out = tmp_path / "o"
    a = _start(RUN + ["--policy", "oracle", "--batch-size", "2", "--out", str(out)])
    b = _start(RUN + ["--policy", "hybrid-price", "--batch-size", "2", "--out", str(out)])
    ra, rb = a.wait(120), b.wait(120)
    errs = a.stderr.read() + b.stderr.read()
    assert sorted([ra, rb]) == [0, 2], errs
    assert "another process" in errs or "already holds files" in errs
    assert _run_result(out) in (("adaptive", "oracle"), NEW)


def test_a_second_sweep_on_a_busy_out_is_refused(tmp_path):
    """A sweep on an --out another process is writing is refused at once (here the first writer is this test
    holding the lock, so the timing cannot decide the outcome); the earlier tables stay whole."""
    out = tmp_path / "s"
    grid = ["--policy", "hybrid-price", "--batch-size", "2", "--out", str(out)]
    assert subprocess.run(SWEEP + grid, cwd=ROOT, capture_output=True).returncode == 0
    before = _sweep_tables(out)
    with fsio.output_lock(out):
        b = subprocess.run(SWEEP + ["--policy", "ngram-threshold", "--batch-size", "4", "--out", str(out)], cwd=ROOT,
                           capture_output=True, text=True)
    assert b.returncode == 2 and "another process" in b.stderr, b.stderr
    assert _sweep_tables(out) == before and not _leftovers(out)



# ---------------------------------------------------------------------------------------------- --out edges
def _run_inproc(*args, cwd):
    return run_cli_inprocess("sim.api.run", "--trace", TINY, "--policy", "hybrid-price", "--batch-size", "2",
                             "--no-progress", "--steps", *args, cwd=cwd)


@pytest.mark.parametrize("out", [".", "..", "{cwd}/.", "{cwd}", "{parent}", "/"])
def test_out_naming_the_working_folder_or_an_ancestor_is_refused_before_any_work(tmp_path, out):
    cwd = tmp_path / "work"
    cwd.mkdir()
    (cwd / "precious.txt").write_text("keep me")
    t0 = time.perf_counter()
    r = _run_inproc("--out", out.format(cwd=cwd, parent=tmp_path), "--force", cwd=cwd)
    assert r.returncode == 2 and r.stderr.startswith("error: --out") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert time.perf_counter() - t0 < 5 and "wrote" not in r.stdout  # refused before the simulation
    assert (cwd / "precious.txt").read_text() == "keep me"


def test_sweep_out_dot_is_refused(tmp_path):
    r = run_cli_inprocess("sim.api.sweep", "--trace", TINY, "--out", ".", "--no-progress", cwd=tmp_path)
    assert r.returncode == 2 and "current folder" in r.stderr


def test_a_symlinked_out_gets_the_new_result_through_the_link(tmp_path):
    target = tmp_path / "real"
    link = tmp_path / "link"
    assert _run_inproc("--out", target, cwd=tmp_path).returncode == 0
    link.symlink_to(target)
    r = run_cli_inprocess("sim.api.run", "--trace", TINY, "--policy", "oracle", "--batch-size", "2", "--no-progress",
                          "--steps", "--out", link, "--force", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and os.path.realpath(link) == str(target)
    assert _run_result(link) == ("adaptive", "oracle") and _run_result(target) == ("adaptive", "oracle")


def test_force_replaces_only_the_files_sim_run_writes(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "sub").mkdir()
    (out / "sub" / "data.bin").write_bytes(b"\x00\x01")
    r = _run_inproc("--out", out, cwd=tmp_path)
    assert r.returncode == 2 and "already holds files" in r.stderr
    r = _run_inproc("--out", out, "--force", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (out / "notes.txt").read_text() == "mine" and (out / "sub" / "data.bin").read_bytes() == b"\x00\x01"
    assert (out / "summary.json").is_file()


def test_leftovers_of_killed_runs_are_cleaned_by_the_next(tmp_path):
    out = tmp_path / "o"
    dead = 2 ** 22 + 12345  # above any pid_max default: no live process has it
    (tmp_path / fsio.own_name("o", "tmp", dead)).mkdir()
    (tmp_path / fsio.own_name("o", "tmp", dead) / "summary.json").write_text("{}")
    (tmp_path / fsio.own_name("o", "old", dead)).mkdir()
    assert len(_leftovers(tmp_path)) == 2
    assert _run_inproc("--out", out, cwd=tmp_path).returncode == 0
    assert not _leftovers(tmp_path)
    s = tmp_path / "s"
    (s / "cells").mkdir(parents=True)
    (s / fsio.own_name("results.csv", "part", dead)).write_text("half")
    (s / "cells" / fsio.own_name("abc.json", "tmp", dead)).write_text("half")
    r = run_cli_inprocess("sim.api.sweep", "--trace", TINY, "--policy", "hybrid-price", "--batch-size", "2",
                          "--no-progress", "--workers", "1", "--out", s, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not _leftovers(s) and not _leftovers(s / "cells")


# ---------------------------------------------------------------------------------------------- swaps and units
def _folder(p: Path, text: str) -> Path:
    p.mkdir()
    (p / "a").write_text(text)
    (p / "b").write_text(text)
    return p


@pytest.mark.parametrize("exchange", [True, False])
def test_swap_dir_replaces_a_folder_whole(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setenv("HYBRIDSPEC_NO_RENAMEAT2", "1")
    path = _folder(tmp_path / "out", "old")
    fsio.swap_dir(_folder(tmp_path / ".out.1.tmp", "new"), path)
    assert (path / "a").read_text() == (path / "b").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_kill_between_the_journal_swaps_renames_rolls_forward(tmp_path, monkeypatch):
    """The journal fallback killed after its first rename (out moved aside, new not yet in place): the next
    recover() puts the new folder in place; `out` is never left missing for good."""
    monkeypatch.setenv("HYBRIDSPEC_NO_RENAMEAT2", "1")
    path = _folder(tmp_path / "out", "old")
    new = _folder(tmp_path / fsio.own_name("out", "tmp", 7), "new")
    real_replace = os.replace
    calls = []

    def dying_replace(a, b):
        calls.append(a)
        if len(calls) == 3:  # 1: the journal, 2: out moved aside, 3: new into place
            raise KeyboardInterrupt  # stands for SIGKILL between the two renames
        real_replace(a, b)

    monkeypatch.setattr(fsio.os, "replace", dying_replace)
    with pytest.raises(KeyboardInterrupt):
        fsio.swap_dir(new, path)
    monkeypatch.setattr(fsio.os, "replace", real_replace)
    assert not path.exists()
    fsio.recover(tmp_path)
    assert (path / "a").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("die_after", [0, 1])
def test_commit_files_is_one_unit_at_every_kill_point(tmp_path, monkeypatch, die_after):
    """A kill after 0 or 1 of the two renames of a committed unit: recover() completes it (all new)."""
    (tmp_path / "x.csv").write_text("old")
    (tmp_path / "x.parquet").write_text("old")
    real_replace = os.replace
    n = []

    def dying_replace(a, b):
        if str(a).endswith(".part"):
            if len(n) == die_after:
                raise KeyboardInterrupt
            n.append(a)
        real_replace(a, b)

    monkeypatch.setattr(fsio.os, "replace", dying_replace)
    with pytest.raises(KeyboardInterrupt):
        fsio.commit_files(tmp_path, {"x.csv": "new", "x.parquet": "new"})
    monkeypatch.setattr(fsio.os, "replace", real_replace)
    fsio.recover(tmp_path)
    assert (tmp_path / "x.csv").read_text() == (tmp_path / "x.parquet").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.csv", "x.parquet"]


def test_an_uncommitted_unit_leaves_the_old_files(tmp_path):
    (tmp_path / "x.csv").write_text("old")
    dead = 2 ** 22 + 777
    (tmp_path / fsio.own_name("x.csv", "part", dead)).write_text("new but never committed")
    fsio.clean_dead(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.csv"] and (tmp_path / "x.csv").read_text() == "old"


def test_a_drafter_save_killed_between_weights_and_digest_still_loads(tmp_path, monkeypatch):
    import torch

    from real.drafter.model import DrafterConfig, DSparkDrafter, load_drafter, save_drafter

    tiny = dict(target="qwen3-tiny", target_vocab=4096, hidden=128, layers=(0, 1), block=5, heads=4, kv_heads=2,
                head_dim=32, intermediate=256, vocab=512, rank=16)
    torch.manual_seed(0)
    d = DSparkDrafter(DrafterConfig(**tiny))
    d.set_vocab(torch.arange(512))
    p = tmp_path / "d.pt"
    save_drafter(d, p, {"v": 1})
    real_replace = os.replace

    def dying_replace(a, b):
        real_replace(a, b)
        if str(b) == str(p):
            raise KeyboardInterrupt  # killed after the weights, before the digest

    monkeypatch.setattr(fsio.os, "replace", dying_replace)
    with pytest.raises(KeyboardInterrupt):
        save_drafter(d, p, {"v": 2})
    monkeypatch.setattr(fsio.os, "replace", real_replace)
    assert load_drafter(p).meta["v"] == 2  # the committed unit was finished, the digest matches


# ---------------------------------------------------------------------------------------------- signals
def test_sigterm_unwinds_like_ctrl_c(tmp_path):
    """A command under SIGTERM exits 130 with one line, and its finally blocks ran (here: the temporary
    folder of an output being written is removed)."""
    code = ("import os, signal, time, sys\n"
            "from sim.infra.cli import run_cli\n"
            "from sim.infra.fsio import atomic_dir\n"
            "def main(argv):\n"
            f"    with atomic_dir(__import__('pathlib').Path({str(tmp_path / 'o')!r})) as t:\n"
            "        (t / 'f').write_text('x'); print('ready', flush=True); time.sleep(60)\n"
            "run_cli(main)\n")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130 and err.strip() == "interrupted (SIGTERM)", err
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def test_validate_refuses_an_out_another_process_writes(tmp_path):
    """real/validation/validate.py holds the --out lock too: a second validation of one folder is refused at once."""
    out = tmp_path / "val"
    with fsio.output_lock(out):  # stands for a first validation still running
        r = run_cli_inprocess("real.validation.validate", "--quick", "--trace", ROOT / "tests" / "fixtures" / "trace" / "text.jsonl",
                              "--out", out, cwd=tmp_path)
    assert r.returncode == 2 and "another process" in r.stderr, r.stderr


@pytest.mark.parametrize("journal", [False, True])
@pytest.mark.parametrize("kill_at", [1, 2, 3])
def test_atomic_dir_killed_at_each_rename_leaves_old_or_new(tmp_path, kill_at, journal):
    """sim.api.run's folder swap (sim.infra.cli.atomic_dir) with the process killed (os._exit, no cleanup) at its
    1st, 2nd or 3rd os.replace: `out` is there, old or new, at once or after the next run's recover()."""
    out = _folder(tmp_path / "out", "old")
    code = ("import os, sys\n"
            "from pathlib import Path\n"
            "from sim.infra.cli import atomic_dir\n"
            "real, n = os.replace, [0]\n"
            "def dying(a, b):\n"
            "    n[0] += 1\n"
            f"    if n[0] == {kill_at}: os._exit(9)\n"
            "    real(a, b)\n"
            "os.replace = dying\n"
            f"with atomic_dir(Path({str(out)!r})) as t:\n"
            "    (t / 'a').write_text('new'); (t / 'b').write_text('new')\n")
    env = {**os.environ, **({"HYBRIDSPEC_NO_RENAMEAT2": "1"} if journal else {})}  # the fallback without renameat2
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=60, env=env)
    try:
        from sim.infra.fsio import recover  # the next run's first step
    except ImportError:
        recover = None
    if recover is not None:
        recover(tmp_path)
    assert out.is_dir(), sorted(p.name for p in tmp_path.iterdir())
    assert (out / "a").read_text() == (out / "b").read_text() in ("old", "new")
