"""The vLLM plugin's settings against the whole menu a vLLM user can turn on, per workload and batch size.

    python -m sim.plugin_menu [--out reports/plugin-menu.md] [--force] [--batch-size B ...] [--trace T ...] [--main]

--trace takes any JSONL trace (the bundled three by default): your workload, or prompts the report does not use.

Every cell is one simulation of qwen3-8b on H100 (roofline), temperature 0, whole trace, charged as vLLM's
scheduler charges it (`--scheduler vllm`, the default `--vllm-version`). The comparison set is what vLLM runs
without the plugin (COMPARISON: no speculation, DSpark with adaptive verification, DSpark at its fixed block, vLLM's
n-gram at the plugin's W, the suffix drafter); PLUGIN are the plugin's deployable settings (`hybrid-vllm`, docs/real.md, "The
plugin"). Per (trace, batch) the report gives each setup's output throughput [tok/s] and

    ratio_menu   = max over PLUGIN / max over COMPARISON          (the plugin's target: >= 0.99)
    ratio_hybrid = max over PLUGIN / `hybrid` (the simulator's design, under the project's own charge)

    ratio_main   = max over PLUGIN / max over MAIN                (--main only: where the plugin stands)

MAIN (`--main`) is a tier of its own, "vLLM main, unreleased": what vLLM's main branch runs and no release does
(`suffix-adaptive`, Model Runner V2's suffix speculator feeding adaptive verification; vLLM main's `ngram-mtp` needs a
target with MTP layers, which qwen3-8b has not), under the project's own charge (`--scheduler hybridspec`: the
simulator models the scheduling of vLLM's releases only). It is never part of the comparison set, so never the
target.
`hybrid` is run only at HYBRID_BATCHES on the code-editing traces. Predictions only: docs/real.md says which real
runs check the plugin (`python -m real.vllm_slots`).
"""
from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

from sim.core.config import PLUGIN_TAIL_SETTINGS, WITH_SUFFIX
from sim.core.deploy import MAIN_TIER
from sim.infra.errors import ConfigError
from sim.infra import paths
from sim.infra.cli import ArgumentParser, check_in_file, check_out_file, flag_given, write_files
from sim.infra.pool import run_local

REPO = paths.REPO
TRACES = ("traces/codeedit.jsonl", "traces/codeedit-model.jsonl", "traces/chat.jsonl")
CODE_TRACES = TRACES[:2]
BATCHES = (1, 4, 32, 128, 256)
HYBRID_BATCHES = (4, 128)
W = 32  # the plugin's slots; vLLM's n-gram runs at the same W
COMPARISON = ("none", "adaptive", "model-fixed:7", f"vllm-ngram:{W}", "suffix")
PLUGIN = (f"hybrid-vllm:slots={W}", f"hybrid-vllm:slots={W}:skip", "hybrid-vllm:runcal=64",
          f"hybrid-vllm:slots={W}:runcal=64", f"hybrid-vllm:slots={W}:skip:runcal=64") \
    + PLUGIN_TAIL_SETTINGS  # tuned on general text (sim/core/config.py)
MAIN = ("suffix-adaptive",)  # vLLM main, unreleased (--main)
HYBRID = "hybrid"
DEFAULT_OUT = "reports/plugin-menu.md"
MENU_TARGET = 0.99
HYBRID_TARGET = 0.9


@functools.lru_cache(maxsize=None)
def _prepared(trace: str, scheduler: str, drafters: str, limit: int | None):
    from sim.api.run import SimSetup, prepare

    return prepare(SimSetup(trace=str(REPO / trace), scheduler=scheduler, drafters=drafters, ngram_k=W, limit=limit))


def _runs_on(policy: str, drafters: str) -> bool:
    """Whether `policy` runs with only `drafters` enabled (the smallest set is the one run)."""
    from sim.core.policies.catalog import get_policy

    try:
        get_policy(policy, drafters)
        return True
    except ConfigError:
        return False


