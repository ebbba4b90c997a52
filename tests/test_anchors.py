"""python -m sim.anchors (the simulator against published measurements) and what its anchors need: the JSON
shape and bad input of the command, vLLM's spec-decode counters, the MoE / tensor-parallel roofline, the
sequential (EAGLE-style) drafter cost, adaptive verification's own per-step cost, the model-shaped code-edit
outputs, the no-spec fit of models/gpus/mi350x-dsv4-fit.json, the published ranges and vLLM configs of the
newer anchors and the B300 spec. All fast (no trace simulation) but the one marked slow."""
from __future__ import annotations

import json

import numpy as np
import pytest

from sim.api.anchors import ANCHORS, Figure, eagle_itl_ms, ngram_step_stats
from sim.infra.cli import run_cli
from sim.core.cost import CostConfig, make_cost_model
from sim.infra.errors import ConfigError
from sim.core.models import get_llm


def run_anchors(argv, capsys):
    from sim.api.anchors import main

    with pytest.raises(SystemExit) as ei:
        run_cli(main, argv)
    cap = capsys.readouterr()
    return ei.value.code, cap


# --------------------------------------------------------------------------------------------- the command
def test_json_is_one_object_per_figure(capsys):
    code, cap = run_anchors(["--only", "pr32374-eagle-itl", "--json", "--no-report"], capsys)
    assert code == 0, cap.err
    rows = json.loads(cap.out)
    assert len(rows) == 23  # the fixture's clean rows: batch 1, 16, 32 at K = 0, 1, 3, 4, 5, 7; batch 64 at K <= 5
    for r in rows:
        assert {"anchor", "metric", "published", "simulated", "error", "tolerance", "within"} <= set(r)
        assert isinstance(r["within"], bool)
        assert r["error"] == pytest.approx((r["simulated"] - r["published"]) / r["published"])
        assert r["within"] == (abs(r["error"]) <= r["tolerance"])  # relative targets here
    b1 = [r["simulated"] for r in rows if "batch 1," in r["metric"]]
    assert b1 == sorted(b1) and b1[-1] > b1[0] + 4.0  # the step grows with K (sequential head passes)


def test_report_written_whole_and_not_replaced_without_force(tmp_path, capsys):
    out = tmp_path / "anchors.md"
    code, cap = run_anchors(["--only", "pr32374-eagle-itl", "--out", str(out)], capsys)
    assert code == 0, cap.err
    text = out.read_text()
    assert "## pr32374-eagle-itl" in text and "**Source:**" in text and "| published |" not in text.split("\n")[0]
    assert "python -m sim.anchors --only pr32374-eagle-itl" in text
    rows = json.loads((tmp_path / "anchors.json").read_text())
    assert len(rows) == 23 and all(r["anchor"] == "pr32374-eagle-itl" for r in rows)
    code, cap = run_anchors(["--only", "pr32374-eagle-itl", "--out", str(out)], capsys)
    assert code == 2 and "already exists" in cap.err and cap.err.count("\n") == 1
    assert out.read_text() == text


@pytest.mark.parametrize("argv,needle", [
    (["--only", "pr-nope", "--no-report"], "unknown anchor 'pr-nope'"),
    (["--only", "pr32374-eagle-itl", "--out", "/proc/nope/anchors.md"], "--out"),
])
def test_bad_input_is_one_line_exit_2(argv, needle, capsys):
    code, cap = run_anchors(argv, capsys)
    assert code == 2 and needle in cap.err and cap.err.count("\n") == 1 and "Traceback" not in cap.err


def test_every_anchor_states_its_source_and_limits():
    for a in ANCHORS.values():
        for f in ("source", "setup", "unmatched", "checks", "fitted"):
            assert getattr(a, f).strip(), (a.name, f)
    assert any("fitted" in a.fitted.lower() or "fitted to" in a.fitted for a in ANCHORS.values() if "fit" in a.name)


def test_figure_targets():
    assert Figure("a", "m", 0.547, 0.64, 0.10, "absolute").within
    assert not Figure("a", "m", 0.547, 0.66, 0.10, "absolute").within
    assert Figure("a", "m", 2.96, 3.38, 0.15).within and not Figure("a", "m", 2.96, 3.42, 0.15).within
    assert not Figure("a", "m", 1.0, float("nan"), 0.5).within
    assert Figure("a", "m", 0.547, 0.668, 0.10, "absolute").deviation == "+0.121"
    assert Figure("a", "m", 0.547, 0.668, 0.10, "absolute").miss == pytest.approx(1.21)
    assert Figure("a", "m", 2.96, 3.376, 0.15).deviation == "+14.1%"


