"""One plot style on every HTML page: each trace has an explicit colour, every trace of one legend entry has the
legend's colour in every panel, and a policy, step-time part or named series has the same colour on every page."""
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from sim.infra.plot_style import PART_COLORS, POLICY_COLORS, SERIES_COLORS, family, policy_colors

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl")


def figures(html: str) -> list[list[dict]]:
    """The trace lists of every plotly figure in an HTML page (the data argument of each Plotly.newPlot)."""
    dec = json.JSONDecoder()
    out = []
    for m in re.finditer(r"Plotly\.newPlot\(\s*", html):
        i = m.end()
        _, i = dec.raw_decode(html, i)  # the div id
        i = html.index(",", i) + 1
        while html[i].isspace():
            i += 1
        data, _ = dec.raw_decode(html, i)
        out.append(data)
    return out


def _color(tr: dict):
    if tr.get("type") == "bar":
        return (tr.get("marker") or {}).get("color")
    return (tr.get("line") or {}).get("color") or (tr.get("marker") or {}).get("color")


def check_page(html: str, seen: dict) -> int:
    figs = figures(html)
    assert figs, "no plotly figure on the page"
    n = 0
    for data in figs:
        legend: dict = {}
        for tr in data:
            if tr.get("type") not in ("bar", "scatter"):
                continue
            c = _color(tr)
            assert isinstance(c, str), f"trace {tr.get('name')!r} has no explicit colour"
            key = tr.get("legendgroup") or tr.get("name")
            legend.setdefault(key, set()).add(c)
            n += 1
        for key, cs in legend.items():
            assert len(cs) == 1, f"legend entry {key!r} is drawn in {sorted(cs)} across panels"
            c = next(iter(cs))
            if key in PART_COLORS:
                assert c == PART_COLORS[key]
            elif key in SERIES_COLORS:
                assert c == SERIES_COLORS[key]
            elif key in POLICY_COLORS:
                assert c == POLICY_COLORS[key]
            name = key.split(" bs=")[0]
            if family(name) in POLICY_COLORS:
                assert seen.setdefault(name, c) == c, f"{name} has two colours on different pages"
    return n


def test_policy_colors_fixed_and_distinct():
    got = policy_colors(["ngram-fixed:8", "hybrid", "ngram-fixed:32", "adaptive", "mystery:3"])
    assert got["hybrid"] == POLICY_COLORS["hybrid"] and got["ngram-fixed:32"] == POLICY_COLORS["ngram-fixed"]
    assert got["ngram-fixed:8"] != got["ngram-fixed:32"] and len(set(got.values())) == len(got)
    assert policy_colors(["mystery:3"]) == {"mystery:3": got["mystery:3"]}
    assert len(set(POLICY_COLORS.values())) == len(POLICY_COLORS) and len(set(PART_COLORS.values())) == len(PART_COLORS)


def test_every_page_one_style(tmp_path, monkeypatch):
    import sim.api.sweep as sw
    from sim.api.report import load_sweep, write_sweep_report
    from sim.api.run import main as run_main
    from sim.api.sensitivity import AXIS_TITLES, sensitivity_html

    seen: dict = {}
    # the run's report.html: several batch sizes, so several step-time panels
    assert run_main(["--trace", TINY, "--policy", "hybrid", "--policy", "ngram-fixed:8", "--policy", "oracle",
                     "--batch-size", "1", "--batch-size", "4", "--batch-size", "16", "--workers", "1", "--no-progress",
                     "--out", str(tmp_path / "run")]) == 0
    assert check_page((tmp_path / "run" / "report.html").read_text(), seen) > 12
    # the sweep's index.html
    d = tmp_path / "sweep"
    d.mkdir()
    shutil.copy(TINY, d / "codeedit.jsonl")
    df = sw.run_sweep(sw.expand({"trace": [str(d / "codeedit.jsonl")], "policy": ["hybrid", "ngram-first"],
                                 "batch_size": [2, 8]}), d / "out", workers=1, progress=False)
    assert (df["status"] == "ok").all()
    write_sweep_report(*load_sweep(d / "out"), d / "rep")
    assert check_page((d / "rep" / "index.html").read_text(), seen) > 8
    # sensitivity.html
    rows = [{"axis": ax, "value": v, "batch_size": b, "hybrid": 1.2, "hybrid-price": 1.1, "best single": 1.0, "oracle": 1.4}
            for ax in AXIS_TITLES for v in ("a", "b") for b in (4, 128)]
    check_page(sensitivity_html(pd.DataFrame(rows)), seen)
    # real/validate's fidelity.html
    from real.validation.fidelity import format_html

    cells = [{"trace": "traces/codeedit.jsonl", "policy": p, "batch_size": b, "real": {"tok_per_s": 10.0},
              "predicted": {"tok_per_s": 11.0}, "synthetic": {"tok_per_s": 12.0}} for p in ("none", "adaptive") for b in (1, 4)]
    check_page(format_html(cells, {"median_error": 0.05}, {}), seen)
    assert seen["hybrid"] == POLICY_COLORS["hybrid"] and seen["adaptive"] == POLICY_COLORS["adaptive"]
