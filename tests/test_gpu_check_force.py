"""`real/gpu_check.py --force` replaces only the files it writes: the earlier validate/ folder (which may hold the
user's files) is moved aside, never removed, and a user's folder at a file output's name is refused."""
import os

import pytest

from sim.infra.errors import HybridSpecError

OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")


@pytest.fixture
def replace_earlier():
    """The function, and a check that importing gpu_check leaves the environment alone (its offline switches are set
    by its main, so no later test of this process runs offline by accident)."""
    before = {k: os.environ.get(k) for k in OFFLINE}
    from real.validation.gpu_check import replace_earlier as fn

    assert {k: os.environ.get(k) for k in OFFLINE} == before
    return fn


def test_force_moves_the_earlier_validation_aside_with_the_users_files(tmp_path, replace_earlier):
    (tmp_path / "validate" / "codeedit").mkdir(parents=True)
    (tmp_path / "validate" / "codeedit" / "fidelity.md").write_text("earlier run\n")
    (tmp_path / "validate" / "my-notes.txt").write_text("the user's\n")
    (tmp_path / "cost_table.json").write_text("{}\n")
    (tmp_path / "keep.txt").write_text("the user's\n")
    moved = replace_earlier(tmp_path)
    assert len(moved) == 1 and moved[0].name.startswith("validate.replaced-")
    assert (moved[0] / "my-notes.txt").read_text() == "the user's\n"  # nothing of the user's removed
    assert (moved[0] / "codeedit" / "fidelity.md").is_file()
    assert not (tmp_path / "validate").exists() and not (tmp_path / "cost_table.json").exists()
    assert (tmp_path / "keep.txt").is_file()
    (tmp_path / "validate").mkdir()  # a second --force within the same second gets its own name
    again = replace_earlier(tmp_path)
    assert len(again) == 1 and again[0] != moved[0] and moved[0].is_dir()


def test_force_refuses_a_users_folder_at_a_file_output(tmp_path, replace_earlier):
    (tmp_path / "grid.csv").mkdir()
    (tmp_path / "grid.csv" / "mine.txt").write_text("x")
    with pytest.raises(HybridSpecError):
        replace_earlier(tmp_path)
    assert (tmp_path / "grid.csv" / "mine.txt").is_file()
