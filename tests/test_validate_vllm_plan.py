"""`real/validate.py --engine vllm` and `real/profile_costs.py --engine vllm` without vLLM or a GPU: the --dry-run plan
(serve command, LLM kwargs, sim.api.run commands, checklist), one-line errors, and every piece that runs after vLLM
returns (metric deltas, the checklist's verdicts, the cost table from bench results, the per-cell predictions
and the report), fed with made-up vLLM results."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import shlex
import sys
from pathlib import Path

import pytest

from real.validation.validate import main as validate_main
from real.validation.fidelity import write_reports
from real.validation.pipeline.predict import sim_command
from real.validation.vllm import checks
from real.validation.vllm.config import VllmRunConfig, parse_hybrid_spec
from real.validation.vllm.engine import metric_delta, metric_snapshot, spec_decode_stats
from sim.infra.cli import run_cli
from sim.infra.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _run(main, argv) -> tuple[int, str, str]:
    """run_cli(main, argv) in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as ex:
        run_cli(main, argv)
    return ex.value.code, out.getvalue(), err.getvalue()


def _after(line: str, marker: str) -> list[str]:
    """The shell words after `marker` in a plan line, environment assignments dropped."""
    words = shlex.split(line.split(marker, 1)[1])
    return [w for w in words if not ("=" in w and w.split("=", 1)[0].isupper())]


def _flags(words: list[str]) -> dict:
    out, i = {}, 0
    while i < len(words):
        if words[i].startswith("--"):
            if i + 1 < len(words) and not words[i + 1].startswith("--"):
                out[words[i]] = words[i + 1]
                i += 2
                continue
            out[words[i]] = True
        i += 1
    return out


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "o"
    spec = '{"margin": 0.5, "method": "fixed-point"}'
    code, text, err = _run(validate_main, ["--engine", "vllm", "--dry-run", "--quick", "--out", str(out),
                                           "--hybrid-spec", spec, "--batch-size", "2"])
    assert code == 0, err
    return text, out


def test_dry_run_imports_no_vllm_and_writes_nothing(plan):
    text, out = plan
    assert "vllm" not in sys.modules and not out.exists()
    assert text.index("== 1. first-run checklist") < text.index("== 2. complement table") < text.index("== 3. cells") \
        < text.index("== 4. report")
    assert "build cuda (vllm; the simulator models vLLM 0.33's scheduling)" in text


SERVE = "as a server (the verdict's line for this setup): "


def test_dry_run_serve_command_carries_the_configs(plan):
    text, _ = plan
    cfg = VllmRunConfig(hybrid=parse_hybrid_spec('{"margin": 0.5, "method": "fixed-point"}'))
    serves = [ln for ln in text.splitlines() if SERVE in ln]
    assert len(serves) == 8  # none, adaptive, hybrid, the recommended hybrids at 32 slots (plain, skip, runcal=64),
    # ngram at its K and at 32, at batch 2
    flags = [_flags(_after(ln, SERVE)[3:]) for ln in serves]
    for ln, f in zip(serves, flags):
        assert _after(ln, SERVE)[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]
        assert ln.split(SERVE, 1)[1].startswith("VLLM_USE_V2_MODEL_RUNNER=1 vllm serve")
        assert f["--max-num-seqs"] == "2" and "--enforce-eager" not in f
    measured = [_flags(_after(ln, "measured with, beside it: ")) for ln in text.splitlines()
                if "measured with, beside it: " in ln]
    assert len(measured) == 8 and all(m["--no-enable-prefix-caching"] is True and m["--seed"] == "0" for m in measured)
    assert "--speculative-config" not in flags[0]  # none: the reference
    dspark = {"method": "dspark", "model": "deepseek-ai/dspark_qwen3_8b_block7", "num_speculative_tokens": 7,
              "enable_adaptive_verification": True}
    assert json.loads(flags[1]["--speculative-config"]) == dspark == json.loads(flags[2]["--speculative-config"])
    assert json.loads(flags[2]["--additional-config"]) == {"hybrid_spec": {"method": "fixed-point", "margin": 0.5}} \
        == cfg.hybrid.to_additional_config()
    # the recommended hybrid: vLLM at W = 32 slots, the plugin told so, DSpark at its block inside it
    assert json.loads(flags[3]["--speculative-config"]) == dict(dspark, num_speculative_tokens=32)
    assert json.loads(flags[3]["--additional-config"]) == {"hybrid_spec": {"method": "fixed-point", "margin": 0.5,
                                                                           "slots": 32}}
    assert json.loads(flags[4]["--additional-config"])["hybrid_spec"]["skip"] is True
    assert json.loads(flags[5]["--additional-config"])["hybrid_spec"]["runcal"] == 64
    assert [json.loads(flags[i]["--speculative-config"])["num_speculative_tokens"] for i in (6, 7)] == [7, 32]
    assert all(json.loads(flags[i]["--speculative-config"])["method"] == "ngram" for i in (6, 7))
    kws = [json.loads(ln.split("LLM(**", 1)[1][:-1]) for ln in text.splitlines() if ln.strip().startswith("LLM(**")]
    assert kws[0]["disable_log_stats"] is False and "speculative_config" not in kws[0]
    assert kws[2]["additional_config"] == cfg.hybrid.to_additional_config()


