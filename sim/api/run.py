"""CLI and Python API: replay a trace through the simulated engine for every policy x batch size.

    python -m sim.run --trace traces/codeedit.jsonl [--policy P ...] [--batch-size B ...] [--out DIR]

With no --policy it compares every registered policy against the baseline (`adaptive`) and prints a narrow
table and a one-line verdict per batch size (--format csv|json|vllm for every metric, sim/api/console.py).
The draft tables (what each drafter proposes at every output position) are computed once per
trace and shared by all runs, so every policy sees identical draws.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.api import console
from sim.infra.progress import Heartbeat, progress_bar
from sim.infra.paths import bundled
from sim.infra.cli import ArgumentParser, check_out_dir, finite_float
from sim.infra.fsio import atomic_dir, die_with_parent, forking_workers, out_guard, refuse_in_the_way
from sim.infra.html_page import add_plotly_flag, check_asset
from sim.core.drafters.synthetic import rates_of
from sim.core.cost import make_cost_model
from sim.core.drafters.calibration import NgramCalibrator
from sim.core.drafters.model import ModelDrafterProfile, load_drafter_profile, load_recorded_drafts
from sim.core.drafters.ngram import NgramConfig
from sim.core.drafters.cache import cached_draft_tables
from sim.core.drafters.registry import (DEFAULT_DRAFTERS, check_live_memory, check_settings_used, collect_drafter_flags,
                                        drafter_settings, live_drafters, merge_drafter_config, parse_drafters)
from sim.core.drafters.stream import StreamingTables, pick_streaming
from sim.core.drafters.tables import DraftTables
from sim.engine.engine import Engine, EngineConfig, RunResult
from sim.infra.errors import ConfigError
from sim.core.metrics import summarize
from sim.core.models import DEFAULT_DRAFTER_COST, get_llm, llm_name
from sim.core.policies import get_policy
from sim.engine.policies import sim_policy
from sim.core.scheduler import full_kv_need
from sim.core.trace.schema import Request
from sim.core.deploy import Deployment
from sim.core.vllm import plugin_settings, speculative_config

from sim.core.config import (BASELINE, COMPONENTS, DEFAULT_BATCH_SIZES, DEFAULT_POLICIES, DrafterConfig,  # noqa: E402,F401
                        GROUP_ORDER, ModelConfig, RunGrid, ServingConfig, TraceConfig, add_flags, check, flag_group, from_args)


@dataclass
class SimSetup(ServingConfig, DrafterConfig, ModelConfig, TraceConfig):
    """What stays fixed across the policies and batch sizes of one run: every component of sim/core/config.py
    (the trace and its sampling, the model and GPU, the drafters, the serving engine)."""


@dataclass
class Prepared:
    setup: SimSetup
    tables: DraftTables | StreamingTables  # whole-trace tables, or the recipe of per-request ones (streaming)
    arrivals: np.ndarray
    cost: object
    length_only: bool
    skipped: int
    tokenizer: str | None = None  # what tokenized the trace's text (sim.core.trace.tokenizer.tokenizer_for); None: no text
    tokenizer_note: str | None = None  # set when that is not the served model's own tokenizer
    ids: list[str] | None = None  # each request's id and trace line, for errors that name a request
    lines: list[int | None] | None = None
    context: np.ndarray | None = None  # prompt + output tokens of each request
    kmax: int = 0  # the longest draft chain (model block or n-gram k)


def prepare(setup: SimSetup, progress: bool = False, profile: ModelDrafterProfile | None = None) -> Prepared:
    """Load the trace, the cost model and the drafters, and build the draft tables once (or load them from
    the on-disk cache, sim.core.drafters.cache) -- or, when streaming (setup.draft_tables; sim.core.drafters.stream),
    only their recipe: each run builds a request's rows when it is admitted. `profile` overrides the named drafter profile (for fitting it)."""
    from sim.core.trace import load_trace

    profile = profile or load_drafter_profile(setup.drafter)
    # the profile names the cost shape of its passes (DSpark's block pass, or an EAGLE head's sequential ones)
    extra = {} if profile.cost_spec == DEFAULT_DRAFTER_COST else {"drafter": profile.cost_spec}
    if setup.tensor_parallel_size != 1:
        extra["tensor_parallel_size"] = setup.tensor_parallel_size
    cost = make_cost_model(setup.cost, llm=setup.model, gpu=setup.gpu, **extra)
    calib = NgramCalibrator.load(setup.calibrator)
    ngram_cfg = NgramConfig(n_min=calib.cfg.n_min, n_max=calib.cfg.n_max, k=setup.ngram_k, ext_max=calib.cfg.ext_max)
    from sim.core.trace.tokenizer import tokenizer_for

    tok_name, tok_note = tokenizer_for(setup.model, setup.tokenizer)  # the model's own unless --tokenizer
    trace = load_trace(setup.trace, limit=setup.limit, sample=setup.sample, seed=setup.seed, tokenizer=tok_name,
                       vocab_size=get_llm(setup.model).vocab_size)
    reqs = trace.requests
    if not reqs:
        raise ConfigError(f"{setup.trace}: the trace has no requests")
    check_context(reqs, setup.trace, setup.model, setup.max_model_len)
    if setup.temperature is not None:
        if setup.temperature < 0:
            raise ConfigError(f"--temperature must be >= 0, got {setup.temperature}")
        for r in reqs:
            r.temperature = setup.temperature
    recorded = load_recorded_drafts(setup.drafts, profile.block) if setup.drafts else None
    if recorded is not None:
        unknown = sorted(set(recorded) - {r.id for r in reqs})
        if unknown:
            raise ConfigError(f"{setup.drafts}: recorded drafts for {len(unknown)} request(s) not in the trace, e.g. '{unknown[0]}'")
    synthetic = rates_of(setup.synthetic_acceptance)  # vLLM's synthetic acceptance decides every chain's
    if pick_streaming(setup.draft_tables, reqs, profile.block, ngram_cfg.k):
        tables = StreamingTables(reqs, ngram_cfg, profile, calib, seed=setup.seed, recorded=recorded,
                                 synthetic=synthetic)
    else:
        tables = cached_draft_tables(reqs, ngram_cfg, profile, calib, seed=setup.seed, progress=progress,
                                     recorded=recorded, synthetic=synthetic)
    if trace.length_only and any(n not in DEFAULT_DRAFTERS for n in parse_drafters(setup.drafters)):
        raise ConfigError(f"{setup.trace}: --drafters {setup.drafters}: a live drafter (suffix) proposes from the "
                          "request's tokens, and this trace has lengths only")
    arrivals = np.asarray([r.arrival_s or 0.0 for r in reqs], dtype=np.float64)
    return Prepared(setup, tables, arrivals, cost, bool(trace.length_only), trace.skipped, trace.tokenizer,
                    tok_note if trace.tokenizer else None, [r.id for r in reqs], [r.line for r in reqs],
                    np.asarray([r.prompt_len + r.output_len for r in reqs], dtype=np.int64),
                    max(profile.block, ngram_cfg.k))


