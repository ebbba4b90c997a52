"""Where the repository's own folders are (models/, traces/, reports/): one root for every module, wherever it lives."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
