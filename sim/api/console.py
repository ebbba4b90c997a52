"""What the simulator's commands print: the narrow results table, a verdict per batch size, CSV/JSON/vLLM-style
output, and progress lines for logs (stderr not a terminal).

The table holds the columns people read: policy, batch size, output tokens/s, the ratio to the baseline,
tokens per request-step and median TTFT/TPOT (ms). Everything else (the step-time breakdown, acceptance,
the vLLM latency percentiles) is in `--format json|csv` and in summary.json.
"""
from __future__ import annotations

import csv
import io
import json
import math
import sys
from pathlib import Path

from sim.infra.errors import ConfigError
from sim.core.metrics import LATENCIES, PERCENTILES
from sim.core.policies import get_policy

FORMATS = ("table", "csv", "json", "vllm")
FORMAT_HELP = ("table: the narrow table and a verdict per batch size; csv, json: every metric of every run "
               "(vLLM's names: mean/median/p99 TTFT, TPOT, ITL, E2EL in ms, request_throughput, output_throughput); "
               "vllm: one block per run laid out as `vllm bench serve` prints its result")


def _num(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def columns(baseline: str | None) -> list[tuple[str, str, str]]:
    """(row key, header, format) of the narrow table; no ratio column when no baseline ran (None)."""
    ratio = [("speedup_vs_baseline", f"x {baseline}", "{:.3f}")] if baseline else []
    return [("policy", "policy", "{}"), ("batch_size", "batch", "{:d}"), ("output_throughput_tok_s", "out tok/s", "{:,.0f}"),
            *ratio, ("mean_tokens_per_step", "tok/step", "{:.2f}"),
            ("median_ttft_ms", "TTFT ms", "{:,.0f}"), ("median_tpot_ms", "TPOT ms", "{:.2f}")]


def _cell(v, fmt: str) -> str:
    if isinstance(v, str):
        return v
    if fmt == "{:d}":
        f = _num(v)
        return "-" if f is None else str(int(f))
    if fmt == "{}":
        return str(v)
    f = _num(v)
    return "-" if f is None else fmt.format(f)


def format_table(rows: list[dict], baseline: str | None, lead: list[tuple[str, str]] = ()) -> str:
    """The narrow table; `lead`: extra (key, header) columns first (a sweep's setup keys that vary)."""
    cols = [(k, h, "{}") for k, h in lead] + columns(baseline)
    cells = [[h for _, h, _ in cols]] + [[_cell(r.get(k), f) for k, _, f in cols] for r in rows]
    text_cols = {i for i, (_, _, f) in enumerate(cols) if f == "{}"}
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    lines = ["  ".join(c[i].ljust(widths[i]) if i in text_cols else c[i].rjust(widths[i]) for i in range(len(cols))).rstrip()
             for c in cells]
    lines.insert(1, "-" * max(len(x) for x in lines))
    return "\n".join(lines)


TABLE_NOTE = ("tok/step: output tokens per request per decode step; TTFT, TPOT: medians in ms\n"
              "(--format json or csv: mean, median and p99 of TTFT, TPOT, ITL and E2EL, and every other metric)")
ARRIVALS_AT_ZERO = "all at t=0"  # a row's `arrivals`: the trace has no arrival times and no --rate was given
ARRIVALS_NOTE = ("note: all requests arrive at t = 0 (the trace has no arrival times; vLLM's\n"
                 "--request-rate inf): TTFT counts the wait for a batch slot; --request-rate R\n"
                 "gives Poisson arrivals")


def not_deployable(policy: str) -> str | None:
    """Why `policy` cannot be deployed as it is simulated, or None if it can: a tree policy needs tree attention
    (verifying two chains as branches; vLLM verifies one chain per request), a policy that reads the true accepted
    lengths (the per-step oracle) is an upper bound, not something a server can run."""
    try:
        pol = get_policy(policy)
    except ConfigError:
        return None
    if pol.needs_truth:
        return "upper bound"
    if pol.tree:
        return "needs tree attention"
    return None


def verdicts(rows: list[dict], baseline: str | None, oracle: str = "oracle", group: tuple[str, ...] = ()) -> list[str]:
    """One line per batch size (and per `group` setup): the fastest deployable policy against the baseline
    (one chain per request, no tree attention, no oracle: not_deployable), the deployable runner-up, and any
    faster policy that cannot be deployed, named as such (the per-step oracle always, as an upper bound).
    baseline None (no baseline ran): ranked by output throughput instead."""
    keyf = lambda r: tuple(r.get(k) for k in group) + (r.get("batch_size"),)  # noqa: E731
    key_v = "speedup_vs_baseline" if baseline else "output_throughput_tok_s"
    fmt = (lambda v: f"{v:.3f}x") if baseline else (lambda v: f"{v:,.0f} tok/s")  # noqa: E731
    out = []
    for key in dict.fromkeys(keyf(r) for r in rows):
        rs = [r for r in rows if keyf(r) == key and _num(r.get(key_v)) is not None]
        label = " ".join(Path(str(v)).stem if k == "trace" else f"{k}={v}" for k, v in zip(group, key[:-1]))
        head = f"{label + ', ' if label else ''}batch {key[-1]}: "
        ranked = sorted(rs, key=lambda r: -r[key_v])
        why = {r["policy"]: not_deployable(r["policy"]) for r in ranked}
        pols = [r for r in ranked if why[r["policy"]] is None]
        if not pols:
            out.append(head + (f"no deployable run beside the baseline '{baseline}' finished" if baseline
                               else "no deployable run finished"))
            continue
        best = pols[0]
        line = head + f"{best['policy']} is the fastest deployable policy, {fmt(best[key_v])}" + (f" {baseline}" if baseline else "")
        if best["policy"] == baseline:
            line = head + f"the baseline {baseline} is the fastest deployable policy"
        if len(pols) > 1:
            nxt = pols[1]
            line += f"; next {nxt['policy']} {fmt(nxt[key_v])}"
        beyond = [r for r in ranked if why[r["policy"]] is not None
                  and (r[key_v] > best[key_v] or r["policy"] == oracle)]
        if beyond:
            line += "; not deployable: " + ", ".join(
                f"{'per-step oracle' if r['policy'] == oracle else r['policy']} {fmt(r[key_v])} ({why[r['policy']]})"
                for r in beyond)
        out.append(line)
    return out


def format_csv(rows: list[dict]) -> str:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: r.get(k) for k in keys})
    return buf.getvalue().rstrip("\n")


