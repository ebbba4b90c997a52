"""(b) The plugin's step on the device gives what the same step gives on the CPU.

One plan (state.step_plan: --equal-reqs live rows and a padded one, --equal-history tokens, --steps steps) runs
through two HybridDrafters, one on the CPU (the torch n-gram path) and one on the device (the Triton kernels on
CUDA). After every step both snapshots are compared field by field (state.differences): observe's returned counts,
the published tokens, confidences, chain choices and n-gram lengths, and the drafter's state (copy history, live
statistics). Integers and booleans must be equal; floats within 1e-6 relative (float64 sums may add in another
order on the device). Passes when every step is equal. Without a CUDA device both runs are on the CPU: that checks
the driver and the step's determinism only, and says so.
"""
from __future__ import annotations

import numpy as np

from real.validation.device.runner import Context, Outcome, register
from real.validation.device.state import differences, drafter, max_float_diff, snapshot, step, step_plan


@register("b", "equality", "the plugin's step on the device == the same step on the CPU", cap_s=45, quick_cap_s=30)
def check_equality(ctx: Context) -> Outcome:
    o = ctx.opts
    plan = step_plan(o.equal_reqs, o.equal_reqs + 4, o.slots, o.block, o.equal_history, o.steps, o.seed, padded=True)
    runs = {"cpu": plan, "device": plan.to(ctx.device)}
    ds = {name: drafter(p, p.token_ids.device) for name, p in runs.items()}
    first, worst, share, done = None, 0.0, [], 0
    for s in range(plan.steps):
        if ctx.left() < 2:
            break
        snaps = {name: snapshot(ds[name], step(ds[name], p, s)) for name, p in runs.items()}
        diff = differences(snaps["cpu"], snaps["device"])
        worst = max(worst, max_float_diff(snaps["cpu"], snaps["device"]))
        share.append(float(snaps["cpu"]["use_ngram"][: plan.R - 1].double().mean()))
        done += 1
        if diff and first is None:
            first = f"step {s}: " + ", ".join(f"{k} ({v:g})" for k, v in sorted(diff.items()))
    where = f"{ctx.device} vs cpu" if ctx.cuda else "cpu vs cpu (no CUDA device: the driver and determinism only)"
    figures = {"compared": where, "requests": plan.R - 1, "padded_rows": 1, "history": o.equal_history,
               "slots": plan.W, "block": plan.block, "steps": done, "max_float_difference": worst,
               "ngram_chosen_share": float(np.mean(share)) if share else None}
    if first:
        figures["first_difference"] = first
        return Outcome("fail", f"{where}: {first}", figures)
    if done == 0:
        return Outcome("skip", "no step compared before the cap", figures)
    cut = f" (cap reached after {done} of {plan.steps} steps)" if done < plan.steps else ""
    return Outcome("pass", f"{where}: {done} steps x {plan.R - 1} requests equal (tokens, confidences, choices, state; "
                           f"largest float difference {worst:.1e}){cut}", figures)
