"""The validation pipeline's shared pieces (real/validation/pipeline/, real/validation/vllm/{builds,cells,recorder}.py):
lossless with bf16 tie flips, the recorded-drafts sidecar from an engine's chains, an engine's cost tables with its
capture sizes, steps counted one way, the vLLM flow's policy settings and builds, and the draft recorder's
device-side bookkeeping -- all without vLLM."""
from __future__ import annotations

import json
import types

import numpy as np
import pytest
import torch

from real.validation.pipeline.cells import cell_id, policy_dir
from real.validation.pipeline.drafts import accepted_length, sidecar_from_chains
from real.validation.pipeline.lossless import compare_outputs, top2_margins
from real.validation.pipeline.predict import emitting_steps
from real.validation.pipeline.tables import engine_table
from sim.infra.errors import ConfigError


# ------------------------------------------------------------------------------------------ lossless
def test_exact_comparison_without_margins():
    r = compare_outputs([[1, 2, 3], [4]], [[1, 2, 3], [4]])
    assert r.lossless and r.exact and "2/2 requests equal (4 tokens)" in r.detail()
    r = compare_outputs([[1, 2, 3], [4]], [[1, 2, 9], [4]])
    assert not r.lossless and r.mismatches[0].position == 2 and r.mismatches[0].margin is None


def test_a_flip_below_the_margin_is_a_tie_flip_and_above_it_a_loss():
    ref, got = [[1, 2, 3, 4], [5, 6]], [[1, 2, 7, 8], [5, 9]]
    margins = [[2.0, 2.0, 0.1, 3.0], [4.0, 0.3]]
    r = compare_outputs(ref, got, margins, epsilon=0.25)
    assert [d.request for d in r.tie_flips] == [0] and [d.request for d in r.mismatches] == [1]
    assert not r.lossless and not r.exact
    r = compare_outputs(ref, got, margins, epsilon=0.5)  # both below: lossless, not exact
    assert r.lossless and not r.exact and len(r.tie_flips) == 2 and "2 tie flip(s)" in r.detail()
    assert r.to_json()["epsilon"] == 0.5


def test_length_differences_and_missing_margins_are_never_tie_flips():
    r = compare_outputs([[1, 2, 3]], [[1, 2]], [[0.0, 0.0, 0.0]])
    assert not r.lossless and r.mismatches[0].got is None
    r = compare_outputs([[1, 2, 3]], [[1, 2, 9]], [[0.0, 0.0, None]])
    assert not r.lossless
    r = compare_outputs([[1], [2]], [[1]], [[0.0], [0.0]])
    assert not r.lossless and "1 outputs for 2 requests" in r.detail()


def test_top2_margins():
    assert top2_margins([{5: -0.1, 7: -2.6}, {5: -0.2}, None]) == [pytest.approx(2.5), None, None]


# ------------------------------------------------------------------------------------------ drafts, tables, steps
def test_sidecar_from_an_engines_chains(tmp_path):
    ref = [[10, 11, 12, 13], [20, 21]]
    chains = [("a-8f3c", 0, [10, 11, 99], [0.9, 0.5, 0.2]), ("b", 1, [21], [0.7]), ("zz", 0, [1], [1.0]),
              ("a", 9, [1], [1.0])]
    path = sidecar_from_chains(["a", "b"], ref, chains, 3, tmp_path / "d.jsonl")
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert rows[0]["id"] == "a" and rows[0]["model_acc"] == [2, 0, 0, 0]
    assert rows[0]["model_conf"][0] == [0.9, 0.5, 0.2] and rows[0]["model_conf"][1] == [0, 0, 0]
    assert rows[1]["model_acc"] == [0, 1] and rows[1]["model_conf"][1] == [0.7, 0.0, 0.0]
    assert sidecar_from_chains(["a"], ref[:1], [], 3, tmp_path / "e.jsonl") is None
    assert accepted_length([1, 2, 3], [1, 2, 4], 0, 3) == 2 and accepted_length([1], [0, 1], 1, 3) == 1
    from sim.core.drafters.model import load_recorded_drafts

    assert set(load_recorded_drafts(str(path), 3)) == {"a", "b"}  # the simulator reads it