def test_ngram_counters_follow_vllm():
    """vLLM's counters on a hand-made batch-1 run: 3 drafted steps accepting 5, 2, 0; 4 steps without a draft."""
    steps = {"verified_ngram": np.array([0, 5, 5, 0, 5, 0, 0]), "accepted_ngram": np.array([0, 5, 2, 0, 0, 0, 0])}
    out = 7 + 5 + 2  # one token per step plus the accepted ones
    st = ngram_step_stats(steps, out, 5)
    assert st["share"] == pytest.approx(3 / 7)
    assert st["per_draft"] == pytest.approx(1 + 7 / 3)
    assert st["overall"] == pytest.approx(out / 7)
    assert st["pos"] == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3, 1 / 3])
    # the published Blazedit figures are consistent the same way: 1 + sum of per-position acceptance
    from sim.api.anchors import BLAZEDIT
    assert 1 + sum(BLAZEDIT["pos"]) == pytest.approx(BLAZEDIT["per_draft"])


# --------------------------------------------------------------------------------------------- MoE and TP
def test_moe_spec_and_expert_streaming():
    m = get_llm("deepseek-v4-flash")
    assert m.is_moe and m.expert_params == pytest.approx(256 * 43 * 3 * 4096 * 2048)
    assert m.flops_per_token == pytest.approx(2 * 13e9)
    f = m.expert_fraction(np.array([0, 1, 43, 10_000]))
    assert f[0] == 0 and f[1] == pytest.approx(6 / 256) and f[2] == pytest.approx(1 - (1 - 6 / 256) ** 43)
    assert f[3] == pytest.approx(1.0)
    assert m.weight_bytes == pytest.approx(m.dense_params * 1 + m.expert_params * 0.53125)
    assert get_llm("qwen3-8b").expert_fraction(5) == 0.0


def test_moe_step_reads_more_experts_as_tokens_grow():
    c = make_cost_model("roofline", "deepseek-v4-flash", "mi350x", tensor_parallel_size=8)
    t = np.array([1, 8, 64, 512])
    lin = np.asarray(c.linear_ms(t))
    tw = c.weight_ms + c.expert_ms * c.llm.expert_fraction(t)  # weight streaming alone (ms)
    assert np.all(np.diff(lin) > 0)
    assert lin[0] == pytest.approx(tw[0] + c.allreduce_fixed_ms + c.allreduce_ms_per_token, rel=1e-9)
    assert tw[-1] > 10 * tw[0]  # at 512 tokens nearly every expert is read, at 1 token 6 of 256
    assert float(c.verify_ms(8, 8 * 800, 8)) == pytest.approx(c.verify_table(8, 8 * 800, 8)[8])


def test_tensor_parallel_splits_weights_and_adds_allreduce():
    one = make_cost_model("roofline", "deepseek-v4-flash", "mi350x", tensor_parallel_size=8)
    two = make_cost_model("roofline", "deepseek-v4-flash", "mi350x", tensor_parallel_size=4)
    assert two.weight_ms == pytest.approx(2 * one.weight_ms) and two.ms_per_token == pytest.approx(2 * one.ms_per_token)
    g, m = one.gpu, one.llm
    assert one.allreduce_fixed_ms == pytest.approx(2 * m.num_layers * g.allreduce_us / 1e3)
    assert one.allreduce_ms_per_token == pytest.approx(
        2 * m.num_layers * m.hidden_size * 2 * 2 * 7 / 8 / (g.interconnect_gbps * 1e6))
    # KV: one KV head is replicated on every GPU; weights split 8 ways
    cfg = CostConfig(llm="deepseek-v4-flash", gpu="mi350x", tensor_parallel_size=8)
    assert cfg.kv_bytes_per_token == m.kv_bytes_per_token + cfg.drafter_spec.kv_bytes_per_token(m)
    with pytest.raises(ConfigError, match="does not fit"):
        CostConfig(llm="deepseek-v4-flash", gpu="h100-sxm", tensor_parallel_size=1)  # 154 GB of weights
    # a dense model on one GPU keeps the exact formulas (no MoE, no all-reduce terms)
    d = make_cost_model("roofline", "qwen3-8b", "h100-sxm")
    assert d._plain and d.allreduce_fixed_ms == 0.0 and d.expert_ms == 0.0


def test_tp_kv_split_for_grouped_heads():
    one = CostConfig(llm="qwen3-8b", gpu="mi300x")
    two = CostConfig(llm="qwen3-8b", gpu="mi300x", tensor_parallel_size=2)
    assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token
    assert two.kv_capacity_tokens > 2 * one.kv_capacity_tokens * 0.99


