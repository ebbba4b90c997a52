"""Faster forms of policies for the simulator only: C and numpy transcriptions of the torch definitions.

The torch functions (hybrid.py, adaptive.py, ...) stay the one definition: the real engines and the vLLM
plugin run them, and tests/test_fast_forms.py checks every fast form here against its definition,
allocation for allocation, on thousands of random batches and on batches recorded from engine runs of the
bundled traces (exact equality). The simulator calls a policy thousands of times per second on tiny
tensors, where each torch op's dispatch (2-4 us) dominates.

A fast form is a core over `Arrays` (a StepBatch as numpy arrays and Python scalars): the native engine step
calls it on the arrays it gathers, with no StepBatch or tensors (sim/engine/engine.py, Engine.array_form), and
`fn(batch)` wraps the same core for a StepBatch (`_form`). A core may return None where its transcription
cannot be exact on this machine; the definition then runs.

Bit-exactness rules of the transcription (why it equals the torch definition, not merely approximates it):
  * cumprod / cumsum: torch's CPU kernels accumulate float32 in float64 and round each output, so here
    they do too;
  * float32 sums whose order matters: the sum over requests and the sum along a survival row are
    transcribed in C in the order of ATen's cascade sum (sim/engine/native/hybrid_price.c), which depends
    on the CPU's vector width, so each is checked bit for bit against torch.sum once per process
    (`_sum_width`, `_inner_sum_width`) and used only where it matches; other reductions and exp / log run
    through the same torch op on a zero-copy view, so they round the same way;
  * elementwise IEEE ops (+, -, *, /, comparisons), gathers, integer sums and stable sorts are exact in
    both; Python scalars are added as float32 (NEP 50 / torch's wrapped numbers); the C is compiled
    without fast-math or contraction (one IEEE single-precision operation per op).
A policy spec has a fast form only where one is written: each builder here is declared with
sim.engine.forms.policy_form, naming the definition it transcribes and the specs it covers (the one registry
of fast forms; tests/test_fast_forms.py enrols every registered form); every other spec runs its definition.
HYBRIDSPEC_REFERENCE_POLICIES=1 makes the simulator run the definitions everywhere.
"""
from __future__ import annotations

import os
from typing import Callable, List, NamedTuple, Optional

import numpy as np
import torch

from sim.engine.forms import policy_form, policy_form_of
from sim.core.policies import adaptive, hybrid, simple, tree
from sim.core.policies.base import CHAIN_MODEL, CHAIN_NGRAM, MODEL, NGRAM, Allocation, Decision, StepBatch

_CONST: dict = {}


def _arr(x, dtype) -> np.ndarray:
    """A C-contiguous numpy array of `dtype` (zero-copy for the simulator's tensors)."""
    a = x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    return np.ascontiguousarray(a, dtype=dtype)


CTYPES = {"f": "float[]", "d": "double[]", "q": "int64_t[]", "l": "int64_t[]", "i": "int32_t[]", "B": "uint8_t[]"}


def _sweep_constants(native):
    """The two-stage sweep's float32 prices, computed by the torch definition's ops: the coarse grid [G] and
    the fine prices around each possible coarse best, fine[b] = exp(-(u_lo + q (u_hi - u_lo))) [G, F] with
    u = -log(grid) and u_lo, u_hi the neighbours of b (the same floats as the definition computes per call:
    the argument by hp_fine_arg's float ops, the exp by torch's own exp)."""

    key = ("sweep", hybrid.SWEEP_COARSE, hybrid.SWEEP_FINE)
    out = _CONST.get(key)
    if out is None:
        ffi, lib = native
        grid = hybrid._price_grid(hybrid.SWEEP_COARSE, "cpu", torch.float32)
        u = np.ascontiguousarray((-torch.log(grid.clamp(min=1e-12))).numpy())
        q = np.ascontiguousarray(torch.linspace(0.0, 1.0, hybrid.SWEEP_FINE, dtype=torch.float32).numpy())
        G, F = u.shape[0], q.shape[0]
        best = np.arange(G, dtype=np.int64)
        arg = np.empty((G, F), np.float32)
        lib.hp_fine_arg(G, G, ffi.from_buffer("float[]", u), ffi.from_buffer("int64_t[]", best), F,
                        ffi.from_buffer("float[]", q), ffi.from_buffer("float[]", arg))
        fine = np.ascontiguousarray(torch.exp(torch.from_numpy(arg)).numpy())
        out = _CONST[key] = (np.ascontiguousarray(grid.numpy()), fine)
    return out


# Shapes [S, R, C] on which hp_sum_requests is checked against torch.sum: every column class (leading
# blocks, whole vectors, the scalar tail; C below one vector), cascades of one and several 16-row chunks,
# ilp4 remainders, one request.
_SUM_SHAPES = ((2, 37, 157), (2, 130, 49), (2, 5, 32), (4, 21, 7), (1, 300, 3), (2, 1, 9), (2, 4, 157))
_GRAIN = 32768  # ATen's parallel grain: smaller reductions run on one thread whatever the thread count


