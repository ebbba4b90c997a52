"""`sim.run --out DIR` keeps what it advises (issue 62, point 4): verdict.md and verdict.json beside the tables, the
same recommendation and `vllm serve` line the terminal shows, written whole through the output layer; and the
first command that makes the cache folder says where it is and how to see and prune it, once."""
from __future__ import annotations

import json
from pathlib import Path

from conftest import run_cli_inprocess

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl"


def _run(tmp_path: Path, *args, cache: str = "cache"):
    return run_cli_inprocess("sim.api.run", "--trace", TINY, "--workers", "1", "--no-progress",
                             "--policy", "vllm-ngram:8", "--policy", "hybrid-vllm:slots=32", "--policy", "hybrid", *args,
                             cwd=ROOT, env={"HYBRIDSPEC_CACHE_DIR": str(tmp_path / cache)})


def test_out_keeps_the_verdict_the_terminal_printed(tmp_path):
    p = _run(tmp_path, "--batch-size", "2", "--batch-size", "4", "--out", tmp_path / "o")
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "o" / "verdict.json").read_text())
    assert [v["batch_size"] for v in doc["verdicts"]] == [2, 4]
    for v in doc["verdicts"]:
        rec, nxt = v["recommended"], v["runner_up"]
        assert rec["policy"] != "hybrid"  # simulated only: never the recommendation
        assert f"batch {v['batch_size']}: recommended {rec['policy']}," in p.stdout
        assert " vllm serve " in f" {rec['serve']}" and rec["serve"] in p.stdout
        assert f"--max-num-seqs {v['batch_size']}" in rec["serve"]
        assert nxt is None or (nxt["policy"] != rec["policy"] and f"runner-up {nxt['policy']} " in p.stdout)
        assert v["text"][0] in p.stdout
    md = (tmp_path / "o" / "verdict.md").read_text()
    assert doc["header"] in md and "## Batch size 2" in md and "## Batch size 4" in md
    for v in doc["verdicts"]:
        assert "    " + v["recommended"]["serve"] + "\n" in md  # a code block: copied as is
    assert "verdict.md, verdict.json" in p.stdout  # the `wrote` line names them


def test_a_rerun_replaces_the_verdict_only_with_force(tmp_path):
    assert _run(tmp_path, "--batch-size", "2", "--out", tmp_path / "o").returncode == 0
    first = json.loads((tmp_path / "o" / "verdict.json").read_text())
    p = _run(tmp_path, "--batch-size", "4", "--out", tmp_path / "o")
    assert p.returncode == 2 and json.loads((tmp_path / "o" / "verdict.json").read_text()) == first
    assert _run(tmp_path, "--batch-size", "4", "--out", tmp_path / "o", "--force").returncode == 0
    assert [v["batch_size"] for v in json.loads((tmp_path / "o" / "verdict.json").read_text())["verdicts"]] == [4]


def test_the_first_command_to_make_the_cache_says_where_once(tmp_path):
    p = _run(tmp_path, "--batch-size", "2", cache="fresh")
    assert p.returncode == 0, p.stderr
    notes = [ln for ln in p.stderr.splitlines() if "cache folder" in ln]
    assert len(notes) == 1 and str(tmp_path / "fresh") in notes[0] and "python -m sim.cache" in notes[0]
    assert " MB now" in notes[0]
    again = _run(tmp_path, "--batch-size", "2", cache="fresh")
    assert again.returncode == 0 and "cache folder" not in again.stderr
    off = run_cli_inprocess("sim.api.run", "--trace", TINY, "--batch-size", "2", "--workers", "1", "--no-progress",
                            "--policy", "none", cwd=ROOT, env={"HYBRIDSPEC_CACHE_DIR": "off"})
    assert off.returncode == 0 and "cache folder" not in off.stderr


def test_a_refusal_after_the_cache_was_made_stays_one_line(tmp_path):
    p = _run(tmp_path, "--batch-size", "2", "--kv-capacity-tokens", "10", cache="new")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "cache folder" not in p.stderr, p.stderr
    assert (tmp_path / "new").is_dir()  # made for the draft tables before the refusal, which stays its one line
