"""Machine-noise preflight: is this machine's speed still enough for a fidelity verdict, before a long validation?

    python -m real.machine_noise [--minutes 3] [--repeats 3] [--margin 3] [--grid default|big] [--json]
                                 [--out FILE [--force]] [--cell-seconds S] [--profile-run-seconds S]
                                 [--model smollm2-135m | --model NAME --random-weights] [--device cpu|cuda]
    python -m real.machine_noise --from-run DIR [--repeats 3] [--margin 3] [--json]

It loads the validation's model as real/validation/validate.py does (SmolLM2-135M, its cached GGUF weights, the KV cache of
the default grid's largest batch), times the speed probe that brackets every timed run of a validation
(real.validation.profile.speed_probe, 3 forwards per shape, as the cells' probes) back to back for --minutes, and reads the
machine's load beside each probe (real/validation/machine_load.py: other processes' cores, steal, load average). From the
series (real/validation/noise_stats.py has the math) it prints, self-contained so that it can be pasted into a note:
  - the speed's spread: each probe's ratio to the series' geometric mean (median |off|, 5-95% range);
  - the drift between the two probes around one profile run and around one cell repeat, and between probes 1,
    2, 5, 10, 20 and 30 minutes apart (those the series covers: the distances between a profile and its cells)
    and the series' span apart;
  - the residual a re-anchored run keeps from the machine alone (the speed inside a run's span against the
    mean of its two bracketing probes), for a cell repeat and a profile run of the grid;
  - from those, with real/validation/fidelity_stats.py's verdict math, the band of a default run (--repeats per cell, 2
    runs per profile point): the smallest margin it can call conclusive here now, and what --margin needs:
    "resolvable", "needs about K repeats per cell", "needs K repeats and R profile runs per point", or
    "cannot be resolved" (within 30 repeats per cell and 12 per profile point);
  - the chance a cell is marked drifted (its repeats' brackets more than the margin apart).
The figures are lower bounds on what a run here would see: the engine's own run-to-run scatter is not in them.
--from-run DIR times nothing: it applies the same arithmetic to a recorded validation run's own scatter (its
re-anchored repeats pooled per trace, its profile's runs), which reproduces the bands its cells were judged with
and says what the margin would have needed on the machine that run met.
--json prints the record instead of the text; --out writes the record (series included) as JSON, refusing an
existing file without --force. Progress lines go to stderr every 15 s.
"""
from __future__ import annotations

import datetime
import json
import math
import sys
import time
from pathlib import Path

from real.validation import noise_stats as ns
from real.validation.fidelity_stats import DEFAULT_MARGIN, PROBE_REPEAT
from real.validation.machine_load import DEFAULT_LOAD_GUARD
from real.validation.validate import (DEFAULT_BATCH_SIZES, DEFAULT_POLICIES, GRIDS, estimate_minutes,
                           estimate_run_seconds)
from sim.infra.cli import ArgumentParser, check_out_file, finite_float, int_at_least, write_whole
from sim.infra.errors import ConfigError
from sim.core.models import llm_name

DEFAULT_MINUTES = 3.0
PROFILE_REPEATS = 2  # runs per profile point of a validation's own profile (real.validation.profile.profile_repeats)
MIN_PROBES = 3
PROFILE_TO_CELL_S = (60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0)  # drift lags reported when the series covers them
MIN_WINDOWS = 20  # run-length windows below which the residual is called rough (the default 3 min gives ~100)
PROGRESS_EVERY_S = 15.0
MAX_PROMPT = 512  # real/validation/validate.py's default --max-prompt: the cells' KV cache is sized by it


def load_model(model: str, random_weights: bool, device: str, max_slots: int, max_len: int):
    """The target model instance as a validation's cells run it (real.validation.workload.Workload.model: its weights, dtype
    and device), with a KV cache of max_slots x max_len; the reference and draft tables are not built."""
    from real.engine.weights import build_model
    from real.validation.workload import target_weights

    weights, dev, dtype = target_weights(model, random_weights, device, "to time it with random weights")
    m, _ = build_model(weights, dev, dtype, max_slots=max_slots, max_len=max_len)
    return m, dev, dtype


