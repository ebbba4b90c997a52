"""Timing of the real/engine model on its own (no engine loop): weight load (cold/warm), batch-1 greedy decode
speed, and one forward step at several token counts.

    python -m real.bench_model [--model smollm2-135m-gguf] [--device cpu] [--dtype float32]

Times are wall-clock milliseconds, the median of --repeats runs after a warm-up. On a shared machine they are
noisy: compare runs made at the same time. The cold load uses a fresh temporary cache directory.
--threads sets torch.set_num_threads. On a CPU shared with other busy processes use 1: a 2-thread OpenMP region
waits for its descheduled second thread at every op, which made 64-token forwards ~20x slower (6.9 s vs 0.32 s)
on the 2-core development machine, while a lone batch-1 decode step (ops too small to parallelise) did not care.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from real.engine.weights import SMOLLM2_GGUF_ALIAS, build_model, find_smollm2_gguf, load_gguf
from sim.infra.errors import HybridSpecError


def _ms(fn, repeats: int, sync) -> float:
    fn()
    sync()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=SMOLLM2_GGUF_ALIAS, help="smollm2-135m-gguf, a .gguf path or a models/llms name")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="float32 / bfloat16 (default: fp32 on CPU, bf16 on CUDA)")
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        dtype = getattr(torch, a.dtype) if a.dtype else None
        is_gguf = a.model == SMOLLM2_GGUF_ALIAS or a.model.endswith(".gguf")
        if is_gguf:
            path = find_smollm2_gguf(None if a.model == SMOLLM2_GGUF_ALIAS else a.model)
            with tempfile.TemporaryDirectory() as d:
                old = os.environ.get("HYBRIDSPEC_CACHE_DIR")
                os.environ["HYBRIDSPEC_CACHE_DIR"] = d
                t = time.perf_counter()
                load_gguf(path)
                cold = time.perf_counter() - t
                if old is None:
                    del os.environ["HYBRIDSPEC_CACHE_DIR"]
                else:
                    os.environ["HYBRIDSPEC_CACHE_DIR"] = old
            load_gguf(path)  # make sure the real cache is populated
            t = time.perf_counter()
            load_gguf(path)
            print(f"weights: load_gguf cold {cold:.2f} s (parse + dequantise + write cache), "
                  f"warm {time.perf_counter() - t:.2f} s (from the cache)")
        t = time.perf_counter()
        model, args = build_model(a.model, a.device, dtype, max_slots=8, max_len=a.prompt_len + a.decode_tokens + 512)
        print(f"build_model: {time.perf_counter() - t:.2f} s; {args.name}, {sum(p.numel() for p in model.parameters())/1e6:.1f}M "
              f"params, {next(model.parameters()).dtype}, {a.device}, torch threads {torch.get_num_threads()}")
    except HybridSpecError as e:
        print(f"error: {e}")
        return 2
    dev = next(model.parameters()).device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    L = lambda v: torch.tensor(v, dtype=torch.long, device=dev)  # noqa: E731
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, args.vocab_size, (a.prompt_len,), generator=gen).tolist()

    def greedy() -> tuple[float, float]:
        cur, clen = prompt, 0
        t0 = time.perf_counter()
        for i in range(a.decode_tokens + 1):
            nxt = int(model(L(cur), L([len(cur)]), L([clen]), L([0]), L([len(cur) - 1]))[0].argmax())
            if i == 0:
                t1 = time.perf_counter()
            clen, cur = clen + len(cur), [nxt]
        return t1 - t0, a.decode_tokens / (time.perf_counter() - t1)

    greedy()
    runs = [greedy() for _ in range(3)]
    print(f"greedy batch 1: prefill {a.prompt_len} tokens {statistics.median(r[0] for r in runs)*1e3:.0f} ms, "
          f"decode {statistics.median(r[1] for r in runs):.1f} tok/s (best {max(r[1] for r in runs):.1f}) "
          f"over {a.decode_tokens} tokens")
    for n in (1, 8, 64, 256):
        ms = _ms(lambda: model(L([5] * n), L([n]), L([100]), L([0]), L([n - 1])), a.repeats, sync)
        print(f"forward, one request, {n:3d} new tokens after 100 cached, last-row logits: {ms:8.1f} ms")
    for q in (1, 8):  # a decode step and a verify step of 8 requests (every row's logits, as verification needs)
        ms = _ms(lambda: model(L([5] * 8 * q), L([q] * 8), L([100] * 8), L(list(range(8))), L(list(range(8 * q)))),
                 a.repeats, sync)
        print(f"forward, 8 requests x {q} tokens after 100 cached, all {8 * q} logit rows: {ms:8.1f} ms")
    return 0
