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
