"""`python real/device_check.py --out DIR`: the vLLM plugin's device code checked on one GPU, without vLLM.

    python real/device_check.py --out DIR [--force] [--device auto|cuda|cpu] [--quick] [--budget-s 420]
                                [--sizes 1,8,32,256] [--history 40960] [--slots 32] [--block 7] [--steps 12]
                                [--equal-reqs 8] [--equal-history 4096] [--positions 256] [--only a,b,...] [--seed 0]

For a borrowed H100/H200 with torch (>= 2.11, CUDA, Triton) and no vLLM, no network: the checks of this package
(a kernels, b equality, c sync, d timing, e cuda_graph, f compile (informational), g variants; each module's
docstring says what it does and when it passes), each pass / fail / skip / info with its figures, in key order, each
within its cap and all within --budget-s (runner.py; a watchdog process kills a run hung in a device call at
--budget-s + 30 s and writes the report itself: watchdog.py), progress on stderr. Without a CUDA device (or with --device cpu) the parts that can run on
the CPU do (the n-gram match by its torch version, the step's equality and determinism, its time; launch counting,
CUDA graphs and the CUDA compile are skipped with the reason). --quick shrinks every size (the tests' CPU run).
Writes DIR/device_check.json and DIR/device_check.md whole (a temporary folder renamed into place; other files in
DIR are kept); an existing DIR with files is refused unless --force. Exit 0 when no check failed, 1 otherwise,
2 on bad input (one line).
"""
from __future__ import annotations

import datetime as _dt
import json
import shlex
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

from real.validation.device import compiled, equality, graphs, kernels, sync, timing, variants  # noqa: F401 - registers them
from real.validation.device.options import BUDGET_S, DeviceCheckOptions
from real.validation.device.report import report_json, report_md
from real.validation.device import watchdog
from real.validation.device.runner import CHECKS, Context, run_checks, say
from real.validation.device.watchdog import write_progress
from real.validation.device.versions import version_lines, versions
from sim.infra.cli import SEED, ArgumentParser, check_out_dir, finite_float, int_at_least
from sim.infra.errors import ConfigError
from sim.infra.fsio import atomic_dir, out_guard

OUTPUTS = ("device_check.json", "device_check.md")
DEFAULT_OUT = "out/device-check"