# --------------------------------------------------------------------------------------------- drafters
def test_eagle_cost_grows_per_draft_token():
    e = make_cost_model("roofline", "llama-3.1-8b", "h100-sxm", drafter="eagle-llama3.1-8b-cost")
    d = make_cost_model("roofline", "llama-3.1-8b", "h100-sxm")  # DSpark: one block pass
    for r in (1, 32):
        one = e.draft_ms(r, 1)
        assert one > 0 and [e.draft_ms(r, k) for k in range(1, 8)] == pytest.approx([k * one for k in range(1, 8)])
    assert d.draft_ms(1, 7) < 1.2 * d.draft_ms(1, 1)  # the block drafter's pass is nearly flat in the block
    assert eagle_itl_ms(e, 1, 7) - eagle_itl_ms(e, 1, 0) == pytest.approx(7 * e.draft_ms(1, 1) + e.alloc_ms(1) + (
        float(e.verify_ms(8, 256, 1)) - float(e.verify_ms(1, 256, 1))) + e.sample_ms(8) - e.sample_ms(1), rel=1e-6)
    e3 = make_cost_model("roofline", "llama-3.1-8b", "h100-sxm", drafter="eagle3-llama3.1-8b-cost")
    assert e3.draft_ms(1, 1) < one  # its 32k-token LM head is cheaper than the target's


def test_eagle_profiles_fit_the_acceptance_they_cite():
    from sim.core.drafters.model import load_drafter_profile

    for name, al7 in (("eagle-llama3.1-8b", 2.47), ("eagle3-llama3.1-8b", 3.54)):
        p = load_drafter_profile(name)
        q = p.q1[0] * p.decay[0] ** np.arange(7)
        assert 1 + np.cumprod(q).sum() == pytest.approx(al7, abs=0.03)


def _alloc(c, r, spec):
    """The cost model's allocation charge for the policy `spec` as the engine asks for it: its name and what it
    declares (Policy.adaptive_verification)."""
    from sim.core.policies import get_policy

    pol = get_policy(spec)
    return c.alloc_ms(r, policy=pol.name, adaptive=pol.adaptive_verification)


def test_adaptive_machinery_cost_only_for_policies_that_run_it():
    c = make_cost_model("roofline", "qwen3-8b", "mi300x")
    k = c.gpu.kernels
    base = _alloc(c, 16, "model-fixed:7")
    assert _alloc(c, 16, "adaptive") == pytest.approx(base + k.adaptive_ms + 16 * k.adaptive_us_per_req / 1e3)
    assert _alloc(c, 16, "hybrid:margin=0.1") > base and _alloc(c, 16, "ngram-threshold") > base
    assert _alloc(c, 16, "ngram-fixed:32") == base and _alloc(c, 16, "vllm-ngram:7") == base
    h = make_cost_model("roofline", "qwen3-8b", "h100-sxm")  # no stated adaptive cost: unchanged
    assert _alloc(h, 16, "adaptive") == _alloc(h, 16, "model-fixed:7")


def test_the_cost_model_prices_what_a_policy_declares_not_its_name():
    c = make_cost_model("roofline", "qwen3-8b", "mi300x")
    assert c.alloc_ms(16, policy="adaptive") == c.alloc_ms(16, policy="model-fixed:7")  # a name alone: no charge
    assert c.alloc_ms(16, policy="my-policy", adaptive=True) == c.alloc_ms(16, policy="adaptive", adaptive=True) > \
        c.alloc_ms(16, policy="my-policy")


def test_tensor_parallel_logits_gather_grows_with_logit_rows():
    """Under TP the logits of every logit row are all-gathered (bf16 vocab rows); one GPU pays nothing."""
    c = make_cost_model("roofline", "deepseek-v4-flash", "mi350x", tensor_parallel_size=8)
    g, m = c.gpu, c.llm
    per_row = m.vocab_size * 2 * 7 / 8 / (g.interconnect_gbps * 1e6)
    assert c.gather_ms_per_row == pytest.approx(per_row)
    assert c.verify_ms(2048, 0, 256) - c.verify_ms(2048, 0, 256, logit_rows=256) == pytest.approx(1792 * per_row)
    assert c.verify_table(2048, 0, 256)[2048] == pytest.approx(c.verify_ms(2048, 0, 256))
    assert make_cost_model("roofline", "qwen3-8b", "h100-sxm").verify_ms(64, 1000, 8, logit_rows=8) == \
        make_cost_model("roofline", "qwen3-8b", "h100-sxm").verify_ms(64, 1000, 8)


