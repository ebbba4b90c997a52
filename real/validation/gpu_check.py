"""One prepared run for a borrowed CUDA machine: the project's own torch engine (real/engine/, never vLLM) on a
random-weight model, profiled, its forward timed against the roofline, and a teacher-forced validation slice of
each bundled trace, written as files to commit. It checks the roofline's costs for this engine on this GPU, not
vLLM's (real/validate.py --engine vllm does that).

    python real/gpu_check.py [--model qwen3-8b] [--device cuda] [--quick] [--out DIR] [--time-budget-s 420]
                             [--gpu-spec NAME] [--force]        (also: python -m real.gpu_check)

Meant for a machine with torch (and CUDA) but no vLLM, no internet and no model weights: the target runs with
random weights, teacher forced (real/validation/workload.py), so nothing is downloaded (the Hugging Face offline switches
are set as well). Without a GPU torch can see, it stops with one line naming torch's CUDA build and the driver
(sim/infra/cuda.py). Phases, in order, each started only while --time-budget-s lasts (what is skipped is said):
  1 preflight  OK / FAIL / SKIP lines: torch, CUDA, the device and its memory, bf16, python packages, traces,
               free disk, whether the model fits (bf16 weights num_params * 2 bytes + the largest KV cache the
               runs need), and that no output would be overwritten (unless --force). Any FAIL: one line, exit 2.
  1b plugin    the vLLM plugin's device code without vLLM: Triton n-gram kernels vs the simulator's drafter,
               the hybrid step on the device vs the CPU, no host sync, time per step (real.vllm_plugin.checks).
  2 profile    real.validation.profile.profile(...) -> DIR/cost_table.json; its decode-shaped timings are printed beside
               the table's and the roofline's (the device's models/gpus spec, matched by its name:
               real/validation/machine.py GPU_SPECS; another GPU is a preflight FAIL unless --gpu-spec names one).
  3 grid       the target forward alone over batch R x verify tokens q x context (medians of repeats, synced),
               skipping what does not fit in memory -> DIR/grid.csv, with the roofline's verify_ms.
  4 validate   real.validation.validate.main(...) once per (batch size, trace), largest batch first, into
               DIR/validate/bs<B>/, then every finished cell aggregated into DIR/validate/fidelity.{json,md,html}.
               A cell runs min(--limit, --requests-per-slot x B) requests, so batch 1 does not eat the budget
               (--requests-per-slot 0: --limit for every batch size). A call is not started once the budget is
               spent, nor when the same batch size took longer on the previous trace than what is left.
  5 write      reports/fidelity-gpu.md and models/cost_tables/<gpu>_<model>-measured.json (a copy of
               DIR/cost_table.json), each whole or not at all, never over an existing file without --force;
               with --device cpu (a test run) both go to DIR instead, never into the repository.
It prints the paths to commit at the end. Exit 0 when every phase that ran succeeded, 1 otherwise (the report
is still written and records the failure; details in DIR/errors.log), 2 on a preflight failure.
"""
from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import functools
import gc
import io
import json
import os
import shlex
import shutil
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from sim.infra.cli import SEED, ArgumentParser, check_out_dir, finite_float, write_whole
from sim.infra.fsio import refuse_in_the_way, resolve_out
from sim.infra.errors import ConfigError
from sim.core.models import llm_name
from sim.infra import paths

ROOT = paths.REPO
POLICIES = ["none", "adaptive", "hybrid-price", "ngram-fixed:32"]
QUICK_POLICIES = ["none", "hybrid-price"]
BATCH_SIZES = [1, 16, 64]
QUICK_BATCH_SIZES = [1, 2]
TRACES = ["traces/codeedit.jsonl", "traces/chat.jsonl"]
# forward-timing grid: requests x verify tokens per request x cached context per request
GRID = {"reqs": (1, 8, 32, 128, 256), "q": (1, 8), "contexts": (512, 4096), "repeat": 5}
QUICK_GRID = {"reqs": (1, 4), "q": (1, 8), "contexts": (64, 256), "repeat": 3}
GIB = 1024 ** 3
MIN_FREE_DISK_GIB = 1.0
REPORT = "reports/fidelity-gpu.md"


