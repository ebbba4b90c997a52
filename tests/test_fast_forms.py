"""The equivalence harness of the simulator's fast forms: every form registered in sim.engine.forms is enrolled
here, with no list to keep, and checked against the definition it transcribes.

Policy forms (Policy.sim_fn: sim/engine/policy_fast.py, sim/engine/native/): every spec each registered form
covers gives the torch definition's allocation (Policy.fn), exactly, on random batches (sizes across the
exact and the two-stage sweep, step and smooth cost tables, logits caps, prefill tokens), on tie-heavy
batches, on confidences out of [0, 1] (with NaN: the form declines and the definition runs) and on every
batch of engine runs over slices of the bundled traces (-m slow). A spec whose form is not built (no C
compiler) is skipped, never compared with its own definition. A form over any drafters (`drafters=`,
sim/engine/policy_fast_multi.py) is checked on each drafter set it names, phase by phase (plan, allocate) and whole,
on random, tied, out-of-range and recorded three-drafter batches, and in a three-drafter engine run.

Engine forms (the native step, the policy's array form, fast-forward, steady stretches): a run that uses the
form gives the same step columns, emitted tokens and host-side state as the same run of an engine whose class
overrides one of the methods marked with the form (a pass-through: the engine then steps as defined)."""
import dataclasses
import shutil
import zlib

import numpy as np
import pytest
import torch

from sim.engine.engine import Engine, EngineConfig
from sim.engine.choice import fast_forward_ok, stretch_ok
from sim.engine.forms import ARRAY_FORM, ENGINE_FORMS, FAST_FORWARD, NATIVE_STEP, STRETCH, policy_forms, \
    steps_as_defined, transcribed_methods
from sim.core.policies import get_policy as get_definition, list_policies
from sim.engine.policies import sim_policy
from sim.core.policies.base import CHAIN_NGRAM, host_view
from sim.engine.policy_fast import Arrays
from sim.core.policies.testing import random_batch, random_cost_table
from sim.api.run import SimSetup, prepare, run_one

FORMS = policy_forms()
FAST = [spec for form in FORMS.values() if not form.drafters for spec in form.specs]
# forms over any drafters (sim/engine/policy_fast_multi.py): every spec on the first drafter set the form names, the
# default spec on every other set
OVER = [(spec, names) for form in FORMS.values() if form.drafters
        for spec, names in [(s, form.drafters[0]) for s in form.specs]
        + [(form.specs[0], d) for d in form.drafters[1:]]]
NO_CC = shutil.which("cc") is None


def _policy(spec):
    pol = sim_policy(spec)
    if pol.sim_fn is None:
        if NO_CC:
            pytest.skip("no C compiler: the simulator runs the definitions")
        pytest.fail(f"{spec}: registered as a fast form, but none was built")
    return pol


def _same(spec, pol, b, where):
    want = pol.fn(b)
    got = pol.sim_fn(b)
    _same_fields(want, got, f"{spec}", where)


def _same_fields(want, got, what: str, where: str) -> None:
    """Every Allocation field equal (Allocation.ran, a dict of 0-d bools: the same drafters, the same reports)."""
    for f in dataclasses.fields(want):
        w, g = getattr(want, f.name), getattr(got, f.name)
        if isinstance(w, dict) and isinstance(g, dict):
            same = w.keys() == g.keys() and all(torch.equal(w[k], g[k]) for k in w)
        else:
            same = (w is None and g is None) or torch.equal(w, g)
        assert same, f"{what}: {f.name} differs on {where}: {w} vs {g}"


def test_the_registry_names_families_and_their_definitions():
    families = {u.split(":")[0].split("[")[0] for u in list_policies()}
    assert FORMS and {f.family for f in FORMS.values()} <= families
    for family, form in FORMS.items():
        pol = sim_policy(form.specs[0], *form.drafters[:1])
        # the registered definition is what the family's fn runs (a form of something else would not be checked)
        assert form.definition.__module__ == pol.fn.__module__ or form.definition is pol.fn, family


