"""One vLLM cell on either build: its process (cached by its spec), its record in the report's terms and the
simulator's prediction of it -- used by `real/validate.py --engine vllm` (flow.py), `python -m real.vllm_slots`
and `python -m real.depth_calibration`.

A cell's run is one process (engine.launch) whose spec is the config, policy, batch size and prompts; it is read
back from WORK/run.result.json while its spec is unchanged (a run that died leaves the finished cells intact),
with the code version that made it named on its `cached` line. The machine's load over the process is recorded
beside it (real/validation/machine_load.py).
"""
from __future__ import annotations

import dataclasses

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np

from real.validation.fidelity import write_output
from real.validation.pipeline.lossless import DEFAULT_TIE_EPSILON, compare_outputs
from real.validation.vllm import config as C
from real.validation.vllm.config import VllmRunConfig
from sim.infra import paths
from sim.infra.inputs import CACHE, read_json
from sim.infra.errors import ConfigError

# The sources whose behaviour a cached vLLM run records: the plugin, its launcher and the policies it calls.
CODE_DIRS = ("real/vllm_plugin", "real/validation/vllm", "sim/core/policies")


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


class CacheMiss(ConfigError):
    """A cell that `--cached-only` would have to run: no cached result, or one made for another spec."""


def code_version(root: Path = paths.REPO) -> str:
    """A digest of the .py sources under CODE_DIRS (sorted by path; content, not mtime), so a cached run says which
    code made it. Not part of the cache key: a code change that does not alter a run must not discard hours of
    cached cells; a cell read back from another code version is named on its `cached` line instead."""
    h = hashlib.sha256()
    for d in CODE_DIRS:
        for f in sorted((root / d).rglob("*.py")):
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def run_cell(cfg: VllmRunConfig, sl, policy: str, bs: int, work: Path, warmup: bool = True,
             selfcheck: bool = False, n: int | None = None, max_tokens: int | None = None,
             cached_only: bool = False, margins: bool = False, env: dict[str, str] | None = None) -> dict:
    """One vLLM process, read back from work/run.result.json when its spec is the same. cached_only: never start
    vLLM; a cell without a cached result for this spec raises CacheMiss. margins: record the reference's top-2
    margins (the `none` cell). env: the process's environment (default cfg.env())."""
    from real.validation.machine_load import LoadProbe
    from real.validation.vllm.engine import launch

    n = n or len(sl.ids)
    spec = {"config": cfg.to_json(), "policy": policy, "batch_size": bs, "ids": list(sl.ids[:n]),
            "prompts": [list(p) for p in sl.prompts[:n]],
            "max_tokens": [max_tokens or m for m in sl.max_tokens[:n]], "warmup": warmup, "selfcheck": selfcheck}
    if margins:  # only when asked: earlier cached specs stay valid
        spec["margins"] = True
    res_path, spec_path = work / "run.result.json", work / "run.spec.json"
    load_path, code_path = work / "run.load.json", work / "run.code.json"
    # the cell cache is read through the input layer (capped, strict JSON): a damaged or planted entry is one line
    same = (res_path.is_file() and spec_path.is_file()
            and digest(read_json(spec_path, CACHE, finite=False)) == digest(spec))
    if same:
        made = read_json(code_path, CACHE, finite=False).get("code") if code_path.is_file() else None
        now = code_version()
        note = "" if made == now else f" (made by code {made or 'of unknown version'}, now {now})"
        print(f"cached  {work}{note}", file=sys.stderr)
        res = read_json(res_path, CACHE, finite=False)
        if load_path.is_file():
            res["load"] = read_json(load_path, CACHE, finite=False)
        return res
    if cached_only:
        why = "no cached result" if not res_path.is_file() else "its cached result was made for another spec"
        raise CacheMiss(f"{work}: {why}; --cached-only starts no vLLM process (run without it to measure)")
    write_output(code_path, json.dumps({"code": code_version(), "dirs": list(CODE_DIRS)}) + "\n")
    print(f"running {work.name} ({policy}, batch {bs}, {n} requests)", file=sys.stderr, flush=True)
    # the waited-for process's CPU time is the engine's own: one warning line when others took the cores it needed
    with LoadProbe(os.cpu_count() or 1) as probe:
        res = launch(spec, work, "run", env if env is not None else cfg.env())
    res["load"] = probe.record.to_json()
    write_output(load_path, json.dumps(res["load"]) + "\n")
    if probe.record.loaded:
        print(f"warning: {work} ran under load ({probe.record.note()}): its timings include others' contention",
              file=sys.stderr)
    return res


# ------------------------------------------------------------------------------------------ the real side
def _worker(stats) -> dict | None:
    ws = (stats or {}).get("workers") or []
    return ws[0] if ws and isinstance(ws[0], dict) and ws[0].get("loaded") else None


