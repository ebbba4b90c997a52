"""Docs cite only files in the repository: no DESIGN.md / MISSION.md of an outside project, and every docs/
models/ or traces/ markdown file named in a tracked text file exists."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tracked() -> list[Path]:
    try:
        r = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                           timeout=60)
    except FileNotFoundError:
        pytest.skip("git is not installed")
    if r.returncode != 0:
        pytest.skip("not a git checkout")
    return [ROOT / f for f in r.stdout.splitlines() if f.endswith((".md", ".py", ".ipynb", ".toml")) and (ROOT / f).is_file()]


def test_no_outside_files_cited():
    bad, missing = [], []
    ref = re.compile(r"\b((?:docs|models|traces)/[A-Za-z0-9_./-]+\.md)\b")  # reports/ may name outputs still to come
    for p in _tracked():
        if p.name == "test_docs.py":
            continue
        text = p.read_text(errors="replace")
        if re.search(r"\b(DESIGN|MISSION)\.md\b", text):
            bad.append(str(p.relative_to(ROOT)))
        missing += [f"{p.relative_to(ROOT)}: {m}" for m in ref.findall(text) if not (ROOT / m).is_file()]
    assert not bad, f"cite a file outside the repository: {bad}"
    assert not missing, f"cite missing files: {missing}"


def test_design_doc_covers_its_sections():
    text = (ROOT / "docs" / "design.md").read_text()
    for head in ("What is modelled", "policies' math", "move the headline", "validated"):
        assert head in text


def test_the_docs_stay_a_guide_and_reports_stay_small():
    """README at most 200 lines, docs/*.md at most 2,000 together, tracked reports/ at most 10 MB: measurement logs
    belong in reports/ (with their command) and in closing notes, not in the guide."""
    readme = len((ROOT / "README.md").read_text().splitlines())
    docs = sum(len(p.read_text().splitlines()) for p in (ROOT / "docs").glob("*.md"))
    reports = sum(p.stat().st_size for p in _tracked_all() if p.is_file() and p.relative_to(ROOT).parts[0] == "reports")
    assert readme <= 200, f"README.md has {readme} lines"
    assert docs <= 2000, f"docs/*.md have {docs} lines together"
    assert reports <= 10 * 2**20, f"reports/ holds {reports / 2**20:.1f} MiB"


def _tracked_all() -> list[Path]:
    r = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "reports"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0:
        pytest.skip("not a git checkout")
    return [ROOT / f for f in r.stdout.splitlines()]
