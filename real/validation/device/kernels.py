"""(a) The plugin's n-gram match (real/vllm_plugin/ngram_kernels.py: the compiled Triton kernels on a CUDA device with
Triton, its torch version elsewhere) against the simulator's n-gram lookup, on every history kind of state.py.

Per kind and width (a short one, and the long history of the timing check: many scan blocks and finalize steps),
--positions context lengths t per row (the row's last, its prompt boundary, the first ones, the rest drawn at
random, all within the row), one padded entry (row -1: no proposal) and, every other time, the history passed as a
column slice of a wider buffer (row stride != width, as vLLM's buffer is). Compared field by field:
  ngram_tables   sim/core/drafters/ngram.py at every position of each row (the simulator's offline tables):
                 start, length, n, ext, occ, in_prompt, the chain tokens c[start + j], and first_token_hits
                 (the plugin's copy history) against acc_len >= 1;
  propose_ngram  sim/core/drafters/ngram_torch.py on the CPU (through ngram_match_torch, which gathers the rows and
                 adds in_prompt): every field of the match. On a CPU run that is the code the plugin runs itself,
                 so it is compared only on a device.
Passes when no field of any entry differs.
"""
from __future__ import annotations

import numpy as np
import torch

from real.vllm_plugin.config import HybridSpecConfig
from real.vllm_plugin.ngram_kernels import HAS_TRITON, NgramMatch, first_token_hits, ngram_match, ngram_match_torch
from real.validation.device.runner import Context, Outcome, register
from real.validation.device.state import HISTORY_KINDS, Histories, histories
from sim.core.drafters.ngram import ngram_tables

FIELDS = ("start", "length", "n", "ext", "occ", "in_prompt", "tokens")
CPU_CHUNK = 64  # entries per call of the CPU reference (it copies a [entries, width] history)


def backend(ctx: Context) -> str:
    """What the plugin runs on this device: the Triton kernels on CUDA with Triton, else the torch version."""
    return "triton" if ctx.cuda and HAS_TRITON else "torch"


def _entries(h: Histories, positions: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, context lengths, prompt lengths) of the compared entries, and a padded entry at the end."""
    rows, ctx = [], []
    for r, (t, p) in enumerate(zip(h.lens, h.plen)):
        must = {int(t) - 1, int(p), min(int(p) + 1, int(t) - 1), min(int(p) + 2, int(t) - 1)}
        pick = rng.choice(np.arange(p, t), size=min(positions, int(t - p)), replace=False)
        cs = sorted(must | {int(c) for c in pick[: max(positions - len(must), 0)]})
        rows += [r] * len(cs)
        ctx += cs
    rows.append(-1)
    ctx.append(int(h.lens[0]))
    return np.asarray(rows), np.asarray(ctx), np.concatenate([h.plen[rows[:-1]], [0]])


def _want_tables(h: Histories, rows: np.ndarray, ctx: np.ndarray, k: int, cfg) -> dict[str, np.ndarray]:
    """The simulator's tables at the entries (a padded entry: no proposal), and the hit of each."""
    n = len(rows)
    want = {f: np.zeros(n, dtype=np.int64) for f in FIELDS if f != "tokens"}
    want["start"][:] = -1
    want["tokens"] = np.full((n, k), -1, dtype=np.int64)
    want["hit"] = np.zeros(n, dtype=bool)
    for r in np.unique(rows[rows >= 0]):
        seq = h.tokens[r, : h.lens[r]].astype(np.int64)
        P = int(h.plen[r])
        tab = ngram_tables(seq, P, cfg)
        at = np.nonzero(rows == r)[0]
        i = ctx[at] - P  # output position of each entry in the row's tables
        for f in ("start", "length", "n", "ext", "occ", "in_prompt"):
            want[f][at] = np.asarray(getattr(tab, f))[i].astype(np.int64)
        want["hit"][at] = tab.acc_len[i] >= 1
        j = np.arange(k)
        src = np.clip(want["start"][at][:, None] + j, 0, len(seq) - 1)
        want["tokens"][at] = np.where(j < want["length"][at][:, None], seq[src], -1)
    return want


def _host(m: NgramMatch) -> dict[str, np.ndarray]:
    return {f: getattr(m, f).cpu().numpy().astype(np.int64) for f in FIELDS}


