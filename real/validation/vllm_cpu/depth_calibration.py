"""`python -m real.depth_calibration`: per-depth acceptance of the plugin's chosen n-gram chains in the
real vLLM CPU engine against the simulator's calibrated estimate, with what is needed to read the gap.

Inputs: run directories (--run, repeatable) in `real/validate.py --engine vllm`'s layout: OUT/<trace>/bs<B>/hybrid/
cell.json (the plugin's counters) and OUT/<trace>/bs<B>/reference.jsonl (the target's outputs). Either finished
validate runs (read only), or --out with --trace: then this command first runs the hybrid cells itself, one vLLM
process per trace (real/validation/vllm/cells.run_cell: cached by its spec, so a rerun resumes), without the `none`,
`adaptive` and `ngram` cells a validate run adds: the chains are all this table needs, and the reference is the
hybrid's own outputs (the target's greedy text: the hybrid is lossless in every validate cell).

Depth semantics (the same on every side): depth j (1-based) is the conditional acceptance
    q_j = P(token j accepted | tokens 1..j-1 accepted, slot j verified),
which is what the calibrator publishes (sim.core.drafters.calibration: p_ij, a discrete-time hazard) and what the
plugin counts (real/vllm_plugin/hybrid.py `observe`: slot j reached iff j - 1 <= accepted and j <= admitted, where
vLLM's num_rejected = logits computed - tokens sampled, so admitted = the slots adaptive verification kept; accepted
iff j <= accepted), not the survival prod_{l <= j} q_l.

Tables:
  A  the plugin's counters pooled over the hybrid cells: chains the hybrid chose and vLLM verified to depth j
     (reached), accepted there, observed = accepted / reached, calibrated = mean published confidence over the same
     slots, and the binomial standard error sqrt(o (1 - o) / reached) of the observed share (how much of a gap the
     count alone explains). Mean |observed - calibrated| over the depths reached >= MIN_REACHED times.
  B  the calibrator over EVERY n-gram proposal in the same requests' outputs (none's, i.e. the target's greedy
     text; no choice, no admission): the censored slots (i, j) with j <= chain length, the first j - 1 tokens
     accepted, and output position i + j - 1 inside the recorded output (a slot past max_tokens has no label
     here, though vLLM verifies it). If B shows the gap of A, the gap is the calibrator's on this text, not the
     plugin's accounting or the hybrid's selection.
  C  the same over the traces' own recorded outputs (the text the simulator's runs see and the calibrator was
     checked on by `python -m sim.calibrate`), for the same request ids and for the whole trace (--trace-limit).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from real.validation.fidelity import MIN_REACHED  # a depth counts as a measurement from this many slots on
from sim.infra.cli import SEED
from sim.infra.inputs import CACHE, RECORD, Any, Dict, Int, List, Maybe, Obj, Opt, parse_json, read_json, read_text
from sim.infra.errors import ConfigError

K = 7  # the plugin's chain width in these runs (num_speculative_tokens)


# what is read of the runs' recorded files (sim/infra/inputs.py): a cell's plugin counters, a reference's token ids
_CELL = Obj({"real": Obj({"plugin": Opt(Maybe(Dict(Any())))})})
_REFERENCE = Obj({"id": Any(), "prompt_ids": List(Int(lo=0)), "output_ids": List(Int(lo=0))})


def plugin_depths(runs: list[Path]) -> tuple[list[dict], list[str]]:
    """Table A: the plugin's per-depth counters pooled over every hybrid cell under the runs."""
    reached, accepted, conf, cells = {}, {}, {}, []
    for run in runs:
        for path in sorted(run.glob("*/bs*/hybrid/cell.json")):
            pl = read_json(path, RECORD, _CELL, finite=False)["real"].get("plugin") or {}
            if pl.get("ngram_accepted") is None:
                continue
            cells.append(str(path.parent))
            for d, (r, a, p) in enumerate(zip(pl["ngram_reached"], pl["ngram_accepted"], pl["ngram_predicted"])):
                reached[d] = reached.get(d, 0.0) + r
                accepted[d] = accepted.get(d, 0.0) + a
                conf[d] = conf.get(d, 0.0) + (p or 0.0) * r
    rows = []
    for d in sorted(reached):
        n = reached[d]
        o = accepted[d] / n if n else None
        rows.append({"depth": d + 1, "n": n, "accepted": accepted[d], "observed": o,
                     "calibrated": conf[d] / n if n else None,
                     "stderr": float(np.sqrt(o * (1 - o) / n)) if n else None, "measured": n >= MIN_REACHED})
    return rows, cells


