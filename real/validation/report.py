"""A fidelity report from one or more recorded validation runs: markdown and an offline HTML page, never
overwriting a file unless told to.

    python -m real.fidelity_report RUN [RUN ...] --out reports/fidelity-NAME.md [--title TEXT] [--force] [--plotly shared]

Each RUN is a `real/validate.py --out` directory (torch engine) holding its fidelity.json, or several joined by
commas (DIR,DIR): the parts of one run, a grid measured trace by trace on one profiled table, whose cells are
pooled into one run (the aggregate recomputed over them by real/fidelity.aggregate). The report gives,
per run, the command, its wall time, the machine's load over its repeats (other processes' cores, steal, load
averages, clock: real/validation/machine_load.py), its verdict summary and its full cell table (real/fidelity.format_md);
with two or more runs, every cell's verdict and error side by side and whether the runs agree on each; and the
issue's quiet-machine targets checked on the data: the conclusive cells' median |error| <= 3% and max <= 8%, at
most a quarter of the cells inconclusive, every verdict equal across the runs. Nothing is re-measured: the
figures are the runs' fidelity.json. The HTML (OUT with .html) holds each run's throughput figure and renders
offline (sim/infra/html_page.py): plotly.js inlined (--plotly inline, the default), or, with --plotly shared (the
committed reports/), loaded from the one plotly-VERSION.min.js written beside it. Both files are written whole; an
existing one is refused without --force.
"""
from __future__ import annotations

import math
import shlex
import statistics
import sys
from pathlib import Path

from real.validation.fidelity import aggregate, figure_parts, format_md, summary_line
from real.validation.fidelity_stats import VERDICTS, CellVerdict, summarize
from sim.infra.inputs import RECORD, Any, Bool, Dict, Int, List, Maybe, Num, Obj, Opt, Str, read_json
from sim.infra.cli import ArgumentParser
from sim.infra.errors import ConfigError
from sim.core.config import MAX_BATCH_SIZE
from sim.core.cost.profiled import MAX_COUNT

TARGET_MEDIAN, TARGET_MAX, TARGET_INCONCLUSIVE = 0.03, 0.08, 0.25  # the quiet-machine targets

# The torch engine's fidelity.json (real/validation/fidelity.py write_reports), as far as the reports read it: every
# figure they print or compute with is typed and ranged here, so that a damaged or hand-made file is refused in
# one line naming the field (sim/infra/inputs.py). NaN is kept where the writer means "no data" (an aggregate's
# median over no cell, a latency never measured); a rate, a count or a batch size must be finite.
_RATE = Num(lo=0)  # tokens / s
_ERROR = Num(lo=-1)  # predicted / real - 1
_NAN_OK = Num(nan=True)
_SIDE = Obj({"tok_per_s": _RATE, "steps": Int(lo=0), "mean_latency_s": Num(lo=0, nan=True)})
_LOAD = Obj({k: Opt(Maybe(_NAN_OK)) for k in ("others_cores", "steal_cores", "freq_mhz_before")}
            | {"loadavg_before": Opt(Maybe(List(_NAN_OK, lo=1))), "loaded": Opt(Bool())})
_VERDICT = Obj({"repeats": Int(lo=1), "real": _RATE, "real_min": _RATE, "real_max": _RATE, "spread": Num(lo=0),
                "band": Maybe(Num(lo=0)), "predicted": _RATE, "error": _ERROR, "margin": Num(lo=0, strict_lo=True),
                "loaded": Bool(), "verdict": Str(VERDICTS), "reason": Str(), "pred_sd": Opt(Num(lo=0)),
                "band_real": Opt(Maybe(Num(lo=0))), "drifted": Opt(Bool()), "anchored": Opt(Bool()),
                "speed": Opt(Num(lo=0, strict_lo=True)), "anchor_sd": Opt(Num(lo=0))}, extra=False)