def _cpu_reference(tok: torch.Tensor, rows, ctx, plen, cfg) -> dict[str, np.ndarray]:
    """ngram_match_torch on the CPU, in chunks of entries (each gathers its rows' whole history)."""
    parts = []
    for a in range(0, len(rows), CPU_CHUNK):
        sl = slice(a, a + CPU_CHUNK)
        parts.append(_host(ngram_match_torch(tok, torch.as_tensor(rows[sl]), torch.as_tensor(ctx[sl]),
                                             torch.as_tensor(plen[sl]), n_min=cfg.n_min, n_max=cfg.n_max, k=cfg.k,
                                             ext_max=cfg.ext_max)))
    return {f: np.concatenate([p[f] for p in parts]) for f in FIELDS}


def _first_difference(label: str, got: dict, want: dict, rows, ctx) -> tuple[int, str | None]:
    """(differing fields over all entries, a line naming the first one)."""
    bad, first = 0, None
    for f, w in want.items():
        g = got[f]
        ne = (g != w).reshape(len(rows), -1).any(1)
        bad += int(ne.sum())
        if ne.any() and first is None:
            b = int(np.nonzero(ne)[0][0])
            first = (f"{label}: {f} at row {rows[b]}, context {ctx[b]}: kernel {g[b].tolist()}, "
                     f"reference {w[b].tolist()}")
    return bad, first


@register("a", "kernels", "the plugin's n-gram kernels == the simulator's n-gram lookup", cap_s=60, quick_cap_s=30)
def check_kernels(ctx: Context) -> Outcome:
    o = ctx.opts
    cfg = HybridSpecConfig().ngram(o.slots)  # the plugin's n-gram settings at W slots
    how = backend(ctx)
    rng = np.random.default_rng(o.seed)
    widths = sorted({min(2048, max(o.history // 4, 64)), o.history})
    rows_out, bad, first, left_out = [], 0, None, []
    ctx.partial.update(backend=how, histories=rows_out)  # what a timed-out run keeps
    for width in widths:
        for kind in HISTORY_KINDS:
            if ctx.left() < 5:
                left_out.append(f"{kind}@{width}")
                continue
            h = histories(kind, 2 if width > 4096 else 4, width, o.seed)
            rows, cl, pl = _entries(h, o.positions, rng)
            strided = bool(rng.random() < 0.5)
            buf = np.concatenate([h.tokens, np.zeros((len(h.tokens), 17), np.int32)], 1) if strided else h.tokens
            tok = torch.as_tensor(buf)[:, :width]
            dev_tok = torch.as_tensor(buf).to(ctx.device)[:, :width]
            r_d, c_d, p_d = (torch.as_tensor(x).to(ctx.device) for x in (rows, cl, pl))
            m = ngram_match(dev_tok, r_d, c_d, p_d, n_min=cfg.n_min, n_max=cfg.n_max, k=cfg.k, ext_max=cfg.ext_max,
                            backend=how)
            hit = first_token_hits(dev_tok, r_d, c_d, torch.ones_like(r_d), 1, p_d, n_min=cfg.n_min,
                                   n_max=cfg.n_max, backend=how)
            got = dict(_host(m), hit=hit[:, 0].cpu().numpy())
            want = _want_tables(h, rows, cl, cfg.k, cfg)
            n_bad, line = _first_difference(f"{kind} history, width {width}, vs ngram_tables", got, want, rows, cl)
            row = {"kind": kind, "width": width, "strided": strided, "entries": len(rows),
                   "matched": int((want["length"] > 0).sum()), "vs_ngram_tables": n_bad}
            if ctx.cuda:
                ref = _cpu_reference(tok, rows, cl, pl, cfg)
                n_ref, line_ref = _first_difference(f"{kind} history, width {width}, vs propose_ngram (cpu)",
                                                    {f: got[f] for f in FIELDS}, ref, rows, cl)
                row["vs_propose_ngram_cpu"] = n_ref
                n_bad, line = n_bad + n_ref, line or line_ref
            bad += n_bad
            first = first or line
            rows_out.append(row)
    figures = {"backend": how, "ngram": {"n_min": cfg.n_min, "n_max": cfg.n_max, "k": cfg.k, "ext_max": cfg.ext_max},
               "histories": rows_out, "differing_entries": bad}
    if first:
        figures["first_difference"] = first
    if left_out:
        figures["left_out"] = left_out
    checked = sum(r["entries"] for r in rows_out)
    refs = "the simulator's ngram_tables" + (" and propose_ngram on the CPU" if ctx.cuda else "")
    if bad:
        return Outcome("fail", f"{bad} differing entries among {checked} ({how}); first: {first}", figures)
    if not rows_out:
        return Outcome("skip", "no history compared before the cap", figures)
    more = f"; cap reached, left out {', '.join(left_out)}" if left_out else ""
    return Outcome("pass", f"{checked} entries over {len(rows_out)} histories equal to {refs} ({how}){more}", figures)
