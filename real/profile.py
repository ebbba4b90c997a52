"""Measure the real engine's step costs on the machine at hand and write a profiled cost table
(sim/cost/profiled.py format) that the simulator loads with `--cost profiled --gpu PATH`.

    python -m real.profile [--model smollm2-135m] [--random-weights] [--device cpu|cuda] [--out FILE]
                           [--policy P ...] [--batch-size B ...] [--quick]

Two kinds of measurement, each a median over repeats:
  verify   the target forward alone, on decode-shaped batches (R requests x q tokens, T = R q tokens,
           every row's logits), at a short context, for T on a grid; then
             logits_ms_per_row = (ms(T0, all rows) - ms(T0, one row)) / (T0 - 1)   at T0 = 64,
             f_verify(T)       = ms(T, all rows) - logits_ms_per_row * T            (the body),
             kv_ms_per_token   = slope of ms over the KV tokens read, at T = 8 requests x 1 token;
  the rest the engine's own per-step split (draft, ngram, alloc, sample, cpu) from short real-engine runs
           of each policy on a slice of traces/general.jsonl (the tuning trace; never an evaluated one):
             ngram(R), draft(R), alloc[policy](R): medians of the steps with R decoding requests;
             sample: ms per logit row (least squares through the origin) on a grid of rows;
             cpu(R, T) = a + b R + c T: least squares over all steps.
It prints the roofline model's predictions beside the measured verify times (same grid) when the model
and device have a roofline spec (a GPU), and records the machine (device, cpu, torch, dtype, threads,
model) so that a table from elsewhere is refused (sim.cost.profiled.check_machine).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from sim.cli_util import run_cli
from sim.cost.profiled import CostTable, write_cost_table
from sim.errors import ConfigError

VERIFY_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
QUICK_GRID = (1, 4, 16, 64, 128)


def machine_info(device: torch.device, dtype: torch.dtype, model: str) -> dict:
    """Identity of this machine for check_machine: device, cpu, torch, dtype, threads, model."""
    if device.type == "cuda":
        dev = torch.cuda.get_device_name(device)
    else:
        dev = "cpu"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"device": dev, "cpu": cpu, "torch": torch.__version__.split("+")[0], "dtype": str(dtype).replace("torch.", ""),
            "threads": torch.get_num_threads(), "model": model, "cores": os.cpu_count()}


def _median_ms(fn, repeat: int, device: torch.device) -> float:
    fn()  # warm-up
    ts = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(ts)


def _decode_batch(T: int, context: int, max_slots: int, device):
    """A decode-shaped step: R = min(T, max_slots) requests, q = T / R tokens each (the rest on the first),
    each with `context` tokens cached."""
    R = min(T, max_slots)
    q = [T // R] * R
    q[0] += T - sum(q)
    lt = lambda x: torch.tensor(x, dtype=torch.int64, device=device)  # noqa: E731
    return lt(q), lt([context] * R), lt(list(range(R)))


@torch.inference_mode()
def profile_verify(model, grid=VERIFY_GRID, context: int = 128, repeat: int = 5) -> dict:
    """The verify part of the table (module docstring): f_verify(T) body ms, logits_ms_per_row, kv_ms_per_token."""
    dev = next(model.parameters()).device
    V = model.args.vocab_size
    g = torch.Generator().manual_seed(0)

    def run(T, ctx, rows):
        q, c, s = _decode_batch(T, ctx, model.max_slots, dev)
        toks = torch.randint(0, V, (T,), generator=g).to(dev)
        idx = torch.arange(rows, device=dev)
        return lambda: model(toks, q, c, s, idx)

    T0 = 64
    full = _median_ms(run(T0, context, T0), repeat, dev)
    one = _median_ms(run(T0, context, 1), repeat, dev)
    per_row = max(0.0, (full - one) / (T0 - 1))
    xs, ys = [], []
    for T in grid:
        if T > model.max_slots * 32:
            continue
        ms = _median_ms(run(T, context, T), repeat, dev)
        xs.append(T)
        ys.append(max(1e-6, ms - per_row * T))
    lo_ctx, hi_ctx = context, min(model.max_len - 16, 8 * context)
    R = min(8, model.max_slots)
    lo = _median_ms(run(R, lo_ctx, R), repeat, dev)
    hi = _median_ms(run(R, hi_ctx, R), repeat, dev)
    kv = max(0.0, (hi - lo) / (R * (hi_ctx - lo_ctx)))
    return {"num_tokens": xs, "ms": ys, "logits_ms_per_row": per_row, "kv_ms_per_token": kv, "context": context}


def fit_step_parts(steps: list[dict], policies: list[str]) -> dict:
    """Tables of the engine's non-verify parts from recorded steps (module docstring). `steps`: one dict
    per run with 'policy' and the steps.csv columns as arrays (num_decode, draft_ms, ngram_ms, alloc_ms,
    sample_ms, cpu_ms, logit_rows, tokens)."""
    def by_r(part: str, runs: list[dict]) -> dict | None:
        R = np.concatenate([r["num_decode"] for r in runs])
        v = np.concatenate([r[part] for r in runs])
        keep = (R > 0) & (v > 0)
        if not keep.any():
            return None
        xs = sorted(set(R[keep].tolist()))
        return {"num_reqs": [int(x) for x in xs], "ms": [float(np.median(v[keep & (R == x)])) for x in xs]}

    out: dict = {}
    out["draft"] = by_r("draft_ms", steps)
    out["ngram"] = by_r("ngram_ms", steps)
    out["alloc"] = {}
    for p in policies:
        t = by_r("alloc_ms", [s for s in steps if s["policy"] == p])
        if t:
            out["alloc"][p] = t
    # sample: medians by logit rows, in power-of-two buckets (argmax over rows x vocab, plus its copy)
    rows = np.concatenate([s["logit_rows"] for s in steps]).astype(np.int64)
    smp = np.concatenate([s["sample_ms"] for s in steps])
    keep = rows > 0
    bucket = 2 ** np.ceil(np.log2(np.maximum(rows, 1))).astype(np.int64)
    xs = sorted(set(bucket[keep].tolist()))
    out["sample"] = {"num_tokens": [int(x) for x in xs],
                     "ms": [max(float(np.median(smp[keep & (bucket == x)])), 1e-6) for x in xs]} if xs else None
    # cpu: a robust (soft-L1) linear fit, since a few steps carry the machine's hiccups
    from scipy.optimize import least_squares

    R = np.concatenate([s["num_decode"] for s in steps]).astype(np.float64)
    Tt = np.concatenate([s["tokens"] for s in steps]).astype(np.float64)
    cpu = np.concatenate([s["cpu_ms"] for s in steps])
    A = np.stack([np.ones_like(R), R, Tt], axis=1)
    x0 = np.maximum(np.linalg.lstsq(A, cpu, rcond=None)[0], 0.0)
    fit = least_squares(lambda w: A @ w - cpu, x0, loss="soft_l1", f_scale=max(0.1 * float(np.median(cpu)), 1e-3),
                        bounds=(0.0, np.inf))
    coef = fit.x
    out["cpu"] = {"base_ms": float(coef[0]), "per_req_ms": float(coef[1]), "per_token_ms": float(coef[2])}
    return out


def build_table(model_name: str, verify: dict, parts: dict, machine: dict, kv_capacity: int, vocab: int,
                source: str) -> CostTable:
    """The profiled table: verify from the microbenchmarks, the rest from the engine's own steps."""
    from sim.cost.profiled import load_cost_table
    import json
    import tempfile

    obj = {"format": "hybridspec-cost-table/1", "llm": model_name, "gpu": machine["device"], "source": source,
           "derived": False, "capture_sizes": [],
           "verify": {"num_tokens": verify["num_tokens"], "ms": verify["ms"]},
           "logits_ms_per_row": verify["logits_ms_per_row"], "kv_ms_per_token": verify["kv_ms_per_token"],
           "machine": machine, "kv_capacity_tokens": int(kv_capacity), "vocab_size": int(vocab)}
    for k in ("draft", "ngram", "sample", "cpu"):
        if parts.get(k):
            obj[k] = dict(parts[k], block=7) if k == "draft" else parts[k]
    if parts.get("alloc"):
        obj["alloc"] = parts["alloc"]
    if "draft" not in obj:
        obj["draft"] = {"block": 7, "num_reqs": [1], "ms": [1e-6]}
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.json"
        p.write_text(json.dumps(obj))
        return load_cost_table(p)