def probe_series(model, minutes: float, guard: float, progress: bool = True) -> list[dict]:
    """Speed probes back to back for `minutes` (at least MIN_PROBES), after one discarded: each {"t": seconds since
    the first probe's start, "probe": speed_probe's dict, "load": the machine's load over that probe}."""
    import torch

    from real.validation.machine_load import between, sample
    from real.validation.profile import speed_probe

    threads = torch.get_num_threads()
    speed_probe(model, repeat=PROBE_REPEAT)  # warm-up: first forwards allocate
    series: list[dict] = []
    prev = sample()
    t0, last_note = prev.wall, prev.wall
    end = t0 + 60.0 * minutes
    while True:
        p = speed_probe(model, repeat=PROBE_REPEAT)
        now = sample()
        rec = between(prev, now, threads, guard=guard)
        prev = now
        series.append({"t": now.wall - t0, "probe": p,
                       "load": {"others_cores": rec.others_cores, "steal_cores": rec.steal_cores,
                                "own_cores": rec.own_cores, "loadavg_1": rec.loadavg_after[0] if rec.loadavg_after else None,
                                "loaded": rec.loaded}})
        if progress and now.wall - last_note >= PROGRESS_EVERY_S:
            last_note = now.wall
            oth = "?" if rec.others_cores is None else f"{rec.others_cores:.2f}"
            print(f"machine_noise: {now.wall - t0:5.0f} s of {60 * minutes:.0f}, {len(series)} probes, others "
                  f"{oth} cores, load average {series[-1]['load']['loadavg_1']}", file=sys.stderr, flush=True)
        if now.wall >= end and len(series) >= MIN_PROBES:
            return series


def load_summary(series: list[dict], threads: int, cores: int) -> dict:
    """The load beside the probes: other processes' and steal cores (median, max), the 1-minute load average's
    range, the probes marked loaded."""
    import statistics

    def col(k):
        return [s["load"][k] for s in series if s["load"].get(k) is not None]

    oth, st, la = col("others_cores"), col("steal_cores"), col("loadavg_1")
    return {"threads": threads, "cores": cores,
            "others_median": statistics.median(oth) if oth else None, "others_max": max(oth) if oth else None,
            "steal_median": statistics.median(st) if st else None, "steal_max": max(st) if st else None,
            "loadavg_min": min(la) if la else None, "loadavg_max": max(la) if la else None,
            "loaded": sum(bool(s["load"]["loaded"]) for s in series)}