_SUMMARY = Obj({"cells": Int(lo=0), "agrees": Int(lo=0), "disagrees": Int(lo=0), "inconclusive": Int(lo=0),
                "loaded": Int(lo=0), "median_error": Maybe(Num(lo=0, nan=True)), "max_error": Maybe(Num(lo=0, nan=True)),
                "verdict": Str(), "drifted": Opt(Int(lo=0)), "anchored": Opt(Int(lo=0))}, extra=False)
_CELL = Obj({"trace": Str(), "policy": Str(), "batch_size": Int(1, MAX_BATCH_SIZE), "requests": Int(1, 10**9),
             "output_tokens": Int(0, MAX_COUNT), "predicted": _SIDE, "synthetic": Obj({"tok_per_s": _RATE}),
             "real": Obj({"tok_per_s": _RATE, "steps": Int(lo=0), "mean_latency_s": Num(lo=0, nan=True),
                          "lossless": Bool(), "outputs_equal_reference": Bool(), "tie_flips": Opt(Int(lo=0)),
                          "tokens_per_engine_step": Opt(Num(lo=0, nan=True)), "tokens_per_step": Opt(Num(lo=0, nan=True)),
                          "cpu_tok_per_s": Opt(Maybe(_RATE))}),
             "predicted_error": _ERROR, "synthetic_error": _ERROR, "step_error_median": Num(lo=0, nan=True),
             "steps_error": Opt(_NAN_OK), "tokens_per_step_error": Opt(Maybe(_NAN_OK)), "loaded": Opt(Bool()),
             "repeats": Opt(List(Obj({"tok_per_s": _RATE, "load": Opt(Maybe(_LOAD))}))), "verdict": Opt(_VERDICT),
             "drift": Opt(Maybe(Obj({"speed_vs_profile": Num(lo=0, strict_lo=True), "error": Num()}))),
             "anchor": Opt(Maybe(Obj({"speed": Num(lo=0, strict_lo=True), "real_at_reference": _RATE,
                                      "error_wall": Num()})))})
FIDELITY_SCHEMA = Obj({
    "meta": Obj({"command": Str(), "machine": Dict(Any()), "model": Str(), "mode": Str(), "max_tokens": Int(lo=1),
                 "max_prompt": Int(lo=1), "repeats": Opt(Int(lo=1)), "margin": Opt(Num(lo=0, strict_lo=True)),
                 "wall_minutes": Opt(Maybe(Num(lo=0))), "quick": Opt(Bool()), "drafter_note": Opt(Str()),
                 "speed_probes": Opt(Maybe(Dict(Obj({"note": Str()}))))}),
    "aggregate": Obj({"median_error": _NAN_OK, "max_error": _NAN_OK, "median_step_error": _NAN_OK,
                      "median_synthetic_error": _NAN_OK, "all_lossless": Bool(), "verdicts": Opt(Maybe(_SUMMARY)),
                      "drift_corrected": Opt(Obj({"cells": Int(lo=0), "median_error": Num(lo=0),
                                                  "max_error": Num(lo=0)}))}),
    "cells": List(_CELL, lo=1)}, expected="a real/validate.py fidelity.json (an object of meta, aggregate, cells)")


def read_fidelity(run_dir: Path, schema: Obj = FIDELITY_SCHEMA) -> dict:
    """A torch-engine run's fidelity.json, read through the input layer (sim/infra/inputs.py) and checked against
    FIDELITY_SCHEMA: one ConfigError naming the file and the field otherwise (a pipe, /dev/zero, a truncated file,
    a wrong type, NaN where a figure must be finite, no cell)."""
    d = Path(run_dir)
    if not d.is_dir():
        raise ConfigError(f"{d}: not a directory (give a real/validate.py --out directory)")
    return read_json(d / "fidelity.json", RECORD, schema, finite=False)


