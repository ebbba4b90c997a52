"""`adaptive` decides as vLLM 0.33's adaptive verification does (no vLLM needed).

Hand-computed cases for each rule, each failing on the simulator's former behaviour:
  (a) N counts every request that samples a token (decoding + prefill chunks completing their prefill);
  (b) the budget is capped by the verification logits buffer: 2**30 // (vocab * 4) - scheduled requests;
  (c) stale survivals are masked with this step's draft count, not the stale chain's length;
  (d) a request's stale confidences are 1.0 on its first decode step after admission or resume;
plus: decisions use the start-up profiled verify table (independent of the step's context) while the
engine charges the true cost, and `adaptive` equals an independent loop implementation of vLLM's
get_num_tokens + top-k on random batches.
"""
import dataclasses

import numpy as np
import torch

from conftest import LinearCost, random_requests
from sim.core.cost import make_cost_model
from sim.core.drafters.calibration import KNOTS, NgramCalibrator
from sim.core.drafters.model import ModelDrafterProfile
from sim.core.drafters.ngram import NgramConfig
from sim.core.drafters.tables import build_draft_tables
from sim.engine.engine import Engine, EngineConfig
from sim.core.policies import CHAIN_MODEL, StepBatch
from sim.engine.policies import sim_policy
from sim.core.policies.registry import Policy


def batch(cur, stale, model_len=None, T=None, table=None, draft=0.0, n_sampling=None, cap=None):
    mc = torch.tensor(cur, dtype=torch.float32)
    R, K = mc.shape
    ml = torch.tensor(model_len if model_len is not None else [K] * R)
    return StepBatch(
        chains={"dspark": (mc, ml), "ngram": (torch.zeros(R, 1), torch.zeros(R, dtype=torch.int64))},
        stale_chains={"dspark": (torch.tensor(stale, dtype=torch.float32), torch.full((R,), K)),
                      "ngram": (torch.zeros(R, 1), torch.zeros(R, dtype=torch.int64))},
        num_nondraft_tokens=R if T is None else T,
        verify_cost_ms=torch.tensor(table if table is not None else [10.0 + t for t in range(64)], dtype=torch.float64),
        draft_cost_ms=draft, num_sampling_reqs=n_sampling, max_draft_tokens=cap)


def admitted(b, spec="adaptive"):
    return sim_policy(spec)(b).admitted.tolist()


# --- (a) sampling count ---------------------------------------------------------------------------

def test_a_goodput_counts_prefill_chunks_that_sample():
    # one decoding request, stale = current survivals 0.5, 0.25; T = 3 (the decode token + two prefill
    # tokens), verify[t] = 10 + t, draft 0: G_B = (N + S_1..S_B) / (13 + B).
    # N = 1 (decoding only): G0 = 1/13 = .0769, G1 = 1.5/14 = .1071, G2 = 1.75/15 = .1167 -> B* = 2.
    # N = 4 (+ three prefill chunks that finish their prompt and sample): G0 = 4/13 = .3077,
    # G1 = 4.5/14 = .3214, G2 = 4.75/15 = .3167 -> B* = 1.
    conf = [[0.5, 0.5]]
    assert admitted(batch(conf, conf, T=3)) == [2]
    assert admitted(batch(conf, conf, T=3, n_sampling=1)) == [2]
    assert admitted(batch(conf, conf, T=3, n_sampling=4)) == [1]


def test_a_engine_counts_finishing_prefill_chunks():
    seen = []
    pol = _spy("adaptive", lambda b: seen.append((b.num_reqs, b.num_sampling_reqs, b.num_nondraft_tokens)))
    rng = np.random.default_rng(3)
    reqs = random_requests(rng, 5, max_prompt=30, max_out=30)
    arrivals = np.array([0.0, 0.0, 0.05, 0.06, 0.07])
    Engine(_tables(reqs), arrivals, pol, LinearCost(), EngineConfig(batch_size=5, max_num_batched_tokens=20)).run()
    assert all(n >= r for r, n, _ in seen)
    assert any(n > r for r, n, _ in seen)  # some decode step also finished a prefill
    assert all(n - r <= t - r for r, n, t in seen)  # each sampling prefill chunk brings >= 1 token


# --- (b) logits-buffer cap ------------------------------------------------------------------------

