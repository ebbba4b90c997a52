"""What a new user hits (issue 47): torch's thread count left as it was, `validate --quick` honest about its time and
its figures, outputs that stay small (steps opt-in; report.html carries plotly.js since issue 62; `python -m sim.cache`),
and the smaller points (help that lists methods and policies, bundled traces from any folder, ShareGPT JSONL, the
progress clock, "did you mean")."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import run_cli_inprocess

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl"
FIX = ROOT / "tests" / "fixtures" / "trace"


def _env(tmp_path: Path) -> dict:
    return {"HYBRIDSPEC_CACHE_DIR": str(tmp_path / "cache")}


def _run(tmp_path, *args, cwd=ROOT):
    return run_cli_inprocess("sim.api.run", "--trace", TINY, "--batch-size", "2", "--workers", "1", "--no-progress",
                             *args, cwd=cwd, env=_env(tmp_path))


# ------------------------------------------------------------------------------------------ torch threads
def test_a_one_worker_sweep_runs_on_one_thread_and_gives_the_count_back(tmp_path, monkeypatch):
    import sim.api.sweep as sw

    before = torch.get_num_threads()
    seen = []
    real_cell = sw.run_cell

    def spy(cell):
        seen.append(torch.get_num_threads())
        return real_cell(cell)

    monkeypatch.setattr(sw, "run_cell", spy)
    torch.set_num_threads(2)
    try:
        p = run_cli_inprocess("sim.api.sweep", "--trace", TINY, "--policy", "adaptive", "--batch-size", "2",
                              "--workers", "1", "--no-progress", "--out", tmp_path / "s", cwd=ROOT, env=_env(tmp_path))
        assert p.returncode == 0, p.stderr
        assert seen == [1]  # the cell ran as a worker runs it
        assert torch.get_num_threads() == 2  # and the caller has its own count back
    finally:
        torch.set_num_threads(before)


def test_the_guard_fails_a_test_that_leaves_the_thread_count_changed(tmp_path):
    """tests/conftest.py's guard, on a test file of one leaking and one clean test: the leak is an error of that
    test alone (the count is put back before the next)."""
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_leak.py").write_text(
        "import torch\n\n"
        "def test_leaks():\n    torch.set_num_threads(torch.get_num_threads() + 1)\n\n"
        "def test_after():\n    pass\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_leak.py"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout[-2000:]
    assert "2 passed, 1 error" in p.stdout and "left torch.get_num_threads()" in p.stdout, p.stdout[-2000:]
    assert "ERROR test_leak.py::test_leaks" in p.stdout


# ------------------------------------------------------------------------------------------ validate --quick
def test_the_estimate_follows_this_machines_probe():
    from real.validation.validate import ESTIMATE_PROBE_MS, estimate_minutes, machine_speed

    assert machine_speed(dict(ESTIMATE_PROBE_MS, context=256, repeat=3)) == pytest.approx(1.0)
    slow = {k: 3 * v for k, v in ESTIMATE_PROBE_MS.items()}
    assert machine_speed(slow) == pytest.approx(3.0)
    assert machine_speed({"1x1": 90.0}) == pytest.approx(2.0)  # a probe without the batched shape (batch 1 only)
    prof = {"limit": 6, "max_tokens": 16, "repeats": 1}
    quick = estimate_minutes(1, 3, 16, 2, [1, 4], 1, prof)
    assert estimate_minutes(1, 3, 16, 2, [1, 4], 1, prof, machine_speed(slow)) == pytest.approx(3 * quick)


def _anchored_cell() -> dict:
    """A re-anchored cell as the issue saw it: 7.6 tok/s on the wall clock, 2.5 at the profile's speed, 1.0 predicted."""
    side = {"tok_per_s": 1.0, "steps": 4, "mean_latency_s": 1.0}
    v = {"repeats": 1, "real": 2.5, "real_min": 2.5, "real_max": 2.5, "spread": 0.0, "band": None, "predicted": 1.0,
         "error": 1.0 / 2.5 - 1, "margin": 0.03, "loaded": False, "verdict": "inconclusive", "reason": "r",
         "anchored": True, "speed": 0.329}
    return {"trace": "traces/codeedit.jsonl", "policy": "hybrid", "batch_size": 4, "requests": 3,
            "real": {"tok_per_s": 7.6, "steps": 4, "mean_latency_s": 1.0, "tokens_per_engine_step": 2.0,
                     "lossless": True, "outputs_equal_reference": True},
            "predicted": side, "synthetic": dict(side, tok_per_s=3.0), "predicted_error": abs(1.0 / 2.5 - 1),
            "synthetic_error": abs(3.0 / 2.5 - 1), "step_error_median": 0.1, "verdict": v,
            "anchor": {"speeds": [0.329], "speed": 0.329, "real_at_reference": 2.5, "real_wall": 7.6,
                       "error_wall": 1.0 / 7.6 - 1}}


