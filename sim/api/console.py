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

from typing import Callable

from sim.infra.errors import ConfigError
from sim.core.deploy import DEPLOYABLE, PLUGIN_INSTALL, TIERS, Deployment, serve_flags, tier
from sim.core.metrics import LATENCIES, PERCENTILES
from sim.core.policies import get_policy
from sim.core.vllm import DEFAULT_VLLM_VERSION

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


def _policy(name: str, drafters: str | None = None):
    """The registered policy behind a row's name (None where the name no longer parses)."""
    try:
        return get_policy(name, tuple(str(drafters).split(","))) if drafters else get_policy(name)
    except ConfigError:
        return None


def not_deployable(policy: str) -> str | None:
    """Why `policy` cannot be served as it is simulated (needs tree attention, an upper bound), or None if it can
    (in vLLM as released, with the plugin, or after engine changes: sim.core.deploy.tier says which)."""
    pol = _policy(policy)
    t = "vllm" if pol is None else tier(pol)
    return TIERS[t] if t in ("tree", "bound") else None


ARRIVAL_BOUND_SLACK = 0.05  # a run that ends within 5% of its duration after the last arrival kept up with them
NO_QUEUE_STEPS = 20  # a median TTFT within this many mean steps: requests did not wait for a batch slot


def arrival_bound(row: dict) -> bool:
    """Whether the run's output throughput is what the arrivals offered, not what the engine can do: requests
    arrived over time (not all at t = 0) and either they did not queue (median TTFT <= 20 mean steps) or the run
    ended within 5% of its duration after the last arrival (no backlog was left to drain)."""
    last, dur = _num(row.get("last_arrival_s")), _num(row.get("duration"))
    if row.get("arrivals") in (None, ARRIVALS_AT_ZERO) or last is None or dur is None or not last > 0:
        return False
    ttft, step = _num(row.get("median_ttft_ms")), _num(row.get("mean_step_ms"))
    no_queue = ttft is not None and step is not None and step > 0 and ttft <= NO_QUEUE_STEPS * step
    return no_queue or dur - last <= ARRIVAL_BOUND_SLACK * dur


def _ranking(rs: list[dict], baseline: str | None) -> tuple[str, bool, Callable]:
    """(the key rows are ranked by, whether a smaller value is better, how a value is written). Throughput
    (its ratio to the baseline when one ran), or median TPOT when the fastest runs kept up with the arrivals
    (arrival_bound): their throughput is then the offered load and the latency is what speculation changes."""
    top = max(rs, key=lambda r: _num(r.get("output_throughput_tok_s")) or 0.0)
    if arrival_bound(top):
        return "median_tpot_ms", True, lambda v: f"TPOT {v:.2f} ms"
    if baseline:
        return "speedup_vs_baseline", False, lambda v: f"{v:.3f}x {baseline}"
    return "output_throughput_tok_s", False, lambda v: f"{v:,.0f} tok/s"


