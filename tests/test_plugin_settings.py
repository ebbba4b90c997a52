"""The vLLM plugin's settings are declared once, in the core (sim/core/policies/hybrid.py PluginSettings), with each
field's counterpart in the simulator; the plugin (HybridSpecConfig), --additional-config (sim.core.vllm.plugin_settings),
--policy hybrid-vllm:... and real/validate.py's hybrid:FIELD=V all read that one declaration."""
from __future__ import annotations

import dataclasses

import pytest

from real.validation.vllm.config import split_policy
from real.vllm_plugin.config import HybridSpecConfig
from sim.core import settings
from sim.core.policies import get_policy
from sim.core.plugin_settings import (PLUGIN_OPTIONS, SIM_COUNTERPARTS, PluginSettings, check_counterparts, plugin_fields,
                                      plugin_spec)
from sim.core.settings import setting
from sim.core.vllm import plugin_settings, speculative_config
from sim.infra.errors import ConfigError

FIELDS = [f.name for f in dataclasses.fields(PluginSettings)]
DSPARK = '{"method": "dspark", "enable_adaptive_verification": true}'


def _other(name: str):
    """A valid value of setting `name` other than its default."""
    typ, m = settings.setting_types(PluginSettings)[name], settings.meta(PluginSettings, name)
    default = getattr(PluginSettings(), name)
    if typ is bool:
        return not default
    if m.get("choices"):
        return next(c for c in m["choices"] if c != default)
    if typ is str:
        return default
    lo = m["lo"] if m.get("lo") is not None else 0
    if m.get("hi") is None or default + 1 <= m["hi"]:
        return typ(default + 1)
    return typ(lo) if typ(lo) != default else typ((lo + m["hi"]) / 2)  # a range narrower than 1 (tail)


def test_every_field_declares_its_counterpart():
    assert FIELDS and all(dataclasses.fields(PluginSettings)[i].metadata["sim"] in SIM_COUNTERPARTS
                          for i in range(len(FIELDS)))
    assert sorted(sum((plugin_fields(k) for k in SIM_COUNTERPARTS), ())) == sorted(FIELDS)

    @dataclasses.dataclass(frozen=True)
    class WithANewField(PluginSettings):
        turbo: bool = setting(False, "a field added without saying what the simulator does with it")

    with pytest.raises(TypeError, match="turbo: declare the simulator's counterpart"):
        check_counterparts(WithANewField)


def test_the_plugin_reads_the_declaration():
    assert issubclass(HybridSpecConfig, PluginSettings)
    assert [f.name for f in dataclasses.fields(HybridSpecConfig)] == FIELDS
    assert HybridSpecConfig() == HybridSpecConfig(**dataclasses.asdict(PluginSettings()))


@pytest.mark.parametrize("name", FIELDS)
def test_every_field_is_accepted_by_each_reader_at_its_default_and_another_value(name):
    default = getattr(PluginSettings(), name)
    body = plugin_settings('{"hybrid_spec": {"%s": %s}}' % (name, _json(default)))
    assert body == {name: default}  # --additional-config takes the plugin's own defaults, ext_max included
    over = split_policy(f"hybrid:{name}={_text(default)}")[1]
    assert over == {name: default}
    other = _other(name)
    assert split_policy(f"hybrid:{name}={_text(other)}")[1] == {name: other}
    m = speculative_config(DSPARK, (2, 5), 7, plugin_settings('{"hybrid_spec": {}}'))
    assert m.policy == "hybrid-vllm"
    sim = settings.meta(PluginSettings, name)["sim"]
    if sim == "option":  # the same field of hybrid-vllm's spec, and the spec the plugin is predicted by
        spec = plugin_spec({name: other})
        pol = get_policy(spec)
        assert dict(pol.vllm.plugin_config)[name] == (other if name != "runcal" else int(other))
        assert HybridSpecConfig(**{name: other}).sim_policy() == spec
    elif sim == "ngram" and name != "calibrator":  # must be the run's calibrator's: another value is refused
        with pytest.raises(ConfigError, match=name.split("_")[0]):
            speculative_config(DSPARK, (2, 5), 7, {name: other})
    elif sim == "engine_only":  # no effect on what the simulator predicts
        assert speculative_config(DSPARK, (2, 5), 7, {name: other}).policy == "hybrid-vllm"


@pytest.mark.parametrize("name", [n for n in FIELDS if settings.setting_types(PluginSettings)[n] in (int, float)])
def test_a_bad_value_is_one_line_naming_the_field_and_its_rule(name):
    with pytest.raises(ConfigError) as e:
        plugin_settings('{"hybrid_spec": {"%s": "x"}}' % name)
    msg = str(e.value)
    assert "\n" not in msg and f"hybrid_spec.{name} must be {settings.rule(PluginSettings, name)}" in msg
    with pytest.raises(ConfigError, match=f"policy 'hybrid:{name}=x': {name} must be"):
        split_policy(f"hybrid:{name}=x")


def test_the_spec_options_are_the_declarations():
    assert PLUGIN_OPTIONS == ("method", "margin", "slots", "skip", "runcal", "tail")
    from sim.core.policies.registry import families

    # fill=F, budget=B: the simulator's own options (FillOption), no plugin settings
    assert families()["hybrid-vllm"].usage == \
        "hybrid-vllm[:METHOD][:margin=M][:slots=W][:skip][:runcal=k][:tail=c][:fill=F][:budget=B]"


def _json(v) -> str:
    import json

    return json.dumps(v)


def _text(v) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)