def test_dry_run_sim_commands_parse_and_name_the_policies(plan):
    from sim.api.run import SimSetup, parse_args

    text, _ = plan
    sims = [_after(ln, "predicted: ") for ln in text.splitlines() if ln.strip().startswith("predicted: ")]
    pols = [_flags(w)["--policy"] for w in sims]
    assert pols == ["none", "adaptive", "hybrid-vllm:fixed-point:margin=0.5",
                    "hybrid-vllm:fixed-point:margin=0.5:slots=32", "hybrid-vllm:fixed-point:margin=0.5:slots=32:skip",
                    "hybrid-vllm:fixed-point:margin=0.5:slots=32:runcal=64", "vllm-ngram:7", "vllm-ngram:32"]
    for w, k in zip(sims, (7, 7, 7, 32, 32, 32, 7, 32)):
        assert w[:3] == ["python", "-m", "sim.run"]
        a = parse_args(w[3:])
        assert (a.cost, a.model, a.ngram_k, a.temperature, a.batch_size) == ("profiled", "qwen3-8b", k, 0.0, [2])
        assert a.gpu.endswith("cost_table.json") and a.trace.endswith("bs2/reference.jsonl")
        assert a.drafts.endswith("drafts.jsonl")  # the chains the run records are replayed
        assert SimSetup().async_scheduling and a.async_scheduling  # vLLM schedules asynchronously by default


def test_dry_run_lists_the_checklist_and_the_profile(plan):
    text, _ = plan
    for k in "abcd":
        assert f"  [{k}] " in text
    assert "VLLM_GPU_SYNC_CHECK=error" in text and "checks/hybrid/run.spec.json" in text \
        and "checks/none/run.spec.json" in text
    # every hybrid variant planned (the recommended W-slot ones too) is checked, at its own W, under the sync check
    for d in ("hybrid-slots=32", "hybrid-slots=32-skip", "hybrid-slots=32-runcal=64"):
        (line,) = [ln for ln in text.splitlines() if f"checks/{d}/run.spec.json" in ln]
        assert "VLLM_GPU_SYNC_CHECK=error" in line
    (kw,) = [ln for ln in text.splitlines() if ln.strip().startswith("hybrid:slots=32:skip: LLM(")]
    assert '"num_speculative_tokens":32' in kw and '"skip":true' in kw
    bench = [ln for ln in text.splitlines() if "bench forward" in ln]
    assert len(bench) == 2 and "--exclude-drafter" in bench[0] and "--exclude-drafter" not in bench[1]
    assert "--case verify_r1=8@72:7" in bench[0]
    assert all("enable_adaptive_verification" not in ln for ln in bench)  # bench forward refuses it


def test_profile_dry_run():
    from real.validation.profile import main as profile_main

    code, text, err = _run(profile_main, ["--engine", "vllm", "--dry-run", "--batch-size", "4"])
    assert code == 0, err
    assert "bench forward" in text and "'verify_r4=4*8@72:7'" in text and "vllm" not in sys.modules


