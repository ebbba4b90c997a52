"""Every policy spec the repository spells (docs, README, tests, reports, presets) parses to the same Policy as at
daf1578, before the families' settings were declared (sim/core/settings.py): tests/fixtures/policy_specs/before.json,
written by tests/fixtures/policy_specs/collect.py run on that commit. A spec refused then is refused now, but for
the ones the declared grammar accepts in any order (RELAXED)."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from sim.core.policies.catalog import families, get_policy
from sim.core.policies.registry import describe_settings, spec_fields
from sim.infra.errors import ConfigError

GOLDEN = json.loads((Path(__file__).parent / "fixtures" / "policy_specs" / "before.json").read_text())
# refused at daf1578 only because the hand parser wanted `skip` last; the declaration reads options in any order
RELAXED = {"hybrid-vllm:skip:slots=16": "hybrid-vllm:slots=16:skip"}


def describe(p) -> dict:
    v = p.vllm
    return {"name": p.name, "drafters": list(p.drafters), "recal": p.recal, "recal_shared": p.recal_shared,
            "step_table": p.step_table, "adaptive_verification": p.adaptive_verification, "tree": p.tree,
            "phased": p.phased, "needs_truth": p.needs_truth,
            "vllm": None if v is None else {
                "method": v.method, "k": v.k, "adaptive": v.adaptive, "only_vllm": v.only_vllm, "plugin": v.plugin,
                "plugin_config": [list(e) for e in v.plugin_config], "estimator": v.estimator,
                "per_batch": [list(e) for e in v.per_batch], "release": v.release}}


def test_the_golden_holds_both_kinds():
    assert len(GOLDEN) > 150 and sum("error" in v for v in GOLDEN.values()) > 50
    assert sum("name" in v for v in GOLDEN.values()) > 80


@pytest.mark.parametrize("spec", sorted(GOLDEN))
def test_every_spec_parses_as_before(spec):
    want = GOLDEN[spec]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        if spec in RELAXED:
            assert describe(get_policy(spec)) == describe(get_policy(RELAXED[spec]))
        elif "error" in want:
            with pytest.raises(ConfigError) as e:
                get_policy(spec)
            assert "\n" not in str(e.value)
        else:
            assert describe(get_policy(spec)) == want


# the families whose spec grammar was hand-parsed until their settings were declared, with their usage then
DECLARED_LATE = {"adaptive": "adaptive[:early-stop|:online][:table=T][:dyn=S-E@K,...]",
                 "hybrid-tree": "hybrid-tree[:METHOD][:discount=D]", "suffix": "suffix[:K]", "arctic": "arctic[:K]",
                 "ngram-mtp": "ngram-mtp[:b1]"}
SUFFIX_RUN = ("dspark", "ngram", "suffix")


@pytest.mark.parametrize("family", sorted(DECLARED_LATE))
def test_usage_and_help_come_from_the_declaration(family):
    fam = families()[family]
    assert fam.usage == DECLARED_LATE[family] and fam.settings
    lines = describe_settings(fam)  # --help: one line per declared setting, with its rule and default
    assert len(lines) == sum(len(spec_fields(cls, only)) for cls, only in fam.settings)
    assert all("default" in line for line in lines)


@pytest.mark.parametrize("spec,says", [
    ("adaptive:nope", "variant must be one of early-stop, online, got 'nope'"),
    ("adaptive:early-stop@4", "variant must be one of early-stop, online, got 'early-stop@4'"),
    ("adaptive:early-stop:online", "'adaptive': variant is given twice"),
    ("adaptive:x=1", "'adaptive' has no setting 'x'; it takes adaptive[:early-stop|:online]"),
    ("adaptive:table=step:dyn=1-4@3", "give one"),
    ("adaptive:table=now", "table must be one of startup, step, got 'now'"),
    ("hybrid-tree:discount=2", "discount must be a finite number in 0..1, got 2"),
    ("hybrid-tree:discount=-0.1", "discount must be a finite number in 0..1, got -0.1"),
    ("hybrid-tree:discount=x", "discount must be a finite number in 0..1, got 'x'"),
    ("hybrid-tree:sweep:x", "method must be one of model-opt, fixed-point, sweep, got 'x'"),
    ("hybrid-tree:sweep:model-opt", "'hybrid-tree': method is given twice"),
    ("hybrid-tree:depth=3", "'hybrid-tree' has no setting 'depth'; it takes hybrid-tree[:METHOD][:discount=D]"),
    ("suffix:-1", "K must be an integer >= 0, got -1"), ("suffix:1.5", "K must be an integer >= 0, got '1.5'"),
    ("suffix:3:4", "'suffix': K is given twice"), ("suffix:k=3", "'suffix' has no setting 'k'; it takes suffix[:K]"),
    ("arctic:0", "K must be an integer >= 1, got 0"), ("arctic:x", "K must be an integer >= 1, got 'x'"),
    ("ngram-mtp:b2", "'ngram-mtp' has no setting 'b2'; it takes ngram-mtp[:b1]"),
    ("ngram-mtp:b1=true", "'ngram-mtp': b1 is a flag, written bare (':b1')"),
])
def test_a_bad_setting_of_a_declared_family_is_named_with_its_rule(spec, says):
    with pytest.raises(ConfigError) as e:
        get_policy(spec, SUFFIX_RUN if spec.startswith(("suffix", "arctic")) else ("dspark", "ngram"))
    assert says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("spec,name", [
    ("hybrid-tree:discount=0.8:sweep", "hybrid-tree:sweep:discount=0.8"),  # any order, as every declared family
    ("hybrid-tree:discount=0.5", "hybrid-tree"), ("suffix:0", "suffix:0"), ("arctic", "arctic"),
    ("adaptive:table=startup:dyn=1-4@3", "adaptive:dyn=1-4@3"),
])
def test_declared_families_name_their_policies_canonically(spec, name):
    assert get_policy(spec, SUFFIX_RUN).name == name
