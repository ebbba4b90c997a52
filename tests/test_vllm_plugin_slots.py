"""The vLLM plugin's W slots and skip on CPU tensors, without vLLM (real/vllm_plugin/config.py, plugin.py, hybrid.py):
W and the skip are validated at start-up in one line each; the skip decision is the simulator's `hybrid` rule on the
host copies of the last values, and a skipped step publishes the n-gram chains alone."""
import dataclasses
from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch

from real.vllm_plugin import plugin
from real.vllm_plugin.config import MAX_SLOTS, HybridSpecConfig, block_config
from real.vllm_plugin.hybrid import HybridDrafter
from sim.core.drafters.calibration import NgramCalibrator
from sim.infra.errors import ConfigError
from sim.engine.policies import sim_policy
from sim.core.policies.base import CHAIN_NGRAM, HostView, host_view
from sim.core.policies.hybrid import plan_skip
from sim.core.policies.testing import replace_chain

CAL = NgramCalibrator.load()


def _vllm_config(W=32, block=7, extra=None, method="dspark"):
    hf = NS(block_size=block) if block is not None else NS()
    return NS(additional_config={"hybrid_spec": extra or {}},
              speculative_config=NS(method=method, enable_adaptive_verification=True, num_speculative_tokens=W,
                                    draft_model_config=NS(hf_config=hf)))


def test_slots_are_validated_at_start_up_in_one_line(monkeypatch):
    monkeypatch.setattr(plugin, "is_cpu_build", lambda: True)
    assert plugin.hybrid_config(_vllm_config(32, 7)).slots == 0  # W = num_speculative_tokens
    assert plugin.hybrid_config(_vllm_config(32, 7, {"slots": 32})).slots == 32
    assert plugin.hybrid_config(_vllm_config(7, None)) is not None  # no block in the checkpoint: block = W
    bad = [(_vllm_config(32, 7, {"slots": 16}), "slots = 16 but .* num_speculative_tokens = 32"),
           (_vllm_config(5, 7), "smaller than DSpark's trained block \\(7\\)"),
           (_vllm_config(MAX_SLOTS + 1, 7), f"W <= {MAX_SLOTS}"),
           (_vllm_config(32, 7, {"slots": "32"}), r"slots must be 0 \(num_speculative_tokens\) or an integer"),
           (_vllm_config(32, 7, {"slots": MAX_SLOTS + 1}), f"in 1..{MAX_SLOTS}, got {MAX_SLOTS + 1}"),
           (_vllm_config(32, 7, {"skip": "yes"}), "skip must be true or false"),
           (_vllm_config(32, 0), "block_size 0")]
    for cfg, msg in bad:
        with pytest.raises(ConfigError, match=msg) as e:
            plugin.hybrid_config(cfg)
        assert "\n" not in str(e.value)


def _ranks(cfg, tp=1, dp=1):
    cfg.parallel_config = NS(tensor_parallel_size=tp, data_parallel_size=dp)
    return cfg


@dataclasses.dataclass(frozen=True)
class _Spec:
    """A frozen speculative config validated as vLLM's SpeculativeConfig is on every rebuild (load_dspark_model's
    replace): exactly num_speculative_tokens rates, a length in [1, K + 1]."""
    num_speculative_tokens: int
    synthetic_acceptance_rates: list | None = None
    synthetic_acceptance_length: float | None = None

    def validate(self):
        n, r, L = self.num_speculative_tokens, self.synthetic_acceptance_rates, self.synthetic_acceptance_length
        if r is not None and len(r) != n:
            raise ValueError(f"synthetic_acceptance_rates must have length {n}, got {r}")
        if L is not None and not 1 <= L <= n + 1:
            raise ValueError(f"synthetic_acceptance_length must be in [1, {n + 1}], got {L}")
        return self