def check_context(reqs: list[Request], trace: str, model: str, max_model_len: int | None = None) -> None:
    """Refuse (TraceError naming the request and its line) a request whose prompt + output exceeds the
    context length: `max_model_len`, else the model's (models/llms/, vLLM's default max_model_len). vLLM
    refuses such a request too."""
    from sim.infra.errors import TraceError

    limit = max_model_len or get_llm(model).max_model_len
    if limit is None:
        return
    for r in reqs:
        n = r.prompt_len + r.output_len
        if n > limit:
            where = "--max-model-len" if max_model_len else f"{llm_name(model)}'s context length (max_model_len)"
            raise TraceError(f"request '{r.id}' needs {r.prompt_len} prompt + {r.output_len} output = {n} tokens, "
                             f"more than {where} of {limit}; drop it from the trace or raise --max-model-len",
                             trace, getattr(r, "line", None))


def check_kv(prep: Prepared, kv_capacity_tokens: int | None = None, block_size: int = EngineConfig.block_size) -> None:
    """Refuse, before any simulation (TraceError naming the request and its trace line), a request that can
    never fit the KV cache alone: it needs ceil((prompt + output + kmax + 1) / block_size) * block_size tokens
    (its whole context, the longest draft chain and the bonus token, in blocks: the engine's own rule).
    `kv_capacity_tokens`: the --kv-capacity-tokens override, else the cost model's (model on GPU)."""
    from sim.infra.errors import TraceError

    if prep.context is None or not len(prep.context):
        return
    s = prep.setup
    cap = kv_capacity_tokens or prep.cost.kv_capacity_tokens
    need = full_kv_need(prep.context, prep.kmax, block_size)
    worst = int(np.argmax(need))
    if need[worst] > cap:
        where = "--kv-capacity-tokens" if kv_capacity_tokens else f"the KV cache of {s.model} on {s.gpu}"
        if full_kv_need(prep.context[worst:worst + 1], 0, block_size)[0] <= cap:  # the chain is what does not fit
            raise ConfigError(f"{where} holds {cap} KV tokens: request '{prep.ids[worst]}' ({int(prep.context[worst])} "
                              f"prompt + output) fits, but not beside a draft chain of {prep.kmax} (--ngram-k, the "
                              "policy's K or W, the drafter's block); lower the chain length or give a larger cache")
        raise TraceError(f"request '{prep.ids[worst]}' needs {int(need[worst])} KV tokens ({int(prep.context[worst])} "
                         f"prompt + output, a draft chain of {prep.kmax} and the bonus token, in blocks of {block_size}) "
                         f"but {where} holds {cap}: it can never run; drop it from the trace or give a larger cache",
                         s.trace, prep.lines[worst])