# --------------------------------------------------------------------------------------------- helpers
@dataclass
class Run:
    """State shared by the phases: the budget clock, what ran, what was skipped or failed."""
    args: "GpuCheckOptions"
    out: Path
    t0: float
    budget_s: float
    device: str = "cpu"
    gpu: str = "cpu"                      # models/gpus name ("cpu" for a CPU run)
    device_name: str = "cpu"
    preflight: list[str] = field(default_factory=list)
    phases: list[tuple[str, float, str]] = field(default_factory=list)  # (phase, seconds, status)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    profile_grid_text: str = ""
    grid_rows: list[dict] = field(default_factory=list)
    validate_cmds: list[str] = field(default_factory=list)
    plugin_lines: list[str] = field(default_factory=list)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def fail(self, what: str, exc: BaseException) -> None:
        """Record a failed step: one line kept for the report, the traceback appended to DIR/errors.log."""
        line = f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
        self.failed.append(line)
        say(f"FAILED {line}")
        with open(self.out / "errors.log", "a") as fh:
            fh.write(f"--- {what}\n{traceback.format_exc()}\n")


def say(msg: str) -> None:
    print(msg, flush=True)


def _rel(p: Path) -> str:
    """p relative to the repository (the working directory of the run) when inside it, so that the commands
    recorded in the committed report carry no machine's absolute paths."""
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def _free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _final_paths(run: Run) -> tuple[Path, Path]:
    """Where the report and the measured table go: the repository on CUDA, DIR on a CPU (test) run."""
    name = f"{run.gpu}_{run.args.model}-measured.json"
    if run.device == "cpu":
        return run.out / Path(REPORT).name, run.out / name
    return ROOT / REPORT, ROOT / "models" / "cost_tables" / name


def _own_outputs(out: Path) -> list[Path]:
    """What the phases write under --out (the profiler may add files beside its table: cost_table.json.*)."""
    return [out / "cost_table.json", *sorted(out.glob("cost_table.json.*")), out / "grid.csv", out / "validate",
            out / "errors.log"]


def replace_earlier(out: Path) -> list[Path]:
    """--force: clear the way for this run's outputs under `out` without removing anything but the files it writes.

    A user's folder (or file) at a name the phases write a file (folder) to is refused, never removed. The earlier
    validate/ folder is moved aside (validate.replaced-TIMESTAMP), never removed: the validation phase resumes what
    it finds there, so --force starts it afresh, and the folder may hold the user's files too. Returns what was
    moved aside."""
    refuse_in_the_way(out, [(p.name, p.name == "validate") for p in _own_outputs(out)], f"--out {out}")
    moved = []
    for p in _own_outputs(out):
        if p.is_dir() and not p.is_symlink():
            aside = p.with_name(f"{p.name}.replaced-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}")
            n = 1
            while os.path.lexists(aside):  # two --force runs within a second
                aside, n = aside.with_name(f"{aside.name.split('~')[0]}~{n}"), n + 1
            p.rename(aside)
            moved.append(aside)
            say(f"--force: the earlier {p} moved aside to {aside.name} (remove it when you no longer need it)")
        elif p.exists() or p.is_symlink():
            p.unlink()
    return moved


