"""The drafter recipe that learns (real/drafter/warm_start.py, baselines.py, labels.py's continuations and windows,
train_v.py's settings): each checked on the 2-layer random-weight test target (models/llms/qwen3-tiny.json)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from real.drafter.baselines import RidgeNext, Trigram, first_slot_table, prompt_copy
from real.drafter.labels import LabelConfig, LabelSource, eval_config, label_sequence, texts, windows
from real.drafter.qwen3_dspark import DSparkV, DSparkVConfig
from real.drafter.train import prepare
from real.drafter.train_v import VTrainConfig, input_scale
from real.drafter.warm_start import positive_direction, rope_kernel, warm_start
from sim.infra.errors import ConfigError

TINY = dict(target="qwen3-tiny", target_vocab=4096, hidden=128, layers=(0, 1), block=5, num_layers=1, heads=6,
            kv_heads=3, head_dim=32, intermediate=256, vocab=4096, rank=16, mask_token_id=4095)


@pytest.fixture(scope="module")
def target():
    from real.engine.weights import build_model

    torch.manual_seed(0)
    m, _ = build_model("qwen3-tiny", "cpu", torch.float32, max_slots=4, max_len=512)
    with torch.no_grad():  # a trained LM's embeddings share a common direction; a random one's do not
        w = m.tok_embeddings.weight
        v = torch.randn(w.shape[1], generator=torch.Generator().manual_seed(1))
        w += 4 * w.std() * v / v.norm()
    return m


@pytest.fixture(scope="module")
def seqs(target):
    """The tiny target's own greedy continuations of random prompts (every label valid on them)."""
    from real.engine.greedy import greedy_group

    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 4000, size=n) for n in (24, 40, 32, 28)]
    gens = greedy_group(target, prompts, [160] * 4, eos_id=None)
    return [prepare(label_sequence(target, np.concatenate([p, g.output]), (0, 1), topk=8, chunk=64), 5)
            for p, g in zip(prompts, gens)]


def fresh(target) -> DSparkV:
    torch.manual_seed(0)
    d = DSparkV(DSparkVConfig(**TINY))
    d.set_vocab(torch.arange(4096))
    return d.attach_target(target.tok_embeddings.weight)


def test_windows_cover_every_position_with_overlap():
    ids = np.arange(1000)
    ws = windows(ids, 256)
    assert all(len(w) == 256 for w in ws)
    assert ws[0][0] == 0 and ws[-1][-1] == 999
    covered = np.zeros(1000, bool)
    for a, b in zip(ws, ws[1:]):
        assert b[0] <= a[-1] - 63                                   # at least a quarter overlaps
    for w in ws:
        covered[w] = True
    assert covered.all()
    assert len(windows(np.arange(100), 256)) == 1


class _Tok:
    def encode(self, text):
        return [ord(c) for c in text]


def test_texts_window_long_rows_and_keep_a_continuations_prompt_end(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"prompt": "%s", "output": "%s"}\n{"prompt": "shortish text", "output": "x"}\n{"prompt": "abc"}\n'
                 % ("p" * 300, "o" * 100))
    with pytest.raises(ConfigError, match=r"t.jsonl:3: .*'output'"):   # named, never dropped
        texts(LabelSource("w", str(f), 99, 128, with_output=True, cut=False), _Tok())
    rows, passed = texts(LabelSource("w", str(f), 5, 128, with_output=True, cut=False), _Tok())
    # 400 tokens in windows of 128 (4), then the short row whole; nothing passed over for its length
    assert [len(r) for r in rows] == [128, 128, 128, 128, 14] and passed == 0
    rows, _ = texts(LabelSource("g", str(f), 2, 128, with_output=False, cut=True, generate=64), _Tok())
    assert len(rows[0]) == 64 and rows[0][-1] == ord("p")        # the prompt's last max_len - generate tokens
    with pytest.raises(ConfigError, match="generate"):
        LabelConfig(sources=(LabelSource("g", str(f), 2, 64, False, True, generate=60),)).validate()


def test_evaluation_traces_are_labelled_only_for_measuring():
    with pytest.raises(ConfigError, match="evaluation trace"):
        LabelConfig(sources=(LabelSource("x", "traces/codeedit.jsonl", 4, 64, False, True),)).validate()
    cfg = eval_config(2)
    cfg.validate()
    assert cfg.evaluation and cfg.sources[0].generate > 0


@pytest.mark.parametrize("bad, match", [
    (dict(lr=2.0), "lr"), (dict(lr=float("nan")), "lr"), (dict(l1_weight=float("nan")), "loss weights"),
    (dict(ce_weight=float("inf")), "loss weights"), (dict(conf_weight=-1.0), "loss weights"),
    (dict(l1_weight=0.0, ce_weight=0.0), "not both 0")])
