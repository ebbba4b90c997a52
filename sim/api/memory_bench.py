"""Memory benchmark: seeded large traces, and the peak RSS of `python -m sim.run` over them (docs/memory.md).

    python -m sim.memory_bench gen-burst --requests 1000000 -o out/mem/burst-1m.jsonl
    python -m sim.memory_bench gen-text  --requests 20000 --prompt 1000 --output 2000 -o out/mem/text-20k.jsonl
    python -m sim.memory_bench run out/mem/burst-1m.jsonl [--batch-size 256] [--policy hybrid-price] [sim.api.run flags]

gen-burst: a length-only trace shaped like BurstGPT's conversation logs (Wang et al. 2024: request lengths
Zipf-like, responses of a few hundred tokens, Gamma-distributed inter-arrival times). Lengths are lognormal,
clipped to [1, MAX_LEN]: request tokens mean ~ 600 (median 300), response tokens mean ~ 280 (median 180);
inter-arrival times Gamma(shape 0.5: bursty) at `--rate` requests/s (default 40, below what batch 256
serves on the default model and GPU, so the queue stays short as in a served trace). Workload: chat.
gen-text: a token trace (`prompt_ids`/`output_ids`, seeded uniform ids in [10, 50000)) with fixed lengths; its
output repeats short spans of its prompt now and then so that the n-gram drafter finds matches.
run: `/usr/bin/time -v python -m sim.run TRACE --policy P --batch-size B --no-progress --format csv`, then
prints wall time, peak RSS (GB), simulated output tokens per wall second and the load average (`uptime`).
Every generator is seeded (--seed): the same flags write the same bytes.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from sim.infra.cli import SEED
from sim.infra.errors import ConfigError
from sim.infra.fsio import own_path

MAX_LEN = 16384  # tokens: the longest request or response kept (BurstGPT's longest responses are ~12.5k)


def _lognormal_lengths(rng: np.random.Generator, n: int, median: float, sigma: float) -> np.ndarray:
    """n lognormal lengths with the given median (mean = median * exp(sigma^2 / 2)), clipped to [1, MAX_LEN]."""
    return np.clip(np.rint(rng.lognormal(np.log(median), sigma, n)), 1, MAX_LEN).astype(np.int64)


def gen_burst(n: int, out: Path, seed: int, rate: float) -> None:
    """Write the length-only BurstGPT-like trace (module docstring)."""
    rng = np.random.default_rng(seed)
    prompt = _lognormal_lengths(rng, n, 300.0, 1.18)   # mean ~ 300 * e^(0.70) ~ 600
    output = _lognormal_lengths(rng, n, 180.0, 0.94)   # mean ~ 180 * e^(0.44) ~ 280
    shape = 0.5  # Gamma shape < 1: burstier than Poisson (coefficient of variation 1/sqrt(shape))
    gaps = rng.gamma(shape, 1.0 / (shape * rate), n)
    arrival = np.cumsum(gaps) - gaps[0]
    with _writer(out) as f:
        for i in range(n):
            f.write(f'{{"id": "b{i}", "prompt_len": {prompt[i]}, "output_len": {output[i]}, '
                    f'"arrival_s": {arrival[i]:.6f}, "workload": "chat"}}\n')


def gen_text(n: int, out: Path, seed: int, prompt_len: int, output_len: int) -> None:
    """Write the token trace (module docstring)."""
    rng = np.random.default_rng(seed)
    with _writer(out) as f:
        for i in range(n):
            p = rng.integers(10, 50000, prompt_len)
            o = rng.integers(10, 50000, output_len)
            for s in range(0, output_len - 16, 64):  # copy 16 tokens of the prompt every 64: n-gram matches
                a = int(rng.integers(0, prompt_len - 16))
                o[s:s + 16] = p[a:a + 16]
            f.write(json.dumps({"id": f"t{i}", "prompt_ids": p.tolist(), "output_ids": o.tolist()}) + "\n")


class _writer:
    """A file written whole or not at all (a temporary sibling renamed into place); refuses to overwrite."""

    def __init__(self, path: Path):
        from sim.infra.cli import check_out_file

        check_out_file(path, False, "-o", hint="remove it or choose another -o")  # and claimed against a second writer
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.tmp = path, own_path(path, "tmp")

    def __enter__(self):
        self.f = open(self.tmp, "w")
        return self.f

    def __exit__(self, typ, exc, tb):
        self.f.close()
        if typ is None:
            os.replace(self.tmp, self.path)
        else:
            self.tmp.unlink(missing_ok=True)
        return False


def measure(trace: str, policy: str, batch: int, extra: list[str]) -> dict:
    """Run sim.api.run under /usr/bin/time -v; its wall time, peak RSS and throughput, and the load average."""
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "sim.run", "--trace", trace, "--policy", policy,
           "--batch-size", str(batch), "--no-progress", "--format", "csv", "--workers", "1", *extra]
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise ConfigError(f"sim.api.run failed (exit {p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1))
    import csv
    import io

    rows = [r for r in csv.DictReader(io.StringIO(p.stdout)) if r.get("policy") == policy]
    row = rows[0] if rows else {}
    return {"trace": trace, "policy": policy, "batch_size": batch, "wall_s": round(wall, 1),
            "peak_rss_gb": round(rss_kb / 1e6, 3), "requests": row.get("requests"),
            "output_tokens": row.get("output_tokens"), "engine_wall_s": row.get("wall_s"),
            "sim_tok_per_wall_s": row.get("sim_tok_per_wall_s"),
            "load_before": [round(x, 2) for x in load0], "load_after": [round(x, 2) for x in os.getloadavg()]}


def main(argv: list[str] | None = None) -> int:
    from sim.infra.cli import ArgumentParser

    ap = ArgumentParser(prog="python -m sim.memory_bench", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen-burst", help="length-only BurstGPT-like trace")
    g.add_argument("--requests", type=int, default=1_000_000)
    g.add_argument("--rate", type=float, default=40.0, help="mean arrivals per second")
    g.add_argument("--seed", type=SEED, default=0)
    g.add_argument("-o", "--out", type=Path, required=True)
    t = sub.add_parser("gen-text", help="token trace with fixed prompt and output lengths")
    t.add_argument("--requests", type=int, default=20_000)
    t.add_argument("--prompt", type=int, default=1000)
    t.add_argument("--output", type=int, default=2000)
    t.add_argument("--seed", type=SEED, default=0)
    t.add_argument("-o", "--out", type=Path, required=True)
    r = sub.add_parser("run", help="peak RSS of one sim.api.run")
    r.add_argument("trace")
    r.add_argument("--policy", default="hybrid-price")
    r.add_argument("--batch-size", type=int, default=256)
    a, extra = ap.parse_known_args(argv)  # what is left goes to sim.api.run (run only)
    extra = [x for x in extra if x != "--"]
    if extra and a.cmd != "run":
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    for k in ("requests", "prompt", "output", "batch_size"):
        if getattr(a, k, 1) < 1:
            raise ConfigError(f"--{k.replace('_', '-')} must be >= 1, got {getattr(a, k)}")
    if a.cmd == "gen-burst":
        if not a.rate > 0:
            raise ConfigError(f"--rate must be > 0, got {a.rate}")
        gen_burst(a.requests, a.out, a.seed, a.rate)
    elif a.cmd == "gen-text":
        if a.prompt < 17:
            raise ConfigError(f"--prompt must be >= 17 tokens (the copied spans are 16), got {a.prompt}")
        gen_text(a.requests, a.out, a.seed, a.prompt, a.output)
    else:
        print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
        print(json.dumps(measure(a.trace, a.policy, a.batch_size, extra)))
        print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    return 0
