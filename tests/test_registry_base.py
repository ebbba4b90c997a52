"""One registry idiom (sim/infra/registry.py) for policy families, drafters, cost kinds and fast forms."""
from __future__ import annotations

import pytest

from sim.infra.errors import ConfigError
from sim.infra.registry import Registry


def test_register_add_lookup_and_refusals():
    reg: Registry = Registry("widget", unique=lambda e: e[0])

    @reg.register("alpha", wrap=lambda fn: (1, fn))
    def alpha():
        return "a"

    assert alpha() == "a" and reg["alpha"] == (1, alpha)  # the decorator hands back the function unchanged
    reg.add("beta", (2, None))
    assert list(reg) == ["alpha", "beta"] and reg.lookup("beta") == (2, None)
    with pytest.raises(RuntimeError, match="widget 'alpha' registered twice"):
        reg.add("alpha", (3, None))
    with pytest.raises(RuntimeError, match="widget 'gamma' registered twice"):  # its unique key (1) is alpha's
        reg.add("gamma", (1, None))
    with pytest.raises(ConfigError) as e:
        reg.lookup("alpah", "--widget")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("--widget: unknown widget 'alpah'") and "did you mean 'alpha'" in msg
    assert msg.endswith("choose one of: alpha, beta")
    reg.replace("beta", (4, None))
    assert reg["beta"] == (4, None)
    with pytest.raises(RuntimeError):
        reg.replace("delta", (5, None))


def test_every_family_uses_it():
    from sim.core import cost
    from sim.core.drafters.registry import drafters
    from sim.core.policies.registry import families
    from sim.engine.forms import policy_forms

    import sim.engine.policies  # noqa: F401  (registers the fast forms)

    for reg in (cost._KINDS, drafters(), families(), policy_forms()):
        assert isinstance(reg, Registry) and len(reg) >= 2
