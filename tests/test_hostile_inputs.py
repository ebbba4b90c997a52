"""Hostile inputs found by hand that used to be accepted or crash (issue 12's first cases; the generated
suite is still to come): each is one line on stderr, exit 2, and leaves the input untouched."""
from pathlib import Path

import pytest
from conftest import run_cli_inprocess

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl")


def _run(module, *argv):
    return run_cli_inprocess(module, *argv, cwd=ROOT)


def _one_line(r, needle):
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


RUN = ["sim.api.run", "--trace", TINY, "--policy", "adaptive", "--batch-size", "2", "--no-progress"]


@pytest.mark.parametrize("extra, needle", [
    (["--temperature", "nan"], "--temperature must be a finite number"),
    (["--temperature", "inf"], "--temperature must be a finite number"),
    (["--seed", "-1", "--rate", "1"], "--seed must be >= 0"),
])
def test_run_refuses_bad_numbers(tmp_path, extra, needle):
    _one_line(_run(*RUN, "--out", str(tmp_path / "o"), *extra), needle)
    assert not (tmp_path / "o").exists()


def test_empty_drafts_sidecar_is_an_error(tmp_path):
    empty = tmp_path / "drafts.jsonl"
    empty.write_text("")
    _one_line(_run(*RUN, "--out", str(tmp_path / "o"), "--drafts", str(empty)), "no recorded drafts")


def test_convert_onto_its_input_is_refused(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "hi", "output_tokens": 5}\n')
    before = src.read_bytes()
    _one_line(_run("sim.core.trace", "convert", "--from", "vllm-custom", str(src), "-o", str(src)), "is the input file")
    assert src.read_bytes() == before


def test_cost_negative_context():
    _one_line(_run("sim.core.cost", "--context", "-1000000"), "--context: must be >= 0")


def test_run_out_folder_is_checked_first_and_written_whole(tmp_path):
    out = tmp_path / "o"
    r = _run(*RUN, "--out", str(out))
    assert r.returncode == 0, r.stderr
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(before) == {"summary.json", "requests.csv", "report.html", "verdict.md", "verdict.json"}
    _one_line(_run(*RUN, "--out", str(out)), "already holds files")  # refused before any work
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    r = _run(*RUN, "--out", str(out), "--force", "--seed", "3")
    assert r.returncode == 0, r.stderr
    assert set(p.name for p in out.iterdir()) == set(before)
    # no temporary folder left behind, nor the lock file .o.lock (removed with the lock, docs/cli.md)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    a_file = tmp_path / "f"
    a_file.write_text("x")
    _one_line(_run(*RUN, "--out", str(a_file)), "not a folder")
    _one_line(_run(*RUN, "--out", str(a_file / "sub")), "is a file")


def test_calibrator_with_a_float_setting_is_one_line(tmp_path):
    import json

    cal = json.loads((ROOT / "models" / "calibrators" / "ngram-general.json").read_text())
    cal["ngram"]["n_min"] = 2.0
    p = tmp_path / "cal.json"
    p.write_text(json.dumps(cal))
    _one_line(_run(*RUN, "--policy", "hybrid", "--calibrator", str(p)), "must be an integer")


def test_toml_true_is_not_a_batch_size(tmp_path):
    g = tmp_path / "g.toml"
    g.write_text(f'batch_size = [true]\npolicy = ["adaptive"]\ntrace = ["{TINY}"]\n')
    _one_line(_run("sim.api.sweep", "--grid", str(g), "--out", str(tmp_path / "sw"), "--no-progress"), "true/false")