def profile(model_name: str, random_weights: bool, device: str, policies: list[str], batch_sizes: list[int],
            quick: bool, out: Path | None, overwrite: bool = False, progress: bool = True) -> tuple[CostTable, Path | None]:
    """Measure and (if `out`) write the table; returns it. See the module docstring."""
    from real.workload import Workload, build_engine_model, run_real

    wl = Workload.build("traces/general.jsonl", model_name, random_weights, device, limit=None,
                        sample=6 if quick else 12, seed=0, max_tokens=24 if quick else 48, max_prompt=256,
                        progress=progress)
    model = build_engine_model(wl, max(batch_sizes))
    grid = QUICK_GRID if quick else VERIFY_GRID
    verify = profile_verify(model, grid=grid, repeat=3 if quick else 7)
    steps = []
    for pol in policies:
        for bs in batch_sizes:
            res = run_real(wl, model, pol, bs, cost=None, progress=False)
            st = dict(res.steps)
            st["policy"] = pol
            st["logit_rows"] = res.steps["logit_rows"]
            st["tokens"] = res.steps["tokens"]
            steps.append(st)
    parts = fit_step_parts(steps, policies)
    machine = machine_info(wl.device, wl.dtype, wl.model_label)
    src = (f"real/profile.py on {machine['cpu']} ({machine['device']}, {machine['threads']} threads, torch "
           f"{machine['torch']}); verify microbenchmarks, other parts from engine runs of {', '.join(policies)} "
           f"at batch {', '.join(map(str, batch_sizes))} on traces/general.jsonl")
    table = build_table(wl.model_label, verify, parts, machine, kv_capacity=10**9, vocab=model.args.vocab_size, source=src)
    path = write_cost_table(table, out, overwrite=overwrite) if out is not None else None
    return table, path


