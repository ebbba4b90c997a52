"""The vLLM validation checks the advice itself (issue 62, points 2 and 3), without vLLM or a GPU:

  - every setup the verdict can recommend maps onto a cell the flow runs, which the simulator predicts with the same
    policy (n-gram at the verdict's K, the plugin with its slots / skip / runcal);
  - the validation's `vllm serve` line for a setup is the verdict's line for it, character for character, and it
    carries the speculative and plugin configs the cell's engine really gets;
  - `--from-verdict DIR` plans exactly DIR/verdict.json's recommendations (beside none and adaptive), and refuses a
    missing file, a verdict for another setup, or --policy beside it, in one line each;
  - the dry-run plan estimates GPU time and disk.
"""
from __future__ import annotations

import json
import shlex
import sys

import pytest

from real.validation.vllm.config import VllmRunConfig
from real.validation.vllm.verdict import flow_policy

SERVABLE = ["none", "adaptive", "vllm-ngram:32", "vllm-ngram:7", "hybrid-vllm", "hybrid-vllm:slots=32",
            "hybrid-vllm:slots=32:skip", "hybrid-vllm:slots=32:runcal=64", "hybrid-vllm:slots=32:skip:runcal=64",
            "hybrid-vllm:fixed-point:margin=0.5:slots=16", "hybrid-vllm:runcal=0.5"]
SERVE = "as a server (the verdict's line for this setup): "


def verdict_line(spec: str, bs: int) -> str:
    """The `vllm serve` line sim.run's verdict prints for `spec` recommended at batch `bs` (qwen3-8b, its defaults)."""
    from sim.api.console import verdicts
    from sim.api.run import SimSetup, deployment

    rows = [{"policy": "vllm-ngram:4", "batch_size": bs, "output_throughput_tok_s": 1.0},
            {"policy": spec, "batch_size": bs, "output_throughput_tok_s": 9.0}]
    lines = verdicts(rows, None, deployment=deployment(SimSetup(model="qwen3-8b")))
    assert lines[0].startswith(f"batch {bs}: recommended {spec}"), lines
    return lines[1].strip()


@pytest.mark.parametrize("spec", SERVABLE)
def test_each_recommendable_setup_is_a_cell_the_simulator_predicts_as_that_setup(spec):
    from sim.core.policies import get_policy

    cfg = VllmRunConfig()
    cell = flow_policy(spec)
    assert get_policy(cfg.sim_policy(cell)).name == get_policy(spec).name


@pytest.mark.parametrize("spec", ["model-fixed:7", "hybrid", "adaptive:online", "hybrid-price", "suffix"])
def test_a_setup_the_validation_does_not_run_is_one_clear_refusal(spec):
    from sim.infra.errors import ConfigError

    with pytest.raises(ConfigError, match="vLLM validation runs none, adaptive, vllm-ngram:K and the plugin"):
        flow_policy(spec)


@pytest.mark.parametrize("spec", SERVABLE)
@pytest.mark.parametrize("bs", [4, 128])
def test_the_validations_serve_line_is_the_verdicts(spec, bs):
    cell = flow_policy(spec)
    line = VllmRunConfig().serve_line(cell, bs)
    assert line == verdict_line(spec, bs)
    assert line.startswith("VLLM_USE_V2_MODEL_RUNNER=1 vllm serve Qwen/Qwen3-8B --max-num-seqs " + str(bs))


@pytest.mark.parametrize("cell", ["none", "adaptive", "hybrid", "hybrid:slots=32", "hybrid:slots=32:skip", "ngram",
                                  "hybrid:slots=32:runcal=64", "ngram:32", "hybrid:method=fixed-point:margin=0.5"])
def test_the_serve_line_carries_what_the_cell_runs(cell):
    """The line's --speculative-config is the engine's speculative_config, and its --additional-config the same plugin
    settings (HybridSpecConfig), so the line a user copies is the setup that was measured."""
    from real.vllm_plugin.config import HybridSpecConfig

    cfg = VllmRunConfig()
    words = shlex.split(cfg.serve_line(cell, 8))
    kw = cfg.engine_kwargs(cell, 8)
    flag = lambda f: json.loads(words[words.index(f) + 1]) if f in words else None  # noqa: E731
    assert flag("--speculative-config") == kw.get("speculative_config")
    assert HybridSpecConfig.from_additional_config(flag("--additional-config")) == \
        HybridSpecConfig.from_additional_config(kw.get("additional_config"))
    assert int(words[words.index("--max-num-seqs") + 1]) == kw["max_num_seqs"]


