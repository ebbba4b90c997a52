"""What a new user meets first (issue 31): advice a user can deploy, output in vLLM's terms, errors that say
what to do next, stdout that holds only what was asked for."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli_inprocess

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "trace"
TINY = ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl"


def _env(tmp_path):
    return {"HYBRIDSPEC_CACHE_DIR": str(tmp_path / "cache")}


# ------------------------------------------------------------------------------------------ trace errors
@pytest.mark.parametrize("name, fmt", [("sharegpt.json", "sharegpt"), ("mooncake.jsonl", "mooncake"),
                                       ("vllm_custom.jsonl", "vllm-custom"), ("burstgpt.csv", "burstgpt"),
                                       ("azure.csv", "azure"), ("vidur_replay.csv", "vidur")])
def test_raw_format_error_names_the_converter(tmp_path, name, fmt):
    p = run_cli_inprocess("sim.api.run", "--trace", FIX / name, "--policy", "none", "--batch-size", "1", "--no-progress",
                          cwd=ROOT, env=_env(tmp_path))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    line = p.stderr.strip()
    assert len(line.splitlines()) == 1, p.stderr
    assert f"python -m sim.trace convert --from {fmt} {FIX / name} -o OUT.jsonl" in line, line


def test_a_bad_hybridspec_trace_gets_no_converter_hint(tmp_path):
    bad = tmp_path / "t.jsonl"
    bad.write_text(TINY.read_text().splitlines()[0] + "\n{oops\n")
    p = run_cli_inprocess("sim.api.run", "--trace", bad, "--policy", "none", "--batch-size", "1", cwd=ROOT, env=_env(tmp_path))
    assert p.returncode == 2 and ":2: not valid JSON" in p.stderr and "convert" not in p.stderr


def test_stats_workloads_line_of_a_trace_without_workloads(tmp_path):
    conv = tmp_path / "c.jsonl"
    p = run_cli_inprocess("sim.core.trace", "convert", "--from", "sharegpt", FIX / "sharegpt.json", "-o", conv,
                          cwd=ROOT, env=_env(tmp_path))
    assert p.returncode == 0, p.stderr
    p = run_cli_inprocess("sim.core.trace", "stats", conv, cwd=ROOT, env=_env(tmp_path))
    assert p.returncode == 0, p.stderr
    line = next(x for x in p.stdout.splitlines() if x.strip().startswith("workloads"))
    assert "-=" not in line and "none named" in line, line
    mixed = tmp_path / "m.jsonl"
    rows = [json.loads(x) for x in TINY.read_text().splitlines()[:3]]
    for r in rows:
        r.pop("workload", None)
    rows[0]["workload"] = "code"
    mixed.write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = run_cli_inprocess("sim.core.trace", "stats", mixed, cwd=ROOT, env=_env(tmp_path))
    line = next(x for x in p.stdout.splitlines() if x.strip().startswith("workloads"))
    assert "code=1" in line and "no workload field=2" in line, line


# ------------------------------------------------------------------------------------------ stdout holds only JSON
def test_eval_drafter_json_stdout_is_json_only(tmp_path, monkeypatch):
    """The data collection's log lines go to stderr: `--json`'s stdout loads as JSON."""
    import real.validation.eval_drafter as ev

    figures = {"trace": "t", "requests": 1}

    def fake_evaluate(trace, limit, max_tokens, max_prompt, drafter, progress=True, timing=True, log=print):
        log("data: 1 prompts from t")  # what real.drafter.data.collect_with_ids logs
        return figures, [], [], []

    monkeypatch.setattr(ev, "evaluate_trace", fake_evaluate)
    drafter = tmp_path / "d.pt"
    drafter.write_bytes(b"x")
    p = run_cli_inprocess("real.validation.eval_drafter", "--trace", FIX / "text.jsonl", "--drafter", drafter, "--json",
                          "--no-timing", "--no-progress", cwd=ROOT, env=_env(tmp_path))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == figures
    assert "data: 1 prompts" in p.stderr


# ------------------------------------------------------------------------------------------ advice and notes
def _row(policy, x, bs=4):
    return {"policy": policy, "batch_size": bs, "speedup_vs_baseline": x, "output_throughput_tok_s": 1000 * x}


def test_verdict_recommends_what_a_server_can_run_and_names_the_rest_by_tier():
    from sim.api.console import not_deployable, verdicts

    assert not_deployable("hybrid-tree") == "needs tree attention" and not_deployable("oracle") == "upper bound"
    assert not_deployable("hybrid") is None and not_deployable("adaptive") is None
    rows = [_row("none", 0.3), _row("adaptive", 1.0), _row("vllm-ngram:32", 2.4), _row("hybrid-vllm:slots=32", 2.5),
            _row("hybrid", 2.54), _row("ngram-fixed:32", 2.53), _row("hybrid-tree", 2.60), _row("oracle", 2.75)]
    lines = verdicts(rows, "adaptive")
    # the plugin's hybrid is the fastest servable setup; the simulated-only hybrid is faster but not recommended
    assert lines[0].startswith("batch 4: recommended hybrid-vllm:slots=32, 2.500x adaptive, with hybridspec's vLLM "
                               "plugin; speculation pays: 8.33x none; runner-up vllm-ngram:32 2.400x adaptive (margin 4.2%)"), lines[0]
    assert any(x.startswith("  best in vLLM 0.33 today: vllm-ngram:32 2.400x") for x in lines), lines
    last = lines[-1]
    assert "simulated only (vLLM's engine would need changes): hybrid 2.540x adaptive, ngram-fixed:32 2.530x" in last
    assert "needs tree attention: hybrid-tree 2.600x" in last and "upper bound: per-step oracle 2.750x" in last
    # speculation that does not pay: none is recommended, in so many words
    (line,) = verdicts([_row("none", 1.2), _row("adaptive", 1.0)], "adaptive")
    assert "recommended none" in line and "speculation does not pay here" in line
    # one setup alone is not called the fastest of anything
    (line,) = verdicts([_row("vllm-ngram:8", 0.9)], None)
    assert line.endswith("(the only setup run: nothing to rank it against)"), line
    # no baseline: ranked by throughput
    (line, rest) = verdicts([_row("vllm-ngram:8", 0.9), _row("hybrid-tree", 1.2)], None)
    assert "recommended vllm-ngram:8, 900 tok/s, in vLLM 0.33 today" in line and "hybrid-tree 1,200 tok/s" in rest


def test_a_tie_at_four_digits_ranks_the_same_whatever_order_the_rows_come_in():
    """The verdict and paper.md's "What to serve" rank one set of rows in different orders (the sweep's completion
    order, the report's columns): a tie at 4 significant digits goes to the baseline, then to the better unrounded
    figure, so both name the same setup (they named two at codeedit batch 256: 11,187 and 11,195 tok/s)."""
    from sim.api.console import rank_key, verdicts

    rows = [_row("adaptive", 1.0), _row("hybrid-vllm:slots=32:runcal=64", 11.18689),
            _row("hybrid-vllm:slots=32:skip:runcal=64:tail=0.05", 11.19481)]
    for order in (rows, rows[::-1]):
        assert verdicts(order, "adaptive")[0].startswith("batch 4: recommended hybrid-vllm:slots=32:skip:runcal=64:"
                                                         "tail=0.05, 11.195x adaptive"), verdicts(order, "adaptive")
    # the baseline still wins its tie; a lower-is-better figure ranks the other way
    assert min(["x", "adaptive"], key=lambda p: rank_key(1000.04 if p == "x" else 1000.0, p, "adaptive")) == "adaptive"
    assert min(["a", "b"], key=lambda p: rank_key({"a": 2.0001, "b": 2.0002}[p], p, None, lower=True)) == "a"


def test_verdict_prints_the_flags_that_run_the_recommendation():
    from sim.api.console import verdicts
    from sim.core.deploy import Deployment

    dep = Deployment(model="qwen3-8b", hf_id="Qwen/Qwen3-8B", version="0.33", drafter="dspark-qwen3-b7", block=7,
                     ngram_range=(2, 5))
    lines = verdicts([_row("adaptive", 1.0), _row("vllm-ngram:16", 1.5)], "adaptive", deployment=dep)
    assert lines[1].strip() == ("VLLM_USE_V2_MODEL_RUNNER=1 vllm serve Qwen/Qwen3-8B --max-num-seqs 4 --speculative-config "
                                "'{\"method\":\"ngram\",\"num_speculative_tokens\":16,\"prompt_lookup_min\":2,"
                                "\"prompt_lookup_max\":5}'")
    lines = verdicts([_row("adaptive", 1.0), _row("hybrid-vllm:margin=0.5:slots=32:skip", 1.5)], "adaptive", deployment=dep)
    assert ('--speculative-config \'{"method":"dspark","model":"deepseek-ai/dspark_qwen3_8b_block7",'
            '"num_speculative_tokens":32,"enable_adaptive_verification":true}\' --additional-config '
            '\'{"hybrid_spec":{"margin":0.5,"slots":32,"skip":true}}\'') in lines[1]
    assert lines[2].startswith("  the plugin: install") and "best in vLLM 0.33 today: adaptive" in lines[3]
    # a target without a published DSpark checkpoint gets the reason, never another target's checkpoint
    llama = Deployment(model="llama-3.1-8b", hf_id="meta-llama/Llama-3.1-8B-Instruct", version="0.33",
                       drafter="dspark-qwen3-b7", block=7, ngram_range=(2, 5))
    lines = verdicts([_row("adaptive", 1.0), _row("none", 0.5), _row("vllm-ngram:8", 0.8)], "adaptive",
                     deployment=llama)
    # ... and its figures over none, which it can serve, not over the baseline it cannot (issue 62)
    assert lines[0].startswith("batch 4: recommended vllm-ngram:8, 1.600x none, in vLLM 0.33 today"), lines
    assert lines[1].startswith("  over none (no speculation), not the baseline adaptive: adaptive cannot be served")
    assert lines[2].strip().startswith("VLLM_USE_V2_MODEL_RUNNER=1 vllm serve meta-llama/Llama-3.1-8B-Instruct "
                                       "--max-num-seqs 4")
    assert lines[3].startswith("  faster but without vLLM flags for this target: adaptive 2.000x none (no "
                               "published dspark drafter checkpoint for llama-3.1-8b")
    # an EAGLE run's adaptive verification has no vLLM flags (adaptive verification needs DSpark's confidence head)
    eagle_ad = Deployment(model="llama-3.1-8b", hf_id="meta-llama/Llama-3.1-8B-Instruct", version="0.33",
                          drafter="eagle3-llama3.1-8b:3", block=3)
    lines = verdicts([_row("adaptive", 1.0), _row("none", 0.5)], "adaptive", deployment=eagle_ad)
    assert "recommended none" in lines[0] and "need method 'dspark'" in lines[1] and "need method 'dspark'" in lines[3]
    eagle = Deployment(model="llama-3.1-8b", hf_id="meta-llama/Llama-3.1-8B-Instruct", version="0.33",
                       drafter="eagle3-llama3.1-8b:3", block=3)
    lines = verdicts([_row("adaptive", 1.0), _row("model-fixed:3", 1.3)], "adaptive", deployment=eagle)
    assert '"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.1-Instruct-8B","num_speculative_tokens":3' in lines[1]


def test_with_arrivals_the_verdict_ranks_by_latency_when_throughput_is_arrival_bound():
    from sim.api.console import arrival_bound, verdicts

    def row(policy, tput, tpot, dur, last=100.0):
        return {"policy": policy, "batch_size": 8, "arrivals": "poisson", "last_arrival_s": last, "duration": dur,
                "output_throughput_tok_s": tput, "median_tpot_ms": tpot, "median_e2el_ms": 400.0,
                "speedup_vs_baseline": tput / 1000}

    rows = [row("adaptive", 1000, 2.0, 101), row("vllm-ngram:32", 1010, 0.6, 100.5), row("none", 500, 9.0, 200)]
    assert arrival_bound(rows[0]) and not arrival_bound(rows[2])
    lines = verdicts(rows, "adaptive")
    assert lines[0] == ("batch 8: throughput is arrival-bound (1,000-1,010 tok/s for the 2 setups that keep up): "
                        "ranked by median TPOT, lower is better (TTFT and E2EL: --format json)")
    assert lines[1].startswith("batch 8: recommended vllm-ngram:32, TPOT 0.60 ms, in vLLM 0.33 today; "
                               "speculation pays: 15.00x none; runner-up adaptive TPOT 2.00 ms (margin 233.3%)"), lines[1]
    # a long last request decoding after the last arrival is no backlog: nobody waited for a batch slot
    tail = dict(row("adaptive", 400, 2.0, 300), median_ttft_ms=30.0, mean_step_ms=5.0)
    assert arrival_bound(tail) and not arrival_bound(dict(tail, median_ttft_ms=5000.0))
    # all at t = 0: never arrival-bound, ranked by throughput
    at0 = [dict(r, arrivals="all at t=0") for r in rows]
    assert "recommended vllm-ngram:32, 1.010x adaptive" in verdicts(at0, "adaptive")[0]


def _run(tmp_path, *args):
    return run_cli_inprocess("sim.api.run", "--trace", TINY, "--workers", "1", "--no-progress", *args, cwd=ROOT,
                             env=_env(tmp_path))


def test_note_when_every_request_arrives_at_zero(tmp_path):
    p = _run(tmp_path, "--policy", "none", "--batch-size", "2")
    assert p.returncode == 0 and "all requests arrive at t = 0" in p.stdout
    p = _run(tmp_path, "--policy", "none", "--batch-size", "2", "--request-rate", "5")
    assert p.returncode == 0 and "arrive at t = 0" not in p.stdout


def test_speculative_config_runs_what_it_names_and_skips_batches_past_the_trace(tmp_path):
    five = tmp_path / "five.jsonl"
    five.write_text("".join(TINY.read_text().splitlines(keepends=True)[:5]))
    spec = '{"method": "ngram", "num_speculative_tokens": 8}'
    p = run_cli_inprocess("sim.api.run", "--trace", five, "--workers", "1", "--no-progress", "--format", "json",
                          "--speculative-config", spec, cwd=ROOT, env=_env(tmp_path))
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert [(r["policy"], r["batch_size"]) for r in rows] == [("vllm-ngram:8", 4)]  # vLLM's n-gram as it runs; 128 > 5 requests: skipped
    assert "batch size 128 skipped: the trace has only 5 requests" in p.stderr
    assert "batch sizes 4 and 128 (the defaults)" in p.stderr and "--baseline POLICY" in p.stderr
    p = run_cli_inprocess("sim.api.run", "--trace", five, "--workers", "1", "--no-progress", "--format", "json",
                          "--policy", "hybrid", "--batch-size", "8", "--batch-size", "16", cwd=ROOT, env=_env(tmp_path))
    rows = json.loads(p.stdout)  # every size past the trace: the smallest runs (the others would be identical)
    assert {r["batch_size"] for r in rows} == {8} and {r["policy"] for r in rows} == {"adaptive", "hybrid"}
    assert "running the baseline 'adaptive' too" in p.stderr
    p = run_cli_inprocess("sim.api.run", "--trace", five, "--workers", "1", "--no-progress", "--format", "json",
                          "--policy", "hybrid", "--batch-size", "2", "--no-baseline", cwd=ROOT, env=_env(tmp_path))
    assert [r["policy"] for r in json.loads(p.stdout)] == ["hybrid"]
    p = run_cli_inprocess("sim.api.run", "--trace", five, "--policy", "hybrid", "--baseline", "adaptive", "--no-baseline",
                          cwd=ROOT, env=_env(tmp_path))
    assert p.returncode == 2 and "exclude each other" in p.stderr


# ------------------------------------------------------------------------------------------ help text
def _help(module: str, capsys) -> str:
    import importlib

    with pytest.raises(SystemExit):
        importlib.import_module(module).parse_args(["--help"])
    return capsys.readouterr().out


@pytest.mark.parametrize("module", ["sim.api.run", "sim.api.sweep"])
def test_help_is_grouped_without_doubled_defaults(module, capsys):
    out = _help(module, capsys)
    flat = " ".join(out.split())
    assert "(default: None)" not in flat
    assert not re.search(r"default: [^()]*\(default:", flat), "a default printed twice"
    sections = [x.rstrip(":") for x in out.splitlines() if re.fullmatch(r"[a-z][a-z ]*:", x)]
    for title in ("workload", "model and hardware", "speculation", "output"):
        assert title in sections, sections
    assert len(out.splitlines()) - 3 * len(sections) > 0
    if module == "sim.api.run":
        assert flat.count("default: 4 128") == 1


def test_model_means_the_same_in_every_command():
    """--model takes a models/llms name or its Hugging Face id everywhere (sim.api.run's meaning)."""
    import real.validation.gpu_check as gc
    import real.validation.profile as prof
    import real.validation.validate as val
    from sim.core.models import llm_name

    for parse in (val.parse_args, prof.parse_args, gc.parse_args):
        assert parse(["--model", "HuggingFaceTB/SmolLM2-135M-Instruct"]).model == "smollm2-135m"
        assert parse(["--model", "Qwen/Qwen3-8B"]).model == "qwen3-8b" == llm_name("Qwen/Qwen3-8B")


def test_validate_help_is_grouped(capsys):
    import real.validation.validate as val

    out = _help_of(val.parse_args, capsys)
    sections = [x.rstrip(":") for x in out.splitlines() if re.fullmatch(r"[a-z][a-zA-Z ()',;./]*:", x)]
    for title in ("what runs", "workload", "model and hardware (torch engine)", "vLLM engine", "output"):
        assert title in sections, sections
    assert "(default: None)" not in " ".join(out.split())


def test_validate_help_describes_quick_for_both_engines(capsys):
    import real.validation.validate as val

    out = " ".join(_help_of(val.parse_args, capsys).split())
    quick = out[out.index("--quick checks the pipeline, not fidelity"):][:300]
    assert "torch" in quick and "vllm" in quick


def _help_of(parse, capsys) -> str:
    with pytest.raises(SystemExit):
        parse(["--help"])
    return capsys.readouterr().out


def test_sweep_prints_vllm_format(tmp_path):
    p = run_cli_inprocess("sim.api.sweep", "--trace", TINY, "--policy", "hybrid", "--batch-size", "2", "--workers", "1",
                          "--no-progress", "--format", "vllm", "--out", tmp_path / "s", cwd=ROOT, env=_env(tmp_path))
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("Output token throughput (tok/s):") == 2  # hybrid and the baseline


# ------------------------------------------------------------------------------------------ vLLM's spec-decode figures
@pytest.mark.parametrize("policy", ["adaptive", "hybrid", "ngram-fixed:8", "hybrid-tree"])
def test_spec_decode_counts_native_and_reference_agree(policy, monkeypatch):
    """Drafts by accepted length: the native step (engine_step.c) and the numpy definition give the same counts,
    and they add up to the step columns' accepted tokens."""
    from sim.api.run import SimSetup, prepare, run_one

    prep = prepare(SimSetup(trace=str(TINY)))
    got = {}
    for ref in ("0", "1"):
        monkeypatch.setenv("HYBRIDSPEC_REFERENCE_ENGINE", ref)
        row, res = run_one(prep, policy, 4)
        got[ref] = (res.accepted_hist.copy(), row)
    (h0, row), (h1, _) = got["0"], got["1"]
    assert (h0 == h1).all() and h0.sum() > 0
    accepted = int(res.steps["accepted_model"].sum() + res.steps["accepted_ngram"].sum())
    assert int((np.arange(len(h0)) * h0).sum()) == accepted == row["accepted_tokens"]
    assert row["num_drafts"] == h0.sum() and row["acceptance_length"] == pytest.approx(1 + accepted / h0.sum())
    per = row["acceptance_per_position"]
    assert all(a >= b for a, b in zip(per, per[1:])) and sum(per) == pytest.approx(accepted / h0.sum())
    assert row["draft_tokens"] >= row["accepted_tokens"]


def test_format_vllm_has_the_spec_decode_section(tmp_path):
    p = _run(tmp_path, "--policy", "ngram-fixed:8", "--batch-size", "2", "--format", "vllm", "--no-baseline")
    assert p.returncode == 0, p.stderr
    for label in ("Speculative Decoding", "Acceptance rate (%):", "Acceptance length:", "Drafts:", "Draft tokens:",
                  "Accepted tokens:", "Per-position acceptance (%):", "  Position 0:"):
        assert label in p.stdout, label
    assert "Position 8:" not in p.stdout  # K = 8: positions 0..7
    p = _run(tmp_path, "--policy", "none", "--batch-size", "2", "--format", "vllm", "--no-baseline")
    assert "Speculative Decoding" not in p.stdout  # nothing drafted: vLLM prints no such section either


# ------------------------------------------------------------------------------------------ tokens per step
def test_fidelity_names_its_engine_wide_tokens_per_step():
    """tok/step is per request per step everywhere (sim.api.run, sim.api.sweep); fidelity.md's engine-wide figure is
    named `tok/engine step` and defined under the table (an old fidelity.json's key still reads)."""
    from real.validation.fidelity import format_md

    meta = {"command": "c", "machine": {}, "model": "m", "mode": "real", "max_tokens": 1, "max_prompt": 1}
    agg = {"median_error": 0.0, "max_error": 0.0, "median_step_error": 0.0, "median_synthetic_error": 0.0,
           "all_lossless": True}
    side = {"tok_per_s": 1.0, "steps": 2, "mean_latency_s": 1.0}
    for key in ("tokens_per_engine_step", "tokens_per_step"):
        cell = {"trace": "t.jsonl", "policy": "none", "batch_size": 4, "requests": 4, "predicted_error": 0.0,
                "synthetic_error": 0.0, "step_error_median": 0.0, "real": {**side, key: 3.5}, "predicted": side,
                "synthetic": side}
        md = format_md([cell], agg, meta)
        assert "| tok/engine step |" in md and "| tok/step |" not in md and "| 3.50 |" in md
        assert "tok/engine step: output tokens per engine step" in md
    for page in ("fidelity-slice16.md", "fidelity-agreement.md", "fidelity-drafter.md"):
        text = (ROOT / "reports" / page).read_text()
        assert "| tok/step |" not in text and "tok/engine step" in text


def test_trace_convert_has_no_other_model_flag(tmp_path):
    """sim.core.trace convert's BurstGPT row filter is --burstgpt-model: --model means the served model only."""
    out = tmp_path / "b.jsonl"
    p = run_cli_inprocess("sim.core.trace", "convert", "--from", "burstgpt", FIX / "burstgpt.csv", "-o", out,
                          "--burstgpt-model", "all", cwd=ROOT, env=_env(tmp_path))
    assert p.returncode == 0, p.stderr
    p = run_cli_inprocess("sim.core.trace", "convert", "--from", "burstgpt", FIX / "burstgpt.csv", "-o", tmp_path / "c.jsonl",
                          "--model", "all", cwd=ROOT, env=_env(tmp_path))
    assert p.returncode == 2
