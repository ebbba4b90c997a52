"""Faster forms of policies for the simulator only: numpy transcriptions of the torch definitions.

The torch functions (hybrid.py, adaptive.py, ...) stay the one definition: the real engines and the vLLM
plugin run them, and tests/test_policy_fast_forms.py checks every fast form here against its definition,
allocation for allocation, on thousands of random batches and on batches recorded from engine runs of the
bundled traces (exact equality). The simulator calls a policy thousands of times per second on tiny
tensors, where each torch op's dispatch (2-4 us) dominates; numpy's elementwise ops cost a fraction of it.

Bit-exactness rules of the transcription (why it equals the torch definition, not merely approximates it):
  * cumprod / cumsum: torch's CPU kernels accumulate float32 in float64 and round each output, so here
    they run in float64 and are cast back;
  * float reductions whose order matters (a float32 sum over requests) and transcendental functions
    (exp, log) run through the same torch op on a zero-copy view, so they round the same way;
  * elementwise IEEE ops (+, -, *, /, comparisons), gathers, integer sums and stable sorts are exact in
    both libraries; Python scalars are added as float32 (NEP 50 / torch's wrapped numbers).
A policy spec has a fast form only where one is written (`attach`); every other spec runs its definition.
HYBRIDSPEC_REFERENCE_POLICIES=1 makes the simulator run the definitions everywhere.
"""
from __future__ import annotations

import os
from typing import Callable, List, Optional

import numpy as np
import torch

from sim.policies.base import CHAIN_MODEL, CHAIN_NGRAM, Allocation, StepBatch

_CONST: dict = {}


def _arr(x, dtype) -> np.ndarray:
    """A C-contiguous numpy array of `dtype` (zero-copy for the simulator's tensors)."""
    a = x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    return np.ascontiguousarray(a, dtype=dtype)


def _sweep_constants():
    """The two-stage sweep's float32 constants, computed by the torch definition: grid, u = -log(grid), q."""
    from sim.policies import hybrid

    key = ("sweep", hybrid.SWEEP_COARSE, hybrid.SWEEP_FINE)
    out = _CONST.get(key)
    if out is None:
        grid = hybrid._price_grid(hybrid.SWEEP_COARSE, "cpu", torch.float32)
        u = -torch.log(grid.clamp(min=1e-12))
        q = torch.linspace(0.0, 1.0, hybrid.SWEEP_FINE, dtype=torch.float32)
        out = _CONST[key] = (np.ascontiguousarray(grid.numpy()), np.ascontiguousarray(u.numpy()),
                             np.ascontiguousarray(q.numpy()))
    return out


class _Workspace:
    """Buffers of one batch shape (S sides, R, K_m, K_n) and their C pointers, made once and reused every call.
    gdt: the goodput's dtype (float32 with one drafter cost, float64 with a cost per side, as torch promotes)."""

    CTYPES = {"f": "float[]", "d": "double[]", "q": "int64_t[]", "l": "int64_t[]", "B": "uint8_t[]"}

    def __init__(self, ffi, S: int, R: int, Km: int, Kn: int, exact: bool, gdt=np.float32):
        from sim.policies import hybrid

        f32, i64 = np.float32, np.int64
        self.ffi = ffi
        self.conf_m, self.conf_n = np.empty((S, R, Km), f32), np.empty((S, R, Kn), f32)
        self.len_m, self.len_n = np.empty((S, R), i64), np.empty((S, R), i64)
        self.surv_m, self.surv_n = np.empty((S, R, Km), f32), np.empty((S, R, Kn), f32)
        self.cs_m, self.cs_n = np.empty((S, R, Km + 1), f32), np.empty((S, R, Kn + 1), f32)
        if exact:  # prices: every survival of the side, then 0
            self.lam = [np.zeros((S, R * (Km + Kn) + 1), f32)]
        else:
            grid, u, q = _sweep_constants()
            self.lam = [np.ascontiguousarray(np.broadcast_to(grid, (S, grid.shape[0]))), np.empty((S, hybrid.SWEEP_FINE), f32)]
            self.u, self.q = u, q
            self.arg = np.empty((S, hybrid.SWEEP_FINE), f32)
        self.stage = []
        for lam in self.lam:
            C = lam.shape[1]
            self.stage.append(dict(lam=lam, use=np.empty((S, R, C), np.uint8), adm=np.empty((S, R, C), i64),
                                   gch=np.empty((S, R, C), f32), slots=np.empty((S, C), i64),
                                   g=np.empty((S, C), gdt), best=np.empty(S, i64)))
        self.use_p, self.adm_p = np.empty((S, R), np.uint8), np.empty((S, R), i64)
        self.draft = np.empty(S, np.float64)
        self.len_cur, self.zeros = np.empty(R, i64), np.zeros(R, i64)
        self.work, self.pos = np.empty(R, i64), np.empty(3 * R, i64)
        self.chain, self.admitted = np.empty(R, i64), np.empty(R, i64)
        self.p = {}
        for k, v in list(vars(self).items()):
            if isinstance(v, np.ndarray):
                self.p[k] = self.ptr(v)
        for st in self.stage:
            st["p"] = {k: self.ptr(v) for k, v in st.items()}

    def ptr(self, a: np.ndarray):
        return self.ffi.from_buffer(self.CTYPES[a.dtype.char], a)

    def table(self, t) -> tuple:
        """(float64 array, its pointer) of a verify-cost table. The engine passes the same tensor every step:
        the last one's pointer is kept while it is that tensor and a zero-copy view of it (a float64,
        contiguous CPU tensor), so an in-place change of the table is still read."""
        last = self.__dict__.get("_table")
        if last is not None and last[0] is t:
            return last[1], last[2]
        arr = _arr(t, np.float64)
        p = self.ptr(arr)
        if isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.is_contiguous() and t.is_cpu:
            self._table = (t, arr, p)
        return arr, p


