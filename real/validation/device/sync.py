"""(c) No host synchronisation in the plugin's per-step path (observe + propose), the rule vLLM's
VLLM_GPU_SYNC_CHECK=error enforces on a real run (real/validation/vllm/checks.py, item c).

On CUDA, two ways at the batch sizes 1, --equal-reqs and the largest of --sizes:
  sync debug  after the start-up warm-up, `steps` live steps run under torch.cuda.set_sync_debug_mode("error"), so
              any synchronising call in them (.item(), .cpu(), nonzero, a blocking copy) raises;
  audit       real.vllm_plugin.checks.audit_step on the device: every host-to-device copy the step makes.
On the CPU there is no device to wait for; the project's stand-in is the audit on the meta device, where a host
read of a device value (.item(), .cpu(), a branch on a tensor) raises and any host-to-device copy is listed.
Passes when nothing raised and no step made a host-to-device copy.
"""
from __future__ import annotations

import torch

from real.vllm_plugin.checks import audit_step
from real.validation.device.runner import Context, Outcome, one_line, register
from real.validation.device.state import drafter, step, step_plan


def sizes(ctx: Context) -> list[int]:
    o = ctx.opts
    return sorted({1, o.equal_reqs, max(o.sizes)})


def _debug_mode_steps(ctx: Context, R: int) -> str | None:
    """The first synchronisation of `steps` live steps at batch R under the sync debug mode (None: none)."""
    o = ctx.opts
    plan = step_plan(R, R, o.slots, o.block, o.equal_history, o.steps, o.seed).to(ctx.device)
    d = drafter(plan, ctx.device)
    torch.cuda.synchronize(ctx.device)
    try:
        torch.cuda.set_sync_debug_mode("error")
        for s in range(plan.steps):
            step(d, plan, s)
    except RuntimeError as exc:
        return one_line(exc)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize(ctx.device)
    return None


@register("c", "sync", "no host sync in the plugin's per-step path", cap_s=30, quick_cap_s=20)
def check_sync(ctx: Context) -> Outcome:
    o = ctx.opts
    audit_dev = ctx.device if ctx.cuda else torch.device("meta")
    rows, bad = [], []
    for R in sizes(ctx):
        if ctx.left() < 3:
            break
        row = {"requests": R}
        try:
            a = audit_step(R, device=audit_dev, width=min(o.equal_history, 4096), k=o.slots)
            row["audit_h2d_copies"] = len(a["h2d"])
            if a["h2d"]:
                bad.append(f"R={R}: host-to-device copies {a['h2d'][:3]}")
        except (RuntimeError, NotImplementedError) as exc:  # meta: a host read of a device value
            row["audit_h2d_copies"] = None
            bad.append(f"R={R}: the audit raised {one_line(exc)}")
        if ctx.cuda:
            why = _debug_mode_steps(ctx, R)
            row["sync_debug_error"] = why
            if why:
                bad.append(f"R={R}: {why}")
        rows.append(row)
    how = ("torch.cuda.set_sync_debug_mode('error') over live steps and the audit on the device" if ctx.cuda else
           "the audit on the meta device (no CUDA device: a host read of a device value raises there)")
    figures = {"method": how, "sizes": rows, "steps": o.steps if ctx.cuda else 1}
    if bad:
        return Outcome("fail", "; ".join(bad), figures)
    if not rows:
        return Outcome("skip", "no batch size checked before the cap", figures)
    return Outcome("pass", f"no host sync and no host-to-device copy at R = {', '.join(str(r['requests']) for r in rows)}"
                           f" ({how})", figures)
