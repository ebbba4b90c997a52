"""vLLM's scheduler charge (sim.core.scheduler's 'scheduled' rule, sim.core.vllm's method table): every scheduled
request is charged its scheduled tokens plus its method's extra slots, decoding requests their whole proposal,
whatever adaptive verification later trims; KV reserves drafts + 1 + lookahead. Each charge is pinned here
against the numbers vLLM's source gives (vllm/v1/core/sched/scheduler.py, max_num_new_slots_for_drafting,
num_lookahead_tokens), and the engine's runs are checked to spend the budget that way. The numbers pinned here
are vLLM 0.32's (DSpark's K - 1 extra slots); 0.33's and the difference: tests/test_vllm_semantics.py."""
import numpy as np
import pytest

from sim.infra.errors import ConfigError
from sim.core.policies import get_policy
from sim.core.scheduler import SCHEDULED, VERIFIED, Scheduler, SlotCharge
from sim.core.vllm import VllmRun, slot_charge, vllm_slot_charge


def _sched(charge, budget, prompts=(10, 10, 10, 700), batch=4, kmax=7):
    s = Scheduler(np.array(prompts), batch, budget, 16, 10**6, kmax, charge=charge)
    for r in range(len(prompts)):
        s.add(r)
    return s


def _decoding(s, n):
    """Make the first n running requests decode (their prompts prefilled, one token out)."""
    s.schedule()
    st = s.state
    for r in s.running[:n]:
        st.prefilled[r] = st.prefill_target[r]
        st.pos[r] = 1


V32 = "0.32"  # the release whose charges this file pins


# ------------------------------------------------------------------------------------------ the method table
def test_vllm_method_charges():
    dspark = vllm_slot_charge(VllmRun("dspark", adaptive=True), block=7, version=V32)
    assert (dspark.rule, dspark.drafts, dspark.extra, dspark.lookahead, dspark.verify_all) == (SCHEDULED, 7, 6, 7, False)
    assert dspark.per_decode == 1 + 7 + 6 and dspark.kv_extra == 7 + 1 + 7
    wide = vllm_slot_charge(VllmRun("dspark", k=32, adaptive=True), block=7, version=V32)  # hybrid-vllm:slots=32
    assert (wide.drafts, wide.extra, wide.lookahead) == (32, 31, 32)
    fixed = vllm_slot_charge(VllmRun("dspark", k=4), block=7, version=V32)  # model-fixed:4: no adaptive trimming
    assert (fixed.drafts, fixed.extra, fixed.verify_all) == (4, 3, True)
    ngram = vllm_slot_charge(VllmRun("ngram", k=16), block=7)
    assert (ngram.drafts, ngram.extra, ngram.lookahead, ngram.verify_all) == (16, 0, 0, True)
    none = vllm_slot_charge(VllmRun(None), block=7)
    assert (none.drafts, none.extra, none.lookahead, none.per_decode) == (0, 0, 0, 1)


def test_policies_carry_their_vllm_runs():
    assert slot_charge("hybrid-vllm:slots=16", get_policy("hybrid-vllm:slots=16").vllm, "hybridspec", 16, 7, V32) == \
        SlotCharge(SCHEDULED, drafts=16, extra=15, lookahead=16)
    assert slot_charge("vllm-ngram:7", get_policy("vllm-ngram:7").vllm, "hybridspec", 7, 7) == \
        SlotCharge(SCHEDULED, drafts=7, verify_all=True)
    # adaptive is charged as vLLM only under the vllm scheduler; the project's engines keep the verified rule
    pol = get_policy("adaptive")
    assert slot_charge("adaptive", pol.vllm, "hybridspec", 7, 7) == SlotCharge.verified(7)
    assert slot_charge("adaptive", pol.vllm, "vllm", 7, 7, V32) == SlotCharge(SCHEDULED, drafts=7, extra=6, lookahead=7)
    assert slot_charge("model-fixed:5", get_policy("model-fixed:5").vllm, "vllm", 7, 7).drafts == 5