def analyse(series: list[dict], margin: float, repeats: int, cell_seconds: list[float],
            profile_seconds: list[float], cells: int, minutes_of=None) -> dict:
    """Everything the preflight reports from a probe series (real/validation/noise_stats.py): spread, drift by lag,
    residuals, the default run's band and what `margin` needs. minutes_of(n, r): a run's estimated minutes with
    n repeats per cell and r per profile point (the cost the search minimises; None: n + r)."""
    ys = ns.log_speeds([s["probe"] for s in series])
    ts = [s["t"] for s in series]
    step = (ts[-1] - ts[0]) / (len(ts) - 1) if len(ts) > 1 and ts[-1] > ts[0] else math.nan
    out: dict = {"probes": len(ys), "span_s": ts[-1] - ts[0] if ts else 0.0, "probe_interval_s": step,
                 "spread": ns.spread(ys).__dict__}
    if not math.isfinite(step):
        raise ConfigError("the probe series has no length in time; run longer (--minutes)")
    # the two probes around a run are its bracket apart (bracket_steps); the other lags are plain spans
    lags = [("next probe", step, 1), ("around a profile run", max(profile_seconds),
                                      ns.bracket_steps(max(profile_seconds), step)),
            ("around a cell repeat", max(cell_seconds), ns.bracket_steps(max(cell_seconds), step))]
    # a validation's profile and its cells lie 5-45 minutes apart: the lags the series is long enough for
    lags += [(f"{L / 60:g} minute{'s' if L > 60 else ''}", L, ns.lag_steps(L, step)) for L in PROFILE_TO_CELL_S
             if L < out["span_s"]]
    lags.append(("the series' span", out["span_s"], ns.lag_steps(out["span_s"], step)))
    out["drift"] = [ns.drift_at(ys, k, label, L).__dict__ for label, L, k in lags]
    s_cell, n_cell = ns.pooled_residual(ys, cell_seconds, step)
    s_prof, n_prof = ns.pooled_residual(ys, profile_seconds, step)
    out["residual"] = {"cell": s_cell, "cell_windows": n_cell, "profile": s_prof, "profile_windows": n_prof}
    k_cell = ns.bracket_steps(max(cell_seconds), step)
    out["drift_mark_probability"] = ns.drift_mark_probability(ys, k_cell, margin, repeats)
    out["resolution"] = None
    if s_cell is not None and s_prof is not None:
        cost = minutes_of or (lambda n, r: n + r)
        res = ns.resolve(s_cell, s_prof, margin, cells, repeats, PROFILE_REPEATS, cost)
        out["resolution"] = res.to_json()
        n = res.repeats if res.verdict != "needs profile repeats" else res.pair_repeats
        r = PROFILE_REPEATS if res.verdict != "needs profile repeats" else res.profile_repeats
        out["resolution"]["minutes"] = cost(n, r) if n and r and minutes_of else None
        out["resolution"]["minutes_default"] = cost(repeats, PROFILE_REPEATS) if minutes_of else None
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def conclusion(res: dict | None, margin: float, repeats: int) -> str:
    """The one line a user acts on."""
    m = f"{100 * margin:g}%"
    if res is None:
        return ("=> not measured: the series is shorter than one cell repeat's bracket; run longer (--minutes) "
                "or give shorter runs (--cell-seconds)")
    mins = f" (about {res['minutes']:.0f} min for the grid on one trace)" if res.get("minutes") else ""
    if res["verdict"] == "resolvable":
        return f"=> with this noise a {m} verdict is within reach of the default {repeats} repeats per cell"
    if res["verdict"] == "needs repeats":
        return f"=> with this noise a {m} verdict needs about {res['repeats']} repeats per cell (--repeat {res['repeats']}){mins}"
    if res["verdict"] == "needs profile repeats":
        return (f"=> with this noise a {m} verdict needs about {res['pair_repeats']} repeats per cell and "
                f"{res['profile_repeats']} runs per profile point (python -m real.profile_costs --repeat "
                f"{res['profile_repeats']} ... --out T.json, then real/validate.py --cost-table T.json --repeat "
                f"{res['pair_repeats']}){mins}")
    return (f"=> with this noise a {m} verdict cannot be resolved: the band stays above {m} even with "
            f"{ns.MAX_CELL_REPEATS} repeats per cell and {ns.MAX_PROFILE_REPEATS} runs per profile point; "
            "measure on a machine whose speed holds still")


