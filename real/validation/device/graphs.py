"""(e) The plugin's step captured as one CUDA graph: replayed, it gives what the eager step gives, and costs less.

Two HybridDrafters on one plan (state.step_plan: --equal-reqs rows and a padded one, --equal-history tokens), both
warmed up at start-up. One runs eagerly. The other's step (observe, then propose, on static input tensors) is
captured once with torch.cuda.graph, after a padded step at the same batch size on a side stream (so every device
constant the step caches exists before the capture); for each live step its inputs are copied into the static
tensors and the graph replayed. After every step both snapshots are compared (state.differences: integers and
booleans equal, floats within 1e-6 relative). Then --steps more steps of each are timed (CUDA events, each after a
device sync; the host time to issue the replay or the eager step beside it): replay_ms against eager_ms. Passes
when the capture succeeds and every replayed step equals the eager one. Without CUDA: skipped.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from real.validation.device.runner import Context, Outcome, register
from real.validation.device.state import StepPlan, differences, drafter, max_float_diff, snapshot, step, step_plan


class CapturedStep:
    """The drafter's observe + propose captured on static inputs (module docstring)."""

    def __init__(self, d, plan: StepPlan):
        self.d, self.plan = d, plan
        self.ns, self.nr = plan.ns[0].clone(), plan.nr[0].clone()
        self.total = plan.totals[0].clone()
        self.mtok, self.mconf = plan.mtok[0].clone(), plan.mconf[0].clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            d.padded_step(plan.R, plan.token_ids, self.total, plan.prompt_len)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        steps = d.steps
        with torch.cuda.graph(self.graph):
            self.out = self._step()
        d.steps = steps  # the capture ran nothing: the Python counter must not count it

    def _step(self):
        d, p = self.d, self.plan
        ns, nr = d.observe(p.idx, self.ns, self.nr, p.token_ids, self.total, p.prompt_len)
        prop = d.propose(p.idx, self.ns, self.mtok, self.mconf, p.token_ids, self.total, p.prompt_len, d.table,
                         d.draft_ms(p.R))
        return ns, nr, prop

    def load(self, s: int) -> None:
        """Step s's inputs into the static tensors (device-to-device copies)."""
        p = self.plan
        for dst, src in ((self.ns, p.ns[s]), (self.nr, p.nr[s]), (self.total, p.totals[s]), (self.mtok, p.mtok[s]),
                         (self.mconf, p.mconf[s])):
            dst.copy_(src)

    def replay(self, s: int):
        self.load(s)
        self.graph.replay()
        self.d.steps += 1
        return self.out


def _time(fn) -> tuple[float, float]:
    """(device ms between CUDA events, host ms to issue) of fn(), after a sync."""
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    t0 = time.perf_counter()
    fn()
    host = (time.perf_counter() - t0) * 1e3
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1), host


@register("e", "cuda_graph", "the plugin's step captured as a CUDA graph: replay == eager, and its time",
          cap_s=60, quick_cap_s=20)
def check_graph(ctx: Context) -> Outcome:
    if not ctx.cuda:
        return Outcome("skip", "CUDA graphs need a CUDA device")
    o = ctx.opts
    n = o.steps
    plan = step_plan(o.equal_reqs, o.equal_reqs + 4, o.slots, o.block, o.equal_history, 2 * n, o.seed,
                     padded=True).to(ctx.device)
    eager, graphed = drafter(plan, ctx.device), drafter(plan, ctx.device)
    cap = CapturedStep(graphed, plan)
    first, worst, done = None, 0.0, 0
    for s in range(n):
        if ctx.left() < 3:
            break
        want = snapshot(eager, step(eager, plan, s))
        got = snapshot(graphed, cap.replay(s))
        diff = differences(want, got)
        worst = max(worst, max_float_diff(want, got))
        done += 1
        if diff and first is None:
            first = f"step {s}: " + ", ".join(f"{k} ({v:g})" for k, v in sorted(diff.items()))
    times = {"eager": [], "replay": []}
    for s in range(n, 2 * n):
        if ctx.left() < 2:
            break
        times["eager"].append(_time(lambda s=s: step(eager, plan, s)))
        times["replay"].append(_time(lambda s=s: cap.replay(s)))
    med = {f"{k}_{i}": float(np.median([t[j] for t in v])) if v else None
           for k, v in times.items() for j, i in enumerate(("ms", "host_ms"))}
    figures = {"requests": plan.R - 1, "padded_rows": 1, "history": o.equal_history, "slots": plan.W,
               "compared_steps": done, "timed_steps": len(times["replay"]), "max_float_difference": worst, **med}
    if first:
        figures["first_difference"] = first
        return Outcome("fail", f"captured step differs from eager: {first}", figures)
    if done == 0:
        return Outcome("skip", "captured, but no step compared before the cap", figures)
    t = (f"; replay {med['replay_ms']:.3f} ms vs eager {med['eager_ms']:.3f} ms (host {med['replay_host_ms']:.3f} vs "
         f"{med['eager_host_ms']:.3f} ms)" if med["replay_ms"] is not None else "")
    return Outcome("pass", f"captured once, {done} replayed steps == eager{t}", figures)