def test_b_budget_capped_by_logits_buffer():
    # three requests at 0.9 per slot, flat verify table: every slot pays, B* = 12 without a cap.
    # cap 5: B* = 5 = the three 0.9 slots + two 0.81 slots (ties by row order) -> [2, 2, 1].
    conf = [[0.9] * 4] * 3
    flat = [10.0] * 64
    assert admitted(batch(conf, conf, table=flat)) == [4, 4, 4]
    assert admitted(batch(conf, conf, table=flat, cap=5)) == [2, 2, 1]
    assert sum(admitted(batch(conf, conf, table=flat, cap=5), "adaptive:early-stop")) == 5
    assert admitted(batch(conf, conf, table=flat, cap=0)) == [0, 0, 0]
    b = batch(conf, conf, table=flat, cap=5)
    b.chains["ngram"] = (torch.full((3, 6), 0.95), torch.tensor([6, 0, 0]))
    b.stale_chains["ngram"] = (b.chains["ngram"][0].clone(), b.chains["ngram"][1].clone())
    assert sum(admitted(b, "hybrid-price")) == 5  # hybrid-price's stale budget is capped the same way


def test_b_cap_is_an_argmax_over_the_truncated_curve():
    # the cap truncates the goodput curve (vLLM slices scores[:cap]), it does not clamp the optimum:
    # survivals sorted .9, .81, .729, .6561; table 10, 10, 10 (t <= 3), then 30, then 10.5 is impossible
    # (monotone), so use verify[t] = 10 for t <= 2, 11 at 3, 11 at 4, 11 at 5: T = 1, draft 0.
    # G0 = 1/10, G1 = 1.9/10 = .19, G2 = 2.71/11 = .2464, G3 = 3.439/11 = .3126, G4 = 4.0951/11 = .3723
    # cap 1 -> B = 1; cap 3 -> B = 3.
    conf = [[0.9] * 4]
    table = [10.0, 10.0, 10.0, 11.0, 11.0, 11.0] + [20.0] * 10
    assert admitted(batch(conf, conf, T=1, table=table)) == [4]
    assert admitted(batch(conf, conf, T=1, table=table, cap=1)) == [1]
    assert admitted(batch(conf, conf, T=1, table=table, cap=3)) == [3]


def test_b_engine_passes_vllm_cap_for_qwen3_vocab():
    seen = []
    pol = _spy("adaptive", lambda b: seen.append((b.num_reqs, b.max_draft_tokens)))
    reqs = random_requests(np.random.default_rng(4), 3, max_prompt=10, max_out=20)
    cost = make_cost_model("roofline", llm="qwen3-8b", gpu="h100-sxm")
    assert cost.vocab_size == 151936
    Engine(_tables(reqs), np.zeros(3), pol, cost, EngineConfig(batch_size=3)).run()
    per_row = 2**30 // (151936 * 4)  # 1766 logits rows
    assert seen and all(cap <= per_row - r and cap >= per_row - 3 for r, cap in seen)
    # with K = 7 drafts the cap binds from R = 221 requests: 7 R > 1766 - R
    assert 7 * 220 <= per_row - 220 and 7 * 221 > per_row - 221


# --- (c) stale mask ---------------------------------------------------------------------------------

def test_c_stale_survivals_masked_with_current_draft_count():
    # request 0 is at the end of its output: 1 draft scheduled now (model_len 1), 3 in the stale chain.
    # stale survivals: row0 .9 (only slot 0 counts now), row1 .3, .09, .027; T = 2, verify[t] = 10 + t.
    # Sorted .9, .3, .09, .027: G0 = 2/12 = .1667, G1 = 2.9/13 = .2231, G2 = 3.2/14 = .2286,
    # G3 = 3.29/15 = .2193 -> B* = 2. (Masking with the stale length 3 would rank .9, .81, .729, .3 and
    # give B* = 4: G4 = 4.739/16 = .2962 > G3 = 4.439/15 = .2959.)
    # Current survivals: row0 .9 (length 1), row1 .5, .25, .125 -> top-2 = row0 slot 0, row1 slot 0.
    b = batch([[0.9] * 3, [0.5] * 3], [[0.9] * 3, [0.3] * 3], model_len=[1, 3])
    assert admitted(b) == [1, 1]


# --- (d) stale reset on admission and resume -------------------------------------------------------