def test_piecewise_step_above_the_capture_limit():
    """A step above cuda_graph_max_tokens pays num_layers * piecewise_layer_us once; the engine's table, the
    scalar path and adaptive's start-up table all see the same step up; GPUs that state nothing are unchanged."""
    import dataclasses

    from sim.core.cost.roofline import RooflineCost
    from sim.core.models import get_gpu

    for llm, gpu, tp in (("deepseek-v4-flash", "mi350x", 8), ("qwen3-8b", "h100-sxm", 1)):
        base = make_cost_model("roofline", llm, gpu, tensor_parallel_size=tp)
        g = dataclasses.replace(get_gpu(gpu), piecewise_layer_us=100.0)
        c = RooflineCost(base.config, gpu_spec=g)
        step = base.llm.num_layers * 100.0 / 1e3
        lim = g.cuda_graph_max_tokens
        for t in (1, lim, lim + 1, 4 * lim):
            want = base.verify_ms(t, 5000, 8) + (step if t > lim else 0.0)
            assert c.verify_ms(t, 5000, 8) == pytest.approx(want)
            assert c.verify_table(4 * lim, 5000, 8)[t] == pytest.approx(want)
        s0 = base.startup_verify_table(8192, 256, query_per_req=8)
        s1 = c.startup_verify_table(8192, 256, query_per_req=8)
        assert np.allclose(s1[: lim + 1], s0[: lim + 1]) and np.all(s1[lim + 1:] >= s0[lim + 1:] + step - 1e-9)
    h = make_cost_model("roofline", "qwen3-8b", "h100-sxm")
    assert h.eager_ms(10_000) == 0.0 and h._plain  # no stated graph loss: the dense formulas unchanged


def test_adaptive_per_layer_cost_and_the_sized_spec():
    from sim.core.models import get_gpu

    c = make_cost_model("roofline", "deepseek-v4-flash", "mi350x-dsv4-graphs", tensor_parallel_size=8)
    g = get_gpu("mi350x-dsv4-graphs")
    assert g.cuda_graph_max_tokens == 1024 and g.piecewise_layer_us > 0 and g.kernels.adaptive_layer_us > 0
    assert "FITTED TO AN ANCHOR" in g.source
    k = g.kernels
    fixed = _alloc(c, 4, "model-fixed:7")
    assert _alloc(c, 4, "adaptive") == pytest.approx(
        fixed + k.adaptive_ms + 4 * k.adaptive_us_per_req / 1e3 + 43 * k.adaptive_layer_us / 1e3)
    assert c.graph_tokens(1000) == 1008 and c.graph_tokens(2048) == 2048  # padded up to 1024, as is above
    assert c.verify_ms(2048, 0, 256) - c.verify_ms(1024, 0, 128) > 43 * g.piecewise_layer_us / 1e3


@pytest.mark.slow  # about 2 minutes: 28 simulations of the 512-token ShareGPT workload
def test_mi350x_graphs_fit_is_reproducible():
    from sim.api.anchors import fit_pr52362_graphs
    from sim.core.models import get_gpu

    fit = fit_pr52362_graphs(progress=False)
    g = get_gpu("mi350x-dsv4-graphs")
    assert g.piecewise_layer_us == pytest.approx(fit["piecewise_layer_us"], rel=1e-3)
    assert g.kernels.adaptive_layer_us == pytest.approx(fit["adaptive_layer_us"], rel=1e-3)
    assert fit["fixed/none at 256"] == pytest.approx(7852.42 / 8878.57, abs=2e-3)
    assert fit["adaptive/fixed at 4"] == pytest.approx(902.37 / 970.33, abs=2e-3)


def test_blazedit_runs_are_cut_at_the_published_max_tokens(tmp_path):
    from sim.api.anchors import BLAZEDIT_MAX_TOKENS, capped_trace
    from sim.core.trace import load_trace

    full = load_trace("traces/codeedit-model.jsonl", tokenizer="qwen3", limit=40)
    cut = {r.id: r for r in load_trace(capped_trace("traces/codeedit-model.jsonl", BLAZEDIT_MAX_TOKENS,
                                                    tmp_path)).requests}
    assert BLAZEDIT_MAX_TOKENS == 256 and len(cut) == 351
    for r in full.requests:
        c = cut[r.id]
        assert np.array_equal(c.prompt_ids, r.prompt_ids)
        assert np.array_equal(c.output_ids, r.output_ids[:256]) and len(c.output_ids) == min(256, len(r.output_ids))


def test_a_published_range_is_within_only_inside_it():
    from sim.api.anchors import range_figure

    under = [range_figure("a", "m", 0.0, 0.10, v) for v in (0.0, 0.05, 0.10, 0.1001, 0.114)]
    assert [f.within for f in under] == [True, True, True, False, False]
    over = [range_figure("a", "m", 0.70, 1.0, v) for v in (0.69, 0.70, 0.761, 1.0)]
    assert [f.within for f in over] == [False, True, True, True]
    f = range_figure("a", "share", 0.42, 0.95, 0.901)
    assert f.tolerance_kind == "absolute" and f.published == pytest.approx(0.685) and "0.42-0.95" in f.metric


