"""The one output layer every writer goes through (sim/infra/fsio.py, sim/infra/cli.py; issue 46), family by family,
each on the commands the issue found and through the mechanism that closes it:
  data loss    `--out ..`, `.`, the working folder or its parent (with --force) is refused before any work and
               touches nothing; --force replaces only the files the command writes; a second writer of one
               output is refused; a multi-file output is one unit (a full disk leaves the old set or the new
               one, and the rerun works)
  leftovers    no lock file after a refused run or a finished one (the holder removes it, and a locker that got
               a removed file retries); no temporary folder after anchors' or reprice's runs, failed or not
  tracked      a default output never replaces a file git tracks; naming the output does
  config       an exported config.json never holds a non-numeric or non-finite rope_theta
Every case runs on tiny inputs in seconds."""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import run_cli_inprocess

from sim.infra import cli, fsio
from sim.infra.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl"
EXPORT = "real.drafter.export_vllm"
VLLM_CPU = "real.validation.vllm_cpu.make_models"
TINY_V = dict(target="qwen3-tiny", target_vocab=256, hidden=32, layers=(0,), block=3, num_layers=1, heads=2,
              kv_heads=1, head_dim=16, intermediate=64, vocab=256, rank=4, mask_token_id=255)


def _tiny_drafter():
    import torch

    from real.drafter.qwen3_dspark import DSparkV, DSparkVConfig

    torch.manual_seed(0)
    return DSparkV(DSparkVConfig(**TINY_V))


@pytest.fixture(scope="module")
def drafter_file(tmp_path_factory) -> Path:
    """A vLLM-architecture drafter small enough to export in a fraction of a second (its vocabulary is the
    target's: no target model is needed)."""
    from real.drafter.model import save_drafter

    p = tmp_path_factory.mktemp("drafter") / "d.pt"
    save_drafter(_tiny_drafter(), p, {"note": "test"})
    return p


