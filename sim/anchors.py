"""python -m sim.anchors: the simulator against measurements vLLM's developers published, side by side.

Each anchor reproduces one published measurement with the closest setup the simulator can express and
records where the figure comes from (PR and what it measured), what cannot be matched, which part of the
simulator it checks, and which knobs (if any) were fitted to it. Every compared figure has a target
(`tolerance`), relative or absolute as the anchor states:

    error  = (simulated - published) / published                       (relative, signed)
    within = |error| <= tolerance            (relative tolerance)
             |simulated - published| <= tolerance                      (absolute tolerance: shares, ratios)

    python -m sim.anchors [--only NAME ...] [--json] [--out reports/anchors.md] [--force] [--no-report]

It prints the figures side by side (`--json`: a list of objects with keys anchor, metric, published,
simulated, error, tolerance, within, plus tolerance_kind and fitted) and writes the report (Markdown) and the
same list as JSON beside it (reports/anchors.json, which `python -m sim.report` shows beside the code-editing
headline), each written whole; existing ones are replaced only with --force, checked before any work. The anchors are
checks: nothing here tunes a knob, and a knob fitted to one of these measurements is named in its anchor.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from sim.cli_util import ArgumentParser, check_out_file, run_cli, write_whole
from sim.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = "reports/anchors.md"
CODEEDIT_TRACES = ("traces/codeedit.jsonl", "traces/codeedit-model.jsonl")


@dataclass(frozen=True)
class Figure:
    """One compared figure. tolerance_kind: 'relative' (of the published value) or 'absolute' (same units)."""

    anchor: str
    metric: str
    published: float
    simulated: float
    tolerance: float
    tolerance_kind: str = "relative"
    fitted: bool = False  # a knob was fitted to this very figure: it checks nothing

    @property
    def error(self) -> float:
        return (self.simulated - self.published) / self.published if self.published else math.nan

    @property
    def within(self) -> bool:
        if not math.isfinite(self.simulated):
            return False
        if self.tolerance_kind == "absolute":
            return abs(self.simulated - self.published) <= self.tolerance + 1e-12
        return abs(self.error) <= self.tolerance + 1e-12

    @property
    def miss(self) -> float:
        """How far outside (> 1) or inside (<= 1) its target the figure is: deviation / tolerance."""
        if self.tolerance_kind == "absolute":
            return abs(self.simulated - self.published) / self.tolerance
        return abs(self.error) / self.tolerance

    @property
    def deviation(self) -> str:
        """simulated - published in the target's terms: a relative error, or an absolute difference."""
        if self.tolerance_kind == "absolute":
            return f"{self.simulated - self.published:+.3f}"
        return f"{self.error:+.1%}"

    def as_dict(self) -> dict:
        return {"anchor": self.anchor, "metric": self.metric, "published": self.published,
                "simulated": self.simulated, "error": self.error, "tolerance": self.tolerance,
                "within": self.within, "tolerance_kind": self.tolerance_kind, "fitted": self.fitted}


@dataclass(frozen=True)
class Anchor:
    """A published measurement and how the simulator reproduces it (`run` returns its figures)."""

    name: str
    source: str      # PR and what it measured
    setup: str       # the simulator setup used
    unmatched: str   # what cannot be matched
    checks: str      # which part of the simulator it checks
    fitted: str      # knobs fitted to this anchor ("none" if none)
    run: Callable[[], list[Figure]] = field(repr=False, compare=False)


# --------------------------------------------------------------------------------------------- helpers
def _prepare(trace: str, *, policy_k: int | None = None, model: str = "qwen3-8b", gpu: str = "h100-sxm",
             tp: int = 1, drafter: str = "dspark-qwen3-b7"):
    """The simulator's Prepared for one trace (sim.run.prepare: what `python -m sim.run` would build for
    --trace TRACE --ngram-k K --model M --gpu G --tensor-parallel-size TP --drafter D)."""
    from sim.run import SimSetup, prepare

    path = REPO / trace if not Path(trace).is_absolute() else Path(trace)
    if not path.is_file():
        raise ConfigError(f"anchor trace {trace} not found (python -m sim.trace build builds the bundled traces)")
    setup = SimSetup(trace=str(path), model=model, gpu=gpu, drafter=drafter, tensor_parallel_size=tp,
                     ngram_k=policy_k or SimSetup.ngram_k)
    return prepare(setup)


