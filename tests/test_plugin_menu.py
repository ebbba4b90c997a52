"""sim.plugin_menu: the plugin's settings against vLLM's own menu (issue 43's comparison set): which cells run,
how the best of each set and the ratios are read, the report, and bad input."""
import subprocess
import sys

import pytest

from sim.api import plugin_menu as M


def test_every_trace_and_batch_runs_the_whole_comparison_set_and_every_plugin_setting():
    cells = M.cells(M.TRACES, M.BATCHES)
    for t in M.TRACES:
        for b in M.BATCHES:
            got = {p for (tt, p, bb, sch) in cells if tt == t and bb == b and sch == "vllm"}
            assert got == set(M.COMPARISON + M.PLUGIN)
    hyb = {(t, b) for (t, p, b, sch) in cells if p == M.HYBRID}
    assert hyb == {(t, b) for t in M.CODE_TRACES for b in M.HYBRID_BATCHES}
    assert all(sch == "hybridspec" for (_, p, _, sch) in cells if p == M.HYBRID)
    assert f"vllm-ngram:{M.W}" in M.COMPARISON and all(f"slots={M.W}" in p or p.endswith("runcal=64") for p in M.PLUGIN)


def test_the_ratios_are_the_best_plugin_over_the_best_alternative_and_over_hybrid():
    tok = {p: 100.0 for p in M.COMPARISON + M.PLUGIN}
    tok["suffix"], tok[M.PLUGIN[2]], tok[M.HYBRID] = 150.0, 120.0, 200.0
    rows = [{"trace": "t", "policy": p, "batch_size": 4, "scheduler": "vllm", "tok_s": v} for p, v in tok.items()]
    (s,) = M.summarize(rows)
    assert (s["best_menu"], s["best_plugin"]) == ("suffix", M.PLUGIN[2])
    assert s["ratio_menu"] == pytest.approx(120 / 150) and s["ratio_hybrid"] == pytest.approx(120 / 200)
    text = M.report([s], "python -m sim.plugin_menu", 60.0)
    assert "0.8000 (miss)" in text and "0 of 1 cells meet" in text and "whole traces" in text


def test_the_suffix_drafter_is_enabled_only_for_the_policies_that_need_it():
    from sim.core.config import DEFAULT_DRAFTERS, WITH_SUFFIX

    assert not M._runs_on("suffix", DEFAULT_DRAFTERS) and M._runs_on("suffix", WITH_SUFFIX)
    assert all(M._runs_on(p, DEFAULT_DRAFTERS) for p in M.PLUGIN + tuple(p for p in M.COMPARISON if p != "suffix"))


def test_a_quick_run_writes_its_report_and_never_overwrites_one(tmp_path):
    out = tmp_path / "menu.md"
    args = [sys.executable, "-m", "sim.plugin_menu", "--trace", "traces/codeedit.jsonl", "--batch-size", "4",
            "--limit", "3", "--workers", "1", "--out", str(out)]
    r = subprocess.run(args, capture_output=True, text=True, cwd=M.REPO, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    text = out.read_text()
    assert "first 3 requests only" in text and "--limit 3" in text and "| 4 |" in text
    again = subprocess.run(args, capture_output=True, text=True, cwd=M.REPO, timeout=120)
    assert again.returncode == 2 and "--force" in again.stderr and "Traceback" not in again.stderr
    assert out.read_text() == text


@pytest.mark.parametrize("extra,needle", [(["--limit", "0"], "--limit"), (["--workers", "0"], "--workers"),
                                          (["--out", "x.txt"], ".md"), (["--trace", "nope.jsonl"], "--trace")])
def test_bad_input_is_one_line_and_exit_2(tmp_path, extra, needle):
    r = subprocess.run([sys.executable, "-m", "sim.plugin_menu", "--out", str(tmp_path / "m.md"), *extra],
                       capture_output=True, text=True, cwd=M.REPO, timeout=120)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_vllm_main_is_a_tier_of_its_own_never_the_target():
    assert not set(M.MAIN) & set(M.COMPARISON + M.PLUGIN)
    plain, main = M.cells(M.TRACES, (4,)), M.cells(M.TRACES, (4,), main=True)
    assert not {p for (_, p, _, _) in plain} & set(M.MAIN)
    assert {(t, p) for (t, p, _, sch) in main if p in M.MAIN and sch == "hybridspec"} == \
        {(t, p) for t in M.TRACES for p in M.MAIN}
    assert all(M._runs_on(p, __import__("sim.core.config", fromlist=["x"]).WITH_SUFFIX) for p in M.MAIN)
    tok = {p: 100.0 for p in M.COMPARISON + M.PLUGIN}
    tok[M.MAIN[0]] = 400.0  # faster than everything: still not the target, the menu ratio is unchanged
    rows = [{"trace": "t", "policy": p, "batch_size": 4, "scheduler": "vllm", "tok_s": v} for p, v in tok.items()]
    (s,) = M.summarize(rows)
    assert s["ratio_menu"] == pytest.approx(1.0) and s["ratio_main"] == pytest.approx(0.25)
    text = M.report([s], "python -m sim.plugin_menu --main", 60.0)
    assert M.MAIN_TIER in text and "0.2500 (vs `suffix-adaptive`)" in text and "1 of 1 cells meet" in text
    (s0,) = M.summarize([r for r in rows if r["policy"] not in M.MAIN])
    assert "ratio_main" not in s0 and M.MAIN_TIER not in M.report([s0], "python -m sim.plugin_menu", 60.0)


def test_any_trace_file_runs_and_a_bad_one_is_refused_before_any_work(tmp_path, monkeypatch):
    assert M.trace_arg("traces/chat.jsonl") == "traces/chat.jsonl"  # bundled: repo-relative, runs from any folder
    own = tmp_path / "own.jsonl"
    own.write_text('{"id": "a", "prompt": "x y", "output": "y z"}\n')
    monkeypatch.chdir(tmp_path)
    assert M.trace_arg("own.jsonl") == str(own.resolve())
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "x"}\n')
    r = subprocess.run([sys.executable, "-m", "sim.plugin_menu", "--trace", str(bad), "--out", str(tmp_path / "m.md")],
                       capture_output=True, text=True, cwd=M.REPO, timeout=120)
    assert r.returncode == 2 and "bad.jsonl:1" in r.stderr and "output" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "m.md").exists()


def test_a_stopped_menu_ends_its_workers_at_once_and_writes_nothing(tmp_path):
    """SIGTERM (a timeout, docker stop) ends the run with its cells unfinished: the executor's default would run
    every queued cell first (the old behaviour: minutes of work after the stop)."""
    import signal
    import time

    out = tmp_path / "menu.md"
    p = subprocess.Popen([sys.executable, "-m", "sim.plugin_menu", "--trace", "traces/codeedit.jsonl", "--batch-size",
                          "1", "--limit", "60", "--workers", "2", "--out", str(out)], cwd=M.REPO, text=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first = p.stderr.readline()  # the first finished cell
    assert first.startswith("[1/"), first
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    rest = p.stderr.read()
    p.wait(timeout=120)
    total = int(first.split("/")[1].split("]")[0])
    assert p.returncode == 130 and "Traceback" not in rest
    waited = time.monotonic() - t0  # the queued cells of 60 requests at batch 1 take minutes; a stop, a second
    assert rest.count("\n[") + 1 < total and waited < 15, waited
    assert not out.exists()