def _snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def _locks(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*.lock")]


def _one_line(r, needle: str, progress: bool = False) -> None:
    """Exit 2 with one error line naming `needle` (after the command's progress lines, where it prints some)."""
    lines = r.stderr.strip().splitlines()
    if progress:
        lines = [ln for ln in lines if not ln.startswith("[")]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------------------------------------ data loss: --out
def _folder_writers(drafter: Path) -> dict[str, list[str]]:
    return {"export": [EXPORT, "--drafter", str(drafter)], "tiny-target": [VLLM_CPU, "tiny-target"]}


@pytest.mark.parametrize("cmd", ["export", "tiny-target"])
@pytest.mark.parametrize("out", ["..", ".", "{cwd}", "{parent}", "{cwd}/../sub/."])
def test_out_naming_the_working_folder_or_its_parent_touches_nothing(tmp_path, drafter_file, cmd, out):
    work = tmp_path / "w"
    sub = work / "sub"
    sub.mkdir(parents=True)
    (work / "precious.txt").write_text("mine")
    (sub / "notes.txt").write_text("mine too")
    before = _snapshot(tmp_path)
    module, *args = _folder_writers(drafter_file)[cmd]
    r = run_cli_inprocess(module, *args, "--out", out.format(cwd=sub, parent=work), "--force", cwd=sub)
    _one_line(r, "--out")
    assert _snapshot(tmp_path) == before and not _locks(tmp_path)


def test_force_replaces_only_the_files_the_export_writes(tmp_path, drafter_file):
    out = tmp_path / "e"
    r = run_cli_inprocess(EXPORT, "--drafter", drafter_file, "--out", out, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    written = sorted(p.name for p in out.iterdir())
    assert written == ["config.json", "hybridspec.json", "model.safetensors"]
    (out / "notes.txt").write_text("mine")
    (out / "sub").mkdir()
    (out / "sub" / "data.bin").write_bytes(b"\x00\x01")
    (out / "config.json").write_text("{}")  # a stale output: replaced
    _one_line(run_cli_inprocess(EXPORT, "--drafter", drafter_file, "--out", out, cwd=tmp_path), "already holds files")
    r = run_cli_inprocess(EXPORT, "--drafter", drafter_file, "--out", out, "--force", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (out / "notes.txt").read_text() == "mine" and (out / "sub" / "data.bin").read_bytes() == b"\x00\x01"
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3DSparkModel"]
    assert not _locks(tmp_path) and sorted(p.name for p in tmp_path.iterdir()) == ["e"]


def test_atomic_dir_carries_over_what_the_block_did_not_write(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "a").write_text("old a")
    (out / "foreign").write_text("kept")
    with fsio.atomic_dir(out) as tmp:
        (tmp / "a").write_text("new a")
    assert (out / "a").read_text() == "new a" and (out / "foreign").read_text() == "kept"
    with fsio.atomic_dir(out, keep=lambda n: n != "foreign") as tmp:  # a narrower keep drops an old output
        (tmp / "a").write_text("newer")
    assert sorted(p.name for p in out.iterdir()) == ["a"] and not _locks(tmp_path)


# ------------------------------------------------------------------------------------------ data loss: two writers
_HOLD = ("import sys, time; from sim.infra.fsio import output_lock\n"
         "with output_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(float(sys.argv[2]))\n")


def _holder(path: Path, seconds: float = 30.0) -> subprocess.Popen:
    """Another process holding the output lock of `path` (the first of two writers), until killed."""
    p = subprocess.Popen([sys.executable, "-c", _HOLD, str(path), str(seconds)], cwd=ROOT, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "held"
    return p


@pytest.mark.parametrize("cmd", ["export", "tiny-target"])
def test_a_second_writer_of_one_folder_is_refused(tmp_path, drafter_file, cmd):
    out = tmp_path / "o"
    holder = _holder(out)
    try:
        module, *args = _folder_writers(drafter_file)[cmd]
        r = run_cli_inprocess(module, *args, "--out", out, "--force", cwd=tmp_path)
        _one_line(r, "another process")
        assert not out.exists()
    finally:
        holder.kill()
        holder.wait()


def test_two_concurrent_exports_never_both_succeed(tmp_path, drafter_file):
    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "real.export_drafter", "--drafter", str(drafter_file), "--out", str(out)]
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in "ab"]
    codes = [p.wait(120) for p in procs]
    errs = "".join(p.stderr.read() for p in procs)
    assert sorted(codes) == [0, 2], errs
    assert "another process" in errs or "already holds files" in errs
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "hybridspec.json", "model.safetensors"]
    assert not _locks(tmp_path)


def test_a_checked_output_stays_claimed_until_written(tmp_path):
    """check_out_file claims the output before any work: another process is refused until the write."""
    f = tmp_path / "r.json"
    cli.check_out_file(f)
    try:
        probe = ("import sys; from sim.infra.cli import check_out_file\n"
                 "try:\n    check_out_file(sys.argv[1])\nexcept Exception as e:\n    print(e)\n")
        r = subprocess.run([sys.executable, "-c", probe, str(f)], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert "another process" in r.stdout, r.stdout + r.stderr
        cli.write_whole(f, "{}\n")
    finally:
        fsio.release_claims()
    assert not _locks(tmp_path)
    r = subprocess.run([sys.executable, "-c", probe, str(f)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "already exists" in r.stdout, r.stdout + r.stderr


# ------------------------------------------------------------------------------------------ data loss: units
def _fail_fsync_at(monkeypatch, n: int) -> None:
    """The n-th fsync of a file being committed fails as a full disk does (the 2nd file of a unit for n=2)."""
    calls = []
    real = os.fsync

    def fsync(fd):
        calls.append(fd)
        if len(calls) == n:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(fsio.os, "fsync", fsync)


def test_fidelity_report_on_a_full_disk_leaves_both_old_or_both_new(tmp_path, monkeypatch):
    from test_validate_report import _record_run

    run = tmp_path / "run"
    _record_run(run, monkeypatch)
    out = tmp_path / "rep" / "fid.md"
    with monkeypatch.context() as m:
        _fail_fsync_at(m, 2)
        r = run_cli_inprocess("real.validation.report", run, "--out", out, cwd=tmp_path)
    _one_line(r, "no space left on device")
    assert not out.exists() and not out.with_suffix(".html").exists()  # never the .md without its .html
    r = run_cli_inprocess("real.validation.report", run, "--out", out, cwd=tmp_path)  # the rerun is not refused
    assert r.returncode == 0, r.stderr
    old = {p.name: p.read_bytes() for p in out.parent.iterdir()}
    assert sorted(old) == ["fid.html", "fid.md"]
    with monkeypatch.context() as m:
        _fail_fsync_at(m, 2)
        _one_line(run_cli_inprocess("real.validation.report", run, run, "--out", out, "--force", cwd=tmp_path),
                  "no space left on device")
    assert {p.name: p.read_bytes() for p in out.parent.iterdir()} == old  # the old set, whole, no temporaries
    assert not _locks(tmp_path)


def test_anchors_report_and_json_are_never_out_of_step(tmp_path, monkeypatch):
    out = tmp_path / "a" / "anchors.md"
    args = ("sim.api.anchors", "--only", "pr32374-eagle-itl", "--out", out)
    with monkeypatch.context() as m:
        _fail_fsync_at(m, 2)
        _one_line(run_cli_inprocess(*args, cwd=tmp_path), "no space left on device", progress=True)
    assert not out.exists() and not out.with_suffix(".json").exists()
    assert run_cli_inprocess(*args, cwd=tmp_path).returncode == 0
    old = {p.name: p.read_bytes() for p in out.parent.iterdir()}
    assert sorted(old) == ["anchors.json", "anchors.md"]
    with monkeypatch.context() as m:
        _fail_fsync_at(m, 2)
        _one_line(run_cli_inprocess(*args, "--force", cwd=tmp_path), "no space left on device", progress=True)
    assert {p.name: p.read_bytes() for p in out.parent.iterdir()} == old
    assert run_cli_inprocess(*args, "--force", cwd=tmp_path).returncode == 0
    assert "--force" in out.read_text() and len(json.loads(out.with_suffix(".json").read_text())) == 23


# ------------------------------------------------------------------------------------------ leftovers: locks
def test_no_lock_file_after_a_refused_or_a_finished_run(tmp_path, drafter_file):
    # refused after the output was claimed (a missing input): the lock, and the folders made for it, go
    r = run_cli_inprocess(EXPORT, "--drafter", tmp_path / "none.pt", "--out", tmp_path / "new" / "e", cwd=tmp_path)
    _one_line(r, "none.pt")
    assert not (tmp_path / "new").exists() and not _locks(tmp_path)
    # refused because another process writes it: the holder's lock file is the holder's, removed when it ends
    holder = _holder(tmp_path / "e", seconds=0.5)
    _one_line(run_cli_inprocess(EXPORT, "--drafter", drafter_file, "--out", tmp_path / "e", cwd=tmp_path),
              "another process")
    holder.wait(30)
    assert not _locks(tmp_path)
    assert run_cli_inprocess(EXPORT, "--drafter", drafter_file, "--out", tmp_path / "e", cwd=tmp_path).returncode == 0
    assert not _locks(tmp_path)


def test_the_lock_file_goes_with_the_lock_and_a_locker_of_a_removed_file_retries(tmp_path, monkeypatch):
    out = tmp_path / "o"
    lock = tmp_path / fsio.own_name("o", "lock")
    with fsio.output_lock(out):
        assert lock.read_text() == str(os.getpid())
    assert not lock.exists()
    # a locker that opened the file just before the holder removed it (on release) must not keep that lock:
    # it would hold a file no other locker can see. It sees the inode changed and locks the one at the path.
    real_open = os.open
    opened = []

    def open_then_holder_releases(path, flags, mode=0o777):
        fd = real_open(path, flags, mode)
        if not opened:
            os.unlink(path)  # the holder's release, between this locker's open and its flock
        opened.append(fd)
        return fd

    monkeypatch.setattr(fsio.os, "open", open_then_holder_releases)
    with fsio.output_lock(out):
        held = fsio._HELD[str(lock)]
        assert len(opened) == 2 and os.fstat(held.fd).st_ino == os.stat(lock).st_ino
    assert not lock.exists()


def test_a_second_command_in_this_process_is_refused_but_a_commands_own_checks_reenter(tmp_path):
    out = tmp_path / "o"
    with fsio.output_lock(out):
        cli.check_out_dir(out)  # the command's own check re-enters its lock
        with pytest.raises(ConfigError, match="another process"):
            with fsio.output_lock(out):  # a second command's guard does not
                pass
        with fsio.atomic_dir(out) as tmp:
            (tmp / "x").write_text("1")
    assert (out / "x").read_text() == "1" and not _locks(tmp_path)


# ------------------------------------------------------------------------------------------ leftovers: temporaries
@pytest.fixture
def private_tmp(tmp_path, monkeypatch) -> Path:
    """tempfile's folder for this test alone, so what a run leaves in it can be counted."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


def test_anchors_remove_their_temporary_traces_on_every_exit(private_tmp, monkeypatch):
    import sim.api.anchors as A

    st = A.blazedit_stats(str(TINY), max_tokens=4)  # a capped trace, written, simulated, removed
    assert 0.0 <= st["share"] <= 1.0 and list(private_tmp.iterdir()) == []

    def dies(*a, **k):
        raise KeyboardInterrupt  # Ctrl-C, or SIGTERM through termination_as_interrupt, mid-simulation

    monkeypatch.setattr(A, "_run", dies)
    with pytest.raises(KeyboardInterrupt):
        A.blazedit_stats(str(TINY), max_tokens=4)
    assert list(private_tmp.iterdir()) == []


def test_reprice_removes_its_temporary_folder_on_every_exit(tmp_path, private_tmp, monkeypatch):
    from test_cost_attention import _run_dir

    import real.validation.reprice as R

    d, _ = _run_dir(tmp_path)
    try:  # the real path on a recorded run in miniature, whether it is accepted or refused
        R.reprice(d)
    except ConfigError:
        pass
    assert list(private_tmp.iterdir()) == []
    scratches = []

    def body(*args):  # what the re-pricing puts in its scratch (the recorded table marked padded), then an end
        scratch = args[-1]
        (scratch / "recorded_padded.json").write_text("{}")
        scratches.append(scratch)
        if len(scratches) == 2:
            raise KeyboardInterrupt
        return {"cells": []}

    monkeypatch.setattr(R, "_reprice", body)
    assert R.reprice(d) == {"cells": []}
    with pytest.raises(KeyboardInterrupt):
        R.reprice(d)
    assert len(scratches) == 2 and list(private_tmp.iterdir()) == []


def test_temp_dir_is_removed_whatever_ends_the_block(private_tmp):
    for exc in (None, ValueError, KeyboardInterrupt):
        try:
            with fsio.temp_dir() as d:
                (d / "f").write_text("x")
                if exc:
                    raise exc()
        except (ValueError, KeyboardInterrupt):
            pass
        assert not d.exists()
    assert list(private_tmp.iterdir()) == []


# ------------------------------------------------------------------------------------------ tracked files
@pytest.fixture
def git_checkout(tmp_path) -> Path:
    """A git checkout in tmp whose out/anchors/anchors.md (what sim.anchors writes by default) is tracked."""
    repo = tmp_path / "repo"
    (repo / "out" / "anchors").mkdir(parents=True)
    (repo / "out" / "anchors" / "anchors.md").write_text("the committed report\n")
    (repo / "untracked.md").write_text("x\n")
    try:
        subprocess.run(["git", "init", "-q", str(repo)], check=True, capture_output=True, timeout=60)
        subprocess.run(["git", "-C", str(repo), "add", "out/anchors/anchors.md"], check=True, capture_output=True,
                       timeout=60)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git is not usable here")
    return repo


def test_is_tracked_asks_git_and_is_false_without_it(git_checkout, monkeypatch, tmp_path):
    assert fsio.is_tracked(git_checkout / "out" / "anchors" / "anchors.md")
    assert fsio.is_tracked(git_checkout / "out")  # a folder holding a tracked file
    assert not fsio.is_tracked(git_checkout / "untracked.md") and not fsio.is_tracked(git_checkout / "new.md")
    assert not fsio.is_tracked(tmp_path / "elsewhere" / "x.md")  # outside any checkout
    assert fsio.is_tracked(ROOT / "reports" / "anchors.md")

    def no_git(*a, **k):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "git")

    monkeypatch.setattr(fsio.subprocess, "run", no_git)
    assert not fsio.is_tracked(git_checkout / "out" / "anchors" / "anchors.md")


def test_a_default_output_never_replaces_a_tracked_file_but_a_named_one_does(git_checkout):
    tracked = git_checkout / "out" / "anchors" / "anchors.md"
    r = run_cli_inprocess("sim.api.anchors", "--only", "pr32374-eagle-itl", "--force", cwd=git_checkout)
    _one_line(r, "git tracks", progress=True)
    assert tracked.read_text() == "the committed report\n" and not _locks(git_checkout)
    r = run_cli_inprocess("sim.api.anchors", "--only", "pr32374-eagle-itl", "--out", "out/anchors/anchors.md",
                          "--force", cwd=git_checkout)
    assert r.returncode == 0, r.stderr
    assert "--out out/anchors/anchors.md --force" in tracked.read_text()  # the command that made it, as named


def test_the_given_options_are_noted_in_every_spelling():
    ap = cli.ArgumentParser(prog="t")
    ap.add_argument("-o", "--out")
    ap.add_argument("--force", action="store_true")
    sub = ap.add_subparsers(dest="cmd")
    sub.add_parser("go").add_argument("--out-dir")
    ap.parse_args(["--ou", "x"])  # an abbreviation
    assert cli.flag_given("-o") and cli.flag_given("--out") and not cli.flag_given("--force")
    ap.parse_args(["-ox", "go", "--out-dir=y"])
    assert cli.flag_given("--out") and cli.flag_given("--out-dir")
    ap.parse_args([])  # a new command line starts afresh
    assert not cli.flag_given("--out")


# ------------------------------------------------------------------------------------------ exported config
@pytest.mark.parametrize("field, value", [("rope_theta", "fast"), ("rope_theta", float("nan")),
                                          ("rope_theta", float("inf")), ("rms_eps", -1.0), ("rope_theta", True)])
def test_an_exported_config_never_holds_a_non_numeric_or_non_finite_value(tmp_path, field, value):
    from real.drafter.export_vllm import export_vllm

    d = _tiny_drafter()
    d.cfg = dataclasses.replace(d.cfg, **{field: value})
    with pytest.raises(ConfigError, match="nothing exported"):
        export_vllm(d, tmp_path / "e")
    assert not (tmp_path / "e").exists() and not _locks(tmp_path)  # checked before the output is claimed


def test_a_clean_export_passes_the_config_check(tmp_path):
    from real.drafter.export_vllm import check_vllm_config, export_vllm, vllm_config

    d = _tiny_drafter()
    cfg = json.loads((export_vllm(d, tmp_path / "e") / "config.json").read_text())
    assert cfg == check_vllm_config(vllm_config(d.cfg)) and cfg["rope_theta"] == d.cfg.rope_theta



# ------------------------------------------------------------------------------------------ review findings
def _run_tiny(out: Path, *extra: str, env: dict | None = None):
    return run_cli_inprocess("sim.api.run", "--trace", TINY, "--policy", "adaptive", "--batch-size", "1",
                             "--workers", "1", "--no-progress", "--out", out, *extra, cwd=out.parent, env=env)


def test_a_users_lock_or_dot_file_in_out_is_neither_ignored_nor_deleted(tmp_path):
    """Only the layer's own names (`.<name>.lock`, `.<folder>.commit`, `.<name>.swap`, leftovers) are its own."""
    out = tmp_path / "run"
    out.mkdir(mode=0o700)
    (out / "poetry.lock").write_text("mine")
    r = _run_tiny(out)
    assert r.returncode == 2 and "already holds files" in r.stderr  # a user's file counts: --force is asked for
    (out / ".notes").write_text("mine too")
    (out / "db.commit").write_text("and this")
    assert _run_tiny(out, "--force").returncode == 0
    assert {p.name for p in out.iterdir()} >= {"poetry.lock", ".notes", "db.commit", "summary.json"}
    assert (out.stat().st_mode & 0o777) == 0o700  # the replaced folder keeps its mode
    assert fsio.is_internal(fsio.own_name("run", "lock")) and fsio.is_internal(fsio.own_name("run", "tmp"))
    assert not fsio.is_internal("poetry.lock") and not fsio.is_internal(".notes")
    assert not fsio.is_internal(".run.lock") and not fsio.is_internal(f".run.{os.getpid()}.tmp")  # names alike: the user's


def test_workers_remove_their_private_folders_when_caching_is_off(tmp_path):
    """A forked pool worker leaves through os._exit (no atexit): its private folders must still go."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"HYBRIDSPEC_CACHE_DIR": "off", "TMPDIR": str(tmp)}
    r = subprocess.run([sys.executable, "-m", "sim.run", "--trace", str(TINY), "--policy", "adaptive", "--policy",
                        "hybrid", "--batch-size", "1", "--batch-size", "2", "--workers", "2", "--no-progress"],
                       cwd=tmp_path, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert list(tmp.iterdir()) == []


def test_a_bad_input_cap_setting_is_one_line(tmp_path):
    from sim.infra.inputs import RECORD

    for bad in ("inf", "nan", "-1", "lots"):
        os.environ["HYBRIDSPEC_MAX_INPUT_MB"] = bad
        try:
            with pytest.raises(ConfigError, match="expected a finite number of MiB > 0"):
                RECORD.limit()
        finally:
            del os.environ["HYBRIDSPEC_MAX_INPUT_MB"]


def test_depth_calibration_may_replace_a_tracked_report_it_is_told_to(tmp_path, monkeypatch):
    """`python -m real.depth_calibration --report F` names F: a tracked report regenerated by its own command is not a
    default output (it used argparse's parser, which does not note the options given, and refused)."""
    import sim.infra.cli as cli
    from real.validation.vllm_cpu.depth_calibration import main
    from sim.infra.errors import ConfigError

    monkeypatch.setattr(cli, "is_tracked", lambda p: True)  # as if the report were a tracked file, now removed
    with pytest.raises(ConfigError, match="--run .*not a directory"):  # past the --report check, to the next one
        main(["--run", str(tmp_path / "none"), "--report", str(tmp_path / "depths.md")])
