"""python -m sim.run end to end on a tiny trace: the table, --out files, determinism, and bad input."""
import json
from pathlib import Path

import pytest
from conftest import run_cli_inprocess

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl")


def run(*args, cwd=ROOT):
    return run_cli_inprocess("sim.api.run", *args, cwd=cwd)


def test_table_and_outputs(tmp_path):
    r = run("--trace", TINY, "--batch-size", "2", "--batch-size", "8", "--out", str(tmp_path / "o"), "--no-progress")
    assert r.returncode == 0, r.stderr
    for p in ("none", "adaptive", "hybrid-price", "oracle", "ngram-first", "ngram-threshold"):
        assert p in r.stdout
    rows = json.loads((tmp_path / "o" / "summary.json").read_text())
    need = {"policy", "batch_size", "trace", "model", "gpu", "requests", "output_tokens", "sim_time_s",
            "output_throughput_tok_s", "mean_tokens_per_step", "speedup_vs_baseline", "lossless"}
    assert all(need <= set(row) for row in rows)
    assert all(row["lossless"] for row in rows)
    assert {row["batch_size"] for row in rows} == {2, 8}
    base = [row for row in rows if row["policy"] == "adaptive"]
    assert all(abs(row["speedup_vs_baseline"] - 1.0) < 1e-12 for row in base)
    for name in ("requests.csv", "report.html"):  # steps only with --steps (tests/test_new_user_47.py)
        assert (tmp_path / "o" / name).stat().st_size > 0
    assert "plotly" in (tmp_path / "o" / "report.html").read_text()[:200000].lower()


def test_same_seed_same_numbers(tmp_path):
    outs = []
    for d in ("a", "b"):
        r = run("--trace", TINY, "--policy", "hybrid-price", "--batch-size", "4", "--seed", "7", "--out", str(tmp_path / d), "--no-progress")
        assert r.returncode == 0, r.stderr
        rows = json.loads((tmp_path / d / "summary.json").read_text())
        outs.append([(x["policy"], x["output_throughput_tok_s"], x["sim_time_s"]) for x in rows])
    assert outs[0] == outs[1]


@pytest.mark.parametrize("args,needle", [
    (["--policy", "bogus"], "unknown policy 'bogus'"),
    (["--model", "gpt-9"], "gpt-9"),
    (["--gpu", "tpu"], "tpu"),
    (["--cost", "magic"], "magic"),
    (["--batch-size", "0"], "batch-size"),
    (["--drafter", "nope"], "unknown drafter profile"),
])
def test_bad_names_one_line(args, needle):
    r = run("--trace", TINY, *args, "--no-progress")
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_bad_trace_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "x", "output": "y"}\n{not json}\n')
    r = run("--trace", str(bad), "--no-progress")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "bad.jsonl:2" in r.stderr
    r = run("--trace", str(tmp_path / "missing.jsonl"), "--no-progress")
    assert r.returncode != 0 and "Traceback" not in r.stderr and "missing.jsonl" in r.stderr


def test_length_only_trace_runs_and_says_so(tmp_path):
    t = tmp_path / "lens.jsonl"
    t.write_text("".join(f'{{"id": "L{i}", "prompt_len": {50 + 10 * i}, "output_len": {40 + 7 * i}, '
                         f'"workload": "{"codeedit" if i % 2 else "chat"}"}}\n' for i in range(8)))
    r = run("--trace", str(t), "--policy", "hybrid-price", "--batch-size", "4", "--out", str(tmp_path / "o"), "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "length-only" in r.stderr and "statistical profile" in r.stderr
    rows = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert all(row["lossless"] and row["length_only"] for row in rows)
    assert rows[0]["output_tokens"] == sum(40 + 7 * i for i in range(8))


@pytest.mark.parametrize("content", ['{"x": 1', '{"features": "hinge8+history2", "knots": [0.0, 1.0, 1.7, 2.3, 2.9, 3.5, 4.2, 5.0], "weights": [1]}',
                                     '[1, 2]'])
def test_bad_calibrator_file_one_line(tmp_path, content):
    bad = tmp_path / "cal.json"
    bad.write_text(content)
    r = run("--trace", TINY, "--calibrator", str(bad), "--no-progress")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "cal.json" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_lossy_run_exits_with_one_line(monkeypatch, capsys):
    """A run whose lossless check fails: no table, exit code 1 (a simulator bug, not an input error: 2), one
    'error:' line naming the run and the reason."""
    from sim.infra.cli import run_cli
    from sim.engine.engine import Engine
    from sim.api.run import main

    monkeypatch.setattr(Engine, "check_lossless", lambda self: "request 0 output position 3: planted")
    with pytest.raises(SystemExit) as ei:
        run_cli(main, ["--trace", TINY, "--policy", "adaptive", "--batch-size", "2", "--workers", "1", "--no-progress"])
    assert ei.value.code == 1
    cap = capsys.readouterr()
    assert "policy" not in cap.out
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and "policy adaptive at batch size 2: not lossless: request 0 output position 3: planted" in err[0]


def test_sample_flag(tmp_path):
    r = run("--trace", TINY, "--policy", "adaptive", "--batch-size", "2", "--sample", "5", "--seed", "1",
            "--out", str(tmp_path / "o"), "--no-progress", "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert "5 requests" in r.stdout
    from sim.core.trace import load_trace

    want = [r_.id for r_ in load_trace(TINY, sample=5, seed=1).requests]
    import pandas as pd

    assert len(pd.read_csv(tmp_path / "o" / "requests.csv")) == len(want) == 5
    help_ = run("--help").stdout
    assert "--sample" in help_ and "first N requests" in help_


@pytest.mark.parametrize("args,needle", [(["--sample", "99"], "exceeds the trace's 12 requests"),
                                         (["--sample", "0"], "--sample must be >= 1"),
                                         (["--sample", "3", "--limit", "3"], "not both")])
def test_bad_sample_one_line(args, needle):
    r = run("--trace", TINY, "--policy", "adaptive", *args, "--no-progress")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