def load_run(run: Path | str) -> dict:
    """A run's fidelity.json (ConfigError naming the file when missing or unreadable). `run` may join several
    directories with commas: the parts of one run, pooled (module docstring); a cell measured in two parts, or
    parts of different cell shapes (output tokens, prompt cap, repeats), is a ConfigError."""
    dirs = [Path(d) for d in str(run).split(",")]
    fids = []
    for d in dirs:
        fids.append(read_fidelity(d))
    if len(fids) == 1:
        return fids[0]
    seen: dict[str, Path] = {}
    for d, fid in zip(dirs, fids):
        for c in fid["cells"]:
            k = _cell_key(c)
            if k in seen:
                raise ConfigError(f"{run}: cell '{k}' is in both {seen[k]} and {d}; parts of one run share no cell "
                                  "(give two runs as two arguments)")
            seen[k] = d
    m0 = fids[0]["meta"]
    for d, fid in zip(dirs[1:], fids[1:]):
        for key in ("max_tokens", "max_prompt", "repeats", "margin", "model"):
            if fid["meta"].get(key) != m0.get(key):
                raise ConfigError(f"{run}: {d} has {key} {fid['meta'].get(key)!r} against {m0.get(key)!r} in "
                                  f"{dirs[0]}: not parts of one run")
    cells = [c for fid in fids for c in fid["cells"]]
    walls = [fid["meta"].get("wall_minutes") for fid in fids]
    # the formatters wrap the command in backticks: the parts' commands come out as `a` and `b`
    meta = dict(m0, command=" and ".join(f"`{fid['meta'].get('command', '?')}`" for fid in fids).strip("`"),
                wall_minutes=sum(walls) if all(w is not None for w in walls) else None,
                speed_probes={k: v for fid in fids for k, v in (fid["meta"].get("speed_probes") or {}).items()},
                parts=[str(d) for d in dirs], quick=any(fid["meta"].get("quick") for fid in fids))
    return {"meta": meta, "aggregate": aggregate(cells), "cells": cells}


def _cell_key(c: dict) -> str:
    return f"{Path(c['trace']).stem} {c['policy']} bs{c['batch_size']}"


def load_summary(cells: list[dict]) -> str:
    """The machine's load over a run's repeats, in one sentence."""
    recs = [r["load"] for c in cells for r in c.get("repeats", []) if r.get("load")]
    if not recs:
        return "no load recorded"
    vals = lambda k: [x[k] for x in recs if x.get(k) is not None]  # noqa: E731
    others, steal = vals("others_cores"), vals("steal_cores")
    la = [x["loadavg_before"][0] for x in recs if x.get("loadavg_before")]
    mhz = vals("freq_mhz_before")
    loaded = sum(bool(x.get("loaded")) for x in recs)
    parts = [f"{len(recs)} repeats"]
    if others:
        parts.append(f"others {min(others):.2f}-{max(others):.2f} cores")
    if steal:
        parts.append(f"steal {min(steal):.2f}-{max(steal):.2f}")
    if la:
        parts.append(f"1-min load average {min(la):.2f}-{max(la):.2f}")
    if mhz:
        parts.append(f"clock {min(mhz):.0f}-{max(mhz):.0f} MHz")
    parts.append(f"{loaded} measured under load")
    return ", ".join(parts)


def _target_rows(name: str, v: dict) -> list[tuple[str, bool | None, str]]:
    conc = v["agrees"] + v["disagrees"]
    med, mx = v.get("median_error"), v.get("max_error")
    return [(f"{name}: conclusive cells' median |error| <= {100 * TARGET_MEDIAN:.0f}%",
             None if med is None else med <= TARGET_MEDIAN,
             "no conclusive cell" if med is None else f"{100 * med:.1f}% over {conc} cells"),
            (f"{name}: conclusive cells' max |error| <= {100 * TARGET_MAX:.0f}%",
             None if mx is None else mx <= TARGET_MAX, "no conclusive cell" if mx is None else f"{100 * mx:.1f}%"),
            (f"{name}: at most {TARGET_INCONCLUSIVE:.0%} of the cells inconclusive",
             v["inconclusive"] <= TARGET_INCONCLUSIVE * v["cells"], f"{v['inconclusive']} of {v['cells']}")]