def _run(prep, policy: str, batch: int, host_sync: bool = False):
    """One simulation (sim.run.run_one); host_sync: the policy's step reads GPU results on the host, so its
    CPU work no longer overlaps the GPU (sim/step_time.py), as vLLM 0.33's adaptive verification does when it
    copies the admitted draft counts to the host (model_runner.py: copy_admitted_drafts_to_host, set with
    batch-sharded sampling)."""
    from sim.run import run_one

    if not host_sync:
        row, res = run_one(prep, policy, batch)
    else:
        from sim.engine import Engine, EngineConfig
        from sim.metrics import summarize
        from sim.policies import get_policy

        pol = dataclasses.replace(get_policy(policy), host_sync=True)
        s = prep.setup
        cfg = EngineConfig(batch_size=batch, max_num_batched_tokens=s.max_num_batched_tokens, seed=s.seed,
                           async_scheduling=s.async_scheduling)
        res = Engine(prep.tables, prep.arrivals, pol, prep.cost, cfg).run()
        row = {"policy": pol.name, "batch_size": batch, **summarize(res, batch)}
    res.raise_if_lossy(f"anchor run {policy} at batch {batch}")
    return row, res


def ngram_step_stats(steps: dict, output_tokens: int, k: int) -> dict:
    """vLLM's spec-decode counters (examples/offline_inference/spec_decode.py) from a batch-1 run's steps:
    num_drafts = steps that verified an n-gram draft; accepted = their accepted tokens;
    tokens_without_sd = output - num_drafts - accepted (one token per step without a draft);
      share      = num_drafts / (num_drafts + tokens_without_sd)      steps with a draft
      per_draft  = 1 + accepted / num_drafts                          vLLM's "mean acceptance length"
      overall    = output / (num_drafts + tokens_without_sd)          its "seq normalized acceptance length"
      pos[j]     = drafts with >= j+1 accepted / num_drafts           its "acceptance at token j"."""
    ver = np.asarray(steps["verified_ngram"])
    acc = np.asarray(steps["accepted_ngram"])
    drafted = ver > 0
    n = int(drafted.sum())
    accepted = int(acc[drafted].sum())
    without = int(output_tokens) - n - accepted
    total_steps = n + without
    return {"share": n / total_steps, "per_draft": 1 + accepted / max(n, 1), "overall": output_tokens / total_steps,
            "pos": [float((acc[drafted] >= j + 1).sum() / max(n, 1)) for j in range(k)]}


# --------------------------------------------------------------------------------------------- PR 24344
BLAZEDIT = {"share": 0.547, "per_draft": 4.59, "overall": 2.96, "pos": (0.81, 0.74, 0.70, 0.68, 0.66)}


def _blazedit(trace: str, label: str) -> Callable[[], list[Figure]]:
    def run() -> list[Figure]:
        prep = _prepare(trace, policy_k=5)
        row, res = _run(prep, "ngram-fixed:5", 1)
        st = ngram_step_stats(res.steps, int(row["output_tokens"]), 5)
        name = f"pr24344-blazedit ({label})"
        out = [Figure(name, "share of steps with an n-gram draft", BLAZEDIT["share"], st["share"], 0.10, "absolute"),
               Figure(name, "tokens per step, all steps", BLAZEDIT["overall"], st["overall"], 0.15),
               Figure(name, "tokens per drafted step", BLAZEDIT["per_draft"], st["per_draft"], 0.10)]
        out += [Figure(name, f"acceptance at draft position {j + 1}", p, s, 0.10, "absolute")
                for j, (p, s) in enumerate(zip(BLAZEDIT["pos"], st["pos"]))]
        return out
    return run


BLAZEDIT_EAGLE_AL = 2.46  # EAGLE-1 (Llama-3.1-8B), K = 3, Blazedit: mean acceptance length (PR 24344)