def test_fidelity_md_shows_one_real_figure_and_signed_errors_against_it():
    from real.validation.fidelity import aggregate, format_md

    cell = _anchored_cell()
    meta = {"command": "python real/validate.py --quick", "machine": {}, "model": "m", "mode": "real",
            "max_tokens": 16, "max_prompt": 512, "quick": True}
    md = format_md([cell], aggregate([cell]), meta)
    row = next(x for x in md.splitlines() if x.startswith("| codeedit | hybrid |"))
    cols = [c.strip() for c in row.strip("|").split("|")]
    head = [c.strip() for c in next(x for x in md.splitlines() if x.startswith("| trace |")).strip("|").split("|")]
    got = dict(zip(head, cols))
    assert got["real tok/s"] == "2.5" and got["predicted tok/s"] == "1.0"  # the verdict's figure, not 7.6
    errors = [c for h, c in zip(head, cols) if h == "error"]
    assert errors == ["-60.0%", "+20.0%"]  # signed, predicted / real - 1 against that same 2.5
    assert got["wall-clock tok/s"] == "7.6" and got["wall-clock error"] == "-86.8%"
    assert "| 7.6 | 1.0 |" not in md


def test_validate_prints_repository_relative_paths(tmp_path, monkeypatch):
    from sim.infra.paths import REPO, shown

    assert shown(REPO / "out" / "validate" / "fidelity.md") == "out/validate/fidelity.md"
    monkeypatch.chdir(tmp_path)
    assert shown(tmp_path / "o" / "x.md") == "o/x.md"  # under the working folder: relative to it
    assert shown(REPO / "out" / "v") == "out/v"
    assert shown("/nonexistent-root-47/x") == "/nonexistent-root-47/x"


# ------------------------------------------------------------------------------------------ outputs
def test_a_run_folder_has_steps_opt_in_and_a_report_that_carries_its_plotly(tmp_path):
    from sim.infra.html_page import asset_name, plotly_js

    p = _run(tmp_path, "--policy", "hybrid", "--out", tmp_path / "o")
    assert p.returncode == 0, p.stderr
    o = tmp_path / "o"
    assert sorted(x.name for x in o.iterdir()) == ["report.html", "requests.csv", "summary.json", "verdict.json",
                                                   "verdict.md"]
    assert "--steps adds every step" in p.stdout
    text = (o / "report.html").read_text()
    # issue 62: the page renders wherever the folder is copied (plotly.js inlined), nothing loaded from the cache
    assert plotly_js()[:5000] in text and "src='file://" not in text
    assert not (tmp_path / "cache" / "plotly" / asset_name()).exists()
    p = _run(tmp_path, "--policy", "hybrid", "--out", tmp_path / "c", "--plotly", "cached")  # small, this machine only
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "c" / "report.html").stat().st_size < 1_000_000
    p = _run(tmp_path, "--policy", "hybrid", "--out", tmp_path / "s", "--steps")
    assert p.returncode == 0, p.stderr
    name = "steps.parquet" if _has_pyarrow() else "steps.csv.gz"
    read = pd.read_parquet if name.endswith(".parquet") else pd.read_csv
    steps = read(tmp_path / "s" / name)
    assert set(steps["policy"]) == {"adaptive", "hybrid"} and len(steps) > 10
    first = (tmp_path / "s" / name).read_bytes()
    assert _run(tmp_path, "--policy", "hybrid", "--out", tmp_path / "s", "--steps", "--force").returncode == 0
    assert (tmp_path / "s" / name).read_bytes() == first  # the same run, the same bytes
    assert _run(tmp_path, "--policy", "hybrid", "--out", tmp_path / "s", "--force").returncode == 0
    assert not (tmp_path / "s" / name).exists()  # a rerun without --steps drops the earlier run's steps


