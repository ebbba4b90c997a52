"""`python real/vllm_smoke.py --out DIR`: a user's first run of the vLLM flow on an H100 with vLLM 0.33: does it start?

    python real/vllm_smoke.py --out DIR [--force] [--budget-s 570] [--trace TRACE]

Prints the versions (GPU, NVIDIA driver, CUDA, torch, vLLM, ...) and the command of every step, then refuses with one
line unless vLLM 0.33.x is installed and torch sees a CUDA GPU (exit 2). Then the steps, in order, each within its
cap and all within --budget-s (a step past its cap is stopped: SIGALRM, its child process killed):
  plan       `python real/validate.py --engine vllm --vllm-device cuda --dry-run --quick` (no GPU work) -> DIR/plan.txt
  checklist  real.validation.vllm.checks.run_checklist on the first CHECK_PROMPTS (4) prompts of the trace, at most
             CHECK_MAX_TOKENS (32) tokens each: the plugin loaded, its n-gram kernels, no host sync, lossless
             (two vLLM processes with the default target and DSpark drafter; logs and results under DIR/checks/)
  bench      one `vllm bench forward` (the target pass of the quick profile, real/validation/vllm/bench.py) ->
             DIR/bench/target.json and its log
A step passes when its command exits 0 (and, for the checklist, no item FAILs). DIR/vllm_smoke.json records the
versions and every step (command, status, seconds, detail), written whole. An existing DIR with files is refused
unless --force. Exit 0 when every step passed, 1 otherwise. The first run downloads Qwen/Qwen3-8B and its DSpark
drafter from the Hugging Face hub, which the 10 minutes do not cover: a step stopped at its cap says so; run it
again once they are in $HF_HOME.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from real.validation.device.runner import CheckTimeout, hard_stop, one_line
from real.validation.device.versions import version_lines, versions
from real.validation.vllm import bench
from real.validation.vllm import config as C
from real.vllm_plugin.config import SUPPORTED_VLLM
from real.vllm_plugin.versions import installed_build, plugin_entry_point_missing
from sim.infra import paths
from sim.infra.cli import ArgumentParser, check_in_file, check_out_dir, finite_float, write_whole
from sim.infra.cuda import no_cuda_reason
from sim.infra.errors import ConfigError
from sim.infra.fsio import out_guard

BUDGET_S = 570.0  # under the 10 minutes a smoke test may take
BENCH_BATCH_SIZES = [1, 4]
REPORT = "vllm_smoke.json"
DEFAULT_TRACE = "traces/codeedit.jsonl"


@dataclass
class StepResult:
    name: str
    command: str
    status: str   # pass, fail, skip
    seconds: float
    detail: str


@dataclass(frozen=True)
class Step:
    """One step: its cap, the command it runs (for printing) and the run, which returns (ok, one-line detail)."""
    name: str
    cap_s: float
    command: Callable[["Smoke"], str]
    run: Callable[["Smoke", float], tuple[bool, str]]


@dataclass
class Smoke:
    out: Path
    trace: str
    cfg: C.VllmRunConfig

    def child(self, argv: list[str], log: Path, cap: float, env: dict[str, str] | None = None) -> int:
        """Run argv (a leading "python" is this interpreter) from the repository root, its output in `log`, within
        `cap` seconds (the child is killed past it); its exit status."""
        full = dict(os.environ, **(env or {}))
        full["PYTHONPATH"] = os.pathsep.join([str(paths.REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
        argv = [sys.executable if i == 0 and a == "python" else a for i, a in enumerate(argv)]
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as fh:
            try:
                return subprocess.run(argv, cwd=paths.REPO, env=full, stdout=fh, stderr=subprocess.STDOUT,
                                      timeout=cap).returncode
            except subprocess.TimeoutExpired:  # killed; the log's last line says why
                fh.write(f"\nstopped: ran past the step's cap of {cap:.0f} s\n")
                return 124


def _last_line(path: Path) -> str:
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()] if path.is_file() else []
    return lines[-1][:300] if lines else "no output"


# ------------------------------------------------------------------------------------------------ plan
def _plan_argv(s: Smoke) -> list[str]:
    return ["python", "real/validate.py", "--engine", "vllm", "--vllm-device", "cuda", "--dry-run", "--quick",
            "--trace", s.trace, "--out", str(s.out / "validate")]


def _plan(s: Smoke, cap: float) -> tuple[bool, str]:
    log = s.out / "plan.txt"
    rc = s.child(_plan_argv(s), log, cap)
    n = len(log.read_text(errors="replace").splitlines())
    return rc == 0, f"exit {rc}: {n} lines in {log}" + ("" if rc == 0 else f"; last: {_last_line(log)}")


# ------------------------------------------------------------------------------------------------ checklist
def _slice(s: Smoke):
    from real.validation.vllm.builds import build_of
    from real.validation.vllm.checks import CHECK_MAX_TOKENS, CHECK_PROMPTS

    b = build_of("cuda")
    return b.load_slice(s.trace, CHECK_PROMPTS, b.quick["max_prompt"], CHECK_MAX_TOKENS, s.cfg.seed)


def _checklist_command(s: Smoke) -> str:
    from real.validation.vllm.checks import CHECK_MAX_TOKENS

    sl = _slice(s)
    return (f"real.validation.vllm.checks.run_checklist(VllmRunConfig(), {len(sl.ids)} prompts of {s.trace} x "
            f"{CHECK_MAX_TOKENS} tokens, work={s.out / 'checks'}, sync_check=True)")


def _checklist(s: Smoke, cap: float) -> tuple[bool, str]:
    from real.validation.pipeline.lossless import DEFAULT_TIE_EPSILON
    from real.validation.vllm.checks import run_checklist

    res = run_checklist(s.cfg, _slice(s), s.out / "checks", True, DEFAULT_TIE_EPSILON)
    for r in res:
        print(r.line(), flush=True)
    failed = [f"({r.key}) {r.detail}" for r in res if r.status == "FAIL"]
    return not failed, "; ".join(failed) if failed else ", ".join(f"({r.key}) {r.status}" for r in res)


# ------------------------------------------------------------------------------------------------ bench
def _bench_argv(s: Smoke) -> list[str]:
    cases = bench.forward_cases(s.cfg, BENCH_BATCH_SIZES, quick=True)
    return bench.bench_argv(s.cfg, cases, s.out / "bench" / "target.json", exclude_drafter=True, quick=True)


def _bench(s: Smoke, cap: float) -> tuple[bool, str]:
    out, log = s.out / "bench" / "target.json", s.out / "bench" / "target.log"
    rc = s.child(_bench_argv(s), log, cap, s.cfg.env())
    if rc != 0 or not out.is_file():
        return False, f"exit {rc}: {_last_line(log)} (log: {log})"
    got = bench.read_bench(out)
    return True, f"{len(got)} cases: " + ", ".join(f"{k} {v:.2f} ms" for k, v in list(got.items())[:4])


STEPS = (
    Step("plan", 60, lambda s: C.shell_line(_plan_argv(s)), _plan),
    Step("checklist", 330, _checklist_command, _checklist),
    Step("bench", 180, lambda s: C.shell_line(_bench_argv(s), s.cfg.env()), _bench),
)


def preflight() -> None:
    """One ConfigError line unless vLLM 0.33.x is installed, the plugin's entry point with it, and torch sees a CUDA
    GPU."""
    import torch

    got = installed_build()
    missing = []
    if got is None:
        missing.append("vLLM is not installed")
    elif got[0] != "vllm" or got[1].split(".")[:2] != SUPPORTED_VLLM.split("."):
        missing.append(f"{got[0]} {got[1]} is installed")
    if not torch.cuda.is_available():  # vLLM 0.33's torch is built for CUDA 13: an older driver hides the GPU
        missing.append(no_cuda_reason())
    if missing:
        raise ConfigError(f"the vLLM smoke test needs vLLM {SUPPORTED_VLLM}.x and a CUDA GPU (an H100): "
                          f"{'; '.join(missing)}; {C.INSTALL_HINT}")
    if why := plugin_entry_point_missing():  # else checklist (a) finds it, minutes and a model download later
        raise ConfigError(f"the vLLM smoke test: {why}")


def smoke(out: Path, trace: str, budget_s: float, force: bool) -> int:
    t0 = time.perf_counter()
    with out_guard(out) as real_out:
        check_out_dir(real_out, force)
        s = Smoke(out=real_out, trace=trace, cfg=C.from_args({"device": "cuda"}))
        v = versions()
        print("\n".join(version_lines(v)))
        commands = {st.name: st.command(s) for st in STEPS}
        print("steps:")
        for name, cmd in commands.items():
            print(f"  {name}: {cmd}")
        sys.stdout.flush()
        preflight()
        real_out.mkdir(parents=True, exist_ok=True)
        results = []
        for st in STEPS:
            cap = min(st.cap_s, budget_s - (time.perf_counter() - t0))
            print(f"\n== {st.name} (cap {max(cap, 0):.0f} s)\n$ {commands[st.name]}", flush=True)
            if cap < 5:
                results.append(StepResult(st.name, commands[st.name], "skip", 0.0, "the time budget is spent"))
                print("SKIP the time budget is spent", flush=True)
                continue
            start = time.perf_counter()
            try:
                with hard_stop(cap + 5):
                    ok, detail = st.run(s, cap)
            except CheckTimeout as exc:
                ok, detail = False, str(exc)
            except Exception as exc:  # noqa: BLE001 - a step's failure is its result; the next may still run
                ok, detail = False, one_line(exc)
            r = StepResult(st.name, commands[st.name], "pass" if ok else "fail", round(time.perf_counter() - start, 1),
                           detail)
            results.append(r)
            print(f"{r.status.upper()} in {r.seconds:.0f} s: {detail}", flush=True)
        doc = {"versions": v, "trace": trace, "budget_s": budget_s, "steps": [asdict(r) for r in results],
               "passed": all(r.status == "pass" for r in results)}
        write_whole(real_out / REPORT, json.dumps(doc, indent=1) + "\n", overwrite=True)
    print(f"\nsmoke test: {sum(r.status == 'pass' for r in results)} of {len(results)} steps passed -> {out / REPORT}")
    return 0 if doc["passed"] else 1


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python real/vllm_smoke.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for the steps' outputs and vllm_smoke.json")
    ap.add_argument("--force", action="store_true", help="reuse a folder that holds an earlier run's files")
    ap.add_argument("--budget-s", type=finite_float(0, strict=True), default=BUDGET_S,
                    help=f"the whole run's seconds (default {BUDGET_S:g})")
    ap.add_argument("--trace", default=None, help=f"the checklist's prompts (default {DEFAULT_TRACE})")
    a = ap.parse_args(argv)
    # the steps run from the repository root: a trace named here is resolved now
    trace = check_in_file(a.trace, "--trace").resolve() if a.trace else paths.REPO / DEFAULT_TRACE
    return smoke(Path(a.out), str(trace), a.budget_s, a.force)
