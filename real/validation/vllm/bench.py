"""The profiled cost table of a vLLM setup (sim/core/cost/profiled.py format), from `vllm bench forward` runs.

`vllm bench forward` (vLLM 0.33, vllm/benchmarks/forward/) builds exact batches `NAME=[N*]Q[@K][:D]`
(N requests of query length Q, KV length K including the query, D draft tokens), runs them through the real
`execute_model`, captures the forward as a CUDA graph and reports its median replay time (median_us). It
loads dummy weights (timing does not depend on them), times the target alone with --exclude-drafter and
target + drafter (every draft accepted) without it; target sampling, rejection sampling and the host's work
are not timed. Two runs, every case fixed by `forward_cases`:
  target   --exclude-drafter, every case below;
  drafter  the verify cases again with the DSpark drafter.
Cases (K = num_speculative_tokens, q = K + 1, P = SHORT_PREFIX cached tokens per request):
  verify_r<R>   R requests x q tokens, K drafts each, KV P + q      (R = 1, 2, 4, ... up to the largest batch)
  decode_r<R>   R requests x 1 token, KV P + 1                      (R = 1, 2, 4 below q: steps without drafts)
  kv_lo, kv_hi  KV_REQS requests x 1 token at KV_CONTEXTS[0] and [1] tokens
  prefill_t<T>  one fresh prefill of T tokens, above the largest verify step up to max_num_batched_tokens
The LM head is not part of the forward the bench times, so it is timed here apart, in torch: the
[rows x hidden] x [hidden x vocab] bf16 GEMM of the target's shape (models/llms), medians of CUDA-event timed
repeats, fitted as lm(rows) = a + b * rows (non-negative least squares).
Table (every time in ms):
  kv_ms_per_token   (kv_hi - kv_lo) / (KV_REQS * (KV_CONTEXTS[1] - KV_CONTEXTS[0])), >= 0
  verify(T)         case time - kv_ms_per_token * its KV tokens + a (the LM head's fixed cost), by the case's
                    tokens T (mean where two cases share T); logits_ms_per_row = b
  draft(R)          drafter run - target run of verify_r<R>, block K
  capture_sizes     [] (the bench times exact shapes; vLLM's padding to its capture sizes is not modelled)
  ngram, alloc, sample, cpu, kv_capacity_tokens: absent, so the simulator takes them from the roofline model of
                    the table's llm and gpu (sim/core/cost/roofline.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.infra.errors import ConfigError
from sim.infra.inputs import RECORD, read_json
from real.validation.vllm.config import VllmRunConfig

SHORT_PREFIX = 64
KV_REQS = 16
KV_CONTEXTS = (256, 4096)
PREFILL_TOKENS = (512, 1024, 2048, 4096, 8192)
DECODE_REQS = (1, 2, 4)
LM_HEAD_ROWS = (1, 8, 32, 64, 128, 256, 512, 1024)
BENCH_MODULE = ["python", "-m", "vllm.entrypoints.cli.main", "bench", "forward"]


@dataclass(frozen=True)
class Case:
    """One `vllm bench forward --case`: reqs requests of `query` tokens, `kv` KV tokens each (query included),
    `drafts` draft tokens each."""
    name: str
    reqs: int
    query: int
    kv: int
    drafts: int = 0

    @property
    def tokens(self) -> int:
        return self.reqs * self.query

    @property
    def kv_tokens(self) -> int:
        return self.reqs * self.kv

    def arg(self) -> str:
        """NAME=[N*]Q[@K][:D] as vllm/benchmarks/forward/shapes.py parses it."""
        s = f"{self.name}={self.reqs}*{self.query}" if self.reqs > 1 else f"{self.name}={self.query}"
        if self.kv != self.query:
            s += f"@{self.kv}"
        return s + (f":{self.drafts}" if self.drafts else "")


def forward_cases(cfg: VllmRunConfig, batch_sizes: list[int], quick: bool = False) -> list[Case]:
    """The cases of the target run (module docstring); the drafter run takes the verify_* ones."""
    k = cfg.num_speculative_tokens
    q = k + 1
    top = max(batch_sizes)
    reqs = sorted({r for r in ((1, 4, 16) if quick else tuple(2 ** i for i in range(12))) if r <= top} | {top})
    cases = [Case(f"verify_r{r}", r, q, SHORT_PREFIX + q, k) for r in reqs if r * q <= cfg.max_num_batched_tokens]
    if not cases:
        raise ConfigError(f"--max-num-batched-tokens {cfg.max_num_batched_tokens} is below one verify step "
                          f"({q} tokens)")
    cases += [Case(f"decode_r{r}", r, 1, SHORT_PREFIX + 1) for r in DECODE_REQS if r < q]
    cases += [Case(f"kv_{tag}", KV_REQS, 1, c) for tag, c in zip(("lo", "hi"), KV_CONTEXTS)]
    biggest = max(c.tokens for c in cases)
    pre = [t for t in PREFILL_TOKENS if biggest < t <= cfg.max_num_batched_tokens]
    cases += [Case(f"prefill_t{t}", 1, t, t) for t in (pre[:1] if quick else pre)]
    return cases


def bench_argv(cfg: VllmRunConfig, cases: list[Case], out_json: Path, exclude_drafter: bool,
               quick: bool = False) -> list[str]:
    """The `vllm bench forward` command (as `python -m vllm.entrypoints.cli.main bench forward ...`)."""
    argv = BENCH_MODULE + ["--model", cfg.model,
                           "--speculative-config", json.dumps(cfg.speculative_config(adaptive=False), separators=(",", ":")),
                           "--max-num-batched-tokens", str(cfg.max_num_batched_tokens),
                           "--gpu-memory-utilization", str(cfg.gpu_memory_utilization), "--seed", str(cfg.seed),
                           "--kv-len-jitter", "0", "--iters", "10" if quick else "20", "--samples", "3" if quick else "5",
                           "--output-json", str(out_json)]
    if exclude_drafter:
        argv.append("--exclude-drafter")
    for c in cases:
        argv += ["--case", c.arg()]
    return argv


def read_bench(path: Path) -> dict[str, float]:
    """{case name: median ms} from a `vllm bench forward --output-json` file."""
    try:
        rows = read_json(path, RECORD, finite=False)  # through the input layer: a regular file, capped
        return {str(r["case"]): float(r["median_us"]) / 1000.0 for r in rows}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a `vllm bench forward` result ({type(exc).__name__}: {exc})") from None


def time_lm_head(hidden: int, vocab: int, rows=LM_HEAD_ROWS, repeat: int = 20) -> list[tuple[int, float]]:
    """(rows, median ms) of the bf16 LM-head GEMM [rows x hidden] x [hidden x vocab] on the CUDA device."""
    import torch

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    w = torch.randn(vocab, hidden, generator=g, device=dev, dtype=torch.bfloat16)
    out = []
    with torch.inference_mode():
        for r in rows:
            x = torch.randn(r, hidden, generator=g, device=dev, dtype=torch.bfloat16)
            for _ in range(3):
                torch.nn.functional.linear(x, w)
            ts = []
            for _ in range(repeat):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                torch.nn.functional.linear(x, w)
                b.record()
                b.synchronize()
                ts.append(a.elapsed_time(b))
            out.append((int(r), float(np.median(ts))))
    del w
    torch.cuda.empty_cache()
    return out


def fit_lm_head(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(a ms, b ms per row) of lm(rows) = a + b * rows, non-negative least squares over `points`."""
    from scipy.optimize import nnls

    if not points:
        raise ConfigError("no LM-head timings to fit")
    r = np.asarray([p[0] for p in points], dtype=np.float64)
    y = np.asarray([p[1] for p in points], dtype=np.float64)
    coef, _ = nnls(np.stack([np.ones_like(r), r], axis=1), y)
    return float(coef[0]), float(coef[1])