def cell_drafters(cells: list[str]) -> str:
    """The DSpark drafter(s) the pooled cells ran, as their runs recorded them (run.result.json's engine arguments:
    the drafter directory's name), for the report's header; "not recorded" where a cell has no record."""
    names = set()
    for c in cells:
        try:  # the cell cache's own reader (vllm/cells.run_cell): capped, strict JSON
            run = read_json(Path(c) / "run.result.json", CACHE, finite=False)
            spec = (run.get("engine_kwargs") or {}).get("speculative_config") or {}
        except (ConfigError, OSError, AttributeError):  # no record, or not one a run wrote: the header says so
            spec = {}
        names.add(Path(spec["model"]).name if spec.get("model") else "not recorded")
    return ", ".join(f"`{n}`" if n != "not recorded" else n for n in sorted(names))


BINS = (0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)  # table B's reliability bins of the calibrated p_ij


def _censored_slots(seqs: list[tuple[np.ndarray, int]], k: int):
    """Every censored n-gram slot of the sequences (prompt + output token ids, prompt length): depth j (1-based),
    calibrated conditional p_ij and the label 1{accepted} (module docstring, table B)."""
    from real.vllm_plugin.config import HybridSpecConfig
    from sim.core.drafters.calibration import NgramCalibrator, calibrator_slots
    from sim.core.drafters.ngram import ngram_tables

    hcfg = HybridSpecConfig()
    cal = NgramCalibrator.load(hcfg.calibrator)
    cfg = hcfg.ngram(k)
    ds, ps, ys = [np.zeros(0, dtype=np.int64)], [np.zeros(0)], [np.zeros(0)]
    for tokens, plen in seqs:
        tab = ngram_tables(np.asarray(tokens), plen, cfg)
        cond = cal.conditional(tab, k)
        rows, depth = calibrator_slots(tab)
        L = len(tokens) - plen
        obs = (tab.acc_len[rows] >= depth - 1) & (rows + depth - 1 < L) & (depth <= k)
        rows, depth = rows[obs], depth[obs]
        ds.append(depth)
        ps.append(cond[rows, depth - 1].astype(np.float64))
        ys.append((tab.acc_len[rows] >= depth).astype(np.float64))
    return np.concatenate(ds), np.concatenate(ps), np.concatenate(ys)


def reliability(seqs: list[tuple[np.ndarray, int]], k: int) -> list[dict]:
    """Table B's reliability rows: all depths pooled, by bin of the calibrated p_ij (BINS)."""
    _, p, y = _censored_slots(seqs, k)
    b = np.clip(np.searchsorted(BINS, p, side="right") - 1, 0, len(BINS) - 2)
    return [{"bin": f"{BINS[i]:.1f}-{BINS[i + 1]:.1f}", "n": int((b == i).sum()),
             "calibrated": float(p[b == i].mean()) if (b == i).any() else None,
             "observed": float(y[b == i].mean()) if (b == i).any() else None} for i in range(len(BINS) - 1)]


def _slot_stats(seqs: list[tuple[np.ndarray, int]], k: int) -> list[dict]:
    """Tables B and C: the calibrator's conditional estimate vs the observed acceptance per depth over every
    censored n-gram slot of the sequences (prompt + output token ids, prompt length)."""
    depth, p, y = _censored_slots(seqs, k)
    n = np.bincount(depth - 1, minlength=k).astype(np.float64)[:k]
    acc = np.bincount(depth - 1, weights=y, minlength=k)[:k]
    pred = np.bincount(depth - 1, weights=p, minlength=k)[:k]
    return [{"depth": d + 1, "n": float(n[d]), "observed": acc[d] / n[d] if n[d] else None,
             "calibrated": pred[d] / n[d] if n[d] else None,
             "stderr": float(np.sqrt((acc[d] / n[d]) * (1 - acc[d] / n[d]) / n[d])) if n[d] else None,
             "measured": n[d] >= MIN_REACHED} for d in range(k)]


