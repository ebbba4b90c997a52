"""What vLLM verifies past the plugin's chosen chains, and what the one-step-old budget loses, on one trace.

    python -m sim.past_slots [--trace T] [--limit N] [--batch-size B ...] [--setting S ...] [--tail c ...]

Per batch size, under vLLM's charge (`--scheduler vllm`), for the plugin setting S (a `hybrid-vllm` spec, default
DEFAULT_SETTING) with the slots past each chosen chain charged (`fill=vllm`): its output throughput [tok/s], the
share of its decode steps in which vLLM's budget exceeded the positive slots published (so vLLM verified slots past
some chain), those slots and the tokens accepted there (DSpark's own past a shorter n-gram chain); then the same
with the budget from the current publication (`budget=current`, a what-if no vLLM runs), whose throughput over the
first's is the stale budget's loss; and, per tail c, the plugin publishing c past its chain (`tail=c`), before and
after the same what-if. Prints a Markdown table; writes nothing. Tune on traces the reports do not evaluate
(general text by default).
"""
from __future__ import annotations

import argparse

from sim.core.config import PLUGIN_SKIP_SETTING
from sim.infra.cli import ArgumentParser, check_in_file, finite_float, int_at_least

DEFAULT_TRACE = "traces/general.jsonl"
DEFAULT_SETTING = PLUGIN_SKIP_SETTING
BATCHES = (1, 4, 64)
TAILS = (0.05,)


def variants(setting: str, tails: tuple[float, ...]) -> list[str]:
    """The specs run per batch: fill=vllm at tail 0 and each tail c, each with the stale and the current budget."""
    out = [f"{setting}:fill=vllm", f"{setting}:fill=vllm:budget=current"]
    for c in tails:
        out += [f"{setting}:tail={c:g}", f"{setting}:tail={c:g}:budget=current"]
    return out


def measure(trace: str, setting: str, batches: tuple[int, ...], tails: tuple[float, ...],
            limit: int | None = None) -> list[dict]:
    """One row per (batch, spec): tok_s and the run's RunResult.past_slots."""
    from sim.api.run import SimSetup, prepare, run_one

    prep = prepare(SimSetup(trace=trace, scheduler="vllm", ngram_k=32, limit=limit))
    rows = []
    for b in batches:
        for spec in variants(setting, tails):
            row, res = run_one(prep, spec, b)
            res.raise_if_lossy(f"{trace} {spec} batch {b}")
            rows.append({"batch_size": b, "policy": spec, "tok_s": float(row["output_throughput_tok_s"]),
                         **res.past_slots})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| batch | spec | tok/s | steps past a chain | slots past | accepted there | stale budget loss |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    cur = {(r["batch_size"], r["policy"]): r["tok_s"] for r in rows}
    for r in rows:
        what_if = cur.get((r["batch_size"], r["policy"] + ":budget=current"))
        loss = f"{1 - r['tok_s'] / what_if:.2%}" if what_if else ""
        share = r["steps_with"] / r["decode_steps"] if r["decode_steps"] else 0.0
        lines.append(f"| {r['batch_size']} | `{r['policy']}` | {r['tok_s']:.1f} | {share:.1%} | {r['slots']} | "
                     f"{r['accepted']} | {loss} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m sim.past_slots", description=__doc__.splitlines()[0],
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--trace", default=DEFAULT_TRACE, help="a JSONL trace")
    ap.add_argument("--limit", type=int_at_least(1), default=None, help="the trace's first N requests")
    ap.add_argument("--batch-size", action="append", type=int_at_least(1), default=None, help="repeatable")
    ap.add_argument("--setting", default=DEFAULT_SETTING, help="a hybrid-vllm spec (without fill=, tail=, budget=)")
    ap.add_argument("--tail", action="append", type=finite_float(0.0, strict=True), default=None,
                    help="a confidence c published past the chain (repeatable; hybrid-vllm's tail range)")
    a = ap.parse_args(argv)
    check_in_file(a.trace, "--trace")
    from sim.core.policies.catalog import get_policy
    from sim.infra.errors import ConfigError

    if not a.setting.startswith("hybrid-vllm") or any(k in a.setting for k in ("fill=", "tail=", "budget=")):
        raise ConfigError(f"--setting {a.setting}: give a hybrid-vllm spec without fill=, tail= or budget=")
    tails = tuple(a.tail or TAILS)
    for spec in variants(a.setting, tails):
        get_policy(spec)  # a bad setting or tail: one line before any work
    rows = measure(a.trace, a.setting, tuple(a.batch_size or BATCHES), tails, a.limit)
    print(table(rows))
    return 0
