"""The policies as the simulator runs them: the core's definition with its fast form attached where one transcribes
it. This is the one place that chooses a policy's form; the engine's own step forms are chosen in forms.py.

`sim_policy(spec, drafters)` = `sim.core.policies.get_policy(spec, drafters)` plus `Policy.sim_fn`: the C/numpy
transcription registered for the spec (policy_fast.py for the default two drafters, policy_fast_multi.py over any
set), checked against the definition by tests/test_fast_forms.py. A policy with online recalibration (`recal=k`,
`runcal=k`) or the step-priced table (`table=step`) has no form and runs as defined; `table=startup` names the
default, so it keeps the form of the spec without it. Real engines use the core's get_policy and always run the
definition.
"""
from __future__ import annotations

import dataclasses

from sim.core.drafters.registry import DEFAULT_DRAFTERS, parse_drafters
from sim.core.policies.catalog import get_policy, over_drafters, split_spec
from sim.core.policies.registry import Policy
from sim.engine import policy_fast_multi  # noqa: F401  (imported to register the forms over any drafters)
from sim.engine.policy_fast import sim_form, sim_form_over


def with_sim_form(pol: Policy, spec: str, drafters: tuple = DEFAULT_DRAFTERS) -> Policy:
    """`pol` (get_policy(spec, drafters)) with its simulator fast form, if one transcribes it."""
    drafters = parse_drafters(drafters)
    name, params = split_spec(spec)  # a deprecated spelling takes its family's forms
    general = over_drafters(name, drafters)
    plain = ":".join([name, *(p for p in params if p != "table=startup")])
    fast = None if pol.recal is not None or pol.step_table else \
        sim_form_over(plain, drafters) if general else sim_form(plain)
    return pol if fast is None else dataclasses.replace(pol, sim_fn=fast, sim_for=pol.fn)


def sim_policy(spec: str, drafters=DEFAULT_DRAFTERS) -> Policy:
    """The policy named by `spec` for a simulated run that enables `drafters`: the definition (ConfigError on a bad
    spec, as get_policy) with its fast form attached where one is registered."""
    return with_sim_form(get_policy(spec, drafters), spec, drafters)