def test_training_settings_out_of_range_are_refused(bad, match):
    with pytest.raises(ConfigError, match=match):
        VTrainConfig(**bad).validate()


@pytest.mark.parametrize("flag", ["--lr=2", "--l1-weight=nan", "--ce-weight=inf", "--conf-weight=-1",
                                  "--mask-token=99999"])
def test_the_command_refuses_them_in_one_line_before_labelling(flag, tmp_path):
    r = subprocess.run([sys.executable, "-m", "real.train_drafter_v", "--out", str(tmp_path / "d.pt"), flag],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2 and flag.split("=")[0] in r.stderr


def test_input_scale_leaves_out_position_0(seqs):
    from dataclasses import replace

    big = []
    for st in seqs:
        f = st.feats.clone()
        f[0] *= 1000                                                 # massive activations at position 0
        big.append(replace(st, feats=f))
    assert torch.allclose(input_scale(big), input_scale(seqs))
    assert not torch.allclose(input_scale([replace(st, feats=st.feats.clone() * 2) for st in seqs]),
                              input_scale(seqs))


def test_positive_direction_and_rope_kernel():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(500, 16, generator=g) + 2.0                     # a cloud off the origin
    w, share = positive_direction(X)
    assert share == 1.0 and abs(float(w.norm()) - 1) < 1e-5
    o = torch.randn(16, 1, generator=g)
    w2, _ = positive_direction(X, orth=o)
    assert abs(float(w2 @ o[:, 0])) < 1e-4                          # orthogonal to what it must not see
    f = rope_kernel(1e5, 32, 1)
    assert int(f.argmax()) == 1 and float(f[1]) == pytest.approx(16.0)


def test_warm_start_reads_position_a_minus_1_and_the_anchor(target, seqs):
    d = fresh(target)
    d.in_scale = input_scale(seqs)
    st = seqs[1]
    a = torch.arange(60, 120, 7)
    stats = warm_start(d, seqs, target.norm.weight, log=print)
    assert stats["context_positive"] > 0.99 and stats["beta"] > 0
    # slot 0 starts at the closed-form fit: it picks what the target's own final state at a picks as often as the
    # fit does (the tiny target's LM head is not its embedding, so this compares with the tied head's choice)
    hits = n = 0
    for s in seqs:
        aa = torch.arange(1, s.feats.shape[0])
        c, ck, cv = d.sequence_context(s.feats, s.next_tok)
        u = d.backbone(s.tokens[aa], aa, ck, cv, d.visible(c.shape[0], aa))[:, 0]
        y = s.feats[aa, -128:].float()
        want = ((y / y.pow(2).mean(-1, keepdim=True).sqrt() * target.norm.weight) @ d.embed.T).argmax(-1)
        hits += int((d.base_logits(u).argmax(-1) == want).sum())
        n += len(aa)
    assert hits / n == pytest.approx(stats["fit_top1_vs_target"], abs=0.05) and hits / n > 0.8

    c, ck, cv = d.sequence_context(st.feats, st.next_tok)
    u0 = d.backbone(st.tokens[a], a, ck, cv, d.visible(c.shape[0], a))[:, 0]
    far = st.feats.clone()
    far[: int(a.min()) - 2] = torch.randn_like(far[: int(a.min()) - 2]).half()   # every context before a - 2
    c2, ck2, cv2 = d.sequence_context(far, st.next_tok)
    u_far = d.backbone(st.tokens[a], a, ck2, cv2, d.visible(c.shape[0], a))[:, 0]
    near = st.feats.clone()
    near[a - 1] = torch.randn_like(near[a - 1]).half()
    c3, ck3, cv3 = d.sequence_context(near, st.next_tok)
    u_near = d.backbone(st.tokens[a], a, ck3, cv3, d.visible(c.shape[0], a))[:, 0]
    assert float((u_far - u0).abs().max()) < 1e-2 * float(u0.abs().max())   # slot 0 ignores the far context
    assert float((u_near - u0).abs().max()) > 0.1 * float(u0.abs().max())   # and reads position a - 1
    # slot 1 reads the anchor token through the anchor heads
    tok2 = (st.tokens[a] + 1) % 4000
    u1 = d.backbone(tok2, a, ck, cv, d.visible(c.shape[0], a))[:, 1]
    assert float((u1 - d.backbone(st.tokens[a], a, ck, cv, d.visible(c.shape[0], a))[:, 1]).abs().max()) > 1e-3


def test_baselines_on_the_same_anchors(target, seqs):
    t = torch.tensor([5, 6, 7, 9, 5, 6, 8, 5, 6])
    assert prompt_copy(t, 8) == 8 and prompt_copy(t, 2) == -1       # the last earlier (5, 6) was followed by 8
    tri = Trigram([[1, 2, 3, 1, 2, 3, 1, 2, 4]])
    assert tri.predict(1, 2) == 3 and tri.predict(9, 2) == 3 and tri.predict(9, 9) in (1, 2)
    ridge = RidgeNext(seqs[:3], target.tok_embeddings.weight.detach(), target.norm.weight.detach(), 2)
    table = first_slot_table(seqs[3:], tri, ridge, lambda st, a: st.labels[a, 0])
    assert table["drafter"] == 1.0 and table["anchors"] > 50
    assert 0 <= table["ridge"] <= 1 and 0 <= table["trigram"] <= 1


def test_platt_recovers_a_known_map_and_folds_exactly_into_the_head(target):
    """fit_platt finds the affine logit map that generated the acceptances (reachable slots only), and
    fold_confidence_affine makes the exported head compute exactly a * logit + b."""
    from real.drafter.evaluate import fit_platt

    rng = np.random.default_rng(0)
    n, K, a_true, b_true = 20000, 5, 0.6, -0.4
    raw = rng.uniform(0.02, 0.98, size=(n, K))
    z = np.log(raw) - np.log1p(-raw)
    hit = rng.uniform(size=(n, K)) < 1 / (1 + np.exp(-(a_true * z + b_true)))
    acc = np.cumprod(hit, axis=1).sum(1)
    a, b, slots = fit_platt(raw, acc, np.ones((n, K), bool))
    assert abs(a - a_true) < 0.05 and abs(b - b_true) < 0.05 and slots == int((acc[:, None] >= np.arange(K)).sum())
    d = fresh(target)
    with torch.no_grad():
        d.conf.weight.normal_(0, 0.1)
        d.conf.bias.fill_(0.3)
    u, m = torch.randn(4, K, d.cfg.hidden), torch.randn(4, K, d.cfg.rank)
    before = d.raw_confidence(u, m)
    d.fold_confidence_affine(a, b)
    torch.testing.assert_close(d.raw_confidence(u, m), a * before + b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ConfigError, match="a > 0"):
        d.fold_confidence_affine(-1.0, 0.0)


def test_the_report_reads_the_files_metadata_and_refuses_one_without_it(tmp_path):
    """python -m real.drafter_v_report: the curve table and each held-out set against the trivial predictors
    and the issue's floors, from the weights file alone; a file without a learning curve is one line, exit 2."""
    from real.drafter.model import save_drafter

    torch.manual_seed(0)
    d = DSparkV(DSparkVConfig(**TINY))
    d.set_vocab(torch.arange(4096))
    fs = {"trigram": 0.15, "prompt_copy": 0.30, "ridge": 0.28, "drafter": 0.31, "anchors": 100}
    meta = {"command": "python -m real.train_drafter_v --steps 2", "data": {"general": {
                "sequences": 2, "train": 1, "held_out": 1, "tokens": 10, "agreement": 0.5}},
            "warm_start": {"r2": 0.5}, "confidence_affine": {"a": 0.65, "b": -0.43, "slots": 10},
            "steps_done": 2, "labelled_seen": 1234, "finished": True,
            "curve": [{"step": 0, "labelled": 0, "top1": [0.2] * 5, "tau_tf": 1.2},
                      {"step": 2, "labelled": 1234, "cpu_s": 3.0, "top1": [0.3] * 5, "tau_tf": 1.4}],
            "measured": {"general (held out)": {"first_slot": fs, "tau_all": 1.39, "ece_raw": 0.034},
                         "codeedit edits": {"first_slot": {**fs, "prompt_copy": 0.74}, "tau_all": 2.6,
                                            "ece_raw": 0.02}}}
    save_drafter(d, tmp_path / "d.pt", meta)
    save_drafter(d, tmp_path / "bare.pt", {"command": "x"})
    r = subprocess.run([sys.executable, "-m", "real.drafter_v_report", "--drafter", str(tmp_path / "d.pt"), "-o",
                        str(tmp_path / "r" / "v.md")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "r" / "v.md").read_text()
    assert "| 2 | 1,234 | 3 | 1.400 | 0.300 |" in md and "logit -> 0.650 x logit -0.430" in md
    assert "| general (held out) | 100 | 0.310 | 0.150 | 0.300 | 0.280 | 1.39 | 1.8 missed | 0.034 missed |" in md
    assert "| codeedit edits | 100 | 0.310 (below) |" in md and "| 2.60 | 2.5 met | 0.020 met |" in md
    assert (tmp_path / "r" / "v.html").stat().st_size > 1000
    r = subprocess.run([sys.executable, "-m", "real.drafter_v_report", "--drafter", str(tmp_path / "bare.pt"), "-o",
                        str(tmp_path / "r2" / "v.md")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no learning curve" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "r2" / "v.md").exists()