def _blazedit_eagle(trace: str, label: str) -> Callable[[], list[Figure]]:
    def run() -> list[Figure]:
        prep = _prepare(trace, drafter="eagle-llama3.1-8b:3")
        row, res = _run(prep, "model-fixed:3", 1)
        ver = np.asarray(res.steps["verified_model"])
        acc = np.asarray(res.steps["accepted_model"])
        drafted = ver > 0
        al = 1 + float(acc[drafted].sum()) / max(int(drafted.sum()), 1)
        return [Figure(f"pr24344-blazedit-eagle ({label})", "EAGLE-1 K=3 mean acceptance length", BLAZEDIT_EAGLE_AL,
                       al, 0.10)]
    return run


# --------------------------------------------------------------------------------------------- PR 52362
# Output tokens/s (ShareGPT, 880 requests, output forced to 512 tokens): no speculation, fixed K=7, adaptive K<=7
PR52362 = {4: (381.53, 970.33, 902.37), 8: (729.20, 1762.59, 1616.77), 16: (1342.83, 2909.52, 2773.69),
           32: (2392.99, 4756.32, 4501.11), 64: (4094.75, 6712.35, 7144.12), 128: (6340.78, 8778.87, 10356.48),
           256: (8878.57, 7852.42, 13324.67)}
PR52362_OUTPUT_LEN = 512


def _sharegpt_512(n: int | None = None) -> Path:
    """The chat trace's prompts with every output forced to 512 tokens (length-only, as vLLM's benchmark
    forces the output length), written to a temporary file; acceptance then comes from the chat trace's
    statistical profile (sim.drafters.tables.stat_profile)."""
    src = REPO / "traces/chat.jsonl"
    lines = src.read_text().splitlines()[: n or None]
    rows = []
    for ln in lines:
        r = json.loads(ln)
        rows.append(json.dumps({"id": r["id"], "prompt": r["prompt"], "output_len": PR52362_OUTPUT_LEN,
                                "workload": "chat"}))
    d = Path(tempfile.mkdtemp(prefix="hybridspec-anchors-"))
    out = d / "sharegpt-512.jsonl"
    out.write_text("\n".join(rows) + "\n")
    return out


def _pr52362(model: str, gpu: str, tp: int, label: str, with_none: bool,
             host_sync: bool = False) -> Callable[[], list[Figure]]:
    def run() -> list[Figure]:
        trace = _sharegpt_512()
        prep = _prepare(str(trace), model=model, gpu=gpu, tp=tp)
        name = f"pr52362-adaptive ({label})"
        out = []
        for c, (nospec, fixed, adaptive) in PR52362.items():
            thr = {p: _run(prep, p, c, host_sync=host_sync and p == "adaptive")[0]["output_throughput_tok_s"]
                   for p in (("none",) if with_none else ()) + ("model-fixed:7", "adaptive")}
            out.append(Figure(name, f"adaptive / fixed K=7 at concurrency {c}", adaptive / fixed,
                              thr["adaptive"] / thr["model-fixed:7"], 0.07, "absolute"))
            if with_none:
                out.append(Figure(name, f"fixed K=7 / no speculation at concurrency {c}", fixed / nospec,
                                  thr["model-fixed:7"] / thr["none"], 0.15))
        return out
    return run


PR52362_CONTEXT = 830  # mean tokens of context per request while decoding: chat.jsonl's mean prompt (574) + 512 / 2
FIT_GPU = "mi350x-dsv4-fit"


def nospec_step_ms(cost, concurrency: int, context: int = PR52362_CONTEXT) -> float:
    """A no-speculation decoding step of `concurrency` requests (verify + sample, sim.cost RooflineCost)."""
    return cost.decode_step_ms(concurrency, context)