def format_text(rec: dict) -> str:
    """The preflight's report as text (self-contained: command, time, machine, load, every figure, the line)."""
    a, ld, mc = rec["analysis"], rec["load"], rec["machine"]
    sp = a["spread"]
    lines = [f"machine-noise preflight: {rec['command']}",
             f"  at {rec['utc']} for {rec['minutes_measured']:.1f} min; {mc['cpu']}, {mc['cores']} cores, "
             f"torch {mc['torch']} with {mc['threads']} threads, {mc['model']} {mc['dtype']} on {mc['device']}",
             f"  {a['probes']} speed probes (real.validation.profile.speed_probe, {PROBE_REPEAT} forwards per shape, as a "
             f"validation's), one every {a['probe_interval_s']:.2f} s",
             "load: " + (f"others used median {ld['others_median']:.2f} cores (max {ld['others_max']:.2f}), steal "
                         f"median {ld['steal_median']:.2f} (max {ld['steal_max']:.2f}); " if ld["others_median"] is not
                         None else "counters unknown (no /proc/stat); ")
             + (f"load average {ld['loadavg_min']:.2f}-{ld['loadavg_max']:.2f} (the probes' own {ld['threads']} "
                f"threads count in it); " if ld["loadavg_min"] is not None else "")
             + f"{ld['loaded']} of {a['probes']} probes under load",
             f"speed, as a ratio to the series' geometric mean: median off {_pct(sp['median_abs'])}, 5-95% "
             f"{sp['p05']:.3f}-{sp['p95']:.3f}x (fastest {sp['lo']:.3f}x, slowest {sp['hi']:.3f}x)",
             f"drift between two probes {'lag':>8s} {'median':>7s} {'95%':>7s} {'pairs':>6s}"]
    for d in a["drift"]:
        lines.append(f"  {d['label']:22s} {d['seconds']:7.1f}s {_pct(d['median']):>7s} {_pct(d['p95']):>7s} "
                     f"{d['pairs']:6d}")
    g = rec["grid"]
    rs = a["residual"]
    lines.append(f"re-anchored run's residual from the machine alone (speed inside a run against its brackets' mean): "
                 f"cell repeat {_pct(rs['cell'])} ({g['name']} grid: "
                 f"{', '.join(f'{s:.3g}' for s in g['cell_seconds'])} s; {rs['cell_windows']} windows), profile run "
                 f"{_pct(rs['profile'])} ({', '.join(f'{s:.3g}' for s in g['profile_seconds'])} s; "
                 f"{rs['profile_windows']} windows)")
    res = a["resolution"]
    if res is not None:
        lines.append(f"verdict math (real/validation/fidelity_stats.py): a run with {rec['repeats']} repeats per cell and "
                     f"{PROFILE_REPEATS} runs per profile point over {g['cells']} cells per trace has a noise band of "
                     f"{_pct(res['band_default'])}: the smallest margin it can call conclusive here now "
                     f"(floor {_pct(res['floor'])} at {ns.MAX_CELL_REPEATS} repeats; margin {rec['margin_pct']:g}%)")
    pm = a["drift_mark_probability"]
    if pm is not None:
        lines.append(f"drift mark: a cell's repeats' brackets differ by more than the margin (its median over "
                     f"{rec['repeats']} repeats): probability {_pct(pm)}")
    if ld["loaded"]:
        lines.append(f"note: {ld['loaded']} of {a['probes']} probes ran under load (other processes took cores the "
                     "engine needs): these figures describe that load, not a quiet machine")
    if res is not None and min(rs["cell_windows"], rs["profile_windows"]) < MIN_WINDOWS:
        lines.append(f"note: fewer than {MIN_WINDOWS} windows per run length: the figures are rough; run longer "
                     "(--minutes)")
    lines.append(conclusion(res, rec["margin_pct"] / 100.0, rec["repeats"]))
    lines.append("   (lower bounds: the engine's own run-to-run scatter is not in these figures; docs/real.md, "
                 "'Machine noise')")
    return "\n".join(lines)


def recorded_noise(run_dir: Path, margin: float, repeats: int) -> dict:
    """The same verdict arithmetic on a recorded validation run (no timing): per trace, one repeat's re-anchored
    relative sd pooled over its quiet cells (real/validation/validate.py's pooled scatter of x' = x q), the median |log|
    of its repeats' bracket ratios, and the profile's one-run sd s_1 (real.validation.profile.profile_uncertainty_of); then
    noise_stats.run_band / resolve with them, so that the band printed for `repeats` and 2 profile runs is the one
    the run's cells were judged with."""
    import statistics

    from real.validation.anchor import read_json
    from real.validation.fidelity_stats import pooled_scatter, probe_ratio
    from real.validation.profile import profile_load, profile_uncertainty_of
    from real.validation.pipeline.cells import cell_id
    from real.validation.validate import repeat_speeds, trace_anchor

    fid = read_json(run_dir / "fidelity.json")
    table = run_dir / "cost_table.json"
    s1, p_dof = profile_uncertainty_of(table, one_run=True)
    prof = profile_load(table)
    out = {"run": str(run_dir), "command": fid["meta"].get("command"), "wall_minutes": fid["meta"].get("wall_minutes"),
           "profile_run_sd": s1, "profile_dof": p_dof, "traces": {}}
    by_trace: dict[str, list[dict]] = {}
    for c in fid["cells"]:
        by_trace.setdefault(c["trace"], []).append(c)
    for trace, cells in by_trace.items():
        reps_of = [[read_json(run_dir / Path(trace).stem / "cells" / cell_id(trace, c["policy"], int(c["batch_size"]))
                              / f"real.r{r}.json") for r in range(len(c["repeats"]))] for c in cells]
        pairs = [(r["speed_probe_before"], r["speed_probe"]) for reps in reps_of for r in reps
                 if r.get("speed_probe") and r.get("speed_probe_before")]
        anchor = trace_anchor(prof, pairs, (s1, p_dof))  # as measure_trace: u_a > 0 for a table fitted unanchored
        ua, ua_df = ((anchor["sd"], anchor["dof"] or math.inf) if anchor and not anchor["table_anchored"]
                     else (0.0, math.inf))
        brackets = [abs(math.log(x)) for x in (probe_ratio(a, b) for b, a in pairs) if x]
        s_r, dof = pooled_scatter([[r["tok_per_s"] * q for r, q in zip(reps, repeat_speeds(reps, anchor)
                                                                      or [1.0] * len(reps))]
                                   for reps in reps_of if not any(r["load"]["loaded"] for r in reps)])
        t = {"cells": len(cells), "repeat_sd": s_r if math.isfinite(s_r) else None, "repeat_dof": dof, "anchor_sd": ua,
             "bracket_median": math.expm1(statistics.median(brackets)) if brackets else None}
        if t["repeat_sd"] is not None and p_dof:
            res = ns.resolve(s_r, s1, margin, len(cells), repeats, PROFILE_REPEATS, anchor_sd=ua, anchor_df=ua_df)
            t["resolution"] = res.to_json()
            t["band_max_repeats"] = ns.run_band(s_r, s1, ns.MAX_CELL_REPEATS, ns.MAX_PROFILE_REPEATS, len(cells))
        out["traces"][trace] = t
    return out