# --------------------------------------------------------------------------------------------- 1 preflight
def preflight(run: Run) -> None:
    """Print the checklist (module docstring); ConfigError (one line) on any FAIL."""
    import importlib
    import importlib.util

    import torch

    a = run.args
    lines: list[str] = []
    fails: list[str] = []

    def check(status: str, what: str) -> None:
        lines.append(f"{status:4s}  {what}")
        say(f"{status:4s}  {what}")
        if status == "FAIL":
            fails.append(what)

    try:
        dev = torch.device(a.device)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(f"bad --device {a.device!r}: {e}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {a.device}: use cuda (the point of this script) or cpu (to test it)")
    run.device = dev.type
    cuda = dev.type == "cuda"
    say(f"preflight ({'CUDA run' if cuda else '--device cpu: a test run, the CUDA checks are skipped'})")
    check("OK", f"torch {torch.__version__} (CUDA build {torch.version.cuda or 'none'}), python "
                f"{sys.version.split()[0]}")
    cuda_ok, no_cuda = False, ""
    if cuda:
        cuda_ok = torch.cuda.is_available()
        if not cuda_ok:
            from sim.infra.cuda import no_cuda_reason

            no_cuda = no_cuda_reason()
        check("OK" if cuda_ok else "FAIL", "CUDA available" + ("" if cuda_ok else f": {no_cuda}"))
    else:
        check("SKIP", "CUDA available (--device cpu)")
    free_mem = None
    if cuda_ok:
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        if idx >= torch.cuda.device_count():
            check("FAIL", f"device {a.device}: only {torch.cuda.device_count()} CUDA device(s)")
        else:
            run.device_name = torch.cuda.get_device_name(idx)
            from real.validation.machine import gpu_models_name
            free_mem, total = torch.cuda.mem_get_info(idx)
            cap = torch.cuda.get_device_capability(idx)
            what = (f"device {run.device_name} (sm_{cap[0]}{cap[1]}), {total / GIB:.1f} GiB, {free_mem / GIB:.1f} GiB "
                    "free; roofline spec ")
            try:
                run.gpu = gpu_models_name(run.device_name, a.gpu_spec)
                check("OK", f"{what}models/gpus/{run.gpu}.json" + (" (--gpu-spec)" if a.gpu_spec else ""))
            except ConfigError as e:
                check("FAIL", f"{what}none: {e}")
            bf16 = torch.cuda.is_bf16_supported()
            check("OK" if bf16 else "FAIL", "bf16 supported" if bf16 else "bf16 not supported by this GPU")
    elif cuda:
        check("SKIP", "device name and memory (no CUDA)")
        check("SKIP", "bf16 support (no CUDA)")
    else:
        check("SKIP", "device name and memory (--device cpu)")
        check("SKIP", "bf16 support (--device cpu)")
        if a.gpu_spec is not None:
            check("FAIL", f"--gpu-spec {a.gpu_spec}: names the spec of a CUDA GPU; --device cpu has none")

    missing = [m for m in ("numpy", "scipy", "pandas", "plotly", "simpy", "tqdm") if importlib.util.find_spec(m) is None]
    if not missing:
        try:  # the modules the phases import, so that a missing dependency fails here, not after minutes
            for mod in ("real.validation.profile", "real.validation.validate", "real.validation.workload", "real.engine.engine", "sim.api.run"):
                importlib.import_module(mod)
        except ImportError as e:
            missing.append(f"{e.name or e}")
    check("FAIL" if missing else "OK", f"python packages: missing {', '.join(missing)}" if missing else
          "python packages: numpy scipy pandas plotly simpy tqdm and the project's modules import")

    absent = [t for t in run.args.trace if not (ROOT / t).is_file() and not Path(t).is_file()]
    gen = "traces/general.jsonl"
    if not (ROOT / gen).is_file():
        absent.append(f"{gen} (profiling)")
    check("FAIL" if absent else "OK", f"traces missing: {', '.join(absent)}" if absent else
          f"traces: {', '.join(run.args.trace)} (validation), {gen} (profiling)")

    probe = run.out
    while not probe.exists():
        probe = probe.parent
    disk = shutil.disk_usage(probe).free / GIB
    check("OK" if disk >= MIN_FREE_DISK_GIB else "FAIL", f"free disk {disk:.1f} GiB at {probe}"
          + ("" if disk >= MIN_FREE_DISK_GIB else f" (need {MIN_FREE_DISK_GIB} GiB)"))

    try:
        from sim.core.models import get_llm

        spec = get_llm(a.model)
        elt = 2 if cuda else 4  # bf16 on CUDA, fp32 on a CPU (real/validation/workload.py)
        kvb = spec.num_layers * 2 * spec.num_kv_heads * spec.head_dim * elt
        weights = spec.num_params * elt
        kv = max(max(a.batch_size) * (a.max_prompt + a.max_tokens + 40), max(a.batch_size) * (512 + 32 + 40)) * kvb
        need = weights + kv + (4 * GIB if cuda else 0.5 * GIB)
        what = (f"model {a.model} fits: {'bf16' if cuda else 'fp32'} weights {weights / GIB:.1f} GiB + KV cache "
                f"{kv / GIB:.1f} GiB (batch {max(a.batch_size)}, {a.max_prompt} + {a.max_tokens} tokens) + headroom "
                f"= {need / GIB:.1f} GiB")
        if cuda and free_mem is not None:
            check("OK" if need <= free_mem else "FAIL", f"{what} of {free_mem / GIB:.1f} GiB free")
        elif cuda:
            check("SKIP", f"{what} (no CUDA to compare with)")
        else:
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            check("OK" if need <= ram else "FAIL", f"{what} of {ram / GIB:.1f} GiB RAM")
    except ConfigError as e:
        check("FAIL", f"model {a.model}: {e}")

    report, table = _final_paths(run)
    prev = [p for p in (report, table, *_own_outputs(run.out)) if p.exists()]
    if prev and not a.force:
        check("FAIL", f"outputs exist (pass --force to replace them): {', '.join(map(str, prev))}")
    else:
        check("OK", f"outputs: {report}, {table}, {run.out}/" + (" (replacing, --force)" if prev else ""))

    run.preflight = lines
    if cuda and not cuda_ok:
        raise ConfigError(f"--device {a.device}: {no_cuda}; --device cpu runs the script as a test")
    if fails:
        raise ConfigError(f"preflight failed: {'; '.join(fails)}")


