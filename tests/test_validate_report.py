"""Recorded validation runs, offline: re-anchoring an older recording (real/validation/anchor.py) gives the live
run's verdicts, and the report command (real/validation/report.py) writes markdown and an offline page from runs,
checks the targets on them and never overwrites by default. Also validate's --grid estimate."""
from __future__ import annotations

import json
import types

import pytest

from real.validation.options import ValidateOptions
from sim.infra.errors import ConfigError


def _fake_run(tps: float, probe: float) -> dict:
    load = {"loaded": False, "others_cores": 0.01, "steal_cores": 0.0, "engine_threads": 2, "cores": 2,
            "loadavg_before": [2.0, 2.0, 2.0], "freq_mhz_before": 2600.0}
    return {"time_s": 1.0, "tok_per_s": tps, "steps": 3, "tokens_per_engine_step": 2.0, "mean_latency_s": 0.5,
            "lossless": True, "violation": None, "step_ms": [10.0, 10.0, 10.0], "outputs_equal_reference": True,
            "wall_s": 1.0, "load": load, "cpu_tok_per_s": tps, "steps_csv": "a\n1\n",
            "speed_probe": {"1x1": probe, "1x8": 2 * probe}}


def _record_run(run, monkeypatch):
    """A two-cell run recorded by validate's own loop (measure_trace, write_reports) with fake engines: the
    machine's speed moves from repeat to repeat and the throughputs follow it."""
    import real.validation.validate as V

    run.mkdir()
    (run / "cost_table.json").write_text("{}")
    (run / "cost_table.json.load.json").write_text(json.dumps({"loaded": False, "speed_probe": {"1x1": 30.0,
                                                                                               "1x8": 60.0}}))
    speed = iter([1.0, 1.1, 1.2, 1.15, 1.05, 1.0])  # the machine's slowdown at each repeat, in run order
    n = {"k": 0}

    def fake_measure(wl, t_dir, table, pol, bs, guard, drafters):
        q = next(speed)
        n["k"] += 1
        return _fake_run((100.0 if pol == "none" else 150.0) / q, 30.0 * q)

    def fake_predict(wl, t_dir, table, pol, bs, seed, drafters):
        pred = dict(_fake_run(101.0 if pol == "none" else 160.0, 30.0))
        return {"predicted": pred, "synthetic": pred, "steps_predicted_csv": "a\n1\n", "sim_command": "python -m sim.run"}

    monkeypatch.setattr(V, "measure_real", fake_measure)
    monkeypatch.setattr(V, "predict_cell", fake_predict)
    monkeypatch.setattr(V, "speed_probe_of", lambda wl, bss, repeat=9: {"1x1": 30.0, "1x8": 60.0})
    wl = types.SimpleNamespace(trace="traces/chat.jsonl", requests=[types.SimpleNamespace(output_len=10)])
    a = ValidateOptions(load_guard=0.25, seed=0, margin=3.0, drafters="dspark,ngram")
    cells, probes, _ = V.measure_trace(wl, run / "chat", run / "cost_table.json", ["none", "adaptive"], [1], {"k": 1},
                                       3, a)
    meta = {"command": "python real/validate.py --out x", "machine": {}, "model": "m", "mode": "real", "max_tokens": 8,
            "max_prompt": 9, "repeats": 3, "margin": 0.03, "speed_probes": {wl.trace: probes}, "wall_minutes": 1.5}
    V.write_reports(run, cells, meta)
    return cells


def test_offline_reanchoring_of_an_older_recording_gives_the_live_verdicts(tmp_path, monkeypatch, capsys):
    from real.validation.anchor import main as anchor_main, reanchor

    run = tmp_path / "run"
    cells = _record_run(run, monkeypatch)
    assert all(c["verdict"]["anchored"] for c in cells)
    # run order (ABBA): none, adaptive, adaptive, none, none, adaptive at slowdowns 1.0 1.1 1.2 1.15 1.05 1.0; the
    # second 'none' repeat had the probe after the second 'adaptive' one (1.2) before it and its own (1.15) after
    assert cells[0]["anchor"]["speeds"][1] == pytest.approx((1.2 * 1.15) ** 0.5)
    assert cells[0]["repeats"][0]["speed_probe_before"] == {"1x1": 30.0, "1x8": 60.0}  # the trace's probe
    for f in (run / "chat" / "cells").rglob("real.r*.json"):  # an older recording: no probe before each repeat
        d = json.loads(f.read_text())
        d.pop("speed_probe_before")
        f.write_text(json.dumps(d))
    res = reanchor(run)
    assert [r["verdict"] for r in res["cells"]] == [c["verdict"]["verdict"] for c in cells]
    assert [r["error"] for r in res["cells"]] == pytest.approx([c["verdict"]["error"] for c in cells])
    assert res["reanchored"]["anchored"] == 2
    assert anchor_main([str(run)]) == 0 and "re-anchored" in capsys.readouterr().out
    with pytest.raises(ConfigError):
        reanchor(tmp_path)  # no fidelity.json