def _has_pyarrow() -> bool:
    import importlib.util

    return importlib.util.find_spec("pyarrow") is not None


def test_a_cached_page_whose_copy_is_gone_says_so(tmp_path, monkeypatch):
    from sim.infra.html_page import page

    monkeypatch.setenv("HYBRIDSPEC_CACHE_DIR", str(tmp_path / "c"))
    text = page("t", ["<p>x</p>"], "cached")
    assert "typeof Plotly==='undefined'" in text and "python -m sim.cache" in text
    assert "</script>" not in text.split("textContent=")[1].split(";document")[0]  # the notice cannot end its script
    monkeypatch.setenv("HYBRIDSPEC_CACHE_DIR", "off")
    assert "* plotly.js v" in page("t", ["<p>x</p>"], "cached")  # caching off: the page carries plotly.js


def _cache(tmp_path: Path) -> Path:
    root = tmp_path / "cache"
    (root / "draft-tables").mkdir(parents=True)
    (root / "draft-tables" / "a.npz").write_bytes(b"x" * 3000)
    (root / "draft-tables" / "old.npz").write_bytes(b"x" * 1000)
    os.utime(root / "draft-tables" / "old.npz", (time.time() - 40 * 86400,) * 2)
    (root / "tokens" / "sub").mkdir(parents=True)
    (root / "tokens" / "sub" / "t.npz").write_bytes(b"y" * 500)
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    (root / "tokens" / "link").symlink_to(outside)  # a link out of the cache: never followed
    return root


def test_sim_cache_lists_each_kind_and_prunes_without_following_links(tmp_path):
    root = _cache(tmp_path)
    env = {"HYBRIDSPEC_CACHE_DIR": str(root)}
    p = run_cli_inprocess("sim.api.cache", cwd=ROOT, env=env)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith(f"cache {root}")
    assert re.search(r"draft-tables\s+4\.0 KB\s+2 files", p.stdout) and re.search(r"tokens\s+\d+ B\s+2 files", p.stdout)
    p = run_cli_inprocess("sim.api.cache", "--prune", "--older-than", "30", cwd=ROOT, env=env)
    assert p.returncode == 0 and "removed 1 files, 1.0 KB" in p.stderr, p.stderr
    assert (root / "draft-tables" / "a.npz").exists() and not (root / "draft-tables" / "old.npz").exists()
    p = run_cli_inprocess("sim.api.cache", "--prune", "--kind", "tokns", cwd=ROOT, env=env)
    assert p.returncode == 2 and "did you mean 'tokens'?" in p.stderr
    p = run_cli_inprocess("sim.api.cache", "--prune", "--kind", "tokens", cwd=ROOT, env=env)
    assert p.returncode == 0, p.stderr
    assert not (root / "tokens").exists() and (root / "draft-tables" / "a.npz").exists()
    assert (tmp_path / "precious" / "keep.txt").read_text() == "mine"  # the link went, not what it pointed to
    p = run_cli_inprocess("sim.api.cache", "--prune", cwd=ROOT, env=env)
    assert p.returncode == 0 and [q.name for q in root.iterdir()] == [".hybridspec-cache"]  # adopted: only kinds