def timed_plugin_stats(run: dict) -> dict | None:
    """The plugin's counters of the timed generate: the totals after it minus those before it (the warm-up's),
    as vLLM's metrics are; per-depth predicted confidence re-averaged over the difference."""
    after, before = _worker(run.get("hybrid_stats")), _worker(run.get("hybrid_stats_before"))
    if after is None or before is None:
        return after
    out = dict(after, steps=after["steps"] - before["steps"], warmup_subtracted=True)
    for chain in ("model", "ngram"):
        a, b = after[chain], before[chain]
        reached = [x - y for x, y in zip(a["reached"], b["reached"])]
        accepted = [x - y for x, y in zip(a["accepted"], b["accepted"])]
        conf = [(pa or 0.0) * ra - (pb or 0.0) * rb for pa, ra, pb, rb in
                zip(a["predicted"], a["reached"], b["predicted"], b["reached"])]
        out[chain] = {"chosen": a["chosen"] - b["chosen"], "reached": reached, "accepted": accepted,
                      "observed": [c / r if r else None for c, r in zip(accepted, reached)],
                      "predicted": [c / r if r else None for c, r in zip(conf, reached)]}
    return out


def warmup_runcal(run: dict | None) -> str | None:
    """The plugin's run-level recalibration state when the timed generate began (what its warm-up learnt) as the
    simulator's --runcal-start (DSpark's offset and precision, then the n-gram's: the plugin's order); None where
    the run recorded none (runcal off, or no plugin)."""
    from sim.core.drafters.recalibration import runcal_start_text
    from sim.core.policies.base import MODEL, NGRAM

    rc = (_worker((run or {}).get("hybrid_stats_before")) or {}).get("runcal")
    if not rc:
        return None
    return runcal_start_text(dict(zip((MODEL, NGRAM), zip(rc["offset"], rc["precision"]))))


def real_summary(run: dict, ref: list[list[int]], margins: list[list] | None = None,
                 epsilon: float = DEFAULT_TIE_EPSILON) -> dict:
    """A vLLM run in the report's terms: lossless against the reference (pipeline/lossless.py), steps (vLLM's
    iterations that emitted tokens), tokens per step, throughput of the timed generate, acceptance, and the
    plugin's counters of the timed generate."""
    if run.get("outputs") is None:
        raise ConfigError(f"the {run.get('policy')} run recorded no outputs ({run.get('error')})")
    cmp = compare_outputs(ref, run["outputs"], margins, epsilon)
    n, steps = run["output_tokens"], run.get("steps") or 0
    spec = run.get("spec") or {}
    nan = float("nan")
    out = {"lossless": cmp.lossless, "outputs_equal_reference": cmp.exact, "lossless_detail": cmp.detail("none"),
           "tie_flips": len(cmp.tie_flips), "lossless_check": cmp.to_json(), "steps": steps,
           "tokens_per_step": n / steps if steps else nan,
           "output_tokens": n, "tok_per_s": run.get("tok_per_s", nan), "time_s": run.get("wall_s", nan),
           "mean_latency_s": run["mean_latency_s"] if run.get("mean_latency_s") is not None else nan,
           "acceptance_per_pos": spec.get("acceptance_per_pos", []),
           "accepted_per_draft": spec.get("accepted_per_draft", nan), "drafts": spec.get("drafts", 0)}
    h = timed_plugin_stats(run)
    if h:
        acc_m, acc_n = sum(h["model"]["accepted"]), sum(h["ngram"]["accepted"])
        out["plugin"] = {"chosen_model": h["model"]["chosen"], "chosen_ngram": h["ngram"]["chosen"],
                         "ngram_observed": h["ngram"]["observed"], "ngram_predicted": h["ngram"]["predicted"],
                         "ngram_reached": h["ngram"]["reached"], "ngram_accepted": h["ngram"]["accepted"],
                         "accepted_model": acc_m, "accepted_ngram": acc_n,
                         "ngram_share_accepted": acc_n / (acc_m + acc_n) if acc_m + acc_n else 0.0,
                         "steps": h.get("steps"), "warmup_subtracted": bool(h.get("warmup_subtracted"))}
        pairs = [(o, p) for o, p in zip(h["ngram"]["observed"], h["ngram"]["predicted"]) if o is not None]
        out["plugin"]["ngram_calibration_gap"] = float(np.mean([abs(o - p) for o, p in pairs])) if pairs else None
    return out


