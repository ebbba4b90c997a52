"""Data files in models/: every LLM / GPU / drafter cost spec loads, validates and errors clearly."""
import json

import pytest

from sim.infra.errors import ConfigError
from sim.core.models import get_drafter_cost, get_gpu, get_llm, list_gpus, list_llms

REQUIRED_LLMS = {"qwen3-8b", "qwen3-4b", "qwen3-14b", "llama-3.1-8b", "smollm2-135m"}
REQUIRED_GPUS = {"a100-80g", "h100-sxm", "h200"}


def test_all_required_names_present_and_load():
    assert REQUIRED_LLMS <= set(list_llms())
    assert REQUIRED_GPUS <= set(list_gpus())
    for n in list_llms():
        m = get_llm(n)
        if m.is_moe:  # totals from the model card (FP8/BF16 dense weights, 4-bit experts); widths cover the dense part
            assert m.source and m.dtype_bytes in (1, 2) and m.expert_dtype_bytes < m.dtype_bytes
            assert m.active_params < m.num_params
            continue
        assert m.source and m.dtype_bytes == 2
        assert abs(m.architecture_params / m.num_params - 1) < 0.01
    for n in list_gpus():
        g = get_gpu(n)
        # vLLM's default capture limit, except the anchor-sized spec (capture limit stated in its source)
        assert g.source and g.cuda_graph_max_tokens == (1024 if n == "mi350x-dsv4-graphs" else 512)


def test_kv_bytes_per_token():
    assert get_llm("qwen3-8b").kv_bytes_per_token == 147456 == 144 * 1024
    assert get_llm("llama-3.1-8b").kv_bytes_per_token == 131072
    assert get_llm("smollm2-135m").kv_bytes_per_token == 30 * 3 * 64 * 2 * 2


def test_names_case_insensitive_and_defaults():
    assert get_llm("Qwen3-8B") is get_llm("qwen3-8b") is get_llm()
    assert get_gpu(" H100-SXM ") is get_gpu()
    assert get_drafter_cost().draft_layers == 2


@pytest.mark.parametrize("fn,kind", [(get_llm, "model"), (get_gpu, "gpu")])
def test_unknown_name_lists_valid(fn, kind):
    with pytest.raises(ConfigError) as e:
        fn("gpt-17")
    msg = str(e.value)
    assert f"unknown {kind} 'gpt-17'" in msg and "choose one of:" in msg
    for n in (list_llms() if fn is get_llm else list_gpus()):
        assert n in msg
    with pytest.raises(ConfigError):
        fn(3)


def _tmp_models(tmp_path, monkeypatch, llm: dict):
    (tmp_path / "llms").mkdir(parents=True)
    (tmp_path / "llms" / "x.json").write_text(json.dumps(llm))
    monkeypatch.setenv("HYBRIDSPEC_MODELS_DIR", str(tmp_path))


def test_bad_data_files(tmp_path, monkeypatch):
    base = json.loads((__import__("sim.core.models", fromlist=["models_dir"]).models_dir() / "llms" / "qwen3-8b.json")
                      .read_text())
    bad = dict(base, name="x")
    del bad["num_layers"]
    _tmp_models(tmp_path, monkeypatch, bad)
    with pytest.raises(ConfigError, match="missing field 'num_layers'"):
        get_llm("x")
    _tmp_models(tmp_path / "b", monkeypatch, dict(base, name="x", num_layerz=3))
    with pytest.raises(ConfigError, match="unknown field"):
        get_llm("x")
    _tmp_models(tmp_path / "c", monkeypatch, dict(base, name="x", num_params=1e9))
    with pytest.raises(ConfigError, match="disagrees with the architecture"):
        get_llm("x")
    _tmp_models(tmp_path / "d", monkeypatch, dict(base, name="x", num_kv_heads=5))
    with pytest.raises(ConfigError, match="multiple of num_kv_heads"):
        get_llm("x")


def test_graph_tokens_pad_to_the_next_capture_size_and_the_charge_follows():
    from sim.core.cost import make_cost_model
    c = make_cost_model("roofline", llm="qwen3-8b", gpu="h100-sxm")
    caps = sorted(c.capture_sizes)
    assert c.graph_tokens(0) == 0 and c.graph_tokens(1) == 1 and c.graph_tokens(3) == 4
    assert c.graph_tokens(caps[-1] - 1) == caps[-1] and c.graph_tokens(caps[-1] + 7) == caps[-1] + 7
    t = c.charged_verify_table(300, 50_000, 8)
    raw = c.verify_table(600, 50_000, 8)
    for n in (5, 130, 257, 300):
        assert t[n] == raw[c.graph_tokens(n)]
    assert t[129] == t[136] < t[137]  # one bucket (129..136) costs the same: padding is paid anyway


def test_cost_kinds_are_a_registry():
    """A new kind is one decorated builder: make_cost_model finds it, the help lists it, a second registration of a
    name fails, and an unknown name names the choices."""
    import pytest

    from sim.core import cost
    from sim.infra.errors import ConfigError

    @cost.cost_kind("test-flat")
    def _flat(llm, gpu, **kw):
        return cost.make_cost_model("roofline", llm, gpu, **kw)

    try:
        # a property, not a list: the new kind is registered after the built-in ones, which stay as they were
        assert cost.cost_kinds()[-1] == "test-flat" and "test-flat" not in cost.COST_KINDS
        assert cost.cost_kinds()[:len(cost.COST_KINDS)] == cost.COST_KINDS
        assert isinstance(cost.make_cost_model("test-flat", "qwen3-8b", "h100-sxm"), cost.RooflineCost)
        with pytest.raises(RuntimeError):
            cost.cost_kind("test-flat")(_flat)
        with pytest.raises(ConfigError, match="choose one of: " + ", ".join(cost.cost_kinds())):
            cost.make_cost_model("nope")
    finally:
        cost._KINDS.pop("test-flat")
