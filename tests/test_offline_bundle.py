"""`python -m real.offline_bundle`: the downloads an offline GPU box needs (the requirements of `.[vllm]` read from
pyproject, vLLM 0.33 among them, the target's config and tokenizer only unless --weights), printed before they run;
--dry-run writes nothing; OFFLINE.md names the bundle's own paths; bad input is one line."""
import json

from conftest import run_cli_inprocess
from real.validation import offline

MODULE = "real.offline_bundle"


def test_the_plan_reads_pyproject_and_fetches_config_and_tokenizer_only_without_weights(tmp_path):
    req = offline.requirements()
    assert "vllm==0.33.0" in req and any(r.startswith("setuptools") for r in req) and "numpy>=1.26" in req
    steps = offline.plan(tmp_path, "Qwen/Qwen3-8B", False, "3.11", "manylinux_2_28_x86_64")
    pip = steps[0].argv
    assert pip[pip.index("--python-version") + 1] == "3.11" and "--only-binary=:all:" in pip and "vllm==0.33.0" in pip
    assert steps[-1].repo == "Qwen/Qwen3-8B" and "config.json" in steps[-1].patterns and "tokenizer.json" in steps[-1].patterns
    full = offline.plan(tmp_path, "Qwen/Qwen3-8B", True, "3.11", "manylinux_2_28_x86_64")
    assert full[2].patterns is None and full[3].repo and full[3].folder.parent == tmp_path / "models"


def test_dry_run_prints_and_writes_nothing_and_a_run_writes_the_box_steps(tmp_path, monkeypatch):
    out = tmp_path / "bundle"
    r = run_cli_inprocess(MODULE, "--out", out, "--dry-run")
    assert r.returncode == 0 and "pip download" in r.stdout and "hub snapshot Qwen/Qwen3-8B" in r.stdout
    assert not out.exists()
    seen = []
    monkeypatch.setattr(offline, "fetch", lambda d: (seen.append(d.what) or True, "done"))
    r = run_cli_inprocess(MODULE, "--out", out)
    assert r.returncode == 0, r.stderr
    assert seen == ["the requirements' wheels", "this project's wheel", "the target's config and tokenizer"]
    md = (out / "OFFLINE.md").read_text()
    assert f"--find-links {out.resolve()}/wheels -e '.[vllm]'" in md and "--dummy-weights" in md
    assert f"--vllm-model {out.resolve()}/models/Qwen3-8B" in md and "HF_HUB_OFFLINE=1" in md
    monkeypatch.setattr(offline, "fetch", lambda d: (False, "ERROR: No matching distribution"))
    r = run_cli_inprocess(MODULE, "--out", tmp_path / "b2")
    assert r.returncode == 1 and "FAIL the requirements' wheels: ERROR: No matching distribution" in r.stdout


def test_bad_input_is_one_line(tmp_path):
    r = run_cli_inprocess(MODULE, "--out", tmp_path / "o", "--vllm-model", "foo/bar", "--dry-run")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "no models/llms spec" in r.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text(json.dumps({}))
    r = run_cli_inprocess(MODULE, "--out", tmp_path / "full")
    assert r.returncode == 2 and "already holds files" in r.stderr and len(r.stderr.strip().splitlines()) == 1