def test_newer_anchors_run_the_configs_a_user_would_paste():
    from sim.api.anchors import ILLUSION_EAGLE, PR25784_NGRAM, PR25784_SUFFIX, vllm_spec

    suffix, ngram, eagle = vllm_spec(PR25784_SUFFIX), vllm_spec(PR25784_NGRAM), vllm_spec(ILLUSION_EAGLE)
    assert (suffix.policy, suffix.suffix) == ("suffix:5", {"max_spec_tokens": 5})
    assert (ngram.policy, ngram.ngram_k) == ("vllm-ngram:5", 5)
    assert (eagle.policy, eagle.drafter) == ("model-fixed:3", "eagle-llama3.1-8b:3")
    # the published n-gram range (3..5) is refused, not fitted: the only calibrator covers 2..5
    with pytest.raises(ConfigError, match="prompt_lookup_min=3, prompt_lookup_max=5 cannot be mapped"):
        vllm_spec('{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 3, "prompt_lookup_max": 5}')


def test_newer_anchors_state_published_figures_and_fit_nothing():
    from sim.api import anchors as A

    for name in ("pr25784-suffix", "vllm-blog-dspark-adaptive", "arxiv2601.11580-eagle"):
        assert ANCHORS[name].fitted.startswith("none"), name
    ratios = {c: n / s for c, (s, n) in A.PR25784.items()}
    assert ratios[1] == pytest.approx(1.18, abs=0.01) and ratios[64] == pytest.approx(1.01, abs=0.01)
    assert A.BLOG_AL[256] < A.BLOG_AL[1] and A.BLOG_OVER_NONE_256["model-fixed:7"] < 1 < A.BLOG_OVER_NONE_256["adaptive"]


def test_b300_spec_states_datasheet_figures_and_fits_deepseek_at_tp8():
    from sim.core.models import get_gpu

    g = get_gpu("b300")
    assert (g.memory_bandwidth_tbps, g.bf16_tflops, g.cuda_graph_max_tokens) == (8.0, 2250.0, 512)
    assert g.interconnect_gbps > 0 and g.piecewise_layer_us == 0 and "fitted to nothing" in g.source
    c = make_cost_model("roofline", "deepseek-v4-flash", "b300", tensor_parallel_size=8)
    m = make_cost_model("roofline", "deepseek-v4-flash", "mi350x", tensor_parallel_size=8)
    assert c.kv_capacity_tokens > 1_000_000
    assert c.decode_step_ms(256, 800) < m.decode_step_ms(256, 800)  # same bandwidth, more FLOPs and NVLink


@pytest.mark.slow  # about 10 s: four simulations of chat.jsonl
def test_eagle_speedup_shrinks_with_batch_and_verify_share_grows():
    figs = {f.metric: f.simulated for f in ANCHORS["arxiv2601.11580-eagle"].run()}
    b1, b128 = (figs[f"EAGLE K=3 / no speculation, output throughput at batch {b}"] for b in (1, 128))
    v1, v128 = (next(v for k, v in figs.items() if k.startswith(f"share of step time in verification, EAGLE K=3, "
                                                               f"batch {b} ")) for b in (1, 128))
    assert b1 > b128 > 1.0 and 0 < v1 < v128 < 1


def test_fitted_figures_are_not_counted_as_checks():
    from sim.api.anchors import report

    a = ANCHORS["pr32374-eagle-itl"]
    figs = {a.name: [Figure(a.name, "m1", 1.0, 1.0, 0.1, fitted=True), Figure(a.name, "m2", 1.0, 1.5, 0.1),
                     Figure(a.name, "m3", 1.0, 1.05, 0.1)]}
    text = report([a], figs, "python -m sim.anchors", 1.0)
    assert "**1 of 2 figures within their targets** (1 more were fitted to" in text
    assert "| 1 of 2 (+1 fitted) | +50.0% (m2) |" in text and "yes (fitted)" in text


def test_mi350x_fit_is_reproducible():
    from sim.api.anchors import fit_pr52362_nospec
    from sim.core.models import get_gpu

    fit = fit_pr52362_nospec()
    g = get_gpu("mi350x-dsv4-fit")
    assert g.layer_overhead_us == pytest.approx(fit["layer_overhead_us"], rel=1e-3)
    assert g.flops_efficiency == pytest.approx(fit["flops_efficiency"], rel=1e-3)
    assert np.allclose(fit["fitted_ms"], fit["published_ms"], rtol=0.03)


# --------------------------------------------------------------------------------------------- the trace
OLD = ["import os\n", "\n", "def area(r):\n", "    return 3.14 * r * r\n", "\n", "\n",
       "class Shape:\n", "    def size(self):\n", "        return 0\n"]
NEW = ["import os\n", "\n", "def area(radius):\n", "    return math.pi * radius ** 2\n", "\n", "\n",
       "class Shape:\n", "    def size(self):\n", "        return 0\n"]


