"""`python real/validate.py` end to end in the default tier, and the real engine on a step whose plan skips the model
pass while a trained drafter is live (issue 62's crash: `_m_tokens` was None, or the previous step's chain).

Both run the 2-layer random-weight target (models/llms/qwen3-tiny.json) with an untrained tiny DSpark drafter made
for it (block 7, the tables' model chain): its chains are almost never accepted, so the hybrid policies skip its pass
on many steps -- the plan that crashed -- while it stays loaded and live. Seconds on a CPU.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from real.drafter.model import DrafterConfig, DSparkDrafter, save_drafter

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(target="qwen3-tiny", target_vocab=4096, hidden=128, layers=(0, 1), block=7, heads=4, kv_heads=2,
            head_dim=32, intermediate=256, vocab=512, rank=16)


def tiny_drafter() -> DSparkDrafter:
    torch.manual_seed(0)
    d = DSparkDrafter(DrafterConfig(**TINY))
    d.set_vocab(torch.arange(512))
    return d


@pytest.fixture(scope="module")
def live_wl():
    """Three chat prompts, the tiny random target's own greedy outputs, the tiny drafter live."""
    from real.validation.workload import Workload

    wl = Workload.build("traces/chat.jsonl", "qwen3-tiny", True, "cpu", limit=3, sample=None, seed=0, max_tokens=8,
                        max_prompt=300, drafter=tiny_drafter())
    assert wl.drafter is not None and not wl.teacher  # a drafter object with random weights: greedy, live
    return wl


@pytest.mark.parametrize("policy", ["hybrid", "adaptive"])
def test_a_plan_without_the_model_pass_beside_a_live_drafter_verifies_lossless(live_wl, policy):
    """Every other decoding step's plan leaves the model pass out, the first one included: a request the n-gram
    drafter has nothing for then verifies its last token alone. Before the fix this read `_m_tokens` (None on the
    first such step: TypeError; the previous step's chain after it)."""
    from real.engine.engine import RealEngine
    from real.validation.workload import provisional_cost
    from sim.core.policies import get_policy
    from sim.engine.engine import EngineConfig

    plans = []

    class SkipsTheModelPass(RealEngine):
        def _plan(self, view):
            p = super()._plan(view)
            p = dataclasses.replace(p, drafters=p.drafters - {"dspark"}) if len(plans) % 2 == 0 else p
            plans.append(p.runs("dspark"))
            return p

    wl = live_wl
    model = wl.model(max_slots=2)
    cfg = EngineConfig(batch_size=2, max_num_batched_tokens=512, async_scheduling=False, kv_capacity_tokens=10**9)
    eng = SkipsTheModelPass(wl.tables, np.zeros(len(wl.requests)), get_policy(policy), provisional_cost(model), cfg,
                            model, wl.ngram_cfg, drafter=wl.drafter)
    assert eng.dcache is not None  # the drafter is live
    res = eng.run()
    assert res.lossless, res.violation
    assert res.outputs == [[int(x) for x in r.output_ids] for r in wl.requests]
    assert plans[0] is False and True in plans and plans.count(False) >= 3
    assert res.steps["verified_model"].sum() > 0  # the steps that ran the pass still verified its chains


def test_the_engine_says_so_when_it_reads_a_model_chain_no_pass_made(live_wl):
    """_model_tokens outside a step that ran the model pass is the engine's own bug: a clear RuntimeError, never a
    None subscript or an earlier step's chain."""
    from real.engine.engine import RealEngine
    from real.validation.workload import provisional_cost
    from sim.core.policies import get_policy
    from sim.engine.engine import EngineConfig

    wl = live_wl
    model = wl.model(max_slots=2)
    cfg = EngineConfig(batch_size=2, max_num_batched_tokens=512, async_scheduling=False, kv_capacity_tokens=10**9)
    eng = RealEngine(wl.tables, np.zeros(len(wl.requests)), get_policy("hybrid"), provisional_cost(model), cfg,
                     model, wl.ngram_cfg, drafter=wl.drafter)
    with pytest.raises(RuntimeError, match="no model pass"):
        eng._model_tokens(0, 0)


