"""The device check's hard stop that one blocking call cannot hold up: a separate process that kills the run.

runner.py's SIGALRM stop raises in the main thread only when Python gets control back; a CUDA call that blocks
(a hung kernel, a synchronize that never returns) keeps it from ever running. So `device_check` starts this watchdog
(`start`) as a child process with the run's hard deadline,

    deadline = start + budget_s + GRACE_S                                                       [s, wall clock]

(with --budget-s 420: 450 s, under the 8 minutes a borrowed GPU session has), and keeps a progress file up to date
(`write_progress`: the finished checks, the running one, those not yet started). The watchdog polls every POLL_S:
when the run has exited it exits too; at the deadline it SIGKILLs the run and writes device_check.json and .md from
the progress file itself: the finished checks as they were, the running one failed ("killed by the watchdog"), the
rest skipped. The run's exit status is then the kill's (137); the watchdog's own is 1.

`start` runs `watch(PID, DEADLINE, PROGRESS, OUT)` in a fresh interpreter (python -c), not a command of its own.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE_S = 30.0  # past the budget: the runner's own stop (cap + its grace, within the budget) comes first
POLL_S = 0.5
OUTPUTS = ("device_check.json", "device_check.md")


def start(progress: Path, out: Path, budget_s: float) -> subprocess.Popen:
    """The watchdog of this process, firing budget_s + GRACE_S from now."""
    deadline = time.time() + float(budget_s) + GRACE_S
    code = "import sys; from real.validation.device.watchdog import watch; sys.exit(watch(*sys.argv[1:]))"
    return subprocess.Popen([sys.executable, "-c", code, str(os.getpid()), repr(deadline), str(progress), str(out)],
                            stdin=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                [str(Path(__file__).resolve().parents[3])] + [p for p in [os.environ.get("PYTHONPATH")]
                                                                               if p])))


def write_progress(progress: Path, meta: dict, done: list[dict], current: dict | None, pending: list[dict]) -> None:
    """The run so far, written whole (a rename): what the watchdog reports if it has to stop the run."""
    tmp = progress.with_suffix(".tmp")
    tmp.write_text(json.dumps({"meta": meta, "done": done, "current": current, "pending": pending}, default=str))
    os.replace(tmp, progress)


def report_after_kill(progress: Path, out: Path, elapsed_s: float) -> dict:
    """device_check.{json,md} from the progress file: the running check failed, the others not started skipped."""
    from real.validation.device.report import report_json, report_md
    from real.validation.device.runner import CheckResult

    p = json.loads(progress.read_text())
    results = [CheckResult(**r) for r in p["done"]]
    cur = p.get("current")
    if cur:
        results.append(CheckResult(cur["key"], cur["name"], cur["title"], "fail",
                                   f"killed by the watchdog at {elapsed_s:.0f} s: a call the run's own stop could not "
                                   "interrupt (a blocking device call) held it past its cap", round(
                                       time.time() - cur["started"], 1), cur["cap_s"], {}))
    results += [CheckResult(c["key"], c["name"], c["title"], "skip", "not started: the run was killed by the watchdog",
                            0.0, 0.0, {}) for c in p["pending"]]
    doc = report_json(dict(p["meta"], elapsed_s=round(elapsed_s, 1), stopped_by="watchdog"), results)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in ((OUTPUTS[0], json.dumps(doc, indent=1, default=str) + "\n"), (OUTPUTS[1], report_md(doc))):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out / name)
    return doc


def watch(pid: int | str, deadline: float | str, progress: Path | str, out: Path | str) -> int:
    """Wait for the run `pid` (this process's parent) to exit, or kill it at `deadline` and write its report."""
    pid, deadline, progress, out = int(pid), float(deadline), Path(progress), Path(out)
    t0 = time.time()
    while time.time() < deadline:
        if os.getppid() != pid:  # the run has exited (this process was handed to another parent)
            return 0
        time.sleep(POLL_S)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return 0
    while os.getppid() == pid:
        time.sleep(0.05)
    if not progress.exists():
        return 1
    doc = report_after_kill(progress, out, time.time() - t0)
    cur = next((c for c in doc["checks"] if "watchdog at" in c["summary"]), None)
    print(f"device check: killed by the watchdog after {time.time() - t0:.0f} s"
          + (f" in check {cur['key']} {cur['name']}" if cur else "") + f" -> {out / OUTPUTS[1]}", file=sys.stderr)
    progress.unlink(missing_ok=True)
    return 1