def run_cell(cell: tuple[str, str, int, str], limit: int | None = None) -> dict:
    """One simulation: (trace, policy, batch, scheduler) on the trace's first `limit` requests (None: all) -> its
    summary row (lossless or an error)."""
    from sim.api.run import SimSetup, run_one

    trace, policy, batch, scheduler = cell
    drafters = SimSetup.drafters if _runs_on(policy, SimSetup.drafters) else WITH_SUFFIX
    row, res = run_one(_prepared(trace, scheduler, drafters, limit), policy, batch)
    res.raise_if_lossy(f"{trace} {policy} batch {batch}")
    return {"trace": trace, "policy": policy, "batch_size": batch, "scheduler": scheduler,
            "tok_s": float(row["output_throughput_tok_s"])}


def trace_arg(trace: str) -> str:
    """--trace as the cells key it: a bundled trace's repo-relative name as given (it runs from any folder), any
    other file its absolute path. Before any work: ConfigError naming --trace where it is no readable file, the
    trace's first bad line as TraceError (sim.core.trace.scan_trace: file, line, field)."""
    from sim.core.trace.loader import scan_trace

    p = Path(trace)
    if not p.is_absolute() and (REPO / p).is_file() and (not p.exists() or p.resolve() == (REPO / p).resolve()):
        return trace
    out = str(check_in_file(p, "--trace").resolve())
    scan_trace(out)
    return out


def cells(traces: tuple[str, ...], batches: tuple[int, ...], main: bool = False) -> list[tuple[str, str, int, str]]:
    out = [(t, p, b, "vllm") for t in traces for b in batches for p in COMPARISON + PLUGIN]
    # vLLM main's scheduling is not modelled (sim.core.vllm refuses --scheduler vllm for it): the project's charge
    out += [(t, p, b, "hybridspec") for t in traces for b in batches for p in (MAIN if main else ())]
    out += [(t, HYBRID, b, "hybridspec") for t in traces if t in CODE_TRACES for b in batches if b in HYBRID_BATCHES]
    return sorted(out, key=lambda c: c[2])  # batch 1 first: the longest cells start early


def summarize(rows: list[dict]) -> list[dict]:
    """Per (trace, batch): the best of each set and the two ratios (module docstring)."""
    out = []
    for t in dict.fromkeys(r["trace"] for r in rows):
        for b in sorted({r["batch_size"] for r in rows if r["trace"] == t}):
            got = {r["policy"]: r["tok_s"] for r in rows if r["trace"] == t and r["batch_size"] == b}
            menu = max(COMPARISON, key=lambda p: got[p])
            plug = max(PLUGIN, key=lambda p: got[p])
            s = {"trace": t, "batch_size": b, "tok_s": got, "best_menu": menu, "best_plugin": plug,
                 "ratio_menu": got[plug] / got[menu]}
            if HYBRID in got:
                s["ratio_hybrid"] = got[plug] / got[HYBRID]
            if all(p in got for p in MAIN):
                s["best_main"] = max(MAIN, key=lambda p: got[p])
                s["ratio_main"] = got[plug] / got[s["best_main"]]
            out.append(s)
    return out


