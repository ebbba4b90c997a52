"""A cell's name, the same for every engine: (trace, policy, batch size) -> one filesystem-safe id and folder.

A policy spec's ':' separates its options (`ngram-fixed:32`, `hybrid:slots=32`) and is not safe in every file
system, so it becomes '-' in names: `codeedit__hybrid-slots=32__bs4`.
"""
from __future__ import annotations

from pathlib import Path


def policy_dir(policy: str) -> str:
    """The folder name of a policy spec."""
    return policy.replace(":", "-")


def cell_id(trace: str, policy: str, bs: int) -> str:
    """The id of a cell: `<trace stem>__<policy_dir>__bs<B>`."""
    return f"{Path(trace).stem}__{policy_dir(policy)}__bs{bs}"
