"""Simulator speed benchmark: simulated output tokens per wall second, this tree against a previous commit.

    python -m sim.bench [--against HEAD~1] [--repeat 3] [--policy P ...] [--batch-size B ...] [--trace T ...]
                        [--main-job] [--per-step]

For every policy (default: sim.api.run's default list) at batch 1, 4, 32, 128, 256 on both bundled traces it
times the engine run alone (draft tables are built before timing, as sim.api.run does) in two worker
processes, one importing this tree and one importing the tree of commit `--against` (exported with git
archive). The workers take turns, never run at once, and every cell runs `--repeat` times on each side
(median), so a noisy or shared machine slows both alike: the ratio after/before is the figure to read.
It also prints tokens per CPU-second of the worker (process time), which time-slicing on a loaded
machine disturbs far less than wall time.
Each batch size runs on a seeded sample of the trace of max(16, 2 x batch) requests (the whole trace
when it holds fewer; --scale multiplies it), so that a batch of B can fill and the slow small batches
stay short. `--main-job` also times the README's main job (python -m sim.run --trace
traces/codeedit.jsonl) on both sides, and its setup (sim.api.run.prepare: trace, cost model, draft tables)
with a warm draft-table cache, and prints the setup's share of it. `--per-step` splits a step's CPU time at
batch 4 into the calls into the native libraries (engine step, policy forms; timed around each call, in a
worker of their own) and the rest, the Python, numpy and cffi glue around them. `--phases` splits each run's
CPU time on this tree's side into the live drafters' work (sim/engine/live.py: propose, stop), the policy
(plan + allocate) and the rest, in ms per step (a run with --drafters ... suffix; 0 where the native step
stands in for them).
Prints the machine's load average before and after; figures go in docs/performance.md.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sim.infra.cli import ArgumentParser, check_out_file, finite_float, int_at_least, write_whole
from sim.core.drafters.registry import DEFAULT_DRAFTERS, parse_drafter_list
from sim.infra.errors import ConfigError
from sim.infra import paths

REPO = paths.REPO
TRACES = ("traces/codeedit.jsonl", "traces/chat.jsonl")
SIZES = (1, 4, 32, 128, 256)

# One request per line on stdin (JSON), one answer per line on stdout. Imports whatever tree PYTHONPATH names.
WORKER = r"""
import json, sys, time, os
import torch
torch.set_num_threads(1)
try:
    from sim.api.run import SimSetup, prepare, run_one
except ImportError:  # a tree from before the re-house by role (sim/run.py held the API)
    from sim.run import SimSetup, prepare, run_one


def timed_natives():
    # Time every call into the native libraries (engine step, policy forms) from now on: an [ns] accumulator.
    # The wrapper's own cost counts outside the calls (so the rest is, if anything, overstated).
    acc = [0]
    try:
        try:
            from sim.engine import native
        except ImportError:  # a tree from before the re-house by role
            from sim.policies import native
    except ImportError:  # a tree without native forms: everything is the rest
        return acc
    clock = time.perf_counter_ns

    class Timed:
        def __init__(self, lib):
            self._lib = lib

        def __getattr__(self, name):
            f = getattr(self._lib, name)
            if not callable(f):
                return f

            def timed(*args):
                t0 = clock()
                try:
                    return f(*args)
                finally:
                    acc[0] += clock() - t0

            setattr(self, name, timed)
            return timed

    for name in ("engine_step", "hybrid_price"):
        if not os.path.exists(os.path.join(os.path.dirname(native.__file__), name + ".c")):
            continue  # an older tree without this library (load would warn that the forms are unavailable)
        got = native.load(name)
        if got is not None:
            native._LIBS[name] = (got[0], Timed(got[1]))
    return acc


def timed_phases():
    # CPU time spent in the live drafters' work (LiveChains.propose / stop) and in the policy (Engine._plan /
    # _allocate), from now on: [s] accumulators (process time, as tok/cpu-s: time-slicing disturbs it least).
    # functools.wraps keeps each method's fast-form marks.
    import functools
    acc = {"live": 0.0, "policy": 0.0}
    try:
        try:
            from sim.engine.engine import Engine
            from sim.engine.live import LiveChains
        except ImportError:  # a tree from before the re-house by role
            from sim.engine import Engine
            from sim.engine_live import LiveChains
    except ImportError:  # a tree without live drafters
        return acc
    for cls, names, key in ((LiveChains, ("propose", "stop"), "live"), (Engine, ("_plan", "_allocate"), "policy")):
        for name in names:
            f = cls.__dict__.get(name)
            if f is None:
                continue

            def timed(*args, _f=f, _key=key, **kw):
                t0 = time.process_time()
                try:
                    return _f(*args, **kw)
                finally:
                    acc[_key] += time.process_time() - t0

            setattr(cls, name, functools.wraps(f)(timed))
    return acc