def test_model_shaped_output():
    from sim.core.trace.build_codeedit import ModelShape, model_shaped

    ops = [("replace", 2, 4, 2, 4)]
    user, out = model_shaped("p 1->2:m.py#0", "m.py", OLD, NEW, ops, 0)
    assert "math.pi * radius" not in user and "3.14 * r * r" in user  # the new text must be written
    assert "change the code at lines 3-4 in `area`" in user
    assert "```python\n" in out and "math.pi * radius ** 2" in out and out.count("```") == 2
    assert (user, out) == model_shaped("p 1->2:m.py#0", "m.py", OLD, NEW, ops, 0)  # seeded by the id
    whole = ModelShape(p_preamble=0.0, p_whole=1.0, p_explanation=0.0)
    assert model_shaped("x", "m.py", OLD, NEW, ops, 0, whole)[1] == "```python\n" + "".join(NEW) + "```\n"
    part = ModelShape(p_preamble=1.0, p_whole=0.0, context_lines=1, p_explanation=1.0)
    out = model_shaped("x", "m.py", OLD, NEW, ops, 0, part)[1]
    head, code, tail = out.split("```")
    assert head.strip() and tail.strip().startswith(("The changes", "Explanation", "What changed", "Summary"))
    assert code == "python\n\ndef area(radius):\n    return math.pi * radius ** 2\n\n"
    assert "`radius`" in tail or "`math`" in tail or "`area`" in tail


def test_model_shaped_trace_keeps_the_exact_traces_requests():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    ids = [json.loads(ln)["id"] for ln in (root / "traces/codeedit.jsonl").read_text().splitlines()]
    shaped = [json.loads(ln) for ln in (root / "traces/codeedit-model.jsonl").read_text().splitlines()]
    assert [r["id"] for r in shaped] == ids
    fenced = sum("```python\n" in r["output"] for r in shaped)
    assert fenced == len(shaped) and sum(not r["output"].startswith("```") for r in shaped) > len(shaped) // 2


def test_paper_shows_the_anchors_beside_the_code_edit_headline():
    from sim.api.report import anchor_lines

    rows = [Figure("pr24344-blazedit:codeedit-model", "share of steps with an n-gram draft",
                   0.547, 0.668, 0.10, "absolute").as_dict(),
            Figure("pr24344-blazedit:codeedit", "tokens per step, all steps", 2.96, 4.675,
                   0.15).as_dict(),
            Figure("pr32374-eagle-itl", "inter-token latency (ms), batch 1, K=0", 6.87, 7.35, 0.15).as_dict()]
    model = " ".join(anchor_lines(rows, "codeedit-model"))
    assert "0.668 vs 0.547" in model and "+0.121" in model and "missed" in model and "4.675" not in model
    exact = " ".join(anchor_lines(rows, "codeedit"))
    assert "4.675 vs 2.960" in exact and "+58%" in exact and "1 of 1 within 15%" in exact
    assert anchor_lines(None, "codeedit") == []


def test_tensor_parallel_on_the_command_line(capsys):
    from pathlib import Path

    from sim.api.run import main

    tiny = str(Path(__file__).resolve().parent / "fixtures" / "sim" / "tiny.jsonl")
    base = ["--trace", tiny, "--policy", "model-fixed:7", "--batch-size", "4", "--workers", "1", "--no-progress",
            "--format", "json", "--model", "deepseek-v4-flash"]
    with pytest.raises(SystemExit) as ei:
        run_cli(main, base + ["--gpu", "mi350x", "-tp", "8"])
    cap = capsys.readouterr()
    assert ei.value.code == 0, cap.err
    rows = json.loads(cap.out[cap.out.index("["):])
    assert {r["tensor_parallel_size"] for r in rows} == {8}
    with pytest.raises(SystemExit) as ei:
        run_cli(main, base + ["--gpu", "h100-sxm", "--tensor-parallel-size", "8"])
    err = capsys.readouterr().err
    assert ei.value.code == 2 and "interconnect_gbps" in err and err.count("\n") == 1


# --------------------------------------------------------------------------------------------- issue 44's anchor causes
def test_blazedit_eagle_counters_are_the_published_ones_and_the_copy_variants_change_only_copied_tokens():
    from sim.api.anchors import BLAZEDIT_EAGLE, EAGLE_COPY_VARIANTS
    from sim.core.drafters.model import load_drafter_profile

    # vLLM's counters: 1 + accepted / drafts = 1 + the acceptance at each draft position (2189 drafts, 3187 accepted)
    assert 1 + sum(BLAZEDIT_EAGLE["pos"]) == pytest.approx(BLAZEDIT_EAGLE["al"], abs=0.005)
    assert 1 + 3187 / 2189 == pytest.approx(BLAZEDIT_EAGLE["al"], abs=0.005)
    p = load_drafter_profile("eagle-llama3.1-8b:3")
    q = {name: f(p).q() for name, f in EAGLE_COPY_VARIANTS.items()}
    bundled, dspark, dspark_q1 = q.values()
    assert all(np.array_equal(v[0], bundled[0]) for v in q.values())  # normal tokens keep the MT-Bench fit
    assert np.array_equal(bundled[1], bundled[0])  # as bundled: no copy effect, copied = normal
    assert dspark[1][0] == dspark_q1[1][0] > bundled[1][0]  # the DSpark profile's copied q1 is higher
    assert np.all(dspark_q1[1][1:] < dspark[1][1:])  # with the normal decay, copied tokens decay faster