def format_recorded(rec: dict, margin: float, repeats: int) -> str:
    took = f"; {rec['wall_minutes']:.1f} min" if rec.get("wall_minutes") else ""
    lines = [f"machine noise of a recorded run: {rec['run']} ({rec['command']}{took})",
             f"  profile: one run's relative sd s_1 (re-anchored when its table was) {_pct(rec['profile_run_sd'])} ({rec['profile_dof']} dof), "
             f"so u_p = {_pct(rec['profile_run_sd'] / math.sqrt(PROFILE_REPEATS))} with {PROFILE_REPEATS} runs per point"]
    for trace, t in rec["traces"].items():
        lines.append(f"  {trace}: one repeat's relative sd (re-anchored where probed) {_pct(t['repeat_sd'])} pooled over its quiet "
                     f"cells ({t['repeat_dof']} dof); a repeat's two probes differ by a median {_pct(t['bracket_median'])}")
        res = t.get("resolution")
        if res:
            ua = (f" (with u_a {_pct(t['anchor_sd'])}: its table was fitted before re-anchoring)"
                  if t["anchor_sd"] else "")
            lines.append(f"    band with {repeats} repeats per cell, as its cells are judged: {_pct(res['band_default'])}"
                         f"{ua}; a new run (re-anchored table) with {ns.MAX_CELL_REPEATS} repeats: {_pct(res['floor'])}; "
                         f"with {ns.MAX_CELL_REPEATS} repeats and {ns.MAX_PROFILE_REPEATS} profile runs per point: "
                         f"{_pct(t['band_max_repeats'])}")
            lines.append("    " + conclusion(res, margin, repeats))
    return "\n".join(lines)