def run_one(prep: Prepared, policy: str, batch_size: int, progress: bool = False) -> tuple[dict, RunResult]:
    """Simulate one (policy, batch size) and return its summary row and the raw result."""
    s = prep.setup
    pol = sim_policy(policy, s.drafters)
    live = live_drafters(pol.uses_extra, s.drafter_config)  # fresh per run
    cfg = EngineConfig(batch_size=batch_size, max_num_batched_tokens=s.max_num_batched_tokens,
                       kv_capacity_tokens=s.kv_capacity_tokens, rate=s.rate, seed=s.seed,
                       async_scheduling=s.async_scheduling, scheduler=s.scheduler, vllm_version=s.vllm_version,
                       runcal_start=s.runcal_start)
    t0 = time.perf_counter()
    res = Engine(prep.tables, prep.arrivals, pol, prep.cost, cfg, progress=progress, live=live).run()
    wall = time.perf_counter() - t0
    row = {"policy": pol.name, "batch_size": batch_size, "trace": s.trace, "model": s.model, "gpu": s.gpu,
           "tensor_parallel_size": s.tensor_parallel_size,
           "cost": s.cost, "drafter": s.drafter, "drafters": s.drafters, "ngram_k": s.ngram_k, "seed": s.seed, "tokenizer": prep.tokenizer}
    row.update(summarize(res, batch_size))
    row["wall_s"] = wall
    row["sim_tok_per_wall_s"] = row["output_tokens"] / wall if wall > 0 else float("nan")
    row["length_only"] = prep.length_only
    row["arrivals"] = ("poisson" if s.rate is not None else
                       console.ARRIVALS_AT_ZERO if not np.any(prep.arrivals) else "trace")
    arrivals = np.asarray(res.requests["arrival_s"], dtype=np.float64)  # Poisson (--rate) arrivals are drawn by the run
    row["last_arrival_s"] = float(arrivals.max()) if len(arrivals) else 0.0  # console.arrival_bound
    return row, res


def deployment(s: SimSetup) -> Deployment:
    """What the verdict's `vllm serve` lines need from the run's setup (sim.core.deploy.Deployment)."""
    from sim.core.drafters.suffix import SuffixConfig

    cal = NgramCalibrator.load(s.calibrator).cfg
    defaults = dataclasses.asdict(SuffixConfig())
    suffix = {**defaults, **drafter_settings(s.drafter_config).get("suffix", {})}
    # the plugin's n-gram settings (PluginSettings' sim="ngram" fields) are the run's calibrator's: written where
    # they differ from the plugin's defaults
    from sim.core.plugin_settings import PluginSettings, plugin_fields

    ours = {k: s.calibrator if k == "calibrator" else getattr(cal, k) for k in plugin_fields("ngram")}
    plugin_ngram = {k: v for k, v in ours.items() if v != getattr(PluginSettings(), k)}
    target = get_llm(s.model).hf_id or s.model
    if Path(target).name == "config.json":  # a Hugging Face config.json given by path: vLLM serves its folder
        target = str(Path(target).parent)
    profile = load_drafter_profile(s.drafter)
    return Deployment(model=llm_name(s.model), hf_id=target, version=s.vllm_version, drafter=profile.name,
                      block=profile.block, ngram_range=(cal.n_min, cal.n_max), suffix=suffix, suffix_defaults=defaults,
                      plugin_ngram=plugin_ngram)