def fit_pr52362_nospec() -> dict:
    """The two knobs of models/gpus/mi350x-dsv4-fit.json, fitted to PR 52362's no-speculation arm only: the
    per-layer overhead (layer_overhead_us) and the GEMM efficiency (flops_efficiency) of mi350x that make
    deepseek-v4-flash at TP8 take the published no-spec step times, step(c) = c / throughput(c), in least squares
    of log step time over c = 4..256. The fixed-K and adaptive arms are not used, so the anchor's ratios stay
    checks. Returns the knobs and the fitted vs published step times [ms]."""
    import copy

    from scipy.optimize import least_squares

    from sim.cost import make_cost_model

    base = make_cost_model("roofline", "deepseek-v4-flash", "mi350x", tensor_parallel_size=8)
    g, m = base.gpu, base.llm
    conc = list(PR52362)
    pub = np.asarray([c / PR52362[c][0] * 1e3 for c in conc])

    def steps(x):
        layer_us, eff = x
        c = copy.copy(base)  # the two derived quantities these knobs set (sim/cost/roofline.py)
        c.overhead_ms = g.step_overhead_ms + m.num_layers * layer_us / 1e3
        c.ms_per_token = m.flops_per_token / base.tp / (g.bf16_tflops * 1e12 * eff / 1e3)
        c._tab_base = np.zeros(0)
        return np.asarray([nospec_step_ms(c, n) for n in conc])

    r = least_squares(lambda x: np.log(steps(x)) - np.log(pub), [200.0, 0.02], bounds=([0.0, 1e-4], [1e4, 1.0]))
    return {"layer_overhead_us": float(r.x[0]), "flops_efficiency": float(r.x[1]),
            "fitted_ms": steps(r.x).tolist(), "published_ms": pub.tolist()}


# --------------------------------------------------------------------------------------------- PR 32374
# Inter-token latency (ms) of Llama-3.1-8B with EAGLE-1 on MT-Bench, per batch size, at K = 0, 1, 3, 5, 7
PR32374 = {1: (6.87, 7.97, 9.41, 10.8, 12.29), 32: (7.64, 8.97, 10.78, 12.81, 14.86)}
PR32374_K = (0, 1, 3, 5, 7)
MTBENCH_CONTEXT = 256  # tokens of context per request during decoding (an MT-Bench prompt + part of its answer)


def eagle_itl_ms(cost, batch: int, k: int, context: int = MTBENCH_CONTEXT, async_scheduling: bool = True) -> float:
    """One decoding step of `batch` requests verifying k EAGLE tokens each, as the engine charges it
    (sim/step_time.py): draft(B, k) + alloc(B) + verify(graph_tokens(B (k+1)), B context, B) + sample(B (k+1)),
    overlapped with cpu(B, B (k+1)) under asynchronous scheduling. With every draft accepted or not, a
    streamed chunk arrives once per step, so this is the inter-token latency vLLM's benchmark reports."""
    from sim.step_time import step_time

    t = batch * (k + 1)
    draft = cost.draft_ms(batch, k) if k else 0.0
    alloc = cost.alloc_ms(batch, policy=f"model-fixed:{k}") if k else 0.0
    verify = float(cost.verify_ms(int(cost.graph_tokens(t)), batch * context, batch))
    _, step = step_time(draft, 0.0, alloc, verify, cost.sample_ms(t), cost.cpu_ms(batch, t), not async_scheduling)
    return step


def _pr32374() -> list[Figure]:
    from sim.cost import make_cost_model

    cost = make_cost_model("roofline", "llama-3.1-8b", "h100-sxm", drafter="eagle-llama3.1-8b-cost")
    out = []
    for b, row in PR32374.items():
        for k, pub in zip(PR32374_K, row):
            out.append(Figure("pr32374-eagle-itl", f"inter-token latency (ms), batch {b}, K={k}", pub,
                              eagle_itl_ms(cost, b, k), 0.15))
    return out


# --------------------------------------------------------------------------------------------- registry
ANCHORS: dict[str, Anchor] = {}


def _register(a: Anchor) -> None:
    ANCHORS[a.name] = a


