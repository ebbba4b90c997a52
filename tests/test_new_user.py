"""What a new user meets first (issue 31): advice a user can deploy, output in vLLM's terms, errors that say
what to do next, stdout that holds only what was asked for."""
from __future__ import annotations

import json
from pathlib import Path

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
    p = run_cli_inprocess("sim.run", "--trace", FIX / name, "--policy", "none", "--batch-size", "1", "--no-progress",
                          cwd=ROOT, env=_env(tmp_path))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    line = p.stderr.strip()
    assert len(line.splitlines()) == 1, p.stderr
    assert f"python -m sim.trace convert --from {fmt} {FIX / name} -o OUT.jsonl" in line, line


def test_a_bad_hybridspec_trace_gets_no_converter_hint(tmp_path):
    bad = tmp_path / "t.jsonl"
    bad.write_text(TINY.read_text().splitlines()[0] + "\n{oops\n")
    p = run_cli_inprocess("sim.run", "--trace", bad, "--policy", "none", "--batch-size", "1", cwd=ROOT, env=_env(tmp_path))
    assert p.returncode == 2 and ":2: not valid JSON" in p.stderr and "convert" not in p.stderr


def test_stats_workloads_line_of_a_trace_without_workloads(tmp_path):
    conv = tmp_path / "c.jsonl"
    p = run_cli_inprocess("sim.trace", "convert", "--from", "sharegpt", FIX / "sharegpt.json", "-o", conv,
                          cwd=ROOT, env=_env(tmp_path))
    assert p.returncode == 0, p.stderr
    p = run_cli_inprocess("sim.trace", "stats", conv, cwd=ROOT, env=_env(tmp_path))
    assert p.returncode == 0, p.stderr
    line = next(x for x in p.stdout.splitlines() if x.strip().startswith("workloads"))
    assert "-=" not in line and "none named" in line, line
    mixed = tmp_path / "m.jsonl"
    rows = [json.loads(x) for x in TINY.read_text().splitlines()[:3]]
    for r in rows:
        r.pop("workload", None)
    rows[0]["workload"] = "code"
    mixed.write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = run_cli_inprocess("sim.trace", "stats", mixed, cwd=ROOT, env=_env(tmp_path))
    line = next(x for x in p.stdout.splitlines() if x.strip().startswith("workloads"))
    assert "code=1" in line and "no workload field=2" in line, line


# ------------------------------------------------------------------------------------------ stdout holds only JSON
def test_eval_drafter_json_stdout_is_json_only(tmp_path, monkeypatch):
    """The data collection's log lines go to stderr: `--json`'s stdout loads as JSON."""
    import real.eval_drafter as ev

    figures = {"trace": "t", "requests": 1}

    def fake_evaluate(trace, limit, max_tokens, max_prompt, drafter, progress=True, timing=True, log=print):
        log("data: 1 prompts from t")  # what real.drafter.data.collect_with_ids logs
        return figures, [], [], []

    monkeypatch.setattr(ev, "evaluate_trace", fake_evaluate)
    drafter = tmp_path / "d.pt"
    drafter.write_bytes(b"x")
    p = run_cli_inprocess("real.eval_drafter", "--trace", FIX / "text.jsonl", "--drafter", drafter, "--json",
                          "--no-timing", "--no-progress", cwd=ROOT, env=_env(tmp_path))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == figures
    assert "data: 1 prompts" in p.stderr