preps, warm, acc, phases = {}, set(), None, None
for line in sys.stdin:
    q = json.loads(line)
    dr = {"drafters": q["drafters"]} if q.get("drafters") else {}  # only when given: older trees lack the key
    if q["op"] == "run":
        if (q["trace"], q["policy"]) not in warm:  # first use: imports, native builds, constants (untimed)
            warm.add((q["trace"], q["policy"]))
            if (q["trace"], 4) not in preps:
                preps[(q["trace"], 4)] = prepare(SimSetup(trace=q["trace"], sample=4, seed=0, **dr))
            run_one(preps[(q["trace"], 4)], q["policy"], 4)
        key = (q["trace"], q["sample"])
        if key not in preps:
            preps[key] = prepare(SimSetup(trace=q["trace"], sample=q["sample"], seed=0, **dr))
        if q.get("phases") and phases is None:
            phases = timed_phases()
        for k in phases or ():
            phases[k] = 0.0
        c0 = time.process_time()
        row, res = run_one(preps[key], q["policy"], q["bs"])
        out = {"wall": row["wall_s"], "cpu": time.process_time() - c0, "tokens": int(row["output_tokens"]),
               "steps": int(len(res.steps["emitted"])), **({f"{k}_s": v for k, v in phases.items()} if phases else {})}
    elif q["op"] == "split":  # a worker of its own: its native calls are timed (timed_natives, first use)
        if acc is None:
            acc = timed_natives()
        key = (q["trace"], q["sample"])
        if key not in preps:
            preps[key] = prepare(SimSetup(trace=q["trace"], sample=q["sample"], seed=0))
        run_one(preps[key], q["policy"], q["bs"])  # warm: native builds, workspaces, constants
        best = None
        for _ in range(q["repeat"]):
            acc[0] = 0
            c0 = time.process_time()
            row, res = run_one(preps[key], q["policy"], q["bs"])
            dt = time.process_time() - c0
            steps = len(res.steps["emitted"])
            cur = (dt / steps * 1e6, acc[0] / steps / 1e3)
            best = cur if best is None or cur[0] < best[0] else best
        out = {"us_step": best[0], "us_native": best[1], "steps": steps}
    elif q["op"] == "setup":
        t0 = time.perf_counter()
        prepare(SimSetup(trace=q["trace"]))
        out = {"wall": time.perf_counter() - t0}
    print(json.dumps(out), flush=True)
"""


class Worker:
    """A python process importing the sim package of `tree`."""

    def __init__(self, tree: Path, label: str):
        env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
        self.label, self.tree = label, tree
        # cwd = the tree too: `python -c` puts the working directory ahead of PYTHONPATH on sys.path
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER], cwd=str(tree), env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def ask(self, **q) -> dict:
        self.proc.stdin.write(json.dumps(q) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.label} worker ({self.tree}) died")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def export_tree(rev: str, dest: Path) -> str:
    """Write the tree of commit `rev` into dest (git archive); returns its short hash. A `rev` that is a folder
    holding a sim/ package (an exported tree) is used as it is."""
    if (Path(rev) / "sim" / "run.py").exists():
        shutil.rmtree(dest)
        shutil.copytree(rev, dest, ignore=shutil.ignore_patterns(".git", "__pycache__"))
        return str(rev)
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, check=True, capture_output=True,
                         text=True).stdout.strip()
    arch = subprocess.run(["git", "archive", "--format=tar", sha], cwd=REPO, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=arch, check=True)
    return sha


def check_args(a, traces: list[str], policies: list[str]) -> None:
    """Every path, name and commit checked before any worker starts (ConfigError, one line)."""
    from sim.core.policies import get_policy
    from sim.core.trace.loader import check_trace_file

    for t in traces:
        check_trace_file(REPO / t, t)
    for pol in policies:
        get_policy(pol, a.drafters or DEFAULT_DRAFTERS)  # against the drafters the run enables
    if a.json is not None:
        check_out_file(a.json, a.force, "--json")
    if a.against != "none" and not (Path(a.against) / "sim" / "run.py").exists():
        ok = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{a.against}^{{commit}}"], cwd=REPO,
                            capture_output=True, text=True)
        if ok.returncode != 0:
            raise ConfigError(f"--against {a.against}: not a commit of this repository, nor a folder holding an "
                              "exported tree ('none': this tree only)")


def trace_size(trace: str) -> int:
    with open(REPO / trace) as f:
        return sum(1 for line in f if line.strip())


def main_job(tree: Path) -> float:
    """Wall seconds of python -m sim.run --trace traces/codeedit.jsonl imported from `tree`."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sim.run", "--trace", "traces/codeedit.jsonl", "--no-progress"], cwd=str(tree),
                   env=env, check=True, stdout=subprocess.DEVNULL)  # cwd: `-m` puts it ahead of PYTHONPATH
    return time.perf_counter() - t0


