"""real/vllm_smoke.py: on this CPU machine (no vLLM 0.33, no GPU) it prints the versions and every step's command,
then fails with one line and writes nothing; with the preflight passed and the GPU work faked, each step runs within
its cap, its command is printed, the checklist is called as real.validation.vllm.checks.run_checklist takes it, and
vllm_smoke.json records every step."""
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli_inprocess
from real.validation import vllm_smoke
from real.validation.vllm import checks

ROOT = Path(__file__).resolve().parents[1]
MODULE = "real.validation.vllm_smoke"


def _needs_no_gpu():
    from real.vllm_plugin.versions import installed_build
    import torch

    got = installed_build()
    if torch.cuda.is_available() and got and got[0] == "vllm":
        pytest.skip("this machine has vLLM and a GPU: the smoke test would run")


def test_cpu_machine_fails_with_one_line_after_the_commands(tmp_path):
    _needs_no_gpu()
    out = tmp_path / "smoke"
    r = subprocess.run([sys.executable, "real/vllm_smoke.py", "--out", str(out)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the vLLM smoke test needs vLLM 0.33.x and a CUDA GPU"), r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    lines = r.stdout.splitlines()
    for name in ("gpu", "NVIDIA driver", "CUDA (torch's build)", "torch", "vLLM"):
        assert any(ln.startswith(f"{name}: ") for ln in lines), name
    cmd = {ln.split(":", 1)[0].strip(): ln.split(":", 1)[1] for ln in lines if ln.startswith("  ")}
    assert "python real/validate.py --engine vllm --vllm-device cuda --dry-run --quick" in cmd["plan"]
    assert "run_checklist" in cmd["checklist"] and "4 prompts" in cmd["checklist"] and "x 32 tokens" in cmd["checklist"]
    assert "bench forward" in cmd["bench"] and "--output-json" in cmd["bench"]
    assert not out.exists()


def test_bad_input_is_one_line(tmp_path):
    r = run_cli_inprocess(MODULE, "--out", tmp_path / "o", "--trace", tmp_path / "missing.jsonl")
    assert r.returncode == 2 and r.stderr.strip() == f"error: --trace {tmp_path / 'missing.jsonl'}: file not found"
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    r = run_cli_inprocess(MODULE, "--out", tmp_path / "full")
    assert r.returncode == 2 and "already holds files" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_steps_run_in_order_with_the_gpu_work_faked(tmp_path, monkeypatch):
    seen = []

    def child(self, argv, log, cap, env=None):
        seen.append((argv, cap))
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("plan line 1\nplan line 2\n")
        if "--output-json" in argv:
            Path(argv[argv.index("--output-json") + 1]).write_text(json.dumps([{"case": "verify_r1", "median_us": 2500}]))
        return 0

    def run_checklist(*a, **kw):
        inspect.signature(checks.run_checklist).bind(*a, **kw)  # called as the real entry point takes it
        return [checks.CheckResult("a", "PASS", "1 worker"), checks.CheckResult("d", "FAIL", "request 2 differs")]

    monkeypatch.setattr(vllm_smoke, "preflight", lambda: None)
    monkeypatch.setattr(vllm_smoke.Smoke, "child", child)
    monkeypatch.setattr(checks, "run_checklist", run_checklist)
    out = tmp_path / "smoke"
    r = run_cli_inprocess(MODULE, "--out", out, "--budget-s", "200")
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads((out / "vllm_smoke.json").read_text())
    steps = {s["name"]: s for s in doc["steps"]}
    assert [s["name"] for s in doc["steps"]] == ["plan", "checklist", "bench"] and not doc["passed"]
    assert steps["plan"]["status"] == "pass" and "2 lines" in steps["plan"]["detail"]
    assert steps["checklist"]["status"] == "fail" and "(d) request 2 differs" in steps["checklist"]["detail"]
    assert steps["bench"]["status"] == "pass" and "verify_r1 2.50 ms" in steps["bench"]["detail"]
    assert seen[0][0][:3] == ["python", "real/validate.py", "--engine"] and "bench" in seen[1][0]
    assert all(cap <= 200 for _, cap in seen)
    for name in ("plan", "checklist", "bench"):
        assert f"== {name} (cap " in r.stdout and f"$ {steps[name]['command']}" in r.stdout
    assert "[d] FAIL" in r.stdout and "2 of 3 steps passed" in r.stdout


def test_a_missing_plugin_entry_point_is_refused_in_one_line(monkeypatch):
    """vLLM 0.33 and a GPU present but the checkout never `pip install -e`'d: one line before any GPU work (else every
    hybrid cell would run plain DSpark); and the entry point named is pyproject's."""
    import tomllib
    from importlib import metadata

    from real.vllm_plugin import versions
    from sim.infra.errors import ConfigError

    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert eps[versions.ENTRY_POINT_GROUP] == dict([versions.ENTRY_POINT])
    monkeypatch.setattr(vllm_smoke, "installed_build", lambda: ("vllm", "0.33.0"))
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr(metadata, "entry_points", lambda group: [])
    with pytest.raises(ConfigError) as e:
        vllm_smoke.preflight()
    msg = str(e.value)
    assert "\n" not in msg and "entry point" in msg and "plain DSpark" in msg and "pip install -e '.[vllm]'" in msg
    ep = metadata.EntryPoint(versions.ENTRY_POINT[0], versions.ENTRY_POINT[1], versions.ENTRY_POINT_GROUP)
    monkeypatch.setattr(metadata, "entry_points", lambda group: [ep] if group == versions.ENTRY_POINT_GROUP else [])
    vllm_smoke.preflight()  # everything present: no error