@pytest.mark.parametrize("argv,msg", [
    (["--engine", "vllm", "--dry-run", "--hybrid-spec", "{bad"], "not valid JSON"),
    (["--engine", "vllm", "--dry-run", "--hybrid-spec", '{"nope": 1}'], "unknown field(s) nope"),
    (["--engine", "vllm", "--dry-run", "--hybrid-spec", '{"margin": -1}'], "margin"),
    (["--engine", "vllm", "--dry-run", "--hybrid-spec", "[1]"], "JSON object"),
    (["--engine", "tensorrt"], "--engine must be one of torch, vllm"),
    (["--engine", "vllm", "--dry-run", "--policy", "hybrid-price"], "hybrid-price"),
    (["--engine", "vllm", "--dry-run", "--num-speculative-tokens", "5"], "drafts 7 tokens"),
    (["--engine", "vllm", "--dry-run", "--random-weights"], "torch engine"),
    (["--engine", "vllm", "--dry-run", "--gpu-memory-utilization", "1.5"], "gpu-memory-utilization"),
    (["--engine", "vllm", "--dry-run", "--policy", "hybrid:slots=100"], "slots must be 0 (num_speculative_tokens) or an integer in 1..64, got 100"),
    (["--engine", "vllm", "--dry-run", "--policy", "hybrid:slots=4"], "smaller than DSpark"),
    (["--engine", "vllm", "--dry-run", "--policy", "hybrid:wings=3"], "not a hybrid setting"),
    (["--engine", "vllm", "--dry-run", "--policy", "ngram:slots=3"], "only hybrid takes settings"),
    (["--engine", "vllm", "--dry-run", "--vllm-device", "tpu"], "--vllm-device"),
    (["--engine", "vllm", "--dry-run", "--policy", "hybrid:compile"], "compile runs only on the CPU build"),
    (["--engine", "vllm", "--dry-run", "--synthetic-acceptance-length", "9"], "must be in [1, 8] (1 + K), got 9"),
    (["--engine", "vllm", "--dry-run", "--synthetic-acceptance-length", "0.5"], "must be in [1, 8]"),
    (["--engine", "vllm", "--dry-run", "--synthetic-acceptance-rates", "0.5,0.9"], "must not increase"),
    (["--engine", "vllm", "--dry-run", "--synthetic-acceptance-rates", "1,1.5"], "must be in [0, 1], got 1.5"),
    (["--engine", "vllm", "--dry-run", "--synthetic-acceptance-rates", "1,x"], "expected rates separated by commas"),
    (["--engine", "vllm", "--dry-run", "--synthetic-acceptance-length", "2", "--synthetic-acceptance-rates", "1"],
     "give one of them"),
    (["--engine", "vllm", "--dry-run", "--dummy-weights", "--vllm-model", "tests", "--vllm-drafter", "tests"],
     "--dummy-weights: --vllm-model tests has no config.json"),
    (["--synthetic-acceptance-length", "3"], "--synthetic-acceptance-length is for --engine vllm"),
    # the CPU build takes --dummy-weights too (the harness's dummy-dflash-buffers shim): the same model check
    (["--engine", "vllm", "--dry-run", "--vllm-device", "cpu", "--dummy-weights", "--vllm-model", "tests",
      "--vllm-drafter", "tests"], "--dummy-weights: --vllm-model tests has no config.json"),
    (["--dry-run"], "--dry-run is for --engine vllm"),
    (["--hybrid-spec", "{}"], "--hybrid-spec is for --engine vllm"),
])
def test_bad_input_is_one_line(tmp_path, argv, msg):
    code, _, err = _run(validate_main, [*argv, "--out", str(tmp_path / "o")])
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("error: ") and msg in err, err


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_vllm_engine_without_vllm_says_how(tmp_path):
    from real.validation.profile import main as profile_main

    for main in (validate_main, profile_main):
        code, _, err = _run(main, ["--engine", "vllm", "--out", str(tmp_path / "o")])
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert "vLLM is not installed" in err and "pip install -e '.[vllm]'" in err and "CUDA GPU" in err
    assert not (tmp_path / "o").exists()


def test_sim_command_round_trips_through_sim_run():
    from sim.api.run import SimSetup, parse_args

    setup = SimSetup(trace="a b.jsonl", model="qwen3-8b", cost="profiled", gpu="t.json", ngram_k=7, seed=3,
                     temperature=0.0, max_num_batched_tokens=512, kv_capacity_tokens=123456, drafts="d.jsonl",
                     async_scheduling=False, calibrator="ngram-general")
    w = shlex.split(sim_command(setup, "adaptive", 4))
    a = parse_args(w[3:])
    import dataclasses

    assert SimSetup(**{f.name: getattr(a, f.name) for f in dataclasses.fields(SimSetup)}) == setup
    assert a.policy == ["adaptive"] and a.batch_size == [4]


def test_config_flags_and_serve_line_come_from_the_dataclass():
    import argparse

    from real.validation.vllm.config import add_arguments, from_args, vllm_flags

    ap = argparse.ArgumentParser()
    add_arguments(ap)
    cfg = from_args(vllm_flags(ap.parse_args(["--num-speculative-tokens", "7", "--vllm-model", "Qwen/Qwen3-4B",
                                              "--hybrid-spec", '{"enabled": false}'])), seed=2)
    assert cfg == VllmRunConfig(model="Qwen/Qwen3-4B", seed=2, hybrid=parse_hybrid_spec('{"enabled": false}'))
    assert cfg.sim_model() == "qwen3-4b" and cfg.sim_policy("hybrid") == "adaptive"  # disabled: plain DSpark
    assert VllmRunConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg
    kw = cfg.engine_kwargs("none", 3)
    assert "speculative_config" not in kw and kw["max_num_seqs"] == 3
    with pytest.raises(ConfigError, match="policies"):
        cfg.engine_kwargs("hybrid-price", 3)


# ------------------------------------------------------------------------------- after vLLM returns
class Counter:  # the shapes of vllm.v1.metrics.reader's classes (type names matter, not the classes)
    def __init__(self, name, value, labels=None):
        self.name, self.value, self.labels = name, value, labels or {}


class Vector:
    def __init__(self, name, values, labels=None):
        self.name, self.values, self.labels = name, values, labels or {}


class Histogram:
    def __init__(self, name, count, total, labels=None):
        self.name, self.count, self.sum, self.labels, self.buckets = name, count, total, labels or {}, {}


class Gauge:
    def __init__(self, name, value, labels=None):
        self.name, self.value, self.labels = name, value, labels or {}