def test_sim_cache_refuses_what_is_not_a_cache_and_stray_flags(tmp_path):
    p = run_cli_inprocess("sim.api.cache", "--older-than", "3", cwd=ROOT, env={"HYBRIDSPEC_CACHE_DIR": str(tmp_path)})
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "go with --prune" in p.stderr
    (tmp_path / "w").mkdir()
    p = run_cli_inprocess("sim.api.cache", "--prune", cwd=tmp_path / "w", env={"HYBRIDSPEC_CACHE_DIR": str(tmp_path)})
    assert p.returncode == 2 and "refusing to prune" in p.stderr and (tmp_path / "w").is_dir()
    p = run_cli_inprocess("sim.api.cache", cwd=ROOT, env={"HYBRIDSPEC_CACHE_DIR": "off"})
    assert p.returncode == 0 and "caching is off" in p.stdout


# ------------------------------------------------------------------------------------------ smaller points
def test_help_names_every_speculative_method_and_every_policy(capsys):
    from sim.api.run import parse_args
    from sim.core.policies import list_policies
    from sim.core.vllm import SPEC_METHODS

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    spec = flat.split("--speculative-config JSON")[-1][:900]
    for m in SPEC_METHODS:
        assert re.search(rf"\b{re.escape(m)}\b", spec), m
    tail = out.split("policies (--policy")[1]
    for usage in list_policies():
        assert f"\n  {usage}\n" in tail, usage


def test_an_unmapped_method_names_suffix_among_the_alternatives():
    from sim.core.vllm import speculative_config
    from sim.infra.errors import ConfigError

    with pytest.raises(ConfigError, match="suffix"):
        speculative_config('{"method": "mtp", "num_speculative_tokens": 2}', (2, 5), 7)
    with pytest.raises(ConfigError, match="ngram, ngram_gpu, dspark, eagle, eagle3, suffix"):
        speculative_config('{"num_speculative_tokens": 2}', (2, 5), 7)


def test_the_suffix_row_keeps_its_k(tmp_path):
    p = _run(tmp_path, "--drafters", "dspark,ngram,suffix", "--no-baseline", "--speculative-config",
             '{"method": "suffix", "num_speculative_tokens": 6}')
    assert p.returncode == 0, p.stderr
    assert re.search(r"^suffix:6\s", p.stdout, re.M), p.stdout


