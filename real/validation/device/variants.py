"""(g) The recommended variants' device paths: the skip, online recalibration (runcal) and the plugin's step timers.

The verdict's cells run the plugin with `slots=32:skip` and `slots=32:runcal=64`; their device work is more than (b)
checks: plan_skip's host decision on pinned host copies of the last step's state (on CUDA an asynchronous copy and
an event the next decision waits on), the n-gram-only step after a skipped DSpark pass, runcal's logit offsets
graded in observe, and the StepClock segments (CUDA timing events) around each part, as the speculator runs them:

    per live step s:  observe (timed)  ->  ran = plan_skip(slots) (timed, host)  ->  propose(ran_model=ran) (timed)
                      -> clock.commit(R)

One plan (state.step_plan, as in (b)) runs through two HybridDrafters with hybrid_spec {skip: true, runcal: 64}, one
on the CPU and one on the device, the draft cost SKIP_SCALE times the plan's and a skipped pass priced at 0 ms (so
the skip is worth taking on some steps). Passes when every step's decision, outputs and state (state.differences,
runcal's offsets too) are equal and the device's clock kept one positive, finite sample per step; the figures say how
many steps skipped DSpark's pass. Without CUDA both run on the CPU (the decision's determinism and the CPU clock).
"""
from __future__ import annotations

import math

import torch

from real.validation.device.runner import Context, Outcome, register
from real.validation.device.state import differences, drafter, max_float_diff, snapshot, step_plan
from real.vllm_plugin.config import HybridSpecConfig

RUNCAL = 64        # the verdict's runcal=64
SKIP_SCALE = 10.0  # the plan's draft cost (1..2 ms) times this: a saving the skip can weigh against the n-gram chain


def _live_step(d, plan, s: int, slots: list[int]):
    """One live step as the speculator runs it, every part inside the drafter's clock; (ran, (ns, nr, Proposal))."""
    c = d.clock
    t = c.start()
    ns, nr = d.observe(plan.idx, plan.ns[s], plan.nr[s], plan.token_ids, plan.totals[s], plan.prompt_len)
    c.stop(t)
    t = c.start()
    ran = bool(d.plan_skip(slots))
    c.stop(t)
    t = c.start()
    p = d.propose(plan.idx, plan.ns[s], plan.mtok[s], plan.mconf[s], plan.token_ids, plan.totals[s], plan.prompt_len,
                  d.table, d.draft_ms(plan.R), ran_model=ran)
    c.stop(t)
    c.commit(plan.R)
    return ran, (ns, nr, p)


@register("g", "variants", "the skip, runcal and the step timers: device == CPU, the clock's samples",
          cap_s=45, quick_cap_s=30)
def check_variants(ctx: Context) -> Outcome:
    o = ctx.opts
    plan = step_plan(o.equal_reqs, o.equal_reqs + 4, o.slots, o.block, o.equal_history, o.steps, o.seed, padded=True)
    runs = {"cpu": plan, "device": plan.to(ctx.device)}
    cfg = HybridSpecConfig(skip=True, runcal=RUNCAL)
    ds = {}
    for name, p in runs.items():
        d = drafter(p, p.token_ids.device, cfg=cfg)
        d.set_cost_tables(p.draft_table * SKIP_SCALE, p.verify_table)
        d.set_skip_table([0.0] * len(p.draft_table))
        ds[name] = d
    slots = [int(i) for i in plan.idx.tolist() if i >= 0]
    fig = ctx.partial
    fig.update(requests=len(slots), padded_rows=1, slots=plan.W, block=plan.block, runcal=RUNCAL)
    first, worst, skipped, done = None, 0.0, 0, 0
    for s in range(plan.steps):
        if ctx.left() < 2:
            break
        snaps, ran = {}, {}
        for name, p in runs.items():
            ran[name], out = _live_step(ds[name], p, s, slots)
            snaps[name] = snapshot(ds[name], out)
            snaps[name]["runcal_offset"] = ds[name].rc_b.detach().to("cpu", copy=True)
        diff = differences(snaps["cpu"], snaps["device"])
        if ran["cpu"] != ran["device"]:
            diff["ran_model"] = 1.0
        worst = max(worst, max_float_diff(snaps["cpu"], snaps["device"]))
        skipped += not ran["device"]
        done += 1
        if diff and first is None:
            first = f"step {s}: " + ", ".join(f"{k} ({v:g})" for k, v in sorted(diff.items()))
    clock = ds["device"].clock.samples("live")
    bad = [ms for _, ms in clock if not (math.isfinite(ms) and ms > 0)]
    where = f"{ctx.device} vs cpu" if ctx.cuda else "cpu vs cpu (no CUDA device: determinism and the CPU clock only)"
    fig.update(compared=where, steps=done, skipped_passes=skipped, max_float_difference=worst,
               runcal_offsets=[float(x) for x in ds["device"].rc_b.tolist()], clock_samples=len(clock),
               clock_ms=[round(ms, 4) for _, ms in clock[:8]], clock_kind="CUDA events" if ctx.cuda else "perf_counter")
    fig.pop("phase", None)
    if first:
        fig["first_difference"] = first
        return Outcome("fail", f"{where}: {first}", dict(fig))
    if done == 0:
        return Outcome("skip", "no step compared before the cap", dict(fig))
    if len(clock) != done or bad:
        return Outcome("fail", f"the step clock kept {len(clock)} sample(s) for {done} steps"
                               + (f", {len(bad)} not positive and finite" if bad else ""), dict(fig))
    return Outcome("pass", f"{where}: {done} steps equal with skip and runcal={RUNCAL} ({skipped} skipped DSpark's "
                           f"pass); the clock ({fig['clock_kind']}) kept {len(clock)} positive samples", dict(fig))