def _steps(path: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


def test_validate_runs_end_to_end_with_every_default_policy_and_a_live_drafter(tmp_path):
    """The validate command (in process, its own error boundary) on every policy its default grid plans, the tiny
    target decoding greedily with a live drafter file (--random-weights --drafter FILE): it runs each cell for real,
    predicts it and writes the reports; every run lossless. The cost table is given (--cost-table) and prices the
    model drafter's pass at 100 ms against a verify of about 1 ms, so that `hybrid` plans no model pass on its
    steps while the drafter is live -- the plan that crashed, made certain rather than left to a profile of a
    loaded machine (the profile itself: test_real_engine.py's round trip)."""
    from conftest import run_cli_inprocess
    from real.validation.validate import DEFAULT_POLICIES
    from real.validation.workload import provisional_table

    d = tmp_path / "d.pt"
    save_drafter(tiny_drafter(), d, {"note": "untrained, for tests"})
    table = tmp_path / "table.json"
    table.write_text(json.dumps({**provisional_table("qwen3-tiny", 4096),
                                 "draft": {"num_reqs": [1], "ms": [100.0], "block": 7}}))
    out = tmp_path / "v"
    pols = [x for p in DEFAULT_POLICIES for x in ("--policy", p)]
    r = run_cli_inprocess("real.validation.validate", "--quick", "--model", "qwen3-tiny", "--random-weights",
                          "--drafter", d, "--batch-size", "2", "--limit", "2", "--max-tokens", "8", *pols,
                          "--cost-table", table, "--out", out, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    fid = json.loads((out / "fidelity.json").read_text())
    assert sorted(c["policy"] for c in fid["cells"]) == sorted(DEFAULT_POLICIES)
    assert fid["aggregate"]["all_lossless"] and all(c["real"]["outputs_equal_reference"] for c in fid["cells"])
    assert fid["meta"]["mode"] == "random weights, greedy"
    assert "live in the real engine" in fid["meta"]["drafter_note"]
    for c in fid["cells"]:
        assert c["real"]["tok_per_s"] > 0 and c["predicted"]["tok_per_s"] > 0, c["policy"]
        # the simulator, replaying the drafter's recorded chains on the same table, takes the same steps
        assert c["steps_aligned"] and c["real"]["steps"] == c["predicted"]["steps"], c["policy"]
    hybrid = _steps(out / "codeedit" / "cells" / "codeedit__hybrid__bs2" / "steps_real.r0.csv")
    decode = [s for s in hybrid if int(s["num_decode"]) > 0]
    skipped = sum(int(s["draft_pass"]) == 0 for s in decode)
    assert skipped >= len(decode) // 2, f"hybrid skipped the model pass on {skipped} of {len(decode)} steps"
    adaptive = _steps(out / "codeedit" / "cells" / "codeedit__adaptive__bs2" / "steps_real.r0.csv")
    assert sum(int(s["verified_model"]) for s in adaptive) > 0  # the live drafter's chains were verified
    assert (out / "fidelity.md").read_text().startswith("# Fidelity")


def test_a_drafter_file_for_another_target_is_one_line(tmp_path):
    """--random-weights --drafter FILE: a drafter trained for another target is refused before any run."""
    from conftest import run_cli_inprocess

    d = tmp_path / "d.pt"
    torch.manual_seed(0)
    other = DSparkDrafter(DrafterConfig(**{**TINY, "target": "smollm2-135m"}))
    other.set_vocab(torch.arange(512))
    save_drafter(other, d, {})
    r = run_cli_inprocess("real.validation.validate", "--quick", "--model", "qwen3-tiny", "--random-weights",
                          "--drafter", d, "--out", tmp_path / "v", cwd=ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "trained for target 'smollm2-135m', not 'qwen3-tiny'" in r.stderr, r.stderr


def test_a_drafter_file_retrained_in_place_is_another_setting(tmp_path):
    """The cells' cache key holds a drafter file's content: the same path with other weights recomputes them."""
    from real.validation.options import ValidateOptions
    from real.validation.validate import cell_settings

    d, table = tmp_path / "d.pt", tmp_path / "t.json"
    table.write_text("{}")
    save_drafter(tiny_drafter(), d, {"v": 1})
    a = ValidateOptions(model="qwen3-tiny", random_weights=True, drafter=str(d))
    first = cell_settings(a, "traces/chat.jsonl", table, 2, 8, 300)
    torch.manual_seed(1)
    other = DSparkDrafter(DrafterConfig(**TINY))
    other.set_vocab(torch.arange(512))
    save_drafter(other, d, {"v": 2})
    second = cell_settings(a, "traces/chat.jsonl", table, 2, 8, 300)
    assert first["drafter"] == second["drafter"] and first["drafter_sha256"] != second["drafter_sha256"]
    assert "drafter_sha256" not in cell_settings(ValidateOptions(), "traces/chat.jsonl", table, 2, 8, 300)