def targets(runs: list[dict]) -> list[tuple[str, bool | None, str]]:
    """(target, met, figures) for the issue's quiet-machine targets on these runs; met None: not applicable.
    Runs that share no cell (one grid measured trace by trace, e.g. on one profiled table) are parts of one run:
    the targets are then also checked over all their cells together, and agreement between runs is n/a."""
    out = []
    for i, fid in enumerate(runs, 1):
        v = fid["aggregate"].get("verdicts")
        if not v:
            out.append((f"run {i}: verdicts", None, "no verdicts (one repeat per cell, or the vLLM engine)"))
            continue
        out += _target_rows(f"run {i}", v)
    if len(runs) >= 2:
        same, total = verdict_agreement(runs)
        if total:
            out.append(("the runs agree on every cell's verdict", same == total, f"{same} of {total} cells"))
            flips = contradictions(runs)
            out.append(("no cell agrees in one run and disagrees in another", not flips,
                        f"{len(flips)} of {total} cells" + (f": {', '.join(flips)}" if flips else
                                                            "; the other differences are conclusive against inconclusive")))
        else:
            allv = summarize(CellVerdict.from_json(c["verdict"]) for fid in runs for c in fid["cells"]
                             if c.get("verdict")).to_json()  # as real/validation/fidelity.py forms a run's aggregate
            if allv["cells"]:
                out += _target_rows(f"runs 1-{len(runs)} together (no cell in common: parts of one grid)", allv)
            out.append(("the runs agree on every cell's verdict", None, "no cell in common: agreement needs a rerun "
                        "(parts of one run: join them as DIR,DIR)"))
    return out


def common_verdicts(runs: list[dict]) -> dict[str, set[str]]:
    """{cell: the set of its verdicts over the runs} for the cells judged in every run, in the first run's order."""
    maps = [{_cell_key(c): c["verdict"]["verdict"] for c in fid["cells"] if "verdict" in c} for fid in runs]
    return {k: {m[k] for m in maps} for k in maps[0] if all(k in m for m in maps[1:])}


def verdict_agreement(runs: list[dict]) -> tuple[int, int]:
    """(cells with the same verdict in every run, cells present in every run)."""
    common = common_verdicts(runs)
    return sum(len(v) == 1 for v in common.values()), len(common)


def contradictions(runs: list[dict]) -> list[str]:
    """The cells present in every run that agree in one and disagree in another: the verdicts' contradictions.
    A cell conclusive in one run and inconclusive in another is not one (an error near margin + band falls either
    side of it from run to run); agreeing and disagreeing both are, since each excludes the other at the 5% level."""
    return [k for k, v in common_verdicts(runs).items() if {"agrees", "disagrees"} <= v]