def parse_args(argv):
    ap = ArgumentParser(prog="python -m real.machine_noise", description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=finite_float(0, strict=True), default=DEFAULT_MINUTES,
                    help=f"how long to time the probe back to back (default {DEFAULT_MINUTES:g})")
    ap.add_argument("--repeats", type=int_at_least(2), default=3,
                    help="repeats per cell of the run to judge (real/validate.py --repeat; default 3)")
    ap.add_argument("--margin", type=finite_float(0, strict=True), default=100 * DEFAULT_MARGIN,
                    help="fidelity margin in percent, as real/validate.py --margin (default 3)")
    ap.add_argument("--grid", default="default", choices=sorted(GRIDS),
                    help="the validation grid whose run lengths set the lags (real/validate.py --grid; default default)")
    ap.add_argument("--cell-seconds", type=finite_float(0, strict=True), default=None,
                    help="one cell repeat's seconds (default: the grid's estimate per batch size, real/validation/validate.py)")
    ap.add_argument("--profile-run-seconds", type=finite_float(0, strict=True), default=None,
                    help="one profile run's seconds (default: the profile slice's estimate per batch size)")
    ap.add_argument("--model", default="smollm2-135m", type=llm_name,
                    help="the validation's model (default smollm2-135m, real weights)")
    ap.add_argument("--random-weights", action="store_true", help="random weights (any models/llms name; tests)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    ap.add_argument("--load-guard", type=finite_float(0), default=DEFAULT_LOAD_GUARD,
                    help="as real/validate.py --load-guard: others' cores beyond the free ones that mark a probe loaded")
    ap.add_argument("--from-run", default=None, metavar="DIR",
                    help="time nothing: the same arithmetic on a recorded real/validate.py --out folder's repeats and "
                    "profile (its band per trace, and what --margin would need with that noise)")
    ap.add_argument("--json", action="store_true", help="print the record as JSON instead of the text")
    ap.add_argument("--out", default=None, help="write the record (with the probe series) as JSON to this file")
    ap.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.out:  # before minutes of timing, not after
        check_out_file(a.out, a.force, "--out")
    if a.from_run:
        if not Path(a.from_run).is_dir():
            raise ConfigError(f"--from-run {a.from_run}: not a directory (a real/validate.py --out folder)")
        rec = recorded_noise(Path(a.from_run), a.margin / 100.0, a.repeats)
        if a.out:
            write_whole(Path(a.out), json.dumps(rec) + "\n", overwrite=a.force)
        print(json.dumps(rec) if a.json else format_recorded(rec, a.margin / 100.0, a.repeats))
        return 0
    from real.validation.machine import machine_info
    from real.validation.profile import profile_slice

    grid = GRIDS[a.grid]
    bss = list(DEFAULT_BATCH_SIZES)
    prof = profile_slice(False, bss)
    cell_s = [a.cell_seconds] if a.cell_seconds else estimate_run_seconds(grid["limit"], grid["max_tokens"], bss)
    prof_s = [a.profile_run_seconds] if a.profile_run_seconds else \
        estimate_run_seconds(prof["limit"], prof["max_tokens"], bss)
    cells = len(DEFAULT_POLICIES) * len(bss)
    model, dev, dtype = load_model(a.model, a.random_weights, a.device, max(bss),
                                   MAX_PROMPT + grid["max_tokens"] + 40)
    machine = machine_info(dev, dtype, a.model)
    utc = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"machine_noise: timing the speed probe back to back for {a.minutes:g} min ({machine['cpu']}, "
          f"{machine['threads']} threads)", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    series = probe_series(model, a.minutes, a.load_guard)
    minutes = (time.perf_counter() - t0) / 60.0

    def minutes_of(n: int, r: int) -> float:
        return estimate_minutes(1, grid["limit"], grid["max_tokens"], len(DEFAULT_POLICIES), bss, n,
                                dict(prof, repeats=r))

    analysis = analyse(series, a.margin / 100.0, a.repeats, cell_s, prof_s, cells, minutes_of)
    ld = load_summary(series, machine["threads"], machine["cores"])
    ys = ns.log_speeds([s["probe"] for s in series])
    rec = {"command": "python -m real.machine_noise " + " ".join(argv if argv is not None else sys.argv[1:]), "utc": utc, "minutes_measured": minutes,
           "machine": machine, "margin_pct": a.margin, "repeats": a.repeats,
           "grid": {"name": a.grid, "cells": cells, "cell_seconds": cell_s, "profile_seconds": prof_s,
                    "batch_sizes": bss},
           "load": ld, "analysis": analysis,
           "series": [dict(s, ratio=math.exp(y)) for s, y in zip(series, ys)]}
    rec["conclusion"] = conclusion(analysis["resolution"], a.margin / 100.0, a.repeats)
    if a.out:
        write_whole(Path(a.out), json.dumps(rec) + "\n", overwrite=a.force)
    print(json.dumps({k: v for k, v in rec.items() if k != "series"}) if a.json else format_text(rec))
    if a.out:
        print(f"wrote {a.out}", file=sys.stderr)
    return 0
