"""Instructions of one simulator run, counted by callgrind: a figure that does not move with the machine's load.

    python -m sim.bench_instr --trace traces/chat.jsonl --batch-size 128 [--policy hybrid-price] [--sample N]

Wall time on a shared VM moves by up to 1.5x between runs (docs/performance.md), and such VMs rarely expose
hardware counters. This runs one (trace, policy, batch size) cell the way `sim.api.bench` times it -- the draft
tables prepared and one warm-up run first, untimed -- in a worker under `valgrind --tool=callgrind
--instr-atstart=no`, which switches collection on around one more `run_one` (CALLGRIND_START_INSTRUMENTATION,
from a two-line C helper compiled with the system C compiler) and off after it. It prints the instructions of
that run and per decode step. The same code gives the same count, give or take a few thousand, so two
commits compare without repeats. Counts are instructions, not time: a change that removes stalls (cache
misses, store-forwarding) shows in `sim.api.bench`, not here. `--tree DIR` counts another tree (an exported
commit, as `sim.api.bench --against` makes). Needs valgrind (Debian: `apt install valgrind`, which ships the
header) and a C compiler; a run under callgrind is about 50x slower than without.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sim.infra.cli import ArgumentParser, int_at_least
from sim.infra.errors import ConfigError
from sim.engine.native import compile_library
from sim.infra import paths

REPO = paths.REPO

TOGGLE_C = """#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void cg_stop(void) { CALLGRIND_DUMP_STATS; CALLGRIND_STOP_INSTRUMENTATION; }
"""

# Runs in the tree on PYTHONPATH: prepare, warm up, then one run with collection on. argv: helper .so, JSON query.
WORKER = r"""
import ctypes, json, sys
import torch
torch.set_num_threads(1)
try:
    from sim.api.run import SimSetup, prepare, run_one
except ImportError:  # a tree from before the re-house by role
    from sim.run import SimSetup, prepare, run_one
q = json.loads(sys.argv[2])
prep = prepare(SimSetup(trace=q["trace"], sample=q["sample"], seed=0))
run_one(prep, q["policy"], q["bs"])
cg = ctypes.CDLL(sys.argv[1])
cg.cg_start()
row, res = run_one(prep, q["policy"], q["bs"])
cg.cg_stop()
print(json.dumps({"steps": int(len(res.steps["emitted"])), "tokens": int(row["output_tokens"])}))
"""


def _helper(tmp: Path) -> Path:
    """The compiled CALLGRIND_START/STOP helper (ConfigError naming what is missing)."""
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:
        raise ConfigError(f"no C compiler ({cc}): the callgrind helper is compiled on the spot")
    src, so = tmp / "cg_toggle.c", tmp / "cg_toggle.so"
    src.write_text(TOGGLE_C)
    try:
        compile_library(src, so, cc)  # as the native forms are built
    except RuntimeError as exc:
        raise ConfigError(f"could not compile the callgrind helper ({exc}); valgrind's header "
                          "valgrind/callgrind.h comes with Debian's valgrind package") from None
    return so


def count(tree: Path, trace: str, policy: str, bs: int, sample: int | None) -> dict:
    """{"instructions", "steps", "tokens"} of one run_one of the cell in `tree`, under callgrind."""
    if shutil.which("valgrind") is None:
        raise ConfigError("valgrind is not installed (Debian: apt install valgrind)")
    with tempfile.TemporaryDirectory(prefix="hybridspec-instr-") as d:
        tmp = Path(d)
        so = _helper(tmp)
        out = tmp / "callgrind.out"
        q = json.dumps({"trace": trace, "policy": policy, "bs": bs, "sample": sample})
        # sys.executable itself, not a launcher script: valgrind follows no children unless told to
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
               os.path.realpath(sys.executable), "-c", WORKER, str(so), q]
        env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")  # the same dict layouts every run
        done = subprocess.run(cmd, cwd=str(tree), env=env, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise ConfigError(f"the run under callgrind failed (exit {done.returncode}): {last}")
        m = re.findall(r"Collected : (\d+)", done.stderr)
        if not m:
            raise ConfigError("callgrind reported no collected instructions (was the helper's request honoured?)")
        res = json.loads(done.stdout.strip().splitlines()[-1])
    res["instructions"] = int(m[-1])
    return res


def main(argv: list[str] | None = None) -> int:
    from sim.core.policies import get_policy
    from sim.core.trace.loader import check_trace_file

    ap = ArgumentParser(prog="python -m sim.bench_instr", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default="traces/chat.jsonl")
    ap.add_argument("--policy", default="hybrid-price")
    ap.add_argument("--batch-size", type=int_at_least(1), default=128)
    ap.add_argument("--sample", type=int_at_least(1), default=None,
                    help="a seeded sample of this many requests (default: the whole trace)")
    ap.add_argument("--tree", type=Path, default=REPO, help="the tree to count (default: this one)")
    a = ap.parse_args(argv)
    if not (a.tree / "sim" / "run.py").exists():
        raise ConfigError(f"--tree {a.tree}: no sim/api/run.py there (an exported tree of this repository)")
    # a trace here (the working directory), else in the tree (its bundled traces/...)
    trace = str(Path(a.trace).resolve()) if Path(a.trace).exists() else a.trace
    check_trace_file(a.tree / trace, a.trace)
    get_policy(a.policy)
    r = count(a.tree.resolve(), trace, a.policy, a.batch_size, a.sample)
    print(f"{a.trace} {a.policy} batch {a.batch_size}: {r['instructions']:,} instructions in one run "
          f"({r['steps']} steps, {r['tokens']} tokens): {r['instructions'] / max(r['steps'], 1):,.0f} a step")
    return 0