for _trace, _label in zip(CODEEDIT_TRACES, ("codeedit.jsonl, copy-heavy bound", "codeedit-model.jsonl, model-shaped")):
    _register(Anchor(
        name=f"pr24344-blazedit:{Path(_trace).stem}",
        source="vLLM PR 24344 (ngram-eagle hybrid): n-gram speculation (K=5, prompt_lookup_min 2, max 5) on 90 "
               "Blazedit edit prompts, Llama-3.1-8B-Instruct, offline spec_decode.py counters: n-gram draft on "
               "54.7% of steps, 4.59 tokens per drafted step, 2.96 over all steps, acceptance .81 .74 .70 .68 .66 "
               "at draft positions 1-5",
        setup=f"{_trace}, ngram-fixed:5 with --ngram-k 5 (n 2..5), batch 1, temperature 0; counters from the "
              "run's steps exactly as vLLM counts them (ngram_step_stats)",
        unmatched="Blazedit's prompts and Llama-3.1-8B's outputs are not available offline: the trace's own edits "
                  "(Python release pairs, Qwen3 tokenizer) stand in; the share of steps with a draft depends on how "
                  "much of an output is new text, which is a property of the trace",
        checks="the n-gram drafter (matching rule, chain length, exact acceptance) and the trace's output shape",
        fitted="none (codeedit-model.jsonl's shape parameters come from public descriptions of edit-model "
               "outputs, traces/README.md; none was fitted on these figures)",
        run=_blazedit(_trace, _label)))

for _trace, _label in zip(CODEEDIT_TRACES, ("codeedit.jsonl, copy-heavy bound", "codeedit-model.jsonl, model-shaped")):
    _register(Anchor(
        name=f"pr24344-blazedit-eagle:{Path(_trace).stem}",
        source="vLLM PR 24344: EAGLE-1 (yuhuili/EAGLE-LLaMA3.1-Instruct-8B) with K = 3 on the same 90 Blazedit "
               "prompts: mean acceptance length 2.46 (vLLM's counter: 1 + accepted / drafts)",
        setup=f"{_trace}, model-fixed:3 with the eagle-llama3.1-8b profile at block 3 (--drafter "
              "eagle-llama3.1-8b:3, what --speculative-config method eagle runs), batch 1, temperature 0",
        unmatched="as the n-gram anchor on this trace; the EAGLE profile is fitted on MT-Bench (chat), so its "
                  "acceptance of copied code tokens is the DSpark profile's assumption (q1[copied] 0.897)",
        checks="the EAGLE-style drafter profile out of its fitting domain (code edits instead of chat)",
        fitted="none (the profile's q1 and decay are fitted to MT-Bench acceptance lengths, issue 20780)",
        run=_blazedit_eagle(_trace, _label)))

_register(Anchor(
    name="pr52362-adaptive:dense",
    source="vLLM PR 52362 (ROCm DSv4 DSpark adaptive verification): DeepSeek-V4-Flash-DSpark, 284B FP4 MoE, TP8 on "
           "8x MI350X, raw ShareGPT with output forced to 512 tokens, 880 requests per cell: output throughput of "
           "no speculation, fixed K=7 and adaptive K<=7 at concurrency 4-256",
    setup="the nearest dense setup: qwen3-8b on one H100 (roofline), dspark-qwen3-b7 profile; chat.jsonl's 600 "
          "prompts with outputs forced to 512 tokens (length-only: acceptance from the chat trace's profile); "
          "batch size = concurrency",
    unmatched="the model (dense 8B vs 284B MoE), the GPU (H100 vs MI350X), TP1 vs TP8, the DSV4 DSpark drafter's "
              "acceptance and ROCm's kernels; kept as the before-picture of the MoE anchor below",
    checks="adaptive verification's budget (sim/policies/adaptive.py) against fixed K on the roofline cost model",
    fitted="none",
    run=_pr52362("qwen3-8b", "h100-sxm", 1, "qwen3-8b, H100, TP1", with_none=False)))

_register(Anchor(
    name="pr52362-adaptive:moe",
    source="vLLM PR 52362, as above",
    setup="deepseek-v4-flash (models/llms: 284B total, 13B active, 256 experts, top-6, FP4 experts) on mi350x at "
          "tensor_parallel_size 8 (roofline with MoE expert streaming and all-reduces), dspark-qwen3-b7 profile, the "
          "same 512-token ShareGPT workload; batch size = concurrency",
    unmatched="the DSV4 DSpark drafter's acceptance (the Qwen3 DSpark profile stands in), DeepSeek-V4's compressed "
              "sparse attention (modelled as one 512-wide KV head), ROCm kernel efficiencies (H100's fitted ones "
              "are reused), routing skew (uniform routing assumed), varlen-graph and host-side costs of adaptive "
              "verification (only its GPU kernels are priced)",
    checks="the MoE/TP roofline (sim/cost/roofline.py) and adaptive verification's own per-step cost (alloc_ms)",
    fitted="none",
    run=_pr52362("deepseek-v4-flash", "mi350x", 8, "deepseek-v4-flash, MI350X, TP8", with_none=True)))

