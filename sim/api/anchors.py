"""python -m sim.anchors: the simulator against measurements vLLM's developers published, side by side.

Each anchor reproduces one published measurement with the closest setup the simulator can express and
records where the figure comes from (PR and what it measured), what cannot be matched, which part of the
simulator it checks, and which knobs (if any) were fitted to it. Every compared figure has a target
(`tolerance`), relative or absolute as the anchor states:

    error  = (simulated - published) / published                       (relative, signed)
    within = |error| <= tolerance            (relative tolerance)
             |simulated - published| <= tolerance                      (absolute tolerance: shares, ratios)

    python -m sim.anchors [--only NAME ...] [--json] [--out out/anchors/anchors.md] [--force] [--no-report]

It prints the figures side by side (`--json`: a list of objects with keys anchor, metric, published,
simulated, error, tolerance, within, plus tolerance_kind and fitted) and writes the report (Markdown) and the
same list as JSON beside it (anchors.json, which `python -m sim.report` shows beside the code-editing headline
of reports/), the two as one unit; existing ones are replaced only with --force, the tracked reports/anchors.md only
when named with --out (`--out reports/anchors.md --force`), checked before any work. The anchors are
checks: nothing here tunes a knob, and a knob fitted to one of these measurements is named in its anchor.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from sim.infra.cli import ArgumentParser, check_out_file, flag_given, write_files
from sim.infra.fsio import temp_dir
from sim.infra.errors import ConfigError
from sim.infra import paths

if TYPE_CHECKING:
    from sim.core.drafters.model import ModelDrafterProfile

REPO = paths.REPO
DEFAULT_OUT = "out/anchors/anchors.md"  # reports/anchors.md, the tracked copy, only when named
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
             tp: int = 1, drafter: str = "dspark-qwen3-b7", sample: int | None = None, drafters: str | None = None,
             drafter_config: str | None = None, profile: ModelDrafterProfile | None = None,
             temperature: float | None = None):
    """The simulator's Prepared for one trace (sim.api.run.prepare: what `python -m sim.run` would build for
    --trace TRACE --ngram-k K --model M --gpu G --tensor-parallel-size TP --drafter D --num-prompts N --drafters DS
    --drafter-config C --temperature T --tokenizer qwen3: the bundled traces' Qwen3 text stands in for every anchor
    model's, as each anchor's `unmatched` says); `profile` (a ModelDrafterProfile) replaces D's, as prepare's does;
    temperature None keeps the trace's own (0 in the bundled traces)."""
    from sim.api.run import SimSetup, prepare

    path = REPO / trace if not Path(trace).is_absolute() else Path(trace)
    if not path.is_file():
        raise ConfigError(f"anchor trace {trace} not found (python -m sim.trace build builds the bundled traces)")
    setup = SimSetup(trace=str(path), model=model, gpu=gpu, drafter=drafter, tensor_parallel_size=tp,
                     ngram_k=policy_k or SimSetup.ngram_k, tokenizer="qwen3", sample=sample,
                     drafters=drafters or SimSetup.drafters, drafter_config=drafter_config, temperature=temperature)
    return prepare(setup, profile=profile)


def _run(prep, policy: str, batch: int, host_sync: bool = False):
    """One simulation (sim.api.run.run_one); host_sync: the policy's step reads GPU results on the host, so its
    CPU work no longer overlaps the GPU (sim/engine/step_time.py), as vLLM 0.33's adaptive verification does when it
    copies the admitted draft counts to the host (model_runner.py: copy_admitted_drafts_to_host, set with
    batch-sharded sampling)."""
    from sim.api.run import run_one

    if not host_sync:
        row, res = run_one(prep, policy, batch)
    else:
        from sim.engine.engine import Engine, EngineConfig
        from sim.core.metrics import summarize
        from sim.engine.policies import sim_policy

        pol = dataclasses.replace(sim_policy(policy), host_sync=True)
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
# The published runs' max_tokens: vLLM's examples/offline_inference/spec_decode.py samples with
# max_tokens = --output-len (default 256); the command's --hf-output-len 2048 only sets the dataset's expected
# length, which that script does not pass on. Both runs report 5376 output tokens = exactly 21 x 256: read as
# every answer cut at 256 tokens, 21 of the 90 prompts asked for passing the --blazedit-min/max-distance filter.
BLAZEDIT_MAX_TOKENS = 256


def capped_trace(trace: str, max_tokens: int, dest: Path, model: str = "qwen3-8b") -> Path:
    """`trace` with every output cut at its first `max_tokens` tokens (the served model's tokenizer), as a
    token-id trace in the folder `dest` (a temp_dir): what a run with max_tokens = `max_tokens` generates at
    temperature 0."""
    from sim.core.models import llm_name
    from sim.core.trace import load_trace
    from sim.core.trace.formats import write_jsonl
    from sim.core.trace.tokenizer import tokenizer_for

    path = REPO / trace if not Path(trace).is_absolute() else Path(trace)
    if not path.is_file():
        raise ConfigError(f"anchor trace {trace} not found (python -m sim.trace build builds the bundled traces)")
    tr = load_trace(path, tokenizer=tokenizer_for(llm_name(model))[0])
    out = Path(dest) / f"{path.stem}-max{max_tokens}.jsonl"
    write_jsonl(out, ({"id": r.id, "prompt_ids": r.prompt_ids.tolist(), "output_ids": r.output_ids[:max_tokens].tolist(),
                       **({"workload": r.workload} if r.workload else {})} for r in tr.requests))
    return out


def _blazedit(trace: str, label: str) -> Callable[[], list[Figure]]:
    def run() -> list[Figure]:
        st = blazedit_stats(trace)
        name = f"pr24344-blazedit ({label})"
        out = [Figure(name, "share of steps with an n-gram draft", BLAZEDIT["share"], st["share"], 0.10, "absolute"),
               Figure(name, "tokens per step, all steps", BLAZEDIT["overall"], st["overall"], 0.15),
               Figure(name, "tokens per drafted step", BLAZEDIT["per_draft"], st["per_draft"], 0.10)]
        out += [Figure(name, f"acceptance at draft position {j + 1}", p, s, 0.10, "absolute")
                for j, (p, s) in enumerate(zip(BLAZEDIT["pos"], st["pos"]))]
        return out
    return run


def blazedit_stats(trace: str, max_tokens: int | None = BLAZEDIT_MAX_TOKENS) -> dict:
    """vLLM's n-gram counters (ngram_step_stats) of ngram-fixed:5 at batch 1 on `trace`, outputs cut at max_tokens."""
    with temp_dir("hybridspec-anchors-") as d:  # the trace is read while the run streams it
        path = str(capped_trace(trace, max_tokens, d)) if max_tokens else trace
        prep = _prepare(path, policy_k=5)
        row, res = _run(prep, "ngram-fixed:5", 1)
    return ngram_step_stats(res.steps, int(row["output_tokens"]), 5)


SHAPE_VARIANTS = {"as bundled": {}, "no preamble": {"p_preamble": 0.0}, "always a preamble": {"p_preamble": 1.0},
                  "whole code in half the answers": {"p_whole": 0.5}, "always the whole code": {"p_whole": 1.0},
                  "no explanation": {"p_explanation": 0.0}, "always an explanation": {"p_explanation": 1.0}}


def blazedit_shape_sensitivity(progress: bool = True) -> list[dict]:
    """How the Blazedit anchor's three figures on the model-shaped trace move with its shape assumptions
    (sim.core.trace.build_codeedit.ModelShape, none fitted): the trace is rebuilt in a temporary folder with one
    parameter moved at a time (same wheels, edits and seeds; the bundled file is not touched) and counted at
    the published max_tokens. Prints a Markdown table; returns its rows.

        python -c "from sim.api.anchors import blazedit_shape_sensitivity as s; s()"     (about 3 minutes)"""
    from sim.core.trace import build_codeedit as bc

    rows = []
    with temp_dir("hybridspec-shapes-") as d:
        for i, (label, change) in enumerate(SHAPE_VARIANTS.items()):
            shape = dataclasses.replace(bc.MODEL_SHAPE, **change)
            out = d / f"codeedit-model-{i}.jsonl"
            bc.build(out, progress=False, shape="model", model_shape=shape)
            st = blazedit_stats(str(out))
            rows.append({"variant": label, **dataclasses.asdict(shape), "share": st["share"],
                         "overall": st["overall"], "per_draft": st["per_draft"]})
            if progress:
                print(f"[{i + 1}/{len(SHAPE_VARIANTS)}] {label}: share {st['share']:.3f}", file=sys.stderr, flush=True)
    print("| ModelShape | share of steps with a draft (0.547 ±0.10) | tokens/step (2.96 ±15%) | per drafted step "
          "(4.59 ±10%) |\n|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['variant']} | {r['share']:.3f} | {r['overall']:.2f} | {r['per_draft']:.2f} |")
    return rows