def test_d_stale_confidences_reset_on_admission_and_resume():
    rng = np.random.default_rng(5)
    reqs = random_requests(rng, 6, max_prompt=60, max_out=120)
    tb = _tables(reqs)
    tb.m_conf[:] = 0.3  # any stale row the engine reads from the tables is 0.3; a reset row is 1.0
    cap = int(max(r.prompt_len + r.output_len for r in reqs)) + 64
    eng = None
    last_preempt = {}  # request -> its preemption count at its previous decode step
    checks = {"admission": 0, "resume": 0, "steady": 0}

    def look(b):
        dec = scheduled["decoding"]  # the rows of this StepBatch, in order
        stale = b.stale_chains["dspark"][0].numpy()
        for i, r in enumerate(dec):
            r = int(r)
            first = r not in last_preempt
            resumed = not first and eng.n_preempt[r] > last_preempt[r]
            if first or resumed:
                assert np.all(stale[i] == 1.0), (r, "first" if first else "resumed")
                checks["admission" if first else "resume"] += 1
            else:
                assert np.all(stale[i] == np.float32(0.3)), r
                checks["steady"] += 1
            last_preempt[r] = int(eng.n_preempt[r])

    eng = Engine(tb, np.zeros(len(reqs)), _spy("adaptive", look), LinearCost(),
                 EngineConfig(batch_size=6, kv_capacity_tokens=cap))
    scheduled, schedule = {}, eng._schedule

    def spy_schedule():
        out = schedule()
        scheduled["decoding"] = out.decoding
        return out
    eng._schedule = spy_schedule
    res = eng.run()
    assert res.lossless and res.requests["preemptions"].sum() > 0
    assert checks["admission"] > 0 and checks["resume"] > 0 and checks["steady"] > 0


def test_d_a_prefill_in_chunks_reads_a_chunks_confidences_not_the_reset():
    """vLLM's drafter runs on a partial prefill chunk's row too and publishes its confidences; the budget of the first
    decode step reads the publication of the step before the last chunk, so under --scheduler vllm only a prefill
    done in one step leaves the reset 1.0 (the engine's `fresh` mark is cleared by a chunk that does not finish it);
    the project's engines reset the row whatever the chunks."""
    rng = np.random.default_rng(7)
    reqs = random_requests(rng, 6, max_prompt=90, max_out=40)
    for scheduler in ("vllm", "hybridspec"):
        tb = _tables(reqs)
        tb.m_conf[:] = 0.3
        chunks: dict = {}  # request -> prefill chunks since it was (re)admitted
        seen = {"one": 0, "chunked": 0}
        scheduled: dict = {}

        def look(b):
            stale = b.stale_chains["dspark"][0].numpy()
            for i, r in enumerate(scheduled["decoding"]):
                n = chunks.pop(int(r), None)
                if n is None:
                    continue  # not its first decode step
                reset = n == 1 or scheduler == "hybridspec"
                assert np.all(stale[i] == (1.0 if reset else np.float32(0.3))), (scheduler, r, n)
                seen["one" if n == 1 else "chunked"] += 1

        inner = sim_policy("adaptive")
        spy = dataclasses.replace(inner, fn=lambda b: (look(b), inner.fn(b))[1])  # keeps its vLLM counterpart
        eng = Engine(tb, np.zeros(len(reqs)), spy, LinearCost(),
                     EngineConfig(batch_size=3, max_num_batched_tokens=48, kv_capacity_tokens=1 << 16,
                                  scheduler=scheduler))
        schedule = eng._schedule

        def spy_schedule():
            out = schedule()
            scheduled["decoding"] = out.decoding
            for r, _ in out.prefilling:
                chunks[int(r)] = chunks.get(int(r), 0) + 1
            return out
        eng._schedule = spy_schedule
        assert eng.run().lossless
        assert seen["one"] > 0 and seen["chunked"] > 0, (scheduler, seen)


def test_e_vllm_schedules_and_publishes_the_whole_model_chain_near_a_requests_end():
    """vLLM's scheduler gives every decoding request its num_speculative_tokens and its drafter does not know
    max_tokens: under --scheduler vllm the model chain's scheduled length and the stale chain's stay K near a
    request's end (what is accepted still ends there); the project's engines cut both to the output left."""
    rng = np.random.default_rng(3)
    reqs = random_requests(rng, 5, max_prompt=40, max_out=30)
    for scheduler, whole in (("vllm", True), ("hybridspec", False)):
        tb = _tables(reqs)
        K = tb.k_model
        near_end = []

        def look(b):
            near_end.append((b.chains["dspark"][1].numpy().min(), b.stale_chains["dspark"][1].numpy().min()))

        inner = sim_policy("adaptive")
        spy = dataclasses.replace(inner, fn=lambda b: (look(b), inner.fn(b))[1])  # keeps its vLLM counterpart
        res = Engine(tb, np.zeros(len(reqs)), spy, LinearCost(), EngineConfig(batch_size=2, scheduler=scheduler)).run()
        assert res.lossless and int(res.steps["emitted"].sum()) == int(tb.out_len.sum())
        shortest = min(c for c, _ in near_end), min(o for _, o in near_end)
        if whole:
            assert shortest == (K, K)
        else:
            assert shortest[0] < K and shortest[1] < K