def _ints(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--sizes: expected request counts separated by commas, e.g. 1,8,32,256; got {text!r}") from None
    return vals


def parse_args(argv: list[str] | None) -> DeviceCheckOptions:
    d = DeviceCheckOptions(out=DEFAULT_OUT)
    ap = ArgumentParser(prog="python real/device_check.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"folder for device_check.json and .md (default {DEFAULT_OUT})")
    ap.add_argument("--force", action="store_true", help="replace the outputs of an earlier run in --out")
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                    help="cuda (the GPU check), cpu (what runs without one), auto: cuda when torch sees a GPU")
    ap.add_argument("--quick", action="store_true", help="small sizes everywhere (the tests' run: seconds on a CPU)")
    ap.add_argument("--budget-s", type=finite_float(0, strict=True), default=BUDGET_S,
                    help=f"the whole run's seconds; every check stops within its cap and this (default {BUDGET_S:g})")
    ap.add_argument("--sizes", type=_ints, default=d.sizes, help="requests per step timed in (d) (default 1,8,32,256)")
    ap.add_argument("--history", type=int_at_least(1), default=d.history,
                    help=f"tokens in every request's history in (d) (default {d.history})")
    ap.add_argument("--slots", type=int_at_least(1), default=d.slots,
                    help=f"W, vLLM's draft slots per request (default {d.slots})")
    ap.add_argument("--block", type=int_at_least(1), default=d.block,
                    help=f"K_b, DSpark's block (default {d.block})")
    ap.add_argument("--steps", type=int_at_least(1), default=d.steps,
                    help=f"live steps per comparison and timing (default {d.steps})")
    ap.add_argument("--equal-reqs", type=int_at_least(1), default=d.equal_reqs,
                    help=f"requests per step in (b), (c) and (e), (f) (default {d.equal_reqs})")
    ap.add_argument("--equal-history", type=int_at_least(1), default=d.equal_history,
                    help=f"their history's tokens (default {d.equal_history})")
    ap.add_argument("--positions", type=int_at_least(1), default=d.positions,
                    help=f"context positions per history row compared in (a) (default {d.positions})")
    ap.add_argument("--only", default="", help=f"the checks to run, e.g. a,b (default all: {','.join(sorted(CHECKS))})")
    ap.add_argument("--seed", type=SEED, default=d.seed)
    ns = ap.parse_args(argv)
    only = tuple(k.strip() for k in ns.only.split(",") if k.strip())
    unknown = [k for k in only if k not in CHECKS]
    if unknown:
        raise ConfigError(f"--only {ns.only}: no check {', '.join(unknown)} (known: {', '.join(sorted(CHECKS))})")
    o = DeviceCheckOptions(out=ns.out, force=ns.force, device=ns.device, quick=ns.quick, budget_s=ns.budget_s,
                           sizes=tuple(ns.sizes), history=ns.history, slots=ns.slots, block=ns.block, steps=ns.steps,
                           equal_reqs=ns.equal_reqs, equal_history=ns.equal_history, positions=ns.positions,
                           seed=ns.seed, only=only, argv=tuple(sys.argv[1:] if argv is None else argv))
    return o.shrunk() if o.quick else o


def resolve_device(name: str) -> torch.device:
    """auto: cuda when torch sees a GPU; cuda without one is one line."""
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        from sim.infra.cuda import no_cuda_reason

        raise ConfigError(f"--device cuda: {no_cuda_reason()}; --device cpu runs what runs without one")
    return torch.device("cuda", torch.cuda.current_device())


def device_check(o: DeviceCheckOptions) -> int:
    t0 = time.perf_counter()
    device = resolve_device(o.device)
    with out_guard(o.out) as out:
        check_out_dir(out, o.force)  # before any work, under the lock
        v = versions()
        for line in version_lines(v):
            say(line)
        started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        meta = {"command": shlex.join(["python", "real/device_check.py", *o.argv]), "device": f"{device} ({name})",
                "started": started, "budget_s": o.budget_s, "elapsed_s": 0.0,
                "versions": v, "options": {k: list(x) if isinstance(x, tuple) else x for k, x in asdict(o).items()}}
        with tempfile.TemporaryDirectory(prefix="device-check-") as tmpdir:
            prog = Path(tmpdir) / "progress.json"

            def progress(done, current, pending):
                write_progress(prog, meta, [r.to_json() for r in done], current, pending)

            progress([], None, [])
            dog = watchdog.start(prog, out, o.budget_s - (time.perf_counter() - t0))  # the hard stop (watchdog.py)
            try:
                results = run_checks(Context(device=device, opts=o), o.budget_s, t0, o.only, progress)
            finally:
                dog.kill()
                dog.wait()
        meta["elapsed_s"] = round(time.perf_counter() - t0, 1)
        doc = report_json(meta, results)
        with atomic_dir(out, keep=lambda n: n not in OUTPUTS) as tmp:
            (Path(tmp) / OUTPUTS[0]).write_text(json.dumps(doc, indent=1, default=str) + "\n")
            (Path(tmp) / OUTPUTS[1]).write_text(report_md(doc))
    c = doc["counts"]
    info = f", {c['info']} informational" if c["info"] else ""
    print(f"device check: {c['pass']} passed, {c['fail']} failed, {c['skip']} skipped{info} in {meta['elapsed_s']:.0f} s "
          f"-> {Path(o.out) / OUTPUTS[1]}")
    for r in results:
        print(f"  {r.key} {r.name:10s} {r.status.upper():4s} {r.summary}")
    return 1 if c["fail"] else 0


def main(argv: list[str] | None = None) -> int:
    return device_check(parse_args(argv))
