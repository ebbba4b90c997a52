"""One config (sim/core/config.py): sim.api.run's flags, sim.api.sweep's grid keys and flags and their checks come from one
dataclass per component; one baseline name."""
import dataclasses
import re
from pathlib import Path

import pytest

from sim.core import config
from sim.infra.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _options(parser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def test_every_field_has_help_and_a_flag_in_run_and_sweep():
    import argparse

    import sim.api.sweep as sw

    run_ap, sweep_ap = argparse.ArgumentParser(), argparse.ArgumentParser()
    config.add_flags(run_ap, config.COMPONENTS + (config.RunGrid,))
    config.add_flags(sweep_ap, (config.RunGrid, *config.COMPONENTS), repeatable=True, grid_only=True)
    for f in config.fields_of(*config.COMPONENTS, config.RunGrid):
        assert len(f.metadata["help"]) > 10, f.name
        assert config.flag(f.name) in _options(run_ap)
        assert (config.flag(f.name) in _options(sweep_ap)) == (f.metadata["grid"] is not None)
    assert {"--num-prompts", "--request-rate", "--max-num-seqs"} <= _options(sweep_ap)
    assert set(sw.GRID_KEYS) == {f.name for f in config.fields_of(*config.COMPONENTS, config.RunGrid)
                                 if f.metadata["grid"]}
    assert tuple(f.name for f in dataclasses.fields(sw.Cell)) == sw.GRID_KEYS


def test_run_setup_is_the_components():
    from sim.api.run import SimSetup

    names = {f.name for f in dataclasses.fields(SimSetup)}
    assert names == {f.name for f in config.fields_of(*config.COMPONENTS)}
    assert SimSetup().ngram_k == 32 and SimSetup().model == "qwen3-8b"


@pytest.mark.parametrize("key,value,msg", [("limit", 0, "--limit must be >= 1, got 0"),
                                           ("rate", 0.0, "--rate must be >= 1e-06, got 0.0"),
                                           ("temperature", -1.0, "--temperature must be >= 0, got -1.0"),
                                           ("batch_size", 0, "--batch-size must be >= 1, got 0")])
def test_checks_come_from_the_metadata(key, value, msg):
    with pytest.raises(ConfigError, match=re.escape(msg)):
        config.check(key, value)
    import sim.api.sweep as sw

    with pytest.raises(ConfigError, match=re.escape(msg)):
        sw.validate(sw.expand({"trace": str(ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl"), key: value,
                               "policy": "adaptive"}))


def test_one_baseline_name():
    hits = []
    for p in (ROOT / "sim").rglob("*.py"):
        for m in re.finditer(r"^\s*(BASELINE|BASE)\s*=\s*['\"]", p.read_text(), re.M):
            hits.append(str(p.relative_to(ROOT)))
    assert hits == ["sim/core/config.py"]