def test_block_config_cuts_w_long_synthetic_rates_to_the_block_and_leaves_the_runner_w_wide():
    rates = [1.0, 1.0, 0.5] + [0.0] * 29
    wide = NS(speculative_config=_Spec(32, rates), model_config="target")
    with pytest.raises(ValueError, match="must have length 7"):  # what vLLM said before the cut
        dataclasses.replace(wide.speculative_config, num_speculative_tokens=7).validate()
    out = block_config(wide, 7)
    spec = out.speculative_config.validate()
    assert spec.num_speculative_tokens == 7 and spec.synthetic_acceptance_rates == rates[:7]
    assert out.model_config == "target" and out is not wide
    assert wide.speculative_config.num_speculative_tokens == 32 and len(wide.speculative_config.synthetic_acceptance_rates) == 32
    # a length not yet resolved (here 9.5, beyond the block's 1 + 7) becomes W's rates cut to the block: rates only
    spec = block_config(NS(speculative_config=_Spec(32, None, 9.5)), 7).speculative_config.validate()
    assert spec.synthetic_acceptance_rates == [1.0] * 7 and spec.synthetic_acceptance_length is None
    spec = block_config(NS(speculative_config=_Spec(32, None, 2.5)), 7).speculative_config.validate()
    assert spec.synthetic_acceptance_rates == [1.0, 0.5] + [0.0] * 5
    plain = block_config(NS(speculative_config=_Spec(32)), 7).speculative_config.validate()  # no synthetic: only K
    assert plain.num_speculative_tokens == 7 and plain.synthetic_acceptance_rates is None


@pytest.mark.parametrize("cpu_build", [True, False])
def test_the_skip_runs_on_both_builds_on_one_rank_and_compile_only_on_the_cpu_build(monkeypatch, cpu_build):
    """The skip runs on CUDA too (vLLM 0.33's K = 0 path), but not across ranks, which would each decide alone;
    compile is refused on CUDA (its Triton n-gram kernels are untested under torch.compile), one line each."""
    monkeypatch.setattr(plugin, "is_cpu_build", lambda: cpu_build)
    assert plugin.hybrid_config(_vllm_config(32, 7, {"skip": True})).skip
    assert plugin.hybrid_config(_ranks(_vllm_config(32, 7, {"skip": True}))).skip
    assert plugin.hybrid_config(_ranks(_vllm_config(32, 7), tp=2)) is not None  # no skip: any ranks
    for tp, dp in ((2, 1), (1, 4)):
        with pytest.raises(ConfigError, match=f"parallel size 1 \\(got {tp * dp} ranks\\)") as e:
            plugin.hybrid_config(_ranks(_vllm_config(32, 7, {"skip": True}), tp, dp))
        assert "\n" not in str(e.value)
    if cpu_build:
        assert plugin.hybrid_config(_vllm_config(32, 7, {"compile": True})).compile
    else:
        with pytest.raises(ConfigError, match="compile runs only on the CPU build.*Triton") as e:
            plugin.hybrid_config(_vllm_config(32, 7, {"compile": True}))
        assert "\n" not in str(e.value)


def test_sim_policy_names_the_slots_and_the_skip_twin():
    c = HybridSpecConfig(slots=32)
    assert c.sim_policy() == "hybrid-vllm:slots=32"
    sim_policy(c.sim_policy())
    assert HybridSpecConfig.from_additional_config(c.to_additional_config()) == c
    s = HybridSpecConfig(skip=True, slots=16, margin=0.5)
    assert s.sim_policy() == "hybrid-vllm:margin=0.5:slots=16:skip"
    pol = sim_policy(s.sim_policy())
    assert pol.name == s.sim_policy() and pol.plan_fn is not None and pol.alloc_fn is not None
    # the options are read by their declaration (PluginSettings), in any order, into the one canonical name
    assert sim_policy("hybrid-vllm:skip:slots=16:margin=0.5").name == s.sim_policy()
    with pytest.raises(ConfigError, match="skip is given twice|'skip' is given twice"):
        sim_policy("hybrid-vllm:skip:slots=16:skip")


