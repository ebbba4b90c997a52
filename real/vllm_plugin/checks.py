"""First-run self-checks of the plugin's device code (real/validate.py --engine vllm runs them first)."""
from __future__ import annotations

import re

import numpy as np
import torch

from real.vllm_plugin.ngram_kernels import ngram_match
from sim.core.drafters.ngram import NgramConfig, ngram_tables


def ngram_selfcheck(device, batches: int = 20, seed: int = 0, cfg: NgramConfig = NgramConfig(k=7)) -> tuple[bool, str]:
    """The n-gram kernels on `device` against the simulator's n-gram drafter (sim.core.drafters.ngram.ngram_tables)
    at every position of random repetitive sequences: (all equal, one line of detail)."""
    rng = np.random.default_rng(seed)
    bad = checked = 0
    for _ in range(batches):
        seqs = []
        for _ in range(int(rng.integers(1, 9))):
            base = rng.integers(0, 12, size=int(rng.integers(4, 60)))
            seqs.append(np.concatenate([base, base[: int(rng.integers(1, len(base) + 1))], rng.integers(0, 12, 8), base]))
        width = max(len(s) for s in seqs) + 1
        hist = np.zeros((len(seqs), width), dtype=np.int32)
        for r, s in enumerate(seqs):
            hist[r, :len(s)] = s
        h = torch.as_tensor(hist, device=device)
        for r, s in enumerate(seqs):
            P = int(rng.integers(1, len(s)))
            tab = ngram_tables(s, P, cfg)
            L = len(tab)
            rows = torch.full((L,), r, dtype=torch.int64, device=device)
            ctx = torch.arange(P, P + L, dtype=torch.int64, device=device)
            m = ngram_match(h, rows, ctx, torch.full((L,), P, dtype=torch.int64, device=device),
                            n_min=cfg.n_min, n_max=cfg.n_max, k=cfg.k, ext_max=cfg.ext_max)
            got = {f: getattr(m, f).cpu().numpy() for f in ("start", "length", "n", "ext", "occ", "in_prompt")}
            want = {"start": tab.start, "length": tab.length, "n": tab.n, "ext": tab.ext, "occ": tab.occ,
                    "in_prompt": tab.in_prompt}
            checked += L
            bad += int(sum((got[f].astype(np.int64) != np.asarray(want[f]).astype(np.int64)).sum() for f in want))
    ok = bad == 0
    return ok, (f"n-gram kernels on {device}: {checked} positions, {'all equal' if ok else f'{bad} fields differ'} "
                "to the simulator's drafter")