def test_metric_delta_and_spec_stats():
    from real.validation.vllm.engine import kv_capacity_from_metrics

    before = [Counter("vllm:spec_decode_num_drafts", 5), Vector("vllm:spec_decode_num_accepted_tokens_per_pos", [4, 2, 1]),
              Histogram("vllm:iteration_tokens_total", 3, 30.0)]
    after = [Counter("vllm:spec_decode_num_drafts", 15), Counter("vllm:spec_decode_num_drafts", 5, {"engine": "1"}),
             Counter("vllm:spec_decode_num_draft_tokens", 140), Counter("vllm:spec_decode_num_accepted_tokens", 37),
             Vector("vllm:spec_decode_num_accepted_tokens_per_pos", [14, 10, 7]),
             Histogram("vllm:iteration_tokens_total", 23, 330.0),
             Gauge("vllm:cache_config_info", 1, {"num_gpu_blocks": "100", "block_size": "16"})]
    d = metric_delta(metric_snapshot(after), metric_snapshot(before))
    assert d["vllm:spec_decode_num_drafts"] == 15 and d["vllm:iteration_tokens_total"] == {"count": 20, "sum": 300.0}
    s = spec_decode_stats(d)
    assert s["accepted_per_pos"] == [10, 8, 6] and s["acceptance_per_pos"] == [10 / 15, 8 / 15, 6 / 15]
    assert s["accepted_per_draft"] == 37 / 15 and s["draft_tokens"] == 140
    assert kv_capacity_from_metrics(after) == 1600


def _hyb(**kw):
    base = {"outputs": [[1, 2, 3], [4, 5]], "env": {"VLLM_GPU_SYNC_CHECK": "error"}, "error": None,
            "hybrid_stats": {"available": True, "workers": [{"steps": 9, "ngram_chosen": 4}]},
            "ngram_selfcheck": [[True, "512 histories equal"]]}
    return {**base, **kw}


def test_checklist_verdicts():
    base = {"outputs": [[1, 2, 3], [4, 5]]}
    st = lambda res: [r.status for r in res]  # noqa: E731
    assert st(checks.evaluate(base, _hyb())) == ["PASS"] * 4
    r = checks.evaluate(base, _hyb(hybrid_stats={"available": False, "detail": "cannot be imported"},
                                   ngram_selfcheck=[[None, "not available: no checks module"]]))
    assert st(r) == ["FAIL", "N/A", "PASS", "PASS"] and "not available" in r[1].detail
    r = checks.evaluate(base, _hyb(outputs=[[1, 2, 9], [4, 5]]))
    assert st(r)[3] == "FAIL" and "request 0 first at output token 2 (none 3, hybrid 9" in r[3].detail
    r = checks.evaluate(base, _hyb(error="RuntimeError: host sync in step", outputs=None))
    assert st(r)[2:] == ["FAIL", "FAIL"] and "host sync" in r[2].detail
    assert st(checks.evaluate(base, _hyb(hybrid_stats={"available": True, "workers": [{"active": False}]})))[0] == "FAIL"
    assert st(checks.evaluate(base, _hyb(hybrid_stats={"available": True, "workers": [{"steps": 0}]})))[0] == "FAIL"
    assert st(checks.evaluate(base, _hyb(ngram_selfcheck=[[False, "slot 3 differs"]])))[1] == "FAIL"
    assert "[d] PASS" in checks.evaluate(base, _hyb())[3].line()
    # bf16: a flip where `none`'s top-2 margin is below epsilon is a tie flip (PASS, counted); above it, a FAIL
    tied = dict(base, margins=[[3.0, 2.0, 0.01], [3.0, 3.0]])
    r = checks.evaluate(tied, _hyb(outputs=[[1, 2, 9], [4, 5]]))
    assert st(r)[3] == "PASS" and "1 tie flip(s)" in r[3].detail
    r = checks.evaluate(dict(base, margins=[[3.0, 2.0, 0.9], [3.0, 3.0]]), _hyb(outputs=[[1, 2, 9], [4, 5]]))
    assert st(r)[3] == "FAIL" and "margin 0.900" in r[3].detail
    # the CPU build has no device sync to check: N/A, not a PASS
    assert st(checks.evaluate(base, _hyb(), sync_check=False))[2] == "N/A"
    r = checks.evaluate(base, _hyb(), policy="hybrid:slots=32:skip")
    assert {x.policy for x in r} == {"hybrid:slots=32:skip"} and "(hybrid:slots=32:skip): " in r[3].line()


def test_the_checklist_runs_every_planned_hybrid_variant_at_its_own_config(monkeypatch, tmp_path):
    """run_checklist starts `none` and then each hybrid variant (cfg.cell: W slots, skip) under the sync check; one
    variant that fails fails only its own items."""
    from real.validation.vllm import cells
    from real.validation.vllm.slices import Slice

    assert checks.hybrid_variants(["none", "adaptive", "hybrid", "hybrid:slots=32", "ngram:32", "hybrid:slots=32:skip",
                                   "hybrid"]) == ("hybrid", "hybrid:slots=32", "hybrid:slots=32:skip")
    assert checks.hybrid_variants(["none", "adaptive"]) == ("hybrid",)
    seen = []

    def run_cell(cfg, sl, pol, bs, work, **kw):
        seen.append((pol, cfg.num_speculative_tokens, cfg.hybrid.skip, work.name, kw["env"].get("VLLM_GPU_SYNC_CHECK")))
        if pol == "none":
            return {"outputs": [[1, 2, 3], [4, 5]]}
        return _hyb(outputs=[[1, 2, 3], [4, 6]] if pol == "hybrid:slots=32:skip" else [[1, 2, 3], [4, 5]])

    monkeypatch.setattr(cells, "run_cell", run_cell)
    sl = Slice(trace="t", ids=("a", "b"), prompts=((1,), (2,)), max_tokens=(3, 2), passed_over=0)
    res = checks.run_checklist(VllmRunConfig(), sl, tmp_path, True, 0.25, ("hybrid", "hybrid:slots=32",
                                                                           "hybrid:slots=32:skip"))
    assert seen == [("none", 7, False, "none", None), ("hybrid", 7, False, "hybrid", "error"),
                    ("hybrid:slots=32", 32, False, "hybrid-slots=32", "error"),
                    ("hybrid:slots=32:skip", 32, True, "hybrid-slots=32-skip", "error")]
    assert len(res) == 12 and [r.policy for r in res if r.status == "FAIL"] == ["hybrid:slots=32:skip"]