_PREP: Prepared | None = None  # the parent's tables, inherited by forked workers


def _run_combo(combo: tuple[str, int]) -> tuple[dict, RunResult]:
    return run_one(_PREP, *combo)


def run_many(prep: Prepared, combos: list[tuple[str, int]], workers: int | None = None,
             progress: bool = False, heartbeat: Heartbeat | None = None) -> list[tuple[dict, RunResult]]:
    """run_one for every (policy, batch size), in parallel on forked processes that inherit the draft
    tables (no copy). Slow runs (small batches, no speculation) start first. Results keep `combos` order.
    `heartbeat` (if any) is told of each finished run."""
    global _PREP
    workers = min(workers or os.cpu_count() or 1, len(combos))
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        serial = []
        for p, b in combos:
            serial.append(run_one(prep, p, b, progress=progress))
            if heartbeat is not None:
                heartbeat.done()
        return serial
    order = sorted(range(len(combos)), key=lambda i: (combos[i][1], combos[i][0] != "none"))
    _PREP = prep
    try:
        with forking_workers():  # a stop signal during the workers' start-up is not lost (sim/infra/fsio.py)
            pool = multiprocessing.get_context("fork").Pool(workers, initializer=die_with_parent)
        with pool:
            it = pool.imap(_run_combo, [combos[i] for i in order], chunksize=1)
            done = []
            for res in progress_bar(it, total=len(combos), desc="runs", unit="run", disable=not progress, leave=False):
                done.append(res)
                if heartbeat is not None:
                    heartbeat.done()
            pool.close()  # workers leave normally, running their exit finalizers (private folders: sim/infra/fsio.py)
            pool.join()
    finally:
        _PREP = None
    out: list = [None] * len(combos)
    for i, res in zip(order, done):
        out[i] = res
    return out


def pick_baseline(a: argparse.Namespace, policies: list[str], from_spec_config: bool,
                  drafters: tuple = DEFAULT_DRAFTERS) -> str | None:
    """The policy every ratio is taken against, or None (no ratios): --baseline P; none with --no-baseline;
    by default BASELINE, except when only --speculative-config named the runs (then they run alone, as
    vLLM would run them, unless one of them is BASELINE) or the run does not enable BASELINE's drafter."""
    if a.baseline is not None and a.no_baseline:
        raise ConfigError("--baseline and --no-baseline exclude each other")
    if a.baseline is not None:
        get_policy(a.baseline, drafters)
        return a.baseline
    if a.no_baseline or (from_spec_config and not a.policy and BASELINE not in policies):
        return None
    if "dspark" not in drafters:
        return None
    return BASELINE


def default_policies(drafters: tuple) -> list[str]:
    """The policies a run compares when none is named: DEFAULT_POLICIES that use only the enabled drafters,
    and `suffix` when the suffix drafter is enabled."""
    out = []
    for p in DEFAULT_POLICIES:
        try:
            get_policy(p, drafters)
        except ConfigError:
            continue
        out.append(p)
    return out + (["suffix"] if "suffix" in drafters else [])


def fit_batch_sizes(sizes: list[int], n_requests: int) -> tuple[list[int], list[int]]:
    """(kept, skipped): a batch size above the number of requests runs exactly as batch n_requests (the batch
    never fills past it), so it is skipped, unless every size is above it (then the smallest runs)."""
    kept = [b for b in sizes if b <= n_requests]
    if not kept:
        kept = [min(sizes)]
    return kept, [b for b in sizes if b not in kept]