def verdicts(rows: list[dict], baseline: str | None, oracle: str = "oracle", group: tuple[str, ...] = (),
             deployment: Deployment | None = None, records: list[dict] | None = None) -> list[str]:
    """Per batch size (and per `group` setup): the recommendation -- the fastest setup a user can serve (in vLLM as
    released or with the plugin: sim.core.deploy's tiers) -- with the `vllm serve` line that runs it when
    `deployment` is given, the runner-up and the margin, whether speculation beats none there, the best setup in
    vLLM as released when the plugin's wins, and the faster setups that are simulated only, need tree attention
    or bound the rest (the per-step oracle always). Ranked by throughput, or by median TPOT where it is
    arrival-bound (_ranking). Where the baseline itself cannot be served for the target (no drafter checkpoint
    published for it), the figures are over `none` (no speculation, what any server runs) and a line says why.
    `records`, when given, gets one dict per batch size (and setup): the same verdict
    as data (verdict_record), which `--out` keeps as verdict.json."""
    keyf = lambda r: tuple(r.get(k) for k in group) + (r.get("batch_size"),)  # noqa: E731
    version = deployment.version if deployment else DEFAULT_VLLM_VERSION
    out = []
    for key in dict.fromkeys(keyf(r) for r in rows):
        label = " ".join(Path(str(v)).stem if k == "trace" else f"{k}={v}" for k, v in zip(group, key[:-1]))
        head = f"{label + ', ' if label else ''}batch {key[-1]}: "
        group_rows = [r for r in rows if keyf(r) == key]
        k_v, lower, fmt = _ranking(group_rows, baseline)
        rs = sorted((r for r in group_rows if _num(r.get(k_v)) is not None),
                    key=lambda r: rank_key(r[k_v], r["policy"], baseline, lower))
        pols = {r["policy"]: _policy(r["policy"], r.get("drafters")) for r in rs}
        tiers = {n: "vllm" if p is None else tier(p) for n, p in pols.items()}
        flags = {}  # policy -> (its `vllm serve` line or None, why not / a note), once per group
        if deployment is not None:  # servable: its line can be given (a checkpoint for this target, ...)
            for n, p in pols.items():
                if tiers[n] in DEPLOYABLE and p is not None:
                    flags[n] = serve_flags(p, deployment, int(key[-1]))
                    if flags[n][0] is None:
                        tiers[n] = "unservable"
        served = [r for r in rs if tiers[r["policy"]] in DEPLOYABLE]
        name = lambda t: TIERS[t].format(version=version)  # noqa: E731
        plain = lambda r: pols[r["policy"]] is not None and pols[r["policy"]].vllm is not None \
            and pols[r["policy"]].vllm.method is None  # noqa: E731 - no speculation (vLLM without --speculative-config)
        none_row = next((r for r in rs if plain(r)), None)
        reference, why_ref = baseline, None  # what the figures are over: the baseline, unless it cannot be served
        if k_v == "speedup_vs_baseline" and tiers.get(baseline) == "unservable" and none_row is not None \
                and _num(none_row[k_v]):
            reference, why_ref, over = none_row["policy"], flags[baseline][1], float(none_row[k_v])
            fmt = lambda v, over=over, ref=reference: f"{v / over:.3f}x {ref}"  # noqa: E731
        if k_v == "median_tpot_ms":
            bound = [r for r in group_rows if arrival_bound(r)]
            tput = [r["output_throughput_tok_s"] for r in bound]
            n_b = f"{len(bound)} setup{'s' * (len(bound) != 1)} that keep{'s' * (len(bound) == 1)} up"
            out.append(head + f"throughput is arrival-bound ({min(tput):,.0f}-{max(tput):,.0f} tok/s for the {n_b}): "
                       "ranked by median TPOT, lower is better (TTFT and E2EL: --format json)")
        first = len(out)
        if not served:
            out.append(head + "no setup a server can run finished")
            if records is not None:
                records.append(verdict_record(key, group, k_v, None, None, None, flags, tiers, out[first:], reference))
            continue
        best = served[0]
        gain = lambda a, b: (b[k_v] / a[k_v] if lower else a[k_v] / b[k_v]) - 1.0  # noqa: E731
        line = head + f"recommended {best['policy']}, {fmt(best[k_v])}, {name(tiers[best['policy']])}"
        if plain(best):
            line += "; speculation does not pay here: serve without --speculative-config"
        elif none_row is not None and why_ref is None:  # (over none, the figure says it already)
            line += f"; speculation pays: {1 + gain(best, none_row):.2f}x none"
        if len(served) > 1:
            nxt = served[1]
            line += f"; runner-up {nxt['policy']} {fmt(nxt[k_v])} (margin {100 * gain(best, nxt):.1f}%)"
        elif len(rs) == 1:
            line += " (the only setup run: nothing to rank it against)"
        out.append(line)
        if why_ref is not None:
            out.append(f"  over {reference} (no speculation), not the baseline {baseline}: {baseline} cannot be served "
                       f"for this model ({why_ref}); {best['policy']} is the best setup that can")
        if deployment is not None:
            out.append(_flags_line(best["policy"], flags))
        if tiers[best["policy"]] == "plugin":
            out.append("  the plugin: " + PLUGIN_INSTALL)
            today = next((r for r in served if tiers[r["policy"]] == "vllm"), None)
            if today is not None:
                out.append(f"  best {name('vllm')}: {today['policy']} {fmt(today[k_v])} "
                           f"(margin {100 * gain(best, today):.1f}%)")
                if deployment is not None:
                    out.append(_flags_line(today["policy"], flags))
        others = []
        unservable = [r for r in rs if tiers[r["policy"]] == "unservable" and gain(r, best) > 0]
        if unservable:  # grouped by why, so one missing checkpoint is said once
            why = {}
            for r in unservable:
                why.setdefault(flags[r["policy"]][1], []).append(f"{r['policy']} {fmt(r[k_v])}")
            out.append("  faster but without vLLM flags for this target: " + "; ".join(
                f"{', '.join(names)} ({reason})" for reason, names in why.items()))
        for t in ("engine", "newer", "tree", "bound"):
            faster = [r for r in rs if tiers[r["policy"]] == t
                      and (gain(r, best) > 0 or r["policy"] == oracle)]
            if faster:
                others.append(f"{name(t)}: " + ", ".join(
                    f"{'per-step oracle' if r['policy'] == oracle else r['policy']} {fmt(r[k_v])}" for r in faster))
        if others:
            out.append("  faster, not servable as is: " + "; ".join(others))
        if records is not None:
            records.append(verdict_record(key, group, k_v, best, served[1] if len(served) > 1 else None,
                                          none_row, flags, tiers, out[first:], reference))
    return out


