"""No command removes a file or folder it did not create, under any flag (issue 60): user entries of every shape are
planted in and beside the outputs of every writer (sim.run --out, sim.sweep --out, sim.report -o) and in folders
`sim.cache --prune` is pointed at, the commands run (twice, the second time with --force), and every planted entry
must still be there with its bytes. The shapes: dot-files and folders named like the output layer's temporaries,
locks and journals (a journal whose JSON names a planted "temporary" too), folders named like outputs, links, a
misnamed cache root and a linked one."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import run_cli_inprocess
from hostile_cases import _fake_sweep

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl"
RUN = ["--trace", TINY, "--policy", "adaptive", "--batch-size", "2", "--limit", "4", "--no-progress", "--workers", "1"]


def _plant(folder: Path, out_name: str, inside: bool) -> list[Path]:
    """User entries shaped like the layer's own, for an output named `out_name` (inside it, or beside it)."""
    folder.mkdir(parents=True, exist_ok=True)
    dead = 2**22 + 4321  # no live process has this pid: a leftover of it would be "removable"
    files = {
        f".{out_name}.{dead}.tmp": b"a draft", f".{out_name}.{dead}.old": b"old notes", f".{out_name}.lock": b"mine",
        f".{out_name}.swap": json.dumps({"path": out_name, "new": f".{out_name}.{dead}.tmp",
                                         "old": f".{out_name}.{dead}.old"}).encode(),
        f".unit.{dead}.commit": json.dumps({"files": {"notes.txt": f".notes.txt.{dead}.part"}}).encode(),
        f".notes.txt.{dead}.part": b"would replace notes.txt if taken for a journal's temporary",
        "notes.txt": b"my notes", ".report.2023.old": b"2023", ".session.lock": b"session", ".draft.7.tmp": b"draft",
        f".x.{dead}.jtmp": b"j", "poetry.lock": b"lock", ".hybridspec-cache": b"not a cache mark of ours",
    }
    made = []
    for name, data in files.items():
        (folder / name).write_bytes(data)
        made.append(folder / name)
    for name in (f".{out_name}.{dead + 1}.tmp", f".{out_name}.{dead + 1}.old", "sub"):  # folders named like temporaries
        (folder / name).mkdir()
        (folder / name / "inside.txt").write_bytes(b"mine")
        made.append(folder / name / "inside.txt")
    (folder / "link").symlink_to(folder / "notes.txt")
    made.append(folder / "link")
    if inside:
        (folder / "steps.csv").mkdir()  # named like an output the command does not write this time
        (folder / "steps.csv" / "mine.csv").write_bytes(b"a,b\n")
        made.append(folder / "steps.csv" / "mine.csv")
    return made


def _digests(paths: list[Path]) -> dict[Path, str | None]:
    out = {}
    for p in paths:
        if p.is_symlink():
            out[p] = "link:" + os.readlink(p)
        elif p.is_file():
            out[p] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[p] = None
    return out


def _check(before: dict) -> None:
    after = _digests(list(before))
    gone = [str(p) for p, d in before.items() if after[p] != d]
    assert not gone, f"user entries removed or changed: {gone}"


@pytest.fixture
def env(tmp_path):
    return {"HYBRIDSPEC_CACHE_DIR": str(tmp_path / "cache")}


