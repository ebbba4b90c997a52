"""real/validation/gpu_check.py on the CPU: the --quick path end to end with the 2-layer test model (preflight printed,
grid.csv and the reports under --out, nothing written into the repository's reports/ or models/), a one-line
refusal of --device cuda without CUDA, of existing outputs, and a spent time budget."""
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PREFLIGHT = ("torch ", "CUDA available", "device name and memory", "bf16 support", "python packages", "traces",
             "free disk", "model qwen3-tiny fits", "outputs")


def _run(*argv: str, timeout: int = 600):
    """real/validation/gpu_check.py in this process (tests/conftest.run_cli_inprocess); timeout: kept for the callers."""
    from conftest import run_cli_inprocess

    return run_cli_inprocess("real.validation.gpu_check", *argv, cwd=ROOT)


def _repo_state() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", "reports", "models"],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout


def _one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), r.stderr
    return err[0]


@pytest.mark.slow  # about 25 s: the whole prepared GPU check on the CPU (run before a GPU session: -m slow)
def test_quick_cpu_run(tmp_path):
    before = _repo_state()
    out = tmp_path / "o"
    r = _run("--device", "cpu", "--model", "qwen3-tiny", "--quick", "--out", str(out))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    for what in PREFLIGHT:
        assert any(ln.split(None, 1)[0] in ("OK", "SKIP") and what in ln for ln in lines if ln.strip()), what
    assert any(ln.startswith("SKIP") and "CUDA available" in ln for ln in lines)
    assert not any(ln.startswith("FAIL") for ln in lines)
    grid = (out / "grid.csv").read_text().splitlines()
    assert grid[0] == "R,q,context,tokens,measured_ms,roofline_ms,note" and len(grid) == 1 + 8
    assert all(float(row.split(",")[4]) > 0 for row in grid[1:])
    assert (out / "cost_table.json").is_file() and (out / "cpu_qwen3-tiny-measured.json").is_file()
    assert (out / "cpu_qwen3-tiny-measured.json").read_bytes() == (out / "cost_table.json").read_bytes()
    assert (out / "validate" / "fidelity.md").is_file() and (out / "validate" / "fidelity.json").is_file()
    md = (out / "fidelity-gpu.md").read_text()
    assert any(ln.strip().startswith("PASS n-gram kernels on cpu") for ln in lines)
    assert any(ln.strip().startswith("PASS hybrid step on cpu == on cpu") for ln in lines)
    for part in ("## Preflight", "## The vLLM plugin's device code", "## Target forward alone vs the roofline",
                 "measured / roofline",
                 "## Validation", "Median |throughput error|", "python real/gpu_check.py --device cpu"):
        assert part in md, part
    for trace in ("codeedit", "chat"):  # 2 traces x 2 policies x batch 1 and 2
        for pol in ("none", "hybrid-price"):
            assert sum(f"| {trace} | {pol} |" in ln for ln in md.splitlines()) == 2, (trace, pol)
    assert _repo_state() == before

    # a second run into the same --out refuses to replace the first one's results, in one line
    r2 = _run("--device", "cpu", "--model", "qwen3-tiny", "--quick", "--out", str(out))
    assert "outputs exist" in _one_line_error(r2)
    assert r2.returncode == 2 and any(ln.startswith("FAIL") and "outputs exist" in ln for ln in r2.stdout.splitlines())
    assert _repo_state() == before


def test_cuda_without_cuda_is_one_line(tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    before = _repo_state()
    r = _run("--device", "cuda", "--model", "qwen3-tiny", "--quick", "--out", str(tmp_path / "o"), timeout=300)
    assert "CUDA" in _one_line_error(r)
    assert any(ln.startswith("FAIL") and "CUDA available" in ln for ln in r.stdout.splitlines())
    assert not (tmp_path / "o").exists()
    assert _repo_state() == before


def test_spent_budget_skips_and_reports(tmp_path):
    out = tmp_path / "o"
    r = _run("--device", "cpu", "--model", "qwen3-tiny", "--quick", "--out", str(out), "--time-budget-s", "0.001",
             timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "skip profile: time budget spent" in r.stdout
    md = (out / "fidelity-gpu.md").read_text()
    assert "profile: time budget spent" in md and "No validation cell finished" in md
    assert not (out / "cpu_qwen3-tiny-measured.json").exists()
