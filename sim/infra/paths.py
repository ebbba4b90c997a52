"""Where the repository's own folders are (models/, traces/, reports/): one root for every module, wherever it lives.

REPO is the checkout that holds this package (the source tree, or an editable install's). MODELS is the models/
data that the installed code reads at run time: an installed wheel (`pip install .`, say behind `vllm serve` with
the vLLM plugin) ships the part of models/ the vLLM plugin needs (the n-gram calibrators) inside the package as
sim/data/ (setup.py: package_dir), and a checkout, which has no sim/data/, reads models/ itself.
"""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# an installed wheel's copy, found relative to its package: REPO there is site-packages' parent, not a checkout
_SHIPPED_MODELS = Path(__file__).resolve().parents[1] / "data"
MODELS = _SHIPPED_MODELS if _SHIPPED_MODELS.is_dir() else REPO / "models"


def shown(path: Path | str) -> str:
    """A path as a command prints it: relative to the working folder when under it, else to the repository when
    under it (a folder the lock resolved to its real path prints as the user named it), else as it is."""
    p = Path(path)
    try:
        full = p.resolve()
    except OSError:
        return str(p)
    for base in (Path.cwd().resolve(), REPO):
        if full.is_relative_to(base):
            return str(full.relative_to(base)) or "."
    return str(p)


def bundled(path: Path | str) -> Path:
    """`path` itself when it exists or is absolute; a relative path that does not exist from the working folder but
    does in the repository (its traces/, models/: the bundled data, whatever folder a command runs from) is the
    repository's file."""
    p = Path(path)
    if p.is_absolute() or p.exists() or not (REPO / p).exists():
        return p
    return REPO / p


def missing_hint(path: Path | str) -> str:
    """What an error about a file that is not there adds: the closest name in its folder (a typo), and for a
    relative path the folder it was read from."""
    from sim.infra.errors import did_you_mean

    p = Path(path)
    try:
        near = did_you_mean(p.name, [q.name for q in p.parent.iterdir()]) if p.parent.is_dir() else ""
    except OSError:
        near = ""
    return near + ("" if p.is_absolute() else f" (relative to the working folder {Path.cwd()})")
