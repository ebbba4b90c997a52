"""What sim.api.run and sim.api.sweep print: the narrow table and verdicts, --format csv/json/vllm, progress lines for
logs, and the vLLM-named serving metrics (TTFT, TPOT, ITL, E2EL in ms; request and output throughput)."""
import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl")
VLLM_KEYS = ["request_throughput", "output_throughput", "total_token_throughput"] + [
    f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "std", "p99")]


def run_main(mod, argv, capsys):
    import importlib

    from sim.infra.cli import run_cli

    with pytest.raises(SystemExit) as ei:
        run_cli(importlib.import_module(mod).main, argv)
    cap = capsys.readouterr()
    assert ei.value.code == 0, cap.err
    return cap


ARGS = ["--trace", TINY, "--policy", "hybrid", "--policy", "oracle", "--batch-size", "2", "--batch-size", "8",
        "--workers", "1", "--no-progress"]


def test_table_is_narrow_with_verdicts(capsys):
    out = run_main("sim.api.run", ARGS, capsys).out
    lines = out.splitlines()
    assert max(len(x) for x in lines if not x.startswith(("trace ", "tok/step", "(--format", "batch ", "  "))) <= 80
    head = next(x for x in lines if x.startswith("policy"))
    assert head.split() == ["policy", "batch", "out", "tok/s", "x", "adaptive", "tok/step", "TTFT", "ms", "TPOT", "ms"]
    verdicts = [x for x in lines if x.startswith("batch ")]
    assert len(verdicts) == 2 and all("recommended " in v and "x adaptive" in v for v in verdicts)
    assert sum("per-step oracle" in x for x in lines) == 2  # the bound, named under each batch size


def test_formats(capsys, tmp_path):
    rows = json.loads(run_main("sim.api.run", ARGS + ["--format", "json"], capsys).out)
    assert {(r["policy"], r["batch_size"]) for r in rows} == {(p, b) for p in ("adaptive", "hybrid", "oracle") for b in (2, 8)}
    assert all(set(VLLM_KEYS) <= set(r) for r in rows)
    got = list(csv.DictReader(io.StringIO(run_main("sim.api.run", ARGS + ["--format", "csv"], capsys).out)))
    assert [(r["policy"], int(r["batch_size"])) for r in got] == [(r["policy"], r["batch_size"]) for r in rows]
    assert float(got[0]["output_throughput"]) == pytest.approx(rows[0]["output_throughput"])
    cap = run_main("sim.api.run", ARGS + ["--format", "vllm", "--out", str(tmp_path / "o")], capsys)
    for label in ("Request throughput (req/s):", "Output token throughput (tok/s):", "Mean TTFT (ms):",
                  "Median TPOT (ms):", "P99 ITL (ms):", "Mean E2EL (ms):"):
        assert cap.out.count(label) == 6
    assert "wrote" in cap.err  # stdout holds only the requested format


def test_progress_lines_when_stderr_is_not_a_terminal(capsys):
    import sys

    assert not sys.stderr.isatty()  # captured: as in a log or a pipe
    cap = run_main("sim.api.run", ["--trace", TINY, "--policy", "none", "--batch-size", "1", "--workers", "1",
                               "--progress-every", "0.01"], capsys)
    assert "progress: 2/2 runs done" in cap.err  # the closing line; periodic ones before it
    assert "progress:" not in cap.out


def test_vllm_metrics_definitions():
    from sim.core.metrics import itl_samples_s
    from sim.api.run import SimSetup, prepare, run_one

    prep = prepare(SimSetup(trace=TINY))
    for pol, bs in (("none", 4), ("hybrid", 2), ("adaptive", 128)):
        row, res = run_one(prep, pol, bs)
        from sim.core.result import REQUEST_COLUMNS, STEP_COLUMNS

        assert set(REQUEST_COLUMNS) <= set(res.requests) and set(STEP_COLUMNS) <= set(res.steps)  # the schema
        rq = res.requests
        itl = itl_samples_s(res)
        assert len(itl) == rq["decode_steps"].sum()  # one delivery per decode step
        assert itl.sum() == pytest.approx(np.nansum(rq["finish_s"] - rq["first_token_s"]))
        e2el = (rq["finish_s"] - rq["arrival_s"]) * 1000
        assert row["mean_e2el_ms"] == pytest.approx(e2el.mean())
        assert row["p99_ttft_ms"] == pytest.approx(np.percentile(rq["ttft_s"] * 1000, 99))
        assert row["median_tpot_ms"] == pytest.approx(np.nanmedian(rq["tpot_s"]) * 1000)
        assert row["request_throughput"] == pytest.approx(len(rq["output_len"]) / res.sim_time_s)
        assert row["output_throughput"] == pytest.approx(row["output_throughput_tok_s"])
        if pol == "none":  # one token per step: ITL equals TPOT
            assert row["mean_itl_ms"] == pytest.approx(row["mean_tpot_ms"], rel=0.05)


def test_sweep_prints_its_results(tmp_path, capsys):
    cap = run_main("sim.api.sweep", ["--trace", TINY, "--policy", "hybrid", "--batch-size", "2", "--batch-size", "4",
                                 "--seed", "0", "--seed", "1", "--workers", "1", "--progress-every", "0.01",
                                 "--out", str(tmp_path / "s")], capsys)
    out = cap.out
    assert "progress: 8/8 cells done" in cap.err  # stderr is not a terminal: progress lines, no bar
    head = next(x for x in out.splitlines() if "policy" in x and "tok/s" in x)
    assert head.split()[0] == "seed"  # the varying setup key leads
    assert sum(1 for x in out.splitlines() if x.startswith("seed=") and ", batch " in x) == 4
