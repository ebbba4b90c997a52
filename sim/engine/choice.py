"""The one place that chooses which form a simulated step takes. Every form computes what the definition (the
Engine's own step methods, the policy's torch functions) computes, and tests/test_fast_forms.py and the engine tests
check each against it; this module says where each may stand in, and nowhere else does:

  fast_forward  a stretch of pure decode steps of `none` at once (fast_forward.py)
  stretch       the native step's steady steps in one loop (stretch.py)
  native step   the step's bookkeeping in C before and after the policy (native_step.py; its library must load)
  array form    the policy's fast form on the native step's gathered arrays (policy_fast.py, policy_fast_multi.py)
  plan form     that form's host phase, run in Engine._plan (a form over any drafters)

A form runs only while the engine's class keeps every method marked with it (forms.steps_as_defined: a subclass that
overrides one, the real torch engine or a test injecting a fault, steps as defined), and
HYBRIDSPEC_REFERENCE_ENGINE=1 / HYBRIDSPEC_REFERENCE_POLICIES=1 turn them all off (forms.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from sim.core.policies.simple import alloc_none
from sim.core.scheduler import Scheduler
from sim.engine.api import EngineSteps
from sim.engine.forms import ARRAY_FORM, FAST_FORWARD, NATIVE_STEP, STRETCH, steps_as_defined


def fast_forward_ok(engine: EngineSteps) -> bool:
    """Fast-forward: Engine's own step methods (those marked FAST_FORWARD) and scheduler, whole (not streamed)
    tables, no padded cost (it prices each step's per-request shape, Engine._step_shape), and the `none` policy's
    allocation (nothing drafted or admitted; fn is alloc_none, which the simulator runs or its fast form, checked
    equal by tests/test_fast_forms.py; with no drafter it has no unused vLLM drafter pass to charge either,
    Engine.unused_pass is None)."""
    if steps_as_defined(engine, FAST_FORWARD) or type(engine.sched) is not Scheduler or engine.padded:
        return False
    pol = engine.policy
    return (not engine.stream and pol.fn is alloc_none
            and not pol.uses_model and not pol.uses_ngram and not pol.needs_truth and engine.sched.kmax == 0)


def stretch_ok(engine: EngineSteps) -> bool:
    """Steady stretches: Engine's own step methods (those marked STRETCH) and scheduler, whole (not streamed)
    tables, no padded cost, and a budget that charges the verified drafts (not every proposed slot). A vLLM-charged
    run's unused drafter pass, by release (Engine.unused_pass_ms), it charges as the step does."""
    return (not engine.stream and type(engine.sched) is Scheduler and not steps_as_defined(engine, STRETCH)
            and not engine.padded and not engine.sched.charge.verify_all and not engine.policy.verifies_past)


def native_step_ok(engine: EngineSteps) -> bool:
    """The native step: Engine's own methods marked NATIVE_STEP, no padded cost, whole tables (streaming tables index
    the K-wide history by a live slot, Engine._hist, and the C reads it by request), every decoding request's whole
    chain gathered (not where the budget may cut it) and copies emitted only (not vLLM's fillers, nor the slots a
    policy's Allocation.verified adds past its chain)."""
    return not (steps_as_defined(engine, NATIVE_STEP) or engine.padded or engine.stream
                or engine.sched.may_cut_drafts or engine.filler_k or engine.policy.verifies_past)


def array_form_of(engine: EngineSteps) -> Optional[Callable]:
    """The policy's fast form on the native step's arrays (a form's `arrays`), or None: the step builds a StepBatch.
    Only where the simulator runs the policy's fast form (Policy.sim_callable) and the engine keeps the hooks it
    bypasses (a subclass overriding _allocate sees every batch)."""
    return None if steps_as_defined(engine, ARRAY_FORM) else getattr(engine.policy.sim_callable, "arrays", None)


def plan_form_of(engine: EngineSteps) -> Optional[Callable]:
    """The fast form's host phase (a form over any drafters has `plan`), or None: Policy.plan."""
    pol = engine.policy
    run = pol.sim_callable
    return None if run is pol or steps_as_defined(engine, ARRAY_FORM) else getattr(run, "plan", None)


@dataclass(frozen=True)
class StepForms:
    """What a run's steps may take, chosen once when the engine starts (Engine.run)."""

    fast_forward: bool
    stretch: bool


def choose(engine: EngineSteps) -> StepForms:
    """The whole-step forms of a run (the per-step ones, native step and array form, are chosen on the first step:
    Engine.native_step, Engine.array_form, through native_step_ok and array_form_of)."""
    ff = fast_forward_ok(engine)
    return StepForms(fast_forward=ff, stretch=not ff and stretch_ok(engine))