# ------------------------------------------------------------------------------------------ the simulator's inputs
def cost_table(cfg: VllmRunConfig, run: dict, path: Path, complement: dict | None = None, *, block: int) -> Path:
    """vLLM's tables of this run with its capture sizes as a project cost table (pipeline/tables.py), complemented
    by a profiled table's other parts when given. block: the tokens DSpark drafted per request in `run` (its draft
    curve is keyed by requests): the checkpoint's trained block under the plugin, whatever its W slots, and
    num_speculative_tokens for vLLM's own DSpark, which drafts a block that wide. Never cfg's W: a W-slot cell priced
    at block W would look DSpark up at R*K_b/W requests (profiled.py's draft_ms)."""
    from real.validation.pipeline.tables import engine_table, write_engine_table
    from real.vllm_plugin.timing import table_field

    engine = f"{run.get('vllm_distribution', 'vllm')} {run.get('vllm_version')}"
    obj = engine_table(run.get("cost_tables") or {}, llm=cfg.sim_model(),
                       # the complement's GPU spec name keeps the roofline fallback for any part neither has
                       label=(complement or {}).get("gpu") or ("cpu-harness" if cfg.device == "cpu"
                                                               else str(run.get("device") or "cuda")),
                       block=block, capture_sizes=run.get("capture_sizes") or [],
                       machine={"device": cfg.device, "engine": engine},
                       source=f"{path.parent}: vLLM's adaptive-verification tables profiled in this run"
                              + (" by the CPU harness (wall clock, interpreted kernels: not a GPU's costs)"
                                 if cfg.device == "cpu" else ""),
                       complement=complement, extra=table_field(run.get("hybrid_stats")))  # the plugin's own step
    return write_engine_table(path, obj)


def drafts_file(sl, run: dict, ref: list[list[int]], k: int, path: Path) -> Path | None:
    """The DSpark chains the run drafted and the plugin's chain choices (recorder.py), as the simulator's
    recorded-drafts sidecar."""
    from real.validation.pipeline.drafts import sidecar_from_chains

    by_req = dict(zip(run.get("request_ids") or [], sl.ids))  # vLLM's request ids -> the slice's

    def rid_of(rid) -> str:
        return by_req.get(str(rid)) or by_req.get(str(rid).rsplit("-", 1)[0]) or str(rid)

    chains = [(rid_of(rid), pos, toks, cs) for rid, pos, toks, cs in run.get("drafts") or []]
    # the plugin's published chain per row and step (recorder.collect_choices), replayed by hybrid-vllm
    choices = [(rid_of(rid), pos, ng, n) for rid, pos, ng, n in run.get("chain_choices") or []]
    return sidecar_from_chains(sl.ids, ref, chains, k, path, choices)


def sim_setup(cfg: VllmRunConfig, semantics: str, ref_path: Path, table: Path, drafts: Path | None, run: dict | None,
              seed: int, k: int | None = None, drafts_k: int | None = None):
    """The SimSetup predicting a vLLM cell: vLLM's scheduler and token budget, the semantics of the build's version,
    the run's KV capacity and async scheduling (run None, a plan: the simulator's defaults stand in), the recorded
    chains (else the synthetic DSpark profile), n-gram chains of k = the cell's num_speculative_tokens. drafts_k: the
    recorded chains' width where it is not the profile's block (vLLM's DSpark at num_speculative_tokens = W > its
    block drafts a W-token block): the profile then runs for chains of that many tokens (`NAME:K`)."""
    from sim.api.run import SimSetup
    from sim.core.drafters.model import load_drafter_profile

    run = run or {}
    drafter = C.SIM_DRAFTER
    if drafts_k is not None and drafts_k != load_drafter_profile(drafter).block:
        drafter = f"{drafter}:{int(drafts_k)}"
    cell_k = k or cfg.num_speculative_tokens
    # synthetic rejection sampling: the rates vLLM verified this cell with (its own K = W), by position
    synthetic = (",".join(f"{r:g}" for r in dataclasses.replace(cfg, num_speculative_tokens=cell_k).synthetic_rates())
                 if cfg.synthetic else None)
    return SimSetup(trace=str(ref_path), model=cfg.sim_model(), gpu=str(table), cost="profiled",
                    synthetic_acceptance=synthetic,
                    drafter=drafter, calibrator=cfg.hybrid.calibrator, ngram_k=cell_k,
                    seed=seed, temperature=C.TEMPERATURE, max_num_batched_tokens=cfg.max_num_batched_tokens,
                    kv_capacity_tokens=run.get("kv_capacity_tokens"), drafts=str(drafts) if drafts else None,
                    async_scheduling=run.get("async_scheduling") is not False, scheduler="vllm",
                    vllm_version=semantics, runcal_start=warmup_runcal(run))


def predict(cfg: VllmRunConfig, semantics: str, policy: str, bs: int, ref_path: Path, table: Path,
            drafts: Path | None, run: dict, seed: int, drafts_k: int | None = None) -> tuple[dict, str]:
    """The simulator's run of the cell (its summary, steps counted as vLLM counts them, and its command); drafts_k:
    the recorded chains' width (sim_setup)."""
    from real.validation.pipeline.predict import predict as sim_predict

    cell = cfg.cell(policy)
    s, cmd = sim_predict(sim_setup(cfg, semantics, ref_path, table, drafts, run, seed, cell.num_speculative_tokens,
                                   drafts_k), cfg.sim_policy(policy), bs)
    s.pop("step_ms", None)
    return s, cmd


def rel_err(a, b) -> float:
    """|a - b| / b (nan when b is 0)."""
    return abs(a - b) / b if b else float("nan")