# EAGLE-1 (yuhuili/EAGLE-LLaMA3.1-Instruct-8B), K = 3, on the same Blazedit run (PR 24344, spec_decode.py's
# counters: 2189 drafts, 3187 accepted tokens): mean acceptance length and the share of drafts accepted at
# draft positions 1-3 (the conditional acceptance 0.77, 0.58, 0.53 by depth: MT-Bench's depth decay).
BLAZEDIT_EAGLE = {"al": 2.46, "pos": (0.77, 0.45, 0.24)}
BLAZEDIT_EAGLE_K = 3


def blazedit_eagle_stats(trace: str, profile: ModelDrafterProfile | None = None) -> dict:
    """vLLM's counters of model-fixed:3 at batch 1 on `trace` cut at the published max_tokens, with the
    eagle-llama3.1-8b profile at block 3 or `profile` (a ModelDrafterProfile of block 3):
        al     = 1 + accepted / drafts                     (a draft: a step that verified a model draft)
        pos[j] = drafts with >= j + 1 accepted / drafts    (vLLM's "acceptance at token j")."""
    with temp_dir("hybridspec-anchors-") as d:
        prep = _prepare(str(capped_trace(trace, BLAZEDIT_MAX_TOKENS, d)),
                        drafter=f"eagle-llama3.1-8b:{BLAZEDIT_EAGLE_K}", profile=profile)
        _, res = _run(prep, f"model-fixed:{BLAZEDIT_EAGLE_K}", 1)
    acc = np.asarray(res.steps["accepted_model"])[np.asarray(res.steps["verified_model"]) > 0]
    n = max(len(acc), 1)
    return {"al": 1 + float(acc.sum()) / n, "pos": [float((acc >= j + 1).sum()) / n for j in range(BLAZEDIT_EAGLE_K)]}


def _blazedit_eagle(trace: str, label: str) -> Callable[[], list[Figure]]:
    def run() -> list[Figure]:
        st, name = blazedit_eagle_stats(trace), f"pr24344-blazedit-eagle ({label})"
        # fitted: the profiles' copied-token values were chosen after this anchor's miss (see the anchor's `fitted`)
        return [Figure(name, "EAGLE-1 K=3 mean acceptance length", BLAZEDIT_EAGLE["al"], st["al"], 0.10,
                       fitted=True)] + [
            Figure(name, f"EAGLE-1 K=3 acceptance at draft position {j + 1}", p, s, 0.10, "absolute", fitted=True)
            for j, (p, s) in enumerate(zip(BLAZEDIT_EAGLE["pos"], st["pos"]))]
    return run


# The EAGLE profiles give copied tokens the normal tokens' q1 and decay (fitted to MT-Bench with every token treated
# alike); before, they borrowed the DSpark profile's copied-token acceptance. Each variant rebuilds the profile.
def _dspark_copy(p):
    from sim.core.drafters.model import load_drafter_profile
    d = load_drafter_profile("dspark-qwen3-b7")
    return dataclasses.replace(p, q1=(p.q1[0], d.q1[1]), decay=(p.decay[0], d.decay[1]))


EAGLE_COPY_VARIANTS = {
    "as bundled (copied = normal, as fitted)": lambda p: p,
    "copied tokens with the DSpark profile's q1 and decay (the earlier assumption)": _dspark_copy,
    "copied tokens with the DSpark profile's q1, normal decay":
        lambda p: dataclasses.replace(_dspark_copy(p), decay=p.decay),
}


def eagle_copy_sensitivity() -> list[dict]:
    """The EAGLE Blazedit figures on both code-editing traces under each EAGLE_COPY_VARIANTS profile (the bundled
    file is not touched). Prints a Markdown table; returns its rows.

        python -c "from sim.api.anchors import eagle_copy_sensitivity as s; s()"     (about 30 s)"""
    from sim.core.drafters.model import load_drafter_profile

    base = load_drafter_profile(f"eagle-llama3.1-8b:{BLAZEDIT_EAGLE_K}")
    rows = [{"trace": t, "variant": v, **blazedit_eagle_stats(t, f(base))}
            for t in CODEEDIT_TRACES for v, f in EAGLE_COPY_VARIANTS.items()]
    pub = BLAZEDIT_EAGLE
    print(f"| trace | EAGLE profile | acceptance length ({pub['al']} ±10%) | positions 1-3 "
          f"({' / '.join(map(str, pub['pos']))} ±0.10) |\n|---|---|---:|---|")
    for r in rows:
        print(f"| {Path(r['trace']).name} | {r['variant']} | {r['al']:.3f} | {' / '.join(f'{x:.3f}' for x in r['pos'])} |")
    return rows


# --------------------------------------------------------------------------------------------- PR 52362
# Output tokens/s (ShareGPT, 880 requests, output forced to 512 tokens): no speculation, fixed K=7, adaptive K<=7
PR52362 = {4: (381.53, 970.33, 902.37), 8: (729.20, 1762.59, 1616.77), 16: (1342.83, 2909.52, 2773.69),
           32: (2392.99, 4756.32, 4501.11), 64: (4094.75, 6712.35, 7144.12), 128: (6340.78, 8778.87, 10356.48),
           256: (8878.57, 7852.42, 13324.67)}
PR52362_OUTPUT_LEN = 512


def _sharegpt_512(dest: Path, n: int | None = None) -> Path:
    """The chat trace's prompts with every output forced to 512 tokens (length-only, as vLLM's benchmark
    forces the output length), written into the folder `dest` (a temp_dir); acceptance then comes from the
    chat trace's statistical profile (sim.core.drafters.tables.stat_profile)."""
    src = REPO / "traces/chat.jsonl"
    lines = src.read_text().splitlines()[: n or None]
    rows = []
    for ln in lines:
        r = json.loads(ln)
        rows.append(json.dumps({"id": r["id"], "prompt": r["prompt"], "output_len": PR52362_OUTPUT_LEN,
                                "workload": "chat"}))
    out = Path(dest) / "sharegpt-512.jsonl"
    out.write_text("\n".join(rows) + "\n")
    return out


def _pr52362(model: str, gpu: str, tp: int, label: str, with_none: bool,
             host_sync: bool = False, fitted: tuple[str, ...] = ()) -> Callable[[], list[Figure]]:
    """The anchor's figures on one setup; `fitted`: the metrics a knob of the setup was fitted to (marked)."""
    def run() -> list[Figure]:
        with temp_dir("hybridspec-anchors-") as d:
            return figures(_prepare(str(_sharegpt_512(d)), model=model, gpu=gpu, tp=tp))

    def figures(prep) -> list[Figure]:
        name = f"pr52362-adaptive ({label})"
        out = []
        for c, (nospec, fixed, adaptive) in PR52362.items():
            thr = {p: _run(prep, p, c, host_sync=host_sync and p == "adaptive")[0]["output_throughput_tok_s"]
                   for p in (("none",) if with_none else ()) + ("model-fixed:7", "adaptive")}
            m = f"adaptive / fixed K=7 at concurrency {c}"
            out.append(Figure(name, m, adaptive / fixed, thr["adaptive"] / thr["model-fixed:7"], 0.07, "absolute",
                              fitted=m in fitted))
            if with_none:
                m = f"fixed K=7 / no speculation at concurrency {c}"
                out.append(Figure(name, m, fixed / nospec, thr["model-fixed:7"] / thr["none"], 0.15,
                                  fitted=m in fitted))
        return out
    return run


PR52362_CONTEXT = 830  # mean tokens of context per request while decoding: chat.jsonl's mean prompt (574) + 512 / 2
FIT_GPU = "mi350x-dsv4-fit"


def nospec_step_ms(cost, concurrency: int, context: int = PR52362_CONTEXT) -> float:
    """A no-speculation decoding step of `concurrency` requests (verify + sample, sim.core.cost RooflineCost)."""
    return cost.decode_step_ms(concurrency, context)


def fit_pr52362_nospec() -> dict:
    """The two knobs of models/gpus/mi350x-dsv4-fit.json, fitted to PR 52362's no-speculation arm only: the
    per-layer overhead (layer_overhead_us) and the GEMM efficiency (flops_efficiency) of mi350x that make
    deepseek-v4-flash at TP8 take the published no-spec step times, step(c) = c / throughput(c), in least squares
    of log step time over c = 4..256. The fixed-K and adaptive arms are not used, so the anchor's ratios stay
    checks. Returns the knobs and the fitted vs published step times [ms]."""
    import copy

    from scipy.optimize import least_squares

    from sim.core.cost import make_cost_model

    base = make_cost_model("roofline", "deepseek-v4-flash", "mi350x", tensor_parallel_size=8)
    g, m = base.gpu, base.llm
    conc = list(PR52362)
    pub = np.asarray([c / PR52362[c][0] * 1e3 for c in conc])

    def steps(x):
        layer_us, eff = x
        c = copy.copy(base)  # the two derived quantities these knobs set (sim/core/cost/roofline.py)
        c.overhead_ms = g.step_overhead_ms + m.num_layers * layer_us / 1e3
        c.ms_per_token = m.flops_per_token / base.tp / (g.bf16_tflops * 1e12 * eff / 1e3)
        c._tab_base = np.zeros(0)
        return np.asarray([nospec_step_ms(c, n) for n in conc])

    r = least_squares(lambda x: np.log(steps(x)) - np.log(pub), [200.0, 0.02], bounds=([0.0, 1e-4], [1e4, 1.0]))
    return {"layer_overhead_us": float(r.x[0]), "flops_efficiency": float(r.x[1]),
            "fitted_ms": steps(r.x).tolist(), "published_ms": pub.tolist()}