@pytest.mark.skipif(NO_CC, reason="no C compiler: the simulator runs the definitions")
def test_registered_forms_are_built_here():
    for spec in FAST:
        assert sim_policy(spec).sim_fn is not None, spec
    for spec, names in OVER:
        assert sim_policy(spec, names).sim_fn is not None, (spec, names)
    assert sim_policy("hybrid-price:current").sim_fn is None and sim_policy("hybrid:fixed-point").sim_fn is None


def _random_batches(n: int, seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        R = int(rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 16, 17, 32, 64, 128, 200]))
        km, kn = int(rng.choice([1, 3, 7])), int(rng.choice([1, 4, 8, 32]))
        b = random_batch(rng, R, km, kn, max_tokens=int(R * (1 + kn) * rng.uniform(0.5, 1.5)) + 2)
        if rng.random() < 0.3:
            b = dataclasses.replace(b, max_draft_tokens=int(rng.integers(0, 3 * R + 2)))
        if rng.random() < 0.3:
            b = dataclasses.replace(b, num_sampling_reqs=R + int(rng.integers(0, 4)),
                                    num_nondraft_tokens=R + int(rng.integers(0, 40)))
        if rng.random() < 0.2:  # stale model confidences exactly 1 (a fresh request), ties everywhere
            b.stale_chains["dspark"][0][: R // 2] = 1.0
            b.chains["dspark"][0][:, : km // 2] = 1.0
        if rng.random() < 0.1:
            b.chains["ngram"][1][:] = 0
        if rng.random() < 0.2:  # requests without a model chain (hybrid then takes the n-gram chain)
            b.chains["dspark"][1][: R // 2] = 0
        # hybrid's inputs: the model pass's share of the drafter cost, the mean n-gram chain
        b = dataclasses.replace(b, draft_ms_of={**b.draft_ms_of, "dspark": float(rng.uniform(0, b.draft_cost_ms))})
        if rng.random() < 0.7:
            b = dataclasses.replace(b, means={**b.means, "ngram": torch.tensor(rng.random((R, kn)))})
        if rng.random() < 0.5:  # the oracle's inputs: the n-gram pass's share, the engine's charged table
            b = dataclasses.replace(b, draft_ms_of={**b.draft_ms_of,
                                                    "ngram": float(rng.uniform(0, b.draft_cost_ms - b.price("dspark")))},
                                    true_verify_cost_ms=random_cost_table(rng, b.verify_cost_ms.shape[0] - 1))
        yield b


@pytest.mark.parametrize("spec", ["adaptive:early-stop", "hybrid:fixed-point", "hybrid-price:model-opt",
                                  "hybrid-price:fixed-point", "hybrid-price:current", "hybrid-vllm", "vllm-ngram:7"])
def test_specs_without_a_form_run_their_definition(spec):
    """Specs no registered form covers (nothing to compare): the simulator runs their definition."""
    pol = sim_policy(spec)
    assert pol.sim_fn is None and pol.sim_callable is pol, spec


@pytest.mark.parametrize("spec", ["hybrid:fixed-point", "hybrid:recal=4", "hybrid:runcal=4", "hybrid:table=step",
                                  "hybrid-price:current", "hybrid-price:model-opt", "hybrid-tree", "oracle",
                                  "hybrid-vllm"])
def test_policies_over_three_drafters_run_their_definition(spec):
    """Specs over three drafters that no form over any drafters covers (sim/engine/policy_fast_multi.py transcribes
    hybrid and hybrid-price with the sweep, on the start-up table, without recalibration) run their definition."""
    pol = sim_policy(spec, ("dspark", "ngram", "suffix"))
    assert pol.sim_fn is None and pol.sim_callable is pol and "suffix" in pol.drafters, spec


@pytest.mark.parametrize("spec", FAST)
def test_random_batches(spec):
    pol = _policy(spec)
    n = 600 if spec in ("adaptive", "hybrid", "hybrid-price", "hybrid-tree", "oracle", "ngram-threshold") else 200
    for i, b in enumerate(_random_batches(n, seed=zlib.crc32(spec.encode()))):
        _same(spec, pol, b, f"random batch {i} (R={b.num_reqs})")


class _Recorder(Engine):
    batches: list

    def _allocate(self, batch, plan):
        type(self).batches.append(batch)
        return super()._allocate(batch, plan)


@pytest.mark.slow  # 15 s per trace; the default run compares the forms on random batches
@pytest.mark.parametrize("trace", ["traces/codeedit.jsonl", "traces/chat.jsonl"])
def test_recorded_engine_batches(trace, monkeypatch):
    import sim.api.run

    prep = prepare(SimSetup(trace=trace, sample=24, seed=2))
    monkeypatch.setattr(sim.api.run, "Engine", _Recorder)
    for spec in FAST:
        pol = _policy(spec)
        for bs in (4, 32):
            _Recorder.batches = []
            run_one(prep, spec, bs)
            assert len(_Recorder.batches) > 20
            for i, b in enumerate(_Recorder.batches):
                _same(spec, pol, b, f"{trace} bs={bs} step {i}")


@pytest.mark.parametrize("spec", FAST)
def test_tied_confidences(spec):
    """Confidences from a few values only: survivals tie across requests and chains, so the budget cuts
    through equal values (the top-B's selection must give ties to the lower flat index, as the merge does)."""
    pol = _policy(spec)
    rng = np.random.default_rng(zlib.crc32(spec.encode()) + 1)
    for i in range(200):
        R = int(rng.choice([2, 4, 5, 9, 33, 128]))
        km, kn = int(rng.choice([3, 7])), int(rng.choice([4, 32]))
        b = random_batch(rng, R, km, kn, max_tokens=int(R * (1 + kn)) + 2)
        levels = torch.tensor([0.5, 0.75, 1.0])
        for t in _confs(b):
            t.copy_(levels[torch.from_numpy(rng.integers(0, 3, tuple(t.shape)))])
        if rng.random() < 0.5:
            b = dataclasses.replace(b, max_draft_tokens=int(rng.integers(0, 2 * R + 2)))
        _same(spec, pol, b, f"tied batch {i} (R={R})")


def _confs(b) -> list:
    """The default drafters' current and stale confidences of a batch (the tensors themselves, to change in place)."""
    return [b.chains["dspark"][0], b.chains["ngram"][0], b.stale_chains["dspark"][0], b.stale_chains["ngram"][0]]


@pytest.mark.parametrize("spec", [s for s in FAST if s.split(":")[0] in ("hybrid", "hybrid-price")])
def test_an_empty_model_chain_takes_the_other_chain(spec):
    """One definition of the chain choice (hybrid.allocate_chosen) for every hybrid: a request whose model chain is
    empty takes the n-gram chain even where that chain's first survival is 0 (no lambda-prefix, no better first
    slot), and the two-drafter C form does the same."""
    pol = _policy(spec)
    rng = np.random.default_rng(7)
    taken = 0
    for i in range(60):
        R = int(rng.choice([2, 5, 9]))
        b = random_batch(rng, R, 7, 8, max_tokens=R * 9 + 2)
        b.chains["dspark"][1][0] = 0
        b.chains["ngram"][1][0] = 4
        b.chains["ngram"][0][0, 0] = 0.0
        b = dataclasses.replace(b, max_draft_tokens=None)
        _same(spec, pol, b, f"batch {i} (R={R})")
        out = pol.fn(b)
        assert int(out.admitted[0]) == 0 or int(out.chain[0]) == CHAIN_NGRAM, (spec, i)
        taken += int(out.admitted[0]) > 0
    assert taken > 0, spec  # some budgets reach the zero-survival slots: the rule is exercised


@pytest.mark.parametrize("spec", FAST)
def test_out_of_range_confidences(spec):
    """Confidences outside [0, 1] (clamped by the survival) and signed zeros in some requests' chains: the
    native forms give the definition's answer. With NaN among them, the forms decline the batch (their
    transcription does not follow the definitions' NaN semantics) and the definition runs."""
    pol = _policy(spec)
    reads_conf = pol.sim_fn.arrays.reads_conf
    rng = np.random.default_rng(zlib.crc32(spec.encode()) + 2)
    odd = torch.tensor([float("nan"), -0.25, 1.5, -0.0, 0.0, 1.0, float("inf")])
    for i in range(200):
        R = int(rng.choice([1, 3, 4, 9, 17, 64, 128]))
        km, kn = int(rng.choice([3, 7])), int(rng.choice([4, 9, 32]))
        b = random_batch(rng, R, km, kn, max_tokens=int(R * (1 + kn)) + 2)
        for t in _confs(b):
            hit = torch.from_numpy(rng.random(tuple(t.shape)) < rng.choice([0.02, 0.2]))
            if rng.random() < 0.5:  # no NaN: only the clamp and signed zeros
                t[hit] = odd[torch.from_numpy(rng.integers(1, len(odd), tuple(t.shape)))][hit].to(t.dtype)
            else:
                t[hit] = odd[torch.from_numpy(rng.integers(0, len(odd), tuple(t.shape)))][hit].to(t.dtype)
        _same(spec, pol, b, f"odd batch {i} (R={R})")
        if reads_conf:  # a form that reads the confidences declines NaN (the definition runs) and takes the rest
            nan = any(bool(torch.isnan(t).any()) for t in _confs(b))
            declined = pol.sim_fn.arrays(Arrays.of(b)) is None
            assert declined == nan, f"{spec}: odd batch {i}"


@pytest.mark.slow  # about a minute: a second build of the native forms and the random-batch checks on it
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler: the simulator runs the definitions")
def test_default_clone(tmp_path):
    """The lane functions' default clone (what a CPU without AVX2 runs; -DHP_NO_CLONES builds it alone) gives
    the definitions' allocations too: the random, tied and out-of-range batches of this file, rerun on it."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, HYBRIDSPEC_NATIVE_CFLAGS="-DHP_NO_CLONES")
    keys = "random_batches or tied or out_of_range or built_here"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__, "-k", keys],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


# ------------------------------------------------------------------------- forms over any number of drafters
def _over_batch(rng, names, kind: str):
    """A random step over `names` (any of dspark, ngram, suffix): the two-drafter fields of _random_batches'
    kind and a suffix chain (float32 or float64 confidences, as the live drafter hands over, its own stale chain
    and mean, its price); kind 'tied' draws every confidence from three levels, 'odd' puts values out of [0, 1],
    signed zeros and NaN in some; drafters the run does not enable have no chain (length 0)."""
    R = int(rng.choice([1, 2, 3, 4, 5, 8, 16, 17, 32, 64, 128, 200]))
    km, kn, ks = int(rng.choice([1, 3, 7])), int(rng.choice([1, 4, 8, 32])), int(rng.choice([1, 5, 16, 24]))
    b = random_batch(rng, R, km, kn, max_tokens=int(R * (1 + kn + ks) * rng.uniform(0.3, 1.2)) + 2)
    dt = torch.float64 if rng.random() < 0.5 else torch.float32
    conf = lambda hi: torch.tensor(rng.beta(hi, 1.0, size=(R, ks)), dtype=dt)  # noqa: E731
    n = lambda: torch.tensor(rng.integers(0, ks + 1, size=R))  # noqa: E731
    d = float(b.draft_cost_ms)
    b = dataclasses.replace(b, chains={**b.chains, "suffix": (conf(8.0), n())},
                            stale_chains={**b.stale_chains, "suffix": (conf(5.0), n())},
                            means={**b.means, **({"suffix": conf(6.0)} if rng.random() < 0.8 else {})},
                            draft_ms_of={**b.draft_ms_of, "dspark": d * rng.uniform(0, 0.8),
                                         "ngram": d * rng.uniform(0, 0.1), "suffix": float(rng.uniform(0, 0.5))},
                            draft_cost_ms=d + float(rng.uniform(0, 0.6)))
    if rng.random() < 0.7:
        b = dataclasses.replace(b, means={**b.means, "ngram": torch.tensor(rng.random((R, kn)), dtype=dt)})
    if rng.random() < 0.3:
        b = dataclasses.replace(b, max_draft_tokens=int(rng.integers(0, 3 * R + 2)))
    if rng.random() < 0.3:
        b = dataclasses.replace(b, num_sampling_reqs=R + int(rng.integers(0, 4)),
                                num_nondraft_tokens=R + int(rng.integers(0, 40)))
    if rng.random() < 0.2:
        b.chains["dspark"][1][: R // 2] = 0
    if rng.random() < 0.1:
        b.chains["ngram"][1][:] = 0
    confs = _confs(b) + [b.chains["suffix"][0], b.stale_chains["suffix"][0]]
    if kind == "tied":
        levels = torch.tensor([0.5, 0.75, 1.0])
        for t in confs:
            t.copy_(levels[torch.from_numpy(rng.integers(0, 3, tuple(t.shape)))])
    elif kind == "odd":
        odd = torch.tensor([float("nan"), -0.25, 1.5, -0.0, 0.0, 1.0, float("inf")])
        lo = 0 if rng.random() < 0.5 else 1  # half the batches without NaN: only the clamp and signed zeros
        for t in confs:
            hit = torch.from_numpy(rng.random(tuple(t.shape)) < rng.choice([0.02, 0.2]))
            t[hit] = odd[torch.from_numpy(rng.integers(lo, len(odd), tuple(t.shape)))][hit].to(t.dtype)
    # a drafter the run does not enable has no chain
    for name, (c, length) in list(b.chains.items()):
        if name not in names:
            length.zero_()
    return b


def _declined(chains: dict, names) -> bool:
    """Where the transcription declines: NaN confidences, or a first chain not float32 (the definition then
    computes in its dtype)."""
    return chains[names[0]][0].dtype != torch.float32 or any(bool(torch.isnan(chains[n][0]).any()) for n in names)


def _same_over(spec, names, pol, b, where, kind):
    """The form's three faces against the definition's: plan (drafters, budget), allocate under the definition's
    plan and the whole policy on one view (every Allocation field)."""
    form = pol.sim_fn
    view = host_view(b)
    want_p, got_p = pol.plan_fn(view), form.plan(view)
    assert (want_p.drafters, int(want_p.budget)) == (got_p.drafters, int(got_p.budget)), \
        f"{spec} {names}: plan differs on {where}"
    for want, got in ((pol.alloc_fn(b, want_p), form.allocate(b, want_p)), (pol.fn(b), form(b))):
        _same_fields(want, got, f"{spec} {names}", where)
    # the transcription declines NaN confidences and float64 first chains (the definition runs), takes the rest
    ran = [n for n in names if n in want_p.drafters]
    assert (form.numpy_plan(view) is None) == _declined(b.stale_chains, names), f"{spec} {names}: {where}"
    assert (form.numpy_allocate(b, want_p) is None) == _declined(b.chains, ran), f"{spec} {names}: {where}"


@pytest.mark.skipif(NO_CC, reason="no C compiler: the simulator runs the definitions")
@pytest.mark.parametrize("kind", ["random", "tied", "odd"])
@pytest.mark.parametrize("spec,names", OVER)
def test_forms_over_drafters(spec, names, kind):
    """Every form over any drafters equals its definition on random batches (sizes across the exact and the
    two-stage sweep, caps, prefill tokens, float64 live chains), on tie-heavy ones and on confidences out of
    [0, 1] (with NaN: declined)."""
    pol = sim_policy(spec, names)
    assert pol.sim_fn is not None and pol.sim_callable is pol.sim_fn
    rng = np.random.default_rng(zlib.crc32(f"{spec}{names}{kind}".encode()))
    n = 60 if names == names_three() and kind == "random" else 15
    for i in range(n):
        _same_over(spec, names, pol, _over_batch(rng, names, kind), f"{kind} batch {i}", kind)


@pytest.mark.skipif(NO_CC, reason="no C compiler: the simulator runs the definitions")
@pytest.mark.parametrize("kind", ["random", "tied", "odd"])
@pytest.mark.parametrize("spec", [s for form in FORMS.values() if form.drafters for s in form.specs])
def test_forms_over_drafters_on_the_default_two(spec, kind):
    """The two drafters are the case N = 2 of the one definition: the form over any drafters, run on (dspark,
    ngram), equals the definition the default run uses (which the two-drafter C form transcribes too)."""
    from sim.core.drafters.registry import DEFAULT_DRAFTERS
    from sim.engine.policy_fast import sim_form_over

    form = sim_form_over(spec, DEFAULT_DRAFTERS)
    assert form is not None, spec
    pol = dataclasses.replace(get_definition(spec), sim_fn=form)
    assert FORMS[spec.split(":")[0]].definition is policy_forms()[spec.split(":")[0] + "@drafters"].definition
    rng = np.random.default_rng(zlib.crc32(f"{spec}two{kind}".encode()))
    for i in range(15):
        _same_over(spec, DEFAULT_DRAFTERS, pol, _over_batch(rng, DEFAULT_DRAFTERS, kind), f"{kind} batch {i}", kind)


def names_three() -> tuple:
    return ("dspark", "ngram", "suffix")


class _PlanRecorder(Engine):
    batches: list

    def _allocate(self, batch, plan):
        type(self).batches.append(batch)
        return super()._allocate(batch, plan)


@pytest.mark.slow  # about 80 s: engine runs of the live suffix drafter
@pytest.mark.skipif(NO_CC, reason="no C compiler: the simulator runs the definitions")
@pytest.mark.parametrize("trace", ["traces/codeedit.jsonl", "traces/chat.jsonl"])
def test_recorded_three_drafter_batches(trace, monkeypatch):
    """Every form over any drafters equals its definition on every batch of engine runs over three drafters."""
    import sim.api.run

    names = names_three()
    prep = prepare(SimSetup(trace=trace, sample=16, seed=2, drafters=",".join(names)))
    monkeypatch.setattr(sim.api.run, "Engine", _PlanRecorder)
    for spec in sorted({s for s, d in OVER if d == names}):
        pol = sim_policy(spec, names)
        for bs in (4, 32):
            _PlanRecorder.batches = []
            run_one(prep, spec, bs)
            assert len(_PlanRecorder.batches) > 20
            for i, b in enumerate(_PlanRecorder.batches):
                _same_over(spec, names, pol, b, f"{trace} bs={bs} step {i}", "recorded")


@pytest.mark.skipif(NO_CC, reason="no C compiler: the simulator runs the definitions")
@pytest.mark.parametrize("spec", ["hybrid", "hybrid-price"])
def test_a_three_drafter_run_takes_the_form_and_steps_as_defined(spec, monkeypatch):
    """A run over three drafters plans and allocates through the form's transcription on every step (none
    declined: the live suffix drafter's float64 chains included) and makes the same steps as the same run on the
    definitions (the policy without its sim_fn)."""
    import sim.api.run
    from sim.engine import policy_fast_multi as fast_multi

    prep = prepare(SimSetup(trace="traces/codeedit.jsonl", sample=8, seed=1, drafters="dspark,ngram,suffix"))
    calls = {"run": 0, "declined": 0}

    def counted(f):
        def inner(*args):
            out = f(*args)
            calls["run"] += 1
            calls["declined"] += out is None
            return out
        return inner

    phases = ("plan_skip", "allocate_skip") if spec == "hybrid" else ("plan_price", "allocate_price")
    for name in phases:
        monkeypatch.setattr(fast_multi, name, counted(getattr(fast_multi, name)))
    _, fast = run_one(prep, spec, 4)
    assert calls["run"] > 40 and calls["declined"] == 0, calls
    defined = get_definition  # the core's get_policy: the definitions, no fast form
    monkeypatch.setattr(sim.api.run, "sim_policy", defined)
    _, slow = run_one(prep, spec, 4)
    assert fast.lossless and slow.lossless
    for k, v in fast.steps.items():
        assert np.asarray(v).tobytes() == np.asarray(slow.steps[k]).tobytes(), f"step column {k} differs"


# ------------------------------------------------------------------------------------------ engine forms
STATE = ("pos", "prev_pos", "model_pos", "m_conf_sum", "m_conf_cnt", "ng_conf_sum", "ng_conf_cnt", "n_steps",
         "emitted_tokens", "n_preempt")
# a policy under which each engine form runs, and how a run shows that it did
ENGINE_CASES = {NATIVE_STEP: ("hybrid", lambda e: e._fast is not None),
                ARRAY_FORM: ("hybrid-price", lambda e: e._arrays is not None),
                FAST_FORWARD: ("none", fast_forward_ok),
                STRETCH: ("adaptive", stretch_ok)}


def test_every_engine_form_is_enrolled():
    assert set(ENGINE_CASES) == set(ENGINE_FORMS)
    for form in ENGINE_FORMS:
        assert transcribed_methods(Engine, form), f"{form}: no Engine method is marked as its definition"


def _as_defined(form: str) -> type:
    """An Engine whose class overrides (passes through) the marked method of `form` that the fewest other forms
    mark: the engine then runs that method's definition where the form would stand in for it."""
    marks = transcribed_methods(Engine, form)
    name = min(sorted(marks), key=lambda n: len(getattr(marks[n], "__fast_forms__")))
    base = marks[name]

    def passthrough(self, *args, **kwargs):
        return base(self, *args, **kwargs)

    return type(f"Defined{name}", (Engine,), {name: passthrough})


@pytest.fixture(scope="module")
def engine_prep():
    return prepare(SimSetup(trace="traces/chat.jsonl", sample=12, seed=5))


def _run_fast_and_defined(prep, spec: str, form: str) -> tuple:
    """((engine, result) with the form, (engine, result) on the definition it stands in for): `spec` at batch 4."""
    cfg = EngineConfig(batch_size=4)
    runs = []
    for cls in (Engine, _as_defined(form)):
        eng = cls(prep.tables, prep.arrivals, sim_policy(spec), prep.cost, cfg)
        runs.append((eng, eng.run()))
    return tuple(runs)


@pytest.mark.skipif(NO_CC, reason="no C compiler: the engine runs its definitions")
@pytest.mark.parametrize("form", ENGINE_FORMS)
def test_engine_form_equals_its_definition(engine_prep, form):
    spec, used = ENGINE_CASES[form]
    (fast, rf), (slow, rs) = _run_fast_and_defined(engine_prep, spec, form)
    assert not steps_as_defined(fast, form) and steps_as_defined(slow, form)
    assert used(fast), f"{form}: the run under {spec} does not use the form, so it checks nothing"
    assert rf.lossless and rs.lossless
    for k, v in rf.steps.items():
        assert np.asarray(v).tobytes() == np.asarray(rs.steps[k]).tobytes(), f"{form}: step column {k} differs"
    for k in STATE:
        assert getattr(fast, k).tobytes() == getattr(slow, k).tobytes(), f"{form}: {k} differs"
    assert fast.n_written == slow.n_written and len(rf.steps["emitted"]) > 10


@pytest.fixture(scope="module")
def codeedit_prep():
    return prepare(SimSetup(trace="traces/codeedit.jsonl", sample=16, seed=3))


@pytest.mark.skipif(NO_CC, reason="no C compiler: the engine runs its definitions")
def test_native_step_hands_the_policy_only_the_planned_chains(codeedit_prep):
    """A policy that skips a drafter and still reads its chain in allocate (hybrid-vllm:skip schedules slots from
    the model chain's length) must see what the numpy step's _propose hands it: nothing from the skipped drafter.
    The native step gathers every drafter's chain; before planned_chains it passed them through (4,543 vs 4,518
    verified n-gram slots on a code-editing run)."""
    (fast, rf), (slow, rs) = _run_fast_and_defined(codeedit_prep, "hybrid-vllm:skip", NATIVE_STEP)
    assert fast._fast is not None and steps_as_defined(slow, NATIVE_STEP)
    assert (np.asarray(rf.steps["draft_ms"]) < np.max(rf.steps["draft_ms"])).any(), "no skipped pass: checks nothing"
    for k, v in rf.steps.items():
        assert np.asarray(v).tobytes() == np.asarray(rs.steps[k]).tobytes(), f"step column {k} differs"