def _workspace(ffi, S, R, Km, Kn, gdt):
    from sim.policies import hybrid

    exact = R * Km + R * Kn <= hybrid.SWEEP_EXACT_MAX
    key = ("ws", S, R, Km, Kn, exact, np.dtype(gdt).char)
    ws = _CONST.get(key)
    if ws is None:
        ws = _CONST[key] = _Workspace(ffi, S, R, Km, Kn, exact, gdt)
    ws.exact = exact
    return ws


def _sweep_native(native, ws, batch: StepBatch, margin: float, per_side_draft: bool) -> np.ndarray:
    """hybrid.lambda_sweep over the workspace's S sides (confidences and lengths already in ws): survivals,
    both stages, and the pick; leaves (use_ngram, admitted) per side in ws.use_p, ws.adm_p and returns the
    picked goodput per side [S]."""
    ffi, lib = native
    S, R, Km = ws.conf_m.shape
    Kn = ws.conf_n.shape[2]
    p = ws.p
    lib.hp_chains(S * R, Km, Kn, p["conf_m"], p["len_m"], p["conf_n"], p["len_n"], p["surv_m"], p["cs_m"],
                  p["surv_n"], p["cs_n"])
    table, tp = ws.table(batch.verify_cost_ms)
    T, N, margin = int(batch.num_nondraft_tokens), float(batch.num_sampling), float(margin)
    draft = None if per_side_draft else float(batch.draft_cost_ms)

    def evaluate(st):
        q = st["p"]
        C = st["lam"].shape[1]
        lib.hp_eval(S, R, Km, Kn, p["surv_m"], p["cs_m"], p["surv_n"], p["cs_n"], C, q["lam"], margin, q["use"],
                    q["adm"], q["gch"], q["slots"])
        gain = torch.from_numpy(st["gch"]).sum(1).numpy()  # torch's summation order; fresh and contiguous
        if per_side_draft:
            lib.hp_goodput_d(S, C, ws.ptr(gain), q["slots"], tp, table.shape[0], T, N, p["draft"], q["g"], q["best"])
        else:
            lib.hp_goodput(S, C, ws.ptr(gain), q["slots"], tp, table.shape[0], T, N, draft, q["g"], q["best"])

    st = ws.stage[0]
    rows = np.arange(S)
    if ws.exact:
        st["lam"][:, :-1] = np.concatenate([ws.surv_m, ws.surv_n], -1).reshape(S, -1)
        evaluate(st)
    else:
        evaluate(st)
        lib.hp_fine_arg(S, ws.u.shape[0], ffi.from_buffer("float[]", ws.u), st["p"]["best"], ws.q.shape[0],
                        ffi.from_buffer("float[]", ws.q), p["arg"])
        fine = ws.stage[1]
        fine["lam"][...] = torch.exp(torch.from_numpy(ws.arg)).numpy()
        evaluate(fine)
        # first maximum over [coarse, fine]: the fine stage's best only where it is strictly better
        g2 = fine["g"][rows, fine["best"]]
        take2 = g2 > st["g"][rows, st["best"]]
        if take2.any():
            lib.hp_take(S, R, fine["lam"].shape[1], fine["p"]["use"], fine["p"]["adm"], fine["p"]["best"],
                        p["use_p"], p["adm_p"])
            use2, adm2 = ws.use_p.copy(), ws.adm_p.copy()
    lib.hp_take(S, R, st["lam"].shape[1], st["p"]["use"], st["p"]["adm"], st["p"]["best"], p["use_p"], p["adm_p"])
    best_g = st["g"][rows, st["best"]]
    if not ws.exact and take2.any():
        ws.use_p[take2], ws.adm_p[take2] = use2[take2], adm2[take2]
        best_g = np.where(take2, g2, best_g)
    return best_g