# --------------------------------------------------------------------------------------------- 2 profile
def phase_profile(run: Run):
    """real.validation.profile.profile into DIR/cost_table.json; returns (table, roofline) or (None, None)."""
    from real.validation.profile import format_grid, profile

    a = run.args
    roof = None
    if run.device == "cuda":
        try:
            from sim.core.cost import make_cost_model

            roof = make_cost_model("roofline", llm=a.model, gpu=run.gpu)
        except Exception as e:  # noqa: BLE001 -- the measurements stand without it; say why
            run.fail(f"roofline model of {a.model} on {run.gpu}", e)
    say(f"\n[profile] {a.model} on {run.device_name}: policies {', '.join(a.policy)}, batch "
        f"{', '.join(map(str, a.batch_size))} -> {run.out / 'cost_table.json'}")
    table, path, grid = profile(a.model, True, a.device, list(a.policy), sorted(set(a.batch_size)), a.quick,
                                run.out / "cost_table.json", gpu_spec=a.gpu_spec)
    run.profile_grid_text = format_grid(grid, table, roof)
    say(run.profile_grid_text)
    say(f"fit: logits_ms_per_row {table.logits_ms_per_row:.4f}  kv_ms_per_token {table.kv_ms_per_token:.2e}  "
        f"-> {path}")
    return table, roof


# --------------------------------------------------------------------------------------------- 3 grid
def _transient_bytes(args, R: int, q: int, ctx: int, elt: int) -> int:
    """A generous bound on one forward's temporary memory beyond the KV cache: the gathered K/V of the padded
    decode batch (and their GQA expansion if SDPA falls back to its math path), the attention scores, the
    logits (model dtype, then fp32) and the MLP activations."""
    T, K = R * q, ctx + q
    attn = 2 * R * (args.num_kv_heads + args.num_heads) * K * args.head_dim * elt + 2 * R * args.num_heads * q * K * 4
    return int(attn + T * args.vocab_size * (elt + 4) + 4 * T * (args.hidden_size + 2 * args.intermediate_size) * elt
               + GIB)


def phase_grid(run: Run, roof) -> None:
    """The target forward alone over the R x q x context grid -> DIR/grid.csv (module docstring)."""
    import torch

    from real.engine.weights import build_model
    from real.validation.profile import median_ms

    a = run.args
    g = QUICK_GRID if a.quick else GRID
    cuda = run.device == "cuda"
    dev = torch.device(a.device)
    say(f"\n[grid] forward alone: R {list(g['reqs'])} x q {list(g['q'])} x context {list(g['contexts'])}, "
        f"median of {g['repeat']}")
    model, args = build_model(a.model, dev, None, max_slots=1, max_len=64, seed=a.seed)
    elt = model.tok_embeddings.weight.element_size()
    kvb = args.num_layers * 2 * args.num_kv_heads * args.head_dim * elt
    qmax = max(g["q"])
    rows: list[dict] = []
    out_of_time = False

    def row(R, q, ctx, ms=None, note=""):
        T, K = R * q, R * (ctx + q)
        rl = float(roof.verify_ms(T, K, R)) if roof is not None else None
        rows.append({"R": R, "q": q, "context": ctx, "tokens": T, "measured_ms": ms, "roofline_ms": rl, "note": note})

    try:
        for ctx in g["contexts"]:
            max_len = ctx + qmax + 1
            if max_len > args.max_seq_len:
                for R in g["reqs"]:
                    for q in g["q"]:
                        row(R, q, ctx, note=f"context beyond max_seq_len {args.max_seq_len}")
                continue
            model.k_cache = model.v_cache = None  # free the previous cache before sizing the next
            _free_memory()
            slots = max(g["reqs"])
            if cuda:
                free = torch.cuda.mem_get_info(dev)[0]
                fit = [R for R in g["reqs"] if R * max_len * kvb + _transient_bytes(args, R, qmax, ctx, elt) <= 0.9 * free]
                slots = max(fit) if fit else 0
            while slots:
                try:
                    model.setup_caches(slots, max_len)
                    break
                except torch.cuda.OutOfMemoryError:
                    pass  # freed below, once the exception (and the frames it holds) is gone
                model.k_cache = model.v_cache = None
                _free_memory()
                slots = max([R for R in g["reqs"] if R < slots], default=0)
            for R in g["reqs"]:
                for q in g["q"]:
                    if out_of_time or run.left() <= 0:
                        out_of_time = True
                        row(R, q, ctx, note="skipped: time budget spent")
                        continue
                    if R > slots:
                        row(R, q, ctx, note=f"skipped: KV cache of {R} x {max_len} tokens does not fit")
                        continue
                    T = R * q
                    lt = lambda x: torch.tensor(x, dtype=torch.int64, device=dev)  # noqa: E731
                    toks = torch.randint(0, args.vocab_size, (T,), generator=torch.Generator().manual_seed(R * q)).to(dev)
                    fwd = (toks, lt([q] * R), lt([ctx] * R), lt(list(range(R))), torch.arange(T, device=dev))
                    ms = None
                    try:
                        ms = median_ms(functools.partial(model, *fwd), g["repeat"], dev)
                    except torch.cuda.OutOfMemoryError:
                        pass  # freed below, once the exception (and the frames it holds) is gone
                    del fwd, toks
                    if ms is None:
                        _free_memory()
                        row(R, q, ctx, note="skipped: out of memory")
                        continue
                    row(R, q, ctx, ms)
                    r = rows[-1]
                    say(f"  R {R:4d}  q {q:2d}  context {ctx:5d}  tokens {T:5d}  {ms:9.2f} ms"
                        + (f"  roofline {r['roofline_ms']:8.2f} ms  ratio {ms / r['roofline_ms']:5.2f}"
                           if r["roofline_ms"] else ""))
    finally:
        del model
        _free_memory()
        run.grid_rows = rows
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=["R", "q", "context", "tokens", "measured_ms", "roofline_ms", "note"],
                           lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4f}" if isinstance(v, float) else "" if v is None else v) for k, v in r.items()})
        write_whole(run.out / "grid.csv", buf.getvalue(), overwrite=True)
    if out_of_time:
        run.skipped.append("grid: points after the time budget was spent (marked in grid.csv)")
    say(f"wrote {run.out / 'grid.csv'}")


