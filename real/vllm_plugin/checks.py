"""First-run self-checks of the plugin's device code (real/validate.py --engine vllm runs them first)."""
from __future__ import annotations

import numpy as np
import torch

from real.vllm_plugin.ngram_kernels import ngram_match
from sim.drafters.ngram import NgramConfig, ngram_tables


def ngram_selfcheck(device, batches: int = 20, seed: int = 0, cfg: NgramConfig = NgramConfig(k=7)) -> tuple[bool, str]:
    """The n-gram kernels on `device` against the simulator's n-gram drafter (sim.drafters.ngram.ngram_tables)
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