def price_with_budget_native(batch: StepBatch, margin: float, native) -> Allocation:
    """hybrid.price_with_budget(batch, "sweep", margin), float32 confidences, in C (native/hybrid_price.c).
    Both sides (current, stale) at once, as the definition stacks them; the float32 sums over requests
    run through torch's own sum so that they round exactly as the definition's do."""
    ffi, lib = native
    R, Km = batch.model_conf.shape
    Kn = batch.ngram_conf.shape[1]
    ws = _workspace(ffi, 2, R, Km, Kn, np.float32)
    p = ws.p
    ws.conf_m[0], ws.conf_m[1] = batch.model_conf.numpy(), batch.stale_model_conf.numpy()
    ws.conf_n[0], ws.conf_n[1] = batch.ngram_conf.numpy(), batch.stale_ngram_conf.numpy()
    ws.len_m[0], ws.len_m[1] = batch.model_len.numpy(), batch.stale_model_len.numpy()
    ws.len_n[0], ws.len_n[1] = batch.ngram_len.numpy(), batch.stale_ngram_len.numpy()
    _sweep_native(native, ws, batch, margin, per_side_draft=False)
    budget = int(ws.adm_p[1].sum())
    if batch.max_draft_tokens is not None:
        budget = min(budget, max(int(batch.max_draft_tokens), 0))
    lib.hp_finish(R, Km, Kn, p["surv_m"], p["surv_n"], p["len_m"], p["len_n"], p["use_p"], p["adm_p"], budget, 0,
                  p["work"], p["pos"], p["chain"], p["admitted"])
    return Allocation(chain=torch.from_numpy(ws.chain.copy()), admitted=torch.from_numpy(ws.admitted.copy()))


_FORECAST_NP = {"avg": lambda last, mean: (last + mean) * np.float32(0.5), "min": np.minimum,
                "mean": lambda last, mean: mean, "stale": lambda last, mean: last}


def price_skip_native(batch: StepBatch, margin: float, hysteresis: float, forecast: str, native) -> Allocation:
    """hybrid.price_skip(batch, "sweep", margin, hysteresis, forecast), float32 confidences, in C: four sides
    (current, stale, current without the model pass, stale without it), goodput in float64 since each side
    pays its own drafter cost, then the model pass's decision, the free budget and the top-B."""
    ffi, lib = native
    R, Km = batch.model_conf.shape
    Kn = batch.ngram_conf.shape[1]
    ws = _workspace(ffi, 4, R, Km, Kn, np.float64)
    p = ws.p
    mc, smc = batch.model_conf.numpy(), batch.stale_model_conf.numpy()
    ws.conf_m[0], ws.conf_m[1], ws.conf_m[2], ws.conf_m[3] = mc, smc, mc, smc
    ml = batch.model_len.numpy()
    ws.len_m[0], ws.len_m[1], ws.len_m[2:] = ml, batch.stale_model_len.numpy(), 0
    last = batch.stale_ngram_conf.numpy().astype(np.float32, copy=False)
    if batch.mean_ngram_conf is not None:
        last = _FORECAST_NP[forecast](last, batch.mean_ngram_conf.numpy().astype(np.float32))
    nc = batch.ngram_conf.numpy()
    ws.conf_n[0], ws.conf_n[1], ws.conf_n[2], ws.conf_n[3] = nc, last, nc, last
    nl, snl = batch.ngram_len.numpy(), batch.stale_ngram_len.numpy()
    ws.len_n[0], ws.len_n[1], ws.len_n[2], ws.len_n[3] = nl, snl, nl, snl
    full = float(batch.draft_cost_ms)
    skip = full - float(batch.model_draft_ms)
    ws.draft[:] = (full, full, skip, skip)
    g = _sweep_native(native, ws, batch, margin, per_side_draft=True)
    run_model = bool(g[3] <= g[1] * (1.0 + hysteresis))
    side = 0 if run_model else 2
    budget = int(ws.adm_p[1 if run_model else 3].sum())
    table, tp = ws.table(batch.verify_cost_ms)
    budget = lib.hs_free_budget(tp, table.shape[0], int(batch.num_nondraft_tokens), budget)
    if batch.max_draft_tokens is not None:
        budget = min(budget, max(int(batch.max_draft_tokens), 0))
    ws.len_cur[...] = ml if run_model else 0
    lib.hp_finish(R, Km, Kn, p["surv_m"], p["surv_n"], p["len_cur"], p["len_n"],
                  ffi.from_buffer("uint8_t[]", ws.use_p[side]), ffi.from_buffer("int64_t[]", ws.adm_p[side]), budget, 1,
                  p["work"], p["pos"], p["chain"], p["admitted"])
    return Allocation(chain=torch.from_numpy(ws.chain.copy()), admitted=torch.from_numpy(ws.admitted.copy()),
                      model_ran=torch.tensor(run_model))


