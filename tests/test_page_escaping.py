"""Every HTML page writer escapes every string it shows (issue 60; sim/infra/html_page.py: `Markup`, `text`, `para`):
each writer is fed a hostile string where a user's argument, file name or recorded value goes, and the page must
hold no element or event attribute made from it, while still showing it as text. A meta-test keeps the list whole:
every module that builds a page with html_page.page must be one of the writers tested here."""
from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from conftest import run_cli_inprocess

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl"
LLM_JSON = ROOT / "models" / "llms" / "qwen3-8b.json"
HOSTILE = "<img src=x onerror=alert(1)><b onmouseover=alert(2)>m'\"&"
SHOWN = "&lt;img src=x onerror=alert(1)&gt;"  # how the page shows it (escaped text)


class _Live(HTMLParser):
    """Elements and event attributes of a page, outside its scripts (what a browser would make live)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.bad: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("img", "b"):
            self.bad.append(f"<{tag}>")
        self.bad += [f"<{tag} {k}=...>" for k, _ in attrs if k.lower().startswith("on")]


def assert_escaped(text: str) -> None:
    p = _Live()
    p.feed(text)
    assert not p.bad, f"live markup from a hostile string: {p.bad[:5]}"
    assert SHOWN in text, "the hostile string is not shown (as text) on the page"


def test_page_escapes_its_title_and_any_plain_string_part():
    from sim.infra.html_page import heading, nav, page, para

    assert_escaped(page(HOSTILE, [HOSTILE, heading(2, HOSTILE, HOSTILE), para(HOSTILE, HOSTILE), nav([(HOSTILE, HOSTILE)])],
                        "shared"))


def test_rewrap_escapes_the_title(tmp_path):
    import plotly.graph_objects as go

    from sim.infra.html_page import figure_div, page, rewrap

    fig = go.Figure(go.Bar(x=[HOSTILE], y=[1], name=HOSTILE))
    fig.update_layout(title=HOSTILE)
    assert_escaped(rewrap(page("t", [figure_div(fig, "f")], "shared"), HOSTILE, "shared"))


def test_sim_run_report_escapes_the_model_and_trace_names(tmp_path):
    """The audit's case: `--model` (a model file named with markup) shown in report.html's summary line."""
    model = tmp_path / f"{HOSTILE}.json"
    model.write_bytes(LLM_JSON.read_bytes())
    trace = tmp_path / f"{HOSTILE}.jsonl"
    trace.write_bytes(TINY.read_bytes())
    r = run_cli_inprocess("sim.api.run", "--trace", trace, "--model", model, "--policy", "adaptive", "--batch-size", "2",
                          "--limit", "4", "--no-progress", "--workers", "1", "--out", tmp_path / "o",
                          cwd=tmp_path, env={"HYBRIDSPEC_CACHE_DIR": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    assert_escaped((tmp_path / "o" / "report.html").read_text())


def test_sim_report_escapes_names_read_from_the_results(tmp_path):
    from hostile_cases import _fake_sweep

    sw = _fake_sweep(tmp_path)
    df = pd.read_csv(sw / "results.csv")
    df["model"] = HOSTILE
    df["trace"] = f"traces/{HOSTILE}.jsonl"
    df.to_csv(sw / "results.csv", index=False)
    r = run_cli_inprocess("sim.api.report", sw, "-o", tmp_path / "rep", "--plotly", "shared", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert_escaped((tmp_path / "rep" / "index.html").read_text())


def test_the_fidelity_pages_escape_the_title_and_the_cells(tmp_path):
    from hostile_cases import fidelity_doc
    from real.validation.fidelity import format_html
    from real.validation.report import format_page

    doc = fidelity_doc()
    for c in doc["cells"]:
        c["trace"] = f"traces/{HOSTILE}.jsonl"
    text = format_page([doc], HOSTILE, "shared")
    assert_escaped(text)
    page = format_html(doc["cells"], doc["aggregate"], doc["meta"], "shared")
    assert not _bad(page)  # the cells' names are in the figure only (JSON, escaped by plotly)
    assert "\\u003cimg" in page


def test_the_drafter_curve_page_escapes_the_command(tmp_path):
    from real.validation.drafter_v_report import curve_html

    meta = {"command": f"python -m real.train_drafter_v --out {HOSTILE}",
            "curve": [{"labelled": 10, "tau_tf": 1.5, "top1": [0.5, 0.4]}, {"labelled": 20, "tau_tf": 1.7, "top1": [0.6, 0.5]}]}
    assert_escaped(curve_html(meta, "shared"))


def test_the_sensitivity_page_escapes_axis_values():
    from sim.api.sensitivity import AXIS_TITLES, sensitivity_html

    rows = [{"axis": axis, "batch_size": 4, "value": HOSTILE, "hybrid": 1.1, "hybrid-price": 1.2, "best single": 1.0,
             "oracle": 1.3} for axis in AXIS_TITLES]
    page = sensitivity_html(pd.DataFrame(rows), "shared")
    assert not _bad(page) and "\\u003cimg" in page


def _bad(text: str) -> list[str]:
    p = _Live()
    p.feed(text)
    return p.bad


TESTED = {"sim/api/report.py", "sim/api/sensitivity.py", "real/validation/report.py", "real/validation/fidelity.py",
          "real/validation/drafter_v_report.py", "sim/infra/html_page.py"}


def test_every_page_writer_is_tested_here():
    """A module that builds a page (calls html_page's `page(`) must be one of those above, so that a new writer
    cannot escape this file's checks."""
    writers = set()
    for p in [*(ROOT / "sim").rglob("*.py"), *(ROOT / "real").rglob("*.py")]:
        src = p.read_text()
        if "html_page" in src and re.search(r"(?<![\w.])page\(", src):
            writers.add(str(p.relative_to(ROOT)))
    assert writers <= TESTED, f"page writers without an escaping test: {sorted(writers - TESTED)}"
    assert {"sim/api/report.py", "real/validation/fidelity.py"} <= writers  # the scan finds the writers it should


@pytest.mark.parametrize("value", [HOSTILE, "</p><script>alert(1)</script>", "x' onload='alert(1)"])
def test_text_and_para_escape_quotes_and_tags(value):
    from sim.infra.html_page import para, text

    assert "<" not in text(value) and "'" not in text(value) and '"' not in text(value)
    assert para(value, cls=value).count("<") == 2  # <p ...> and </p> only
