"""The bundled DSpark profile, measured by the simulator on the bundled traces, against the published
figures it was fitted to (docs/simulator.md); and the committed n-gram calibrator's held-out ECE."""
from pathlib import Path

import numpy as np
import pytest

from sim.calibrate import ECE_BOUND, evaluate, is_heldout, tables_of
from sim.drafters.calibration import NgramCalibrator
from sim.drafters.fit_profile import AUC_RANGE, CHAT_RANGE, CODE_RANGE, measure

TRACES = Path(__file__).resolve().parents[1] / "traces"


@pytest.fixture(scope="module")
def chat():
    return measure("dspark-qwen3-b7", str(TRACES / "chat.jsonl"), limit=120)


@pytest.fixture(scope="module")
def code():
    return measure("dspark-qwen3-b7", str(TRACES / "codeedit.jsonl"), limit=40)


def test_chat_tau_in_published_range(chat):
    assert CHAT_RANGE[0] <= chat["tau"] <= CHAT_RANGE[1]


def test_code_tau_at_or_above_published_range(code):
    assert code["tau"] >= CODE_RANGE[0]


def test_acceptance_decays_slowly_and_head_discriminates(chat, code):
    for m in (chat, code):
        cond = np.asarray(m["cond"])
        assert cond.min() > 0.6 and cond.max() < 0.99
        assert abs(cond[0] - cond[-1]) < 0.1  # slow decay with position
        assert AUC_RANGE[0] - 0.03 <= m["auc"] <= AUC_RANGE[1] + 0.03
    assert code["cond"][0] > chat["cond"][0] + 0.05  # copying makes drafting easier


def test_committed_calibrator_meets_ece_bound_on_heldout_general_text():
    cal = NgramCalibrator.load()
    ids, tabs = tables_of(str(TRACES / "general.jsonl"), cal.cfg, limit=600)
    held = [t for i, t in zip(ids, tabs) if is_heldout(i)]
    assert len(held) > 80
    res = evaluate(cal, held)
    assert res["ece"] <= ECE_BOUND
    assert res["auc"] > 0.85
