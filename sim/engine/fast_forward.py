"""Fast-forward of the engine over a stretch of pure decode steps of a policy that drafts nothing (`none`).

In such a stretch every running request decodes (no prefill pending), nothing is admitted (the batch is
full, the head of the queue does not fit in the KV cache, or nothing waits and no arrival is due before the
stretch's last step starts), nothing is preempted
(the KV the running requests hold, in blocks, stays within capacity at every step) and nothing finishes
(the stretch ends one step before the first request's last token). Each step then emits exactly one token
per running request -- the target's output[pos] -- and only positions, KV tokens and the clock change, so k
steps are computed at once: the emission and per-request state with numpy, and each step's charge and
time with the same scalar calls and float operations, in the same order, as Engine._step and
Engine._finish_step (the per-step code stays the definition; tests/test_engine_ff.py compares every step
and request column bit for bit against HYBRIDSPEC_REFERENCE_ENGINE=1, which disables this).

Clock: step j starts at t_j = t_{j-1} + step_ms_{j-1} (simpy's now + delay, a sequential float sum);
the engine yields one timeout of t_k - t_0 when that reproduces t_k exactly, else one per step.
"""
from __future__ import annotations

import numpy as np

from sim.engine.api import EngineSteps
from sim.core.scheduler import in_blocks
from sim.engine.step_log import make_record
from sim.engine.step_time import host_syncs, step_time

MIN_STEPS = 2  # shorter stretches step normally (the set-up costs about a step)


def fast_forward(engine: EngineSteps, now_ms: float, next_event_ms: float) -> list[float]:
    """Run the pure-decode stretch that starts at `now_ms` (k >= MIN_STEPS steps, else nothing) and return its
    step delays [ms]; `next_event_ms` is the time of simpy's next pending event (an arrival)."""
    sched, tb = engine.sched, engine.tb
    running = sched.running
    R = len(running)
    if not R or sched.last_draft:
        return []
    # Nothing can be admitted in the stretch when the batch is full, or when the head of the queue does not
    # fit now: the running requests' KV only grows, the head's need is fixed, arrivals queue behind it.
    full = R >= sched.batch_size or bool(sched.waiting) and (
        sched.kv_used() + sched.kv_need(sched.waiting[0], sched.kmax + 1) > sched.kv_cap)
    if not full and (sched.waiting or not next_event_ms > now_ms):
        return []
    st = sched.state
    reqs = np.asarray(running, dtype=np.int64)
    if np.any(st.prefilled[reqs] < st.prefill_target[reqs]):
        return []
    pos0 = st.pos[reqs]
    k = int((tb.out_len[reqs] - pos0).min()) - 1  # no request finishes within the stretch
    if k < MIN_STEPS:
        return []
    if R > 1:  # no step's schedule preempts: KV held (kmax = 0: one more token each) within capacity
        bs = sched.block
        base = sched.prompt_len[reqs] + pos0 + 1
        used_last = int(in_blocks(base + (k - 1), bs).sum())
        if used_last > sched.kv_cap:  # monotone in j: find the first step that would preempt
            j = np.arange(k)[:, None]
            used = in_blocks(base[None, :] + j, bs).sum(axis=1)
            k = int(np.argmax(used > sched.kv_cap))
            if k < MIN_STEPS:
                return []
    # Each step's charge and time, as Engine._finish_step computes them (scalar calls, same float order).
    cost, pol = engine.cost, engine.policy
    sync = host_syncs(pol, engine.cfg)
    gt = cost.graph_tokens(R)
    sample = cost.sample_ms(R)
    cpu = cost.cpu_ms(R, R)
    kv_first = int((tb.prompt_len[reqs] + pos0).sum())
    rows, delays = [], []
    t = now_ms
    append = rows.append
    for j in range(k):
        if not full and not t < next_event_ms:  # this step could see an arrival: the stretch ends before it
            k = j
            break
        kv = kv_first + R * j
        verify = float(cost.verify_ms(gt, kv, R, logit_rows=R))
        gpu, step = step_time(0.0, 0.0, 0.0, verify, sample, cpu, sync)
        append(make_record((t, step, R, 0, 0, 0, 0, 0, R, 0.0, 0.0, 0.0, verify, sample, cpu, step - gpu, kv, 0,
                            R, R, R)))
        delays.append(step)
        t = t + step
    if k < MIN_STEPS:
        return []
    # Emission: step j writes output[pos0 + j] of every running request (Engine._emit's bonus token).
    p = pos0[:, None] + np.arange(k)[None, :]
    engine.emitted_tokens[(tb.offsets[reqs][:, None] + p).ravel()] = tb.tokens.take(
        (engine.out_base[reqs][:, None] + p).ravel(), mode="clip")
    engine.n_written += R * k
    st.pos[reqs] += k
    engine.prev_pos[reqs] = pos0 + (k - 1)
    engine.n_steps[reqs] += k
    st.fresh[reqs] = False
    sched.last_draft = 0
    log = engine.steps
    for row in rows[:k]:
        log.append(row)
    return delays[:k]


def clock_delays(now_ms: float, delays: list[float]) -> list[float]:
    """The timeouts that take simpy's clock from `now_ms` where the steps' `delays` take it one by one (now =
    now + delay, a sequential float sum): their total as one timeout when now + total gives that sum exactly,
    else the delays themselves."""
    end = now_ms
    for d in delays:
        end = end + d
    total = end - now_ms
    return [total] if now_ms + total == end else list(delays)