def _skip_batch(seed=0, R=5, K=7, W=16):
    from sim.core.policies import StepBatch

    g = torch.Generator().manual_seed(seed)
    mc, nc = torch.rand(R, K, generator=g), torch.rand(R, W, generator=g) ** 0.2
    return StepBatch(chains={"dspark": (mc, torch.full((R,), K)),
                             "ngram": (nc, torch.randint(0, W + 1, (R,), generator=g))},
                     stale_chains={"dspark": (torch.rand(R, K, generator=g), torch.full((R,), K)),
                                   "ngram": (nc.flip(0), torch.randint(0, W + 1, (R,), generator=g))},
                     num_nondraft_tokens=R,
                     verify_cost_ms=torch.tensor([5.0 + 0.05 * t for t in range(R * (W + 1) + 2)], dtype=torch.float64),
                     draft_cost_ms=1.0, draft_ms_of={"dspark": 0.8, "ngram": 0.05},
                     means={"ngram": nc.to(torch.float64)})


def test_the_skip_twin_runs_hybrid_vllm_when_the_pass_runs_and_publishes_ngram_chains_when_skipped():
    from sim.core.policies.base import Plan
    from sim.core.policies.hybrid import alloc_hybrid_vllm, alloc_hybrid_vllm_skip, plan_hybrid_vllm_skip

    for seed in range(6):
        b = _skip_batch(seed)
        ran = alloc_hybrid_vllm_skip(b, Plan(frozenset(("dspark", "ngram"))), slots=16)
        want = alloc_hybrid_vllm(b, slots=16)
        assert torch.equal(ran.chain, want.chain) and torch.equal(ran.admitted, want.admitted) and bool(ran.said("dspark"))
        skipped = alloc_hybrid_vllm_skip(b, Plan(frozenset(("ngram",))), slots=16)
        assert not bool(skipped.said("dspark")) and bool((skipped.admitted <= b.chains["ngram"][1]).all())
        assert bool((skipped.chain[skipped.admitted > 0] == CHAIN_NGRAM).all())
        # the current model chains were not drafted: changing them changes nothing
        b2 = replace_chain(b, "dspark", conf=torch.ones_like(b.chains["dspark"][0]))
        again = alloc_hybrid_vllm_skip(b2, Plan(frozenset(("ngram",))), slots=16)
        assert torch.equal(again.admitted, skipped.admitted)
        # the plan is plan_skip's decision (the plugin's HybridDrafter.plan_skip calls the same function), no budget
        p = plan_hybrid_vllm_skip(host_view(b))
        assert p.budget is None and p.runs("dspark") == plan_skip(host_view(b)).runs("dspark")


def test_the_skip_twin_skips_in_an_engine_run_and_is_charged_without_the_pass():
    from conftest import LinearCost, random_requests
    from sim.core.drafters.calibration import KNOTS
    from sim.core.drafters.model import ModelDrafterProfile
    from sim.core.drafters.ngram import NgramConfig
    from sim.core.drafters.tables import build_draft_tables
    from sim.engine.engine import Engine, EngineConfig

    rng = np.random.default_rng(0)
    reqs = random_requests(rng, 6, vocab=4, max_prompt=60, max_out=120)
    w = np.zeros(len(KNOTS) + 11)
    w[0], w[1] = 2.0, 1.0
    cfg = NgramConfig(n_min=1, n_max=3, k=8, ext_max=16)
    tb = build_draft_tables(reqs, cfg, ModelDrafterProfile(name="t", block=4), NgramCalibrator(w, cfg))
    res = Engine(tb, np.zeros(len(reqs)), sim_policy("hybrid-vllm:slots=8:skip"), LinearCost(),
                 EngineConfig(batch_size=2, scheduler="vllm")).run()
    assert res.lossless
    st = res.steps
    dec = st["num_decode"] > 0
    skipped = dec & (st["draft_ms"] == 0)
    assert skipped.any() and (dec & (st["draft_ms"] > 0)).any()
    assert (st["verified_model"][skipped] == 0).all()