def add_speedups(rows: list[dict], baseline: str | None = BASELINE) -> None:
    """speedup_vs_baseline = throughput / the baseline's throughput at the same batch size and setup;
    steady_speedup_vs_baseline the same for the full-batch (steady-state) throughput; NaN without a baseline."""
    keys = ("batch_size", "trace", "model", "gpu", "tensor_parallel_size", "cost", "drafter", "ngram_k", "seed")
    base = {tuple(r[k] for k in keys): (r["output_throughput_tok_s"], r["steady_throughput_tok_s"])
            for r in rows if r["policy"] == baseline}
    for r in rows:
        b = base.get(tuple(r[k] for k in keys))
        r["speedup_vs_baseline"] = r["output_throughput_tok_s"] / b[0] if b else float("nan")
        r["steady_speedup_vs_baseline"] = r["steady_throughput_tok_s"] / b[1] if b else float("nan")


STEPS_FILES = ("steps.parquet", "steps.csv.gz")  # --steps: parquet where pyarrow is installed, else gzipped CSV
VERDICT_FILES = ("verdict.md", "verdict.json")  # the verdict per batch size, its `vllm serve` lines (console.verdicts)
OUTPUTS = ("summary.json", "requests.csv", "report.html", *VERDICT_FILES, *STEPS_FILES,
           "steps.csv")  # steps.csv: an older run's


def steps_file() -> str:
    """The name --steps writes the per-step table under: parquet when pyarrow is installed (pandas reads either
    with read_parquet / read_csv), else CSV gzipped; both a tenth or less of the plain CSV."""
    import importlib.util

    return STEPS_FILES[0] if importlib.util.find_spec("pyarrow") is not None else STEPS_FILES[1]


def write_outputs(dest: Path, rows: list[dict], results: list[tuple[dict, RunResult]],
                  baseline: str | None = BASELINE, plotly: str = "inline", steps: bool = False,
                  verdict: list[dict] | None = None, header: str | None = None) -> list[str]:
    """summary.json, requests.csv and report.html in `dest` (and with `steps` the per-step table, steps_file();
    with `verdict`, console.verdicts' records, verdict.md and verdict.json: {"verdicts": records}; `header`: the
    run's header line, atop verdict.md),
    written whole or not at all (a temporary sibling folder swapped into place atomically,
    sim.infra.fsio.atomic_dir: `dest` is either the earlier result or the new one); other files already in `dest`
    are kept (carried into the new folder), those of OUTPUTS an earlier run wrote are not. Returns the names written."""
    with atomic_dir(dest, keep=lambda name: name not in OUTPUTS) as out:  # the layer leaves out its own files
        return _write_outputs(out, rows, results, baseline, plotly, steps, verdict, header)


def _write_outputs(out: Path, rows: list[dict], results: list[tuple[dict, RunResult]],
                   baseline: str | None = BASELINE, plotly: str = "inline", steps: bool = False,
                   verdict: list[dict] | None = None, header: str | None = None) -> list[str]:
    import pandas as pd  # here, not at the top: 0.6 s of import the runs themselves do not need

    from sim.api.report import write_run_report

    (out / "summary.json").write_text(json.dumps(rows, indent=1, default=float) + "\n")
    reqs, frames = [], []
    for row, res in results:
        for frame, dest in ((res.requests, reqs), *(((res.steps, frames),) if steps else ())):
            df = pd.DataFrame(frame)
            df.insert(0, "batch_size", row["batch_size"])
            df.insert(0, "policy", row["policy"])
            dest.append(df)
    pd.concat(reqs).to_csv(out / "requests.csv", index=False)
    names = ["summary.json", "requests.csv"]
    if steps:
        name, table = steps_file(), pd.concat(frames)
        if name.endswith(".parquet"):
            table.to_parquet(out / name, index=False)
        else:  # mtime 0: the same run writes the same bytes
            table.to_csv(out / name, index=False, compression={"method": "gzip", "mtime": 0})
        names.append(name)
    write_run_report(rows, [(r, res.steps) for r, res in results], out / "report.html", baseline, plotly)
    names.append("report.html")
    if verdict is not None:
        (out / "verdict.md").write_text(console.verdict_markdown(verdict, header))
        (out / "verdict.json").write_text(json.dumps({"header": header, "verdicts": verdict}, indent=1) + "\n")
        names += list(VERDICT_FILES)
    return names