def test_engine_table_pads_to_the_capture_sizes(tmp_path):
    from sim.core.cost.profiled import ProfiledCost

    v = [0.0] + [1.0 + 0.1 * t for t in range(1, 33)]
    obj = engine_table({"verify_ms": v, "draft_ms": [0.0, 0.5, 0.6]}, llm="qwen3-8b", label="h100-sxm", block=7,
                       capture_sizes=[8, 1, 2, 4, 16, 0], machine={"device": "cuda"}, source="test")
    assert obj["capture_sizes"] == [1, 2, 4, 8, 16] and obj["verify"]["num_tokens"][0] == 1
    path = tmp_path / "t.json"
    path.write_text(json.dumps(obj))
    cost = ProfiledCost(str(path), fallback=None)
    # 5 tokens replay the graph captured for 8: vLLM's own table at 8
    assert cost.verify_ms(5, 0, 1) == pytest.approx(1.8) and cost.verify_ms(8, 0, 1) == pytest.approx(1.8)
    assert cost.verify_ms(20, 0, 1) == pytest.approx(3.0)  # past the largest capture size: the table itself
    with pytest.raises(ConfigError, match="no cost tables"):
        engine_table({}, llm="x", label="y", block=7, capture_sizes=[], machine={}, source="run/x")


def test_steps_are_counted_as_vllm_counts_them():
    assert emitting_steps({"emitted": np.array([0, 3, 1, 0, 2])}) == 3


def test_cell_names():
    assert cell_id("traces/codeedit.jsonl", "hybrid:slots=32", 4) == "codeedit__hybrid-slots=32__bs4"
    assert policy_dir("ngram-fixed:32") == "ngram-fixed-32"


# ------------------------------------------------------------------------------------------ the vLLM flow's settings
def test_hybrid_policy_settings_and_their_refusals():
    from real.validation.vllm.config import VllmRunConfig, split_policy

    assert split_policy("hybrid:slots=32:skip") == ("hybrid", {"slots": 32, "skip": True})
    assert split_policy("hybrid:margin=0.5:skip=false") == ("hybrid", {"margin": 0.5, "skip": False})
    cfg = VllmRunConfig()
    cell = cfg.cell("hybrid:slots=32")
    assert cell.num_speculative_tokens == 32 and cell.hybrid.slots == 32 and cfg.cell("adaptive") is cfg
    assert cfg.sim_policy("hybrid:slots=32") == "hybrid-vllm:slots=32"
    assert cfg.engine_kwargs("hybrid:slots=32", 4)["speculative_config"]["num_speculative_tokens"] == 32
    for bad, msg in (("hybrid:slots=x", "an integer in 1..64, got 'x'"), ("hybrid:slots=3", "smaller than DSpark"),
                     ("hybrid:slots=65", "an integer in 1..64, got 65"), ("hybrid:skip=maybe", "true or false"),
                     ("hybrid:slots=8:slots=9", "given twice"), ("none:skip", "only hybrid"), ("eagle", "policies")):
        with pytest.raises(ConfigError, match=msg):
            cfg.cell(bad) if bad.startswith("hybrid") else split_policy(bad)


def test_builds_differ_only_in_their_facts():
    from real.validation.vllm.builds import BUILDS, build_of

    assert set(BUILDS) == {"cuda", "cpu"} and BUILDS["cuda"].timed and not BUILDS["cpu"].timed
    assert BUILDS["cuda"].semantics == "0.33" and BUILDS["cpu"].semantics == "0.32"
    assert BUILDS["cuda"].policies[0] == BUILDS["cpu"].policies[0] == "none"
    assert {"hybrid:slots=32", "hybrid:slots=32:skip"} <= set(BUILDS["cuda"].policies)
    with pytest.raises(ConfigError, match="--vllm-device"):
        build_of("tpu")


def test_batch_invariant_mode_only_where_shipped(monkeypatch):
    from importlib import metadata

    from real.validation.vllm.config import BATCH_INVARIANT_MODULE, batch_invariant_env

    monkeypatch.setattr(metadata, "files", lambda d: [BATCH_INVARIANT_MODULE])
    assert batch_invariant_env("cuda") == {"VLLM_BATCH_INVARIANT": "1"} and batch_invariant_env("cpu") == {}
    monkeypatch.setattr(metadata, "files", lambda d: ["vllm/__init__.py"])
    assert batch_invariant_env("cuda") == {}


