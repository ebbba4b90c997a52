"""sim.api.sensitivity: every axis reported, files written whole, no overwrite without --force."""
from pathlib import Path

import pandas as pd
import pytest

from sim.api import sensitivity

TINY = str(Path(__file__).resolve().parent / "fixtures" / "sim" / "tiny.jsonl")


def test_sensitivity_reports_every_axis_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "s"
    assert sensitivity.main(["--trace", TINY, "--batch-size", "2", "--out", str(out), "--workers", "1"]) == 0
    md = (out / "sensitivity.md").read_text()
    for title in sensitivity.AXIS_TITLES.values():
        assert f"## {title}" in md
    assert "Simulation only" in md and sensitivity.COMMAND in md
    summ = pd.read_csv(out / "sensitivity.csv")
    assert set(summ["axis"]) == set(sensitivity.AXES)
    assert (summ["oracle"] > 0).all() and summ["hybrid"].notna().all()
    assert len(summ[summ["axis"] == "copy"]) == 3
    assert not list(out.glob("*.tmp"))
    assert not list(out.glob("plotly-*.js"))  # the default page inlines plotly.js: no shared copy beside it
    before = (out / "sensitivity.md").read_text()
    with pytest.raises(SystemExit) as exc:
        from sim.infra.cli import run_cli
        run_cli(sensitivity.main, ["--trace", TINY, "--batch-size", "2", "--out", str(out)])
    assert exc.value.code == 2 and "--force" in capsys.readouterr().err
    assert (out / "sensitivity.md").read_text() == before
