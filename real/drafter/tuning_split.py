"""The drafter's copy-heavy code-editing tuning split: real edits between releases of other PyPI projects than
the ones the evaluation traces are built from.

traces/codeedit.jsonl and traces/codeedit-model.jsonl (sim/core/trace/build_codeedit.py `PROJECTS`: attrs, click,
rich, Jinja2, packaging, more-itertools, requests, Markdown, Pygments) are evaluation traces; the drafter never
trains on them. The tuning split is built by the same builder (same prompts, selection rules and fast-apply
shape: the output copies most of the prompt's code) from `TUNE_PROJECTS` below, whose names are disjoint from
the evaluation projects' (tests/test_drafter_v.py checks the lists and the built rows):

  pyparsing 3.0.9 -> 3.1.1 (MIT), itsdangerous 2.0.1 -> 2.1.2 (BSD-3-Clause), pluggy 0.13.1 -> 1.3.0 (MIT),
  tqdm 4.62.3 -> 4.66.1 (MPL-2.0 AND MIT), python-dateutil 2.8.1 -> 2.8.2 (Apache-2.0 OR BSD-3-Clause)

    python -m real.tuning_split --out PATH      # fetches the pinned wheels with pip (sha256 checked)

Written to the drafter data cache by `python -m real.train_drafter_v` when absent (never into traces/: it is
data built by a command, not a bundled trace).
"""
from __future__ import annotations

import json
from pathlib import Path

from sim.core.trace.build_codeedit import PROJECTS as EVAL_PROJECTS
from sim.core.trace.build_codeedit import Project, Release

TUNE_PROJECTS: tuple[Project, ...] = (
    Project("pyparsing", "MIT",
            Release("3.0.9", "pyparsing-3.0.9-py3-none-any.whl",
                    "5026bae9a10eeaefb61dab2f09052b9f4307d44aee4eda64b309723d8d206bbc"),
            Release("3.1.1", "pyparsing-3.1.1-py3-none-any.whl",
                    "32c7c0b711493c72ff18a981d24f28aaf9c1fb7ed5e9667c9e84e3db623bdbfb")),
    Project("itsdangerous", "BSD-3-Clause",
            Release("2.0.1", "itsdangerous-2.0.1-py3-none-any.whl",
                    "5174094b9637652bdb841a3029700391451bd092ba3db90600dea710ba28e97c"),
            Release("2.1.2", "itsdangerous-2.1.2-py3-none-any.whl",
                    "2c2349112351b88699d8d4b6b075022c0808887cb7ad10069318a8b0bc88db44")),
    Project("pluggy", "MIT",
            Release("0.13.1", "pluggy-0.13.1-py2.py3-none-any.whl",
                    "966c145cd83c96502c3c3868f50408687b38434af77734af1e9ca461a4081d2d"),
            Release("1.3.0", "pluggy-1.3.0-py3-none-any.whl",
                    "d89c696a773f8bd377d18e5ecda92b7a3793cbe66c87060a6fb58c7b6e1061f7")),
    Project("tqdm", "MPL-2.0 AND MIT",
            Release("4.62.3", "tqdm-4.62.3-py2.py3-none-any.whl",
                    "8dd278a422499cd6b727e6ae4061c40b48fce8b76d1ccbf5d34fca9b7f925b0c"),
            Release("4.66.1", "tqdm-4.66.1-py3-none-any.whl",
                    "d302b3c5b53d47bce91fea46679d9c3c6508cf6332229aa1e7d8653723793386")),
    Project("python-dateutil", "Apache-2.0 OR BSD-3-Clause",
            Release("2.8.1", "python_dateutil-2.8.1-py2.py3-none-any.whl",
                    "75bb3f31ea686f1197762692a9ee6a7550b59fc6ca3a1f4b5d7e32fb98e2da2a"),
            Release("2.8.2", "python_dateutil-2.8.2-py2.py3-none-any.whl",
                    "961d03dc3453ebbc59dbdea9e4e11c5651520a876d0f4db161e8674aae935da9")),
)

TUNE_TARGET = 200  # requests


def project_names(projects) -> set[str]:
    return {p.name.lower().replace("_", "-") for p in projects}


def eval_project_names() -> set[str]:
    return project_names(EVAL_PROJECTS)


def row_project(row_id: str) -> str:
    """The project of a code-edit trace row id ('NAME OLD->NEW:path#i')."""
    return row_id.split(" ", 1)[0].lower().replace("_", "-")


def build_tuning_split(out: Path, cache: Path | None = None, progress: bool = True) -> dict:
    """Build the split into `out` (whole or not at all: the builder writes it in one piece)."""
    from sim.core.trace.build_codeedit import build

    if project_names(TUNE_PROJECTS) & eval_project_names():  # a guard on edits to either list
        raise AssertionError("tuning projects overlap the evaluation projects")
    return build(Path(out), cache=cache, projects=TUNE_PROJECTS, target=TUNE_TARGET, progress=progress)


def main(argv: list[str] | None = None) -> int:
    from sim.infra.cli import ArgumentParser, check_out_file

    ap = ArgumentParser(prog="python -m real.tuning_split", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSONL file to write (must not exist)")
    a = ap.parse_args(argv)
    out = check_out_file(a.out, False, "--out", hint="choose another path (this command never replaces a file)")
    print(json.dumps(build_tuning_split(out)))
    return 0