# ------------------------------------------------------------------------------------------ the draft recorder
def test_recorder_keeps_device_copies_and_positions():
    from real.validation.vllm import recorder

    class T:  # vLLM's UvaBackedTensor / StagedWriteTensor: a host array and a device tensor
        def __init__(self, a):
            self.np, self.gpu = np.asarray(a, dtype=np.int32), torch.tensor(a, dtype=torch.int32)

    rs = types.SimpleNamespace(prompt_len=T([5, 7, 9]), total_len=T([8, 7, 15]))
    worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(req_states=rs, speculator=object()))
    recorder._STATE.update(req_states=rs, rows=[])
    sp = types.SimpleNamespace(draft_tokens=torch.tensor([[1, 2], [3, 4], [5, 6]]),
                               draft_token_confidence_probs=torch.tensor([[0.5, 0.25], [0.1, 0.1], [1.0, 0.0]]))
    batch = types.SimpleNamespace(num_reqs=2, idx_mapping_np=np.array([2, 0]), idx_mapping=torch.tensor([2, 0]),
                                  req_ids=["r2", "r0", "pad"])
    recorder._record(sp, batch)
    sp.draft_tokens[0, 0] = 99  # later steps overwrite the buffers: the record holds copies
    assert recorder.collect(worker) == [["r2", 6, [1, 2], [0.5, 0.25]], ["r0", 3, [3, 4], [pytest.approx(0.1)] * 2]]
    assert recorder.collect(worker) == []  # collected once
    no_spec = types.SimpleNamespace(model_runner=types.SimpleNamespace(req_states=rs, speculator=None))
    assert recorder.attach(no_spec) is False


def test_recorder_keeps_the_plugins_chain_choice_per_live_row():
    """The wrapped HybridDrafter.propose keeps each live step's use_ngram and ngram_len with the batch's request ids
    and output positions (device clones); a padded step (warm-up, profiling) records nothing."""
    from real.validation.vllm import recorder

    class T:
        def __init__(self, a):
            self.np, self.gpu = np.asarray(a, dtype=np.int32), torch.tensor(a, dtype=torch.int32)

    rs = types.SimpleNamespace(prompt_len=T([5, 7, 9]), total_len=T([8, 7, 15]))
    worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(req_states=rs, speculator=object()))
    recorder._STATE.update(req_states=rs, choices=[], batch=(["r2", "r0"], np.array([2, 0])), padded=False)
    p = types.SimpleNamespace(use_ngram=torch.tensor([True, False]), ngram_len=torch.tensor([12, 0]))
    recorder._record_choice(p, rs.total_len.gpu)
    p.use_ngram[0] = False  # the plugin's buffers change later: the record holds copies
    recorder._STATE["padded"] = True
    recorder._record_choice(p, rs.total_len.gpu)  # a padded step: left out
    recorder._STATE["padded"] = False
    assert recorder.collect_choices(worker) == [["r2", 6, True, 12], ["r0", 3, False, 0]]
    assert recorder.collect_choices(worker) == []


def test_the_wrapped_plugin_records_live_steps_and_not_its_warm_up(monkeypatch):
    from real.validation.device.state import drafter, step, step_plan
    from real.validation.vllm import recorder
    from real.vllm_plugin.hybrid import HybridDrafter

    monkeypatch.setattr(HybridDrafter, "propose", HybridDrafter.propose)  # restored after the test
    monkeypatch.setattr(HybridDrafter, "padded_step", HybridDrafter.padded_step)
    recorder._install_choices()
    plan = step_plan(3, 5, 16, 7, 768, 2, 0)
    rs = types.SimpleNamespace(prompt_len=types.SimpleNamespace(np=plan.prompt_len.numpy()))
    slots = plan.idx.numpy()
    recorder._STATE.update(req_states=rs, choices=[], batch=([f"q{s}" for s in slots], slots), padded=False)
    d = drafter(plan, torch.device("cpu"))  # its warm-up runs padded steps: nothing recorded
    assert recorder._STATE["choices"] == []
    _, _, p = step(d, plan, 0)
    got = recorder.collect_choices(None)
    want_pos = (plan.totals[0].numpy()[slots] - plan.prompt_len.numpy()[slots]).tolist()
    assert [g[0] for g in got] == [f"q{s}" for s in slots] and [g[1] for g in got] == want_pos
    assert [g[2] for g in got] == p.use_ngram.tolist() and [g[3] for g in got] == p.ngram_len.tolist()