@pytest.mark.parametrize("call,needle", [
    (lambda: slot_charge("hybrid", get_policy("hybrid").vllm, "vllm", 32, 7), "no counterpart in vLLM"),
    (lambda: slot_charge("ngram-fixed:8", get_policy("ngram-fixed:8").vllm, "vllm", 8, 7), "no counterpart in vLLM"),
    (lambda: slot_charge("hybrid-vllm:slots=3", get_policy("hybrid-vllm:slots=3").vllm, "vllm", 7, 7), "below the DSpark"),
    (lambda: slot_charge("adaptive", None, "sglang", 7, 7), "--scheduler must be one of"),
    (lambda: SlotCharge("greedy"), "rule must be"),
    (lambda: SlotCharge(SCHEDULED, drafts=-1), "drafts must be an integer >= 0"),
    (lambda: SlotCharge(VERIFIED, drafts=7, extra=6), "belong to the 'scheduled' rule"),
    (lambda: VllmRun("medusa"), "is not one the simulator maps"),
    (lambda: Scheduler(np.array([4]), 1, 64, 16, 1000, 7, charge=SlotCharge.verified(3)), "reserves kmax = 7"),
])
def test_bad_charges_are_one_line_errors(call, needle):
    with pytest.raises(ConfigError) as ei:
        call()
    assert needle in str(ei.value) and "\n" not in str(ei.value)


# ------------------------------------------------------------------------------------------ the budget split
def test_prefill_chunks_shrink_by_the_scheduled_slots():
    """Three decoding requests and a long prompt, budget 128. vLLM (DSpark, K = 7): each decode takes 1 + 7 + 6 =
    14, the chunk min(left, budget left - 6) = 128 - 42 - 6 = 80. The project's rule: 1 per decode plus last
    step's verified drafts (here 2): 128 - 3 - 2 = 123."""
    s = _sched(SlotCharge(SCHEDULED, drafts=7, extra=6, lookahead=7), 128)
    _decoding(s, 3)
    plan = s.schedule()
    assert len(plan.decoding) == 3 and plan.draft_cap is None and plan.prefilling == [(3, 80)]
    s = _sched(None, 128)
    _decoding(s, 3)
    s.last_draft = 2
    plan = s.schedule()
    assert plan.prefilling == [(3, 123)]
    ngram = _sched(SlotCharge(SCHEDULED, drafts=7, verify_all=True), 128)  # n-gram: no extra slots
    _decoding(ngram, 3)
    assert ngram.schedule().prefilling == [(3, 128 - 3 * 8)]


def test_no_chunk_when_only_the_extra_slots_are_left():
    s = _sched(SlotCharge(SCHEDULED, drafts=7, extra=6, lookahead=7), 3 * 14 + 6)
    _decoding(s, 3)
    plan = s.schedule()
    assert len(plan.decoding) == 3 and plan.prefilling == []  # 6 left <= extra: vLLM stops scheduling


@pytest.mark.parametrize("budget,extra,want_cap", [
    (35, 6, [7, 7, 0]),   # two whole (28), 7 left: the third gets 7 - 6 = 1 token, no drafts
    (30, 6, [7, 7]),      # two whole, 2 left <= extra: the third is not scheduled this step
    (20, 0, [7, 7, 3]),   # n-gram: two whole (16), 4 left: the third gets 1 + 3 drafts
    (13, 6, [6]),         # one request, cut to 13 - 6 = 7 tokens: 6 drafts
])
def test_the_budget_cuts_drafts_in_running_order(budget, extra, want_cap):
    s = _sched(SlotCharge(SCHEDULED, drafts=7, extra=extra), budget, prompts=(4, 4, 4), batch=3)
    _decoding(s, 3)
    plan = s.schedule()
    assert plan.draft_cap is not None and plan.draft_cap.tolist() == want_cap
    assert plan.decoding.tolist() == s.running[:len(want_cap)] and plan.prefilling == []
    assert s.may_cut_drafts


