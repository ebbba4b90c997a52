"""The plugin's n-gram (prompt-lookup) match on vLLM's token history: Triton kernels and a torch reference.

The hybrid speculator drafts with an n-gram matcher next to vLLM's DSpark drafter and calibrates its
proposals with features of the match. Both read vLLM's history buffer `req_states.all_token_ids.gpu`
([max_num_reqs, max_model_len] int32) through a batch -> row mapping, as vLLM's own GPU n-gram speculator
does; unlike it, these return the match itself (n, start, length) and the calibrator features.

Semantics: exactly `sim.core.drafters.ngram.ngram_tables` at a context c = token_ids[rows[b], :t] of length
t = ctx_len[b] (a caller may ask for a context shorter than the row, e.g. an earlier output position):

    n*   = the largest n in [n_min, n_max] with an earlier occurrence of the suffix c[t-n:t], an end e with
           n <= e < t and c[e-n:e] == c[t-n:t] (0 = none)
    e*   = the rightmost such end for n*;  start = e* (-1 = none);  length = min(k, t - e*) (0 = none)
    tokens[b, j] = c[e* + j] for j < length, PAD_TOKEN (-1) elsewhere
    ext  = the longest common suffix of c[:t] and c[:e*] (tokens compared backwards from t-1 and e*-1),
           capped at ext_max (may exceed n_max; 0 = none)
    occ  = #{e : n* <= e < t, c[e-n*:e] == c[t-n*:t]}   (e* included; 0 = none)
    in_prompt = e* < prompt_len[b]  (the copied source starts inside the prompt; False = none)

A padded batch entry (rows[b] < 0) and a context too short for any match give no proposal. Everything is
host-sync free (no `.item()`, `.cpu()`, `nonzero`, no branch on tensor values) and output shapes depend
only on input shapes, so both versions can run inside an asynchronous step or a CUDA graph.

Triton version (two kernels; Q = n_max, NQ = n_max - n_min + 1):
  scan, grid (B, ceil(L / BLOCK_L)): for each end e of its block, the matched suffix length
      m[e] = #leading q in 0..Q-1 with e-1-q >= 0, e < t and c[e-1-q] == c[t-1-q]
  (m <= e because a compare at q needs e >= q+1, so no separate cap as in `sim.core.drafters.ngram_torch`), and per n
  in [n_min, n_max] the block's count of ends with m >= n and its rightmost such end -> scratch [B, NB, NQ].
  A block that starts at or past t exits at once and writes nothing (L is vLLM's max_model_len, so without
  the exit every step would scan every request's whole row).
  finalize, grid (B,): sums the counts and takes the max end over the ceil(t / BLOCK_L) live blocks; n* is the largest n with a count,
  occ its count, e* its rightmost end (the sets {m >= n} are nested, so this is the rule above); then the
  chain tokens, ext (blocks of 64 positions backwards with a running "still matching" flag; loads are
  masked off once a mismatch is seen, so the trip count min(ext_max, L) / 64 is data independent) and
  in_prompt. Work O(B * L * Q) compares for the scan, O(B * (L / BLOCK_L * NQ + ext_max + k)) to finalize.
The torch version is `sim.core.drafters.ngram_torch.propose_ngram(features=True)` on the gathered rows (one
definition of the rule for the engine and the plugin); it copies the B rows ([B, L]), fine as a reference.

The module imports without Triton; the kernels are defined on first use (see `_kernels`), so that
TRITON_INTERPRET (read by `triton.jit` when it decorates) takes effect whenever it is set before that.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import torch

from sim.core.drafters.ngram_torch import PAD_TOKEN, propose_ngram
from sim.core.drafters.ngram import NgramConfig
from sim.core.policies.common import arange

try:  # optional: the default (CPU) environment has no Triton
    import triton
    import triton.language as tl
except Exception as _e:  # noqa: BLE001 - any import failure means: no usable Triton here
    triton = tl = None
    _TRITON_WHY = f"{type(_e).__name__}: {_e}"
else:
    _TRITON_WHY = ""

HAS_TRITON = triton is not None

__all__ = ["NgramMatch", "ngram_match", "ngram_match_torch", "ngram_match_triton", "first_token_hits",
           "HAS_TRITON", "PAD_TOKEN"]

Backend = Literal["auto", "torch", "triton"]

_EXT_BLOCK = 64  # positions compared per step of the backwards ext scan
# Largest block of ends per scan program, and of scan blocks per finalize step (module constants so that a
# test can shrink them to exercise several blocks and steps on short histories).
_BLOCK_L_MAX = 256
_NB_BLOCK_MAX = 128


@dataclass
class NgramMatch:
    """n-gram match of a batch of B entries (int64 tensors on the input's device; in_prompt bool).

    tokens [B, k]  token_ids[rows[b], start + j] for j < length, PAD_TOKEN (-1) elsewhere
    start [B]      index of the first proposed token, the matched end e* (-1 = no proposal)
    length [B]     chain length min(k, t - e*), 0..k
    n [B]          matched suffix length (0 = none)
    ext [B]        longest common suffix of c[:t] and c[:e*], capped at ext_max (0 = none)
    occ [B]        earlier ends e (n <= e < t) of the matched n-gram (0 = none): ngram_tables' `occ`
    in_prompt [B]  e* < prompt_len (False = none)
    """

    tokens: torch.Tensor
    start: torch.Tensor
    length: torch.Tensor
    n: torch.Tensor
    ext: torch.Tensor
    occ: torch.Tensor
    in_prompt: torch.Tensor


def _config(n_min: int, n_max: int, k: int, ext_max: int) -> NgramConfig:
    """The settings as an NgramConfig (validated there: 1 <= n_min <= n_max, 1 <= k <= 256, ext_max >= n_max)."""
    return NgramConfig(n_min=int(n_min), n_max=int(n_max), k=int(k), ext_max=int(ext_max))


def _no_match(B: int, k: int, device: torch.device) -> NgramMatch:
    """The result of a batch where nothing can match (shape-only cases: B = 0, no columns, no rows)."""
    def zero() -> torch.Tensor:  # distinct tensors: the Triton path writes its outputs into these
        return torch.zeros(B, dtype=torch.int64, device=device)

    return NgramMatch(tokens=torch.full((B, k), PAD_TOKEN, dtype=torch.int64, device=device),
                      start=torch.full((B,), -1, dtype=torch.int64, device=device), length=zero(), n=zero(),
                      ext=zero(), occ=zero(), in_prompt=torch.zeros(B, dtype=torch.bool, device=device))


def ngram_match_torch(token_ids: torch.Tensor, rows: torch.Tensor, ctx_len: torch.Tensor, prompt_len: torch.Tensor,
                      *, n_min: int, n_max: int, k: int, ext_max: int) -> NgramMatch:
    """The n-gram match of every batch entry in torch (any device; semantics in the module docstring).

    token_ids: integer [R, L] history; rows: integer [B] (rows[b] < 0: padded entry, no proposal);
    ctx_len: integer [B], the context length t to match at (clamped to [0, L]); prompt_len: integer [B].
    """
    cfg = _config(n_min, n_max, k, ext_max)
    dev = token_ids.device
    R, L = token_ids.shape
    B = rows.shape[0]
    if R == 0 or L == 0:  # shape-only: no history to match in
        return _no_match(B, cfg.k, dev)
    rows = rows.to(dev, torch.int64)
    valid = rows >= 0
    hist = token_ids.index_select(0, rows.clamp(min=0))
    t = torch.where(valid, ctx_len.to(dev, torch.int64).clamp(0, L), 0)
    p = propose_ngram(hist, t, cfg, features=True)
    in_prompt = (p.start >= 0) & (p.start < prompt_len.to(dev, torch.int64))
    return NgramMatch(tokens=p.tokens, start=p.start, length=p.length, n=p.n, ext=p.ext, occ=p.occ,
                      in_prompt=in_prompt)


def _interpret_mode() -> bool:
    """Whether `triton.jit` would build interpreter functions now (TRITON_INTERPRET, or knobs set in code)."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:  # triton >= 3.3: env-backed knobs, read on access
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


_KERNELS: dict = {}


def _kernels() -> tuple:
    """(scan, finalize) Triton kernels, defined on first use and cached per interpreter mode.

    `triton.jit` decides at decoration time whether a kernel compiles for the GPU or runs in the interpreter
    (triton 3.x reads TRITON_INTERPRET then), so decorating at import would freeze whatever the environment
    was when the first module imported this one; defining them here follows the mode at the first call
    (and a later switch gets its own pair).

    Reductions are written `tl.reduce(x, axis, tl.standard._elementwise_max)` (resp. `_elementwise_min`,
    `_sum_combine`) instead of tl.max / tl.min / tl.sum: those are themselves `triton.jit` functions,
    decorated when triton is imported, so after an import without TRITON_INTERPRET the interpreter cannot
    call them ("Cannot call @triton.jit'd outside of the scope of a kernel"), while `tl.reduce` is a builtin
    that it patches and that recognises these combine functions (numpy max/min/sum). Compiled, it is exactly
    what tl.max / tl.min / tl.sum lower to for 32- and 64-bit integers (every reduced tensor here is)."""
    mode = _interpret_mode()
    got = _KERNELS.get(mode)
    if got is not None:
        return got

    @triton.jit
    def _ngram_scan_kernel(
        tok_ptr, stride_r, stride_c,  # history [R, L], any integer dtype
        rows_ptr, ctx_ptr,  # int64 [B]
        cnt_ptr, end_ptr,  # int32 [B, NB, NQ] (output)
        L, NB,
        N_MIN: tl.constexpr, N_MAX: tl.constexpr, NQ_PO2: tl.constexpr, BLOCK_L: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        blk = tl.program_id(1).to(tl.int64)
        row = tl.load(rows_ptr + b)
        t = tl.minimum(tl.maximum(tl.load(ctx_ptr + b), 0), L)
        t = tl.where(row >= 0, t, 0)  # a padded entry has an empty context
        base = tok_ptr + tl.maximum(row, 0) * stride_r
        # early exit: a block that starts at or past the sequence length holds no end e < t; it writes nothing
        # (finalize reads only the ceil(t / BLOCK_L) live blocks), so a scan over max_model_len columns costs
        # only the sequence's own blocks
        if blk * BLOCK_L < t:
            e = blk * BLOCK_L + tl.arange(0, BLOCK_L)  # the ends of this block
            match = e < t
            m = tl.full([BLOCK_L], 0, dtype=tl.int32)
            for q in tl.static_range(N_MAX):
                # suffix token c[t-1-q]; when t-1-q < 0 no end reaches this compare (it needs e >= q+1, e < t)
                sp = t - 1 - q
                s = tl.load(base + tl.maximum(sp, 0) * stride_c, mask=sp >= 0, other=0)
                pos = e - 1 - q
                ok = match & (pos >= 0)
                h = tl.load(base + tl.maximum(pos, 0) * stride_c, mask=ok, other=0)
                match = ok & (h == s)
                m += match.to(tl.int32)  # match_{q+1} is inside match_q: m counts the matched suffix length
            nq = tl.arange(0, NQ_PO2)
            ge = m[:, None] >= (N_MIN + nq)[None, :]  # [BLOCK_L, NQ_PO2]: e is an occurrence for n = N_MIN + nq
            cnt = tl.reduce(ge.to(tl.int32), 0, tl.standard._sum_combine)
            last = tl.reduce(tl.where(ge, e.to(tl.int32)[:, None], -1), 0, tl.standard._elementwise_max)
            off = (b * NB + blk) * (N_MAX - N_MIN + 1) + nq
            keep = nq < N_MAX - N_MIN + 1
            tl.store(cnt_ptr + off, cnt, mask=keep)
            tl.store(end_ptr + off, last, mask=keep)

    @triton.jit
    def _ngram_finalize_kernel(
        tok_ptr, stride_r, stride_c,
        rows_ptr, ctx_ptr, plen_ptr,  # int64 [B]
        cnt_ptr, end_ptr,  # int32 [B, NB, NQ]
        tokens_ptr,  # int64 [B, K] (output)
        start_ptr, length_ptr, n_ptr, ext_ptr, occ_ptr,  # int64 [B] (output)
        inp_ptr,  # int8 [B] (output)
        L, NB, EXT_CAP,
        N_MIN: tl.constexpr, N_MAX: tl.constexpr, NQ_PO2: tl.constexpr, NB_BLOCK: tl.constexpr, BLOCK_L: tl.constexpr,
        K: tl.constexpr, K_PO2: tl.constexpr, EXT_BLOCK: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        row = tl.load(rows_ptr + b)
        t = tl.minimum(tl.maximum(tl.load(ctx_ptr + b), 0), L)
        t = tl.where(row >= 0, t, 0)
        base = tok_ptr + tl.maximum(row, 0) * stride_r
        nq = tl.arange(0, NQ_PO2)
        nb = tl.arange(0, NB_BLOCK)
        total = tl.full([NQ_PO2], 0, dtype=tl.int32)
        last = tl.full([NQ_PO2], -1, dtype=tl.int32)
        live = (t + BLOCK_L - 1) // BLOCK_L  # the blocks the scan wrote (those before the sequence length)
        for c0 in range(0, live, NB_BLOCK):
            blk = c0 + nb
            msk = (blk < live)[:, None] & (nq < N_MAX - N_MIN + 1)[None, :]
            off = (b * NB + blk)[:, None] * (N_MAX - N_MIN + 1) + nq[None, :]
            total += tl.reduce(tl.load(cnt_ptr + off, mask=msk, other=0), 0, tl.standard._sum_combine)
            last = tl.maximum(last, tl.reduce(tl.load(end_ptr + off, mask=msk, other=-1), 0,
                                              tl.standard._elementwise_max))
        # sel = 1 + index of the largest n with an occurrence (0: none); occ and e* are that n's
        sel = tl.reduce(tl.where(total > 0, nq + 1, 0), 0, tl.standard._elementwise_max)
        found = sel > 0
        pick = (nq + 1) == sel
        occ = tl.reduce(tl.where(pick, total, 0), 0, tl.standard._sum_combine).to(tl.int64)
        e = tl.reduce(tl.where(pick, last, -1), 0, tl.standard._elementwise_max).to(tl.int64)
        n = tl.where(found, N_MIN - 1 + sel, 0).to(tl.int64)
        length = tl.where(found, tl.minimum(t - e, K), 0)

        j = tl.arange(0, K_PO2)
        jok = j < length
        tok = tl.load(base + (tl.maximum(e, 0) + j) * stride_c, mask=jok, other=0).to(tl.int64)
        tl.store(tokens_ptr + b * K + j, tl.where(jok, tok, -1), mask=j < K)

        # ext: leading q with e-1-q >= 0 and c[t-1-q] == c[e-1-q], in blocks; `still` masks the loads once a
        # block had a mismatch, so only the matching prefix (plus one block) is read
        ext = tl.full([], 0, dtype=tl.int64)
        still = found
        lane = tl.arange(0, EXT_BLOCK)
        for x0 in range(0, EXT_CAP, EXT_BLOCK):
            q = x0 + lane
            pb = e - 1 - q
            ok = still & (q < EXT_CAP) & (pb >= 0)
            ta = tl.load(base + tl.maximum(t - 1 - q, 0) * stride_c, mask=ok, other=0)
            tb = tl.load(base + tl.maximum(pb, 0) * stride_c, mask=ok, other=0)
            same = ok & (ta == tb)
            # first mismatch in the block, or EXT_BLOCK
            run = tl.reduce(tl.where(same, EXT_BLOCK, lane), 0, tl.standard._elementwise_min)
            ext += tl.where(still, run, 0).to(tl.int64)
            still = still & (run == EXT_BLOCK)

        tl.store(start_ptr + b, tl.where(found, e, -1))
        tl.store(length_ptr + b, length.to(tl.int64))
        tl.store(n_ptr + b, n)
        tl.store(ext_ptr + b, ext)
        tl.store(occ_ptr + b, occ)
        tl.store(inp_ptr + b, (found & (e < tl.load(plen_ptr + b))).to(tl.int8))

    got = _KERNELS[mode] = (_ngram_scan_kernel, _ngram_finalize_kernel)
    return got


def _pow2(x: int, lo: int = 1, hi: int | None = None) -> int:
    """The smallest power of two >= x, clamped to [lo, hi] (block sizes: host-side shape arithmetic)."""
    p = 1 << max(int(x) - 1, 0).bit_length()
    p = max(p, lo)
    return p if hi is None else min(p, hi)


def ngram_match_triton(token_ids: torch.Tensor, rows: torch.Tensor, ctx_len: torch.Tensor, prompt_len: torch.Tensor,
                       *, n_min: int, n_max: int, k: int, ext_max: int) -> NgramMatch:
    """`ngram_match_torch` as two Triton kernels (CUDA tensors; CPU tensors under TRITON_INTERPRET=1).

    Same arguments, outputs and invariants; token_ids may be any strided integer tensor (vLLM's int32
    `all_token_ids.gpu` as is). Assumes L < 2**31 (ends are kept as int32 in the scratch).
    """
    if triton is None:
        raise RuntimeError("ngram_match_triton needs Triton, which is not importable here "
                           f"({_TRITON_WHY}); install triton (it comes with vllm and CUDA builds of torch) "
                           "or use ngram_match_torch")
    cfg = _config(n_min, n_max, k, ext_max)
    dev = token_ids.device
    R, L = token_ids.shape
    B = rows.shape[0]
    if B == 0 or R == 0 or L == 0:  # shape-only: nothing to launch
        return _no_match(B, cfg.k, dev)
    scan, finalize = _kernels()
    rows = rows.to(dev, torch.int64).contiguous()
    ctx = ctx_len.to(dev, torch.int64).contiguous()
    plen = prompt_len.to(dev, torch.int64).contiguous()
    NQ = cfg.n_max - cfg.n_min + 1
    BLOCK_L = _pow2(L, lo=min(16, _BLOCK_L_MAX), hi=_BLOCK_L_MAX)
    NB = triton.cdiv(L, BLOCK_L)
    # every (b, block, n) cell is written by the scan: no initialisation needed
    cnt = torch.empty((B, NB, NQ), dtype=torch.int32, device=dev)
    end = torch.empty((B, NB, NQ), dtype=torch.int32, device=dev)
    out = _no_match(B, cfg.k, dev)  # fresh tensors, all overwritten by the finalize kernel
    inp = torch.empty(B, dtype=torch.int8, device=dev)
    s_r, s_c = token_ids.stride()
    NQ_PO2 = _pow2(NQ, lo=2)
    scan[(B, NB)](token_ids, s_r, s_c, rows, ctx, cnt, end, L, NB,
                  N_MIN=cfg.n_min, N_MAX=cfg.n_max, NQ_PO2=NQ_PO2, BLOCK_L=BLOCK_L, num_warps=4)
    # ext never exceeds e* < L, so scanning min(ext_max, L) positions back gives the capped value
    finalize[(B,)](token_ids, s_r, s_c, rows, ctx, plen, cnt, end,
                   out.tokens, out.start, out.length, out.n, out.ext, out.occ, inp,
                   L, NB, min(cfg.ext_max, L),
                   N_MIN=cfg.n_min, N_MAX=cfg.n_max, NQ_PO2=NQ_PO2, BLOCK_L=BLOCK_L,
                   NB_BLOCK=_pow2(NB, lo=min(16, _NB_BLOCK_MAX), hi=_NB_BLOCK_MAX),
                   K=cfg.k, K_PO2=_pow2(cfg.k, lo=2), EXT_BLOCK=_EXT_BLOCK, num_warps=2)
    out.in_prompt = inp.view(torch.bool)
    return out


def _use_triton(token_ids: torch.Tensor, backend: Backend) -> bool:
    if backend == "auto":
        return HAS_TRITON and token_ids.is_cuda
    if backend not in ("torch", "triton"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    return backend == "triton"


def ngram_match(token_ids: torch.Tensor, rows: torch.Tensor, ctx_len: torch.Tensor, prompt_len: torch.Tensor,
                *, n_min: int, n_max: int, k: int, ext_max: int, backend: Backend = "auto") -> NgramMatch:
    """The n-gram match (module docstring): the Triton kernels on CUDA tensors when Triton is importable
    (backend="auto"), the torch version otherwise; backend="torch"/"triton" forces one."""
    fn = ngram_match_triton if _use_triton(token_ids, backend) else ngram_match_torch
    return fn(token_ids, rows, ctx_len, prompt_len, n_min=n_min, n_max=n_max, k=k, ext_max=ext_max)


def first_token_hits(token_ids: torch.Tensor, rows: torch.Tensor, base_ctx: torch.Tensor, count: torch.Tensor,
                     kmax: int, prompt_len: torch.Tensor, *, n_min: int, n_max: int,
                     backend: Backend = "auto") -> torch.Tensor:
    """Whether the n-gram drafter would have predicted each of the next `count` tokens of every entry.

    hit[b, j] (bool [B, kmax]) = j < count[b] and the proposal at context length t = base_ctx[b] + j exists
    and its first token equals token_ids[rows[b], t] (so that token must already be in the history); False
    for j >= count[b], padded entries (rows[b] < 0) and t outside [0, L). At temperature 0 this is
    `ngram_tables(...).acc_len >= 1` at those positions. One `ngram_match` (k = 1, ext_max = n_max: the
    features are not used) over B * kmax virtual entries, so the rule has one definition.
    """
    dev = token_ids.device
    R, L = token_ids.shape
    B = rows.shape[0]
    rows = rows.to(dev, torch.int64)
    j = arange(int(kmax), dev)
    ctx = base_ctx.to(dev, torch.int64).unsqueeze(1) + j  # [B, kmax]: the position to predict = its context
    active = (j < count.to(dev).unsqueeze(1)) & (rows.unsqueeze(1) >= 0) & (ctx >= 0) & (ctx < L)
    vrows = torch.where(active, rows.unsqueeze(1), -1).reshape(-1)
    vctx = ctx.reshape(-1)
    vplen = prompt_len.to(dev, torch.int64).unsqueeze(1).expand(B, int(kmax)).reshape(-1)
    m = ngram_match(token_ids, vrows, vctx, vplen, n_min=n_min, n_max=n_max, k=1, ext_max=n_max, backend=backend)
    if R == 0 or L == 0:  # shape-only: nothing can hit
        return torch.zeros(B, int(kmax), dtype=torch.bool, device=dev)
    target = token_ids[vrows.clamp(min=0), vctx.clamp(0, L - 1)].to(torch.int64)
    hit = (m.length >= 1) & (m.tokens[:, 0] == target)
    return active & hit.view(B, int(kmax))
