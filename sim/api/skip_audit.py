"""Whether DSpark's pass pays for itself under a plugin setting: the passes run for nothing, and the most any skip
rule could gain by leaving them out.

    python -m sim.skip_audit [--trace T] [--limit N] [--batch-size B ...] [--setting S ...] [--against P]

Per batch size, under vLLM's charge (`--scheduler vllm`), each plugin setting S (a `hybrid-vllm` spec, default
DEFAULT_SETTINGS) is run beside the reference P (default `vllm-ngram:32`, vLLM's n-gram at the plugin's W). From
each run's step log (t: an engine step, ms):

    ran[t]     = draft_ms[t] > 0                          DSpark's pass ran at step t (draft_ms: what a skip saves;
                                                          the rest of its step is charged with the allocation)
    useful[t]  = verified_model[t] > 0  or  past[t] > 0   some request verified a DSpark token: in its chosen chain,
                                                          or past a chosen n-gram chain and accepted there
                                                          (past[t] = emitted - accepted_model - accepted_ngram - num_decode;
                                                          a prefill completing at t emits its first token too, so
                                                          such a step can count as useful: the bound errs low there)
    wasted_ms  = sum of draft_ms[t] over ran & ~useful    [ms]
    bound      = output tokens / (T - wasted_ms / 1e3)    [tok/s], T = the run's simulated time [s]

`bound` removes every pass that verified no DSpark token, at no cost, all else equal (the same schedule): no skip
rule gains more over S's own, one that sees this step's n-gram match before it launches the pass included (a rule
that also leaves out useful passes loses their tokens, and a real one pays for what it reads). bound / P < 1 says no
skip rule reaches P on this workload: DSpark's chains, where chosen, are worth less than its passes cost. The
column `after no n-gram` counts the wasted passes that follow a step in which the n-gram chains accepted nothing
(at batch 1, what the plugin's skip, decided from the last step's values, cannot foresee). Prints a Markdown table;
writes nothing.
"""
from __future__ import annotations

import argparse

import numpy as np

from sim.core.config import PLUGIN_TAIL_SETTINGS
from sim.infra.cli import ArgumentParser, check_in_file, int_at_least

DEFAULT_TRACE = "traces/codeedit.jsonl"
DEFAULT_SETTINGS = PLUGIN_TAIL_SETTINGS[-1:]  # tail=0.2, the setting that meets the menu at batch 1
DEFAULT_AGAINST = "vllm-ngram:32"
BATCHES = (1, 4)


def audit(steps: dict, sim_time_s: float) -> dict:
    """The step log's DSpark passes (module docstring): passes run, useful, wasted, their time [ms], those after a
    step with no n-gram token accepted, and the output tokens and simulated time the bound needs."""
    s = {k: np.asarray(v) for k, v in steps.items()}
    dec = s["num_decode"] > 0
    ran = (s["draft_ms"] > 0) & dec
    past = s["emitted"] - s["accepted_model"] - s["accepted_ngram"] - s["num_decode"]
    useful = (s["verified_model"] > 0) | (past > 0)
    wasted = ran & ~useful
    no_ngram_before = np.r_[True, s["accepted_ngram"][:-1] == 0]
    return {"decode_steps": int(dec.sum()), "ran": int(ran.sum()), "useful": int((ran & useful).sum()),
            "wasted": int(wasted.sum()), "wasted_ms": float(s["draft_ms"][wasted].sum()),
            "after_no_ngram": int((wasted & no_ngram_before).sum()),
            "step_ms": float(s["step_ms"].sum()), "sim_time_s": float(sim_time_s)}


def bound_tok_s(tok_s: float, a: dict) -> float:
    """The run's throughput with its wasted passes removed at no cost [tok/s] (module docstring)."""
    left = a["sim_time_s"] - a["wasted_ms"] / 1e3
    return tok_s * a["sim_time_s"] / left if left > 0 else float("nan")


def measure(trace: str, settings: tuple[str, ...], against: str, batches: tuple[int, ...],
            limit: int | None = None) -> list[dict]:
    """One row per (batch, setting): its tok/s, the reference's, the audit and the bound."""
    from sim.api.run import SimSetup, prepare, run_one

    prep = prepare(SimSetup(trace=trace, scheduler="vllm", ngram_k=32, limit=limit))
    rows = []
    for b in batches:
        ref_row, ref = run_one(prep, against, b)
        ref.raise_if_lossy(f"{trace} {against} batch {b}")
        ref_tok_s = float(ref_row["output_throughput_tok_s"])
        for spec in settings:
            row, res = run_one(prep, spec, b)
            res.raise_if_lossy(f"{trace} {spec} batch {b}")
            a = audit(res.steps, res.sim_time_s)
            tok_s = float(row["output_throughput_tok_s"])
            rows.append({"batch_size": b, "policy": spec, "against": against, "tok_s": tok_s, "ref_tok_s": ref_tok_s,
                         "bound_tok_s": bound_tok_s(tok_s, a), **a})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| batch | setting | tok/s | vs reference | DSpark passes run / useful / wasted | after no n-gram | "
             "wasted pass time | bound tok/s | bound vs reference |",
             "|---:|---|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        share = r["wasted_ms"] / r["step_ms"] if r["step_ms"] else 0.0
        lines.append(f"| {r['batch_size']} | `{r['policy']}` | {r['tok_s']:.1f} | {r['tok_s'] / r['ref_tok_s']:.4f} | "
                     f"{r['ran']} / {r['useful']} / {r['wasted']} of {r['decode_steps']} steps | "
                     f"{r['after_no_ngram']} | {r['wasted_ms']:.0f} ms ({share:.2%}) | {r['bound_tok_s']:.1f} | "
                     f"{r['bound_tok_s'] / r['ref_tok_s']:.4f} |")
    ref = {(r["batch_size"], r["against"], r["ref_tok_s"]) for r in rows}
    lines += ["", "Reference: " + "; ".join(f"batch {b} `{p}` {t:.1f} tok/s" for b, p, t in sorted(ref))]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m sim.skip_audit", description=__doc__.splitlines()[0],
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--trace", default=DEFAULT_TRACE, help="a JSONL trace")
    ap.add_argument("--limit", type=int_at_least(1), default=None, help="the trace's first N requests")
    ap.add_argument("--batch-size", action="append", type=int_at_least(1), default=None,
                    help=f"repeatable (default {', '.join(map(str, BATCHES))})")
    ap.add_argument("--setting", action="append", default=None,
                    help=f"a plugin setting, a hybrid-vllm spec (repeatable; default {DEFAULT_SETTINGS[0]})")
    ap.add_argument("--against", default=DEFAULT_AGAINST, help="the reference policy")
    a = ap.parse_args(argv)
    check_in_file(a.trace, "--trace")
    from sim.core.policies.catalog import get_policy
    from sim.infra.errors import ConfigError

    settings = tuple(a.setting or DEFAULT_SETTINGS)
    for spec in settings:
        if not get_policy(spec).uses_model:  # a bad spec: get_policy's one line, before any work
            raise ConfigError(f"--setting {spec}: runs no DSpark pass, nothing to audit")
    get_policy(a.against)
    rows = measure(a.trace, settings, a.against, tuple(a.batch_size or BATCHES), a.limit)
    print(table(rows))
    return 0
