"""real/device_check.py on the CPU (real/validation/device/): the --quick run end to end (the CPU-runnable checks pass
with their figures, the CUDA-only ones skip with the reason, both reports written, progress on stderr), its imports
with simpy, plotly and vLLM blocked, the --out refusals, a spent budget, a check stopped at its cap, and the parts
that only a GPU runs fed with stand-ins (the profiler's event counting)."""
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import run_cli_inprocess
from real.validation.device import runner
from real.validation.device.report import report_md
from real.validation.device.timing import count_events

ROOT = Path(__file__).resolve().parents[1]
MODULE = "real.validation.device.main"

BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("simpy", "plotly", "vllm"):
            raise ImportError("blocked: " + name)
        return None
sys.meta_path.insert(0, Block())
import real.validation.device.main as m
import real.validation.vllm_smoke
import torch._dynamo, torch.profiler  # what only the CUDA checks import, when they run
from sim.infra.cli import run_cli
code = None
try:
    run_cli(m.main, ["--quick", "--device", "cpu", "--out", sys.argv[1]])
except SystemExit as e:
    code = e.code
print("CODE", code, "LOADED", sorted(n for n in sys.modules if n.split(".")[0] in ("simpy", "plotly", "vllm")))
"""


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """`real/device_check.py --quick --device cpu` once, in a process where importing simpy, plotly or vLLM fails (the
    GPU machine has none of them): (the finished process, its --out)."""
    out = tmp_path_factory.mktemp("device-check") / "dc"
    r = subprocess.run([sys.executable, "-c", BLOCKER, str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=240)
    return r, out


def _one_line_error(r) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    err = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("[device-check")]
    assert len(err) == 1 and err[0].startswith("error: "), r.stderr
    return err[0]


def test_quick_cpu_run_writes_both_reports(quick_run):
    r, out = quick_run
    assert "CODE 0 " in r.stdout, r.stdout + r.stderr[-3000:]
    doc = json.loads((out / "device_check.json").read_text())
    st = {c["key"]: c["status"] for c in doc["checks"]}
    assert st == {"a": "pass", "b": "pass", "c": "pass", "d": "pass", "e": "skip", "f": "skip", "g": "pass"}, \
        doc["checks"]
    assert doc["passed"] and doc["counts"] == {"pass": 5, "fail": 0, "skip": 2, "info": 0}
    fig = {c["key"]: c["figures"] for c in doc["checks"]}
    hist = fig["a"]["histories"]
    assert fig["a"]["backend"] == "torch" and fig["a"]["differing_entries"] == 0
    assert {h["kind"] for h in hist} == {"random", "dense", "repetitive"} and len({h["width"] for h in hist}) == 2
    assert all(h["entries"] > 20 and h["vs_ngram_tables"] == 0 for h in hist)
    assert sum(h["matched"] for h in hist if h["kind"] == "dense") > sum(h["matched"] for h in hist
                                                                         if h["kind"] == "random")
    assert fig["b"]["steps"] == 3 and fig["b"]["max_float_difference"] == 0.0
    assert 0.0 <= fig["b"]["ngram_chosen_share"] <= 1.0
    assert all(s["audit_h2d_copies"] == 0 for s in fig["c"]["sizes"]) and len(fig["c"]["sizes"]) >= 2
    assert [s["requests"] for s in fig["d"]["sizes"]] == [1, 4]
    assert all(s["step_ms"] > 0 and s["aten_ops"] > 50 and "kernels" not in s for s in fig["d"]["sizes"])
    assert fig["d"]["launch_counting"].startswith("skipped: no CUDA device")
    assert "CUDA" in next(c["summary"] for c in doc["checks"] if c["key"] == "e")
    # (g) the skip fired, runcal moved its offsets, the clock kept one sample per step
    g = fig["g"]
    assert g["steps"] == 3 and g["skipped_passes"] >= 1 and g["clock_samples"] == 3 and g["max_float_difference"] == 0
    assert any(b != 0 for b in g["runcal_offsets"]) and all(ms > 0 for ms in g["clock_ms"])
    assert doc["versions"]["torch"] == torch.__version__ and "gpu" in doc["versions"]
    md = (out / "device_check.md").read_text()
    assert md.index("## Versions") < md.index("## Checks") < md.index("## a. ")
    assert "| a kernels | PASS |" in md and "| e cuda_graph | SKIP |" in md and "| kind | width |" in md
    for key in "abcdefg":  # progress: a line as each check starts and one as it ends
        assert sum(f"] {key} " in ln for ln in r.stderr.splitlines()) == 2, key


def test_refuses_an_existing_out_unless_force(tmp_path):
    out = tmp_path / "dc"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert "already holds files" in _one_line_error(run_cli_inprocess(MODULE, "--quick", "--out", out))
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    r = run_cli_inprocess(MODULE, "--quick", "--device", "cpu", "--only", "c", "--force", "--out", out)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["device_check.json", "device_check.md", "mine.txt"]
    assert [c["key"] for c in json.loads((out / "device_check.json").read_text())["checks"]] == ["c"]


@pytest.mark.parametrize("args, says", [
    (["--sizes", "0,8"], "--sizes must be request counts >= 1"),
    (["--sizes", "1,x"], "--sizes: expected request counts"),
    (["--only", "a,z"], "no check z"),
    (["--slots", "4", "--block", "7"], "need 1 <= block <= slots"),
    (["--history", "100", "--quick"], "--history 100: too short"),
    (["--budget-s", "0"], "must be > 0"),
])
def test_bad_flags_are_one_line(tmp_path, args, says):
    r = run_cli_inprocess(MODULE, "--out", tmp_path / "o", *args)
    assert says in _one_line_error(r)
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_device_cuda_without_a_gpu_is_one_line(tmp_path):
    assert "sees no CUDA GPU" in _one_line_error(run_cli_inprocess(MODULE, "--device", "cuda", "--out", tmp_path))


def test_a_spent_budget_skips_every_check(tmp_path):
    r = run_cli_inprocess(MODULE, "--quick", "--device", "cpu", "--budget-s", "1", "--out", tmp_path / "o")
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "o" / "device_check.json").read_text())
    assert [c["status"] for c in doc["checks"]] == ["skip"] * 7
    assert all("time budget" in c["summary"] for c in doc["checks"])


def test_a_check_past_its_cap_is_stopped_and_the_run_goes_on(monkeypatch):
    def forever(ctx):
        ctx.partial["phase"] = "looping"
        while True:
            time.sleep(0.01)

    def fine(ctx):
        return runner.Outcome("pass", "ran", {"left": ctx.left() > 0})

    monkeypatch.setattr(runner, "CHECKS", {})
    monkeypatch.setattr(runner, "GRACE_S", 0.3)
    monkeypatch.setattr(runner, "RESERVE_S", 0.0)
    monkeypatch.setattr(runner, "MIN_START_S", 0.1)
    runner.register("x", "forever", "never ends", cap_s=0.2, quick_cap_s=0.2)(forever)
    runner.register("y", "fine", "ends", cap_s=5, quick_cap_s=5)(fine)
    ctx = runner.Context(device=torch.device("cpu"), opts=SimpleNamespace(quick=True))
    t0 = time.perf_counter()
    res = runner.run_checks(ctx, budget_s=30, t0=t0)
    assert time.perf_counter() - t0 < 5
    assert [(r.key, r.status) for r in res] == [("x", "fail"), ("y", "pass")]
    assert "ran past its cap" in res[0].summary and "while looping" in res[0].summary
    assert res[0].figures == {"phase": "looping"} and res[1].figures == {"left": True}


def test_a_raising_check_is_one_line_with_its_traceback_kept(monkeypatch):
    def broken(ctx):
        raise ValueError("first line\nsecond line")

    monkeypatch.setattr(runner, "CHECKS", {})
    runner.register("x", "broken", "raises", cap_s=30, quick_cap_s=30)(broken)
    res = runner.run_checks(runner.Context(device=torch.device("cpu"), opts=SimpleNamespace(quick=False)), 60,
                            time.perf_counter())
    assert res[0].status == "fail" and res[0].summary == "ValueError: first line"
    assert "Traceback" in res[0].error and "second line" in res[0].error


def test_launch_counting_reads_the_profilers_device_events():
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    ev = [SimpleNamespace(name="triton_scan", device_type=cuda, activity_type="kernel"),
          SimpleNamespace(name="void at::native::vectorized_elementwise_kernel", device_type=cuda, activity_type=None),
          SimpleNamespace(name="Memcpy DtoD (Device -> Device)", device_type=cuda, activity_type="gpu_memcpy"),
          SimpleNamespace(name="Memset (Device)", device_type=cuda, activity_type="gpu_memset"),
          SimpleNamespace(name="gpu annotation", device_type=cuda, activity_type="gpu_user_annotation"),
          SimpleNamespace(name="cudaLaunchKernel", device_type=cpu, activity_type="cuda_runtime"),
          SimpleNamespace(name="cuLaunchKernelEx", device_type=cpu, activity_type="cuda_driver"),
          SimpleNamespace(name="aten::add", device_type=cpu, activity_type="cpu_op")]
    assert count_events(ev) == {"kernels": 2, "memcpy": 1, "memset": 1, "launch_calls": 2}


def test_report_renders_records_as_tables():
    doc = {"command": "python real/device_check.py", "device": "cpu", "started": "now", "elapsed_s": 1.0,
           "budget_s": 420.0, "versions": {"torch": "2.x", "gpu": None}, "counts": {"pass": 1, "fail": 0, "skip": 0},
           "checks": [{"key": "d", "name": "timing", "title": "t", "status": "pass", "summary": "a | b", "seconds": 1.0,
                       "figures": {"sizes": [{"requests": 1, "step_ms": 0.123456}], "note": "x"}}]}
    md = report_md(doc)
    assert "- gpu: none" in md and "| d timing | PASS | 1.0 | a \\| b |" in md
    assert "| requests | step_ms |\n|---|---|\n| 1 | 0.1235 |" in md and "- note: x" in md


def test_nothing_it_runs_imports_simpy_plotly_or_vllm(quick_run):
    """The command, the smoke test's library and what the CUDA checks import later import, and the device check runs,
    with every import of simpy, plotly and vLLM refused."""
    r, out = quick_run
    assert "CODE 0 LOADED []" in r.stdout, r.stdout + r.stderr[-3000:]
    assert (out / "device_check.md").is_file()


def test_an_informational_checks_failure_is_info_and_the_run_passes(monkeypatch):
    """(f) is informational (the plugin refuses compile: true on CUDA): its failure is recorded as `info`, with why,
    and does not fail the run; another check's failure still does."""
    monkeypatch.setattr(runner, "CHECKS", {})
    runner.register("f", "compile", "t", 5, 5, informational="the plugin refuses it")(
        lambda ctx: runner.Outcome("fail", "does not compile"))
    ctx = runner.Context(device=torch.device("cpu"), opts=SimpleNamespace(quick=True))
    (r,) = runner.run_checks(ctx, 60.0, time.perf_counter())
    assert r.status == "info" and r.summary == "does not compile (informational: the plugin refuses it)"
    from real.validation.device.report import report_json
    doc = report_json({}, [r])
    assert doc["passed"] and doc["counts"]["info"] == 1