def _emulated_inputs(R: int, width: int, steps: int, k: int, seed: int) -> dict:
    """Host-side inputs of an emulated vLLM loop: R slots of repetitive token sequences (prompt + output,
    `width` tokens), and per step the emitted count (1..k+1) and rejected count per slot."""
    rng = np.random.default_rng(seed)
    seqs = np.zeros((R, width), dtype=np.int32)
    plen = np.zeros(R, dtype=np.int64)
    for r in range(R):
        base = rng.integers(0, 50, size=int(rng.integers(16, 128)))
        reps = np.concatenate([base, rng.integers(0, 50, 7)] * (width // (len(base) + 7) + 1))[:width]
        noise = rng.random(width) < 0.1
        seqs[r] = np.where(noise, rng.integers(0, 50, width), reps)
        plen[r] = int(rng.integers(8, max(9, width // 4)))
    ns = rng.integers(1, k + 2, size=(steps, R))
    nr = rng.integers(0, k, size=(steps, R))
    mconf = rng.uniform(0.05, 0.95, size=(steps, R, k)).astype(np.float32)
    mtok = rng.integers(0, 50, size=(steps, R, k))
    return dict(seqs=seqs, plen=plen, ns=ns, nr=nr, mconf=mconf, mtok=mtok)


def emulate(device, R: int = 8, width: int = 512, steps: int = 12, k: int = 7, seed: int = 0,
            sync_check: bool = False) -> dict:
    """Drive `HybridDrafter.observe` / `propose` through `steps` emulated vLLM steps on `device`.

    Every slot starts at its prompt and appends the emitted count of tokens per step (a random 1..k+1),
    as vLLM's post_update does before the drafter runs. Returns the published chains of every step
    (host copies, taken after the loop), and the device time per step [ms] (CUDA events on a GPU, the wall
    clock elsewhere). The tables are set and the step warmed up first, as the plugin does when vLLM's tables
    arrive. sync_check (CUDA): every step runs under torch.cuda.set_sync_debug_mode("error"), so any host
    synchronisation inside observe/propose raises."""
    import time

    from real.vllm_plugin.config import HybridSpecConfig
    from real.vllm_plugin.hybrid import HybridDrafter

    dev = torch.device(device)
    x = _emulated_inputs(R, width, steps, k, seed)
    tok = torch.as_tensor(x["seqs"], device=dev)
    plen = torch.as_tensor(x["plen"], device=dev)
    total_host = x["plen"].copy()
    d = HybridDrafter(HybridSpecConfig(), R, k, dev)
    t = np.arange(R * (k + 1) + 64, dtype=np.float64)
    d.set_cost_tables(np.full(R + 1, 1.5), 10.0 + np.maximum(t - 64, 0) * 0.05)  # as when vLLM's tables arrive
    table = d.table
    idx = torch.arange(R, device=dev)
    per_step = [(torch.as_tensor(x["ns"][s], dtype=torch.int32, device=dev),
                 torch.as_tensor(x["nr"][s], dtype=torch.int32, device=dev),
                 torch.as_tensor(x["mtok"][s], device=dev), torch.as_tensor(x["mconf"][s], device=dev))
                for s in range(steps)]
    totals = []
    for s in range(steps):  # host-side lengths, as vLLM's post_update would have them on the device
        total_host = np.minimum(total_host + x["ns"][s], width)
        totals.append(torch.as_tensor(total_host, dtype=torch.int32, device=dev))
    cuda = dev.type == "cuda"
    d.warm_up(tok, totals[0], plen)  # start-up: the step's device constants and kernels, before any live step
    if cuda:
        torch.cuda.synchronize(dev)
        events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    out, wall = [], []
    try:
        if cuda:
            events[0].record()
        for s in range(steps):
            if cuda and sync_check and s == 0:  # every live step (the warm-up ran at start-up)
                torch.cuda.set_sync_debug_mode("error")
            t0 = time.perf_counter()
            ns, nr, mtok, mconf = per_step[s]
            d.observe(idx, ns, nr, tok, totals[s], plen)
            p = d.propose(idx, ns, mtok, mconf, tok, totals[s], plen, table, 1.5)
            out.append(p)
            if cuda:
                events[s + 1].record()
            wall.append((time.perf_counter() - t0) * 1e3)
    finally:
        if cuda and sync_check:
            torch.cuda.set_sync_debug_mode("default")
    if cuda:
        torch.cuda.synchronize(dev)
        ms = [events[i].elapsed_time(events[i + 1]) for i in range(steps)]
    else:
        ms = wall
    return {"use_ngram": [p.use_ngram.cpu().numpy() for p in out], "conf": [p.conf.cpu().numpy() for p in out],
            "tokens": [p.tokens.cpu().numpy() for p in out], "ms": ms, "host_ms": wall,
            "ngram_share": float(np.mean([p.use_ngram.cpu().numpy().mean() for p in out]))}


def plugin_device_check(device, sizes: tuple[int, ...] = (4, 64, 256), width: int = 4096,
                        steps: int = 12) -> list[str]:
    """What a GPU can show of the plugin without vLLM: the n-gram kernels against the simulator's drafter,
    the whole hybrid step on the device against the same step on the CPU (device-agnostic: same choices,
    tokens and confidences), no host synchronisation (CUDA sync debug mode "error"), and the step's device
    and launch (host) time per batch size. Lines of text; raises nothing for a failed comparison (says FAIL)."""
    lines = []
    ok, detail = ngram_selfcheck(device)
    lines.append(f"{'PASS' if ok else 'FAIL'} {detail}")
    dev = torch.device(device)
    R0 = min(sizes)
    ref = emulate("cpu", R=R0, width=min(width, 1024), steps=steps)
    got = emulate(dev, R=R0, width=min(width, 1024), steps=steps, sync_check=dev.type == "cuda")
    same = all(np.array_equal(a, b) for a, b in zip(ref["use_ngram"], got["use_ngram"])) and \
        all(np.array_equal(a, b) for a, b in zip(ref["tokens"], got["tokens"])) and \
        all(np.allclose(a, b, atol=1e-5) for a, b in zip(ref["conf"], got["conf"]))
    lines.append(f"{'PASS' if same else 'FAIL'} hybrid step on {device} == on cpu ({steps} steps x {R0} requests: "
                 f"choices, tokens, confidences; n-gram chosen in {ref['ngram_share']:.0%} of request-steps)")
    if dev.type == "cuda":
        lines.append(f"PASS no host sync in observe + propose (torch.cuda.set_sync_debug_mode('error'), "
                     f"{steps} steps after the start-up warm-up)")
    for R in sizes:
        r = emulate(dev, R=R, width=width, steps=steps)
        med = float(np.median(r["ms"][2:])) if steps > 3 else float(np.median(r["ms"]))
        host = float(np.median(r["host_ms"][2:])) if steps > 3 else float(np.median(r["host_ms"]))
        lines.append(f"time R={R:4d}, history {width}: {med:.3f} ms per step on the device, {host:.3f} ms to launch "
                     "(observe + propose, median)")
    return lines


# ---------------------------------------------------------------------------------------- step audits (no GPU)
# Ops that launch nothing on a GPU: views and aliases of an existing storage.
_NO_LAUNCH = ("aten::detach", "aten::alias", "aten::lift_fresh")
# The hybrid step's kernel-launching op budget (observe, propose), counted by `count_step_ops` on the torch n-gram
# path (CPU; on CUDA the n-gram match is 2 Triton kernels instead of its torch ops, so the GPU step launches
# fewer). tests/test_vllm_plugin_lifecycle.py fails when a change makes the step launch more than this.
MAX_STEP_OPS = {"observe": 180, "propose": 261}


class _OpCounter:
    """A TorchDispatchMode that counts the aten ops that would launch a kernel (views excluded), and notes every op
    that reads a host tensor and writes a tensor on another device (a host-to-device copy)."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if not func.is_view and func.name() not in _NO_LAUNCH:
                    counter.ops[func.name()] = counter.ops.get(func.name(), 0) + 1
                ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
                outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
                if any(t.device.type == "cpu" and t.dim() > 0 for t in ins) and \
                        any(t.device.type != "cpu" for t in outs):
                    counter.h2d.append(f"{func.name()} {[tuple(t.shape) for t in ins if t.device.type == 'cpu']}")
                return out

        self.mode = Mode()
        self.ops: dict[str, int] = {}
        self.h2d: list[str] = []

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def audit_step(R: int, device="meta", max_reqs: int | None = None, width: int = 512, k: int = 7,
               warm: bool = True, cfg=None) -> dict:
    """One hybrid step (observe + propose) of R live rows on `device` after start-up: the kernel-launching ops of
    each half, and every host-to-device copy in it. On the meta device nothing is computed, every tensor op
    still dispatches, and a host read of a device value (.item(), .cpu()) raises: a host sync fails the audit
    too. warm=False skips the start-up warm-up (then the first step makes the step's device constants itself);
    cfg: the plugin's settings (a HybridSpecConfig; default its defaults)."""
    from real.vllm_plugin.config import HybridSpecConfig
    from real.vllm_plugin.hybrid import HybridDrafter

    dev = torch.device(device)
    S = max(R, max_reqs or R)
    d = HybridDrafter(cfg or HybridSpecConfig(), S, k, dev)
    tok = torch.zeros(S, width, dtype=torch.int32, device=dev)
    total = torch.full((S,), width // 2, dtype=torch.int32, device=dev)
    plen = torch.full((S,), width // 8, dtype=torch.int32, device=dev)
    t = np.arange(S * (k + 1) + 65, dtype=np.float64)
    d.set_cost_tables(np.linspace(1.0, 2.0, S + 1), 10.0 + np.maximum(t - 64, 0) * 0.05)
    if warm:
        d.warm_up(tok, total, plen)
    idx = torch.arange(R, dtype=torch.int32, device=dev)
    ns = torch.full((R,), 2, dtype=torch.int32, device=dev)
    mt = torch.zeros(R, k, dtype=torch.int64, device=dev)
    mc = torch.full((R, k), 0.5, dtype=torch.float32, device=dev)
    with _OpCounter() as obs:
        d.observe(idx, ns, torch.zeros_like(ns), tok, total, plen)
    with _OpCounter() as prop:
        d.propose(idx, ns, mt, mc, tok, total, plen, d.table, d.draft_ms(R))
    return {"observe": obs.total, "propose": prop.total, "h2d": obs.h2d + prop.h2d,
            "ops": {"observe": obs.ops, "propose": prop.ops}}


# A line of inductor's generated wrapper that launches work: a generated kernel (cpp_fused_* on the CPU, triton_* on
# CUDA, called directly or through .run), an extern kernel (mm, ...) or an aten fallback op. Allocations, views
# (reinterpret_tensor, as_strided), size asserts and deletes launch nothing and are not counted.
_LAUNCH = re.compile(r"^\s*(?:\w+\s*=\s*)?((?:cpp_fused|triton)_\w+|extern_kernels\.\w+|torch\.ops\.\w+\.\w+|aten\.\w+)"
                     r"[\w.]*\(", re.M)
_NOT_LAUNCH = ("empty_strided", "as_strided", "reinterpret_tensor", "_reinterpret", "alloc_from_pool")


def wrapper_launches(code: str) -> list[str]:
    """The kernel launches in the `call` functions of inductor's generated wrapper code (see _LAUNCH)."""
    out = []
    for i in [m.start() for m in re.finditer(r"def call\(", code)]:
        body = code[i:]
        end = body.find("\n    return ", 1)
        for m in _LAUNCH.finditer(body[:end if end > 0 else None]):
            name = m.group(1)
            if not any(n in name for n in _NOT_LAUNCH):
                out.append(name)
    return out


def trace_histories(path, R: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Token histories from a recorded trace, for step checks without a tokenizer: the UTF-8 bytes of the first R
    requests' prompt + reference output (int32 [R, width], cut or zero-padded) and the prompt lengths in bytes."""
    import json

    from sim.infra.inputs import REQUEST, iter_lines

    seqs = np.zeros((R, width), dtype=np.int32)
    plen = np.zeros(R, dtype=np.int64)
    # through the input layer: a regular file, each request line capped, only the R lines used are read
    for r, line in enumerate(iter_lines(path, REQUEST, "request file", limit=R)):
        req = json.loads(line)
        p = req["prompt"].encode()
        out = str(req.get("output") or "").encode()
        b = np.frombuffer((p + out)[:width], dtype=np.uint8)
        seqs[r, :len(b)] = b
        plen[r] = min(len(p), width - 1)
    return seqs, plen


def count_compiled_kernels(R: int, k: int = 7, block: int | None = None, width: int = 512, max_reqs: int = 64,
                           steps: int = 3, ran_model: bool = True, seed: int = 0,
                           histories: tuple[np.ndarray, np.ndarray] | None = None, cfg=None) -> dict:
    """Run `steps` hybrid steps (observe + propose) of R live rows on the CPU twice, eager and compiled
    (`HybridDrafter(compiled=True)`), on the same inputs, and count the compiled step's kernel launches: every
    generated kernel, extern kernel and fallback op the compiled graphs' wrapper code calls (`wrapper_launches`),
    per half, and the barrier-separated loop nests inside the generated CPU kernels (`#pragma omp for` / `single`
    regions: what a GPU backend would rather launch as separate kernels). Inputs: random
    repetitive histories (`_emulated_inputs`) or `histories` (seqs [>= max(R, max_reqs), width], prompt lengths);
    the rows advance by each step's emitted count as vLLM's post_update does. Returns the counts and, per step,
    every output and state buffer of both runs (lists of tensors), for an equivalence check. cfg: the plugin's
    settings (a HybridSpecConfig; default its defaults)."""
    from torch._inductor.utils import run_and_get_code

    from real.vllm_plugin.config import HybridSpecConfig
    from real.vllm_plugin.hybrid import HybridDrafter

    block = k if block is None else block
    S = max(R, max_reqs)
    x = _emulated_inputs(S, width, steps, max(k, block), seed)
    if histories is not None:
        x["seqs"], x["plen"] = histories[0][:S, :width], histories[1][:S]
    g = torch.Generator().manual_seed(seed)
    tok = torch.as_tensor(x["seqs"])
    plen = torch.as_tensor(x["plen"], dtype=torch.int32)
    idx = torch.randperm(S, generator=g)[:R].to(torch.int32)
    t = np.arange(S * (k + 1) + 65, dtype=np.float64)
    runs, code = {}, {"observe": [], "propose": []}
    for compiled in (False, True):
        d = HybridDrafter(cfg or HybridSpecConfig(), S, k, "cpu", block=block, compiled=compiled)
        d.set_cost_tables(np.linspace(1.0, 2.0, S + 1), 10.0 + np.maximum(t - 64, 0) * 0.05)
        total = torch.as_tensor(x["plen"], dtype=torch.int64)
        outs = []
        for s in range(steps):
            ns = torch.as_tensor(x["ns"][s][:R], dtype=torch.int32).clamp(max=k + 1)
            nr = torch.as_tensor(x["nr"][s][:R], dtype=torch.int32).clamp(max=k)
            total = total.clone()
            total[idx.long()] = (total[idx.long()] + ns.long()).clamp(max=width)
            tl32 = total.to(torch.int32)
            mt = torch.as_tensor(x["mtok"][s][:R, :block], dtype=torch.int64)
            mc = torch.as_tensor(x["mconf"][s][:R, :block])
            first = compiled and s == 0
            run = run_and_get_code if first else (lambda f, *a: (f(*a), []))
            obs, c_obs = run(d.observe, idx, ns, nr, tok, tl32, plen)
            prop, c_prop = run(d.propose, idx, ns, mt, mc, tok, tl32, plen, d.table, d.draft_ms(R), ran_model)
            code["observe"] += c_obs
            code["propose"] += c_prop
            outs.append([*obs, prop.tokens, prop.conf, prop.use_ngram, prop.ngram_len, d.ring.clone(),
                         d.hits.clone(), d.pos.clone(), d.reached.clone(), d.accepted.clone(), d.predicted.clone(),
                         d.last_conf.clone(), d.last_ngram.clone(), d.chosen.clone()]
                        + ([d.rc_b.clone(), d.rc_P.clone()] if d.runcal else []))
        runs[compiled] = outs
    launches = {half: [n for c in codes for n in wrapper_launches(c)] for half, codes in code.items()}
    nests = {half: sum(len(re.findall(r"#pragma omp (?:for|single)", c)) for c in codes)
             for half, codes in code.items()}
    return {"observe": len(launches["observe"]), "propose": len(launches["propose"]), "launches": launches,
            "loop_nests": nests, "eager": runs[False], "compiled": runs[True]}