def _jsonable(v):
    if hasattr(v, "item"):  # numpy scalars
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def format_json(rows: list[dict]) -> str:
    return json.dumps([{k: _jsonable(v) for k, v in r.items()} for r in rows], indent=1)


def format_vllm(row: dict) -> str:
    """One run laid out as `vllm bench serve` prints its result (its labels, ms)."""
    where = f" on {Path(str(row['trace'])).stem}" if row.get("trace") else ""
    title = f" {row.get('policy')} at batch {row.get('batch_size')}{where} "
    lines = ["{s:{c}^{n}}".format(s=title, n=50, c="=")]

    def add(label, v, fmt="{:<10.2f}"):
        f = _num(v)
        lines.append("{:<40} ".format(label) + ("-" if f is None else fmt.format(f if fmt != "{:<10}" else int(f))))

    add("Successful requests:", row.get("completed"), "{:<10}")
    add("Benchmark duration (s):", row.get("duration"))
    add("Total input tokens:", row.get("total_input_tokens"), "{:<10}")
    add("Total generated tokens:", row.get("total_output_tokens"), "{:<10}")
    add("Request throughput (req/s):", row.get("request_throughput"))
    add("Output token throughput (tok/s):", row.get("output_throughput"))
    add("Total token throughput (tok/s):", row.get("total_token_throughput"))
    for key, name, header in LATENCIES:
        lines.append("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        add(f"Mean {name} (ms):", row.get(f"mean_{key}_ms"))
        add(f"Median {name} (ms):", row.get(f"median_{key}_ms"))
        for p in PERCENTILES:
            add(f"P{p} {name} (ms):", row.get(f"p{p}_{key}_ms"))
    if _num(row.get("num_drafts")):  # vLLM prints this section when the server speculates
        lines.append("{s:{c}^{n}}".format(s="Speculative Decoding", n=50, c="-"))
        add("Acceptance rate (%):", 100 * row["accepted_tokens"] / row["draft_tokens"] if row.get("draft_tokens") else None)
        add("Acceptance length:", row.get("acceptance_length"))
        add("Drafts:", row.get("num_drafts"), "{:<10}")
        add("Draft tokens:", row.get("draft_tokens"), "{:<10}")
        add("Accepted tokens:", row.get("accepted_tokens"), "{:<10}")
        per_pos = _positions(row.get("acceptance_per_position"))
        if per_pos:
            lines.append("Per-position acceptance (%):")
            for i, rate in enumerate(per_pos):
                add(f"  Position {i}:", 100 * rate)
    lines.append("=" * 50)
    return "\n".join(lines)


def _positions(v) -> list[float]:
    """The per-position acceptance list (a list, or its text from a CSV), cut after the last position any draft
    accepted (the rest are zeros up to the longest chain the run could draft)."""
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return []
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return []
    v = [float(x) for x in v]
    while v and v[-1] == 0:
        v.pop()
    return v


def emit(rows: list[dict], fmt: str, baseline: str | None, header: str | None = None, lead: list[tuple[str, str]] = (),
         group: tuple[str, ...] = (), stream=None) -> None:
    """Print `rows` in `fmt` to stdout: table (header line, table, note, verdicts), csv, json or vllm."""
    stream = stream or sys.stdout
    if fmt == "csv":
        print(format_csv(rows), file=stream)
    elif fmt == "json":
        print(format_json(rows), file=stream)
    elif fmt == "vllm":
        print("\n".join(format_vllm(r) for r in rows), file=stream)
    else:
        if header:
            print(header, file=stream)
        print(format_table(rows, baseline, lead), file=stream)
        print(TABLE_NOTE, file=stream)
        if any(r.get("arrivals") == ARRIVALS_AT_ZERO for r in rows):
            print(ARRIVALS_NOTE, file=stream)
        for line in verdicts(rows, baseline, group=group):
            print(line, file=stream)