def test_plan_skip_forecasts_the_dspark_chain_as_the_engine_does():
    """After a skipped step the plugin's host view holds the mean of the request's drafted DSpark chains (the
    engine's forecast, sim.engine.history._host_history), after a drafted one that chain, before any 1.0."""
    d, tok, plen = _drafter()
    d.set_skip_table(np.full(5, 0.5))
    seen = []
    import real.vllm_plugin.hybrid as hy

    orig = hy.HybridDrafter.plan_skip

    def spy(view_fn):
        def plan(view, *a, **k):
            seen.append(view.stale_chains["dspark"][0].clone())
            return view_fn(view, *a, **k)
        return plan

    import sim.core.policies.hybrid as sh
    real_plan = sh.plan_skip
    sh.plan_skip = spy(real_plan)
    try:
        total = torch.full((4,), 140, dtype=torch.int32)
        orig(d, [0, 1, 2, 3])
        _step(d, tok, plen, total, 0.8)
        orig(d, [0, 1, 2, 3])
        _step(d, tok, plen, total + 2, 0.4)
        _step(d, tok, plen, total + 4, 0.0, ran=False)
        orig(d, [0, 1, 2, 3])
    finally:
        sh.plan_skip = real_plan
    assert bool((seen[0] == 1.0).all())
    assert torch.allclose(seen[1], torch.full((4, 7), 0.8))
    assert torch.allclose(seen[2], torch.full((4, 7), 0.6))


def _drafter(W=32, Kb=7, skip=True, S=4, width=256, copies=True):
    d = HybridDrafter(HybridSpecConfig(skip=skip, slots=W), S, W, "cpu", calibrator=CAL, block=Kb)
    t = np.arange(S * (W + 1) + 65, dtype=np.float64)
    d.set_cost_tables(np.full(S + 1, 4.0), 10.0 + np.maximum(t - 64, 0) * 0.05)
    rng = np.random.default_rng(0)
    base = rng.integers(0, 40, 60)
    seq = np.concatenate([base, base, base, base])[:width] if copies else \
        rng.permutation(np.arange(1000))[:width]  # copies: long n-gram chains; else none at all
    tok = torch.as_tensor(np.tile(seq, (S, 1)), dtype=torch.int32)
    plen = torch.full((S,), 70, dtype=torch.int32)
    return d, tok, plen


def _step(d, tok, plen, total, conf_m, ran=True, ns=2):
    S = tok.shape[0]
    idx = torch.arange(S)
    nst = torch.full((S,), ns, dtype=torch.int32)
    d.observe(idx, nst, torch.zeros_like(nst), tok, total, plen)
    mt = torch.zeros(S, d.block, dtype=torch.int64)
    return d.propose(idx, nst, mt, torch.full((S, d.block), conf_m, dtype=torch.float32), tok, total, plen,
                     d.table, d.draft_ms(S), ran_model=ran)


def test_skipped_step_publishes_the_ngram_chains_and_keeps_the_last_dspark_chain():
    d, tok, plen = _drafter()
    total = torch.full((4,), 140, dtype=torch.int32)
    _step(d, tok, plen, total, 0.9)
    kept = d.model_conf_last[:4].clone()
    p = _step(d, tok, plen, total + 2, 0.2, ran=False)
    assert bool(p.use_ngram.all()) and bool((p.ngram_len > 7).any())  # chains past DSpark's block
    assert p.conf.shape == (4, 32) and bool((p.conf[:, :1] > 0).all())
    assert torch.equal(d.model_conf_last[:4], kept)  # a skipped pass drafted nothing: the last chain stays
    assert d.skipped == 1 and d.steps == 2


def test_plan_skip_is_the_simulators_hybrid_decision_on_the_host_copies():
    decisions = []
    # a strong DSpark chain beside no n-gram match runs; a useless one beside long copies is skipped
    for conf_m, copies in ((0.9, False), (0.01, True)):
        d, tok, plen = _drafter(copies=copies)
        total = torch.full((4,), 140, dtype=torch.int32)
        assert d.plan_skip([0, 1, 2, 3])  # no skip cost known: DSpark runs
        skip_ms = 0.5
        d.set_skip_table(np.full(5, skip_ms))
        _step(d, tok, plen, total, conf_m)
        total = total + 2
        slots = [0, 1, 2, 3]
        view = HostView(stale_chains={"dspark": (d.model_conf_last[slots], d.model_len_last[slots]),
                                      "ngram": (d.ngram_conf_last[slots], d.ngram_len_last[slots])},
                        scheduled_len={"dspark": torch.full((4,), 7)}, num_nondraft_tokens=4, verify_cost_ms=d._table_host,
                        draft_cost_ms=4.0, num_sampling_reqs=4, draft_ms_of={"dspark": 4.0 - skip_ms},
                        means={"ngram": d.ngram_conf_sum[slots] / d.ngram_steps[slots][:, None]})
        got = d.plan_skip(slots)
        assert got == plan_skip(view).runs("dspark")
        decisions.append(got)
    assert decisions == [True, False]


