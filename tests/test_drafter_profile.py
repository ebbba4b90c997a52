"""The bundled DSpark profile, measured by the simulator: fitted on general text, checked against the
published figures on the chat and code-editing traces it never saw (docs/simulator.md); and the committed
n-gram calibrator's held-out ECE."""
from pathlib import Path

import numpy as np
import pytest

from sim.api.calibrate import ECE_BOUND, evaluate, is_heldout, tables_of
from sim.core.drafters.calibration import NgramCalibrator
from sim.api.fit_profile import AUC_RANGE, CHAT_RANGE, CODE_RANGE, measure, pure_copy_tau
from sim.core.drafters.model import load_drafter_profile

TRACES = Path(__file__).resolve().parents[1] / "traces"
PROFILE = "dspark-qwen3-b7"


@pytest.fixture(scope="module")
def general():
    return measure(PROFILE, str(TRACES / "general.jsonl"), limit=150)


@pytest.fixture(scope="module")
def chat():
    return measure(PROFILE, str(TRACES / "chat.jsonl"), limit=300)


@pytest.fixture(scope="module")
def code():
    return measure(PROFILE, str(TRACES / "codeedit.jsonl"), limit=100)


def test_fit_trace_hits_its_targets(general):
    """general.jsonl is the only trace the knobs were fitted on: tau mid chat range, AUC mid range."""
    assert abs(general["tau"] - sum(CHAT_RANGE) / 2) < 0.1
    assert abs(general["auc"] - sum(AUC_RANGE) / 2) < 0.02
    assert general["ece"] < 0.01


def test_chat_tau_in_published_range(chat):
    assert CHAT_RANGE[0] <= chat["tau"] <= CHAT_RANGE[1]


def test_code_tau_in_published_range(code):
    assert CODE_RANGE[0] <= code["tau"] <= CODE_RANGE[1]


def test_copied_acceptance_is_the_documented_assumption():
    """q1[copied] is not fitted on a trace: a stream of only copied tokens gets the top of the code range."""
    p = load_drafter_profile(PROFILE)
    assert abs(pure_copy_tau(p.q1[1], p.decay[1], p.block) - CODE_RANGE[1]) < 0.01
    assert "general.jsonl" in p.source and "only checked" in p.source


def test_acceptance_decays_slowly_and_head_discriminates(chat, code):
    for m in (chat, code):
        cond = np.asarray(m["cond"])
        assert cond.min() > 0.6 and cond.max() < 0.99
        assert abs(cond[0] - cond[-1]) < 0.1  # slow decay with position
        assert AUC_RANGE[0] <= m["auc"] <= AUC_RANGE[1]
    assert code["cond"][0] > chat["cond"][0] + 0.05  # copying makes drafting easier


def test_causal_head_is_nearly_calibrated_off_its_fit_trace(chat, code):
    """The head's copy prior is a general-text marginal, so it is calibrated only approximately
    elsewhere: about 1% ECE on chat, about 5% on code edits (copying persists longer there)."""
    assert chat["ece"] < 0.025
    assert code["ece"] < 0.07


def test_committed_calibrator_meets_ece_bound_on_heldout_general_text():
    cal = NgramCalibrator.load()
    ids, tabs = tables_of(str(TRACES / "general.jsonl"), cal.cfg, limit=600)
    held = [t for i, t in zip(ids, tabs) if is_heldout(i)]
    assert len(held) > 80
    res = evaluate(cal, held)
    assert res["ece"] <= ECE_BOUND
    assert res["auc"] > 0.85