# --- decisions from the start-up table, true cost charged --------------------------------------------

class ContextHeavy(LinearCost):
    """Same GPU profile as LinearCost, but every step's true cost grows 100x faster with its context."""

    def verify_ms(self, num_tokens, kv_tokens, num_seqs, logit_rows=None):
        return super().verify_ms(num_tokens, kv_tokens, num_seqs) + 1e-3 * kv_tokens

    def startup_verify_table(self, *args, **kw):
        return LinearCost().startup_verify_table(*args, **kw)


def test_decisions_ignore_the_step_context_and_charging_uses_it():
    rng = np.random.default_rng(9)
    reqs = random_requests(rng, 6, max_prompt=200, max_out=80)
    tb = _tables(reqs)
    tables = []
    pol = _spy("adaptive", lambda b: tables.append(b.verify_cost_ms))
    cfg = EngineConfig(batch_size=3)
    base = Engine(tb, np.zeros(6), pol, LinearCost(), cfg)
    r1 = base.run()
    heavy = Engine(tb, np.zeros(6), sim_policy("adaptive"), ContextHeavy(), cfg).run()
    s1, s2 = r1.steps, heavy.steps
    # every step decided with the one start-up table, although the context changed from step to step
    assert len({id(t) for t in tables}) == 1 and len(np.unique(s1["kv_tokens"])) > 5
    assert torch.equal(tables[0], torch.from_numpy(LinearCost().startup_verify_table(
        cfg.max_num_batched_tokens, cfg.batch_size, 1 + tb.k_model,
        length=cfg.max_num_batched_tokens + cfg.batch_size * max(tb.k_model, tb.k_ngram) + 2)))
    # the same decisions whatever the true context cost ...
    for col in ("num_decode", "prefill_tokens", "verified_model", "accepted_model", "emitted", "kv_tokens"):
        assert np.array_equal(s1[col], s2[col]), col
    # ... but each step is charged its true cost at its own context, padded to its CUDA-graph size
    assert np.allclose(s2["verify_ms"] - s1["verify_ms"], 1e-3 * s1["kv_tokens"])
    tokens = s1["num_decode"] + s1["prefill_tokens"] + s1["verified_model"]
    lin = LinearCost()  # (LinearCost ignores num_seqs)
    assert np.allclose(s1["verify_ms"], [lin.verify_ms(lin.graph_tokens(t), k, 1) for t, k in zip(tokens, s1["kv_tokens"])])


def test_startup_table_is_vllms_profile():
    c = make_cost_model("roofline", llm="qwen3-8b", gpu="h100-sxm")
    tab = c.startup_verify_table(8192, 4, 8)
    caps = c.capture_sizes
    # below the largest capture size: the cost of the next capture size, at 8192 cached tokens per dummy request
    for t in (1, 3, 5, 9, 100, 500):
        nxt = min(x for x in caps if x >= t)
        n = min(nxt, 4)
        assert np.isclose(tab[t], c.verify_ms(nxt, n * 8192, n))
    # above it: interpolation between the profile points above the limit (768, 1024, 2048, 4096, 8192)
    y = {x: c.verify_ms(x, 4 * 8192, 4) for x in (768, 1024, 2048)}
    assert np.isclose(tab[600], y[768]) and np.isclose(tab[768], y[768])
    assert np.isclose(tab[1536], (y[1024] + y[2048]) / 2)
    assert np.all(np.diff(tab[1:]) >= 0)
    free = c.startup_verify_table(8192, 4, 8, context_len=0)
    assert np.isclose(free[8], c.verify_ms(8, 0, 4)) and free[8] < tab[8]


# --- an independent implementation of vLLM's decision ---------------------------------------------