def format_verify(table: CostTable, roofline=None) -> str:
    lines = ["tokens  measured_ms" + ("  roofline_ms" if roofline is not None else "")]
    for x, y in zip(table.verify_tokens, table.verify_ms):
        ms = y + (table.logits_ms_per_row or 0.0) * x
        extra = f"  {float(roofline.verify_ms(int(x), 128 * min(int(x), 8), min(int(x), 8))):11.3f}" if roofline is not None else ""
        lines.append(f"{int(x):6d}  {ms:11.3f}{extra}")
    return "\n".join(lines)


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m real.profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="models/llms name (real weights: smollm2-135m only)")
    ap.add_argument("--random-weights", action="store_true", help="random weights, teacher-forced (any models/llms name)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--policy", action="append", help="policies whose allocation cost to profile (repeatable)")
    ap.add_argument("--batch-size", action="append", type=int, help="batch sizes of the engine runs (repeatable)")
    ap.add_argument("--quick", action="store_true", help="fewer points and repeats (tests)")
    ap.add_argument("--out", default=None, help="table file to write (JSON); refuses to overwrite without --force")
    ap.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    pols = a.policy or ["none", "adaptive", "hybrid-price", "ngram-fixed:32"]
    bss = a.batch_size or [1, 4, 16]
    if any(b < 1 for b in bss):
        raise ConfigError(f"--batch-size must be >= 1, got {min(bss)}")
    table, path = profile(a.model, a.random_weights, a.device, pols, bss, a.quick,
                          Path(a.out) if a.out else None, overwrite=a.force)
    roof = None
    try:
        from sim.cost import make_cost_model
        if a.device == "cuda":
            roof = make_cost_model("roofline", llm=a.model, gpu=_gpu_name(table.machine.get("device", "")))
    except Exception:  # noqa: BLE001 -- no roofline spec for this device: print the measurements alone
        roof = None
    print(format_verify(table, roof))
    print(f"logits_ms_per_row {table.logits_ms_per_row:.4f}  kv_ms_per_token {table.kv_ms_per_token:.2e}")
    if path:
        print(f"wrote {path}")
    return 0


def _gpu_name(device_name: str) -> str:
    n = device_name.lower()
    return "h200" if "h200" in n else "a100-80g" if "a100" in n else "h100-sxm"


if __name__ == "__main__":
    sys.exit(run_cli(main))