def sample_size(total: int, bs: int, scale: float) -> int:
    """Requests a cell of batch `bs` runs on: max(16, 2 x bs) x scale, at most the trace's `total`."""
    return min(total, max(16, int(round(2 * bs * scale))))


def per_step(trees: dict, traces: list[str], policies: list[str], a) -> list[dict]:
    """CPU time per step at batch 4 (best of --repeat), split into the time inside the native libraries' calls
    (timed around each call, in a worker of its own per tree) and the rest: Python, numpy and cffi glue."""
    bs, rows = 4, []
    workers = {k: Worker(tree, f"{k} per-step") for k, tree in trees.items()}
    try:
        print(f"per step at batch {bs} (CPU time, best of {a.repeat}): total us, of which in native calls, and the "
              "rest (Python, numpy, cffi)")
        for trace in traces:
            sample = sample_size(trace_size(trace), bs, a.scale)
            for pol in policies:
                got = {k: w.ask(op="split", trace=trace, sample=sample, policy=pol, bs=bs, repeat=a.repeat)
                       for k, w in workers.items()}
                rows.append(dict(trace=Path(trace).stem, policy=pol, bs=bs, requests=sample, **{
                    f"{k}_{m}": v[m] for k, v in got.items() for m in ("us_step", "us_native")}))
                print(f"{Path(trace).stem:<10}{pol:<18}{bs:>4}{sample:>5}" + "".join(
                    f"   {k}: {v['us_step']:6.1f} us = {v['us_native']:5.1f} native + "
                    f"{v['us_step'] - v['us_native']:5.1f} rest" for k, v in got.items()), flush=True)
    finally:
        for w in workers.values():
            w.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    from sim.api.run import DEFAULT_POLICIES

    ap = ArgumentParser(prog="python -m sim.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", default="HEAD~1",
                    help="commit (or a folder holding an exported tree) to compare with ('none': this tree only)")
    ap.add_argument("--trace", action="append", help=f"default: {' '.join(TRACES)}")
    ap.add_argument("--policy", action="append", help="default: sim.api.run's default policies")
    ap.add_argument("--batch-size", action="append", type=int_at_least(1), help=f"default: {' '.join(map(str, SIZES))}")
    ap.add_argument("--repeat", type=int_at_least(1), default=3, help="runs per cell and side (median)")
    ap.add_argument("--scale", type=finite_float(0, strict=True, hi=1e6), default=1.0,
                    help="multiply the per-batch-size sample of requests")
    ap.add_argument("--main-job", action="store_true", help="also time the README's main job and its setup")
    ap.add_argument("--per-step", action="store_true",
                    help="also split a step's CPU time at batch 4 into the native calls and the rest (Python)")
    ap.add_argument("--drafters", default=None,
                    help="the drafters both sides enable (sim.api.run's --drafters; default: its default, dspark,ngram)")
    ap.add_argument("--phases", action="store_true",
                    help="also split each run's CPU time on this tree's side into the live drafters' work, the policy "
                         "(plan + allocate) and the rest [ms per step]")
    ap.add_argument("--json", type=Path, default=None, help="write every measurement to this file (written whole)")
    ap.add_argument("--force", action="store_true", help="replace an existing --json file")
    a = ap.parse_args(argv)
    traces = a.trace or list(TRACES)
    policies = a.policy or list(DEFAULT_POLICIES)
    sizes = a.batch_size or list(SIZES)
    check_args(a, traces, policies)  # before any worker starts
    drafters = None if a.drafters is None else parse_drafter_list(a.drafters)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    workers = {"after": Worker(REPO, "after")}
    tmp = Path(tempfile.mkdtemp(prefix="hybridspec-bench-"))  # removed in the finally below, whatever ends the run
    base = None
    try:
        if a.against != "none":
            base = export_tree(a.against, tmp)
            workers["before"] = Worker(tmp, "before")
            print(f"before = commit {base} (exported to {tmp}); after = this tree ({REPO})")
        results = []
        head = (f"{'trace':<10}{'policy':<18}{'bs':>4}{'reqs':>5}{'tokens':>8}{'steps':>7}"
                + "".join(f"{k + ' tok/s':>15}" for k in workers) + (f"{'ratio':>8}" if base else "")
                + "".join(f"{k + ' tok/cpu-s':>15}" for k in workers) + (f"{'ratio':>8}" if base else "")
                + ("   after CPU ms/step: all drafters policy rest" if a.phases else ""))
        print(head)
        for trace in traces:
            total = trace_size(trace)
            tname = Path(trace).stem
            for bs in sizes:
                sample = sample_size(total, bs, a.scale)
                for pol in policies:
                    rates = {k: [] for k in workers}
                    cpu = {k: [] for k in workers}
                    info = {}
                    for rep in range(a.repeat):
                        order = list(workers) if rep % 2 == 0 else list(reversed(workers))
                        for k in order:
                            r = workers[k].ask(op="run", trace=trace, sample=sample, policy=pol, bs=bs,
                                               drafters=drafters, phases=a.phases and k == "after")
                            rates[k].append(r["tokens"] / r["wall"])
                            cpu[k].append(r["tokens"] / max(r["cpu"], 1e-9))
                            info[k] = r
                    med = {k: statistics.median(v) for k, v in rates.items()}
                    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
                    if base and info["before"]["steps"] != info["after"]["steps"]:
                        print(f"  note: {pol} bs={bs}: {info['before']['steps']} steps before, {info['after']['steps']} after")
                    ratio = med["after"] / med["before"] if base else None
                    ratio_cpu = med_cpu["after"] / med_cpu["before"] if base else None
                    split = ""
                    if a.phases:  # the last repeat's run, this tree's side
                        r, n = info["after"], info["after"]["steps"]
                        ms = [1e3 * r["cpu"] / n, 1e3 * r.get("live_s", 0) / n, 1e3 * r.get("policy_s", 0) / n]
                        ms.append(ms[0] - ms[1] - ms[2])
                        split = "".join(f"{x:>8.2f}" for x in ms)
                        info["phases_ms"] = dict(zip(("step", "drafters", "policy", "rest"), ms))
                    results.append(dict(trace=tname, policy=pol, bs=bs, requests=sample, tokens=info["after"]["tokens"],
                                        steps=info["after"]["steps"], **{f"{k}_tok_s": v for k, v in med.items()},
                                        **{f"{k}_tok_cpu_s": v for k, v in med_cpu.items()},
                                        **({"ratio": ratio, "ratio_cpu": ratio_cpu} if base else {}),
                                        **({"after_ms_per_step": info["phases_ms"]} if a.phases else {})))
                    print(f"{tname:<10}{pol:<18}{bs:>4}{sample:>5}{info['after']['tokens']:>8}{info['after']['steps']:>7}"
                          + "".join(f"{med[k]:>15,.0f}" for k in workers) + (f"{ratio:>8.2f}" if base else "")
                          + "".join(f"{med_cpu[k]:>15,.0f}" for k in workers) + (f"{ratio_cpu:>8.2f}" if base else "")
                          + split, flush=True)
        if base:
            for key, what in (("ratio", "wall"), ("ratio_cpu", "CPU")):
                ratios = [r[key] for r in results]
                print(f"ratio after/before ({what} time): geometric mean {statistics.geometric_mean(ratios):.2f}, "
                      f"min {min(ratios):.2f}, max {max(ratios):.2f}")
        extra = {}
        if a.per_step:
            extra["per_step"] = per_step({k: w.tree for k, w in workers.items()}, traces, policies, a)
        if a.main_job:
            for k, w in workers.items():
                w.close()
            workers = {}
            trees = {"after": REPO, **({"before": tmp} if base else {})}
            for k, tree in trees.items():
                extra[f"main_job_{k}_s"] = main_job(tree)
            setup = Worker(REPO, "setup")
            setup.ask(op="setup", trace="traces/codeedit.jsonl")  # warms the draft-table cache
            extra["setup_s"] = setup.ask(op="setup", trace="traces/codeedit.jsonl")["wall"]
            setup.close()
            print("main job (python -m sim.run --trace traces/codeedit.jsonl): "
                  + ", ".join(f"{k} {extra[f'main_job_{k}_s']:.1f} s" for k in trees)
                  + f"; setup (warm cache) {extra['setup_s']:.2f} s = {extra['setup_s'] / extra['main_job_after_s']:.0%} of it")
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        if a.json:
            write_whole(a.json, json.dumps({"against": base, "results": results, **extra}, indent=1) + "\n",
                        overwrite=True)
    finally:
        for w in workers.values():
            w.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0
