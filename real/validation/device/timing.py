"""(d) The plugin's step (observe + propose) timed, and its CUDA launches counted, at each of --sizes requests
(1, 8, 32, 256) with --history tokens (40,960) in every request's history.

Per batch size R: a plan over S = max(--sizes) slots (state.step_plan), the drafter warmed up at 1 and R requests
(the plugin warms at 1 and S; the constants of R are what the step needs), two untimed live steps, then --steps
timed ones, each started after a device sync:
  step_ms    CUDA events around observe + propose on the device's stream (the wall clock on the CPU): what the step
             costs vLLM per decoding step, host launch gaps included (the plugin runs eagerly after DSpark's graph);
  launch_ms  the host's time to issue the step (perf_counter around the calls, before any sync);
medians over the timed steps. Then one more step under torch.profiler (CUDA activity), each half in its own session:
  kernels    device-side events of the half that are kernels (activity "kernel"; memcpy and memset counted apart),
  launch_calls  host-side runtime or driver calls whose name contains "LaunchKernel".
aten_ops is the count of kernel-launching aten ops dispatched (real.vllm_plugin.checks.audit_step on the meta
device, W = K_b = --slots): what the CPU can count; over_op_budget names a half that launched more kernels than the
budget the default tests hold the CPU step's ops to (checks.MAX_STEP_OPS, at W = 7), a figure only.
Passes when a size was measured and the kernels per step do not grow with the batch: the largest count at most
LAUNCH_GROWTH times the smallest (the step has no per-request loop; the price sweep switches algorithm at a batch
size, so the count may change a little). On the CPU launch counting is skipped (no CUDA device), and a size whose
torch n-gram path would need more than half the free memory (TORCH_PATH_BYTES per history token of each context it
scans) is skipped with that reason.
"""
from __future__ import annotations

import os
import time

import numpy as np
import torch

from real.vllm_plugin.checks import MAX_STEP_OPS, audit_step
from real.validation.device.kernels import backend
from real.validation.device.runner import Context, Outcome, register
from real.validation.device.state import StepPlan, drafter, step, step_plan

WARM_STEPS = 2
TORCH_PATH_BYTES = 40  # live bytes per scanned history token in the torch n-gram path (its [B, L] temporaries)
LAUNCH_CALLS = "LaunchKernel"
LAUNCH_GROWTH = 2.0


def free_bytes(device: torch.device) -> int:
    """Free memory of the device (the host's available RAM for the CPU)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def torch_path_bytes(R: int, W: int, width: int) -> int:
    """What the torch n-gram path holds at once at batch R: first_token_hits scans R * (W + 1) contexts of `width`."""
    return (R + 1) * (W + 2) * width * TORCH_PATH_BYTES


def timed_step(ctx: Context, d, plan: StepPlan, s: int) -> tuple[float, float]:
    """(step_ms, launch_ms) of live step s (module docstring)."""
    if not ctx.cuda:
        t0 = time.perf_counter()
        step(d, plan, s)
        ms = (time.perf_counter() - t0) * 1e3
        return ms, ms
    torch.cuda.synchronize(ctx.device)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    t0 = time.perf_counter()
    step(d, plan, s)
    host = (time.perf_counter() - t0) * 1e3
    e1.record()
    torch.cuda.synchronize(ctx.device)
    return e0.elapsed_time(e1), host


def count_events(events) -> dict[str, int]:
    """Kernels, memcpys and memsets on the device, and host launch calls, among torch.profiler events."""
    out = {"kernels": 0, "memcpy": 0, "memset": 0, "launch_calls": 0}
    for e in events:
        name = str(e.name)
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kind = (getattr(e, "activity_type", None) or "").lower()  # older torch: no activity type
            if "memcpy" in kind or name.startswith("Memcpy"):
                out["memcpy"] += 1
            elif "memset" in kind or name.startswith("Memset"):
                out["memset"] += 1
            elif kind in ("", "kernel", "concurrent_kernel"):
                out["kernels"] += 1
        elif LAUNCH_CALLS in name:
            out["launch_calls"] += 1
    return out


def count_launches(ctx: Context, d, plan: StepPlan, s: int) -> dict[str, dict[str, int]]:
    """One live step with each half under its own profiler session: count_events per half."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    torch.cuda.synchronize(ctx.device)
    with profile(activities=acts) as p_obs:
        d.observe(plan.idx, plan.ns[s], plan.nr[s], plan.token_ids, plan.totals[s], plan.prompt_len)
        torch.cuda.synchronize(ctx.device)
    with profile(activities=acts) as p_prop:
        d.propose(plan.idx, plan.ns[s], plan.mtok[s], plan.mconf[s], plan.token_ids, plan.totals[s], plan.prompt_len,
                  d.table, d.draft_ms(plan.R))
        torch.cuda.synchronize(ctx.device)
    return {"observe": count_events(p_obs.events()), "propose": count_events(p_prop.events())}