def format_report(runs: list[dict], dirs: list[str], title: str, command: str) -> str:
    lines = [f"# {title}", "", f"Produced by `{command}` from the recorded runs below (nothing re-measured: each "
             "run's figures are its fidelity.json; real/validation/report.py).", ""]
    for i, (fid, d) in enumerate(zip(runs, dirs), 1):
        m = fid["meta"]
        wall = m.get("wall_minutes")
        lines += [f"- **Run {i}** (`{d}`): `{m.get('command', '?')}`"
                  + (f", {wall:.1f} min" if wall is not None else "") + f"; load: {load_summary(fid['cells'])}."]
        v = fid["aggregate"].get("verdicts")
        if v:
            lines.append(f"  {summary_line(v)}.")
        if m.get("quick"):
            lines.append("  --quick: it checks the pipeline, not fidelity.")
    lines += ["", "## Targets (a quiet machine)", "", "| target | met | figures |", "|---|---|---|"]
    for name, met, fig in targets(runs):
        lines.append(f"| {name.replace('|', chr(92) + '|')} | {'n/a' if met is None else 'yes' if met else 'NO'} | {fig} |")
    lines.append("")
    if len(runs) >= 2:
        lines += ["## Verdicts side by side", "",
                  "| cell | " + " | ".join(f"run {i} error | run {i} band | run {i} verdict"
                                          for i in range(1, len(runs) + 1)) + " | same |",
                  "|---|" + "---:|---:|---|" * len(runs) + "---|"]
        maps = [{_cell_key(c): c for c in fid["cells"]} for fid in runs]
        for k in maps[0]:
            if not all(k in m for m in maps[1:]):
                continue
            row, vs = f"| {k} |", set()
            for m in maps:
                v = m[k].get("verdict") or {}
                band = v.get("band")
                row += (f" {100 * v.get('error', math.nan):+.1f}% | {'-' if band is None else f'{100 * band:.1f}%'} | "
                        f"{v.get('verdict', '-')}{' (drift)' if v.get('drifted') else ''} |")
                vs.add(v.get("verdict"))
            lines.append(row + f" {'yes' if len(vs) == 1 else 'NO'} |")
        errs = [[abs(m[k]["verdict"]["error"]) for k in maps[0] if all(k in mm for mm in maps)] for m in maps]
        if errs and errs[0]:
            diffs = [abs(a - b) for a, b in zip(*errs[:2])]
            lines += ["", f"Runs 1 and 2: median |difference| of the cells' |error| {100 * statistics.median(diffs):.1f} "
                          f"points, max {100 * max(diffs):.1f}."]
        lines.append("")
    for i, fid in enumerate(runs, 1):
        body = format_md(fid["cells"], fid["aggregate"], fid["meta"]).splitlines()
        lines += [f"## Run {i}", ""] + ["#" + ln if ln.startswith("# ") else ln for ln in body[1:]] + [""]
    return "\n".join(lines)


def format_page(runs: list[dict], title: str, plotly: str = "inline") -> str:
    from sim.infra.html_page import heading, page

    parts = [heading(1, title)]
    for i, fid in enumerate(runs, 1):
        parts += [heading(2, f"Run {i}")] + figure_parts(fid["cells"], fid["aggregate"], f"fidelity-run{i}", level=3)
    return page(title, parts, plotly)


def main(argv: list[str] | None = None) -> int:
    from sim.infra.cli import check_out_file, write_files
    from sim.infra.html_page import add_plotly_flag, check_asset, write_asset

    ap = ArgumentParser(prog="python -m real.fidelity_report", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", nargs="+", help="real/validate.py --out directories (torch engine), in order; "
                    "DIR,DIR: the parts of one run (a grid measured trace by trace)")
    ap.add_argument("--out", required=True, help="the markdown file to write (the page: the same name, .html)")
    ap.add_argument("--title", default="Fidelity: the simulator against the real engine", help="the report's title")
    ap.add_argument("--force", action="store_true", help="overwrite --out and its .html when they exist")
    add_plotly_flag(ap, "the .html page: ")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if out.suffix != ".md":
        raise ConfigError(f"--out {out}: give a .md file (the page is written beside it as .html)")
    page_out = out.with_suffix(".html")
    for f in (out, page_out):  # before any work; claimed against a second writer until written
        check_out_file(f, a.force, "--out", hint="pass --force to overwrite it, or another --out")
    if a.plotly == "shared":
        check_asset(page_out.parent)
    dirs = list(a.run_dir)
    runs = [load_run(d) for d in dirs]
    command = "python -m real.fidelity_report " + shlex.join(argv if argv is not None else sys.argv[1:])
    text, page_text = format_report(runs, dirs, a.title, command) + "\n", format_page(runs, a.title, a.plotly)
    if a.plotly == "shared":
        write_asset(page_out.parent)  # the shared plotly.js first, so the page never points at a missing file
    # the .md and its .html as one unit (a full disk or a kill leaves both old or both new, never one alone)
    write_files(out.parent, {out.name: text, page_out.name: page_text}, overwrite=a.force, unit=out.name)
    for name, met, fig in targets(runs):
        print(f"{'n/a' if met is None else 'met' if met else 'MISSED':6s} {name}: {fig}")
    print(f"wrote {out} and {page_out}")
    return 0