def _transcribed(batch: StepBatch) -> bool:
    """Whether the native transcription covers the batch (float32 chains of width >= 1, CPU tensors);
    anything else runs the torch definition."""
    return (batch.model_conf.dtype == torch.float32 and batch.model_conf.shape[1] >= 1 and batch.ngram_conf.shape[1] >= 1
            and all(isinstance(t, torch.Tensor) and t.is_cpu for t in (
                batch.model_conf, batch.stale_model_conf, batch.ngram_conf, batch.stale_ngram_conf,
                batch.model_len, batch.stale_model_len, batch.ngram_len, batch.stale_ngram_len)))


def _price_with_budget_form(margin: float):
    from sim.policies import hybrid
    from sim.policies.native import load

    native = load("hybrid_price")
    if native is None:
        return None

    def fn(batch: StepBatch) -> Allocation:
        if not _transcribed(batch):
            return hybrid.price_with_budget(batch, "sweep", margin)  # outside the transcription: the definition
        return price_with_budget_native(batch, margin, native)

    return fn


def alloc_adaptive_native(batch: StepBatch, native) -> Allocation:
    """adaptive.alloc_adaptive(batch), float32 current confidences, in C (native/hybrid_price.c: ad_budget,
    then the same stable top-B merge as hybrid-price with every request on its model chain)."""
    ffi, lib = native
    R, K = batch.model_conf.shape
    key = ("ad", R, K)
    ws = _CONST.get(key)
    if ws is None:
        f32, i64 = np.float32, np.int64
        ws = _CONST[key] = dict(stale=np.empty((R, K), np.float64), conf=np.empty((R, K), f32), len=np.empty(R, i64),
                                surv=np.empty((R, K), f32), cs=np.empty((R, K + 1), f32), work=np.empty(R * K, np.float64),
                                use=np.zeros(R, np.uint8), one=np.ones(R, i64), heap=np.empty(R, i64),
                                pos=np.empty(3 * R, i64), chain=np.empty(R, i64), adm=np.empty(R, i64),
                                none=np.zeros(1, f32))
        ws["p"] = {k: ffi.from_buffer(_Workspace.CTYPES[v.dtype.char], v) for k, v in ws.items()}
    p = ws["p"]
    ws["stale"][...] = batch.stale_model_conf.numpy()
    ws["conf"][...] = batch.model_conf.numpy()
    ws["len"][...] = batch.model_len.numpy()
    table = _arr(batch.verify_cost_ms, np.float64)
    cap = -1 if batch.max_draft_tokens is None else max(int(batch.max_draft_tokens), 0)
    budget = lib.ad_budget(R, K, p["stale"], p["len"], ffi.from_buffer("double[]", table), table.shape[0],
                           int(batch.num_nondraft_tokens), float(batch.num_sampling), float(batch.draft_cost_ms), cap,
                           p["work"])
    lib.ad_survival(R, K, p["conf"], p["len"], p["surv"], p["cs"])
    lib.hp_finish(R, K, 0, p["surv"], p["none"], p["len"], p["len"], p["use"], p["one"], budget, 0, p["heap"],
                  p["pos"], p["chain"], p["adm"])
    return Allocation(chain=torch.from_numpy(ws["chain"].copy()), admitted=torch.from_numpy(ws["adm"].copy()))