GRAPHS_GPU = "mi350x-dsv4-graphs"
GRAPHS_CAPTURE_MAX = 1024  # max_cudagraph_capture_size of vLLM's DSpark adaptive-verification blog's DSV4 serving


def _pr52362_ratios(prep, gpu_spec, concurrency: int) -> dict:
    """Simulated adaptive / fixed K=7 and fixed / no-spec at one concurrency, on `gpu_spec` (a GPUSpec variant)."""
    from sim.core.cost.roofline import RooflineCost

    p = dataclasses.replace(prep, cost=RooflineCost(prep.cost.config, gpu_spec=gpu_spec))
    thr = {q: _run(p, q, concurrency)[0]["output_throughput_tok_s"] for q in ("none", "model-fixed:7", "adaptive")}
    return {"adaptive/fixed": thr["adaptive"] / thr["model-fixed:7"], "fixed/none": thr["model-fixed:7"] / thr["none"]}


def _bisect(f, lo: float, hi: float, target: float, increasing: bool, iters: int = 14) -> float:
    """x in [lo, hi] with f(x) = target, f monotone (increasing or not)."""
    for _ in range(iters):
        mid = (lo + hi) / 2
        if (f(mid) < target) == increasing:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def fit_pr52362_graphs(progress: bool = True) -> dict:
    """The two knobs of models/gpus/mi350x-dsv4-graphs.json, each FITTED TO ONE FIGURE of PR 52362, on mi350x
    (datasheet) with vLLM's capture limit raised to GRAPHS_CAPTURE_MAX:
      piecewise_layer_us: what a step above the capture limit pays per layer without its full CUDA graph, such
        that fixed K=7 / no speculation at concurrency 256 (2048 verified tokens a step) equals the published
        0.884 (the collapse of the fixed arm);
      kernels.adaptive_layer_us: adaptive verification's own per-layer cost (its varlen attention path), such
        that adaptive / fixed K=7 at concurrency 4 equals the published 0.930.
    Fitted in that order by bisection (the fixed and no-spec arms do not pay the second). The other 12 figures
    of the anchor stay checks. Returns the knobs and the two fitted figures."""
    with temp_dir("hybridspec-anchors-") as d:
        return _fit_graphs(_prepare(str(_sharegpt_512(d)), model="deepseek-v4-flash", gpu="mi350x", tp=8), progress)


def _fit_graphs(prep, progress: bool) -> dict:
    from sim.core.models import get_gpu

    base = get_gpu("mi350x")

    def spec(pw: float, ad: float):
        return dataclasses.replace(base, name=GRAPHS_GPU, cuda_graph_max_tokens=GRAPHS_CAPTURE_MAX,
                                   piecewise_layer_us=pw,
                                   kernels=dataclasses.replace(base.kernels, adaptive_layer_us=ad))

    def fixed_none_256(pw: float) -> float:
        v = _pr52362_ratios(prep, spec(pw, 0.0), 256)["fixed/none"]
        if progress:
            print(f"  piecewise_layer_us {pw:8.2f}: fixed/none at 256 = {v:.4f}", file=sys.stderr, flush=True)
        return v

    def adaptive_fixed_4(ad: float) -> float:
        v = _pr52362_ratios(prep, spec(pw, ad), 4)["adaptive/fixed"]
        if progress:
            print(f"  adaptive_layer_us {ad:8.2f}: adaptive/fixed at 4 = {v:.4f}", file=sys.stderr, flush=True)
        return v

    n256, f256, _ = PR52362[256]
    _, f4, a4 = PR52362[4]
    pw = _bisect(fixed_none_256, 0.0, 2000.0, f256 / n256, increasing=False)
    ad = _bisect(adaptive_fixed_4, 0.0, 200.0, a4 / f4, increasing=False)
    return {"cuda_graph_max_tokens": GRAPHS_CAPTURE_MAX, "piecewise_layer_us": round(pw, 1),
            "adaptive_layer_us": round(ad, 2), "fixed/none at 256": fixed_none_256(round(pw, 1)),
            "adaptive/fixed at 4": adaptive_fixed_4(round(ad, 2))}


def pr52362_step_up(concurrency: int) -> dict:
    """Where pr52362-adaptive:moe-graphs' step-up lands at `concurrency`: per arm, its run time and the part of it
    that steps above the capture limit pay (piecewise_ms each), split into mixed steps (carrying a prefill chunk)
    and decode-only steps [s]; and adaptive / fixed K=7 with that part of the mixed steps removed, post hoc (the
    same steps: an estimate of a world in which a mixed step above the limit costs no more than below it).

        python -c "from sim.api.anchors import pr52362_step_up as s; print(s(32))"     (about 10 s)"""
    out = {}
    with temp_dir("hybridspec-anchors-") as d:
        prep = _prepare(str(_sharegpt_512(d)), model="deepseek-v4-flash", gpu=GRAPHS_GPU, tp=8)
        cost = prep.cost
        for p in ("none", "model-fixed:7", "adaptive"):
            st = _run(prep, p, concurrency)[1].steps
            above = np.asarray(st["tokens"]) > cost.graph_limit
            mixed = np.asarray(st["prefill_tokens"]) > 0
            out[p] = {"run_s": float(np.sum(st["step_ms"])) / 1e3,
                      "step_up_mixed_s": float((above & mixed).sum()) * cost.piecewise_ms / 1e3,
                      "step_up_decode_s": float((above & ~mixed).sum()) * cost.piecewise_ms / 1e3}
    f, a = out["model-fixed:7"], out["adaptive"]
    out["adaptive/fixed"] = f["run_s"] / a["run_s"]  # the same output tokens: the inverse ratio of run times
    out["adaptive/fixed, mixed steps without the step-up"] = ((f["run_s"] - f["step_up_mixed_s"])
                                                              / (a["run_s"] - a["step_up_mixed_s"]))
    return out


# --------------------------------------------------------------------------------------------- PR 32374
# Inter-token latency (ms) of Llama-3.1-8B with EAGLE-1 on MT-Bench: {batch: {K: ms}}, the clean rows of the
# fixture PR 32374 adds (_DYNAMIC_STATS_TEST in vllm/v1/spec_decode/dynamic/manager.py, batch_stats). Left out:
# batch 4 (a copy of batch 1's row, not a measurement at 4), batch 128 (marked "# fake" there) and batch 64 at
# K = 7 (120.57 ms: 6.9x its K = 5 value and sharing its decimals with the fake row's 220.57; a placeholder).
PR32374 = {1: {0: 6.87, 1: 7.97, 3: 9.41, 4: 9.91, 5: 10.8, 7: 12.29},
           16: {0: 7.3, 1: 8.39, 3: 9.95, 4: 10.8, 5: 11.59, 7: 13.11},
           32: {0: 7.64, 1: 8.97, 3: 10.78, 4: 11.79, 5: 12.81, 7: 14.86},
           64: {0: 8.53, 1: 10.44, 3: 13.16, 4: 15.7, 5: 17.54}}
MTBENCH_CONTEXT = 256  # tokens of context per request during decoding (an MT-Bench prompt + part of its answer)


def eagle_itl_ms(cost, batch: int, k: int, context: int = MTBENCH_CONTEXT, async_scheduling: bool = True) -> float:
    """One decoding step of `batch` requests verifying k EAGLE tokens each, as the engine charges it
    (sim/engine/step_time.py): draft(B, k) + alloc(B) + verify(graph_tokens(B (k+1)), B context, B) + sample(B (k+1)),
    overlapped with cpu(B, B (k+1)) under asynchronous scheduling. With every draft accepted or not, a
    streamed chunk arrives once per step, so this is the inter-token latency vLLM's benchmark reports."""
    from sim.engine.step_time import step_time

    t = batch * (k + 1)
    draft = cost.draft_ms(batch, k) if k else 0.0
    alloc = cost.alloc_ms(batch, policy=f"model-fixed:{k}") if k else 0.0
    verify = float(cost.verify_ms(int(cost.graph_tokens(t)), batch * context, batch))
    _, step = step_time(draft, 0.0, alloc, verify, cost.sample_ms(t), cost.cpu_ms(batch, t), not async_scheduling)
    return step


def _pr32374() -> list[Figure]:
    from sim.core.cost import make_cost_model

    cost = make_cost_model("roofline", "llama-3.1-8b", "h100-sxm", drafter="eagle-llama3.1-8b-cost")
    out = []
    for b, row in PR32374.items():
        for k, pub in row.items():
            out.append(Figure("pr32374-eagle-itl", f"inter-token latency (ms), batch {b}, K={k}", pub,
                              eagle_itl_ms(cost, b, k), 0.15))
    return out