def verdict_record(key: tuple, group: tuple[str, ...], ranked_by: str, best: dict | None, runner_up: dict | None,
                   none_row: dict | None, flags: dict, tiers: dict, lines: list[str],
                   reference: str | None = None) -> dict:
    """One verdict as data (what `--out` keeps in verdict.json): the batch size and the `group` setup it is for,
    the figure it ranks by, what its ratios are over (`reference`: the baseline, or `none` where the baseline
    cannot be served), the recommended setup and the runner-up (each its policy, `vllm serve` line or None,
    tier and figures; None where there is none), speculation's gain over `none` and the verdict's printed lines."""
    def setup(r: dict | None) -> dict | None:
        if r is None:
            return None
        line, note = flags.get(r["policy"], (None, None))
        return {"policy": r["policy"], "serve": line, "serve_note": note, "tier": tiers.get(r["policy"]),
                ranked_by: _jsonable(r.get(ranked_by)),
                **{k: _jsonable(r.get(k)) for k in ("output_throughput_tok_s", "speedup_vs_baseline", "median_tpot_ms")
                   if k != ranked_by}}

    rec = {"batch_size": int(key[-1]), **{k: _jsonable(v) for k, v in zip(group, key[:-1])}, "ranked_by": ranked_by,
           "reference": reference, "recommended": setup(best), "runner_up": setup(runner_up)}
    if best is not None and none_row is not None:
        a, b = _num(best.get("output_throughput_tok_s")), _num(none_row.get("output_throughput_tok_s"))
        rec["throughput_vs_none"] = a / b if a and b else None
    rec["text"] = lines
    return rec


def verdict_markdown(records: list[dict], header: str | None = None) -> str:
    """verdict.md: the run's header line, then each verdict's printed lines with its `vllm serve` line as code."""
    parts = ["# Verdict", ""] + ([header, ""] if header else [])
    for rec in records:
        parts.append(f"## Batch size {rec['batch_size']}" + "".join(
            f", {k} {v}" for k, v in rec.items() if k not in VERDICT_FIELDS))
        parts.append("")
        serves = {s["serve"] for s in (rec.get("recommended"), rec.get("runner_up")) if s and s.get("serve")}
        for line in rec["text"]:
            text = line.strip()
            parts += (["    " + text] if text in serves else [text]) + [""]
    return "\n".join(parts).rstrip("\n") + "\n"


VERDICT_FIELDS = ("batch_size", "ranked_by", "reference", "recommended", "runner_up", "throughput_vs_none", "text")


def rank_key(value: float, policy: str, baseline: str | None, lower: bool = False) -> tuple:
    """The order the verdict (and reports/paper.md's "What to serve") ranks setups in: by the figure to 4
    significant digits, better first (`lower`: a smaller figure is better), a tie going to the baseline (the
    default a user already runs), then to the better unrounded figure, then by name: the same order whatever order
    the rows come in (the sweep's completion order, a report's columns)."""
    sign = 1 if lower else -1
    return float(f"{value:.4g}") * sign, policy != baseline, value * sign, policy


def _flags_line(policy: str, flags: dict) -> str:
    """The indented `vllm serve` line of a servable setup (the verdict's `flags`: policy -> (line, note))."""
    if policy not in flags:
        return f"  {policy}: no flags (not a registered policy)"
    line, why = flags[policy]
    return "    " + line + (f"  (note: {why})" if why else "")


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
         group: tuple[str, ...] = (), stream=None, deployment: Deployment | None = None) -> None:
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
        for line in verdicts(rows, baseline, group=group, deployment=deployment):
            print(line, file=stream)