WATCHED = """
import sys, time
from pathlib import Path
from real.validation.device import watchdog
prog, out = Path(sys.argv[1]), Path(sys.argv[2])
meta = {"command": "python real/device_check.py", "device": "cpu (cpu)", "started": "now", "budget_s": 1.0,
        "elapsed_s": 0.0, "versions": {"torch": "x"}, "options": {}}
done = [{"key": "a", "name": "kernels", "title": "k", "status": "pass", "summary": "ok", "seconds": 0.1, "cap_s": 5.0,
         "figures": {}, "error": None}]
watchdog.write_progress(prog, meta, done, {"key": "b", "name": "equality", "title": "e", "cap_s": 5.0,
                                           "started": time.time()}, [{"key": "c", "name": "sync", "title": "s"}])
dog = watchdog.start(prog, out, float(sys.argv[3]) - watchdog.GRACE_S)
if sys.argv[4] == "hang":
    time.sleep(60)  # stands in for a CUDA call that never returns
print("finished")
"""


def test_the_watchdog_kills_a_hung_run_and_writes_its_report(tmp_path):
    """A run stuck past budget + grace is SIGKILLed by the watchdog process, which writes the report itself: the
    finished check kept, the running one failed, the rest skipped; a run that ends in time is left alone."""
    prog, out = tmp_path / "progress.json", tmp_path / "dc"
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", WATCHED, str(prog), str(out), "1.5", "hang"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == -9 and time.time() - t0 < 30, (r.returncode, r.stderr)
    for _ in range(100):  # the watchdog writes just after the kill
        if (out / "device_check.md").exists():
            break
        time.sleep(0.1)
    doc = json.loads((out / "device_check.json").read_text())
    assert [(c["key"], c["status"]) for c in doc["checks"]] == [("a", "pass"), ("b", "fail"), ("c", "skip")]
    assert "killed by the watchdog" in doc["checks"][1]["summary"] and doc["stopped_by"] == "watchdog"
    assert not doc["passed"] and "1 failed" in (out / "device_check.md").read_text()
    out2 = tmp_path / "dc2"
    r = subprocess.run([sys.executable, "-c", WATCHED, str(tmp_path / "p2.json"), str(out2), "2", "quick"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "finished" in r.stdout
    time.sleep(3)
    assert not out2.exists()