# --------------------------------------------------------------------------------------------- 4 validate
def cell_limit(a: GpuCheckOptions, bs: int) -> int:
    """Requests of a cell at batch size bs: min(--limit, --requests-per-slot x bs); --limit when that is 0."""
    return a.limit if a.requests_per_slot == 0 else min(a.limit, a.requests_per_slot * bs)


def phase_validate(run: Run) -> Path | None:
    """real.validation.validate.main per (batch size, trace), then the aggregate; returns DIR/validate/fidelity.json."""
    from real.validation import validate as V

    a = run.args
    vdir = run.out / "validate"
    took: dict[int, float] = {}  # batch size -> seconds its last call took
    metas = []
    say(f"\n[validate] traces {', '.join(a.trace)}; policies {', '.join(a.policy)}; batch "
        f"{', '.join(map(str, sorted(set(a.batch_size), reverse=True)))}")
    for bs in sorted(set(a.batch_size), reverse=True):
        for trace in a.trace:
            lim = cell_limit(a, bs)
            what = f"validate {Path(trace).stem} batch {bs} ({lim} requests x {a.max_tokens} tokens)"
            left = run.left()
            if left <= 0:
                run.skipped.append(f"{what}: time budget spent")
                say(f"skip {what}: time budget spent")
                continue
            if bs in took and took[bs] > left:
                run.skipped.append(f"{what}: the previous trace took {took[bs]:.0f} s at this batch size, "
                                   f"{left:.0f} s left")
                say(f"skip {what}: {took[bs]:.0f} s expected, {left:.0f} s left")
                continue
            out_b = vdir / f"bs{bs}"
            argv = ["--random-weights", "--model", a.model, "--device", a.device,
                    "--cost-table", _rel(run.out / "cost_table.json"), "--out", _rel(out_b), "--trace", trace]
            for p in a.policy:
                argv += ["--policy", p]
            argv += ["--batch-size", str(bs), "--limit", str(lim), "--max-tokens", str(a.max_tokens),
                     "--max-prompt", str(a.max_prompt), "--seed", str(a.seed)]
            if a.plotly != "inline":  # the default is left out: the recorded commands stay as they were
                argv += ["--plotly", a.plotly]
            run.validate_cmds.append("python real/validate.py " + shlex.join(argv))
            say(f"{what}: python real/validate.py {shlex.join(argv)}")
            t0 = time.perf_counter()
            try:
                rc = V.main(argv)
                if rc:
                    run.failed.append(f"{what}: real/validation/validate.py exited {rc} (see its output above)")
            except Exception as e:  # noqa: BLE001 -- one failed call must not lose the others' cells
                run.fail(what, e)
            took[bs] = time.perf_counter() - t0
            _free_memory()
            fj = out_b / "fidelity.json"
            if fj.exists():
                metas.append(json.loads(fj.read_text())["meta"])
    # every finished cell (the per-call fidelity files hold only their call's cells) into one aggregate
    order_t = {Path(t).stem: i for i, t in enumerate(a.trace)}
    order_p = {p: i for i, p in enumerate(a.policy)}
    cells = []
    for f in sorted(vdir.glob("bs*/*/cells/*.json")):
        c = json.loads(f.read_text())
        cells.append(c)
    cells.sort(key=lambda c: (order_t.get(Path(c["trace"]).stem, 99), order_p.get(c["policy"], 99), c["batch_size"]))
    if not cells or not metas:
        return None
    meta = dict(metas[-1])
    meta["command"] = run_command(run)
    meta["validate_commands"] = list(run.validate_cmds)
    meta["requests_per_cell"] = {str(b): cell_limit(a, b) for b in sorted(set(a.batch_size))}
    agg = V.write_reports(vdir, cells, meta, plotly=a.plotly)
    say(f"validation: {agg['cells']} cells, median throughput error {100 * agg['median_error']:.1f}%, max "
        f"{100 * agg['max_error']:.1f}%, lossless {agg['all_lossless']} -> {vdir / 'fidelity.md'}")
    return vdir / "fidelity.json"


