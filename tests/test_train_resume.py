"""Resuming real.train_drafter mid-epoch ends with the very weights of an uninterrupted run: the checkpoint
holds the model, the optimizer, the generator and what is left of the epoch's shuffle order."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import real.drafter.train as train_mod
from real.drafter.data import generate_group
from real.drafter.model import DrafterConfig, DSparkDrafter
from real.drafter.train import TrainConfig, prepare, reduced_vocab, train

TINY = dict(target="qwen3-tiny", target_vocab=4096, hidden=128, layers=(0, 1), block=5, heads=4, kv_heads=2,
            head_dim=32, intermediate=256, vocab=512, rank=16)


@pytest.fixture(scope="module")
def setup():
    from real.engine.weights import build_model

    torch.manual_seed(0)
    target, _ = build_model("qwen3-tiny", "cpu", torch.float32, max_slots=5, max_len=256)
    rng = np.random.default_rng(0)
    seqs = generate_group(target, [rng.integers(0, 4096, size=n) for n in (30, 25, 40, 33, 28)], 12, eos_id=-1,
                          layers=(0, 1))
    return target, seqs


def _drafter(target, seqs, seed=0):
    torch.manual_seed(seed)
    d = DSparkDrafter(DrafterConfig(**TINY))
    d.set_vocab(reduced_vocab(seqs, 512))
    d.attach_target(target.tok_embeddings.weight)
    return d


def test_resume_mid_epoch_is_bit_identical(setup, tmp_path, monkeypatch):
    target, seqs = setup
    st = [prepare(s, 5) for s in seqs]
    cfg = TrainConfig(epochs=2.0, anchors=16, accum=1, warmup=1, lr=3e-3, checkpoint_every=2)  # 5 steps an epoch
    whole = _drafter(target, seqs)
    train(whole, st, cfg, tmp_path / "a.ckpt", progress=False)

    real_lr = train_mod.lr_at

    def stop_at_3(step, total, c):  # killed mid-epoch, after the checkpoint of step 2
        if step == 3:
            raise KeyboardInterrupt
        return real_lr(step, total, c)

    part = _drafter(target, seqs)
    monkeypatch.setattr(train_mod, "lr_at", stop_at_3)
    with pytest.raises(KeyboardInterrupt):
        train(part, st, cfg, tmp_path / "b.ckpt", progress=False)
    monkeypatch.setattr(train_mod, "lr_at", real_lr)
    resumed = _drafter(target, seqs, seed=1)  # other initial weights: everything must come from the checkpoint
    logs = []
    train(resumed, st, cfg, tmp_path / "b.ckpt", log=logs.append, progress=False)
    assert any("resumed" in m and "step 2/" in m for m in logs)
    for (k, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), f"{k} differs after a resume"
    assert not list(tmp_path.glob(".*.part")), "a checkpoint temporary was left"