def references(runs: list[Path]) -> dict[tuple[str, str], tuple[list[int], list[int]]]:
    """(trace stem, request id) -> (prompt ids, the longest output recorded for it) over the runs' references."""
    out: dict = {}
    for run in runs:
        for path in sorted(run.glob("*/bs*/reference.jsonl")):
            stem = path.parent.parent.name
            for i, line in enumerate(read_text(path, RECORD).splitlines(), 1):
                r = _REFERENCE.check(parse_json(line, f"{path}:{i}"), "", f"{path}:{i}")
                key = (stem, str(r["id"]))
                if key not in out or len(r["output_ids"]) > len(out[key][1]):
                    out[key] = (r["prompt_ids"], r["output_ids"])
    return out


def trace_sequences(trace: str, ids: set[str] | None, limit: int | None) -> list[tuple[np.ndarray, int]]:
    """The trace's own recorded prompt + output token ids (its tokenizer's), for `ids` or its first `limit`."""
    from sim.core.trace import load_trace

    tr = load_trace(trace, limit=None if ids is not None else limit)
    return [(np.concatenate([r.prompt_ids, r.output_ids]), len(r.prompt_ids)) for r in tr.requests
            if ids is None or str(r.id) in ids]


def mean_gap(rows: list[dict]) -> float | None:
    m = [abs(x["observed"] - x["calibrated"]) for x in rows if x["measured"]]
    return float(np.mean(m)) if m else None


def signed_gap(rows: list[dict]) -> float | None:
    m = [x["observed"] - x["calibrated"] for x in rows if x["measured"]]
    return float(np.mean(m)) if m else None


def noise_floor(rows: list[dict]) -> float | None:
    """The mean |observed - calibrated| the counts alone would give over the measured depths if the calibrated
    estimate were exact: E|o - p| = sqrt(2 / pi) * sqrt(p (1 - p) / n) per depth (normal approximation)."""
    m = [np.sqrt(2 / np.pi) * np.sqrt(x["calibrated"] * (1 - x["calibrated"]) / x["n"]) for x in rows if x["measured"]]
    return float(np.mean(m)) if m else None


def pooled(rows: list[dict]) -> dict | None:
    """All depths pooled (each reached slot once): observed and calibrated shares, their difference and the
    binomial standard error of that difference under an exact estimate."""
    n = sum(x["n"] for x in rows)
    if not n:
        return None
    o = sum(x["observed"] * x["n"] for x in rows if x["n"]) / n
    p = sum(x["calibrated"] * x["n"] for x in rows if x["n"]) / n
    var = sum(x["calibrated"] * (1 - x["calibrated"]) * x["n"] for x in rows if x["n"]) / n ** 2
    return {"n": n, "observed": o, "calibrated": p, "gap": o - p, "se": float(np.sqrt(var))}


def _table(rows: list[dict], count: str) -> list[str]:
    f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    L = [f"| depth | {count} | observed | calibrated | observed - calibrated | std. error | measured |",
         "|---:|---:|---:|---:|---:|---:|---|"]
    for x in rows:
        g = None if x["observed"] is None else x["observed"] - x["calibrated"]
        L.append(f"| {x['depth']} | {x['n']:.0f} | {f(x['observed'])} | {f(x['calibrated'])} | "
                 f"{'-' if g is None else f'{g:+.2f}'} | {f(x['stderr'])} | {'yes' if x['measured'] else 'no'} |")
    gap, sg, nf, pl = mean_gap(rows), signed_gap(rows), noise_floor(rows), pooled(rows)
    L += ["", f"Mean |observed - calibrated| over the {sum(x['measured'] for x in rows)} depths reached at least "
          f"{MIN_REACHED} times: {'-' if gap is None else f'{gap:.3f}'} (signed mean "
          f"{'-' if sg is None else f'{sg:+.3f}'}); with an exact estimate, counts this size alone would give about "
          f"{'-' if nf is None else f'{nf:.3f}'}."
          + ("" if pl is None else f" All depths pooled: observed {pl['observed']:.3f} vs calibrated "
             f"{pl['calibrated']:.3f} over {pl['n']:.0f} slots (difference {pl['gap']:+.3f}, standard error "
             f"{pl['se']:.3f}).")]
    return L