def test_table_from_bench_results_and_the_cell_report(tmp_path):
    """A table built from made-up `vllm bench forward` medians loads in the simulator with the parts it was
    given, and made-up vLLM runs go through prediction, lossless check and fidelity.{json,md}."""
    from real.validation.vllm import bench, flow
    from sim.core.cost.profiled import ProfiledCost, write_cost_table

    cfg = VllmRunConfig()
    cases = bench.forward_cases(cfg, [1, 2], quick=True)
    kv = 1e-5
    target = {c.name: 5.0 + 0.01 * c.tokens + kv * c.kv_tokens for c in cases}
    drafter = {c.name: target[c.name] + 0.3 + 0.05 * c.reqs for c in cases if c.name.startswith("verify_")}
    lm = [(r, 0.4 + 0.002 * r) for r in bench.LM_HEAD_ROWS]
    machine = {"device": "NVIDIA H100 80GB HBM3", "model": "qwen3-8b"}
    table = bench.build_table(cfg, cases, target, drafter, lm, machine, "test")
    assert table.gpu == "h100-sxm" and table.kv_ms_per_token == pytest.approx(kv)
    assert table.logits_ms_per_row == pytest.approx(0.002, rel=1e-6)
    path = write_cost_table(table, tmp_path / "cost_table.json")
    cost = ProfiledCost(path)
    assert cost.verify_ms(8, 0, 1, logit_rows=0) == pytest.approx(5.0 + 0.08 + 0.4)
    assert cost.draft_ms(2, 7) == pytest.approx(0.3 + 0.05 * 2)
    assert cost.sample_ms(8) > 0  # from the roofline fallback (qwen3-8b on h100-sxm)

    from real.validation.options import ValidateOptions
    from real.validation.vllm.slices import write_reference

    a = ValidateOptions(engine="vllm", quick=True, policy=("none", "adaptive"), batch_size=(2,), cost_table=str(path),
                        out=str(tmp_path / "v"), trace=("traces/codeedit.jsonl",), limit=3, max_tokens=8)
    v = flow.VllmValidation.from_args(a)
    assert v.policies == ("none", "adaptive") and v.table == path and v.build.timed
    sl = v.build.load_slice("traces/codeedit.jsonl", 3, v.max_prompt, 8, 0)
    ref = [list(range(100, 100 + m)) for m in sl.max_tokens]
    ref_path = v.out / sl.stem / "bs2" / "reference.jsonl"
    write_reference(sl, ref, ref_path)
    vtab = [0.0] + [5.0 + 0.01 * t for t in range(1, 65)]  # vLLM's verify table by tokens (index 0: nothing run)

    def run(outputs, tps, tables=True):
        n = sum(map(len, outputs))
        return {"policy": "x", "outputs": outputs, "output_tokens": n, "wall_s": n / tps, "tok_per_s": tps,
                "steps": 12, "mean_latency_s": 0.5, "kv_capacity_tokens": 400000, "async_scheduling": True,
                "capture_sizes": [1, 2, 4, 8, 16, 32, 64], "request_ids": list(sl.ids),
                "drafts": [[sl.ids[0], 0, [100, 101, 7, 7, 7, 7, 7], [0.9, 0.8, 0.1, 0.1, 0.1, 0.1, 0.1]]],
                "cost_tables": {"draft_ms": [0.0, 0.4, 0.5], "verify_ms": vtab} if tables else None,
                "spec": spec_decode_stats({"vllm:spec_decode_num_drafts": 10,
                                           "vllm:spec_decode_num_accepted_tokens": 15})}
    bad = [list(o) for o in ref]
    bad[1][-1] += 1
    runs = {"none": dict(run(ref, 300.0, tables=False), margins=[[5.0] * len(o) for o in ref]),
            "adaptive": run(bad, 900.0)}
    cells = [flow.cell_record(v, sl, 2, p, runs, ref_path, json.loads(path.read_text())) for p in ("none", "adaptive")]
    assert cells[0]["real"]["lossless"] and not cells[1]["real"]["lossless"]
    assert "request 1 first at output token" in cells[1]["real"]["lossless_detail"]
    assert cells[0]["table_from"] == "adaptive" and cells[1]["table_from"] == "adaptive"
    # vLLM's n-gram at the verdict's K = 32: priced with adaptive's tables (their DSpark block), predicted at K = 32
    ng = flow.cell_record(v, sl, 2, "ngram:32", dict(runs, **{"ngram:32": run(ref, 1200.0, tables=False)}), ref_path,
                          json.loads(path.read_text()))
    assert ng["sim_policy"] == "vllm-ngram:32" and ng["table_from"] == "adaptive"
    assert "--policy vllm-ngram:32" in ng["sim_command"] and "--ngram-k" not in ng["sim_command"]  # 32: the default
    assert ng["serve"] == v.cfg.serve_line("ngram:32", 2) and '"num_speculative_tokens":32' in ng["serve"]
    assert json.loads((v.cell_dir(sl, 2, "ngram:32") / "cost_table.json").read_text())["draft"]["block"] == 7
    # the recommended hybrid at W = 32 slots: its own tables, priced at DSpark's trained block (7), not W
    hy = flow.cell_record(v, sl, 2, "hybrid:slots=32", dict(runs, **{"hybrid:slots=32": run(ref, 1000.0)}), ref_path,
                          json.loads(path.read_text()))
    assert hy["table_from"] == "hybrid:slots=32" and "slots=32" in hy["sim_policy"]
    assert json.loads((v.cell_dir(sl, 2, "hybrid:slots=32") / "cost_table.json").read_text())["draft"]["block"] == 7
    tab = json.loads((v.cell_dir(sl, 2, "adaptive") / "cost_table.json").read_text())
    assert tab["capture_sizes"] == [1, 2, 4, 8, 16, 32, 64] and tab["verify"]["ms"][:2] == [5.01, 5.02]
    assert tab["logits_ms_per_row"] == pytest.approx(0.002, rel=1e-6)  # the complement's part
    side = [json.loads(ln) for ln in (v.cell_dir(sl, 2, "adaptive") / "drafts.jsonl").read_text().splitlines()]
    assert side[0]["model_acc"][0] == 2 and side[0]["model_conf"][0][:2] == [0.9, 0.8] and side[1]["model_acc"][0] == 0
    for c in cells:
        assert c["predicted"]["tok_per_s"] > 0 and c["predicted_error"] >= 0 and c["steps_error"] >= 0
        assert "--kv-capacity-tokens 400000" in c["sim_command"] and f"--policy {c['sim_policy']}" in c["sim_command"]
        assert "--drafts" in c["sim_command"] and "--drafts" not in c["synthetic_command"]
    meta = {"command": "python real/validate.py --engine vllm", "machine": machine, "config": cfg.to_json(),
            "hybrid_additional_config": cfg.hybrid.to_additional_config(), "sim_model": "qwen3-8b", "model": cfg.model,
            "max_tokens": 8, "max_prompt": 4096, "limit": 3, "vllm_version": "0.33.0", "semantics": "0.33",
            "timed": True, "checklist": [], "tie_epsilon": 0.25, "complement_table": str(path)}
    agg = write_reports(v.out, cells, meta, md=flow.format_md)
    assert agg["cells"] == 2 and not agg["all_lossless"] and agg["predicted_cells"] == 2
    md = (v.out / "fidelity.md").read_text()
    assert md.startswith("# Fidelity: the simulator against vLLM (CUDA)") and "| codeedit | none (none) | 2 | 3 |" in md
    assert json.loads((v.out / "fidelity.json").read_text())["cells"][1]["real"]["lossless_detail"]


