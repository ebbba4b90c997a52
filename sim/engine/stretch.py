"""Steady stretches: the native step's decode steps run back to back in one loop while the schedule is fixed.

While the scheduler's running set is steady (sim/core/scheduler.py: every running request decodes, their KV fits
up to their last steps, and nothing can be admitted) and no simpy event is due, every Engine._step has the
same shape: the plan is the steady decoding set with no prefill, nothing is preempted or admitted, and only
the tables' rows, the policy's choice, the KV context and the clock change. `steady_steps` runs such steps
in one Python loop: per step the native gather, the policy's fast form on the gathered arrays, the native
commit, the charge and the step's record -- the same calls with the same arguments, and the same float
operations in the same order, as Engine._step and Engine._finish_step, which stay the definition. What the
loop does not repeat is what the stretch fixes: the schedule (StepPlan), the prefill pass, the binding of
the native step to the engine's arrays, the drafters' prices for R requests, the simpy loop's bookkeeping.
A vLLM-charged run's unused drafter pass (Engine.unused_pass_ms) can fall only on a stretch's last step, where
every request completes; the loop asks the engine for it there, and whether vLLM's scheduler knew it before each
step (Engine.drafts_known_unused), as Engine._step does.

A stretch ends after the step that completes a request's output (the scheduler is asked for finished
requests then, as Engine._finish_step does), after the step that ends at or past simpy's next event (an
arrival could change the schedule), or when the engine's held-step list is full (Engine._engine, HELD_MAX).
The engine then carries on step by step; tests/test_engine_stretch.py compares every step and request column
with the stretch on and off (HYBRIDSPEC_REFERENCE_ENGINE=1, or a subclass overriding a hook, turns it off).
"""
from __future__ import annotations

from typing import Optional

from sim.engine.api import EngineSteps
from sim.engine.policy_fast import Arrays, decision
from sim.engine.step_log import make_record
from sim.engine.step_time import host_syncs, step_time


def steady_steps(engine: EngineSteps, now_ms: float, next_event_ms: float, room: int) -> Optional[tuple[list[float], list[int]]]:
    """Run the steady stretch that starts at `now_ms` (the caller checked Scheduler.steady) up to the step that
    completes an output, the step that ends at or past `next_event_ms`, or `room` steps (>= 1). Returns the
    steps' delays [ms] and the requests finished at the last one; None where the engine runs the numpy step
    (no native step: the caller steps by Engine._step from then on)."""
    fast = engine.native_step()
    if fast is None:
        return None
    sched, pol, log = engine.sched, engine.policy, engine.steps
    reqs = sched.steady_decoding
    R = n_seqs = T = len(reqs)  # every running request decodes: no prefill tokens, no prefill completes
    form = engine.array_form()
    with_mean, reuse = pol.uses_ngram and (form is None or form.reads_mean), form is not None
    base = engine.step_prices(R).copy()
    priced = base.total()
    cap = None if engine.max_logits is None else max(0, engine.max_logits - n_seqs)
    table = engine.decision_table
    direct = form is not None and not pol.needs_truth  # else Engine.decide builds what the policy reads
    fixed = base.copy()  # the prices of a step whose policy says nothing of the drafters it ran
    fixed_ran = engine.drafters_ran(None, fixed)
    sync = host_syncs(pol, engine.cfg)
    verify_ms, charge = engine.cost.verify_ms, engine.counts_charge
    checks = engine.COMMIT_CHECKS
    delays: list[float] = []
    finished: list[int] = []
    t = now_ms
    drafted = sched.last_draft
    unused, none = engine.unused_pass, ()  # vLLM's drafter pass after a step no request uses (Engine.unused_pass_ms)
    known = False
    while True:
        if unused:  # 0.33: whether vLLM's scheduler knows, before the step, that the pass after it is for nothing
            known = engine.drafts_known_unused(reqs, none)
        g = fast.gather(reqs, with_mean, reuse=reuse)
        kv = g.kv
        out = form(Arrays(g.packed, g.ptrs, g.mean_ng, T, R, priced, base.draft, cap, table, base.ngram,
                          has_nan=g.has_nan)) if direct else None
        if out is None:  # the form declined (or reads what only Engine.decide builds): the definition's way
            out = engine.decide(None if direct else form, g, T, kv, n_seqs, 0, base)
        else:
            out = decision(out)
        chain, adm, sec, said = out
        if said is None:
            prices, (model_ran, ngram_ran) = fixed, fixed_ran
        else:
            prices = base.copy()
            model_ran, ngram_ran = engine.drafters_ran(said, prices)
        sums, bad = fast.commit(g, chain, adm, sec, model_ran, ngram_ran)
        for k, what in zip(bad, checks):
            if k >= 0 and not engine.violation:
                engine.violation = f"request {int(reqs[k])}: {what}"
        drafted = sums[0] + sums[1]
        total = T + drafted
        gt, sample, cpu = charge(R, total)
        verify = float(verify_ms(gt, kv, n_seqs, logit_rows=total))
        d, ng, al = prices.draft, prices.ngram, prices.alloc
        if sums[5] and unused is not None:  # only where an output completed can no request use the drafts
            extra = engine.unused_pass_ms(reqs, none, sums[5], known)
            if extra:
                d += extra
        gpu, step = step_time(d, ng, al, verify, sample, cpu, sync)
        log.append(make_record((t, step, R, 0, sums[0], sums[1], sums[2], sums[3], sums[4], d, ng, al, verify, sample,
                                cpu, step - gpu, kv, 0, total, total, n_seqs)))
        delays.append(step)
        t = t + step
        if sums[5]:  # an output completed this step (Engine._finish_step asks the scheduler only then)
            finished = sched.pop_finished(engine.tb.out_len)
            break
        if not t < next_event_ms or len(delays) >= room:
            break
    sched.last_draft = drafted
    return delays, finished