def policy_list() -> str:
    """--help's closing list of every registered policy, its spelling and what it does (the policy registry's)."""
    import textwrap

    from sim.core.policies.registry import describe_settings, families

    lines = ["policies (--policy; the baseline is adaptive; the math: docs/design.md):"]
    for fam in families().values():
        lines += [f"  {fam.usage}", textwrap.fill(fam.summary, 100, initial_indent=" " * 6, subsequent_indent=" " * 6)]
        lines += [textwrap.fill(d, 100, initial_indent=" " * 8, subsequent_indent=" " * 10)
                  for d in describe_settings(fam)]  # each declared setting: its rule, default and help
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags: sim/core/config.py's components (generated from their fields) plus what only a run has."""
    ap = ArgumentParser(prog="python -m sim.run", description=__doc__.split("\n\n")[0], epilog=policy_list(),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    for title in GROUP_ORDER:  # the help's sections, in this order
        flag_group(ap, title)
    add_flags(ap, (RunGrid,))
    spec = flag_group(ap, "speculation")
    spec.add_argument("--speculative-config", action="append", default=None, metavar="JSON",
                      help="vLLM's speculative config, mapped onto a policy (repeatable; adds to --policy): method ngram "
                           "or ngram_gpu -> vllm-ngram:K, dspark -> model-fixed:K, dspark with "
                           "enable_adaptive_verification -> adaptive, eagle or eagle3 -> model-fixed:K with that "
                           "drafter's profile, suffix -> suffix (the suffix drafter, its suffix_decoding_* fields), "
                           "mtp on a target with MTP layers -> model-fixed:K with the mtp-standin profile (a stand-in: "
                           "EAGLE-1's acceptance); vLLM main only: suffix with enable_adaptive_verification -> "
                           "suffix-adaptive, mtp with prompt_lookup_min/max -> ngram-mtp (sim/core/vllm.py); runs "
                           "only what it names unless --baseline is given")
    spec.add_argument("--additional-config", default=None, metavar="JSON",
                      help="vLLM's additional config: its hybrid_spec object (this project's plugin) turns a dspark "
                           "config with adaptive verification into hybrid-vllm with those settings, as the verdict "
                           "prints them")
    add_flags(ap, COMPONENTS)
    spec.add_argument("--baseline", default=None, metavar="POLICY",
                      help=f"the policy every ratio is taken against, run too if not named (default: {BASELINE}; with "
                           "only --speculative-config: none unless given)")
    spec.add_argument("--no-baseline", action="store_true", help="run only the named policies (no ratio column)")
    out = flag_group(ap, "output")
    out.add_argument("--out", type=Path, default=None, help="write summary.json, requests.csv, report.html, "
                     "verdict.md and verdict.json (the verdict per batch size with its `vllm serve` lines) "
                     "(a folder; checked before the run, written whole at the end)")
    out.add_argument("--force", action="store_true", help="replace the files sim.api.run writes in an --out folder that "
                     "already holds them (other files there are kept)")
    out.add_argument("--steps", action="store_true", help="--out also gets every step of every run: steps.parquet "
                     "(pyarrow installed) or steps.csv.gz, tens of MB for the bundled traces")
    add_plotly_flag(out, "report.html in --out: ")  # inline: the page renders wherever the folder is copied
    out.add_argument("--format", choices=console.FORMATS, default="table", help=console.FORMAT_HELP + " (default: table)")
    out.add_argument("--no-progress", action="store_true",
                     help="no progress bars (terminal) and no progress lines (stderr not a terminal)")
    out.add_argument("--progress-every", type=finite_float(0, strict=True), default=30.0, metavar="SECONDS",
                     help="when stderr is not a terminal (a log, a pipe): a progress line every SECONDS (default: 30)")
    out.add_argument("--workers", type=int, default=None, help="parallel runs (default: CPU cores)")
    a = ap.parse_args(argv)
    if a.steps and a.out is None:  # the per-step table is one of --out's files: without it, silently nothing
        raise ConfigError("--steps goes with --out (it adds the per-step table to the files written there); "
                          "add --out DIR or drop --steps")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    with out_guard(a.out) as out:  # --out's real folder, locked against a second writer for the whole run
        return _run(a, out)


def _run(a: argparse.Namespace, out: Path | None) -> int:
    t_start = time.perf_counter()  # the progress lines' one clock, from the command's start
    trace = bundled(a.trace)  # a bundled trace (the default) from any working folder
    if str(trace) != str(a.trace):
        print(f"note: {a.trace} is not in the working folder: reading the repository's, {trace}", file=sys.stderr)
        a.trace = str(trace)
    if out:
        check_out_dir(out, a.force)  # before any work, under the lock: a bad --out must not cost a simulation
        written = ("summary.json", "requests.csv", "report.html", *((steps_file(),) if a.steps else ()))
        refuse_in_the_way(out, [(n, False) for n in written], f"--out {out}")  # a folder of the user's at a name
        if a.plotly == "shared":  # a plotly.js beside report.html that is not this one: refused now, not after the runs
            check_asset(out)
    model = llm_name(a.model)
    get_llm(model)  # fail fast on a bad name
    ngram_k, spec_k = a.ngram_k, None
    spec_policies, spec_drafter = [], None  # spec_drafter: the drafter (NAME:K) of an eagle/eagle3 config
    dspark = False
    drafters, drafter_cfg = parse_drafters(a.drafters), collect_drafter_flags(a, a.drafter_config)
    plugin = plugin_settings(a.additional_config)
    if plugin is not None and not a.speculative_config:
        raise ConfigError("--additional-config: hybrid_spec needs --speculative-config (a dspark config with "
                          "enable_adaptive_verification, which the plugin rides on)")
    if a.speculative_config:
        from sim.core.drafters.calibration import NgramCalibrator

        calib = NgramCalibrator.load(a.calibrator)
        block = load_drafter_profile(a.drafter).block
        for text in a.speculative_config:
            m = speculative_config(text, (calib.cfg.n_min, calib.cfg.n_max), block, plugin,
                                   mtp_layers=get_llm(model).mtp_layers, target=model, ngram_ext_max=calib.cfg.ext_max)
            for note in m.notes:
                print(f"note: {note}", file=sys.stderr)
            if m.ngram_k is not None:
                if spec_k is not None and spec_k != m.ngram_k:
                    raise ConfigError("--speculative-config: two n-gram configs with different num_speculative_tokens "
                                      "(the n-gram chain length is one per run)")
                if a.ngram_k != SimSetup.ngram_k and a.ngram_k != m.ngram_k:
                    raise ConfigError(f"--speculative-config: num_speculative_tokens={m.ngram_k} and --ngram-k {a.ngram_k} "
                                      "disagree (the n-gram chain length is one per run)")
                spec_k = ngram_k = m.ngram_k
            dspark = dspark or (m.drafter is None and m.ngram_k is None)  # a dspark config: the DSpark drafter
            if m.drafter is not None:
                if spec_drafter is not None and spec_drafter != m.drafter:
                    raise ConfigError("--speculative-config: two eagle configs with different methods or "
                                      "num_speculative_tokens (the model drafter is one per run)")
                spec_drafter = m.drafter
            spec_policies.append(m.policy)
            if m.suffix is not None:  # method suffix: the suffix drafter, with the config's settings
                if "suffix" not in drafters:
                    drafters = parse_drafters(drafters + ("suffix",))
                    print(f"note: --speculative-config method 'suffix' enables the suffix drafter (--drafters "
                          f"{','.join(drafters)})", file=sys.stderr)
                drafter_cfg = merge_drafter_config(drafter_cfg, {"suffix": m.suffix})
        if spec_drafter is not None and (a.drafter != SimSetup.drafter or dspark):
            raise ConfigError("--speculative-config: method eagle/eagle3 replaces the model drafter of every policy in "
                              "the run; it cannot be combined with --drafter or with a dspark config")
        if spec_drafter is not None:
            print("note: every policy of this run uses the EAGLE-style drafter; its confidences (used by adaptive and "
                  "the hybrids) are the profile's synthetic ones: EAGLE has no confidence head", file=sys.stderr)
    check_settings_used(drafter_cfg, drafters)  # --suffix-config without the suffix drafter: refused, not ignored
    defaults_ = [] if spec_policies else default_policies(drafters)
    policies = list(dict.fromkeys((a.policy or defaults_) + spec_policies))
    for p in policies:
        get_policy(p, drafters)  # fail fast on a bad name or a drafter the run does not enable, before any work
    baseline = pick_baseline(a, policies, bool(spec_policies), drafters)
    add_baseline = baseline is not None and baseline not in policies
    if add_baseline:
        policies.insert(0, baseline)
    sizes = list(dict.fromkeys(a.batch_size or DEFAULT_BATCH_SIZES))
    for b in sizes:
        check("batch_size", b)
    if a.workers is not None and a.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {a.workers}")
    setup = dataclasses.replace(from_args(SimSetup, a), model=model, ngram_k=ngram_k, drafters=",".join(drafters),
                                drafter_config=drafter_cfg)
    if spec_drafter is not None:  # an EAGLE head run for K sequential steps: its profile at block K (NAME:K)
        setup = dataclasses.replace(setup, drafter=spec_drafter)
    tty = sys.stderr.isatty()
    progress = not a.no_progress and tty
    every = None if a.no_progress or tty else a.progress_every
    with Heartbeat("loading the trace and building the draft tables", None, every, since=t_start):
        prep = prepare(setup, progress=progress)
        check_kv(prep, setup.kv_capacity_tokens)  # before any simulation (and progress line), naming the request
        tb = prep.tables  # a live drafter's memory (the suffix trees), checked at the largest batch before any run
        check_live_memory([d for p in policies for d in get_policy(p, drafters).uses_extra], setup.drafter_config,
                          np.asarray(tb.prompt_len) + np.asarray(tb.out_len), tb.out_len, max(sizes))
    if prep.tables.replayed_requests:
        print(f"note: {prep.tables.replayed_requests} of {len(prep.tables.out_len)} requests replay recorded drafts; "
              "the rest use the drafter profile", file=sys.stderr)
    if prep.length_only:
        print("note: length-only requests: acceptance drawn from the bundled traces' statistical profile", file=sys.stderr)
    if prep.tokenizer_note:
        print(f"note: {prep.tokenizer_note}", file=sys.stderr)
    if add_baseline:
        print(f"note: running the baseline '{baseline}' too, for the ratios (x {baseline}); --no-baseline skips it",
              file=sys.stderr)
    elif baseline is None and not a.no_baseline:
        why = ("running only what --speculative-config names" if spec_policies else  # not blamed on a config
               f"'{BASELINE}' uses the dspark drafter, which --drafters {','.join(drafters)} does not enable")
        print(f"note: no baseline ({why}): no ratios; --baseline POLICY adds one to compare against, e.g. --baseline "
              f"{BASELINE} (vLLM's adaptive verification)", file=sys.stderr)
    if spec_policies and not a.batch_size:
        print(f"note: batch sizes {' and '.join(map(str, sizes))} (the defaults); --max-num-seqs B runs one",
              file=sys.stderr)
    sizes, skipped = fit_batch_sizes(sizes, len(prep.arrivals))
    if skipped:
        print(f"note: batch size {', '.join(map(str, skipped))} skipped: the trace has only {len(prep.arrivals)} "
              f"requests, so a larger batch runs the same as batch {len(prep.arrivals)}", file=sys.stderr)
    combos = [(p, b) for b in sizes for p in policies]
    with Heartbeat("runs", len(combos), every, since=t_start) as hb:
        results = run_many(prep, combos, workers=a.workers, progress=progress, heartbeat=hb)
    for row, res in results:  # a lossy run is a simulator bug: its numbers must not be reported
        res.raise_if_lossy(f"policy {row['policy']} at batch size {row['batch_size']}")
    rows = [row for row, _ in results]
    add_speedups(rows, baseline)
    tok = f" (text tokenized with {prep.tokenizer})" if prep.tokenizer else ""
    header = (f"trace {a.trace}: {rows[0]['requests']} requests, {rows[0]['output_tokens']} output tokens{tok}; "
              f"{model} on {a.gpu} ({a.cost}); " + (f"baseline {baseline}" if baseline else "no baseline"))
    dep = deployment(setup)
    console.emit(rows, a.format, baseline, header=header, deployment=dep)
    if a.out:
        records: list[dict] = []
        console.verdicts(rows, baseline, deployment=dep, records=records)
        names = write_outputs(out, rows, results, baseline, a.plotly, a.steps, records, header)
        print(f"wrote {a.out}/{', '.join(names)}" + ("" if a.steps else " (--steps adds every step)"),
              file=sys.stdout if a.format == "table" else sys.stderr)
    return 0
