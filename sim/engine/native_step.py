"""The simulator engine's per-step bookkeeping in one native call before the policy and one after it.

Engine._step (sim/engine/engine.py) runs a decode step's bookkeeping -- the drafters' chains, the host-side
history, the Allocation contract, the tables' acceptance, the chain-bounds check, emission and the
history update -- as ~40 small numpy calls, each 1-3 us at batch 4, most of a step. `NativeStep` runs
the same arithmetic in C (sim/engine/native/engine_step.c: es_gather, es_commit), with the same integer
results and the same float operations in the same order, so every step column and every token is the
same bit for bit (tests/test_engine_fast.py runs both paths side by side; tests/test_sim_identity.py
holds both to the recorded digests). The numpy methods stay the definition (each one the native step
transcribes is marked `@transcribed_by(NATIVE_STEP)` where it is defined, sim.engine.forms): the engine runs
them where the library cannot be built, where a subclass (the real engine) overrides a marked method, where the tables or state are not the dtypes transcribed here, with streaming draft tables
(sim.core.drafters.stream: the history is indexed by live slot there), and when HYBRIDSPEC_REFERENCE_ENGINE=1.
"""
from __future__ import annotations

import operator
from typing import NamedTuple, Optional

import numpy as np

from sim.core.drafters.tables import ng_conf_zero_past_length
from sim.engine.api import EngineSteps
from sim.core.scheduler import SMALL

_CTYPES = {np.dtype(np.float32): "float[]", np.dtype(np.float64): "double[]", np.dtype(np.int64): "int64_t[]",
           np.dtype(np.int32): "int32_t[]", np.dtype(np.uint8): "uint8_t[]", np.dtype(np.bool_): "uint8_t[]"}


class Unsupported(Exception):
    """An array is not of the dtype and layout the C transcription reads: the engine keeps the numpy step."""


def _pointer(ffi, cache: dict, a: np.ndarray, dtype):
    """The C pointer of `a`, checked once per array object and kept in `cache` while `a` is that object
    (Unsupported: not a C-contiguous array of `dtype`)."""
    hit = cache.get(id(a))
    if hit is not None and hit[0] is a:
        return hit[1]
    if not isinstance(a, np.ndarray) or a.dtype != np.dtype(dtype) or not a.flags.c_contiguous:
        raise Unsupported(f"{getattr(a, 'dtype', type(a))} where the native code reads {np.dtype(dtype)}")
    p = ffi.from_buffer(_CTYPES[a.dtype], a, require_writable=False)
    cache[id(a)] = (a, p)
    return p