_register(Anchor(
    name="pr52362-adaptive:moe-fit",
    source="vLLM PR 52362, as above",
    setup=f"as pr52362-adaptive:moe, on {FIT_GPU}: mi350x with layer_overhead_us and flops_efficiency fitted to the "
          "published no-speculation throughput (fit_pr52362_nospec); adaptive verification's budget and kernels "
          "as the simulator runs them",
    unmatched="as pr52362-adaptive:moe; the fitted per-token cost (about 73 us per token, 2.5% of MI350X's BF16 "
              "peak at 13B active parameters) stands for whatever the ROCm DeepSeek-V4 path spends per token "
              "(sparse-attention indexers, MoE dispatch), which no datasheet gives",
    checks="whether, with the deployment's measured no-spec step costs, fixed K=7 and adaptive verification "
           "land where the published arms did",
    fitted="layer_overhead_us = 193.8 and flops_efficiency = 0.0251 of mi350x-dsv4-fit, fitted to this PR's "
           "no-speculation arm (7 throughputs); the fixed/no-spec and adaptive/fixed ratios are not fitted",
    run=_pr52362("deepseek-v4-flash", FIT_GPU, 8, "deepseek-v4-flash, MI350X fitted, TP8", with_none=True)))

_register(Anchor(
    name="pr52362-adaptive:moe-fit-hostsync",
    source="vLLM PR 52362, as above",
    setup=f"as pr52362-adaptive:moe-fit, with adaptive's admitted draft counts copied to the host every step "
          "(a host sync: its CPU work stops overlapping the GPU), as vLLM 0.33 does under batch-sharded sampling",
    unmatched="whether PR 52362's runs had batch-sharded sampling on is not stated; the host's per-step time is "
              "the H100 spec's, not measured on that machine",
    checks="how much of adaptive's low-concurrency loss a host sync explains",
    fitted="as pr52362-adaptive:moe-fit",
    run=_pr52362("deepseek-v4-flash", FIT_GPU, 8, "deepseek-v4-flash, MI350X fitted, TP8, adaptive host sync",
                 with_none=False, host_sync=True)))

_register(Anchor(
    name="pr32374-eagle-itl",
    source="vLLM PR 32374 (a test fixture of step latencies, some of its rows synthetic): Llama-3.1-8B with "
           "EAGLE-1 on MT-Bench, H100, inter-token latency in ms at K = 0/1/3/5/7 for batch 1 and 32. Only these "
           "two rows are compared; which fixture rows are measured could not be re-read from this machine, and no "
           "batch-64 row is used",
    setup=f"llama-3.1-8b on h100-sxm (roofline), eagle-llama3.1-8b-cost (sequential EAGLE head: K passes), "
          f"{MTBENCH_CONTEXT} tokens of context per request, asynchronous scheduling (eagle_itl_ms)",
    unmatched="the exact context lengths of MT-Bench requests during decoding (a representative 256 is used), "
              "EAGLE's first pass over the accepted tokens (one position per request is priced)",
    checks="the roofline verify cost and the sequential drafter's per-token cost",
    fitted="none",
    run=_pr32374))


# --------------------------------------------------------------------------------------------- output
def _fmt(v: float) -> str:
    return "nan" if not math.isfinite(v) else f"{v:.3f}"


def table(figures: list[Figure]) -> str:
    """Published vs simulated side by side (Markdown table)."""
    lines = ["| anchor | metric | published | simulated | error (relative, or the difference for ± targets) | target "
             "| within |", "|---|---|---:|---:|---:|---:|---|"]
    for f in figures:
        tol = f"±{f.tolerance:g}" if f.tolerance_kind == "absolute" else f"±{f.tolerance:.0%}"
        lines.append(f"| {f.anchor} | {f.metric} | {_fmt(f.published)} | {_fmt(f.simulated)} | {f.deviation} | "
                     f"{tol} | {'yes' if f.within else '**no**'}{' (fitted)' if f.fitted else ''} |")
    return "\n".join(lines)


