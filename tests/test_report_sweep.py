"""python -m sim.report on a sweep: index.html (plotly inlined once), tables.md and paper.md."""
import shutil
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl"


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    import sim.api.sweep as sw

    d = tmp_path_factory.mktemp("sweep")
    traces = []
    for name in ("codeedit", "chat"):  # the paper table looks the workloads up by trace name
        shutil.copy(TINY, d / f"{name}.jsonl")
        traces.append(str(d / f"{name}.jsonl"))
    cells = sw.expand({"trace": traces, "policy": ["adaptive", "hybrid-price", "ngram-first", "oracle"],
                       "batch_size": [1, 4, 128], "temperature": 0.0})
    df = sw.run_sweep(cells, d / "out", workers=2, progress=False)
    assert (df["status"] == "ok").all()
    return d / "out"


def run_main(argv, capsys):
    from sim.infra.cli import run_cli
    from sim.api.report import main

    with pytest.raises(SystemExit) as exc:
        run_cli(main, argv)
    return exc.value.code, capsys.readouterr()


def test_report_files(sweep_dir, tmp_path, capsys):
    code, cap = run_main([str(sweep_dir), "-o", str(tmp_path / "rep")], capsys)
    assert code == 0, cap.err
    html = (tmp_path / "rep" / "index.html").read_text()
    assert html.count("plotly.js v") <= 2 and "Plotly.newPlot" in html  # plotly.js inlined once, not per figure
    assert "cdn.plot.ly" not in html.split("Plotly.newPlot")[0][-2000:]
    for fid in ("fig-thr-codeedit", "fig-thr-chat", "fig-ctx-codeedit", "fig-share-chat", "fig-steps-codeedit"):
        assert f'id="{fid}"' in html
    tables = (tmp_path / "rep" / "tables.md").read_text()
    for needle in ("## codeedit", "## chat", "Output throughput (tokens/s)", "Throughput / oracle",
                   "n-gram share of verified / accepted", "Step-time breakdown", "per-request decode speed by prompt length"):
        assert needle in tables
    paper = (tmp_path / "rep" / "paper.md").read_text()
    assert "## Code editing" in paper and "## Chat" in paper
    assert "1.10-1.62" in paper and "1.04-1.27" in paper and "0.97-1.01" in paper
    assert "Gap to the oracle" in paper and "python -m sim.sweep --preset paper" in paper
    # the published ranges sit on the right rows
    serve4, row4 = [line for line in paper.splitlines() if line.startswith("| 4 |")][:2]  # what to serve, the headline
    assert "1.10-1.62" in row4
    assert "What to serve" in paper and serve4.split(" | ")[3] in ("vLLM", "plugin")  # the recommendation's tier


def test_report_deterministic_and_csv_only(sweep_dir, tmp_path, capsys):
    outs = []
    for d in ("a", "b"):
        code, cap = run_main([str(sweep_dir), "-o", str(tmp_path / d)], capsys)
        assert code == 0, cap.err
        outs.append([(tmp_path / d / f).read_bytes() for f in ("index.html", "tables.md", "paper.md")])
    assert outs[0] == outs[1]  # committed reports regenerate byte-identically
    code, cap = run_main([str(sweep_dir / "results.csv"), "-o", str(tmp_path / "c")], capsys)
    assert code == 0, cap.err
    assert (tmp_path / "c" / "paper.md").read_text() == (tmp_path / "a" / "paper.md").read_text()


def test_context_bins(sweep_dir):
    from sim.api.report import context_bins, load_sweep

    df, req = load_sweep(sweep_dir)
    g = df[df["trace"].str.endswith("codeedit.jsonl")]
    ratio, labels = context_bins(g, req, "hybrid-price")
    assert list(ratio.columns) == [1, 4, 128] and len(labels) == len(ratio) >= 2
    assert sum(int(lab.split("n=")[1].rstrip(")")) for lab in labels) == 12
    assert ((ratio > 0.2) & (ratio < 5)).all().all()
    # adaptive over itself is exactly 1
    same, _ = context_bins(g, req, "adaptive")
    assert (same == 1.0).all().all()


def test_failed_cells_reported(sweep_dir, tmp_path):
    from sim.api.report import load_sweep, write_sweep_report

    df, req = load_sweep(sweep_dir)
    df = df.copy()
    bad = df.index[(df["policy"] == "oracle") & (df["batch_size"] == 128)]
    df.loc[bad, "status"] = "error"
    df.loc[bad, "error"] = "ConfigError: boom"
    write_sweep_report(df, req, tmp_path)
    assert "ConfigError: boom" in (tmp_path / "tables.md").read_text()
    assert "cells failed" in (tmp_path / "paper.md").read_text()


def test_bad_input_one_line(tmp_path, capsys):
    code, cap = run_main([str(tmp_path), "-o", str(tmp_path / "r")], capsys)
    assert code == 2 and "no results.parquet" in cap.err and len(cap.err.strip().splitlines()) == 1
    pd.DataFrame({"x": [1]}).to_csv(tmp_path / "results.csv", index=False)
    code, cap = run_main([str(tmp_path / "results.csv")], capsys)
    assert code == 2 and "not a sweep results table" in cap.err