def test_report_from_two_runs_checks_targets_and_never_overwrites(tmp_path, monkeypatch, capsys):
    from real.validation.report import main as report_main

    run = tmp_path / "run"
    _record_run(run, monkeypatch)
    out = tmp_path / "rep" / "fidelity-x.md"
    assert report_main([str(run), str(run), "--out", str(out)]) == 0
    md, page = out.read_text(), out.with_suffix(".html").read_text()
    assert "## Verdicts side by side" in md and "| chat none bs1 |" in md and "| 2 of 2 cells |" in md
    v = json.loads((run / "fidelity.json").read_text())["aggregate"]["verdicts"]
    assert f"at most 25% of the cells inconclusive | {'yes' if v['inconclusive'] == 0 else 'NO'} | " \
           f"{v['inconclusive']} of 2" in md
    assert "median \\|error\\| <= 3% |" in md and "## Run 2" in md and "### " not in md.split("## Run 1")[0]
    assert "others 0.01-0.01 cores" in md and "1.5 min" in md
    from test_html_pages import check_page

    check_page(page, "fidelity report")  # plotly.js inlined once, nothing fetched, each figure headed
    assert "wrote" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="exists"):
        report_main([str(run), "--out", str(out)])
    assert report_main([str(run), "--out", str(out), "--force"]) == 0
    with pytest.raises(ConfigError, match=".md"):
        report_main([str(run), "--out", str(tmp_path / "r.txt")])


def test_report_page_shared_records_the_flag_and_a_shared_validate_page(tmp_path, monkeypatch):
    """--plotly shared (the committed reports/): the page loads the plotly.js written once beside it, two reports
    in one folder share it, and the markdown records the command with the flag. validate's own fidelity.html
    (write_reports) takes the same choice."""
    import re

    from real.validation.report import main as report_main
    from real.validation.fidelity import write_reports
    from sim.infra.html_page import asset_name, plotly_js
    from test_html_pages import check_page

    run = tmp_path / "run"
    cells = _record_run(run, monkeypatch)
    assert len(re.findall(r"\* plotly\.js v\d", (run / "fidelity.html").read_text())) == 1  # the default: inlined
    rep = tmp_path / "rep"
    for name in ("a", "b"):
        assert report_main([str(run), "--out", str(rep / f"fidelity-{name}.md"), "--plotly", "shared"]) == 0
        check_page((rep / f"fidelity-{name}.html").read_text(), f"fidelity report {name}, shared", rep)
    assert {p.name for p in rep.iterdir()} == {"fidelity-a.md", "fidelity-a.html", "fidelity-b.md", "fidelity-b.html",
                                               asset_name()}  # one plotly.js for both pages, no temporaries
    assert (rep / asset_name()).read_bytes() == plotly_js().encode()
    assert "--plotly shared`" in (rep / "fidelity-a.md").read_text().split("\n")[2]
    meta = json.loads((run / "fidelity.json").read_text())["meta"]
    write_reports(tmp_path / "v", cells, meta, plotly="shared")
    check_page((tmp_path / "v" / "fidelity.html").read_text(), "validate page, shared", tmp_path / "v")


def _two_trace_runs(tmp_path, monkeypatch):
    """A recorded run on chat (tmp_path/run) and its copy relabelled as code editing (tmp_path/other): one grid
    measured trace by trace. Returns (run, other, other's fidelity.json as a dict)."""
    import shutil

    run, other = tmp_path / "run", tmp_path / "other"
    _record_run(run, monkeypatch)
    shutil.copytree(run, other)
    fid = json.loads((other / "fidelity.json").read_text())
    for c in fid["cells"]:
        c["trace"] = "traces/codeedit.jsonl"
    fid["meta"]["command"] = "python real/validate.py --out other"
    (other / "fidelity.json").write_text(json.dumps(fid))
    return run, other, fid