class NativeStep:
    """es_gather / es_commit bound to one engine's tables and state arrays (pointers made once per array
    object and kept while that object is the engine's)."""

    # (attribute of the tables, dtype the C reads)
    TABLES = (("offsets", np.int64), ("out_len", np.int64), ("prompt_len", np.int64), ("m_conf", np.float32),
              ("ng_conf", np.float32), ("ng_len", np.int64), ("tok_offsets", np.int64), ("length_only", np.bool_),
              ("m_acc", np.int64), ("ng_acc", np.int64), ("ng_start", np.int64), ("m_tok", np.int32),
              ("tokens", np.int64))
    STATE = (("pos", np.int64), ("prev_pos", np.int64), ("model_pos", np.int64), ("fresh", np.bool_),
             ("m_conf_sum", np.float64), ("m_conf_cnt", np.int64), ("ng_conf_sum", np.float64),
             ("ng_conf_cnt", np.int64), ("n_steps", np.int64), ("emitted_tokens", np.int64), ("acc_hist", np.int64))

    def __init__(self, engine: EngineSteps, native) -> None:
        self.eng = engine
        self.ffi, self.lib = native
        self._ptrs: dict = {}
        self._bound = None
        self._get_tables = operator.attrgetter(*(k for k, _ in self.TABLES))
        self._get_state = operator.attrgetter(*(k for k, _ in self.STATE))
        # ffi.from_buffer less its per-call type parsing (~1 us of a call's 1.5)
        self._fb = self.ffi._backend.from_buffer
        self._i64, self._f32, self._f64 = (self.ffi.typeof(c) for c in ("int64_t[]", "float[]", "double[]"))
        self.out = np.zeros(10, dtype=np.int64)  # es_commit's bad[3] and sums[6], es_gather's NaN flag
        self.p_bad = self.ffi.from_buffer("int64_t[]", self.out)
        self.p_nan = self.p_bad + 9
        self._bufs: dict = {}
        self._reqs = (None, None)
        self.bind()

    def _ptr(self, a: np.ndarray, dtype):
        return _pointer(self.ffi, self._ptrs, a, dtype)

    def bind(self) -> None:
        """Pointers of the tables' and the engine state's arrays (raises Unsupported on a dtype or layout
        the C does not read). Called every step: one identity check while the arrays are the same objects."""
        eng, tb = self.eng, self.eng.tb
        cur = self._get_tables(tb) + self._get_state(eng)
        if self._bound is not None and all(map(operator.is_, cur, self._bound)):
            return
        nt = len(self.TABLES)
        self.t = {k: self._ptr(a, dt) for (k, dt), a in zip(self.TABLES, cur[:nt])}
        self.s = {k: self._ptr(a, dt) for (k, dt), a in zip(self.STATE, cur[nt:])}
        km, kn = tb.m_conf.shape[1], tb.ng_conf.shape[1]
        if tb.m_tok.shape[1] != km or eng.m_conf_sum.shape[1] != km or eng.ng_conf_sum.shape[1] != kn:
            raise Unsupported("chain widths of the tables and the host history differ")
        self.km, self.kn = km, kn
        self.ntok, self.nemit = len(tb.tokens), len(eng.emitted_tokens)
        b = self.ffi.new("es_bound *")  # the C's view of them (es_bound); self.t and self.s keep them alive
        b.Km, b.Kn, b.ntokens, b.nemitted = km, kn, self.ntok, self.nemit
        b.ng_clean = int(ng_conf_zero_past_length(tb))
        b.whole = int(eng.whole_model_chain)
        for k in ("offsets", "out_len", "prompt_len", "tok_offsets", "m_acc", "ng_acc", "ng_start", "ng_len",
                  "tokens", "length_only", "m_tok", "m_conf", "ng_conf"):
            setattr(b, k, self.t[k])
        for field, k in (("emitted", "emitted_tokens"), ("pos", "pos"), ("prev_pos", "prev_pos"),
                         ("model_pos", "model_pos"), ("n_steps", "n_steps"), ("m_cnt", "m_conf_cnt"),
                         ("n_cnt", "ng_conf_cnt"), ("fresh", "fresh"), ("m_sum", "m_conf_sum"),
                         ("n_sum", "ng_conf_sum"), ("acc_hist", "acc_hist")):
            setattr(b, field, self.s[k])
        b.hist_len = len(eng.acc_hist)
        self._b = b
        self._bound = cur

    def _buffers(self, R: int, reuse: bool) -> tuple:
        """(ints [5, R] int64, floats [R * 2 * (K_m + K_n)] float32, their pointers, views): the step's gathered
        arrays. Fresh every step unless `reuse` (no StepBatch will keep them: Engine.array_form), else one
        set per R, made once (at most one per batch size the run sees)."""
        hit = self._bufs.get(R) if reuse else None
        if hit is not None:
            return hit
        km, kn, fb = self.km, self.kn, self._fb
        ints = np.empty((5, R), dtype=np.int64)  # rows, model len, stale model len, n-gram len, stale n-gram len
        floats = np.empty(R * 2 * (km + kn), dtype=np.float32)  # model conf, stale, n-gram conf, stale
        pi, pf = fb(self._i64, ints), fb(self._f32, floats)
        a = R * km
        conf_m, conf_n = floats[:2 * a].reshape(2, R, km), floats[2 * a:].reshape(2, R, kn)
        chains = dict(model_conf=conf_m[0], model_len=ints[1], ngram_conf=conf_n[0], ngram_len=ints[3])
        stale = (conf_m[1], ints[2], conf_n[1], ints[4])
        out = (pi, pf, chains, stale, ints[0], (conf_m, ints[1:3], conf_n, ints[3:5]), (pf, pi + R, pf + 2 * a, pi + 3 * R))
        if reuse:
            self._bufs[R] = out
        return out

    def gather(self, reqs: np.ndarray, with_mean_ng: bool, reuse: bool = False) -> Gathered:
        """Engine._propose's chains (every drafter's: table reads) and _host_state's host-side history for the
        decoding requests `reqs`
        (Gathered), and the KV context they read, sum of prompt_len + pos. Marks the requests not fresh, as
        _host_history does. The arrays are fresh every step (a StepBatch may keep them) unless `reuse`.
        The caller has called bind() this step."""
        R = len(reqs)
        fb, i64 = self._fb, self._i64
        if reqs is not self._reqs[0]:  # the scheduler hands the same array while the batch is steady
            reqs = np.ascontiguousarray(reqs, dtype=np.int64)
            self._reqs = (reqs, fb(i64, reqs))
        preqs = self._reqs[1]
        pi, pf, chains, stale, rows, packed, ptrs = self._buffers(R, reuse)
        mean = np.empty((R, self.kn), dtype=np.float64) if with_mean_ng else None
        pm = fb(self._f64, mean) if with_mean_ng else self.ffi.NULL
        kv = self.lib.es_gather(R, preqs, self._b, pi, pf, pm, self.p_nan)
        return Gathered(reqs, preqs, rows, pi, chains, stale, mean, int(kv), packed, ptrs, bool(self.out[9]))

    def commit(self, g: Gathered, chain: np.ndarray, adm: np.ndarray, sec, model_ran: bool,
               ngram_ran: bool) -> tuple[list, list]:
        """Engine._admit's contract and slots, _verify, _check_chain_bounds, _emit and _record_drafts for the
        step gathered in `g`. Returns (sums, bad): sums = [verified model, verified n-gram, accepted model,
        accepted n-gram, emitted, requests whose output is now complete]; bad = the first request index of each
        check that failed, else -1
        (admitted beyond a chain, a drafter that did not run, emitted outside a chain or its context)."""
        fb, i64 = self._fb, self._i64
        R = len(g.reqs)
        chain = np.ascontiguousarray(chain, dtype=np.int64)
        adm = np.ascontiguousarray(adm, dtype=np.int64)
        psec = self.ffi.NULL
        if sec is not None:
            sec = np.ascontiguousarray(sec, dtype=np.int64)
            psec = fb(i64, sec)
        written = self.lib.es_commit(R, g.p_reqs, g.p_ints, fb(i64, chain), fb(i64, adm), psec, int(model_ran),
                                     int(ngram_ran), int(self.eng.policy.uses_ngram), self._b, self.p_bad)
        if written < 0:
            raise IndexError("an output slot outside the emitted-token buffer")
        self.eng.n_written += int(written)
        out = self.out.tolist()
        return out[3:9], out[:3]

    def emit_bonus(self, reqs: list) -> None:
        """Engine._emit of one bonus token per request and no drafts (the token a completed prefill samples):
        output[pos] of each request written at its slot, pos += 1. The native step runs only with Engine's own
        _emit and _write (marked NATIVE_STEP, sim.engine.forms), so this is what they do, without their general machinery; request by
        request for the few that complete a prefill in a step (numpy's per-call cost dominates there)."""
        eng, tb = self.eng, self.eng.tb
        if len(reqs) <= SMALL:
            pos, out, tok, off, base = eng.pos, eng.emitted_tokens, tb.tokens, tb.offsets, eng.out_base
            last = len(tok) - 1
            for r in reqs:
                p = int(pos[r])
                i = int(base[r]) + p
                out[int(off[r]) + p] = tok[0 if i < 0 else (last if i > last else i)]  # take(mode="clip")
                pos[r] = p + 1
        else:
            reqs = np.asarray(reqs, dtype=np.int64)
            pos = eng.pos[reqs]
            eng.emitted_tokens[tb.offsets[reqs] + pos] = tb.tokens.take(eng.out_base[reqs] + pos, mode="clip")
            eng.pos[reqs] += 1
        eng.n_written += len(reqs)