def test_a_new_request_in_a_slot_starts_an_empty_skip_history():
    d, tok, plen = _drafter()
    total = torch.full((4,), 140, dtype=torch.int32)
    _step(d, tok, plen, total, 0.5)
    assert bool((d.ngram_steps[:4] == 1).all())
    # slot 0 gets a new request: its output position restarts, observe sees a fresh slot
    total2 = total.clone()
    total2[0] = 71
    _step(d, tok, plen, total2 + 2, 0.5)
    assert int(d.ngram_steps[0]) == 1 and bool((d.ngram_steps[1:4] == 2).all())


def test_a_profiling_step_runs_the_plugins_ops_without_touching_request_state():
    """HybridSpeculator runs padded_step in vLLM's profiling runs so the profiled draft cost includes the plugin's
    step: before the tables arrive (stand-in prices), and without changing any request's state or counter."""
    from real.vllm_plugin import checks

    d = HybridDrafter(HybridSpecConfig(slots=32, skip=True), 4, 32, "cpu", calibrator=CAL, block=7)
    tok = torch.zeros(4, 128, dtype=torch.int32)
    total = torch.full((4,), 64, dtype=torch.int32)
    plen = torch.full((4,), 16, dtype=torch.int32)
    before = [t.clone() for t in (d.pos, d.hits, d.ring, d.last_ngram, d.last_conf, d.reached, d.chosen,
                                  d.ngram_steps, d.model_conf_last)]
    with checks._OpCounter() as ops:
        for ran in (True, False):
            d.padded_step(4, tok, total, plen, ran_model=ran)
    assert ops.total > 100  # the step's ops ran
    after = [d.pos, d.hits, d.ring, d.last_ngram, d.last_conf, d.reached, d.chosen, d.ngram_steps, d.model_conf_last]
    assert all(torch.equal(a[:4], b[:4]) for a, b in zip(before, after))
    assert d.steps == 0 and d.skipped == 0


def _live_view(d, slots):
    """plan_skip's view built from the device state as it is now (what observe left): the definition the host
    copies must reproduce."""
    idx = torch.as_tensor(slots)
    g = {n: getattr(d, n)[idx] for n in ("ngram_steps", "ngram_conf_sum", "ngram_conf_last", "ngram_len_last",
                                         "model_steps", "model_ran_last", "model_conf_last", "model_conf_sum",
                                         "model_len_last")}
    m_mean = (g["model_conf_sum"] / g["model_steps"].clamp(min=1)[:, None]).float()
    stale_m = torch.where(g["model_ran_last"][:, None], g["model_conf_last"], m_mean)
    stale_m = torch.where((g["model_steps"] == 0)[:, None], 1.0, stale_m)
    mean = g["ngram_conf_sum"] / g["ngram_steps"].clamp(min=1)[:, None].double()
    return (stale_m, torch.where(g["model_steps"] == 0, d.block, g["model_len_last"]), g["ngram_conf_last"],
            torch.where(g["ngram_steps"][:, None] > 0, mean, g["ngram_conf_last"].double()))