# --------------------------------------------------------------------------------------------- vLLM configs
def vllm_spec(text: str, block: int = 7):
    """What `python -m sim.run --speculative-config TEXT` runs (sim.core.vllm.speculative_config, the mapping the
    command uses), with the bundled n-gram calibrator's range: a SpecMapping (policy, n-gram k, drafter, suffix
    settings). A vLLM field the simulator cannot map is one ConfigError, as on the command line."""
    from sim.core.drafters.calibration import DEFAULT_CALIBRATOR, NgramCalibrator
    from sim.core.vllm import speculative_config

    cal = NgramCalibrator.load(DEFAULT_CALIBRATOR).cfg
    return speculative_config(text, (cal.n_min, cal.n_max), block)


def range_figure(anchor: str, metric: str, lo: float, hi: float, simulated: float) -> Figure:
    """A published range or bound [lo, hi] as a figure: its midpoint with half its width as an absolute
    tolerance, so `within` is lo <= simulated <= hi (a bound such as "under 10%" is the range [0, 0.10])."""
    return Figure(anchor, f"{metric} (published {lo:g}-{hi:g}: within = inside it)", (lo + hi) / 2, simulated,
                  (hi - lo) / 2, "absolute")


# --------------------------------------------------------------------------------------------- PR 25784
# SpecBench on H200, mean TPOT (ms) at concurrency 1/4/16/64: (suffix with its response cache, K = 5;
# vLLM's ngram with prompt_lookup_min 3, max 5, K = 5, the best n-gram row). The compared figure is their ratio.
PR25784 = {1: (4.40, 5.21), 4: (4.64, 5.50), 16: (5.85, 6.61), 64: (10.55, 10.66)}
PR25784_SUFFIX = '{"method": "suffix", "num_speculative_tokens": 5}'
PR25784_NGRAM = '{"method": "ngram", "num_speculative_tokens": 5}'
PR25784_SAMPLE = 160  # chat.jsonl requests (SpecBench has 480): the live suffix drafter keeps the run short
# TARGET, set before any run: ±0.10 on each ratio. The workload is the largest unknown (ShareGPT chat for
# SpecBench's six task types, translation and summarization among them, which copy more), then the model
# (not named in the PR) and the H200 costs (H100 efficiencies); ±0.10 still tells "suffix clearly ahead"
# (the published 1.18) from "no difference" (1.01).
PR25784_TOL = 0.10


def pr25784_ngram_arm(k: int) -> str:
    """The n-gram arm as the PR's engine ran it: vLLM's V1 model runner (autumn 2025), whose CPU NgramProposer
    returns no draft for a request without a match, so only matched requests are scheduled drafts (ngram-fixed:K's
    charge; vllm-ngram:K, K slots for every request, is Model Runner V2's GPU n-gram of 0.32/0.33). It runs with
    `_run(..., host_sync=True)` (the host lookup priced as the suffix arm's host-side walk) on a synchronous setup:
    the V1 runner refuses asynchronous scheduling with the CPU n-gram (vllm/config/vllm.py v1_async_sched_incompat)
    as it does with suffix, so both arms run as the suffix arm does."""
    return f"ngram-fixed:{k}"


def _pr25784() -> list[Figure]:
    from sim.core.drafters.registry import parse_drafter_config

    suffix, ngram = vllm_spec(PR25784_SUFFIX), vllm_spec(PR25784_NGRAM)
    prep = _prepare("traces/chat.jsonl", policy_k=ngram.ngram_k, gpu="h200", sample=PR25784_SAMPLE,
                    drafters="dspark,ngram,suffix", drafter_config=parse_drafter_config({"suffix": suffix.suffix}))
    sync = dataclasses.replace(prep, setup=dataclasses.replace(prep.setup, async_scheduling=False))
    arm = pr25784_ngram_arm(ngram.ngram_k)
    out = []
    for c, (pub_suffix, pub_ngram) in PR25784.items():
        ratio = (_run(sync, arm, c, host_sync=True)[0]["mean_tpot_ms"]
                 / _run(prep, suffix.policy, c)[0]["mean_tpot_ms"])
        out.append(Figure("pr25784-suffix", f"n-gram TPOT / suffix TPOT at concurrency {c}", pub_ngram / pub_suffix,
                          ratio, PR25784_TOL, "absolute"))
    return out


# --------------------------------------------------------------------------------------------- DSpark blog
# vLLM's DSpark adaptive-verification blog (2026-08-14), DeepSeek-V4-Pro, TP8, B300: acceptance length with
# adaptive verification at concurrency 1 and 256; survival of the first and the last token of a 7-token block
# (published as bounds: over 70%, under 10%); output throughput over no speculation at concurrency 256.
BLOG_AL = {1: 3.44, 256: 2.65}
BLOG_FIRST, BLOG_LAST = (0.70, 1.0), (0.0, 0.10)
BLOG_OVER_NONE_256 = {"adaptive": 1.41, "model-fixed:7": 0.47}
BLOG_LABEL = {"adaptive": "adaptive", "model-fixed:7": "fixed K=7"}
# The blog's runs sample at temperature 1 (SPEED-Bench, as published); the anchor ran at 0 until round 3 (issue 61), which
# kept every draft's acceptance at its greedy value. At 1 the profile's acceptance is scaled by temp_scale per depth
# (sim/core/drafters/model.py: an approximation of rejection sampling, fitted to nothing here).
BLOG_TEMPERATURE = 1.0
# TARGETS, set before any run: acceptance lengths ±15% (the Qwen3 DSpark profile stands in for DeepSeek-V4's
# drafter; the published DSpark chat range alone spans ±9% around its middle), their fall AL(256) / AL(1) ±0.10
# absolute, the positions' bounds as published, and the ratios over no speculation ±15% (PR 52362's target for
# the same ratio on the kin DeepSeek-V4 deployment).
BLOG_AL_TOL, BLOG_FALL_TOL, BLOG_RATIO_TOL = 0.15, 0.10, 0.15


def scheduled_acceptance_length(steps: dict) -> float:
    """vLLM's acceptance length under adaptive verification, 1 + accepted / decoding request-steps: its scheduler
    counts a draft for every request it scheduled drafts for (scheduled_spec_decode_tokens, vllm/v1/core/sched/
    scheduler.py), and adaptive verification trims them afterwards on the GPU, unseen by those counters; a
    request-step admitted no draft is a draft with none accepted (the run's own acceptance_length skips it)."""
    return 1 + float(np.sum(steps["accepted_model"])) / max(int(np.sum(steps["num_decode"])), 1)


def _dspark_blog() -> list[Figure]:
    name = "vllm-blog-dspark-adaptive"
    prep = _prepare("traces/chat.jsonl", model="deepseek-v4-flash", gpu="b300", tp=8, temperature=BLOG_TEMPERATURE)
    runs = {(p, c): _run(prep, p, c) for p in ("adaptive", "model-fixed:7", "none") for c in (1, 256)
            if not (p == "none" and c == 1)}
    row = {key: r[0] for key, r in runs.items()}
    al = {c: scheduled_acceptance_length(runs[("adaptive", c)][1].steps) for c in BLOG_AL}
    pos = row[("model-fixed:7", 1)]["acceptance_per_position"]  # every position verified: survival per position
    out = [Figure(name, f"acceptance length, adaptive, concurrency {c}", BLOG_AL[c], al[c], BLOG_AL_TOL)
           for c in BLOG_AL]
    out.append(Figure(name, "acceptance length at 256 / at 1, adaptive", BLOG_AL[256] / BLOG_AL[1], al[256] / al[1],
                      BLOG_FALL_TOL, "absolute"))
    out.append(range_figure(name, "share of 7-token blocks whose 1st token is accepted, K=7, concurrency 1",
                            *BLOG_FIRST, pos[0]))
    out.append(range_figure(name, "share of 7-token blocks whose 7th token is accepted, K=7, concurrency 1",
                            *BLOG_LAST, pos[6]))
    thr = {p: row[(p, 256)]["output_throughput_tok_s"] for p in ("none", *BLOG_OVER_NONE_256)}
    out += [Figure(name, f"{BLOG_LABEL[p]} / no speculation at concurrency 256", pub, thr[p] / thr["none"],
                   BLOG_RATIO_TOL) for p, pub in BLOG_OVER_NONE_256.items()]
    return out