def run_hybrid_cells(out: Path, traces: list[str], batch_size: int, limit: int, max_prompt: int, max_tokens: int,
                     seed: int) -> Path:
    """Run (or read back) the hybrid cells of `traces` at `batch_size` under `out`, in validate's layout."""
    from real.validation.vllm.builds import BUILDS
    from real.validation.fidelity import write_output
    from real.validation.vllm.cells import real_summary, run_cell
    from real.validation.vllm_cpu.checkpoints import (MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS, default_drafter,
                                                      default_model)
    from real.vllm_plugin.config import HybridSpecConfig
    from real.validation.vllm import config as C
    from real.validation.vllm.config import VllmRunConfig
    from real.validation.vllm.engine import require_vllm
    from real.validation.vllm.slices import write_reference

    require_vllm("cpu")
    cfg = VllmRunConfig(model=default_model(), drafter=default_drafter(), num_speculative_tokens=K, device="cpu",
                        max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, seed=seed,
                        hybrid=HybridSpecConfig())
    for trace in traces:
        sl = BUILDS["cpu"].load_slice(trace, limit, max_prompt, max_tokens, seed)
        work = out / sl.stem / f"bs{batch_size}" / C.HYBRID
        run = run_cell(cfg, sl, C.HYBRID, batch_size, work)
        if run.get("outputs") is None:
            raise ConfigError(f"{work}: the run recorded no outputs ({run.get('error')})")
        write_reference(sl, run["outputs"], work.parent / "reference.jsonl")
        cell = {"engine": "vllm-cpu", "trace": sl.trace, "policy": C.HYBRID, "batch_size": batch_size,
                "requests": len(sl.ids), "real": real_summary(run, run["outputs"])}
        write_output(work / "cell.json", json.dumps(cell) + "\n")
        print(f"{sl.stem}: {cell['real']['steps']} steps, {cell['real']['output_tokens']} tokens", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    from sim.infra.cli import ArgumentParser  # notes the options given: a --report named is not a default output

    ap = ArgumentParser(prog="python -m real.depth_calibration", description=__doc__.split("\n")[0])
    ap.add_argument("--run", action="append", default=[], help="a run directory to read (validate's layout)")
    ap.add_argument("--out", help="run the hybrid cells of --trace here first (then read it with the --run's)")
    ap.add_argument("--trace", action="append", help="with --out: trace(s) to slice")
    ap.add_argument("--batch-size", type=int, default=4, help="with --out: max_num_seqs (default 4)")
    ap.add_argument("--limit", type=int, default=4, help="with --out: requests per trace (default 4)")
    ap.add_argument("--max-tokens", type=int, default=16, help="with --out: max_tokens (default 16)")
    ap.add_argument("--max-prompt", type=int, default=800, help="with --out: longest prompt (default 800)")
    ap.add_argument("--seed", type=SEED, default=0)
    ap.add_argument("--trace-limit", type=int, default=200,
                    help="table C's whole-trace rows: the first N requests of each trace (default 200)")
    ap.add_argument("--report", help="also write the markdown here (refused if the file exists)")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if bool(a.out) != bool(a.trace):
        raise ConfigError("--out and --trace go together (run the hybrid cells of --trace under --out)")
    from sim.infra.cli import check_out_dir, check_out_file

    if a.out:
        check_out_dir(a.out, force=True, flag="--out")  # a folder of its own (cells are resumed), claimed
    if a.report:
        check_out_file(a.report, False, "--report", hint="choose a new path (reports are never overwritten)")
    runs = [Path(r) for r in a.run] + ([run_hybrid_cells(Path(a.out), a.trace, a.batch_size, a.limit, a.max_prompt,
                                                        a.max_tokens, a.seed)] if a.out else [])
    if not runs:
        raise ConfigError("nothing to read: give --run DIR or --out DIR --trace TRACE")
    for r in runs:
        if not r.is_dir():
            raise ConfigError(f"--run {r}: not a directory")
    A, cells = plugin_depths(runs)
    if not cells:
        raise ConfigError(f"no hybrid cell with the plugin's counters under {', '.join(map(str, runs))}")
    refs = references(runs)
    seqs = [(np.asarray(p + o), len(p)) for p, o in refs.values()]
    B = _slot_stats(seqs, K)
    stems = sorted({s for s, _ in refs})
    C_same, C_all = {}, {}
    for s in stems:
        trace = f"traces/{s}.jsonl"
        ids = {i for t, i in refs if t == s}
        C_same[s] = _slot_stats(trace_sequences(trace, ids, None), K)
        C_all[s] = _slot_stats(trace_sequences(trace, None, a.trace_limit), K)
    cmd = "python -m real.depth_calibration " + " ".join(sys.argv[1:] if argv is None else argv)
    L = ["# Per-depth acceptance of the plugin's n-gram chains in vLLM (CPU harness) vs the calibrated estimate", "",
         f"Produced by `{cmd}` (engine cells: with --out, the hybrid cells this command runs in vLLM's CPU build "
         f"through real/validation/vllm_cpu/harness.py, a test harness, one process per trace, cached under --out; with --run, "
         f"a validate run's). Hybrid cells pooled: {', '.join(cells)}. Requests: {len(refs)} "
         f"({', '.join(f'{s} {sum(1 for t, _ in refs if t == s)}' for s in stems)}), target SmolLM2-135M-Instruct "
         f"fp32, temperature 0, DSpark drafter {cell_drafters(cells)} (as the cells' runs recorded it; "
         f"`dspark-smollm2-135m` is the bundled trained one), "
         f"K = {K}; the reference text is the target's greedy output "
         f"(reference.jsonl: `none`'s in a validate run, the hybrid cell's own with --out, equal to `none`'s since "
         f"the hybrid is lossless); calibrator `{_cal_name()}` (fitted on traces/general.jsonl's recorded "
         f"outputs).", "",
         "Depth j is the conditional acceptance P(token j accepted | tokens 1..j-1 accepted, slot j verified) on every "
         "side: the calibrator's p_ij (a hazard) and the plugin's counters (reached: the first j - 1 tokens accepted "
         "and slot j admitted by adaptive verification; vLLM's num_rejected counts the logits it computed, so slots it "
         "did not admit never count). Step and token counts do not depend on the harness's clock.", "",
         "## A. The chains the hybrid chose, as vLLM verified them (the plugin's counters)", ""]
    L += _table(A, "reached")
    L += ["", "## B. Every n-gram proposal in the same requests' outputs (the target's greedy text)", "",
          "No choice, no admission: all censored slots (j <= chain length, tokens 1..j-1 accepted, the slot inside "
          "the recorded output).", ""]
    L += _table(B, "slots")
    L += ["", "The same slots, all depths pooled, by bin of the calibrated estimate (the calibrator's reliability on "
          "this text; the hybrid's choice and adaptive verification's admission both keep the high bins):", "",
          "| calibrated p | slots | calibrated | observed |", "|---|---:|---:|---:|"]
    f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for r in reliability(seqs, K):
        L.append(f"| {r['bin']} | {r['n']} | {f(r['calibrated'])} | {f(r['observed'])} |")
    for s in stems:
        L += ["", f"## C. {s}: the trace's own recorded outputs (what the simulator's runs see)", "",
              f"Same request ids ({sum(1 for t, _ in refs if t == s)}):", ""]
        L += _table(C_same[s], "slots")
        L += ["", f"First {a.trace_limit} requests of traces/{s}.jsonl:", ""]
        L += _table(C_all[s], "slots")
    md = "\n".join(L) + "\n"
    print(md)
    if a.report:
        from sim.infra.cli import write_whole

        write_whole(Path(a.report), md, hint="choose another path (this command never replaces a file)")
    return 0


def _cal_name() -> str:
    from real.vllm_plugin.config import HybridSpecConfig

    return str(HybridSpecConfig().calibrator)