def _sum_checked(native, V: int, shapes) -> bool:
    """Whether hp_sum_requests with width V equals torch.sum(x, 1) bit for bit on random float32 data spread
    over eight decades (a different summation order shows at once), for every [S, R, C] in `shapes`."""
    ffi, lib = native
    rng = np.random.default_rng(20261130)
    for S, R, C in shapes:
        for _ in range(3):
            x = (rng.random((S, R, C)) * 10.0 ** rng.integers(-4, 4, (S, R, C))).astype(np.float32)
            want = torch.from_numpy(x).sum(1).numpy()
            got = np.empty((S, C), np.float32)
            lib.hp_sum_requests(S, R, C, V, ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", got))
            if not _same_bits(got, want):
                return False
    return True


def _sum_width(native, S: int, R: int, Cs: tuple) -> Optional[int]:
    """The vector width V with which hp_sum_requests reproduces torch.sum(x, 1) on this machine for float32
    x [S, R, C], C in Cs (native/hybrid_price.c states the order), or None (the caller runs the torch
    definition). V is found once per process on _SUM_SHAPES; a reduction big enough for ATen to split across
    threads (more than one thread, S R C >= its grain) is checked on its own shape instead."""
    threads = torch.get_num_threads()
    if threads > 1 and S * R * max(Cs) >= _GRAIN:
        key, shapes = ("sum-width", S, R, Cs, threads), tuple((S, R, C) for C in Cs)
    else:
        key, shapes = ("sum-width",), _SUM_SHAPES
    return _first_width(key, lambda V: _sum_checked(native, V, shapes))


def _first_width(key: tuple, matches: Callable[[int], bool]) -> Optional[int]:
    """The first vector width V (floats per register: this CPU's own, then 8, 16, 4) for which `matches(V)`,
    found once per `key`; None if none does."""
    if key not in _CONST:
        wide = 16 if "AVX512" in str(torch.backends.cpu.get_cpu_capability()) else 8
        _CONST[key] = next((V for V in dict.fromkeys((wide, 8, 16, 4)) if matches(V)), None)
    return _CONST[key]


def _same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    return np.array_equal(got.view(np.uint32), want.view(np.uint32))


class _Workspace:
    """hp_sweep's buffers for one batch shape (S sides, R, K_m, K_n) and their C pointers, made once and
    reused every call; V: the summation width (_sum_width), None where the C sum does not reproduce torch's."""

    def __init__(self, native, S: int, R: int, Km: int, Kn: int):

        ffi = self.ffi = native[0]
        self.R, self.Km, self.Kn = R, Km, Kn
        f32, i64 = np.float32, np.int64
        self.exact = R * Km + R * Kn <= hybrid.SWEEP_EXACT_MAX
        self.grid, self.fine = _sweep_constants(native)
        G, F = self.fine.shape
        Cs = (R * (Km + Kn) + 1,) if self.exact else (G, F)
        self.V = _sum_width(native, S, R, Cs)
        C = max(Cs)
        self.conf_m, self.conf_n = np.empty((S, R, Km), f32), np.empty((S, R, Kn), f32)
        self.len_m, self.len_n = np.empty((S, R), i64), np.empty((S, R), i64)
        self.surv_m, self.surv_n = np.empty((S, R, Km), f32), np.empty((S, R, Kn), f32)
        self.cs_m, self.cs_n = np.empty((S, R, Km + 1), f32), np.empty((S, R, Kn + 1), f32)
        self.lam, self.slots = np.empty((S, C), f32), np.empty((S, C), i64)
        self.gch, self.code = np.empty((S, R, C), f32), np.empty((S, R, C), np.int32)
        self.gain, self.g, self.gd = np.empty((S, C), f32), np.empty((S, C), f32), np.empty((S, C), np.float64)
        self.best, self.best_g = np.empty(S, i64), np.empty(S, np.float64)
        self.use_p, self.adm_p = np.empty((S, R), np.uint8), np.empty((S, R), i64)
        self.J = np.empty(2 * R, i64)  # hp_sweep's work
        self.draft = np.empty(S, np.float64)
        self.len_cur = np.empty(R, i64)
        self.work, self.pos, self.vals = np.empty(R, i64), np.empty(3 * R, i64), np.empty(R * max(Km, Kn), f32)
        self.chain, self.admitted = np.empty(R, i64), np.empty(R, i64)
        self.a_p, self.second = np.empty((R, max(Km, Kn)), f32), np.empty(R, i64)  # hybrid-tree's second branch
        self.p = p = {k: self.ptr(v) for k, v in list(vars(self).items()) if isinstance(v, np.ndarray)}
        # hp_price_with_budget's workspace (hp_work): pointers into the arrays above, which this object keeps
        w = self.work_c = ffi.new("hp_work *")
        w.exact, w.V, w.G, w.F = int(self.exact), -1 if self.V is None else self.V, G, F
        for field, k in (("grid", "grid"), ("fine", "fine"), ("surv_m", "surv_m"), ("cs_m", "cs_m"),
                         ("surv_n", "surv_n"), ("cs_n", "cs_n"), ("lam", "lam"), ("gch", "gch"), ("gain", "gain"),
                         ("g", "g"), ("vals", "vals"), ("code", "code"), ("slots", "slots"), ("best", "best"),
                         ("adm_p", "adm_p"), ("J", "J"), ("heap_r", "work"), ("pos", "pos"), ("chain_out", "chain"),
                         ("adm_out", "admitted"), ("gd", "gd"), ("best_g", "best_g"), ("use_p", "use_p")):
            setattr(w, field, p[k])
        # ffi.from_buffer less its per-call type parsing, for the per-call pointers
        self.fb = ffi._backend.from_buffer
        self.f32, self.i64 = ffi.typeof("float[]"), ffi.typeof("int64_t[]")

    def ptr(self, a: np.ndarray):
        return self.ffi.from_buffer(CTYPES[a.dtype.char], a)

    def pointers(self, packed: tuple) -> tuple:
        """C pointers of (model conf, model len, n-gram conf, n-gram len): float32 / int64, C-contiguous, of
        this workspace's shape (ValueError otherwise: a pointer into a smaller array would read past it)."""
        cm, lm, cn, ln = packed
        if (cm.dtype != np.float32 or cn.dtype != np.float32 or lm.dtype != np.int64 or ln.dtype != np.int64
                or cm.shape != self.conf_m.shape or cn.shape != self.conf_n.shape or lm.shape != self.len_m.shape
                or ln.shape != self.len_n.shape or not all(a.flags.c_contiguous for a in packed)):
            raise ValueError("packed chains of another shape, dtype or layout than the workspace's")
        fb, f32, i64 = self.fb, self.f32, self.i64
        return fb(f32, cm), fb(i64, lm), fb(f32, cn), fb(i64, ln)

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

    def sweep(self, lib, table, T: int, N: float, draft: float, margin: float, per_side_draft: bool) -> None:
        """hp_sweep over the workspace's sides (chains in conf_*, len_*): leaves each side's pick in use_p,
        adm_p and its goodput in best_g. draft: the drafter cost [ms] when one for all sides, else the
        per-side costs are in self.draft."""
        p = self.p
        S, R, Km = self.conf_m.shape
        arr, tp = self.table(table)
        cm, lm, cn, ln = p["conf_m"], p["len_m"], p["conf_n"], p["len_n"]
        lib.hp_sweep(S, R, Km, self.conf_n.shape[2], cm, lm, cn, ln, tp,
                     arr.shape[0], T, N, draft, p["draft"] if per_side_draft else self.ffi.NULL, margin,
                     int(self.exact), self.V, p["grid"], self.fine.shape[0], p["fine"], self.fine.shape[1],
                     p["surv_m"], p["cs_m"], p["surv_n"], p["cs_n"], p["lam"], p["gch"], p["code"],
                     p["slots"], p["gain"], p["g"], p["gd"], p["best"], p["use_p"], p["adm_p"], p["best_g"],
                     p["J"])


def _workspace(native, S: int, R: int, Km: int, Kn: int) -> _Workspace:
    key = ("ws", S, R, Km, Kn, torch.get_num_threads())
    ws = _CONST.get(key)
    if ws is None:
        ws = _CONST[key] = _Workspace(native, S, R, Km, Kn)
    return ws


class Arrays(NamedTuple):
    """A StepBatch as the faster forms read it: numpy arrays and Python scalars, no tensors. These forms transcribe
    the two default drafters' case, so the fields name them: an internal transcription of the StepBatch's entries
    indexed by drafter (chains[dspark], chains[ngram], means[ngram], draft_ms_of, true_acc). The native engine
    step builds one per step from the arrays it gathers, with no StepBatch (sim/engine/engine.py); Arrays.of converts
    a StepBatch. packed = (model conf [2, R, K_m] float32, model len [2, R] int64, n-gram conf [2, R, K_n]
    float32, n-gram len [2, R] int64), the current chains (side 0) and the stale ones (side 1), C-contiguous;
    ptrs: their C pointers, or None. The rest are the StepBatch's fields: mean_ngram_conf = means[ngram]
    (float64 or None), T = num_nondraft_tokens, N = num_sampling, draft = draft_cost_ms, model_draft =
    price(dspark), cap = max_draft_tokens, table = verify_cost_ms (kept a tensor: a workspace keeps its pointer while it is
    the same one); the oracle's: ngram_draft = price(ngram), true_model_acc, true_ngram_acc = true_acc (int64 [R])
    and true_table = true_verify_cost_ms (float64), None where the policy reads no ground truth; has_nan:
    whether the confidences or the mean hold a NaN, where the maker knows (the native step's gather), else
    None."""

    packed: tuple
    ptrs: Optional[tuple]
    mean_ngram_conf: Optional[np.ndarray]
    T: int
    N: int
    draft: float
    model_draft: float
    cap: Optional[int]
    table: object
    ngram_draft: float = 0.0
    true_model_acc: Optional[np.ndarray] = None
    true_ngram_acc: Optional[np.ndarray] = None
    true_table: Optional[np.ndarray] = None
    has_nan: Optional[bool] = None

    @classmethod
    def of(cls, batch: StepBatch) -> "Arrays":
        f32, i64 = np.float32, np.int64
        mean = batch.means.get(NGRAM)
        (mc, ml), (smc, sml) = batch.chains[MODEL], batch.stale_chains[MODEL]
        (nc, nl), (snc, snl) = batch.chains[NGRAM], batch.stale_chains[NGRAM]
        return cls((np.stack([_arr(mc, f32), _arr(smc, f32)]), np.stack([_arr(ml, i64), _arr(sml, i64)]),
                    np.stack([_arr(nc, f32), _arr(snc, f32)]), np.stack([_arr(nl, i64), _arr(snl, i64)])),
                   None, None if mean is None else _arr(mean, np.float64), int(batch.num_nondraft_tokens),
                   int(batch.num_sampling), float(batch.draft_cost_ms), float(batch.price(MODEL)),
                   batch.max_draft_tokens, batch.verify_cost_ms, float(batch.price(NGRAM)),
                   *(None if t is None else t.numpy() for t in (batch.true_acc.get(MODEL), batch.true_acc.get(NGRAM),
                                                              batch.true_verify_cost_ms)))

    def pointers(self, ws: "_Workspace") -> tuple:
        return self.ptrs or ws.pointers(self.packed)

    def workspace(self, native, S: int) -> Optional["_Workspace"]:
        """The sweep's workspace of S sides for this batch's shape (R, K_m, K_n), or None where the C sum
        cannot reproduce torch's here (the definition then runs)."""
        cm, cn = self.packed[0], self.packed[2]
        ws = _workspace(native, S, cm.shape[1], cm.shape[2], cn.shape[2])
        return None if ws.V is None else ws


def _allocation(out: tuple) -> Allocation:
    """The Allocation of a form's (chain, admitted, second, model_ran, ngram_ran), as fresh tensors."""
    chain, adm, sec, ran = decision(out)
    return Allocation(chain=torch.from_numpy(np.array(chain, dtype=np.int64)),
                      admitted=torch.from_numpy(np.array(adm, dtype=np.int64)),
                      second=None if sec is None else torch.from_numpy(np.array(sec, dtype=np.int64)),
                      ran=None if ran is None else {k: torch.tensor(bool(v)) for k, v in ran.items()})


def decision(out: tuple) -> Decision:
    """The Decision of a form's core result (chain, admitted, second, model_ran, ngram_ran): the two default
    drafters' reports, the transcription's own columns, become Decision.ran (absent where None: as planned)."""
    chain, adm, sec, model_ran, ngram_ran = out
    if model_ran is None and ngram_ran is None:
        return Decision(chain, adm, sec)
    ran = {n: r for n, r in ((MODEL, model_ran), (NGRAM, ngram_ran)) if r is not None}
    return Decision(chain, adm, sec, ran)


def _has_nan(a: Arrays) -> bool:
    """Whether the chains' confidences (or the mean n-gram chain) hold a NaN. The transcriptions do not
    follow the definitions' NaN semantics (sorts, top-k and searchsorted over NaN), so a form declines such
    a batch and the definition runs. The native step's gather says (Arrays.has_nan); else a scan."""
    if a.has_nan is not None:
        return a.has_nan
    cm, cn, mean = a.packed[0], a.packed[2], a.mean_ngram_conf
    return bool(np.isnan(cm).any() or np.isnan(cn).any() or (mean is not None and np.isnan(mean).any()))


def _form(core: Callable[[Arrays], Optional[tuple]], covered: Callable[[StepBatch], bool],
          definition: Callable[[StepBatch], Allocation], reads_mean: bool = False, confidences: bool = False):
    """A policy's fast form: fn(batch) runs `core` on Arrays.of(batch) where `covered(batch)` (the inputs the
    transcription reads: dtypes, CPU tensors), else -- or where core returns None -- the definition.
    fn.arrays = core, what the native engine step calls on its gathered arrays (reads_mean: whether core
    reads mean_ngram_conf, so that the step gathers it). core returns (chain, admitted, second or None,
    model_ran or None, ngram_ran or None) as int64 [R] arrays (valid until its next call) and bools. A core
    that reads the confidences (`confidences`, fn.arrays.reads_conf) declines (None) a batch with NaN in them
    (_has_nan)."""
    if confidences:
        inner = core

        def core(a: Arrays) -> Optional[tuple]:
            return None if _has_nan(a) else inner(a)

    def fn(batch: StepBatch) -> Allocation:
        out = core(Arrays.of(batch)) if covered(batch) else None
        return definition(batch) if out is None else _allocation(out)

    core.reads_mean = reads_mean
    core.reads_conf = confidences
    fn.arrays = core
    return fn


def _transcribed(batch: StepBatch) -> bool:
    """Whether the native transcription covers the batch (float32 chains of width >= 1, CPU tensors);
    anything else runs the torch definition."""
    pairs = (batch.chains[MODEL], batch.stale_chains[MODEL], batch.chains[NGRAM], batch.stale_chains[NGRAM])
    return (all(conf.dtype == torch.float32 for conf, _ in pairs)
            and pairs[0][0].shape[1] >= 1 and pairs[2][0].shape[1] >= 1
            and all(isinstance(t, torch.Tensor) and t.is_cpu for pair in pairs for t in pair))


def _scalar_costs(batch: StepBatch) -> bool:
    """Whether the drafter costs are Python numbers (the transcriptions read them as such)."""
    return not any(isinstance(x, torch.Tensor) for x in (batch.draft_cost_ms, batch.price(MODEL)))


def _cpu_table(batch: StepBatch) -> bool:
    return isinstance(batch.verify_cost_ms, torch.Tensor) and batch.verify_cost_ms.is_cpu


def _cap(cap: Optional[int]) -> int:
    """A budget cap for the C: max(cap, 0), or -1 for none."""
    return -1 if cap is None else max(int(cap), 0)


def price_with_budget_arrays(native, margin: float, a: Arrays) -> Optional[tuple]:
    """hybrid.price_with_budget(batch, "sweep", margin) in one C call (native/hybrid_price.c:
    hp_price_with_budget): both sides (current, stale) as the definition stacks them. None where the C sum
    cannot reproduce torch's (the definition then runs)."""
    ws = a.workspace(native, 2)
    if ws is None:
        return None
    R, Km, Kn = ws.R, ws.Km, ws.Kn
    pcm, plm, pcn, pln = a.pointers(ws)
    arr, tp = ws.table(a.table)
    native[1].hp_price_with_budget(R, Km, Kn, pcm, plm, pcn, pln, tp, arr.shape[0], a.T, float(a.N), a.draft,
                                   margin, _cap(a.cap), ws.work_c)
    return ws.chain, ws.admitted, None, None, None


_FORECAST_NP = {"avg": lambda last, mean: (last + mean) * np.float32(0.5), "min": np.minimum,
                "mean": lambda last, mean: mean, "stale": lambda last, mean: last}


def price_skip_arrays(native, margin: float, hysteresis: float, forecast: str, a: Arrays) -> Optional[tuple]:
    """hybrid.price_skip(batch, "sweep", margin, hysteresis, forecast) in C: four sides (current, stale,
    current without the model pass, stale without it), goodput in float64 since each side pays its own
    drafter cost, then the model pass's decision, the free budget and the top-B."""
    ffi, lib = native
    ws = a.workspace(native, 4)
    if ws is None:
        return None
    cm, lm, cn, ln = a.packed
    R, Km, Kn, p = ws.R, ws.Km, ws.Kn, ws.p
    ws.conf_m[0::2], ws.conf_m[1::2] = cm[0], cm[1]
    ws.len_m[0], ws.len_m[1], ws.len_m[2:] = lm[0], lm[1], 0
    last = cn[1]
    if a.mean_ngram_conf is not None:
        last = _FORECAST_NP[forecast](last, a.mean_ngram_conf.astype(np.float32))
    ws.conf_n[0::2], ws.conf_n[1::2] = cn[0], last
    ws.len_n[0::2], ws.len_n[1::2] = ln[0], ln[1]
    full = a.draft
    skip = full - a.model_draft
    ws.draft[:] = (full, full, skip, skip)
    ws.sweep(lib, a.table, a.T, float(a.N), 0.0, float(margin), per_side_draft=True)
    g = ws.best_g
    run_model = bool(g[3] <= g[1] * (1.0 + hysteresis))
    side = 0 if run_model else 2
    budget = int(ws.adm_p[1 if run_model else 3].sum())
    table, tp = ws.table(a.table)
    budget = lib.hs_free_budget(tp, table.shape[0], a.T, budget)
    if a.cap is not None:
        budget = min(budget, max(int(a.cap), 0))
    ws.len_cur[...] = lm[0] if run_model else 0
    lib.hp_finish(R, Km, Kn, p["surv_m"], p["surv_n"], p["len_cur"], p["len_n"],
                  ffi.from_buffer("uint8_t[]", ws.use_p[side]), ffi.from_buffer("int64_t[]", ws.adm_p[side]), budget, 1,
                  p["work"], p["pos"], p["vals"], p["chain"], p["admitted"])
    return ws.chain, ws.admitted, None, run_model, None


def adaptive_arrays(native, a: Arrays) -> Optional[tuple]:
    """adaptive.alloc_adaptive(batch) in C (native/hybrid_price.c: ad_budget from the stale model confidences
    in float64, then the same stable top-B as hybrid-price with every request on its model chain)."""
    ffi, lib = native
    cm, lm = a.packed[0], a.packed[1]
    _, R, K = cm.shape
    key = ("ad", R, K)
    ws = _CONST.get(key)
    if ws is None:
        f32, i64 = np.float32, np.int64
        ws = _CONST[key] = dict(stale=np.empty((R, K), np.float64), conf=np.empty((R, K), f32), len=np.empty(R, i64),
                                surv=np.empty((R, K), f32), cs=np.empty((R, K + 1), f32), work=np.empty(R * K, np.float64),
                                use=np.zeros(R, np.uint8), one=np.ones(R, i64), heap=np.empty(R, i64),
                                pos=np.empty(3 * R, i64), vals=np.empty(R * K, f32), chain=np.empty(R, i64),
                                adm=np.empty(R, i64), none=np.zeros(1, f32))
        ws["p"] = {k: ffi.from_buffer(CTYPES[v.dtype.char], v) for k, v in ws.items()}
    p = ws["p"]
    ws["stale"][...] = cm[1]
    ws["conf"][...] = cm[0]
    ws["len"][...] = lm[0]
    table = _arr(a.table, np.float64)
    budget = lib.ad_budget(R, K, p["stale"], p["len"], ffi.from_buffer("double[]", table), table.shape[0], a.T,
                           float(a.N), a.draft, _cap(a.cap), p["work"])
    lib.ad_survival(R, K, p["conf"], p["len"], p["surv"], p["cs"])
    lib.hp_finish(R, K, 0, p["surv"], p["none"], p["len"], p["len"], p["use"], p["one"], budget, 0, p["heap"],
                  p["pos"], p["vals"], p["chain"], p["adm"])
    return ws["chain"], ws["adm"], None, None, None


@policy_form("adaptive", adaptive.alloc_adaptive, specs=("adaptive",))
def _parse_adaptive(params: List[str]) -> Optional[Callable[[StepBatch], Allocation]]:
    from sim.engine.native import load

    native = load("hybrid_price") if not params else None
    if native is None:
        return None

    def covered(batch: StepBatch) -> bool:
        return (batch.chains[MODEL][0].dtype == torch.float32 and batch.stale_chains[MODEL][0].dtype == torch.float32
                and batch.chains[MODEL][0].shape[1] >= 1 and all(isinstance(t, torch.Tensor) and t.is_cpu for t in (
                    batch.chains[MODEL][0], batch.stale_chains[MODEL][0], batch.chains[MODEL][1])))

    return _form(lambda a: adaptive_arrays(native, a), covered, adaptive.alloc_adaptive, confidences=True)


@policy_form("hybrid-price", hybrid.price_with_budget,
             specs=("hybrid-price", "hybrid-price:sweep", "hybrid-price:margin=0", "hybrid-price:margin=0.37"))
def _parse_hybrid_price(params: List[str]) -> Optional[Callable[[StepBatch], Allocation]]:
    from sim.core.policies.hybrid import parse_hybrid_price
    from sim.engine.native import load

    method, current, margin, _ = parse_hybrid_price(params)
    native = load("hybrid_price") if method == "sweep" and not current else None
    if native is None:
        return None
    return _form(lambda a: price_with_budget_arrays(native, margin, a), _transcribed,
                 lambda batch: hybrid.price_with_budget(batch, "sweep", margin), confidences=True)


@policy_form("hybrid", hybrid.price_skip, specs=("hybrid", "hybrid:forecast=min", "hybrid:hyst=0.2:margin=0.5"))
def _parse_hybrid(params: List[str]) -> Optional[Callable[[StepBatch], Allocation]]:
    from sim.core.policies.hybrid import parse_hybrid
    from sim.engine.native import load

    method, margin, hyst, forecast, _ = parse_hybrid(params)
    native = load("hybrid_price") if method == "sweep" and forecast in _FORECAST_NP else None
    if native is None:
        return None
    return _form(lambda a: price_skip_arrays(native, margin, hyst, forecast, a),
                 lambda batch: _transcribed(batch) and _scalar_costs(batch),
                 lambda batch: hybrid.price_skip(batch, "sweep", margin, hyst, forecast), reads_mean=True,
                 confidences=True)


def tree_arrays(native, margin: float, discount: float, a: Arrays) -> Optional[tuple]:
    """tree.tree_alloc(batch, "sweep", margin, discount): the primary allocation (the current-values sweep,
    hybrid.lambda_sweep on one side), then tree.second_branch (native/hybrid_price.c: tr_primary, torch's
    own float32 sum of the primary's gain for its order, tr_second)."""
    from sim.core.policies.tree import SECANT_MIN

    lib = native[1]
    ws = a.workspace(native, 1)
    if ws is None:
        return None
    ws.conf_m[0], ws.len_m[0], ws.conf_n[0], ws.len_n[0] = (x[0] for x in a.packed)  # the current chains
    ws.sweep(lib, a.table, a.T, float(a.N), a.draft, float(margin), per_side_draft=False)
    R, Km, Kn, p = ws.R, ws.Km, ws.Kn, ws.p
    lib.tr_primary(R, Km, Kn, p["surv_m"], p["surv_n"], p["use_p"], p["adm_p"], p["a_p"])
    gain = float(torch.from_numpy(ws.a_p).sum(-1).sum(-1))  # float32, torch's summation order
    arr, tp = ws.table(a.table)
    lib.tr_second(R, Km, Kn, p["surv_m"], p["surv_n"], p["use_p"], p["adm_p"], p["a_p"], gain, tp, arr.shape[0],
                  a.T, float(a.N), a.draft, float(discount), SECANT_MIN, p["second"])
    adm = ws.adm_p[0]
    chain = np.where(adm > 0, np.where(ws.use_p[0] > 0, CHAIN_NGRAM, CHAIN_MODEL), 0)
    return chain, adm, ws.second, None, None


@policy_form("hybrid-tree", tree.tree_alloc, specs=("hybrid-tree",))
def _parse_tree(params: List[str]) -> Optional[Callable[[StepBatch], Allocation]]:
    from sim.core.policies.hybrid import NGRAM_MARGIN
    from sim.engine.native import load

    method, discount, _ = tree.parse_tree(params)
    native = load("hybrid_price") if method == "sweep" else None
    if native is None:
        return None
    return _form(lambda a: tree_arrays(native, NGRAM_MARGIN, discount, a),
                 lambda batch: _transcribed(batch) and _scalar_costs(batch) and _cpu_table(batch)
                 and batch.verify_cost_ms.dtype == torch.float64,
                 lambda batch: tree.tree_alloc(batch, method, NGRAM_MARGIN, discount), confidences=True)


def _oracle_draft(md: float, nd: float, draft: float) -> np.ndarray:
    """The oracle's drafter cost per set (model, n-gram) = (1,1), (0,1), (1,0), (0,0) [ms, float64], as the
    definition computes them: float32 products of the int64 set flags with the Python costs, summed in
    float32, then float64."""
    key = ("oracle-draft", md, nd, draft)
    out = _CONST.get(key)
    if out is None:
        f32 = np.float32
        use_m = np.array([1, 0, 1, 0], dtype=np.int64)
        use_n = np.array([1, 1, 0, 0], dtype=np.int64)
        out = (use_m.astype(f32) * f32(md) + use_n.astype(f32) * f32(nd)
               + (use_m | use_n).astype(f32) * f32(draft - md - nd)).astype(np.float64)
        if len(_CONST) < 4096:  # a few distinct prices per run (one per batch size); never unbounded
            _CONST[key] = out
    return out


def oracle_arrays(native, a: Arrays) -> tuple:
    """simple.alloc_oracle in C (native/hybrid_price.c: or_alloc): the goodput of every (drafter set, B) in
    float64 as the definition promotes it, the first maximum, the depth-first top-B of the accepted slots."""
    ffi, lib = native
    table = a.true_table if a.true_table is not None else a.table.numpy()
    table = np.ascontiguousarray(table, dtype=np.float64)
    lm, ln = a.packed[1][0], a.packed[3][0]
    R = lm.shape[0]
    K = max(a.packed[0].shape[-1], a.packed[2].shape[-1])
    key = ("oracle", R)
    ws = _CONST.get(key)
    if ws is None:
        ws = _CONST[key] = [np.empty(n, np.int64) for n in (2 * R, R, R, 2)]
    work, chain, adm, ran = ws
    i64 = "int64_t[]"
    fb = ffi.from_buffer
    tm = np.ascontiguousarray(a.true_model_acc, dtype=np.int64)
    tn = np.ascontiguousarray(a.true_ngram_acc, dtype=np.int64)
    draft = _oracle_draft(a.model_draft, a.ngram_draft, a.draft)
    lib.or_alloc(R, K, fb(i64, tm), fb(i64, tn), fb(i64, np.ascontiguousarray(lm)), fb(i64, np.ascontiguousarray(ln)),
                 fb("double[]", table), table.shape[0], a.T, float(a.N), fb("double[]", draft), fb(i64, work),
                 fb(i64, chain), fb(i64, adm), fb(i64, ran))
    return chain, adm, None, bool(ran[0]), bool(ran[1])


@policy_form("oracle", simple.alloc_oracle, specs=("oracle",))
def _parse_oracle(params: List[str]) -> Optional[Callable[[StepBatch], Allocation]]:

    def covered(batch: StepBatch) -> bool:
        truth = batch.true_acc
        return (truth.get(MODEL) is not None
                and _int64_lengths(batch.chains[MODEL][1], batch.chains[NGRAM][1], truth.get(MODEL), truth.get(NGRAM))
                and not any(isinstance(x, torch.Tensor) for x in (batch.draft_cost_ms, batch.price(MODEL),
                                                                  batch.price(NGRAM)))
                and (batch.true_verify_cost_ms if batch.true_verify_cost_ms is not None
                     else batch.verify_cost_ms).dtype == torch.float64)

    from sim.engine.native import load

    native = load("hybrid_price")
    if native is None:
        return None
    return _form(lambda a: oracle_arrays(native, a), covered, simple.alloc_oracle)


_INNER_SHAPES = ((4, 32), (5, 7), (128, 32), (3, 9), (2, 16), (1, 33), (7, 3), (6, 40))


def _inner_checked(native, V: int) -> bool:
    """Whether st_expected's row sums with width V equal torch.sum(surv, 1) bit for bit on random survival
    rows of every shape in _INNER_SHAPES."""
    ffi, lib = native
    rng = np.random.default_rng(20261130)
    for R, K in _INNER_SHAPES:
        conf = (rng.random((R, K)) ** 0.05).astype(np.float32)
        ln = rng.integers(0, K + 1, R).astype(np.int64)
        surv, cs, got = np.empty((R, K), np.float32), np.empty((R, K + 1), np.float32), np.empty(R, np.float32)
        lib.st_expected(R, K, V, ffi.from_buffer("float[]", conf), ffi.from_buffer("int64_t[]", ln),
                        ffi.from_buffer("float[]", surv), ffi.from_buffer("float[]", cs), ffi.from_buffer("float[]", got))
        if not _same_bits(got, torch.from_numpy(surv).sum(1).numpy()):
            return False
    return True


def _inner_sum_width(native) -> Optional[int]:
    """The vector width V with which st_expected's row sums reproduce torch.sum(surv, 1) of float32 survival
    rows bit for bit on this machine (checked once per process, _inner_checked), or None."""
    return _first_width(("inner-width", torch.get_num_threads()), lambda V: _inner_checked(native, V))


def ngram_threshold_arrays(native, threshold: float, a: Arrays) -> Optional[tuple]:
    """simple.alloc_ngram_threshold in C (native/hybrid_price.c: st_expected): the n-gram survivals as
    common.survival computes them and their float32 sum in torch's order, compared with the threshold in
    float32 (torch's wrapped-number rule). None where the C sum does not reproduce torch's here."""
    ffi, lib = native
    V = _inner_sum_width(native)
    if V is None:
        return None
    conf, nl, ml = a.packed[2][0], a.packed[3][0], a.packed[1][0]
    R, K = conf.shape
    key = ("st", R, K)
    ws = _CONST.get(key)
    if ws is None:
        ws = _CONST[key] = [np.empty((R, K), np.float32), np.empty((R, K + 1), np.float32), np.empty(R, np.float32)]
    surv, cs, expected = ws
    fb = ffi.from_buffer
    lib.st_expected(R, K, V, fb("float[]", np.ascontiguousarray(conf)), fb("int64_t[]", np.ascontiguousarray(nl)),
                    fb("float[]", surv), fb("float[]", cs), fb("float[]", expected))
    use = (expected >= np.float32(threshold)) & (nl > 0)
    adm = np.where(use, nl, ml)
    return np.where(adm > 0, np.where(use, CHAIN_NGRAM, CHAIN_MODEL), 0), adm, None, None, None


@policy_form("ngram-threshold", simple.alloc_ngram_threshold, specs=("ngram-threshold", "ngram-threshold:0.5"))
def _parse_ngram_threshold(params: List[str]) -> Optional[Callable[[StepBatch], Allocation]]:
    from sim.core.policies.registry import parse_spec
    from sim.engine.native import load

    native = load("hybrid_price")
    if native is None:
        return None
    t = simple.Threshold(**parse_spec("ngram-threshold", simple.Threshold, params)).t  # the spec is valid
    return _form(lambda a: ngram_threshold_arrays(native, t, a),
                 lambda batch: batch.chains[NGRAM][0].dtype == torch.float32 and batch.chains[NGRAM][0].is_cpu
                 and _int64_lengths(batch.chains[MODEL][1], batch.chains[NGRAM][1]),
                 lambda batch: simple.alloc_ngram_threshold(batch, t), confidences=True)


def _int64_lengths(*ts) -> bool:
    """Whether the chain lengths are CPU int64 tensors (the transcriptions below read them as such)."""
    return all(isinstance(t, torch.Tensor) and t.dtype == torch.int64 and t.is_cpu for t in ts)


def _lengths_form(core: Callable[[np.ndarray, np.ndarray], tuple], definition: Callable[[StepBatch], Allocation]):
    """The fast form of a policy that reads only the chain lengths: core(model_len, ngram_len) -> (chain,
    admitted), integer-only numpy, so it equals the definition exactly; chain NONE where nothing is admitted."""

    def arrays(a: Arrays) -> tuple:
        chain, adm = core(a.packed[1][0], a.packed[3][0])
        adm = np.asarray(adm, dtype=np.int64)
        return np.where(adm > 0, chain, 0), adm, None, None, None

    return _form(arrays, lambda batch: _int64_lengths(batch.chains[MODEL][1], batch.chains[NGRAM][1]), definition)


@policy_form("none", simple.alloc_none, specs=("none",))
def _parse_none(params: List[str]) -> Optional[Callable[[StepBatch], Allocation]]:
    """simple.alloc_none: nothing admitted."""

    return _lengths_form(lambda ml, nl: (0, np.zeros(ml.shape, dtype=np.int64)), simple.alloc_none)


def _fixed_form(which: int):
    def parse(params: List[str]) -> Optional[Callable[[StepBatch], Allocation]]:
        """simple.alloc_fixed: min(K, the chain's length) slots of one chain."""
        from sim.core.settings import parse_text

        k = parse_text(simple.FixedK, "K", params[0], "K")  # the spec is valid (get_policy parsed it first)
        return _lengths_form(lambda ml, nl: (which, np.minimum(ml if which == CHAIN_MODEL else nl, k)),
                             lambda batch: simple.alloc_fixed(batch, k, which))

    return parse


@policy_form("ngram-first", simple.alloc_ngram_first, specs=("ngram-first",))
def _parse_ngram_first(params: List[str]) -> Optional[Callable[[StepBatch], Allocation]]:
    """simple.alloc_ngram_first: the whole n-gram chain where it matched, else the whole model chain."""

    return _lengths_form(lambda ml, nl: (np.where(nl > 0, CHAIN_NGRAM, CHAIN_MODEL), np.where(nl > 0, nl, ml)),
                         simple.alloc_ngram_first)


policy_form("model-fixed", simple.alloc_fixed, specs=("model-fixed:7", "model-fixed:1"))(_fixed_form(CHAIN_MODEL))
policy_form("ngram-fixed", simple.alloc_fixed, specs=("ngram-fixed:32", "ngram-fixed:3"))(_fixed_form(CHAIN_NGRAM))


def sim_form(spec: str) -> Optional[Callable[[StepBatch], Allocation]]:
    """The fast form of the (valid) policy spec, or None when it has none or the definitions are forced."""
    if os.environ.get("HYBRIDSPEC_REFERENCE_POLICIES", "").strip() not in ("", "0"):
        return None
    name, *params = str(spec).strip().split(":")
    form = policy_form_of(name)
    return form.build(params) if form is not None else None


def sim_form_over(spec: str, drafters: tuple) -> Optional[Callable[[StepBatch], Allocation]]:
    """The fast form of the (valid) policy spec over the run's `drafters` (not the default two), or None when its
    family has none (sim.engine.forms.policy_form with drafters=) or the definitions are forced."""
    if os.environ.get("HYBRIDSPEC_REFERENCE_POLICIES", "").strip() not in ("", "0"):
        return None
    name, *params = str(spec).strip().split(":")
    form = policy_form_of(name, over_drafters=True)
    return form.build(params, tuple(drafters)) if form is not None else None
