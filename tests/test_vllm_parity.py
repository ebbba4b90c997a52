"""Parity of `adaptive` with vLLM 0.33.0's AdaptiveVerificationManager (run with `pytest -m vllm`).

Builds the manager without its CUDA __init__ (object.__new__ plus the attributes get_num_tokens reads),
runs its get_num_tokens (budget, on CPU numpy) and _assign_draft_token_budget (top-k, on CPU tensors)
on 3,000 random batches, and compares with the simulator's `adaptive` on the same inputs. Budgets must
match exactly; allocations are compared up to ties (torch.topk leaves the order of equal survivals
unspecified, the simulator's stable sort takes the lower flat index): the multisets of admitted survivals
must match, and the per-request counts whenever no two winning survivals are (nearly) equal.
"""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sim.core.cost import make_cost_model
from sim.core.policies import StepBatch, get_policy

from conftest import vllm_modules

pytestmark = pytest.mark.vllm

(av, _rs), needs_vllm = vllm_modules("vllm.v1.worker.gpu.spec_decode.adaptive_verification",
                                    "vllm.v1.worker.gpu.spec_decode.rejection_sampler")

K = 7
VOCAB = 151936  # qwen3


def _manager(max_num_reqs, stale, verify_table, draft_table, computed, prefill_len):
    m = object.__new__(av.AdaptiveVerificationManager)
    m.num_speculative_steps = K
    m.num_bonus_tokens = 1
    m._max_total_logits = _rs.get_max_chunk_logits(VOCAB)
    m.cost_tables = (draft_table, verify_table)
    m._cudagraph_limit = 0
    m._batch_budget = None
    m._stale_idx = 0
    m._stale_confidences = [SimpleNamespace(np=stale), SimpleNamespace(np=np.ones_like(stale))]
    m.req_states = SimpleNamespace(
        num_speculative_steps=K, max_num_reqs=max_num_reqs,
        req_id_to_index={f"r{i}": i for i in range(len(stale))},
        num_computed_tokens_np=computed, prefill_len=SimpleNamespace(np=prefill_len))
    return m


@needs_vllm
def test_startup_table_matches_vllms_table_builder():
    cost = make_cost_model("roofline", llm="qwen3-8b", gpu="h100-sxm")
    for max_reqs in (4, 128):
        m = object.__new__(av.AdaptiveVerificationManager)
        m.req_states = SimpleNamespace(max_num_batched_tokens=8192, max_num_reqs=max_reqs)
        caps = cost.capture_sizes
        points = sorted({b["num_tokens"] for b in m.batches_to_profile(list(caps))})
        ctx = av.envs.VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN
        curve = []
        for x in points:
            n = min(x, max_reqs, 8192 // (1 + K))
            curve.append((x, float(cost.verify_ms(x, n * ctx, n))))
        _, theirs = av.build_cost_tables_from_curves([(1, 1.0)], curve, max_reqs, 8192, m._cudagraph_limit)
        ours = cost.startup_verify_table(8192, max_reqs, 1 + K, context_len=ctx)
        assert np.allclose(ours[1:], theirs[1:], rtol=1e-12), max_reqs


@needs_vllm
def test_adaptive_matches_vllm_on_random_batches():
    rng = np.random.default_rng(0)
    cost = make_cost_model("roofline", llm="qwen3-8b", gpu="h100-sxm")
    pol = get_policy("adaptive")
    tables = {}
    for it in range(3000):
        bs = int(rng.choice([4, 32, 256]))
        if bs not in tables:
            verify = cost.startup_verify_table(8192, bs, 1 + K)
            draft = np.array([cost.draft_ms(n, K) for n in range(bs + 1)])
            tables[bs] = (verify, draft)
        verify, draft = tables[bs]
        R = int(rng.integers(1, bs + 1))                     # decoding requests
        P = int(rng.integers(0, min(3, bs - R) + 1))          # prefill chunks in the same step
        stale = rng.beta(rng.uniform(0.5, 6), 1.0, size=(R + P, K)).astype(np.float32)
        cur = rng.beta(rng.uniform(0.5, 6), 1.0, size=(R + P, K)).astype(np.float32)
        sched = np.where(rng.random(R) < 0.8, K, rng.integers(0, K + 1, R)).astype(np.int32)
        chunks = rng.integers(1, 300, P)
        finishing = rng.random(P) < 0.5
        # vLLM's view: per-request scheduled tokens, drafts, computed and prefill lengths
        ids = [f"r{i}" for i in range(R + P)]
        num_tokens = {ids[i]: int(1 + sched[i]) for i in range(R)}
        num_tokens.update({ids[R + j]: int(chunks[j]) for j in range(P)})
        drafts = {ids[i]: [0] * int(sched[i]) for i in range(R) if sched[i] > 0}
        computed = np.zeros(R + P, dtype=np.int32)
        prefill_len = np.zeros(R + P, dtype=np.int32)
        computed[:R] = rng.integers(10, 5000, R)
        prefill_len[:R] = computed[:R] - rng.integers(0, 10, R)
        computed[R:] = rng.integers(0, 4000, P)
        prefill_len[R:] = computed[R:] + chunks + np.where(finishing, 0, rng.integers(1, 100, P))
        if not drafts:
            continue  # vLLM only calls get_num_tokens when some request has drafts
        m = _manager(bs, stale, verify, draft, computed, prefill_len)
        m.get_num_tokens(num_tokens, drafts)
        budget = m._batch_budget[2]
        caps = torch.tensor(np.concatenate([sched, np.zeros(P, np.int32)]))
        if 0 < budget < int(sched.sum()):
            av._assign_draft_token_budget(torch.from_numpy(cur), torch.arange(R + P), caps, budget, K)
        elif budget == 0:
            caps.zero_()
        theirs = caps.numpy()[:R]
        # the simulator's view of the same step
        b = StepBatch(
            chains={"dspark": (torch.from_numpy(cur[:R]), torch.from_numpy(sched.astype(np.int64))),
                    "ngram": (torch.zeros(R, 1), torch.zeros(R, dtype=torch.int64))},
            stale_chains={"dspark": (torch.from_numpy(stale[:R]), torch.full((R,), K)),
                          "ngram": (torch.zeros(R, 1), torch.zeros(R, dtype=torch.int64))},
            num_nondraft_tokens=R + int(chunks.sum()), verify_cost_ms=torch.from_numpy(verify),
            draft_cost_ms=float(draft[R + P]), num_sampling_reqs=R + int(finishing.sum()),
            max_draft_tokens=max(0, _rs.get_max_chunk_logits(VOCAB) - (R + P)))
        ours = pol(b).admitted.numpy()
        assert int(ours.sum()) == budget, it
        surv = np.cumprod(cur[:R], 1)
        won_ours = sorted(float(surv[r, j]) for r in range(R) for j in range(ours[r]))
        won_theirs = sorted(float(surv[r, j]) for r in range(R) for j in range(theirs[r]))
        assert np.allclose(won_ours, won_theirs, rtol=1e-6), it
        if len(set(np.round(won_theirs, 6))) == len(won_theirs):
            assert ours.tolist() == theirs.tolist(), it
