"""The trained model drafter (real/drafter/): shapes and causality, calibration, loading and its errors, a
training smoke test, and the live drafter in the real engine replaying exactly in the simulator.

Everything here runs a small drafter on the 2-layer random-weight test target (models/llms/qwen3-tiny.json);
the bundled SmolLM2 drafter's own checks (file, sha256, figures) are at the end, skipped when it is absent.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from real.drafter.data import Sequence, generate_group
from real.drafter.evaluate import fit_sts, metrics, output_chains
from real.drafter.model import DEFAULT_DRAFTER, DrafterConfig, DSparkDrafter, load_drafter, save_drafter
from real.drafter.runtime import DrafterCache
from real.drafter.train import TrainConfig, heldout_loss, prepare, reduced_vocab, train
from sim.infra.errors import ConfigError

TINY = dict(target="qwen3-tiny", target_vocab=4096, hidden=128, layers=(0, 1), block=5, heads=4, kv_heads=2,
            head_dim=32, intermediate=256, vocab=512, rank=16)


@pytest.fixture(scope="module")
def target():
    from real.engine.weights import build_model

    torch.manual_seed(0)
    m, _ = build_model("qwen3-tiny", "cpu", torch.float32, max_slots=4, max_len=256)
    return m


@pytest.fixture(scope="module")
def seqs(target):
    """Four greedy generations of the tiny target with its hidden states (the training data's format)."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 4096, size=n) for n in (40, 25, 60, 33)]
    return generate_group(target, prompts, 30, eos_id=-1, layers=(0, 1))


def tiny_drafter(target, seqs, seed=0) -> DSparkDrafter:
    torch.manual_seed(seed)
    d = DSparkDrafter(DrafterConfig(**TINY))
    d.set_vocab(reduced_vocab(seqs, 512))
    d.attach_target(target.tok_embeddings.weight)
    return d


def test_training_data_is_the_targets_greedy_output(seqs):
    for s in seqs:
        P = s.prompt_len
        assert len(s.tokens) == P + 30 and len(s.greedy) == len(s.tokens) - 1
        assert np.array_equal(s.greedy[P - 1:], s.tokens[P:])  # generated part: g_j = t_{j+1}
        assert s.feats.shape == (len(s.greedy), 2 * 128)


def test_labels_are_valid_only_on_the_accepted_prefix():
    t = np.array([5, 6, 7, 8, 9, 10], dtype=np.int32)
    g = np.array([6, 7, 0, 9, 10], dtype=np.int32)  # the target disagrees with the text at position 3
    st = prepare(Sequence(t, g, torch.zeros(5, 4, dtype=torch.float16), 2), 3)
    # anchor 1: slot 0 label g_1 = 7 (valid), slot 1 needs t_2 == g_1: 7 == 7 -> g_2 = 0 valid,
    # slot 2 needs t_3 == g_2: 8 != 0 -> invalid
    assert st.labels[1].tolist() == [7, 0, 9] and st.valid[1].tolist() == [True, True, False]
    assert st.valid[4].tolist() == [True, False, False]  # past the forwarded tokens


def test_drafts_never_depend_on_tokens_after_the_anchor(target, seqs):
    d = tiny_drafter(target, seqs)
    s = seqs[0]
    anchors = torch.arange(10, 50)
    from real.drafter.evaluate import draft_positions

    tok0, conf0, _ = draft_positions(d, prepare(s, 5), anchors)
    a = 30  # perturb everything after anchor 30: its draft and every earlier one must not change
    t2 = s.tokens.copy()
    t2[a + 1:] = (t2[a + 1:] + 7) % 4096
    f2 = s.feats.clone()
    f2[a:] = torch.randn_like(f2[a:].float()).half()
    tok1, conf1, _ = draft_positions(d, prepare(Sequence(t2, s.greedy, f2, s.prompt_len), 5), anchors)
    keep = anchors <= a
    assert torch.equal(tok0[keep], tok1[keep]) and torch.allclose(conf0[keep], conf1[keep])
    assert not torch.equal(tok0[~keep], tok1[~keep])  # and later ones do see the change
    assert tok0.shape == (40, 5) and ((conf0 >= 0) & (conf0 <= 1)).all()


def test_engine_cache_drafts_equal_whole_sequence_drafts(target, seqs):
    """The runtime cache, fed row by row as an engine would, drafts what the whole-sequence pass drafts."""
    from real.drafter.evaluate import draft_positions

    d = tiny_drafter(target, seqs)
    s = seqs[2]
    st = prepare(s, 5)
    cache = DrafterCache(d, 2, 128)
    n = len(s.greedy)
    nxt = torch.from_numpy(s.tokens[1:].astype(np.int64))
    cache.append(torch.ones(20, dtype=torch.int64), torch.arange(20), s.feats[:20], nxt[:20])
    got = [cache.draft(torch.tensor([1]), torch.tensor([int(s.tokens[20])])).tokens[0]]
    for j in range(20, n - 1, 3):  # chunks of 3 rows, like accepted drafts
        rows = torch.arange(j, min(j + 3, n - 1))
        cache.append(torch.ones(len(rows), dtype=torch.int64), rows, s.feats[rows], nxt[rows])
        got.append(cache.draft(torch.tensor([1]), torch.tensor([int(s.tokens[rows[-1] + 1])])).tokens[0])
    anchors = torch.tensor([20] + [min(j + 3, n - 1) for j in range(20, n - 1, 3)])
    want, _, _ = draft_positions(d, st, anchors)
    assert torch.equal(torch.stack(got), want)


def test_two_training_steps_lower_the_loss_and_resume_from_a_checkpoint(target, seqs, tmp_path):
    d = tiny_drafter(target, seqs)
    st = [prepare(s, 5) for s in seqs]
    before = heldout_loss(d, st)["ce"]
    cfg = TrainConfig(epochs=8.0, anchors=32, accum=2, warmup=1, lr=3e-3, checkpoint_every=1)
    stats = train(d, st, cfg, tmp_path / "ck.pt", progress=False)
    after = heldout_loss(d, st)["ce"]
    assert stats["steps"] == 16 and after < before - 0.5
    # a rerun with the same settings resumes at the last step: nothing left to do, same weights
    d2 = tiny_drafter(target, seqs, seed=1)
    stats2 = train(d2, st, cfg, tmp_path / "ck.pt", progress=False)
    assert stats2["hist"] == stats["hist"]
    assert all(torch.equal(a, b) for a, b in zip(d.state_dict().values(), d2.state_dict().values()))
    with pytest.raises(ConfigError, match="other training settings"):
        train(d2, st, TrainConfig(epochs=1.0), tmp_path / "ck.pt", progress=False)


def test_sts_makes_a_miscalibrated_head_calibrated():
    """A head whose survival is the truth's logit doubled (over-confident) is fixed by T ~ 2 per position."""
    rng = np.random.default_rng(0)
    n, K = 6000, 4
    p = rng.uniform(0.3, 0.95, size=(n, K))
    acc_tok = rng.random((n, K)) < p
    acc = np.cumprod(acc_tok, axis=1).sum(1)
    surv = np.cumprod(p, axis=1)
    lg = np.log(surv) - np.log1p(-surv)
    bad = 1 / (1 + np.exp(-2 * lg))
    raw = np.concatenate([bad[:, :1], bad[:, 1:] / bad[:, :-1]], axis=1).clip(0, 1)
    T = fit_sts(raw, acc, np.ones((n, K), dtype=bool))
    assert np.all(np.abs(T - 2.0) < 0.35), T
    d = DSparkDrafter(DrafterConfig(**{**TINY, "block": K}))
    d.sts_temp.copy_(torch.from_numpy(T).float())
    c_raw = torch.from_numpy(raw).float()
    conf, _ = d.calibrate(torch.logit(c_raw.clamp(1e-6, 1 - 1e-6)))
    chains_bad = [{"raw": raw, "conf": raw, "acc": acc, "inside": np.ones((n, K), dtype=bool)}]
    chains_fix = [{"raw": raw, "conf": conf.numpy(), "acc": acc, "inside": np.ones((n, K), dtype=bool)}]
    assert metrics(chains_fix, K)["ece_sts"] < 0.02 < metrics(chains_bad, K)["ece_sts"]


def test_save_load_and_mismatch_errors(target, seqs, tmp_path):
    d = tiny_drafter(target, seqs)
    p = tmp_path / "d.pt"
    save_drafter(d, p, {"seed": 0, "tau": np.float64(1.5), "per_pos": [np.float32(0.5)]})  # numpy scalars too
    e = load_drafter(p, target="qwen3-tiny", block=5)
    e.attach_target(target.tok_embeddings.weight)
    assert torch.equal(e.vocab_ids, d.vocab_ids) and e.meta["tau"] == 1.5
    with pytest.raises(ConfigError, match="trained for target 'qwen3-tiny'"):
        load_drafter(p, target="smollm2-135m")
    with pytest.raises(ConfigError, match="blocks of 5 tokens"):
        load_drafter(p, block=7)
    with pytest.raises(ConfigError, match="not found"):
        load_drafter(tmp_path / "nope.pt")
    raw = bytearray(p.read_bytes())
    raw[-10] ^= 0xFF
    p.write_bytes(bytes(raw))
    with pytest.raises(ConfigError, match="sha256"):
        load_drafter(p)
    with pytest.raises(ConfigError, match="embedding"):
        e.attach_target(torch.zeros(10, 128))


def test_live_drafter_in_the_real_engine_is_lossless_and_replays_in_the_simulator(target, seqs):
    """The real engine drafting live from its verify forwards accepts exactly what the recorded chains
    (drafted from the reference's hidden states) say: the simulator replaying them takes the same steps."""
    from real.validation.workload import Workload, provisional_cost, run_real
    from sim.engine.engine import Engine, EngineConfig
    from sim.engine.policies import sim_policy

    kw = dict(limit=6, sample=None, seed=0, max_tokens=32, max_prompt=300, teacher=False)
    plain = Workload.build("traces/chat.jsonl", "qwen3-tiny", True, "cpu", drafter=None, **kw)
    # a drafter that is accepted often enough to matter: overfit it on these requests' own generations
    own = generate_group(plain.model(max_slots=8, extra=32), [r.prompt_ids.astype(np.int64) for r in plain.requests],
                         32, eos_id=-1, layers=(0, 1))
    torch.manual_seed(0)
    d = DSparkDrafter(DrafterConfig(**{**TINY, "block": 7}))
    d.set_vocab(reduced_vocab(own, 512))
    d.attach_target(target.tok_embeddings.weight)
    train(d, [prepare(s, 7) for s in own], TrainConfig(epochs=30.0, anchors=32, accum=1, warmup=1, lr=3e-3),
          None, progress=False)
    wl = Workload.build("traces/chat.jsonl", "qwen3-tiny", True, "cpu", drafter=d, **kw)
    assert wl.drafter is not None and wl.tables.replayed_requests == 6
    model = wl.model(max_slots=4)
    cost = provisional_cost(model)
    for policy in ("model-fixed:7", "hybrid-price"):
        real = run_real(wl, model, policy, 4, cost=cost)
        assert real.lossless, real.violation
        assert real.outputs == [[int(x) for x in r.output_ids] for r in wl.requests]
        cfg = EngineConfig(batch_size=4, max_num_batched_tokens=512, async_scheduling=False, kv_capacity_tokens=10**9)
        sim = Engine(wl.tables, np.zeros(len(wl.requests)), sim_policy(policy), cost, cfg).run()
        for col in ("num_decode", "verified_model", "accepted_model", "emitted"):
            assert np.array_equal(real.steps[col], sim.steps[col]), (policy, col)
    assert real.steps["accepted_model"].sum() > 0
    # preemption: a resumed request re-prefills into a fresh slot and rebuilds its drafter context there
    from real.engine.engine import RealEngine

    need = int(max(r.prompt_len + r.output_len for r in wl.requests))
    cfg = EngineConfig(batch_size=4, max_num_batched_tokens=256, async_scheduling=False,
                       kv_capacity_tokens=need + 48)
    real = RealEngine(wl.tables, np.zeros(len(wl.requests)), sim_policy("hybrid-price"), cost, cfg, model,
                      wl.ngram_cfg, drafter=wl.drafter).run()
    sim = Engine(wl.tables, np.zeros(len(wl.requests)), sim_policy("hybrid-price"), cost, cfg).run()
    assert real.requests["preemptions"].sum() > 0 and real.lossless, real.violation
    for col in ("num_decode", "verified_model", "accepted_model", "emitted"):
        assert np.array_equal(real.steps[col], sim.steps[col]), ("preempted", col)


@pytest.mark.skipif(not DEFAULT_DRAFTER.exists(), reason="the bundled drafter is not built")
def test_bundled_drafter_loads_and_is_small():
    from real.drafter.model import file_sha256
    from real.engine.weights import find_smollm2_gguf

    assert DEFAULT_DRAFTER.stat().st_size <= 20e6
    try:  # the target's weights file is not installed on CI: check the pairing only where it is
        target_sha = file_sha256(find_smollm2_gguf())
    except ConfigError:
        target_sha = None
    d = load_drafter(DEFAULT_DRAFTER, target="smollm2-135m", block=7, target_sha256=target_sha)
    assert d.meta["rebuild"].startswith("python -m real.train_drafter")
    assert float(d.sts_temp.min()) > 0