def test_the_blog_counts_acceptance_as_vllms_scheduler_does():
    from sim.api.anchors import scheduled_acceptance_length

    # two steps of 4 decoding requests; 6 tokens accepted; a request-step admitted no draft still counts as one
    steps = {"num_decode": np.array([4, 4]), "accepted_model": np.array([2, 4]), "verified_model": np.array([3, 9])}
    assert scheduled_acceptance_length(steps) == pytest.approx(1 + 6 / 8)


def test_pr25784_runs_its_ngram_arm_as_the_v1_runner_did():
    from sim.api.anchors import PR25784_NGRAM, pr25784_ngram_arm, vllm_spec
    from sim.core.policies import get_policy

    arm = pr25784_ngram_arm(vllm_spec(PR25784_NGRAM).ngram_k)
    assert arm == "ngram-fixed:5" and get_policy(arm).name == arm  # matched-only drafts, not vLLM 0.33's K slots
    assert "V1 model runner" in ANCHORS["pr25784-suffix"].setup


def test_an_anchor_whose_every_figure_is_fitted_is_reported_as_none_counted():
    """The EAGLE Blazedit anchors are all fitted: the report says so instead of failing on an empty list."""
    from sim.api.anchors import ANCHORS, Figure, report

    a = ANCHORS["pr24344-blazedit-eagle:codeedit"]
    figs = {a.name: [Figure(a.name, "m", 2.46, 2.3, 0.1, fitted=True)]}
    text = report([a], figs, "python -m sim.anchors", 1.0)
    assert "| 0 of 0 (+1 fitted) | none counted: every figure fitted |" in text and "**0 of 0 figures" in text


# --------------------------------------------------------------------------------------------- round 3 (issue 61)
def test_round3_published_figures_agree_with_their_own_arithmetic():
    """The typed-in tables of PR 52228 (Muse-Glimmer), PR 52992 and PR 48892 reproduce the totals each source
    states beside them: a digit mistyped in a table shows here."""
    from sim.api import anchors as A

    low, high = A.PR52228_GLIMMER.values()
    assert low[1] / low[0] - 1 == pytest.approx(0.153, abs=0.001) and high[1] / high[0] - 1 == pytest.approx(0.218, abs=0.001)
    assert 1 + sum(A.PR52992_POS_FIXED) == pytest.approx(A.PR52992_AL["model-fixed:16"], abs=0.01)
    assert A.PR52992_THROUGHPUT["adaptive"] / A.PR52992_THROUGHPUT["model-fixed:16"] - 1 == pytest.approx(1.838, abs=0.001)
    assert 1 + sum(A.PR48892_POS_8) == pytest.approx(A.PR48892_AL[8], abs=0.01)
    for pos in (A.PR52992_POS_FIXED, A.PR48892_POS_8):
        assert list(pos) == sorted(pos, reverse=True)  # a share of drafts accepted at j falls with j
    assert len(A.PR52992_POS_FIXED) == A.PR52992_K and max(A.PR52992_POSITIONS) == A.PR52992_K
    assert max(A.PR48892_POSITIONS) == len(A.PR48892_POS_8) == max(A.PR48892_AL)


class _FakeRes:
    def __init__(self, accepted: int, decode: int):
        self.steps = {"accepted_model": np.array([accepted]), "num_decode": np.array([decode])}


@pytest.fixture
def fake_runs(monkeypatch):
    """The round-3 anchors over a stub simulator: every run reports the same made-up figures, and each _prepare's
    arguments are recorded, so what an anchor compares (published value, target) and what it asks the simulator to
    run are checked without a simulation."""
    from sim.api import anchors as A

    calls = []

    def prepare(trace, **kw):
        calls.append({"trace": trace, **kw})
        return kw

    def run(prep, policy, batch, host_sync=False):
        thr = 200.0 if policy.startswith("adaptive") else 100.0
        row = {"output_throughput_tok_s": thr, "acceptance_per_position": [0.5] * 16}
        return row, _FakeRes(accepted=300 if policy.startswith("adaptive") else 400, decode=100)

    monkeypatch.setattr(A, "_prepare", prepare)
    monkeypatch.setattr(A, "_run", run)
    return A, calls