def measure(ctx: Context, R: int) -> dict:
    """The figures of batch size R (module docstring)."""
    o = ctx.opts
    S = max(o.sizes)
    n = o.steps
    plan = step_plan(R, S, o.slots, o.block, o.history, WARM_STEPS + n + 1, o.seed).to(ctx.device)
    d = drafter(plan, ctx.device, warm_sizes=(1, R))  # the constants of R (warming every slot costs a CPU dearly)
    for s in range(WARM_STEPS):
        step(d, plan, s)
    got = [timed_step(ctx, d, plan, s) for s in range(WARM_STEPS, WARM_STEPS + n)]
    ops = audit_step(R, device="meta", width=min(o.history, 4096), k=o.slots)
    row = {"requests": R, "step_ms": float(np.median([g[0] for g in got])),
           "launch_ms": float(np.median([g[1] for g in got])), "timed_steps": n,
           "aten_ops": ops["observe"] + ops["propose"]}
    if ctx.cuda:
        counts = count_launches(ctx, d, plan, WARM_STEPS + n)
        row["launches"] = counts
        row["kernels"] = counts["observe"]["kernels"] + counts["propose"]["kernels"]
    return row


@register("d", "timing", "the plugin's step time and CUDA launches per batch size", cap_s=120, quick_cap_s=30)
def check_timing(ctx: Context) -> Outcome:
    o = ctx.opts
    how = backend(ctx)
    rows, left_out, over = [], [], []
    ctx.partial.update(sizes=rows, left_out=left_out)  # what a timed-out run keeps
    for R in sorted(o.sizes):
        need = torch_path_bytes(R, o.slots, o.history) if how == "torch" else 0
        if need and need > free_bytes(ctx.device) // 2:
            left_out.append(f"R={R}: the torch n-gram path needs about {need / 2**30:.1f} GiB, more than half the free "
                            "memory")
            continue
        if ctx.left() < 5:
            left_out.append(f"R={R}: the check's cap was reached")
            continue
        row = measure(ctx, R)
        rows.append(row)
        for half in ("observe", "propose"):
            k = row.get("launches", {}).get(half, {}).get("kernels")
            if k is not None and k > MAX_STEP_OPS[half]:
                over.append(f"R={R} {half}: {k} kernels > {MAX_STEP_OPS[half]}")
    figures = {"device": str(ctx.device), "ngram_backend": how, "history": o.history, "slots": o.slots,
               "block": o.block, "slots_total": max(o.sizes), "sizes": rows,
               "launch_counting": "torch.profiler CUDA events per half" if ctx.cuda else
               "skipped: no CUDA device (aten_ops is the CPU's count of kernel-launching ops)"}
    if over:
        figures["over_op_budget"] = over
    if left_out:
        figures["left_out"] = left_out
    if not rows:
        return Outcome("skip", "; ".join(left_out) or "no size measured", figures)
    kern = [r["kernels"] for r in rows if "kernels" in r]
    timing = ", ".join(f"R={r['requests']}: {r['step_ms']:.2f} ms" + (f" / {r['kernels']} kernels" if "kernels" in r
                                                                        else "") for r in rows)
    tail = f"; left out {'; '.join(left_out)}" if left_out else ""
    counted = "" if ctx.cuda else " (launch counting skipped: no CUDA device)"
    if kern and max(kern) > LAUNCH_GROWTH * max(min(kern), 1):
        return Outcome("fail", f"the kernels per step grow with the batch ({timing}): a per-request loop?", figures)
    return Outcome("pass", f"history {o.history}, {how} n-gram: {timing}{counted}{tail}", figures)