def _adaptive_form():
    from sim.policies import adaptive
    from sim.policies.native import load

    native = load("hybrid_price")
    if native is None:
        return None

    def fn(batch: StepBatch) -> Allocation:
        if (batch.model_conf.dtype != torch.float32 or batch.model_conf.shape[1] < 1
                or not all(isinstance(t, torch.Tensor) and t.is_cpu for t in (
                    batch.model_conf, batch.stale_model_conf, batch.model_len))):
            return adaptive.alloc_adaptive(batch)
        return alloc_adaptive_native(batch, native)

    return fn


def _parse_hybrid_price(params: List[str]) -> Optional[Callable[[StepBatch], Allocation]]:
    from sim.policies.hybrid import parse_hybrid_price

    method, current, margin, _ = parse_hybrid_price(params)
    if method != "sweep" or current:
        return None
    return _price_with_budget_form(margin)


def _price_skip_form(margin: float, hyst: float, forecast: str):
    from sim.policies import hybrid
    from sim.policies.native import load

    native = load("hybrid_price")
    if native is None:
        return None

    def fn(batch: StepBatch) -> Allocation:
        if (not _transcribed(batch) or isinstance(batch.draft_cost_ms, torch.Tensor)
                or isinstance(batch.model_draft_ms, torch.Tensor)):
            return hybrid.price_skip(batch, "sweep", margin, hyst, forecast)
        return price_skip_native(batch, margin, hyst, forecast, native)

    return fn


def _parse_hybrid(params: List[str]) -> Optional[Callable[[StepBatch], Allocation]]:
    from sim.policies.hybrid import parse_hybrid

    method, margin, hyst, forecast, _ = parse_hybrid(params)
    if method != "sweep" or forecast not in _FORECAST_NP:
        return None
    return _price_skip_form(margin, hyst, forecast)


def _parse_adaptive(params: List[str]) -> Optional[Callable[[StepBatch], Allocation]]:
    return _adaptive_form() if not params else None


def tree_native(batch: StepBatch, margin: float, discount: float, native) -> Allocation:
    """tree.tree_alloc(batch, "sweep", margin, discount): the primary allocation (the current-values sweep,
    hybrid.lambda_sweep on one side) in C, then tree.second_branch in numpy (second_branch_np)."""
    from sim.policies.tree import second_branch

    ffi, lib = native
    R, Km = batch.model_conf.shape
    Kn = batch.ngram_conf.shape[1]
    ws = _workspace(ffi, 1, R, Km, Kn, np.float32)
    ws.conf_m[0], ws.conf_n[0] = batch.model_conf.numpy(), batch.ngram_conf.numpy()
    ws.len_m[0], ws.len_n[0] = batch.model_len.numpy(), batch.ngram_len.numpy()
    _sweep_native(native, ws, batch, margin, per_side_draft=False)
    return second_branch_np(batch, ws.surv_m[0], ws.surv_n[0], ws.use_p[0].astype(bool), ws.adm_p[0].copy(), discount)