# --------------------------------------------------------------------------------------------- arXiv 2601.11580
# "Speculative Decoding: Performance or Illusion?" (vLLM 0.10.1, H100): EAGLE-1 with K = 3 on Llama-3.1-8B,
# GSM8K, throughput over no speculation at batch 1 and 128; verification's share of step time, 42-95% over the
# study's settings (a range, compared at both batch sizes).
ILLUSION_EAGLE = '{"method": "eagle", "num_speculative_tokens": 3}'
ILLUSION_SPEEDUP = {1: 1.96, 128: 1.21}
ILLUSION_VERIFY = (0.42, 0.95)
# TARGET, set before any run: ±15% on each speedup, the roofline's stated accuracy on H100 step times (PR 32374)
# and PR 52362's target for the same ratio; the EAGLE profile is fitted on MT-Bench, not GSM8K.
ILLUSION_TOL = 0.15


def _illusion() -> list[Figure]:
    name = "arxiv2601.11580-eagle"
    eagle = vllm_spec(ILLUSION_EAGLE)
    prep = _prepare("traces/chat.jsonl", model="llama-3.1-8b", drafter=eagle.drafter)
    out, shares = [], {}
    for b, pub in ILLUSION_SPEEDUP.items():
        spec, base = _run(prep, eagle.policy, b)[0], _run(prep, "none", b)[0]
        out.append(Figure(name, f"EAGLE K=3 / no speculation, output throughput at batch {b}", pub,
                          spec["output_throughput_tok_s"] / base["output_throughput_tok_s"], ILLUSION_TOL))
        shares[b] = spec["share_verify"]
    out += [range_figure(name, f"share of step time in verification, EAGLE K=3, batch {b}", *ILLUSION_VERIFY, v)
            for b, v in shares.items()]
    return out


# --------------------------------------------------------------------------------------------- PR 52228
# vLLM PR 52228 (Model Runner V2: acceptance estimation for adaptive verification, the online acceptance estimator):
# output throughput with adaptive verification ON over OFF (fixed K = nspec), concurrency 64, Kimi-K2.5 with a
# DFlash drafter (nspec 8, probabilistic drafting): +19.0% mean over five datasets (speed-bench 2k low / high entropy
# +16.8% / +34.0%, gsm8k +21.2%, humaneval +9.0%, mt-bench +14.0%). Compared: the mean and MT-Bench.
PR52228 = {"mean over five datasets": 1.190, "MT-Bench": 1.140}
PR52228_K, PR52228_CONCURRENCY, PR52228_SAMPLE = 8, 64, 300
PR52228_TEMPERATURE = 1.0  # probabilistic drafting at temperature 1 (as the PR's runs; the anchor ran at 0 until round 3)
# the published model (models/llms/kimi-k2.5.json, round 3; DeepSeek-V4-Flash stood in before: ON / OFF 1.031 -> 1.039)
PR52228_MODEL = "kimi-k2.5"
# TARGET, set before any run: ±0.10 on each ratio. The published per-dataset gains span 1.09-1.34 with run-to-run
# noise up to 10% (its own noise column), and the setup below stands in for the model, the drafter, the GPU and the
# workload; ±0.10 still tells "adaptive clearly pays at 64" (1.19) from "no difference" (1.0).
PR52228_TOL = 0.10


def _pr52228() -> list[Figure]:
    drafter = f"dspark-qwen3-b7:{PR52228_K}"
    prep = _prepare("traces/chat.jsonl", model=PR52228_MODEL, gpu="b300", tp=8, drafter=drafter,
                    sample=PR52228_SAMPLE, temperature=PR52228_TEMPERATURE)
    thr = {p: _run(prep, p, PR52228_CONCURRENCY)[0]["output_throughput_tok_s"]
           for p in ("adaptive:online", f"model-fixed:{PR52228_K}")}
    sim = thr["adaptive:online"] / thr[f"model-fixed:{PR52228_K}"]
    return [Figure("pr52228-online-estimator", f"adaptive verification ON / OFF (fixed K={PR52228_K}), output "
                   f"throughput at concurrency {PR52228_CONCURRENCY}, published {what}", pub, sim, PR52228_TOL,
                   "absolute") for what, pub in PR52228.items()]


# --------------------------------------------------------------------------------------------- PR 52228, GB200
# vLLM PR 52228's second table: Muse-Glimmer-30B with DFlash2 (nspec 7, probabilistic drafting) on one GB200, temperature
# 1.0 / top_p 0.95, concurrency 64, <= 2K in / 2K out, FLASH_ATTN in both arms: adaptive verification (the online
# acceptance estimator: DFlash2 has no confidence head) OFF -> ON, per speed-bench 2k subset:
#   (output tok/s OFF, ON, acceptance length OFF, ON).
PR52228_GLIMMER = {"speed-bench 2k low-entropy": (5410.0, 6236.0, 3.88, 3.61),
                   "speed-bench 2k high-entropy": (3990.0, 4861.0, 2.65, 2.56)}
PR52228_GLIMMER_K, PR52228_GLIMMER_TEMPERATURE = 7, 1.0
# TARGETS, set before any run: ON / OFF throughput ±0.10 absolute, as the Kimi table's (the two rows here are 1.15 and
# 1.22, noise 0.3-0.4%); ON / OFF acceptance length ±0.05 absolute (the two published rows are 0.036 apart; the one
# stand-in workload sits somewhere between their entropies).
PR52228_GLIMMER_TOL, PR52228_GLIMMER_AL_TOL = 0.10, 0.05


def _pr52228_glimmer() -> list[Figure]:
    name = "pr52228-glimmer-gb200"
    prep = _prepare("traces/chat.jsonl", model="qwen3-32b", gpu="gb200", drafter=f"dspark-qwen3-b7:{PR52228_GLIMMER_K}",
                    sample=PR52228_SAMPLE, temperature=PR52228_GLIMMER_TEMPERATURE)
    fixed = f"model-fixed:{PR52228_GLIMMER_K}"
    runs = {p: _run(prep, p, PR52228_CONCURRENCY) for p in ("adaptive:online", fixed)}
    thr = {p: r[0]["output_throughput_tok_s"] for p, r in runs.items()}
    al = {p: scheduled_acceptance_length(r[1].steps) for p, r in runs.items()}
    out = []
    for what, (off, on, al_off, al_on) in PR52228_GLIMMER.items():
        out.append(Figure(name, f"adaptive verification ON / OFF (fixed K={PR52228_GLIMMER_K}), output throughput at "
                          f"concurrency {PR52228_CONCURRENCY}, published {what}", on / off,
                          thr["adaptive:online"] / thr[fixed], PR52228_GLIMMER_TOL, "absolute"))
        out.append(Figure(name, f"acceptance length ON / OFF, published {what}", al_on / al_off,
                          al["adaptive:online"] / al[fixed], PR52228_GLIMMER_AL_TOL, "absolute"))
    return out


# --------------------------------------------------------------------------------------------- PR 52992
# vLLM PR 52992 (Model Runner V2: adaptive verification for more attention backends): nvidia/GLM-5.2-NVFP4 with
# Inferact/GLM-5.2-DSpark, 16 speculative tokens, on 4x GB200; speed-bench 1K/2K, 512 prompts, concurrency 64,
# temperature 1, top_p 0.95. Baseline (DSpark at fixed K = 16) against adaptive verification (DSpark's confidence head):
# output throughput, acceptance length, and the share of drafts accepted at each of the 16 positions (vLLM's
# per-position acceptance; they sum to acceptance length - 1).
PR52992_THROUGHPUT = {"model-fixed:16": 1588.78, "adaptive": 4508.91}
PR52992_AL = {"model-fixed:16": 4.35, "adaptive": 3.76}
PR52992_POS_FIXED = (0.7123, 0.5170, 0.3904, 0.3051, 0.2437, 0.2000, 0.1685, 0.1441, 0.1246, 0.1094, 0.0964, 0.0856,
                     0.0758, 0.0667, 0.0582, 0.0498)
PR52992_POSITIONS = (1, 2, 4, 8, 16)  # compared (chosen before any run: the powers of two up to K)
PR52992_K, PR52992_CONCURRENCY, PR52992_TP, PR52992_TEMPERATURE = 16, 64, 4, 1.0
# TARGETS, set before any run: adaptive / fixed throughput ±15% (PR 52362's target for a ratio of arms; one run, no
# noise column), acceptance lengths ±15% (the DSpark blog anchor's: the Qwen3 DSpark profile stands in for GLM-5.2's
# drafter), per-position acceptance ±0.10 absolute (PR 24344's per-position target).
PR52992_RATIO_TOL, PR52992_AL_TOL, PR52992_POS_TOL = 0.15, 0.15, 0.10