def test_bundled_traces_resolve_from_any_folder_and_a_missing_one_says_where(tmp_path):
    p = run_cli_inprocess("sim.api.run", "--trace", "traces/chat.jsonl", "--limit", "3", "--policy", "none",
                          "--no-baseline", "--batch-size", "1", "--workers", "1", "--no-progress", cwd=tmp_path,
                          env=_env(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "reading the repository's" in p.stderr and str(ROOT / "traces" / "chat.jsonl") in p.stderr
    p = run_cli_inprocess("sim.api.run", "--trace", "traces/chta.jsonl", "--policy", "none", "--no-baseline",
                          "--batch-size", "1", cwd=tmp_path, env=_env(tmp_path))
    assert p.returncode == 2 and f"relative to the working folder {tmp_path}" in p.stderr, p.stderr
    p = run_cli_inprocess("sim.api.run", "--trace", ROOT / "traces" / "chta.jsonl", "--policy", "none",
                          "--batch-size", "1", cwd=tmp_path, env=_env(tmp_path))
    assert p.returncode == 2 and "did you mean 'chat.jsonl'?" in p.stderr, p.stderr


def test_a_sharegpt_jsonl_gets_the_convert_hint_and_converts(tmp_path):
    convs = json.loads((FIX / "sharegpt.json").read_text())
    jl = tmp_path / "sg.jsonl"
    jl.write_text("".join(json.dumps(c) + "\n" for c in convs))
    p = _run(tmp_path, "--policy", "none", "--trace", jl)
    assert p.returncode == 2 and f"convert it first with python -m sim.trace convert --from sharegpt {jl}" in p.stderr
    outs = []
    for src, dst in ((jl, tmp_path / "a.jsonl"), (FIX / "sharegpt.json", tmp_path / "b.jsonl")):
        p = run_cli_inprocess("sim.core.trace", "convert", "--from", "sharegpt", src, "-o", dst, cwd=ROOT,
                              env=_env(tmp_path))
        assert p.returncode == 0, p.stderr
        outs.append(dst.read_bytes())
    assert outs[0] == outs[1] and outs[0]


def test_progress_clock_runs_on_and_an_immediate_error_prints_no_progress(tmp_path):
    from sim.infra.progress import Heartbeat

    import io

    s = io.StringIO()
    t0 = time.perf_counter() - 100.0
    with Heartbeat("a", None, 1000.0, stream=s, since=t0):
        pass
    with pytest.raises(ValueError):
        with Heartbeat("b", None, 1000.0, stream=s, since=t0):
            raise ValueError("bad input")
    lines = s.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("progress: a, 1m4")  # 100 s on, and none for the failure
    p = run_cli_inprocess("sim.api.run", "--trace", TINY, "--batch-size", "2", "--workers", "1", "--policy", "hybrid",
                          "--progress-every", "0.01", cwd=ROOT, env=_env(tmp_path))
    assert p.returncode == 0, p.stderr
    el = [float(m[0]) * 60 + float(m[1]) for m in re.findall(r"^progress: .*?, (\d+)m([\d.]+)s elapsed$", p.stderr, re.M)]
    assert len(el) >= 2 and el == sorted(el), p.stderr  # one clock over both phases
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "x"}\n')
    p = run_cli_inprocess("sim.api.run", "--trace", bad, "--batch-size", "2", "--policy", "hybrid",
                          "--progress-every", "0.01", cwd=ROOT, env=_env(tmp_path))
    assert p.returncode == 2 and "progress:" not in p.stderr and p.stderr.count("\n") == 1, p.stderr


@pytest.mark.parametrize("args, hint", [(["--policy", "hybrd"], "did you mean 'hybrid'?"),
                                        (["--model", "qwen3-8"], "did you mean 'qwen3-8b'?"),
                                        (["--gpu", "h100-sm"], "did you mean 'h100-sxm'?")])
def test_a_typo_gets_did_you_mean(tmp_path, args, hint):
    p = _run(tmp_path, *args)
    assert p.returncode == 2 and hint in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_the_executed_notebook_copy_is_ignored():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    p = subprocess.run(["git", "check-ignore", "-q", "notebooks/policy_tuning.nbconvert.ipynb"], cwd=ROOT, timeout=60)
    assert p.returncode == 0
    p = subprocess.run(["git", "check-ignore", "-q", "notebooks/policy_tuning.ipynb"], cwd=ROOT, timeout=60)
    assert p.returncode == 1  # the notebook itself stays tracked


def test_prune_refuses_a_folder_that_holds_the_home_folder(tmp_path):
    home = tmp_path / "h" / "user"
    (home / "Documents").mkdir(parents=True)
    (home / "Documents" / "thesis.tex").write_text("mine")
    p = run_cli_inprocess("sim.api.cache", "--prune", cwd=ROOT,
                          env={"HYBRIDSPEC_CACHE_DIR": str(tmp_path / "h"), "HOME": str(home)})
    assert p.returncode == 2 and "refusing to prune" in p.stderr
    assert (home / "Documents" / "thesis.tex").read_text() == "mine"


def test_the_cached_plotly_never_writes_through_a_link(tmp_path, monkeypatch):
    from sim.infra.html_page import asset_name, cached_asset

    victim = tmp_path / "victim.txt"
    victim.write_text("my notes")
    cache = tmp_path / "c"
    (cache / "plotly").mkdir(parents=True, mode=0o700)
    (cache / "plotly" / asset_name()).symlink_to(victim)
    monkeypatch.setenv("HYBRIDSPEC_CACHE_DIR", str(cache))
    path = cached_asset()
    assert victim.read_text() == "my notes"
    assert not path.is_symlink() and path.parent == cache / "plotly" and path.stat().st_size > 1_000_000