def vllm_reference(stale, cur, scheduled, T, n_sampling, cap, verify, draft_ms):
    """Plain loops, as vLLM 0.33's get_num_tokens (budget) and _assign_draft_token_budget (top-k)."""
    R, K = len(stale), len(stale[0])
    scores = []
    for r in range(R):
        s = 1.0
        for j in range(K):
            s *= float(stale[r][j])
            if j < scheduled[r]:
                scores.append(s)
    scores.sort(reverse=True)
    limit = min(sum(scheduled), max(0, cap))
    best, best_g, gain = 0, -1.0, float(n_sampling)
    for B in range(limit + 1):
        if B:
            gain += scores[B - 1]
        g = gain / (draft_ms + float(verify[min(T + B, len(verify) - 1)]))
        if g > best_g:
            best, best_g = B, g
    slots = []
    for r in range(R):
        s = 1.0
        for j in range(int(scheduled[r])):
            s *= float(cur[r][j])
            slots.append((s, r))
    slots.sort(key=lambda x: -x[0])
    counts = [0] * R
    for s, r in slots[:best]:
        counts[r] += 1
    return best, counts, sorted(s for s, _ in slots[:best])


def test_adaptive_equals_an_independent_vllm_reference():
    rng = np.random.default_rng(21)
    cost = make_cost_model("roofline", llm="qwen3-8b", gpu="h100-sxm")
    tables = {bs: cost.startup_verify_table(8192, bs, 8, length=8192 + bs * 7 + 2) for bs in (4, 16, 128)}
    pol = sim_policy("adaptive")
    for it in range(400):
        bs = int(rng.choice([4, 16, 128]))
        R, K = int(rng.integers(1, bs + 1)), 7
        stale = rng.beta(rng.uniform(0.5, 6), 1.0, size=(R, K)).astype(np.float32)
        cur = rng.beta(rng.uniform(0.5, 6), 1.0, size=(R, K)).astype(np.float32)
        scheduled = np.where(rng.random(R) < 0.8, K, rng.integers(0, K + 1, R))
        prefill = int(rng.integers(0, 3)) * int(rng.integers(0, 200))
        T = R + prefill
        n_sampling = R + int(rng.integers(0, 3 if prefill else 1))
        cap = int(rng.choice([10**6, int(rng.integers(0, R * K + 2))]))
        draft = float(rng.uniform(0.0, 3.0))
        verify = tables[bs]
        b = StepBatch(
            chains={"dspark": (torch.from_numpy(cur), torch.from_numpy(scheduled.astype(np.int64))),
                    "ngram": (torch.zeros(R, 1), torch.zeros(R, dtype=torch.int64))},
            stale_chains={"dspark": (torch.from_numpy(stale), torch.full((R,), K)),
                          "ngram": (torch.zeros(R, 1), torch.zeros(R, dtype=torch.int64))}, num_nondraft_tokens=T,
            verify_cost_ms=torch.from_numpy(verify), draft_cost_ms=draft, num_sampling_reqs=n_sampling,
            max_draft_tokens=cap)
        a = pol(b)
        budget, counts, won = vllm_reference(stale, cur, scheduled, T, n_sampling, cap, verify, draft)
        got = a.admitted.numpy()
        assert int(got.sum()) == budget, it  # budgets exactly
        surv = np.cumprod(cur.astype(np.float64), 1)
        mine = sorted(float(surv[r, j]) for r in range(R) for j in range(got[r]))
        # allocations up to ties: the same multiset of admitted survivals (float32 cumprod vs float64)
        assert np.allclose(mine, won, rtol=1e-5, atol=1e-7), it
        if len(set(np.round(won, 5))) == len(won) and budget < int(scheduled.sum()):
            assert got.tolist() == counts, it  # no (near-)ties among the winners: the same slots
        assert all(a.chain[r] == CHAIN_MODEL for r in range(R) if got[r] > 0)


# --- helpers ----------------------------------------------------------------------------------------

def _spy(spec, see):
    inner = sim_policy(spec)

    def fn(b):
        see(b)
        return inner.fn(b)
    return Policy(inner.name, fn, uses_model=inner.uses_model, uses_ngram=inner.uses_ngram)


_CFG = NgramConfig(n_min=1, n_max=3, k=6, ext_max=16)


def _tables(reqs, seed=0):
    w = np.zeros(len(KNOTS) + 11)
    w[0], w[1], w[1 + len(KNOTS)] = -0.5, 1.0, -0.3
    return build_draft_tables(reqs, _CFG, ModelDrafterProfile(name="t", block=4), NgramCalibrator(w, _CFG), seed=seed)
