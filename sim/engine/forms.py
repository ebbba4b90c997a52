"""The one registry of the simulator's fast forms: every faster transcription of a definition is declared here,
with the definition it stands in for, and nowhere else.

Two kinds of definition have fast forms:
  * engine steps: the Engine methods (sim/engine/engine.py and its mixins) are the definition; a method is marked,
    where it is defined, with the fast engine forms that transcribe it (`@transcribed_by(NATIVE_STEP, ...)`).
    A fast engine form runs only while the engine's class keeps every method marked with it: a subclass
    that overrides one (the real torch engine: _propose, _verify, _emit, _charge; a test injecting a fault)
    steps as defined (`steps_as_defined`). The marks replace the hand-kept name lists the fast paths had.
  * policies: the torch functions (sim/core/policies/hybrid.py, adaptive.py, simple.py, tree.py) are the
    definition; a form in sim/engine/policy_fast.py is declared with `@policy_form(family, definition, specs)`
    on its builder, naming the definition it transcribes and the specs it covers, so that
    get_policy finds it (`policy_forms`) and tests/test_fast_forms.py enrols it, with no list to keep. A form
    of a family's definition over any drafters (sim/core/policies/hybrid.py's functions given the run's drafters;
    multi.py registers the families over them) is declared with `drafters=`, the drafter sets the harness checks
    it over, and registered beside the two-drafter form of the same family, naming the same definition.

HYBRIDSPEC_REFERENCE_ENGINE=1 makes every engine step run as defined; HYBRIDSPEC_REFERENCE_POLICIES=1 every
policy (sim.engine.policy_fast.sim_form). This module imports only the registry idiom (sim/infra/registry.py) of the
project: the engine, its fast paths and the policy forms all import it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Dict, Optional

from sim.infra.registry import Registry

# The fast engine forms (marks on Engine methods).
NATIVE_STEP = "native-step"    # sim.engine.native_step.NativeStep: the step's bookkeeping in C, before and after the policy
ARRAY_FORM = "array-form"      # a policy's fast form on the native step's gathered arrays (no StepBatch)
FAST_FORWARD = "fast-forward"  # sim.engine.fast_forward: a stretch of pure decode steps of `none` at once
STRETCH = "stretch"            # sim.engine.stretch: the native step's steady steps in one loop
ENGINE_FORMS = (NATIVE_STEP, ARRAY_FORM, FAST_FORWARD, STRETCH)
# what a stretch (either kind) computes in place of a whole step: every step hook
WHOLE_STEP = (FAST_FORWARD, STRETCH)

_MARK = "__fast_forms__"


def transcribed_by(*forms: str):
    """Decorator on an Engine method (its definition): the fast engine forms in `forms` transcribe it, so a
    subclass overriding it runs without them."""
    unknown = set(forms) - set(ENGINE_FORMS)
    if unknown:
        raise ValueError(f"unknown fast engine form(s): {sorted(unknown)}")

    def mark(fn):
        setattr(fn, _MARK, frozenset(getattr(fn, _MARK, ())) | frozenset(forms))
        return fn

    return mark


def transcribed_methods(cls: type, form: str) -> Dict[str, Callable]:
    """name -> definition of every method of `cls`'s bases marked as transcribed by `form` (the definition
    nearest the root of the MRO that carries the mark)."""
    out: Dict[str, Callable] = {}
    for c in reversed(cls.__mro__):
        for name, v in vars(c).items():
            fn = getattr(v, "__func__", v)
            if form in getattr(fn, _MARK, ()) and name not in out:
                out[name] = v
    return out


def steps_as_defined(engine, form: str) -> bool:
    """Whether `engine` must run its definitions instead of the fast engine form `form`:
    HYBRIDSPEC_REFERENCE_ENGINE is set, or the engine's class overrides a method marked with `form`."""
    if os.environ.get("HYBRIDSPEC_REFERENCE_ENGINE", "").strip() not in ("", "0"):
        return True
    cls = type(engine)
    return any(vars_lookup(cls, name) is not v for name, v in transcribed_methods(cls, form).items())


def vars_lookup(cls: type, name: str):
    """The class attribute `name` as the MRO resolves it (unbound: the function, not a bound method)."""
    for c in cls.__mro__:
        if name in vars(c):
            return vars(c)[name]
    raise AttributeError(name)


@dataclass(frozen=True)
class PolicyForm:
    """A policy family's fast form. build(params) -> the form's fn(batch) (with fn.arrays, its core on
    sim.engine.policy_fast.Arrays) or None where these parameters have no form (or the native library cannot be
    built); definition: the torch function it transcribes; specs: the specs it covers, each one the
    equivalence harness checks (tests/test_fast_forms.py) on random, tied, out-of-range and recorded batches.
    drafters: empty for a form of the two-drafter definition; else the form transcribes the family's definition
    over any drafters (build(params, drafters) -> fn or None; fn.plan and fn.allocate: its two phases) and
    these are the drafter sets the harness checks it over."""

    family: str
    build: Callable
    definition: Callable
    specs: tuple
    drafters: tuple = ()


_POLICY_FORMS: Registry[PolicyForm] = Registry("fast form of the policy family")


def policy_form(family: str, definition: Callable, specs: tuple, drafters: tuple = ()):
    """Decorator on a fast form's builder, `build(params) -> fn or None` (with `drafters`: `build(params,
    drafters)`): register it as the fast form of the policy family `family` (over any drafters when `drafters`
    names the sets it is checked over), a transcription of `definition`, covering `specs` (the first is the
    family's default spec)."""
    if not specs or any(s.split(":")[0] != family for s in specs):
        raise ValueError(f"fast form of '{family}': specs must name the family, got {specs}")
    key = _key(family, bool(drafters))

    return _POLICY_FORMS.register(key, lambda build: PolicyForm(family, build, definition, tuple(specs),
                                                                 tuple(drafters)))


def _key(family: str, over_drafters: bool) -> str:
    return family + "@drafters" if over_drafters else family


def policy_forms() -> Dict[str, PolicyForm]:
    """The registered policy forms, key -> PolicyForm: the family's name for a two-drafter form, NAME@drafters for
    a form over any drafters (sim.engine.policy_fast and fast_multi register them on import)."""
    return _POLICY_FORMS


def policy_form_of(family: str, over_drafters: bool = False) -> Optional[PolicyForm]:
    return _POLICY_FORMS.get(_key(family, over_drafters))