class NativeScans:
    """The scheduler's scans over its running requests in C (engine_step.c: es_kv_used, es_split, es_done,
    es_full_need), the same integers as the numpy in sim/core/scheduler.py, which stays the definition (the
    scheduler runs it where `scans` is None: the numpy step, a subclass's engine, HYBRIDSPEC_REFERENCE_ENGINE).
    One call each instead of 5-10 numpy calls and a list conversion: about 30 us a step at a batch of 128."""

    def __init__(self, sched, native) -> None:
        self.ffi, self.lib = native
        self._fb = self.ffi._backend.from_buffer
        self._i64 = self.ffi.typeof("int64_t[]")
        self.sched = sched
        self._ptrs: dict = {}
        self._ptr(sched.prompt_len)  # raises Unsupported now, not mid-run, on arrays the C does not read
        for a in (sched.state.pos, sched.state.prefilled, sched.state.prefill_target, sched.out_len):
            if a is not None:
                self._ptr(a)

    def _ptr(self, a: np.ndarray):
        """The int64_t pointer of a state array `a` (_pointer). The running arrays (views of the scheduler's
        int64 storage, new each step) go by _run."""
        return _pointer(self.ffi, self._ptrs, a, np.int64)

    def _run(self, run: np.ndarray):
        return self._fb(self._i64, run)

    def kv_used(self, run: np.ndarray, extra: int, block: int) -> int:
        s = self.sched
        return int(self.lib.es_kv_used(len(run), self._run(run), self._ptr(s.prompt_len), self._ptr(s.state.pos),
                                       extra, block))

    def split(self, run: np.ndarray) -> tuple[np.ndarray, list]:
        """(decoding ids, [(id, prefill tokens left)] of the others), in running order."""
        st, n = self.sched.state, len(run)
        dec = np.empty(n, dtype=np.int64)
        pre = np.empty(2 * n, dtype=np.int64)
        nd = self.lib.es_split(n, self._run(run), self._ptr(st.prefill_target), self._ptr(st.prefilled),
                               self._fb(self._i64, dec), self._fb(self._i64, pre))
        if nd == n:
            return dec, []
        p = pre[:2 * (n - nd)].tolist()
        return dec[:nd], list(zip(p[::2], p[1::2]))

    def done(self, run: np.ndarray, out_len: np.ndarray) -> list[int]:
        """The finished ids in running order; `run` (writable) keeps the others, in order, at its front."""
        st, n = self.sched.state, len(run)
        done = np.empty(n, dtype=np.int64)
        nd = self.lib.es_done(n, self._run(run), self._ptr(st.pos), self._ptr(out_len), self._ptr(st.prefilled),
                              self._ptr(st.prefill_target), self._fb(self._i64, done))
        return done[:nd].tolist() if nd else []

    def full_need(self, run: np.ndarray, kmax: int, block: int) -> int:
        s = self.sched
        return int(self.lib.es_full_need(len(run), self._run(run), self._ptr(s.prompt_len), self._ptr(s.out_len),
                                         kmax, block))


class Gathered(NamedTuple):
    """One step's gathered arrays (NativeStep.gather): reqs [R] and its pointer; rows [R] (table rows) and
    p_ints, the pointer of the int64 block whose rows are rows, model len, stale model len, n-gram len,
    stale n-gram len; chains (Engine._propose's dict); stale = (model conf, model len, n-gram conf, n-gram
    len) of the host-side history; mean_ng (float64 [R, K_n] or None); kv; packed and ptrs as
    sim.engine.policy_fast.Arrays reads them (current and stale stacked); has_nan: whether a confidence gathered
    (chains or mean) is NaN."""

    reqs: np.ndarray
    p_reqs: object
    rows: np.ndarray
    p_ints: object
    chains: dict
    stale: tuple
    mean_ng: Optional[np.ndarray]
    kv: int
    packed: tuple
    ptrs: tuple
    has_nan: bool


def make_native_step(engine: EngineSteps):
    """A NativeStep for `engine` (where sim.engine.choice.native_step_ok allows it), or None where its library does
    not load or the engine's arrays are not the C's dtypes: the numpy step."""
    from sim.engine.native import load

    native = load("engine_step")
    if native is None:
        return None
    try:
        return NativeStep(engine, native)
    except Unsupported:
        return None