def test_plan_skip_reads_the_last_steps_host_copies_and_restarts_a_new_request(monkeypatch):
    """plan_skip reads host copies taken at the end of the last propose (on CUDA: pinned, asynchronous), not the
    device state; a request new in its slot (a new request id there) gets the empty history observe gives it on
    the device, so the view equals the one the device state after observe gives."""
    import sim.core.policies.hybrid as sh

    seen = []
    real_plan = sh.plan_skip
    monkeypatch.setattr(sh, "plan_skip", lambda view, *a, **k: seen.append(view) or real_plan(view, *a, **k))
    d, tok, plen = _drafter()
    d.set_skip_table(np.full(5, 0.5))
    total = torch.full((4,), 140, dtype=torch.int32)
    slots, ids = [0, 1, 2, 3], ["a", "b", "c", "d"]
    d.plan_skip(slots, req_ids=ids)
    for i, c in enumerate((0.8, 0.4)):
        _step(d, tok, plen, total + 2 * i, c)
        d.plan_skip(slots, req_ids=ids)
    d.ngram_conf_last.fill_(0.123)  # the device state changes after the copy: plan_skip does not see it
    d.plan_skip(slots, req_ids=ids)
    assert torch.equal(seen[-1].stale_chains["ngram"][0], seen[-2].stale_chains["ngram"][0])
    assert not bool((seen[-1].stale_chains["ngram"][0] == 0.123).any())
    d.ngram_conf_last.copy_(d._skip_host["ngram_conf_last"])
    # slot 0 gets request "e": observe restarts its history on the device; the host copies predate it
    total2 = total + 4
    total2[0] = 73
    idx = torch.arange(4)
    nst = torch.full((4,), 2, dtype=torch.int32)
    d.observe(idx, nst, torch.zeros_like(nst), tok, total2, plen)
    assert int(d.ngram_steps[0]) == 0 and int(d._skip_host["ngram_steps"][0]) == 2
    d.plan_skip(slots, req_ids=["e", "b", "c", "d"])
    want = _live_view(d, slots)
    got = seen[-1]
    for w, g in zip(want, (*got.stale_chains["dspark"], got.stale_chains["ngram"][0], got.means.get("ngram"))):
        assert torch.allclose(g.to(w.dtype), w)
    d.plan_skip(slots, req_ids=["e", "b", "c", "d"])  # the same requests again: no longer new, the copies stand
    assert bool((seen[-1].means.get("ngram")[0] != want[3][0]).any())


def test_the_plugin_publishes_its_tail_past_the_chosen_chain():
    """hybrid_spec.tail = c: the published confidences past each row's chosen chain (here DSpark's 7-slot block of
    W = 32: no copies, so no n-gram chain) are c (0 by default), the chain's own unchanged."""
    import real.vllm_plugin.hybrid as ph

    out = {}
    for tail in (0.0, 0.25):
        d, tok, plen = _drafter(copies=False)
        d.cfg = dataclasses.replace(d.cfg, tail=tail)
        out[tail] = _step(d, tok, plen, torch.full((4,), 140, dtype=torch.int32), 0.9)
    zero, with_tail = out[0.0], out[0.25]
    assert torch.equal(zero.use_ngram, with_tail.use_ngram)
    length = torch.where(zero.use_ngram, zero.ngram_len.clamp(max=32), torch.full_like(zero.ngram_len, 7))
    past = torch.arange(32)[None] >= length[:, None]
    assert bool(past.any())
    assert bool((zero.conf[past] == 0).all()) and bool((with_tail.conf[past] == 0.25).all())
    assert torch.equal(zero.conf[~past], with_tail.conf[~past])
    assert ph.FILLER_TOKEN == 0


def test_dspark_block_reads_nested_dflash_then_eagle_config_first_as_vllm_does():
    """vLLM 0.33 reads a Qwen3 DSpark value from dflash_config, then eagle_config, then the top level: a block kept
    only in a nested section is DSpark's block (else the plugin would build DSpark at W tokens)."""
    from real.vllm_plugin.config import HybridSpecConfig, trained_block

    assert HybridSpecConfig.dspark_block(NS(dflash_config={"block_size": 5}), 32) == 5
    assert HybridSpecConfig.dspark_block(NS(eagle_config={"block_size": 6}, block_size=9), 32) == 6
    assert trained_block({"dflash_config": {"block_size": 5}, "eagle_config": {"block_size": 6}, "block_size": 9}) == 5
    assert trained_block({"dflash_config": {"dspark_block_size": 4}, "block_size": 9}) == 9  # each name everywhere first
    assert trained_block({"eagle_config": NS(dspark_block_size=3)}) == 3 and trained_block({}) is None
    with pytest.raises(ConfigError, match=r"dflash_config.block_size 0"):
        trained_block({"dflash_config": {"block_size": 0}})
    monkey = _vllm_config(32, None)
    monkey.speculative_config.draft_model_config.hf_config = NS(dflash_config={"block_size": 40})
    with pytest.raises(ConfigError, match=r"smaller than DSpark's trained block \(40\)"):
        plugin.hybrid_config(monkey)