def _pr52992() -> list[Figure]:
    name = "pr52992-glm52-dspark16"
    prep = _prepare("traces/chat.jsonl", model="glm-5.2", gpu="gb200", tp=PR52992_TP,
                    drafter=f"dspark-qwen3-b7:{PR52992_K}", sample=PR52228_SAMPLE, temperature=PR52992_TEMPERATURE)
    runs = {p: _run(prep, p, PR52992_CONCURRENCY) for p in PR52992_THROUGHPUT}
    thr = {p: r[0]["output_throughput_tok_s"] for p, r in runs.items()}
    label = {"model-fixed:16": f"fixed K={PR52992_K}", "adaptive": "adaptive"}
    out = [Figure(name, f"adaptive / fixed K={PR52992_K}, output throughput at concurrency {PR52992_CONCURRENCY}",
                  PR52992_THROUGHPUT["adaptive"] / PR52992_THROUGHPUT["model-fixed:16"],
                  thr["adaptive"] / thr["model-fixed:16"], PR52992_RATIO_TOL)]
    out += [Figure(name, f"acceptance length, {label[p]}", pub, scheduled_acceptance_length(runs[p][1].steps),
                   PR52992_AL_TOL) for p, pub in PR52992_AL.items()]
    pos = runs["model-fixed:16"][0]["acceptance_per_position"]
    out += [Figure(name, f"share of drafts accepted at position {j}, fixed K={PR52992_K}", PR52992_POS_FIXED[j - 1],
                   pos[j - 1], PR52992_POS_TOL, "absolute") for j in PR52992_POSITIONS]
    return out


# --------------------------------------------------------------------------------------------- PR 48892
# vLLM PR 48892 (Model Runner V2: multi-layer MTP speculator), GSM8K, concurrency 64, temperature 0: Inkling's MTP with
# one module (K = 1) against eight (K = 8): acceptance length, and the share of drafts accepted at each position of
# the eight-module run. Its throughput (1,646.15 vs 2,148.42 tok/s) is not compared: neither Inkling's architecture
# nor the GPU is stated where it was read.
PR48892_AL = {1: 1.84, 8: 4.40}
PR48892_POS_8 = (0.7568, 0.6011, 0.4976, 0.4113, 0.3538, 0.2980, 0.2608, 0.2229)
PR48892_POSITIONS = (1, 2, 4, 8)  # compared (chosen before any run, as PR 52992's)
PR48892_CONCURRENCY = 64
PR48892_SPEC = '{{"method": "mtp", "num_speculative_tokens": {k}}}'
# TARGETS, set before any run: acceptance lengths ±15%, per-position acceptance ±0.10 absolute (as PR 52992's).
PR48892_AL_TOL, PR48892_POS_TOL = 0.15, 0.10


def _pr48892() -> list[Figure]:
    from sim.core.drafters.calibration import DEFAULT_CALIBRATOR, NgramCalibrator
    from sim.core.vllm import speculative_config

    name = "pr48892-mtp-layers"
    cal = NgramCalibrator.load(DEFAULT_CALIBRATOR).cfg
    out, pos = [], None
    for k, pub in PR48892_AL.items():
        # what --speculative-config method mtp runs for a target with k MTP modules (the mtp-standin profile)
        spec = speculative_config(PR48892_SPEC.format(k=k), (cal.n_min, cal.n_max), 7, mtp_layers=k, target="inkling")
        prep = _prepare("traces/chat.jsonl", drafter=spec.drafter, sample=PR52228_SAMPLE)
        row, res = _run(prep, spec.policy, PR48892_CONCURRENCY)
        out.append(Figure(name, f"acceptance length, MTP with {k} module{'s' if k > 1 else ''} (K={k})", pub,
                          scheduled_acceptance_length(res.steps), PR48892_AL_TOL))
        if k == 8:
            pos = row["acceptance_per_position"]
    out += [Figure(name, f"share of drafts accepted at position {j}, K=8", PR48892_POS_8[j - 1], pos[j - 1],
                   PR48892_POS_TOL, "absolute") for j in PR48892_POSITIONS]
    return out


# --------------------------------------------------------------------------------------------- registry
ANCHORS: dict[str, Anchor] = {}


def _register(a: Anchor) -> None:
    ANCHORS[a.name] = a


for _trace, _label in zip(CODEEDIT_TRACES, ("codeedit.jsonl, copy-heavy bound", "codeedit-model.jsonl, model-shaped")):
    _register(Anchor(
        name=f"pr24344-blazedit:{Path(_trace).stem}",
        source="vLLM PR 24344 (ngram-eagle hybrid): n-gram speculation (K=5, prompt_lookup_min 2, max 5) on "
               "Blazedit edit prompts (vdaita/edit_5k_char, normalized edit distance 0.01-0.25), "
               "Llama-3.1-8B-Instruct, offline spec_decode.py counters: n-gram draft on 54.7% of steps, 4.59 tokens "
               "per drafted step, 2.96 over all steps, acceptance .81 .74 .70 .68 .66 at draft positions 1-5. Its "
               "5376 output tokens are exactly 21 x 256, read here as 21 answers each cut at 256 tokens: "
               "spec_decode.py samples with max_tokens = --output-len (default 256; --hf-output-len 2048 only sets "
               "the dataset's expected length), and of the 90 prompts asked for, those passing the distance filter "
               "are used (--no-oversample)",
        setup=f"{_trace} with every output cut at its first {BLAZEDIT_MAX_TOKENS} tokens (capped_trace, the "
              "published max_tokens), ngram-fixed:5 with --ngram-k 5 (n 2..5), batch 1, temperature 0; counters "
              "from the run's steps exactly as vLLM counts them (ngram_step_stats)",
        unmatched="Blazedit's prompts and Llama-3.1-8B's outputs are not available offline: the trace's own edits "
                  "(Python release pairs, Qwen3 tokenizer) stand in; the share of steps with a draft depends on how "
                  "much of an output is new text, which is a property of the trace",
        checks="the n-gram drafter (matching rule, chain length, exact acceptance) and the trace's output shape",
        fitted="none (codeedit-model.jsonl's shape parameters are stated assumptions, traces/README.md, fitted "
               "to nothing; blazedit_shape_sensitivity moves each over its range: all three figures stay within "
               "target, docs/anchors.md)",
        run=_blazedit(_trace, _label)))

for _trace, _label in zip(CODEEDIT_TRACES, ("codeedit.jsonl, copy-heavy bound", "codeedit-model.jsonl, model-shaped")):
    _register(Anchor(
        name=f"pr24344-blazedit-eagle:{Path(_trace).stem}",
        source="vLLM PR 24344: EAGLE-1 (yuhuili/EAGLE-LLaMA3.1-Instruct-8B) with K = 3 on the same Blazedit "
               "prompts (21 answers x 256 tokens): mean acceptance length 2.46 (vLLM's counter: 1 + accepted / drafts), "
               "acceptance .77 .45 .24 at draft positions 1-3",
        setup=f"{_trace} cut at {BLAZEDIT_MAX_TOKENS} output tokens, model-fixed:3 with the eagle-llama3.1-8b profile at block 3 (--drafter "
              "eagle-llama3.1-8b:3, what --speculative-config method eagle runs), batch 1, temperature 0",
        unmatched="as the n-gram anchor on this trace; the EAGLE profile is fitted on MT-Bench (chat) with every "
                  "token treated alike (eagle_copy_sensitivity, docs/anchors.md)",
        checks="the EAGLE-style drafter profile out of its fitting domain (code edits instead of chat)",
        fitted="the profile's copied-token q1 and decay (set equal to the normal ones, fitted to MT-Bench acceptance "
               "lengths, issue 20780) were chosen after this anchor missed with the DSpark profile's values (3.01 vs "
               "2.46): its figures are marked fitted and not counted",
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
    checks="adaptive verification's budget (sim/core/policies/adaptive.py) against fixed K on the roofline cost model",
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
    checks="the MoE/TP roofline (sim/core/cost/roofline.py) and adaptive verification's own per-step cost (alloc_ms)",
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
    fitted="layer_overhead_us = 193.8 and flops_efficiency = 0.0254 of mi350x-dsv4-fit, fitted to this PR's "
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
    name="pr52362-adaptive:moe-graphs",
    source="vLLM PR 52362, as above",
    setup=f"as pr52362-adaptive:moe (datasheet mi350x) on {GRAPHS_GPU}: CUDA graphs captured up to "
          f"{GRAPHS_CAPTURE_MAX} tokens, a step above that runs without its full graph and pays piecewise_layer_us "
          "per layer (fixed K=7 at concurrency 256 verifies 2048 tokens a step; adaptive verification's start-up "
          "table prices the step up, as vLLM profiles past the capture limit), and adaptive verification pays "
          "kernels.adaptive_layer_us per layer for its variable-length attention path (sim/core/cost/roofline.py)",
    unmatched="as pr52362-adaptive:moe; the deployment's capture limit (1024 is what vLLM's DSpark blog serves "
              "DeepSeek-V4-Flash with; PR 52362 does not say) and the real sizes of the two mechanisms, which no "
              "public figure isolates: they are fitted here to show what the published arms would need them to cost",
    checks="whether graph loss above the capture limit and a per-layer cost of adaptive's own path, each sized on "
           "one figure, explain the rest of the published curve",
    fitted="piecewise_layer_us = 631.7 (27 ms a step over 43 layers), fitted to fixed K=7 / no speculation at "
           "concurrency 256; kernels.adaptive_layer_us = 10.72 (0.46 ms a step), fitted to adaptive / fixed K=7 at "
           "concurrency 4 (fit_pr52362_graphs); those two figures are marked fitted and check nothing",
    run=_pr52362("deepseek-v4-flash", GRAPHS_GPU, 8, "deepseek-v4-flash, MI350X graphs sized, TP8", with_none=True,
                 fitted=("fixed K=7 / no speculation at concurrency 256", "adaptive / fixed K=7 at concurrency 4"))))