def second_branch_np(batch: StepBatch, surv_m: np.ndarray, surv_n: np.ndarray, use_ngram: np.ndarray,
                     adm: np.ndarray, discount: float) -> Allocation:
    """tree.second_branch in numpy: float32 elementwise ops with float32 scalars (torch's wrapped-number
    rule), the float32 sums of the primary's gain through torch's own sum (its order), the price's
    secant divided by the window as float32 (torch promotes float32 / int64 to float32)."""
    from sim.policies.tree import SECANT_MIN

    f32 = np.float32
    R, Km = surv_m.shape
    Kn = surv_n.shape[1]
    K = max(Km, Kn)
    pm = np.zeros((R, K), f32)
    pm[:, :Km] = surv_m
    pn = np.zeros((R, K), f32)
    pn[:, :Kn] = surv_n
    u = use_ngram[:, None]
    surv_p, surv_s = np.where(u, pn, pm), np.where(u, pm, pn)
    a_p = np.where(np.arange(K)[None, :] < adm[:, None], surv_p, f32(0.0))
    total = int(adm.sum())
    gain = torch.from_numpy(a_p).sum(-1).sum(-1).numpy()[()]  # float32, torch's summation order
    table = batch.verify_cost_ms.numpy()
    T, last = int(batch.num_nondraft_tokens), table.shape[0] - 1

    def verify(slots: int):
        return table[min(max(slots + T, 0), last)]

    g = (gain + f32(batch.num_sampling)) / (f32(verify(total)) + f32(batch.draft_cost_ms))
    w = max(total // 2, SECANT_MIN)
    lam = g * f32(verify(total + w) - verify(total)) / f32(w)
    v = surv_s * (f32(1.0) - a_p) * f32(discount)
    second = np.cumprod((v > lam).astype(np.int64), -1).sum(-1)
    second = np.where(adm > 0, second, 0).astype(np.int64)
    out = _finished(np.where(use_ngram, CHAIN_NGRAM, CHAIN_MODEL), adm)
    return Allocation(chain=out.chain, admitted=out.admitted, second=torch.from_numpy(second))


def _parse_tree(params: List[str]) -> Optional[Callable[[StepBatch], Allocation]]:
    from sim.policies import tree
    from sim.policies.hybrid import NGRAM_MARGIN
    from sim.policies.native import load

    method, discount, _ = tree.parse_tree(params)
    native = load("hybrid_price") if method == "sweep" else None
    if native is None:
        return None

    def fn(batch: StepBatch) -> Allocation:
        if (not _transcribed(batch) or isinstance(batch.draft_cost_ms, torch.Tensor)
                or not isinstance(batch.verify_cost_ms, torch.Tensor) or not batch.verify_cost_ms.is_cpu):
            return tree.tree_alloc(batch, method, NGRAM_MARGIN, discount)
        return tree_native(batch, NGRAM_MARGIN, discount, native)

    return fn


def oracle_np(batch: StepBatch) -> Allocation:
    """simple.alloc_oracle in numpy: the goodput of every (drafter set, B) in float64 as the definition
    promotes it (the drafter costs in float32 first, as torch multiplies an int64 tensor by a Python float),
    the first maximum, and the depth-first top-B of the accepted slots (integer only)."""
    table = (batch.true_verify_cost_ms if batch.true_verify_cost_ms is not None else batch.verify_cost_ms).numpy()
    acc_m = np.minimum(batch.true_model_acc.numpy(), batch.model_len.numpy())
    acc_n = np.minimum(batch.true_ngram_acc.numpy(), batch.ngram_len.numpy())
    R = acc_m.shape[0]
    use_m = np.array([1, 0, 1, 0], dtype=np.int64)
    use_n = np.array([1, 1, 0, 0], dtype=np.int64)
    md, nd = batch.model_draft_ms, batch.ngram_draft_ms
    alloc_ms = batch.draft_cost_ms - md - nd
    f32 = np.float32
    draft = (use_m.astype(f32) * f32(md) + use_n.astype(f32) * f32(nd)
             + (use_m | use_n).astype(f32) * f32(alloc_ms)).astype(np.float64)
    a_s = np.maximum(acc_m[None] * use_m[:, None], acc_n[None] * use_n[:, None])  # [4, R]
    K = max(batch.model_conf.shape[-1], batch.ngram_conf.shape[-1])
    b = np.arange(R * K + 1)
    idx = np.clip(b + batch.num_nondraft_tokens, 0, table.shape[0] - 1)
    step = table[idx].astype(np.float64)[None, :] + draft[:, None]
    g = (b.astype(np.float64)[None, :] + batch.num_sampling) / step
    g[b[None, :] > a_s.sum(-1, keepdims=True)] = -np.inf
    best = int(np.argmax(g))
    s, budget = best // g.shape[1], best % g.shape[1]
    acc = a_s[s]
    use_ngram = ((acc_n > acc_m) & (use_n[s] > 0)) | (use_m[s] == 0)
    chain = np.where(use_ngram, CHAIN_NGRAM, CHAIN_MODEL)
    # top-B of scores K - depth (ties: lower flat index r * K + depth): depth-major, then request order
    live = np.arange(K)[:, None] < acc[None, :]  # [K, R]
    rank = np.cumsum(live.ravel()).reshape(K, R) - 1
    admitted = (live & (rank < budget)).sum(0)
    out = _finished(chain, admitted)
    return Allocation(chain=out.chain, admitted=out.admitted, model_ran=torch.tensor(bool(use_m[s] > 0)),
                      ngram_ran=torch.tensor(bool(use_n[s] > 0)))


def _parse_oracle(params: List[str]) -> Optional[Callable[[StepBatch], Allocation]]:
    from sim.policies import simple

    def fn(batch: StepBatch) -> Allocation:
        if (batch.true_model_acc is None or not _int64_lengths(batch.model_len, batch.ngram_len, batch.true_model_acc,
                                                                 batch.true_ngram_acc)
                or any(isinstance(x, torch.Tensor) for x in (batch.draft_cost_ms, batch.model_draft_ms,
                                                             batch.ngram_draft_ms))
                or (batch.true_verify_cost_ms if batch.true_verify_cost_ms is not None
                    else batch.verify_cost_ms).dtype != torch.float64):
            return simple.alloc_oracle(batch)
        return oracle_np(batch)

    return fn


def _int64_lengths(*ts) -> bool:
    """Whether the chain lengths are CPU int64 tensors (the transcriptions below read them as such)."""
    return all(isinstance(t, torch.Tensor) and t.dtype == torch.int64 and t.is_cpu for t in ts)


def _finished(chain: np.ndarray, admitted: np.ndarray) -> Allocation:
    """common.finish in numpy: int64, chain NONE wherever nothing is admitted."""
    return Allocation(chain=torch.from_numpy(np.where(admitted > 0, chain, 0).astype(np.int64)),
                      admitted=torch.from_numpy(admitted.astype(np.int64)))


def _parse_none(params: List[str]) -> Optional[Callable[[StepBatch], Allocation]]:
    """simple.alloc_none: nothing admitted (integer-only, so numpy equals it exactly)."""
    from sim.policies import simple

    def fn(batch: StepBatch) -> Allocation:
        if not _int64_lengths(batch.model_len):
            return simple.alloc_none(batch)
        zeros = np.zeros(batch.model_len.shape, dtype=np.int64)
        return Allocation(chain=torch.from_numpy(zeros), admitted=torch.from_numpy(zeros.copy()))

    return fn


def _fixed_form(which: int):
    def parse(params: List[str]) -> Optional[Callable[[StepBatch], Allocation]]:
        """simple.alloc_fixed: min(K, the chain's length) slots of one chain."""
        from sim.policies import simple
        from sim.policies.registry import parse_int

        k = parse_int(params[0], "K", lo=0)  # the spec is valid (get_policy parsed it first)

        def fn(batch: StepBatch) -> Allocation:
            length = batch.model_len if which == CHAIN_MODEL else batch.ngram_len
            if not _int64_lengths(length):
                return simple.alloc_fixed(batch, k, which)
            adm = np.minimum(length.numpy(), k)
            return _finished(np.full(adm.shape, which, dtype=np.int64), adm)

        return fn

    return parse


def _parse_ngram_first(params: List[str]) -> Optional[Callable[[StepBatch], Allocation]]:
    """simple.alloc_ngram_first: the whole n-gram chain where it matched, else the whole model chain."""
    from sim.policies import simple

    def fn(batch: StepBatch) -> Allocation:
        if not _int64_lengths(batch.model_len, batch.ngram_len):
            return simple.alloc_ngram_first(batch)
        nl, ml = batch.ngram_len.numpy(), batch.model_len.numpy()
        use = nl > 0
        return _finished(np.where(use, CHAIN_NGRAM, CHAIN_MODEL), np.where(use, nl, ml))

    return fn


_FORMS = {"hybrid-price": _parse_hybrid_price, "adaptive": _parse_adaptive, "hybrid": _parse_hybrid,
          "none": _parse_none, "model-fixed": _fixed_form(CHAIN_MODEL), "ngram-fixed": _fixed_form(CHAIN_NGRAM),
          "ngram-first": _parse_ngram_first, "hybrid-tree": _parse_tree, "oracle": _parse_oracle}


def sim_form(spec: str) -> Optional[Callable[[StepBatch], Allocation]]:
    """The fast form of the (valid) policy spec, or None when it has none or the definitions are forced."""
    if os.environ.get("HYBRIDSPEC_REFERENCE_POLICIES", "").strip() not in ("", "0"):
        return None
    name, *params = str(spec).strip().split(":")
    parse = _FORMS.get(name)
    return parse(params) if parse is not None else None