def report(summary: list[dict], command: str, wall_s: float, limit: int | None = None) -> str:
    scope = "whole traces" if limit is None else f"each trace's first {limit} requests only"
    lines = ["# The plugin against vLLM's menu (simulated)", "",
             f"Made by `{command}` ({wall_s / 60:.0f} min). qwen3-8b on H100 (roofline), temperature 0, {scope}, "
             "`--scheduler vllm` (vLLM's charge); `hybrid` under the project's own charge. Output throughput "
             "[tok/s]; **menu** = best plugin setting / best of the comparison set (target >= "
             f"{MENU_TARGET}), **hybrid** = best plugin setting / `hybrid` (target >= {HYBRID_TARGET} on code "
             "editing at batch 4 and 128). Simulation only: `python -m real.vllm_slots` checks the plugin's steps "
             "on a real vLLM (docs/real.md).", ""]
    for t in dict.fromkeys(s["trace"] for s in summary):
        rows = [s for s in summary if s["trace"] == t]
        main = any("ratio_main" in s for s in rows)
        pols = list(COMPARISON + PLUGIN) + ([HYBRID] if any(HYBRID in s["tok_s"] for s in rows) else []) \
            + (list(MAIN) if main else [])
        lines += [f"## {Path(t).name}", "",
                  "| batch | " + " | ".join(f"`{p}`" for p in pols) + " | best plugin | menu | hybrid |"
                  + (f" {MAIN_TIER} |" if main else ""),
                  "|---:|" + "---:|" * len(pols) + "---|---:|---:|" + ("---:|" if main else "")]
        for s in rows:
            cells_ = [f"{s['tok_s'][p]:.0f}" if p in s["tok_s"] else "" for p in pols]
            mark = "" if s["ratio_menu"] >= MENU_TARGET else " (miss)"
            hyb = f"{s['ratio_hybrid']:.3f}" if "ratio_hybrid" in s else ""
            lines.append(f"| {s['batch_size']} | " + " | ".join(cells_)
                         + f" | `{s['best_plugin']}` | {s['ratio_menu']:.4f}{mark} (vs `{s['best_menu']}`) | {hyb} |"
                         + (f" {s['ratio_main']:.4f} (vs `{s['best_main']}`) |" if main else ""))
        lines.append("")
    met = sum(s["ratio_menu"] >= MENU_TARGET for s in summary)
    lines.append(f"{met} of {len(summary)} cells meet the menu target.")
    if any("ratio_main" in s for s in summary):
        lines += ["", f"{MAIN_TIER} (`{'`, `'.join(MAIN)}`, under the project's own charge; never the target, never "
                  f"recommended): the best plugin setting is >= 1 in {sum(s.get('ratio_main', 0) >= 1 for s in summary)} of {len(summary)} cells."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m sim.plugin_menu", description=__doc__.splitlines()[0],
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="the Markdown report to write")
    ap.add_argument("--force", action="store_true", help="replace an existing --out")
    ap.add_argument("--trace", action="append", default=None,
                    help=f"a JSONL trace (repeatable; default the bundled {', '.join(TRACES)}): a workload of your "
                         "own, or prompts the report does not use")
    ap.add_argument("--batch-size", action="append", type=int, default=None, help="repeatable")
    ap.add_argument("--workers", type=int, default=2, help="simulations run side by side")
    ap.add_argument("--limit", type=int, default=None, help="each trace's first N requests (a quick look; the "
                                                            "report says so)")
    ap.add_argument("--main", action="store_true", help=f"also run the tier '{MAIN_TIER}' ({', '.join(MAIN)}) and "
                                                            "report where the plugin stands against it")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if out.suffix != ".md":
        raise ConfigError(f"--out {out}: give a .md file")
    if a.workers < 1:
        raise ConfigError(f"--workers {a.workers}: give at least 1")
    if a.limit is not None and a.limit < 1:
        raise ConfigError(f"--limit {a.limit}: give at least 1 request")
    traces = tuple(dict.fromkeys(trace_arg(t) for t in a.trace)) if a.trace else TRACES  # a repeat runs once
    check_out_file(out, a.force, "--out")  # before any work
    batches = tuple(a.batch_size or BATCHES)
    todo = cells(traces, batches, a.main)
    t0, rows = time.perf_counter(), []

    def done(_, r: dict) -> None:
        rows.append(r)
        print(f"[{len(rows)}/{len(todo)}] {Path(r['trace']).stem} {r['policy']} batch {r['batch_size']}: "
              f"{r['tok_s']:.0f} tok/s ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)

    # a stop or a failing cell ends every worker at once (sim.infra.pool), not after the queued cells
    run_local(functools.partial(run_cell, limit=a.limit), [(c, c) for c in todo], a.workers, done)
    order = {c: i for i, c in enumerate(todo)}
    rows.sort(key=lambda r: (traces.index(r["trace"]), r["batch_size"], order[(r["trace"], r["policy"],
                                                                                 r["batch_size"], r["scheduler"])]))
    summary = summarize(rows)
    wall = time.perf_counter() - t0
    cmd = ("python -m sim.plugin_menu" + "".join(f" --trace {t}" for t in (a.trace or ()))
           + "".join(f" --batch-size {b}" for b in (a.batch_size or ())) + (f" --limit {a.limit}" if a.limit else "")
           + (" --main" if a.main else "")
           + (f" --out {a.out}" if flag_given("--out") else "") + (" --force" if a.force else ""))
    text = report(summary, cmd, wall, a.limit) + "\n"
    print(text)
    write_files(out.parent, {out.name: text}, overwrite=a.force, unit=out.name)
    return 0
