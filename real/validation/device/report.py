"""device_check.json and device_check.md: the versions first, then one row per check and its figures.

The JSON holds everything (every figure, each failed check's traceback); the markdown is for reading: the
versions, a table of the checks (status, seconds, the one-line summary) and per check its figures, a list of
records as a table, a mapping as `key: value` lines.
"""
from __future__ import annotations

import json

from real.validation.device.runner import STATUSES, CheckResult


def report_json(meta: dict, results: list[CheckResult]) -> dict:
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    return {**meta, "passed": counts["fail"] == 0, "counts": counts, "checks": [r.to_json() for r in results]}


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(", ", ": "), default=str).replace("|", "\\|")
    return str(v).replace("|", "\\|")


def _table(rows: list[dict]) -> list[str]:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    return (["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            + ["| " + " | ".join(_cell(r.get(c, "")) for c in cols) + " |" for r in rows])


def _figures(figures: dict) -> list[str]:
    out = []
    for k, v in figures.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            out += ["", f"{k}:", "", *_table(v), ""]
        else:
            out.append(f"- {k}: {_cell(v)}")
    return out


def report_md(doc: dict) -> str:
    c = doc["counts"]
    lines = ["# Device check: the vLLM plugin's device code", "",
             f"`{doc['command']}` on {doc['device']}, {doc['started']}; {doc['elapsed_s']:.0f} s of a "
             f"{doc['budget_s']:.0f} s budget. **{c['pass']} passed, {c['fail']} failed, {c['skip']} skipped"
             f"{', %d informational' % c['info'] if c.get('info') else ''}.**", "",
             "## Versions", ""]
    lines += [f"- {k}: {'none' if v is None else v}" for k, v in doc["versions"].items()]
    lines += ["", "## Checks", "", "| check | status | seconds | summary |", "|---|---|---:|---|"]
    for r in doc["checks"]:
        lines.append(f"| {r['key']} {r['name']} | {r['status'].upper()} | {r['seconds']:.1f} | {_cell(r['summary'])} |")
    for r in doc["checks"]:
        lines += ["", f"## {r['key']}. {r['title']}", "", f"**{r['status'].upper()}**: {r['summary']}", ""]
        lines += _figures(r["figures"])
        if r.get("error"):
            lines += ["", "The traceback is in device_check.json."]
    return "\n".join(lines).replace("\n\n\n", "\n\n") + "\n"