def test_sim_run_keeps_every_user_entry_in_and_beside_out(tmp_path, env):
    out = tmp_path / "work" / "o"
    planted = _plant(out, "o", inside=True) + _plant(out.parent, "o", inside=False)
    before = _digests(planted)
    r = run_cli_inprocess("sim.api.run", *RUN, "--out", out, cwd=tmp_path, env=env)
    assert r.returncode == 2 and "already holds files" in r.stderr  # the user's files count: --force is asked for
    for _ in range(2):
        r = run_cli_inprocess("sim.api.run", *RUN, "--out", out, "--force", cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
        assert (out / "summary.json").is_file()
        _check(before)


def test_sim_sweep_keeps_every_user_entry(tmp_path, env):
    out = tmp_path / "work" / "s"
    planted = _plant(out, "s", inside=True) + _plant(out / "cells", "x.json", inside=False) \
        + _plant(out.parent, "s", inside=False)
    before = _digests(planted)
    for extra in ([], ["--seed", "1"]):
        r = run_cli_inprocess("sim.api.sweep", *RUN, "--out", out, "--force", *extra, cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
        assert (out / "results.csv").is_file()
        _check(before)


def test_sim_report_keeps_every_user_entry(tmp_path, env):
    sw = _fake_sweep(tmp_path)
    out = tmp_path / "rep"
    planted = _plant(out, "index.html", inside=True)
    before = _digests(planted)
    for _ in range(2):
        r = run_cli_inprocess("sim.api.report", sw, "-o", out, "--force", "--plotly", "shared", cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
        assert (out / "index.html").is_file()
        _check(before)


@pytest.mark.parametrize("shape", ["misnamed_root", "linked_root", "marked_with_user_files", "unmarked_kinds_and_docs"])
def test_prune_removes_nothing_of_the_users(tmp_path, shape):
    docs = tmp_path / "docs"
    planted = _plant(docs, "cache", inside=True)
    (docs / "tokens").mkdir()  # a folder of the user's named like a cache kind
    (docs / "tokens" / "mine.npz").write_bytes(b"mine")
    planted.append(docs / "tokens" / "mine.npz")
    root = docs
    if shape == "linked_root":
        root = tmp_path / "cache-link"
        root.symlink_to(docs)
    elif shape == "marked_with_user_files":
        from sim.infra.fsio import CACHE_MARK, CACHE_MARK_TEXT

        (docs / CACHE_MARK).write_text(CACHE_MARK_TEXT)
        planted.remove(docs / ".hybridspec-cache")
    elif shape == "unmarked_kinds_and_docs":
        for n in list(docs.iterdir()):  # one known kind and one file of the user's: not adopted
            if n.name not in ("tokens", "notes.txt"):
                planted = [p for p in planted if n not in (p, *p.parents)]
                shutil.rmtree(n) if n.is_dir() and not n.is_symlink() else n.unlink()
    before = _digests(planted)
    for extra in ([], ["--kind", "tokens"], ["--older-than", "0"]):
        r = run_cli_inprocess("sim.api.cache", "--prune", *extra, cwd=tmp_path, env={"HYBRIDSPEC_CACHE_DIR": str(root)})
        assert r.returncode == 2 and "refusing to prune" in r.stderr and r.stderr.count("\n") == 1, r.stderr
        _check(before)


def test_prune_of_the_projects_own_cache_still_works(tmp_path):
    """The other side: a cache folder the project made (marked when created) is pruned, kinds and all."""
    from sim.infra.fsio import CACHE_MARK, cache_root

    os.environ["HYBRIDSPEC_CACHE_DIR"] = str(tmp_path / "c")
    try:
        root = cache_root()
    finally:
        del os.environ["HYBRIDSPEC_CACHE_DIR"]
    assert (root / CACHE_MARK).is_file()
    (root / "tokens").mkdir()
    (root / "tokens" / "a.npz").write_bytes(b"x" * 10)
    r = run_cli_inprocess("sim.api.cache", "--prune", cwd=tmp_path, env={"HYBRIDSPEC_CACHE_DIR": str(root)})
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in root.iterdir()) == [CACHE_MARK]


def test_an_existing_folder_is_never_marked_as_a_cache(tmp_path):
    from sim.infra.fsio import CACHE_MARK, cache_root

    (tmp_path / "docs").mkdir()
    os.environ["HYBRIDSPEC_CACHE_DIR"] = str(tmp_path / "docs")
    try:
        assert cache_root() == tmp_path / "docs"
    finally:
        del os.environ["HYBRIDSPEC_CACHE_DIR"]
    assert not (tmp_path / "docs" / CACHE_MARK).exists()