def test_the_cost_model_check_without_weights_plans_synthetic_cells(tmp_path, monkeypatch):
    """--dummy-weights --synthetic-acceptance-length L: every cell loads random weights and verifies with the rates
    resolved for its own K (7, or 32 for vLLM's n-gram at 32), the simulator is told the same rates, each cell is its
    own reference, and the checklist verifies as vLLM does by default (it checks losslessness). A W-slot hybrid runs it
    too: vLLM verifies its W slots with W rates (the plugin cuts its DSpark copy's to the block: config.block_config)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # a machine that may fetch the target's config (offline: the test below)
    code, text, err = _run(validate_main, ["--engine", "vllm", "--dry-run", "--quick", "--dummy-weights",
                                           "--synthetic-acceptance-length", "3", "--batch-size", "4",
                                           "--out", str(tmp_path / "o")])
    assert code == 0, err
    assert "leaving out" not in err
    assert "losslessness is not claimed" in text and "vllm" not in sys.modules
    assert "hybrid:slots=32" in text.split("policies (vLLM -> simulator): ")[1].splitlines()[0]
    kw = [json.loads(ln.split("LLM(**", 1)[1][:-1]) for ln in text.splitlines() if ln.startswith("    LLM(**")]
    assert kw and all(k["load_format"] == "dummy" for k in kw)
    spec = {(k["speculative_config"]["method"], k["speculative_config"]["num_speculative_tokens"]):
            k["speculative_config"] for k in kw if "speculative_config" in k}
    assert spec["dspark", 7]["rejection_sample_method"] == "synthetic"
    assert spec["dspark", 7]["synthetic_acceptance_rates"] == [1, 1] + [0] * 5
    assert spec["ngram", 32]["synthetic_acceptance_rates"] == [1, 1] + [0] * 30
    assert spec["dspark", 32]["synthetic_acceptance_rates"] == [1, 1] + [0] * 30  # hybrid:slots=32: W rates
    checklist = [ln for ln in text.splitlines() if ln.strip().startswith(("hybrid: LLM(", "none: LLM("))]
    assert len(checklist) == 2 and all("synthetic" not in ln and "dummy" in ln for ln in checklist)
    (pred,) = [ln for ln in text.splitlines() if "predicted:" in ln and "/ngram-32/" in ln]
    assert "--synthetic-acceptance 1,1,0," in pred and "ngram-32/reference.jsonl" in pred


def test_a_synthetic_cell_is_its_own_reference_and_claims_no_losslessness(tmp_path):
    from real.validation.options import ValidateOptions
    from real.validation.vllm import flow
    from real.validation.vllm.slices import write_reference

    a = ValidateOptions(engine="vllm", quick=True, policy=("none", "adaptive"), batch_size=(2,),
                        out=str(tmp_path / "v"), trace=("traces/codeedit.jsonl",), limit=2, max_tokens=12,
                        vllm={"synthetic_acceptance_rates": "1,0.5"})
    v = flow.VllmValidation.from_args(a)
    sl = v.build.load_slice("traces/codeedit.jsonl", 2, v.max_prompt, 12, 0, v.cfg)
    ref = [list(range(100, 100 + m)) for m in sl.max_tokens]
    own = [[7] * m for m in sl.max_tokens]  # synthetic acceptance emitted the drafts: other tokens than `none`'s
    ref_path = v.out / sl.stem / "bs2" / "reference.jsonl"
    write_reference(sl, ref, ref_path)
    n = sum(map(len, own))
    run = {"policy": "adaptive", "outputs": own, "output_tokens": n, "wall_s": 1.0, "tok_per_s": n, "steps": 9,
           "mean_latency_s": 0.5, "kv_capacity_tokens": 400000, "async_scheduling": True, "capture_sizes": [],
           "request_ids": list(sl.ids), "drafts": [], "spec": {},
           "cost_tables": {"draft_ms": [0.0, 0.4, 0.5], "verify_ms": [0.0] + [5.0] * 64}}
    runs = {"none": {"outputs": ref, "output_tokens": n, "steps": n, "tok_per_s": 1.0, "mean_latency_s": 1.0},
            "adaptive": run}
    cell = flow.cell_record(v, sl, 2, "adaptive", runs, ref_path, None)
    assert cell["lossless_claimed"] is False and cell["real"]["lossless"]
    assert (v.cell_dir(sl, 2, "adaptive") / "reference.jsonl").is_file()
    assert "--synthetic-acceptance 1,0.5,0,0,0,0,0 " in cell["sim_command"]
    # 1 + 1 + 0.5 tokens per request per step, within sampling error: the simulator accepted by the rates
    assert 1.2 < cell["predicted"]["tokens_per_step"] / 2 < 2.8
    md = flow.format_md([cell], {"all_lossless": True, "tie_flips": 0, "within_3pct": 0, "predicted_cells": 1,
                                 "median_steps_error": 0.0, "max_steps_error": 0.0},
                        {"config": v.cfg.to_json(), "machine": {}, "timed": False, "command": "x", "vllm_version": "0.32",
                         "semantics": "0.32", "sim_model": "smollm2-135m", "hybrid_additional_config": {}, "limit": 2,
                         "max_prompt": 800, "max_tokens": 12, "tie_epsilon": 0.25, "checklist": []})
    assert "losslessness is not claimed" in md and "Lossless: not claimed" in md and "| not claimed |" in md
    # vLLM's recorded budgets against the prediction's verified slots, step by step (real/validation/vllm/budgets.py)
    sim_v = cell["predicted"]["verified_slots"]
    budgets = [[["a", "b"], [8, 8], [7, 7], v, [[1.0] * 7] * 2] for v in sim_v]
    budgets[1][3] = 99  # B above the drafts scheduled: every one verified, 14
    cell2 = flow.cell_record(v, sl, 2, "adaptive", {**runs, "adaptive": dict(run, budgets=budgets)}, ref_path, None)
    want = sum(x == (14 if i == 1 else x) for i, x in enumerate(sim_v))
    assert cell2["budgets"] == {"steps": len(sim_v), "sim_steps": len(sim_v), "agree": want,
                                "first_diff": None if sim_v[1] == 14 else 1}
    write_reports(v.out, [cell2], {}, md=lambda *a: "", page=False)
    assert "verified_slots" not in (v.out / "fidelity.json").read_text()
    assert flow.budget_cell(None) == "-" and flow.budget_cell(cell2["budgets"]).startswith(f"{want} / {len(sim_v)}")
    assert flow.budget_cell({"steps": 5, "sim_steps": 6, "agree": 5, "first_diff": 5}) == "5 / 5 (sim 6); from 5"


def test_a_cell_with_a_tie_flip_is_predicted_on_its_own_outputs(tmp_path):
    """After a bf16 tie flip a run's later chains were drafted from its own continuation: the cell is predicted (and
    its chains graded) on its own outputs, not `none`'s; a cell without one keeps `none`'s."""
    from real.validation.options import ValidateOptions
    from real.validation.vllm import flow
    from real.validation.vllm.slices import write_reference

    a = ValidateOptions(engine="vllm", quick=True, policy=("none", "adaptive"), batch_size=(2,),
                        out=str(tmp_path / "v"), trace=("traces/codeedit.jsonl",), limit=2, max_tokens=6)
    v = flow.VllmValidation.from_args(a)
    sl = v.build.load_slice("traces/codeedit.jsonl", 2, v.max_prompt, 6, 0, v.cfg)
    ref = [list(range(100, 100 + m)) for m in sl.max_tokens]
    flipped = [list(o) for o in ref]
    flipped[0][2:] = [7] * (len(flipped[0]) - 2)  # a tie at position 2, then its own continuation
    ref_path = v.out / sl.stem / "bs2" / "reference.jsonl"
    write_reference(sl, ref, ref_path)

    def run(outputs):
        n = sum(map(len, outputs))
        return {"policy": "adaptive", "outputs": outputs, "output_tokens": n, "wall_s": 1.0, "tok_per_s": n, "steps": 5,
                "mean_latency_s": 0.5, "kv_capacity_tokens": 400000, "async_scheduling": True, "capture_sizes": [],
                "request_ids": list(sl.ids), "drafts": [], "spec": {},
                "cost_tables": {"draft_ms": [0.0, 0.4, 0.5], "verify_ms": [0.0] + [5.0] * 64}}

    margins = [[3.0] * len(o) for o in ref]
    margins[0][2] = 0.1
    none = {"outputs": ref, "margins": margins, "output_tokens": 1, "steps": 1, "tok_per_s": 1.0, "mean_latency_s": 1}
    cell = flow.cell_record(v, sl, 2, "adaptive", {"none": none, "adaptive": run(flipped)}, ref_path, None)
    assert cell["real"]["tie_flips"] == 1 and cell["real"]["lossless"] and cell["reference"] == "its own outputs (tie flips)"
    own = v.cell_dir(sl, 2, "adaptive") / "reference.jsonl"
    assert f"--trace {own} " in cell["sim_command"] and "7, 7" in own.read_text().replace(",7", ", 7")
    plain = flow.cell_record(v, sl, 2, "adaptive", {"none": none, "adaptive": run(ref)}, ref_path, None)
    assert plain["reference"] == "none's outputs" and f"--trace {ref_path} " in plain["sim_command"]


def test_the_prediction_starts_runcal_where_the_plugins_warm_up_left_it(tmp_path):
    """The plugin learns runcal's offsets in the warm-up generate too: the prediction of the timed one starts from
    the state recorded before it (hybrid_stats_before), in the command that reproduces it."""
    from real.validation.pipeline.predict import sim_command
    from real.validation.vllm.cells import sim_setup, warmup_runcal
    from real.validation.vllm.config import VllmRunConfig

    w = {"loaded": True, "runcal": {"offset": [-0.18, 0.02], "precision": [89.4, 74.3]}}
    run = {"hybrid_stats_before": {"workers": [w]}}
    assert warmup_runcal(run) == "dspark=-0.18/89.4,ngram=0.02/74.3"
    assert warmup_runcal({}) is None and warmup_runcal({"hybrid_stats_before": {"workers": [{"loaded": True}]}}) is None
    setup = sim_setup(VllmRunConfig(), "0.33", tmp_path / "ref.jsonl", tmp_path / "t.json", None, run, 0)
    assert setup.runcal_start == "dspark=-0.18/89.4,ngram=0.02/74.3"
    assert "--runcal-start dspark=-0.18/89.4,ngram=0.02/74.3" in sim_command(setup, "hybrid-vllm:runcal=64", 4)


def test_dummy_weights_offline_needs_the_targets_config_at_hand(tmp_path, monkeypatch):
    """--dummy-weights builds the model from the target's config.json: offline with a hub id that is not cached, or a
    local directory without one, is one line naming what to bring (python -m real.offline_bundle)."""
    from real.validation.vllm.flow import check_dummy_model
    from sim.infra.errors import ConfigError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # an empty hub cache
    with pytest.raises(ConfigError, match="no config.json of Org/never-cached is cached.*real.offline_bundle"):
        check_dummy_model("Org/never-cached")
    (tmp_path / "m").mkdir()
    with pytest.raises(ConfigError, match="has no config.json"):
        check_dummy_model(str(tmp_path / "m"))
    (tmp_path / "m" / "config.json").write_text("{}")
    check_dummy_model(str(tmp_path / "m"))  # a directory with its config: fine


def test_the_report_counts_the_replayed_choices_where_the_simulators_own_rule_differs():
    from real.validation.vllm.flow import replay_cell

    assert replay_cell(None) == "-" and replay_cell({"replay": None}) == "-"
    assert replay_cell({"replay": {"rows": 64, "rows_disagree": 1, "steps": 0, "steps_disagree": 0}}) == "64 / 1"
    assert replay_cell({"replay": {"rows": 58, "rows_disagree": 0, "steps": 58, "steps_disagree": 28}}) == \
        "58 / 0; 58 / 28"