def build_table(cfg: VllmRunConfig, cases: list[Case], target_ms: dict[str, float], drafter_ms: dict[str, float],
                lm_points: list[tuple[int, float]], machine: dict, source: str, gpu: str | None = None):
    """The CostTable from the bench medians (module docstring); ConfigError when a needed case is missing. gpu: its
    models/gpus spec (default: the device's, real/validation/machine.py)."""
    from real.validation.machine import gpu_models_name
    from sim.core.cost.profiled import FORMAT, cost_table_from_dict
    from sim.core.models import get_llm

    by = {c.name: c for c in cases}
    missing = [n for n in by if n not in target_ms]
    if missing:
        raise ConfigError(f"the target bench run has no result for case(s) {', '.join(missing)}")
    lo, hi = by["kv_lo"], by["kv_hi"]
    kv = max(0.0, (target_ms["kv_hi"] - target_ms["kv_lo"]) / (hi.kv_tokens - lo.kv_tokens))
    a, b = fit_lm_head(lm_points)
    pts: dict[int, list[float]] = {}
    for c in cases:
        if c.name.startswith(("verify_", "decode_", "prefill_")):
            pts.setdefault(c.tokens, []).append(max(target_ms[c.name] - kv * c.kv_tokens, 1e-6) + a)
    xs = sorted(pts)
    draft = [(c.reqs, max(drafter_ms[c.name] - target_ms[c.name], 1e-6)) for c in cases
             if c.name.startswith("verify_") and c.name in drafter_ms]
    llm = cfg.sim_model()
    gpu = gpu if gpu is not None else gpu_models_name(machine.get("device", ""))
    obj = {"format": FORMAT, "llm": llm, "gpu": gpu, "source": source,
           "derived": False, "capture_sizes": [],
           "verify": {"num_tokens": xs, "ms": [float(np.mean(pts[x])) for x in xs]},
           "kv_ms_per_token": kv, "logits_ms_per_row": b, "machine": machine, "vocab_size": get_llm(llm).vocab_size}
    if draft:
        obj["draft"] = {"block": cfg.num_speculative_tokens, "num_reqs": [r for r, _ in draft],
                        "ms": [m for _, m in draft]}
    return cost_table_from_dict(obj, "the table profiled with vLLM")