_register(Anchor(
    name="pr32374-eagle-itl",
    source="vLLM PR 32374 (Dynamic SD; its fixture _DYNAMIC_STATS_TEST, vllm/v1/spec_decode/dynamic/manager.py): "
           "Llama-3.1-8B with EAGLE-1 on MT-Bench, H100, inter-token latency in ms at K = 0/1/3/4/5/7 for batch "
           "1, 4, 16, 32, 64, 128. Compared: its clean rows, batch 1, 16 and 32 at every K and batch 64 at K = 0-5. "
           "Left out: batch 4 (a copy of batch 1's row), batch 128 (marked fake in the fixture) and batch 64 at "
           "K = 7 (120.57 ms, 6.9x its K = 5 value, sharing its decimals with the fake row: a placeholder)",
    setup=f"llama-3.1-8b on h100-sxm (roofline), eagle-llama3.1-8b-cost (sequential EAGLE head: K passes), "
          f"{MTBENCH_CONTEXT} tokens of context per request, asynchronous scheduling (eagle_itl_ms)",
    unmatched="the exact context lengths of MT-Bench requests during decoding (a representative 256 is used), "
              "EAGLE's first pass over the accepted tokens (one position per request is priced)",
    checks="the roofline verify cost and the sequential drafter's per-token cost",
    fitted="none",
    run=_pr32374))


_register(Anchor(
    name="pr25784-suffix",
    source="vLLM PR 25784 (suffix decoding from Arctic Inference), SpecBench on H200: mean TPOT (ms) at "
           "concurrency 1/4/16/64 of suffix with its response cache, K = 5 (4.40/4.64/5.85/10.55), and of the best "
           "n-gram row, prompt_lookup_min 3, max 5, K = 5 (5.21/5.50/6.61/10.66); compared: their ratio, the speedup "
           "of suffix over n-gram (1.18x at concurrency 1 to 1.01x at 64)",
    setup=f"chat.jsonl, {PR25784_SAMPLE} requests sampled (seed 0), qwen3-8b on h200 (roofline), batch size = "
          f"concurrency; --speculative-config {PR25784_SUFFIX} (policy suffix:5, the suffix drafter at vLLM's "
          f"defaults: depth 24, min_token_prob 0.1, spec factor 1, 10000 cached responses) against "
          f"{PR25784_NGRAM} as the PR's V1 model runner ran it (pr25784_ngram_arm: ngram-fixed:5, drafts only where "
          "the n-gram matched, its host lookup priced, synchronous scheduling as the suffix arm's; 0.33 maps the "
          "config to vllm-ngram:5, Model Runner V2's GPU n-gram)",
    unmatched="SpecBench is not bundled: ShareGPT chat (chat.jsonl, copy fraction 0.32) stands in, without its "
              "translation, summarization and RAG tasks; the model is not named in the PR text (its benchmark "
              "script is an attachment): qwen3-8b, whose tokenizer the trace is in, stands in; n-gram n = 2..5, "
              "not 3..5: the only n-gram calibrator is fitted for 2..5 (models/calibrators/ngram-general.json), and "
              "--speculative-config with prompt_lookup_min 3 is refused rather than fitting one on evaluation data; "
              "h200 carries H100's fitted efficiencies; both drafters' host time is the roofline's host n-gram "
              "lookup, not measured",
    checks="the suffix drafter (its trees and response cache) against vLLM's n-gram as batch size grows, on one "
           "cost model",
    fitted="none",
    run=_pr25784))

_register(Anchor(
    name="vllm-blog-dspark-adaptive",
    source="vLLM's DSpark adaptive-verification blog (2026-08-14), DeepSeek-V4-Pro, TP8 on B300: acceptance length "
           "with adaptive verification 3.44 at concurrency 1 falling to 2.65 at 256; the last token of a 7-token "
           "block survives under 10% of the time, the first over 70%; at concurrency 256 adaptive is +41% over no "
           "speculation where fixed K = 7 is 53% below it",
    setup="chat.jsonl (600 requests, text, at temperature 1 as published: the profile's acceptance scaled by "
          "temp_scale per depth), deepseek-v4-flash on b300 (models/gpus/b300.json, "
          "datasheet peaks, H100 efficiencies) at tensor_parallel_size 8, dspark-qwen3-b7 profile; adaptive and "
          "model-fixed:7 at concurrency 1 and 256, none at 256; acceptance length as vLLM's counters see adaptive "
          "verification (scheduled_acceptance_length); block positions from model-fixed:7 at 1 (every position "
          "verified)",
    unmatched="DeepSeek-V4-Pro (no spec: V4-Flash, 284B total / 13B active, stands in for a much larger model), "
              "its DSpark drafter (the synthetic Qwen3 profile stands in), the blog's workload (ShareGPT chat "
              "stands in), B300's real efficiencies, and what makes fixed K = 7 collapse at 256 (graph loss above "
              "the capture limit, DeepSeek-V4's sparse-attention costs): no knob is sized here, so that figure "
              "tests the datasheet roofline alone (pr52362-adaptive:moe-graphs shows what it would take)",
    checks="adaptive verification's budget as concurrency grows (acceptance length falls as it verifies less) and "
           "the DSpark profile's per-position decay",
    fitted="none (b300.json states datasheet figures and copied H100 efficiencies, fitted to nothing)",
    run=_dspark_blog))

_register(Anchor(
    name="arxiv2601.11580-eagle",
    source="\"Speculative Decoding: Performance or Illusion?\" (arXiv 2601.11580), vLLM 0.10.1 on H100: EAGLE-1 "
           "with K = 3 on Llama-3.1-8B, GSM8K, output throughput 1.96x no speculation at batch 1 falling to 1.21x at "
           "128; verification 42-95% of step time across the study's settings",
    setup=f"chat.jsonl (600 requests), llama-3.1-8b on h100-sxm (roofline); --speculative-config {ILLUSION_EAGLE} "
          "(model-fixed:3 with the eagle-llama3.1-8b profile at block 3 and its sequential head cost) against none, "
          "batch 1 and 128; share_verify is the simulator's share of step time in the target's verify pass",
    unmatched="GSM8K is not bundled: ShareGPT chat stands in (math answers are more predictable: the published "
              "acceptance is likely higher than the chat trace gives); the bundled text is Qwen3-tokenized; the "
              "EAGLE profile is fitted on MT-Bench acceptance lengths; vLLM 0.10.1's engine (V1, before Model Runner "
              "V2) is priced with the current step model; the 42-95% range spans settings the paper does not split "
              "out per batch size, so only membership is checked",
    checks="the roofline's H100 verify cost against the sequential drafter's as batch size grows, end to end",
    fitted="none (the EAGLE profile's q1 and decay are fitted to MT-Bench acceptance lengths, issue 20780)",
    run=_illusion))


_register(Anchor(
    name="pr52228-online-estimator",
    source="vLLM PR 52228 (Model Runner V2: acceptance estimation for adaptive verification; vLLM's "
           "OnlineAcceptanceEstimator, in 0.32.0 and 0.33.0): adaptive verification for drafters without a confidence "
           "head, Kimi-K2.5 with a DFlash drafter (nspec 8, probabilistic drafting), concurrency 64: output throughput "
           "ON over OFF +19.0% mean over five datasets (speed-bench 2k low/high entropy, gsm8k, humaneval, mt-bench), "
           "MT-Bench +14.0%, HumanEval +9.0%",
    setup=f"chat.jsonl ({PR52228_SAMPLE} requests sampled, seed 0) at temperature 1, kimi-k2.5 on b300 at "
          f"tensor_parallel_size 8, the dspark-qwen3-b7 profile at block {PR52228_K} standing for a parallel block drafter; adaptive:online "
          f"(vLLM's adaptive verification on the simulated online estimator, refit every 100 steps from the cold "
          f"start) against model-fixed:{PR52228_K}, batch {PR52228_CONCURRENCY}",
    unmatched="Kimi-K2.5's kernels (its spec is the published config's sizes; MLA as one 576-wide head), DFlash (the DSpark profile's "
              "acceptance and one-pass cost stand in; its confidence, not DFlash's max draft probability, is the "
              "estimator's feature, which flatters the estimator), the GPU (not named in the PR text read; B300 "
              "datasheet peaks with H100 efficiencies), rejection sampling at temperature 1 (the profile's temp_scale "
              "approximation), and "
              "the datasets: ShareGPT chat stands for MT-Bench and the five-dataset mix; HumanEval (code written "
              "from a docstring) has no bundled trace and is not compared",
    checks="the online estimator inside adaptive verification: whether learnt confidences trim enough of a fixed "
           "K = 8 chain at concurrency 64 to pay as published",
    fitted="none",
    run=_pr52228))