# --------------------------------------------------------------------------------------------- 5 write
def run_command(run: Run) -> str:
    return "python real/gpu_check.py " + shlex.join(run.args.argv)


def _fmt(v, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def format_report(run: Run, fidelity: Path | None) -> str:
    """reports/fidelity-gpu.md: preflight, phases, grid vs roofline, the validation's fidelity table, command."""
    from real.validation.fidelity import format_md

    a = run.args
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    L = [f"# GPU check: {a.model} on {run.device_name}", "",
         f"Produced by `{run_command(run)}` on {now} (`real/validation/gpu_check.py`; random weights, teacher forced: the "
         f"trace's tokens are the target's, every kernel runs at the model's size). Time budget "
         f"{a.time_budget_s:.0f} s, used {run.elapsed():.0f} s.", "", "## Preflight", "", "```", *run.preflight, "```",
         "", "## Phases", "", "| phase | seconds | status |", "|---|---:|---|"]
    L += [f"| {p} | {s:.1f} | {st} |" for p, s, st in run.phases]
    if run.skipped:
        L += ["", "Skipped:", *[f"- {s}" for s in run.skipped]]
    if run.failed:
        L += ["", "Failed (tracebacks in the run's errors.log):", *[f"- {s}" for s in run.failed]]
    L += ["", "## Target forward alone vs the roofline", ""]
    if run.grid_rows:
        L += [f"The forward pass of R requests x q verify tokens (every row's logits) over `context` cached tokens "
              f"each; median of {(QUICK_GRID if a.quick else GRID)['repeat']} synchronised repeats after a warm-up. "
              + (f"Roofline: `make_cost_model('roofline', llm='{a.model}', gpu='{run.gpu}').verify_ms(tokens, "
                 f"R x (context + q), R)`." if run.device == "cuda" else "No roofline on a CPU run."), "",
              "| R | q | context | tokens | measured ms | roofline ms | measured / roofline | note |",
              "|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in run.grid_rows:
            ratio = r["measured_ms"] / r["roofline_ms"] if r["measured_ms"] and r["roofline_ms"] else None
            L.append(f"| {r['R']} | {r['q']} | {r['context']} | {r['tokens']} | {_fmt(r['measured_ms'])} | "
                     f"{_fmt(r['roofline_ms'])} | {_fmt(ratio)} | {r['note']} |")
    else:
        L.append("Not measured (see Phases).")
    if run.profile_grid_text:
        L += ["", "The profiler's own decode-shaped timings (R requests x 8 tokens, context 512) beside its fitted "
              "table and the roofline (`real.validation.profile.format_grid`):", "", "```", run.profile_grid_text, "```"]
    L += ["", "## The vLLM plugin's device code (without vLLM)", ""]
    if run.plugin_lines:
        L += ["`real.vllm_plugin.checks.plugin_device_check`: the Triton n-gram kernels against the simulator's "
              "drafter, the hybrid step (observe + propose of `real/vllm_plugin/hybrid.py`) on the device against "
              "the CPU, host-sync freedom, and its time per step (eager, not in a CUDA graph).", "", "```",
              *run.plugin_lines, "```"]
    else:
        L.append("Not run (see Phases).")
    L += ["", "## Validation: the simulator against the real engine", ""]
    if fidelity is not None and fidelity.exists():
        obj = json.loads(fidelity.read_text())
        md = format_md(obj["cells"], obj["aggregate"], obj["meta"]).splitlines()
        if md and md[0].startswith("# "):
            md = md[2:] if len(md) > 1 and not md[1].strip() else md[1:]
        L += md
        L += ["", "Requests per cell by batch size: " + ", ".join(f"batch {b}: {n}" for b, n in
                                                              obj["meta"].get("requests_per_cell", {}).items()) + ".",
              "", "Each (batch size, trace) was run by:", "", "```", *run.validate_cmds, "```"]
    else:
        L.append("No validation cell finished (see Phases).")
    table = _final_paths(run)[1]
    L += ["", "## Files", "", f"- measured cost table: `{table.relative_to(ROOT) if table.is_relative_to(ROOT) else table}` "
          "(a copy of the run's `cost_table.json`, loadable with `--cost profiled --gpu PATH`)", ""]
    return "\n".join(L)


def phase_write(run: Run, fidelity: Path | None) -> list[Path]:
    report, table = _final_paths(run)
    written = []
    src = run.out / "cost_table.json"
    # the report last: if the table copy fails nothing half-done is left in the repository's reports/
    if src.exists():
        written.append(write_whole(table, src.read_bytes(), overwrite=run.args.force))
    else:
        say(f"no {src}: no measured table to copy")
    written.insert(0, write_whole(report, format_report(run, fidelity), overwrite=run.args.force))
    return written


def phase_plugin(run: Run) -> None:
    """The vLLM plugin's device code without vLLM (real.vllm_plugin.checks.plugin_device_check): the Triton
    n-gram kernels against the simulator's drafter, the hybrid step on the device against the CPU, no host
    sync, and its time per step. A FAIL line marks the phase failed."""
    from real.vllm_plugin.checks import plugin_device_check

    small = run.device != "cuda" or run.args.quick
    lines = plugin_device_check(run.device, sizes=(2, 4) if small else (4, 64, 256), width=256 if small else 4096,
                                steps=4 if small else 12)
    run.plugin_lines = lines
    for ln in lines:
        say("  " + ln)
    bad = [ln for ln in lines if ln.startswith("FAIL")]
    if bad:
        run.failed.append("plugin: " + "; ".join(bad))


# --------------------------------------------------------------------------------------------- main
@dataclass(frozen=True)
class GpuCheckOptions:
    """The check's options, every default resolved at the command line (parse_args), handed down unchanged."""

    model: str
    device: str
    quick: bool
    out: str
    time_budget_s: float
    force: bool
    trace: tuple[str, ...]
    policy: tuple[str, ...]
    batch_size: tuple[int, ...]
    limit: int
    requests_per_slot: int
    max_tokens: int
    max_prompt: int
    seed: int
    plotly: str
    argv: tuple[str, ...]
    gpu_spec: str | None = None  # models/gpus name; None: matched by the device's name (real/validation/machine.py)


def gpu_check(a: GpuCheckOptions) -> int:
    # traces given relative to the working directory stay valid; the defaults are relative to the repository,
    # as are the profiler's traces/general.jsonl and the reports
    a = dataclasses.replace(a, trace=tuple(str(Path(t).resolve()) if Path(t).is_file() and not (ROOT / t).is_file()
                                           else t for t in a.trace))
    # --out is checked against the caller's working folder (never it, `..`, home or an ancestor) before the chdir
    run = Run(args=a, out=resolve_out(a.out, "--out"), t0=time.perf_counter(), budget_s=float(a.time_budget_s))
    os.chdir(ROOT)
    if run.out.exists() and not run.out.is_dir():
        raise ConfigError(f"--out {run.out}: exists and is not a directory")
    check_out_dir(run.out, force=True)  # writable and not under a file (earlier outputs: preflight, --force)
    preflight(run)
    run.out.mkdir(parents=True, exist_ok=True)
    if a.force:
        replace_earlier(run.out)

    def timed(name: str, fn, *args):
        if run.left() <= 0:
            run.skipped.append(f"{name}: time budget spent")
            run.phases.append((name, 0.0, "skipped: time budget spent"))
            say(f"\nskip {name}: time budget spent ({run.elapsed():.0f} s of {run.budget_s:.0f})")
            return None
        t0 = time.perf_counter()
        n_fail = len(run.failed)
        try:
            res = fn(*args)
            status = "ok" if len(run.failed) == n_fail else "partly failed"
        except Exception as e:  # noqa: BLE001 -- record it, go on with what does not depend on it
            run.fail(name, e)
            res, status = None, "failed"
        _free_memory()
        run.phases.append((name, time.perf_counter() - t0, status))
        say(f"[{name}] {status} in {time.perf_counter() - t0:.1f} s ({run.elapsed():.0f} s of {run.budget_s:.0f})")
        return res

    timed("plugin", phase_plugin, run)
    prof = timed("profile", phase_profile, run)
    table, roof = prof if prof else (None, None)
    if table is None and not (run.out / "cost_table.json").exists():
        run.skipped.append("grid and validation: no cost table (profile did not finish)")
        fidelity = None
    else:
        timed("grid", phase_grid, run, roof)
        fidelity = timed("validate", phase_validate, run)
    written = phase_write(run, fidelity)
    say(f"\ndone in {run.elapsed():.0f} s" + (f"; skipped: {len(run.skipped)} item(s)" if run.skipped else "")
        + (f"; FAILED: {len(run.failed)} item(s), see {run.out / 'errors.log'}" if run.failed else ""))
    if run.device == "cuda":
        say("paths to commit:")
        for p in written:
            say(f"  {p.relative_to(ROOT)}")
    else:
        say("--device cpu: a test run, nothing to commit; written:")
        for p in written:
            say(f"  {p}")
    return 1 if run.failed else 0


def parse_args(argv: list[str] | None) -> GpuCheckOptions:
    ap = ArgumentParser(prog="python real/gpu_check.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-8b", type=llm_name,
                    help="a models/llms name or its Hugging Face id, as in sim.api.run (random weights, teacher forced)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (a test run: outputs stay under --out)")
    ap.add_argument("--quick", action="store_true", help="a small run for tests: 2 policies, batch 1 and 2, "
                    "2 requests x 8 tokens, a 2 x 2 x 2 forward grid")
    ap.add_argument("--out", default="out/gpu-check", help="working directory (cost_table.json, grid.csv, validate/)")
    ap.add_argument("--time-budget-s", type=finite_float(0, strict=True), default=420.0, help="start no new work after this many seconds")
    ap.add_argument("--force", action="store_true", help="replace earlier outputs (the report, the measured table, "
                    "and --out's cost_table.json, grid.csv, validate/)")
    ap.add_argument("--trace", action="append", help=f"validation trace (repeatable; default {' '.join(TRACES)})")
    ap.add_argument("--policy", action="append", help=f"policy (repeatable; default {' '.join(POLICIES)})")
    ap.add_argument("--batch-size", action="append", type=int, help="batch size (repeatable; default 1 16 64)")
    ap.add_argument("--limit", type=int, default=None, help="requests per trace (default 64; --quick 2)")
    ap.add_argument("--requests-per-slot", type=int, default=8, help="a cell at batch B runs min(--limit, this x B) "
                    "requests (default 8; 0: --limit at every batch size)")
    ap.add_argument("--max-tokens", type=int, default=None, help="output tokens per request (default 128; --quick 8)")
    ap.add_argument("--max-prompt", type=int, default=None, help="longest prompt kept (default 2048; --quick 512)")
    ap.add_argument("--seed", type=SEED, default=0)
    from sim.infra.html_page import add_plotly_flag

    add_plotly_flag(ap, "the validation's fidelity.html pages under --out/validate/: ")
    from real.validation.machine import add_gpu_spec_flag, given_gpu_spec

    add_gpu_spec_flag(ap)
    ns = ap.parse_args(argv)
    q = ns.quick
    a = GpuCheckOptions(
        model=ns.model, device=ns.device, quick=q, out=ns.out, time_budget_s=ns.time_budget_s, force=ns.force,
        trace=tuple(ns.trace or TRACES), policy=tuple(ns.policy or (QUICK_POLICIES if q else POLICIES)),
        batch_size=tuple(ns.batch_size or (QUICK_BATCH_SIZES if q else BATCH_SIZES)),
        limit=ns.limit if ns.limit is not None else (2 if q else 64), requests_per_slot=ns.requests_per_slot,
        max_tokens=ns.max_tokens if ns.max_tokens is not None else (8 if q else 128),
        max_prompt=ns.max_prompt if ns.max_prompt is not None else (512 if q else 2048), seed=ns.seed,
        plotly=ns.plotly, argv=tuple(argv if argv is not None else sys.argv[1:]),
        gpu_spec=None if ns.gpu_spec is None else given_gpu_spec(ns.gpu_spec))
    for name in ("limit", "max_tokens", "max_prompt"):
        if getattr(a, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.requests_per_slot < 0:
        raise ConfigError(f"--requests-per-slot must be >= 0 (0: --limit at every batch size), "
                          f"got {a.requests_per_slot}")
    if min(a.batch_size) < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {min(a.batch_size)}")
    if a.time_budget_s <= 0:
        raise ConfigError(f"--time-budget-s must be > 0, got {a.time_budget_s}")
    from sim.core.policies import get_policy

    for p in a.policy:
        get_policy(p)  # an unknown name fails before any work
    return a


OFFLINE_SWITCHES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")


def main(argv: list[str] | None = None) -> int:
    # nothing the check runs may download anything: set when the command runs (before any model or tokenizer is
    # built), not when the module is imported, so importing it changes no one else's environment
    for k in OFFLINE_SWITCHES:
        os.environ.setdefault(k, "1")
    return gpu_check(parse_args(argv))