def test_report_of_runs_with_no_cell_in_common_checks_them_as_one_grid(tmp_path, monkeypatch):
    """One grid measured trace by trace (two --out directories on one table): no cell in common, so agreement
    is n/a (not a vacuous "0 of 0: yes") and the targets are checked over all cells together."""
    from real.validation.report import load_run, targets

    run, other, fid = _two_trace_runs(tmp_path, monkeypatch)
    rows = targets([load_run(run), load_run(other)])
    agree = [r for r in rows if r[0] == "the runs agree on every cell's verdict"]
    assert agree == [("the runs agree on every cell's verdict", None, "no cell in common: agreement needs a rerun "
                      "(parts of one run: join them as DIR,DIR)")]
    together = [r for r in rows if r[0].startswith("runs 1-2 together")]
    v = fid["aggregate"]["verdicts"]
    assert len(together) == 3 and together[2][2] == f"{2 * v['inconclusive']} of 4"
    assert together[2][1] == (v["inconclusive"] == 0)
    same = targets([load_run(run), load_run(run)])
    assert ("the runs agree on every cell's verdict", True, "2 of 2 cells") in same
    flip = json.loads((run / "fidelity.json").read_text())
    flip["cells"][0]["verdict"]["verdict"] = "agrees"
    other_flip = json.loads(json.dumps(flip))
    other_flip["cells"][0]["verdict"]["verdict"] = "disagrees"
    other_flip["cells"][1]["verdict"]["verdict"] = "inconclusive"
    rows = dict((r[0], r[1:]) for r in targets([flip, other_flip]))
    assert rows["the runs agree on every cell's verdict"][0] is False
    assert rows["no cell agrees in one run and disagrees in another"] == (False, "1 of 2 cells: chat none bs1")
    other_flip["cells"][0]["verdict"]["verdict"] = "agrees"
    rows = dict((r[0], r[1:]) for r in targets([flip, other_flip]))
    assert rows["no cell agrees in one run and disagrees in another"][0] is True
    assert not any(r[0].startswith("runs 1-2 together") for r in same)


def test_parts_of_one_run_joined_by_a_comma_pool_their_cells(tmp_path, monkeypatch, capsys):
    """DIR,DIR is one run measured trace by trace: its cells pooled, its aggregate recomputed over them, and two
    such runs compared cell by cell; a cell in two parts, or parts of different cell shapes, is refused."""
    from real.validation.report import load_run, main as report_main, targets
    from real.validation.fidelity_stats import CellVerdict, summarize

    run, other, fid = _two_trace_runs(tmp_path, monkeypatch)
    joined = load_run(f"{run},{other}")
    assert len(joined["cells"]) == 4 and joined["meta"]["wall_minutes"] == pytest.approx(3.0)
    want = summarize(CellVerdict.from_json(c["verdict"]) for c in joined["cells"]).to_json()
    assert joined["aggregate"]["verdicts"] == want and joined["aggregate"]["cells"] == 4
    rows = targets([joined, load_run(f"{other},{run}")])
    assert ("the runs agree on every cell's verdict", True, "4 of 4 cells") in rows
    out = tmp_path / "rep.md"
    assert report_main([f"{run},{other}", f"{other},{run}", "--out", str(out)]) == 0
    md = out.read_text()
    assert "| codeedit none bs1 |" in md and "| chat adaptive bs1 |" in md
    assert "`python real/validate.py --out x` and `python real/validate.py --out other`" in md
    with pytest.raises(ConfigError, match="in both"):
        load_run(f"{run},{run}")
    fid["meta"]["max_tokens"] = 99
    (other / "fidelity.json").write_text(json.dumps(fid))
    with pytest.raises(ConfigError, match="max_tokens"):
        load_run(f"{run},{other}")
    with pytest.raises(ConfigError, match="not a directory"):
        load_run(f"{run},{tmp_path / 'nowhere'}")


def test_grid_estimate_prints_before_any_run():
    """The estimate's reference run (3 policies x batch 1, 4 on codeedit) near its measured 10.6 minutes, the
    default grid under an hour at the reference's speed, --grid big at hours; a machine s times slower is
    estimated s times longer; more work never estimates less."""
    from real.validation.validate import GRIDS, estimate_minutes, parse_args

    prof = {"limit": 10, "max_tokens": 24, "repeats": 2}
    assert 9.0 <= estimate_minutes(1, 16, 32, 3, [1, 4], 3, prof) <= 12.5
    d = estimate_minutes(2, 16, 32, 5, [1, 4, 16], 3, prof)
    g = GRIDS["big"]
    big = estimate_minutes(2, g["limit"], g["max_tokens"], 5, [1, 4, 16], g["repeat"], prof)
    assert 30 <= d <= 60 and big > 150 and big > 5 * d
    assert estimate_minutes(2, 16, 32, 5, [1, 4, 16], 3, prof, speed=3.0) == pytest.approx(3 * d)
    assert estimate_minutes(2, 16, 32, 5, [1, 4, 16], 3, None) < d  # a given table: no profile
    assert parse_args(["--grid", "big"]).grid == "big"
    with pytest.raises(SystemExit):
        parse_args(["--grid", "huge"])