_register(Anchor(
    name="pr52228-glimmer-gb200",
    source="vLLM PR 52228 (Model Runner V2: acceptance estimation for adaptive verification), its Muse-Glimmer-30B "
           "table: the online acceptance estimator's first run on a non-DSpark speculator, Muse-Glimmer-30B + DFlash2 on "
           "one GB200, nspec 7, probabilistic drafting, temperature 1.0 / top_p 0.95, concurrency 64, <= 2K in / 2K out, "
           "FLASH_ATTN in both arms: output throughput OFF -> ON 5,410 -> 6,236 tok/s (+15.3%) on speed-bench 2k "
           "low-entropy and 3,990 -> 4,861 (+21.8%) on high-entropy, acceptance length 3.88 -> 3.61 and 2.65 -> 2.56. "
           "(Its five-dataset mean +19.0% belongs to the Kimi-K2.5 table: pr52228-online-estimator)",
    setup=f"chat.jsonl ({PR52228_SAMPLE} requests sampled, seed 0) at temperature 1 (every request's, as published: the "
          "drafter profile's acceptance scaled by temp_scale per depth), qwen3-32b on gb200 (models/gpus/gb200.json: "
          f"datasheet peaks, H100 efficiencies), dspark-qwen3-b7 at block {PR52228_GLIMMER_K} standing for DFlash2; "
          f"adaptive:online (the online estimator, refit every 100 steps from the cold start) against "
          f"model-fixed:{PR52228_GLIMMER_K}, batch {PR52228_CONCURRENCY}; acceptance length as vLLM counts it "
          "(scheduled_acceptance_length)",
    unmatched="Muse-Glimmer-30B (its config.json is not readable here: qwen3-32b, a dense model of the same size, "
              "stands in; the threads read say it has 52 layers, 39 of them sliding-window, which the stand-in does "
              "not have), DFlash2 (the DSpark profile's acceptance and one-pass cost; its confidence, not DFlash2's max "
              "draft probability, is the estimator's feature), GB200's real efficiencies, speed-bench's low- and "
              "high-entropy subsets and their 2K outputs (one ShareGPT chat stand-in is compared with both rows), "
              "rejection sampling at temperature 1 (the profile's temp_scale approximation; top_p not modelled)",
    checks="the online estimator inside adaptive verification at concurrency 64 on a one-GPU dense deployment, and "
           "how much accepted length adaptive trims",
    fitted="none (gb200.json and qwen3-32b.json state published figures and copied H100 efficiencies)",
    run=_pr52228_glimmer))

_register(Anchor(
    name="pr52992-glm52-dspark16",
    source="vLLM PR 52992 ([WIP] Model Runner V2: enable adaptive verification for more attention backends): "
           "nvidia/GLM-5.2-NVFP4 + Inferact/GLM-5.2-DSpark with 16 speculative tokens on 4x GB200, speed-bench 1K/2K, "
           "512 prompts, concurrency 64, temperature 1, top_p 0.95: baseline (fixed K = 16) 1,588.78 -> adaptive "
           "verification 4,508.91 output tok/s, median TPOT 38.95 -> 13.00 ms, acceptance length 4.35 -> 3.76, and the "
           "share of drafts accepted at each of the 16 positions (71.2% ... 5.0% fixed)",
    setup=f"chat.jsonl ({PR52228_SAMPLE} requests sampled, seed 0) at temperature 1, glm-5.2 (models/llms/glm-5.2.json: "
          f"GLM-5's MoE/MLA sizes, NVFP4 experts) on gb200 at tensor_parallel_size {PR52992_TP}, dspark-qwen3-b7 at "
          f"block {PR52992_K}; adaptive against model-fixed:{PR52992_K} at batch {PR52992_CONCURRENCY}; acceptance "
          "length as vLLM counts it; positions 1, 2, 4, 8, 16 of the fixed arm compared",
    unmatched="GLM-5.2's own sizes (GLM-5's stand in), its DSA sparse attention and MLA kernels (one 576-wide KV head), "
              "the GLM-5.2 DSpark drafter (the Qwen3 DSpark profile at block 16 stands in), how the 4 GPUs are split "
              "(TP4 assumed), GB200's real efficiencies and capture limit, speed-bench 1K/2K (ShareGPT chat stands in), "
              "temperature 1 (temp_scale approximation)",
    checks="adaptive verification against a long fixed chain (17 tokens a request, 1,088 a step at 64) on a large "
           "MoE across GPUs, and the DSpark profile's decay to depth 16",
    fitted="none",
    run=_pr52992))

_register(Anchor(
    name="pr48892-mtp-layers",
    source="vLLM PR 48892 (Model Runner V2: add multi-layer MTP speculator), Inkling's multi-module MTP on GSM8K, "
           "concurrency 64, temperature 0: acceptance length 1.84 with one MTP module (K = 1) and 4.40 with eight "
           "(K = 8); per-position acceptance of the eight-module run 75.7, 60.1, 49.8, 41.1, 35.4, 29.8, 26.1, 22.3%. "
           "Its throughput (1,646.15 vs 2,148.42 tok/s) is left out: Inkling's architecture and the GPU are not "
           "stated in the PR text read",
    setup=f"chat.jsonl ({PR52228_SAMPLE} requests sampled, seed 0), temperature 0; what --speculative-config "
          "'{\"method\": \"mtp\", \"num_speculative_tokens\": K}' runs for a target with K MTP modules "
          f"(sim.core.vllm.speculative_config: model-fixed:K with the mtp-standin profile at block K), batch "
          f"{PR48892_CONCURRENCY}; acceptance length as vLLM counts it; positions 1, 2, 4, 8 compared",
    unmatched="Inkling (no spec: acceptance does not depend on the cost model, so qwen3-8b on h100-sxm runs it), its "
              "MTP modules (the mtp-standin profile, eagle-llama3.1-8b's acceptance, stands for any MTP: one module "
              "per depth is not modelled), GSM8K (not bundled: ShareGPT chat stands in, which is less predictable)",
    checks="the mtp-standin profile that --speculative-config method mtp runs, against a published MTP's acceptance",
    fitted="none",
    run=_pr48892))


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
    checks = [f for v in figures.values() for f in v if not f.fitted]  # a fitted figure checks nothing
    n, ok = len(checks), sum(f.within for f in checks)
    n_fit = sum(f.fitted for v in figures.values() for f in v)
    out = ["# The simulator against published measurements", "",
           f"Made by `{command}` ({wall_s:.0f} s on the machine that ran it). Simulation only: each figure is the "
           "simulator's reproduction of a published measurement, none is a real run of this project.", "",
           f"**{ok} of {n} figures within their targets**"
           + (f" ({n_fit} more were fitted to, marked (fitted), and are not counted)" if n_fit else "")
           + ". A target is relative (of the published value) unless "
           "written ±x without %, which is absolute in the figure's units (shares, ratios). What the misses say "
           "about the simulator's missing mechanisms: docs/anchors.md.", "",
           "| anchor | figures within target | largest miss (in its target's terms) |", "|---|---:|---|"]
    for a in anchors:
        fs = [f for f in figures[a.name] if not f.fitted]
        n_fit = len(figures[a.name]) - len(fs)
        worst = max(fs, key=lambda f: f.miss if math.isfinite(f.miss) else math.inf) if fs else None
        out.append(f"| {a.name} | {sum(f.within for f in fs)} of {len(fs)}" + (f" (+{n_fit} fitted)" if n_fit else "")
                   + (f" | {worst.deviation} ({worst.metric}) |" if worst else " | none counted: every figure fitted |"))
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
    ap.add_argument("--out", default=DEFAULT_OUT, help="the Markdown report to write (anchors.json beside it)")
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
    out = Path(a.out)
    if out.suffix != ".md":
        raise ConfigError(f"--out {out}: give a .md file (the figures are written beside it as .json)")
    json_out = out.with_suffix(".json")  # the figures as data, beside the report (read by sim.api.report)
    if not a.no_report:
        for f in (out, json_out):  # before any work
            check_out_file(f, a.force, "--out")
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
        checks = [f for f in flat if not f.fitted]
        print(f"{sum(f.within for f in checks)} of {len(checks)} figures within their targets"
              + (f" ({len(flat) - len(checks)} fitted figures not counted)" if len(checks) < len(flat) else "")
              + f" ({wall:.0f} s)")
    if not a.no_report:
        cmd = ("python -m sim.anchors" + "".join(f" --only {n}" for n in (a.only or ()))
               + (f" --out {a.out}" if flag_given("--out") else "") + (" --force" if a.force else ""))
        text = report(chosen, figures, cmd, wall) + "\n"  # both rendered before either is written
        data = json.dumps([f.as_dict() for f in flat], indent=1) + "\n"
        write_files(out.parent, {out.name: text, json_out.name: data}, overwrite=a.force, unit=out.name)
        print(f"wrote {a.out} and {json_out}", file=sys.stderr)
    return 0