def plan_lines(cfg: VllmRunConfig, batch_sizes: list[int], quick: bool, table: Path) -> list[str]:
    """What `profile` runs, in order, as printable lines."""
    from real.validation.vllm.config import shell_line
    from sim.core.models import get_llm

    cases = forward_cases(cfg, batch_sizes, quick)
    llm = get_llm(cfg.sim_model())
    tgt, drf = _paths(table)
    return [f"  {len(cases)} cases: " + " ".join(c.arg() for c in cases),
            "  " + shell_line(bench_argv(cfg, cases, tgt, True, quick), cfg.env()),
            "  " + shell_line(bench_argv(cfg, [c for c in cases if c.name.startswith("verify_")], drf, False, quick),
                              cfg.env()),
            f"  LM head: torch bf16 GEMM [rows x {llm.hidden_size}] x [{llm.hidden_size} x {llm.vocab_size}] at rows "
            f"{', '.join(map(str, LM_HEAD_ROWS))} (CUDA events, medians), fitted a + b * rows",
            f"  -> {table} (simulator: --cost profiled --gpu {table}); raw results {tgt.name}, {drf.name} beside it",
            "  not measured (the simulator uses the roofline model's): n-gram drafter, allocation, sampling, host CPU"]


def _paths(table: Path) -> tuple[Path, Path]:
    return Path(str(table) + ".bench-target.json"), Path(str(table) + ".bench-drafter.json")


def profile(cfg: VllmRunConfig, batch_sizes: list[int], quick: bool, out: Path, overwrite: bool = False,
            gpu_spec: str | None = None):
    """Run both bench passes and the LM-head timing on this machine's GPU and write the table to `out`
    (gpu_spec: --gpu-spec). Returns (table, path). Needs vLLM and a CUDA GPU (checked by the caller:
    engine.require_vllm)."""
    import torch

    from real.validation.machine import gpu_models_name, machine_info
    from real.validation.vllm.engine import run_logged
    from sim.core.cost.profiled import write_cost_table
    from sim.core.models import get_llm

    if out.exists() and not overwrite:
        raise ConfigError(f"{out} already exists; pass --force to replace it")
    gpu = gpu_models_name(torch.cuda.get_device_name(0), gpu_spec)  # an unknown GPU fails before the bench runs
    cases = forward_cases(cfg, batch_sizes, quick)
    verify = [c for c in cases if c.name.startswith("verify_")]
    tgt, drf = _paths(out)
    run_logged(bench_argv(cfg, cases, tgt, True, quick), cfg.env(), Path(str(tgt) + ".log"),
               "vllm bench forward (target)", must_write=tgt)
    run_logged(bench_argv(cfg, verify, drf, False, quick), cfg.env(), Path(str(drf) + ".log"),
               "vllm bench forward (target + drafter)", must_write=drf)
    llm = get_llm(cfg.sim_model())
    lm = time_lm_head(llm.hidden_size, llm.vocab_size, repeat=10 if quick else 20)
    from importlib import metadata

    machine = machine_info(torch.device("cuda"), torch.bfloat16, llm.name)
    machine.update(engine=f"vllm {metadata.version('vllm')}", hf_model=cfg.model, drafter=cfg.drafter)
    src = (f"real/profile_costs.py --engine vllm on {machine['device']} (vLLM {metadata.version('vllm')}): `vllm bench "
           f"forward` of {cfg.model} with drafter {cfg.drafter} (K={cfg.num_speculative_tokens}; dummy weights, exact "
           f"shapes as CUDA graphs, KV jitter 0), {len(cases)} cases; LM head timed apart in torch; ngram, alloc, "
           "sample and cpu from the roofline model")
    table = build_table(cfg, cases, read_bench(tgt), read_bench(drf), lm, machine, src, gpu=gpu)
    return table, write_cost_table(table, out, overwrite=overwrite)
