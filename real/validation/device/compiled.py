"""(f) `compile: true` (HybridSpecConfig.compile) on the device: the plugin's step as compiled graphs.

HybridDrafter(compiled=True) compiles observe's and propose's device work with torch.compile (fullgraph, the batch
size dynamic; real/vllm_plugin/hybrid.py compile_step). On CUDA the n-gram match inside them is the plugin's own
Triton kernels, which inductor has to take as user-defined kernels: whether that traces is what this check finds.
At --equal-reqs rows and a padded one (state.step_plan):
  trace    torch._dynamo.explain over one eager observe and propose (a throwaway drafter): graphs and graph breaks,
           with the first break reasons; a break means fullgraph compilation cannot work, and why;
  compile  a compiled drafter's padded step at that batch size (what the speculator's warm-up does), timed;
  compare  --steps live steps against an eager drafter (state.differences, as in (b));
  time     compiled and eager step (CUDA events after a sync) and the compiled step's kernels (timing.count_launches).
Passes when it compiles and every step equals the eager one; a failure's summary is the one-line reason, recorded as
informational (`info`, not a failed run): the plugin refuses `compile: true` on CUDA (HybridSpecConfig), so no
served step depends on it; the finding says what fullgraph compilation would have to get past. Without
CUDA: skipped (the CPU build's compiled step is checked by `python -m pytest -m slow tests/test_vllm_plugin_fused.py`).
"""
from __future__ import annotations

import time

import numpy as np

from real.validation.device.runner import Context, Outcome, one_line, register
from real.validation.device.state import differences, drafter, max_float_diff, snapshot, step, step_plan
from real.validation.device.timing import count_launches, timed_step

REASONS = 3  # graph-break reasons kept


def _first_line(text: str) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= 300 else line[:297] + "..."


def trace(ctx: Context, plan) -> dict:
    """torch._dynamo.explain of one eager observe and one propose: graph and break counts, the first reasons."""
    import torch._dynamo

    d = drafter(plan, ctx.device)
    out = {}
    for half, fn, args in (
            ("observe", d.observe, (plan.idx, plan.ns[0], plan.nr[0], plan.token_ids, plan.totals[0], plan.prompt_len)),
            ("propose", d.propose, (plan.idx, plan.ns[0], plan.mtok[0], plan.mconf[0], plan.token_ids, plan.totals[0],
                                    plan.prompt_len, d.table, d.draft_ms(plan.R)))):
        torch._dynamo.reset()
        ex = torch._dynamo.explain(fn)(*args)
        out[half] = {"graphs": int(ex.graph_count), "graph_breaks": int(ex.graph_break_count),
                     "reasons": [_first_line(str(getattr(r, "reason", r))) for r in ex.break_reasons[:REASONS]]}
    torch._dynamo.reset()
    return out


@register("f", "compile", "`compile: true` on the device: the plugin's step compiled", cap_s=120, quick_cap_s=20,
          informational="the plugin refuses compile: true on CUDA, so no served step runs this")
def check_compiled(ctx: Context) -> Outcome:
    if not ctx.cuda:
        return Outcome("skip", "compile: true on CUDA needs a CUDA device (the CPU build's compiled step: "
                               "python -m pytest -m slow tests/test_vllm_plugin_fused.py)")
    o = ctx.opts
    n = o.steps
    plan = step_plan(o.equal_reqs, o.equal_reqs + 4, o.slots, o.block, o.equal_history, 2 * n, o.seed,
                     padded=True).to(ctx.device)
    fig = ctx.partial
    fig.update(requests=plan.R - 1, padded_rows=1, history=o.equal_history, slots=plan.W, phase="tracing")
    try:
        fig["trace"] = trace(ctx, plan)
    except Exception as exc:  # noqa: BLE001 - the tracer's own failure is a finding; the compile is still tried
        fig["trace"] = {"error": one_line(exc)}
    breaks = [f"{half}: {r}" for half, t in fig["trace"].items() if isinstance(t, dict) for r in t["reasons"]]
    fig["phase"] = "compiling"
    t0 = time.perf_counter()
    try:
        comp = drafter(plan, ctx.device, compiled=True, warm=False)
        comp.padded_step(plan.R, plan.token_ids, plan.totals[0], plan.prompt_len)
    except Exception as exc:  # noqa: BLE001 - the reason is the check's result
        fig["compile_error"] = one_line(exc)
        del fig["phase"]
        why = f"; graph breaks: {breaks[0]}" if breaks else ""
        return Outcome("fail", f"compile: true does not compile on {ctx.device}: {one_line(exc)}{why}", dict(fig))
    fig["compile_s"] = round(time.perf_counter() - t0, 1)
    fig["phase"] = "comparing"
    eager = drafter(plan, ctx.device)
    first, worst, done = None, 0.0, 0
    for s in range(n):
        if ctx.left() < 3:
            break
        want, got = snapshot(eager, step(eager, plan, s)), snapshot(comp, step(comp, plan, s))
        diff = differences(want, got)
        worst = max(worst, max_float_diff(want, got))
        done += 1
        if diff and first is None:
            first = f"step {s}: " + ", ".join(f"{k} ({v:g})" for k, v in sorted(diff.items()))
    fig.update(compared_steps=done, max_float_difference=worst, phase="timing")
    times = {"eager": [], "compiled": []}
    for s in range(n, 2 * n - 1):
        if ctx.left() < 3:
            break
        times["eager"].append(timed_step(ctx, eager, plan, s)[0])
        times["compiled"].append(timed_step(ctx, comp, plan, s)[0])
    for k, v in times.items():
        fig[f"{k}_ms"] = float(np.median(v)) if v else None
    if ctx.left() > 3:
        fig["compiled_launches"] = count_launches(ctx, comp, plan, 2 * n - 1)
    del fig["phase"]
    if first:
        fig["first_difference"] = first
        return Outcome("fail", f"compiled step differs from eager: {first}", dict(fig))
    if done == 0:
        return Outcome("skip", f"compiled in {fig['compile_s']} s, but no step compared before the cap", dict(fig))
    k = fig.get("compiled_launches")
    kern = f", {k['observe']['kernels'] + k['propose']['kernels']} kernels" if k else ""
    t = (f"; {fig['compiled_ms']:.3f} ms vs eager {fig['eager_ms']:.3f} ms{kern}" if fig["compiled_ms"] is not None
         else "")
    return Outcome("pass", f"compiled in {fig['compile_s']} s; {done} steps == eager{t}", dict(fig))