def test_ngram_runs_at_the_k_it_names():
    from sim.infra.errors import ConfigError

    cfg = VllmRunConfig()
    assert cfg.engine_kwargs("ngram:32", 4)["speculative_config"]["num_speculative_tokens"] == 32
    assert cfg.sim_policy("ngram:32") == "vllm-ngram:32" and cfg.sim_policy("ngram") == "vllm-ngram:7"
    with pytest.raises(ConfigError, match=r"policy 'ngram:65': must be an integer in 1\.\.64"):
        cfg.cell("ngram:65")


# ------------------------------------------------------------------------------- --from-verdict
def _validate(*argv):
    from conftest import run_cli_inprocess

    return run_cli_inprocess("real.validation.validate", "--engine", "vllm", "--vllm-device", "cuda", "--dry-run",
                             *map(str, argv))


def _write_verdict(d, recs):
    d.mkdir(parents=True, exist_ok=True)
    (d / "verdict.json").write_text(json.dumps({"verdicts": [
        {"batch_size": bs, "recommended": {"policy": p, "serve": serve}, "runner_up": None} for bs, p, serve in recs]}))


def test_from_verdict_plans_exactly_the_recommended_setups(tmp_path):
    recs = [(4, "vllm-ngram:32", verdict_line("vllm-ngram:32", 4)),
            (128, "hybrid-vllm:slots=32:runcal=64", verdict_line("hybrid-vllm:slots=32:runcal=64", 128))]
    _write_verdict(tmp_path / "sim", recs)
    r = _validate("--from-verdict", tmp_path / "sim", "--quick", "--out", tmp_path / "o")
    assert r.returncode == 0, r.stderr
    cells = [ln.split()[1:] for ln in r.stdout.splitlines() if ln.startswith("  cell ")]
    assert cells == [["codeedit", "none", "bs", "4"], ["codeedit", "adaptive", "bs", "4"],
                     ["codeedit", "ngram:32", "bs", "4"], ["codeedit", "none", "bs", "128"],
                     ["codeedit", "adaptive", "bs", "128"], ["codeedit", "hybrid:slots=32:runcal=64", "bs", "128"]]
    serves = [ln.split(SERVE, 1)[1] for ln in r.stdout.splitlines() if SERVE in ln]
    assert serves[2] == recs[0][2] and serves[5] == recs[1][2]  # the verdict's own lines, as validated
    assert "vllm" not in sys.modules and not (tmp_path / "o").exists()


@pytest.mark.parametrize("setup, argv, msg", [
    ("absent", [], "no verdict.json there (python -m sim.run --out DIR writes it)"),
    ("other line", [], "the verdict serves `VLLM_USE_V2_MODEL_RUNNER=1 vllm serve Qwen/Qwen3-4B"),
    ("ok", ["--policy", "none"], "--policy: --from-verdict takes the setups and batch sizes from the verdict"),
    ("unservable", [], "batch 4: policy 'model-fixed:7': the vLLM validation runs"),
    ("not json", [], "verdict.json"),
])
def test_from_verdict_refusals_are_one_line(tmp_path, setup, argv, msg):
    d = tmp_path / "sim"
    if setup == "other line":
        _write_verdict(d, [(4, "vllm-ngram:32", verdict_line("vllm-ngram:32", 4).replace("Qwen3-8B", "Qwen3-4B"))])
    elif setup == "ok":
        _write_verdict(d, [(4, "vllm-ngram:32", None)])
    elif setup == "unservable":
        _write_verdict(d, [(4, "model-fixed:7", None)])
    elif setup == "not json":
        d.mkdir()
        (d / "verdict.json").write_text("{")
    else:
        d.mkdir()
    r = _validate("--from-verdict", d, *argv, "--out", tmp_path / "o")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_the_dry_run_estimates_gpu_time_and_disk(tmp_path):
    from real.validation.vllm.estimate import drafter_bytes
    from sim.core.models import get_llm

    r = _validate("--quick", "--batch-size", "2", "--out", tmp_path / "o")
    assert r.returncode == 0, r.stderr
    est = r.stdout.split("== estimate", 1)[1].split("\n==", 1)[0]
    assert "GPU time about" in est and "12 vLLM processes (8 cells, the checklist's 2, the profile)" in est
    qwen = get_llm("qwen3-8b")
    gb = (qwen.weight_bytes + drafter_bytes(qwen)) / 1e9
    assert f"weights {gb:.1f} GB" in est and 16 < gb < 20  # 8.19e9 bf16 parameters and a 2-layer drafter


def test_from_verdict_is_for_the_vllm_engine(tmp_path):
    from conftest import run_cli_inprocess

    r = run_cli_inprocess("real.validation.validate", "--from-verdict", tmp_path, "--out", tmp_path / "o")
    assert r.returncode == 2 and "--from-verdict is for --engine vllm" in r.stderr, r.stderr