def test_round3_figures_carry_the_published_values_and_the_targets_set_in_code(fake_runs):
    A, calls = fake_runs
    glimmer = A._pr52228_glimmer()
    assert [f.published for f in glimmer] == pytest.approx([6236 / 5410, 3.61 / 3.88, 4861 / 3990, 2.56 / 2.65])
    assert [f.tolerance for f in glimmer] == [A.PR52228_GLIMMER_TOL, A.PR52228_GLIMMER_AL_TOL] * 2
    assert glimmer[0].simulated == pytest.approx(2.0) and glimmer[1].simulated == pytest.approx(4.0 / 5.0)
    glm = A._pr52992()
    assert glm[0].published == pytest.approx(4508.91 / 1588.78) and glm[0].tolerance == A.PR52992_RATIO_TOL
    assert [f.published for f in glm[1:3]] == [4.35, 3.76] and {f.tolerance for f in glm[1:3]} == {A.PR52992_AL_TOL}
    assert [f.published for f in glm[3:]] == [A.PR52992_POS_FIXED[j - 1] for j in A.PR52992_POSITIONS]
    assert all(f.tolerance_kind == "absolute" and f.tolerance == A.PR52992_POS_TOL for f in glm[3:])
    mtp = A._pr48892()
    assert [f.published for f in mtp[:2]] == [1.84, 4.40] and [f.simulated for f in mtp[:2]] == [5.0, 5.0]
    assert len(mtp) == 2 + len(A.PR48892_POSITIONS) and not any(f.fitted for f in glimmer + glm + mtp)
    # what each asked the simulator to run: the published GPU, model stand-in, parallelism and temperature
    g, p, m1, m8 = calls
    assert (g["model"], g["gpu"], g["temperature"], g["drafter"]) == ("qwen3-32b", "gb200", 1.0, "dspark-qwen3-b7:7")
    assert (p["model"], p["gpu"], p["tp"], p["temperature"], p["drafter"]) == ("glm-5.2", "gb200", 4, 1.0,
                                                                                "dspark-qwen3-b7:16")
    assert (m1["drafter"], m8["drafter"]) == ("mtp-standin:1", "mtp-standin:8") and "temperature" not in m8


def test_the_blog_and_the_kimi_table_run_at_the_published_temperature(fake_runs):
    A, calls = fake_runs
    A._dspark_blog()
    A._pr52228()
    assert [c["temperature"] for c in calls] == [1.0, 1.0] and [c["gpu"] for c in calls] == ["b300", "b300"]
    assert [c["model"] for c in calls] == ["deepseek-v4-flash", "kimi-k2.5"]  # the Kimi table runs its own model


def test_round3_specs_state_their_sources_and_fit_on_the_published_deployments():
    from sim.core.models import get_gpu

    g = get_gpu("gb200")
    assert (g.memory_bandwidth_tbps, g.bf16_tflops, g.memory_gib, g.piecewise_layer_us) == (8.0, 2500.0, 173.2, 0)
    assert "fitted to nothing" in g.source and "gb200-nvl72" in g.source
    glm = get_llm("glm-5.2")
    assert glm.is_moe and glm.expert_params == 75 * 256 * 3 * 6144 * 2048 and glm.num_layers == 78
    assert glm.kv_bytes_per_token == 78 * 576 * 2 * 1  # one 576-wide fp8 latent head, counted as K and V
    four = make_cost_model("roofline", "glm-5.2", "gb200", tensor_parallel_size=4)
    assert four.kv_capacity_tokens > 300_000  # 64 requests of speed-bench 1K/2K fit on 4x GB200
    with pytest.raises(ConfigError):
        make_cost_model("roofline", "glm-5.2", "gb200")  # 427 GB of weights do not fit one GB200
    kimi = get_llm("kimi-k2.5")
    assert kimi.expert_params == 60 * 384 * 3 * 7168 * 2048 and kimi.active_params == 32e9
    assert make_cost_model("roofline", "kimi-k2.5", "b300", tensor_parallel_size=8).kv_capacity_tokens > 300_000
    q = get_llm("qwen3-32b")
    assert q.tokenizer == "qwen3" and "Muse-Glimmer-30B" in q.source and not q.is_moe
    assert make_cost_model("roofline", "qwen3-32b", "gb200").kv_capacity_tokens > 64 * 4096


def test_pr48892_runs_what_method_mtp_maps_to():
    from sim.core.drafters.calibration import DEFAULT_CALIBRATOR, NgramCalibrator
    from sim.core.vllm import speculative_config
    from sim.api.anchors import PR48892_SPEC

    cal = NgramCalibrator.load(DEFAULT_CALIBRATOR).cfg
    for k in (1, 8):
        spec = speculative_config(PR48892_SPEC.format(k=k), (cal.n_min, cal.n_max), 7, mtp_layers=k, target="x")
        assert (spec.policy, spec.drafter) == (f"model-fixed:{k}", f"mtp-standin:{k}")
