"""README's headline table is the report it cites (issue 62, point 6): every figure of "What it predicts" equals
reports/paper.md's cell for the same trace and batch size (its "What to serve" table, vLLM main's column included,
and the table under it),
and the anchor figures beside it equal reports/anchors.md's. A regenerated report that moves a figure fails here
until README is updated with it."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PAPER = (ROOT / "reports" / "paper.md").read_text()
ANCHORS = (ROOT / "reports" / "anchors.md").read_text()


def _table(lines: list[str], start: int) -> list[dict]:
    """The markdown table whose header is lines[start], as dicts keyed by its header cells; a header repeated
    (paper.md's "/ adaptive" after each setup) is keyed by the header before it: "best ... / adaptive"."""
    cells = lambda ln: [c.strip() for c in ln.strip().strip("|").split("|")]  # noqa: E731
    head = cells(lines[start])
    head = [f"{head[i - 1]} {h}" if head.count(h) > 1 else h for i, h in enumerate(head)]
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        rows.append(dict(zip(head, cells(ln))))
    return rows


def readme_headline() -> list[dict]:
    lines = README.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("| workload (trace) |"))
    return _table(lines, start)


def paper_tables() -> dict[tuple[str, int], dict]:
    """(trace, batch size) -> the "What to serve" row merged with the detail row of reports/paper.md."""
    out: dict[tuple[str, int], dict] = {}
    lines = PAPER.splitlines()
    trace = None
    for i, ln in enumerate(lines):
        m = re.match(r"## .*\((\S+)\)$", ln)
        if m:
            trace = m.group(1)
        elif trace and ln.startswith("| batch size |"):
            for row in _table(lines, i):
                out.setdefault((trace, int(row["batch size"])), {}).update(
                    {("serve " + k if "recommended" in ln else k): v for k, v in row.items()})
    return out


def _ratio_policy(cell: str) -> tuple[str, str]:
    m = re.fullmatch(r"\**([0-9.]+)x\** `([^`]+)`( \(plugin\))?", cell)
    assert m, f"README headline cell not as '1.234x `policy`': {cell!r}"
    return m.group(1), m.group(2)


def test_the_paper_tables_parse():
    paper = paper_tables()
    assert {t for t, _ in paper} == {"codeedit", "codeedit-model", "chat"}
    assert paper[("codeedit", 4)]["serve recommended"] and paper[("codeedit", 4)]["hybrid / adaptive"]
    assert paper[("codeedit", 4)]["serve best on vLLM main (unreleased) / adaptive"]  # issue 59 point 3


def test_readme_headline_equals_reports_paper():
    paper = paper_tables()
    rows = readme_headline()
    seen = set()
    for row in rows:
        trace = re.search(r"\(`([^`]+)`\)", row["workload (trace)"]).group(1)
        batch = int(row["batch"])
        seen.add((trace, batch))
        want = paper[(trace, batch)]
        ratio, policy = _ratio_policy(row["**recommended** (the verdict)"])
        assert (policy, ratio) == (want["serve recommended"], want["serve recommended / adaptive"]), (trace, batch)
        assert ("(plugin)" in row["**recommended** (the verdict)"]) == (want["serve runs in"] == "plugin")
        # the best released setup: "= recommended" when it is the same setup (a number is written once)
        released = want["serve best in vLLM as released"]
        cell = row["best in vLLM 0.33 as released"]
        if cell == "= recommended":
            assert released == policy, (trace, batch)
        else:
            r_ratio, r_policy = _ratio_policy(cell)
            assert (r_policy, r_ratio) == (released, want["serve best in vLLM as released / adaptive"]), (trace, batch)
        # vLLM main's tier (issue 59 point 3): its best setup and ratio, never the recommendation
        m_ratio, m_policy = _ratio_policy(row["vLLM main (unreleased)"])
        assert (m_policy, m_ratio) == (want["serve best on vLLM main (unreleased)"],
                                       want["serve best on vLLM main (unreleased) / adaptive"]), (trace, batch)
        assert m_policy != policy
        assert row["`hybrid` (simulated only)"] == want["hybrid / adaptive"] + "x", (trace, batch)
        assert row["per-step oracle"] == want["oracle / adaptive"] + "x", (trace, batch)
        assert row["published (seed)"] == want["published"] + "x", (trace, batch)
    assert seen == {(t, b) for t in ("codeedit", "codeedit-model", "chat") for b in (4, 128)}
    assert len(rows) == len(seen)  # each (workload, batch) once


def test_readme_anchor_figures_equal_reports_anchors():
    for trace in ("codeedit", "codeedit-model"):
        m = re.search(rf"\| pr24344-blazedit:{re.escape(trace)} \| tokens per step, all steps \| ([0-9.]+) \| "
                      r"([0-9.]+) \| ([+-][0-9.]+%) \|", ANCHORS)
        assert m, trace
        published, simulated, dev = m.groups()
        assert f"{published} tokens per step" in README
        assert f"{simulated} ({dev})" in README, (trace, simulated, dev)


def test_the_readme_defines_dspark_and_the_seed():
    assert "DSpark is a model-based block drafter" in README
    assert "The seed is the published method this project" in README