def test_kv_reserves_drafts_bonus_and_lookahead():
    c = SlotCharge(SCHEDULED, drafts=16, extra=15, lookahead=16)
    s = _sched(c, 8192, prompts=(40,), batch=1, kmax=16)
    s.schedule()
    assert s.kv_extra == 16 + 1 + 16 and s.kv_used() == -(-(40 + 33) // 16) * 16
    assert _sched(None, 8192, prompts=(40,), batch=1).kv_extra == 7 + 1  # the project's: kmax + bonus


# ------------------------------------------------------------------------------------------ in the engine
def _run(policy, scheduler="hybridspec", budget=64, bs=4):
    from sim.api.run import SimSetup, prepare, run_one

    setup = SimSetup(trace="tests/fixtures/sim/tiny.jsonl", max_num_batched_tokens=budget, ngram_k=7,
                     drafter="dspark-qwen3-b7", scheduler=scheduler, vllm_version=V32)
    return run_one(prepare(setup), policy, bs)[1]


def test_engine_spends_the_budget_as_vllm():
    """Under the vllm scheduler no step's decodes + chunks + extra slots pass the budget, and a step that decodes
    R requests next to a chunk leaves the chunk at most budget - R * (1 + 7 + 6) - 6; the default rule gives
    larger chunks. Both are lossless."""
    budget = 64
    v = _run("adaptive", "vllm", budget)
    d = _run("adaptive", "hybridspec", budget)
    assert v.lossless and d.lossless
    st = v.steps
    R, pre, seqs = (np.asarray(st[k]) for k in ("num_decode", "prefill_tokens", "num_seqs"))
    both = (R > 0) & (pre > 0)
    assert both.any()
    assert np.all(pre[both] <= budget - R[both] * 14 - 6)
    assert np.all(R * 14 + pre + (seqs - R) * 6 <= budget)
    dpre, dR = np.asarray(d.steps["prefill_tokens"]), np.asarray(d.steps["num_decode"])
    assert dpre[(dR > 0) & (dpre > 0)].max() > pre[both].max()
    assert len(st["num_decode"]) >= len(d.steps["num_decode"])  # smaller chunks: no fewer steps


def test_vllm_ngram_verifies_every_slot():
    """vllm-ngram:7 forwards 1 + 7 tokens per decoding request every step, matched or not; ngram-fixed:7 only
    the matched chain. Same acceptance either way (the allocation is the matched prefix)."""
    v, f = _run("vllm-ngram:7", budget=8192), _run("ngram-fixed:7", budget=8192)
    assert v.lossless and f.lossless
    st = v.steps
    R, pre, tok = (np.asarray(st[k]) for k in ("num_decode", "prefill_tokens", "tokens"))
    assert np.array_equal(tok, pre + R * 8)
    assert np.asarray(f.steps["tokens"]).sum() < tok.sum()


def test_vllm_ngram_fillers_are_accepted_where_the_target_repeats(tmp_path):
    """vLLM's V2 n-gram fills the slots past its match (all K without one) with the last sampled token: after a
    prompt ending in 8 and a first output token 8, an output of 8, 8, 9 accepts two fillers at once, which
    ngram-fixed (copies only) cannot. Lossless: the emitted tokens are the trace's."""
    import json

    from sim.api.run import SimSetup, prepare, run_one

    trace = tmp_path / "repeat.jsonl"
    out = [8, 8, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]
    trace.write_text(json.dumps({"id": "r", "prompt_ids": [1, 2, 3, 4, 5, 6, 7, 8], "output_ids": out}) + "\n")
    prep = prepare(SimSetup(trace=str(trace), ngram_k=4, drafter="dspark-qwen3-b7"))
    v, f = run_one(prep, "vllm-ngram:4", 1)[1], run_one(prep, "ngram-fixed:4", 1)[1]
    assert v.lossless and f.lossless, (v.violation, f.violation)
    em = np.asarray(v.steps["emitted"])
    assert em[em > 0][:2].tolist() == [1, 3]  # the prefill's 8, then fillers 8, 8 and the bonus 9
    assert len(em[em > 0]) < len(np.asarray(f.steps["emitted"])[np.asarray(f.steps["emitted"]) > 0])
    assert v.accepted_hist.sum() == len(em[em > 0]) - 1  # every decode step drafts its K slots, matched or not


def test_wide_slots_cost_budget_and_the_default_hybrid_is_unchanged():
    """hybrid-vllm:slots=32 is charged 1 + 32 + 31 per decoding request: with a budget of 256 and 4 requests its
    prefill chunks are smaller than at the block (1 + 7 + 6), so it takes at least as many steps."""
    w = _run("hybrid-vllm:slots=32", budget=256)
    b = _run("hybrid-vllm", budget=256)
    assert w.lossless and b.lossless
    for res, per, extra in ((w, 64, 31), (b, 14, 6)):
        st = res.steps
        R, pre, seqs = (np.asarray(st[k]) for k in ("num_decode", "prefill_tokens", "num_seqs"))
        assert np.all(R * per + pre + (seqs - R) * extra <= 256)
    assert len(w.steps["num_decode"]) >= len(b.steps["num_decode"])


def test_logits_cap_bounds_the_wide_budget():
    """vLLM's adaptive verification caps the draft budget at its logits buffer less one bonus row per request
    (max_total_logits - num_reqs): hybrid-vllm:slots=32 admits no more than StepBatch.max_draft_tokens."""
    import dataclasses

    from sim.core.policies.testing import random_batch

    rng = np.random.default_rng(3)
    pol = get_policy("hybrid-vllm:slots=32")
    for _ in range(20):
        b = random_batch(rng, 4, 7, 32, max_tokens=4 * 33 + 8)
        for cap in (0, 5, 11):
            got = pol(dataclasses.replace(b, max_draft_tokens=cap)).admitted
            assert int(got.sum()) <= cap
