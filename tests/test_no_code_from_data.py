"""Nothing executes from data: every checkpoint, cache, table or library the project loads is parsed as data.

A static check over the project's sources (run in the default test run, so CI catches a new unsafe load):
every torch.load passes weights_only=True; nothing calls pickle/marshal/dill loads, numpy loads with
allow_pickle=True, or shelve; and a planted training checkpoint whose pickle would write a marker file is
refused with one line without running its payload.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from sim.infra.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("sim", "real", "scripts") if (ROOT / d).is_dir() for p in (ROOT / d).rglob("*.py"))


def _kw(call: ast.Call, name: str):
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


def unsafe_loads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every load in `tree` that could unpickle code."""
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
        if name == "load" and owner == "torch":
            wo = _kw(node, "weights_only")
            if not (isinstance(wo, ast.Constant) and wo.value is True):
                bad.append((node.lineno, "torch.load without weights_only=True"))
        elif name in ("load", "loads", "Unpickler") and owner in ("pickle", "cPickle", "dill", "marshal", "joblib",
                                                                     "cloudpickle"):
            bad.append((node.lineno, f"{owner}.{name}"))
        elif name == "open" and owner == "shelve":
            bad.append((node.lineno, "shelve.open"))
        elif name == "load" and owner in ("np", "numpy"):
            ap = _kw(node, "allow_pickle")
            if ap is not None and not (isinstance(ap, ast.Constant) and ap.value is False):
                bad.append((node.lineno, "numpy.load with allow_pickle"))
        elif name in ("read_pickle",):
            bad.append((node.lineno, name))
    return bad


def test_no_source_file_loads_code_from_data():
    found = []
    for p in SOURCES:
        for line, what in unsafe_loads(ast.parse(p.read_text(), str(p))):
            found.append(f"{p.relative_to(ROOT)}:{line}: {what}")
    assert not found, "loads that could run code from a file:\n" + "\n".join(found)


def test_the_static_check_catches_each_unsafe_form():
    src = ("import torch, pickle, numpy as np\n"
           "torch.load(p)\ntorch.load(p, weights_only=False)\npickle.load(f)\nnp.load(p, allow_pickle=True)\n"
           "torch.load(p, weights_only=True)\nnp.load(p)\n")
    assert [line for line, _ in unsafe_loads(ast.parse(src))] == [2, 3, 4, 5]


class _Payload:
    """Unpickling this object opens (creates) the marker file: stands for any code a planted pickle runs."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_planted_training_checkpoint_runs_nothing_and_is_one_line(tmp_path):
    from real.drafter.train import TrainConfig, train

    marker = tmp_path / "PWNED"
    ckpt = tmp_path / "train-x.ckpt"
    torch.save({"train_config": _Payload(marker)}, ckpt)
    with pytest.raises(ConfigError, match="not a training checkpoint"):
        train(torch.nn.Linear(2, 2), [], TrainConfig(), ckpt, progress=False)
    assert not marker.exists(), "the checkpoint's pickle ran code"