def report(anchors: list[Anchor], figures: dict[str, list[Figure]], command: str, wall_s: float) -> str:
    n = sum(len(v) for v in figures.values())
    ok = sum(f.within for v in figures.values() for f in v)
    out = ["# The simulator against published measurements", "",
           f"Made by `{command}` ({wall_s:.0f} s on the machine that ran it). Simulation only: each figure is the "
           "simulator's reproduction of a published measurement, none is a real run of this project.", "",
           f"**{ok} of {n} figures within their targets.** A target is relative (of the published value) unless "
           "written ±x without %, which is absolute in the figure's units (shares, ratios). What the misses say "
           "about the simulator's missing mechanisms: docs/anchors.md.", "",
           "| anchor | figures within target | largest miss (in its target's terms) |", "|---|---:|---|"]
    for a in anchors:
        fs = figures[a.name]
        worst = max(fs, key=lambda f: f.miss if math.isfinite(f.miss) else math.inf)
        out.append(f"| {a.name} | {sum(f.within for f in fs)} of {len(fs)} | {worst.deviation} ({worst.metric}) |")
    out.append("")
    for a in anchors:
        out += [f"## {a.name}", "", f"- **Source:** {a.source}", f"- **Simulator setup:** {a.setup}",
                f"- **Cannot be matched:** {a.unmatched}", f"- **Checks:** {a.checks}",
                f"- **Knobs fitted to this anchor:** {a.fitted}", "", table(figures[a.name]), ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m sim.anchors", description=__doc__.splitlines()[0],
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--only", action="append", default=None, metavar="NAME",
                    help=f"run only this anchor (repeatable; a name or its prefix before ':'): {', '.join(ANCHORS)}")
    ap.add_argument("--json", action="store_true", help="print the figures as a JSON list instead of a table")
    ap.add_argument("--out", default=DEFAULT_OUT, help="the Markdown report to write")
    ap.add_argument("--force", action="store_true", help="replace an existing --out")
    ap.add_argument("--no-report", action="store_true", help="print only; write no report")
    a = ap.parse_args(argv)
    chosen = list(ANCHORS.values())
    if a.only:
        chosen = []
        for name in a.only:
            hit = [x for x in ANCHORS.values() if name in (x.name, x.name.split(":")[0])]
            if not hit:
                raise ConfigError(f"--only: unknown anchor {name!r}; choose one of: {', '.join(ANCHORS)}")
            chosen += [x for x in hit if x not in chosen]
    json_out = Path(a.out).with_suffix(".json")  # the figures as data, beside the report (read by sim.report)
    if not a.no_report:
        check_out_file(a.out, a.force, "--out")  # before any work
        check_out_file(json_out, a.force, "--out")
    t0 = time.perf_counter()
    figures: dict[str, list[Figure]] = {}
    for i, anc in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {anc.name} ...", file=sys.stderr, flush=True)
        figures[anc.name] = [dataclasses.replace(f, anchor=anc.name) for f in anc.run()]  # --only's names
    wall = time.perf_counter() - t0
    flat = [f for anc in chosen for f in figures[anc.name]]
    if a.json:
        print(json.dumps([f.as_dict() for f in flat], indent=1))
    else:
        print(table(flat))
        print(f"{sum(f.within for f in flat)} of {len(flat)} figures within their targets ({wall:.0f} s)")
    if not a.no_report:
        cmd = ("python -m sim.anchors" + "".join(f" --only {n}" for n in (a.only or ()))
               + (" --force" if a.force else ""))
        text = report(chosen, figures, cmd, wall) + "\n"  # both rendered before either is written
        data = json.dumps([f.as_dict() for f in flat], indent=1) + "\n"
        write_whole(Path(a.out), text, overwrite=a.force)
        write_whole(json_out, data, overwrite=a.force)
        print(f"wrote {a.out} and {json_out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_cli(main)
