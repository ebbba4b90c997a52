"""Native (C) forms of policies and of the engine step for the simulator, compiled on first use and cached
on disk (hybrid_price.c: the policy forms, sim/policies/fast.py; engine_step.c: the engine's per-step
bookkeeping, sim/engine_fast.py).

The C source sits next to this file; `load()` compiles it with the system C compiler (`$CC`, else `cc`)
into `<cache dir>/native/<name>-<sha256 of source, flags and compiler>.so` (written atomically, like the
draft-table cache: sim.drafters.cache.cache_dir, HYBRIDSPEC_CACHE_DIR) and opens it with cffi. Where
there is no compiler or no cffi, `load()` returns None and the simulator runs the torch definitions
(slower, same results). Flags: -O2 -ffp-contract=off and no fast-math, so each float operation is one
IEEE single-precision operation, as in torch's elementwise kernels (sim/policies/fast.py).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
FLAGS = ["-O2", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-std=c99"]
CDEF_HYBRID_PRICE = """
void hp_chains(int64_t SR, int64_t Km, int64_t Kn, const float *conf_m, const int64_t *len_m, const float *conf_n,
               const int64_t *len_n, float *surv_m, float *cs_m, float *surv_n, float *cs_n);
void hp_eval(int64_t S, int64_t R, int64_t Km, int64_t Kn, const float *surv_m, const float *cs_m,
             const float *surv_n, const float *cs_n, int64_t C, const float *lam, float margin,
             uint8_t *use, int64_t *adm, float *gch, int64_t *slots);
void hp_goodput(int64_t S, int64_t C, const float *gain, const int64_t *slots, const double *table, int64_t ntab,
                int64_t T, float N, float draft, float *g, int64_t *best);
void hp_fine_arg(int64_t S, int64_t G, const float *u, const int64_t *best, int64_t F, const float *q, float *out);
void hp_take(int64_t S, int64_t R, int64_t C, const uint8_t *use, const int64_t *adm, const int64_t *best,
             uint8_t *use_out, int64_t *adm_out);
void hp_finish(int64_t R, int64_t Km, int64_t Kn, const float *surv_m, const float *surv_n, const int64_t *len_m,
               const int64_t *len_n, const uint8_t *use0, const int64_t *adm0, int64_t budget, int64_t force_ngram,
               int64_t *heap_r, int64_t *pos, int64_t *chain_out, int64_t *adm_out);
void hp_goodput_d(int64_t S, int64_t C, const float *gain, const int64_t *slots, const double *table, int64_t ntab,
                  int64_t T, float N, const double *draft, double *g, int64_t *best);
int64_t hs_free_budget(const double *table, int64_t ntab, int64_t T, int64_t budget);
void ad_survival(int64_t R, int64_t K, const float *conf, const int64_t *len, float *surv, float *cs);
int64_t ad_budget(int64_t R, int64_t K, const double *stale_conf, const int64_t *len, const double *table, int64_t ntab,
                  int64_t T, double N, double draft, int64_t cap, double *work);
"""
CDEF_ENGINE_STEP = """
int64_t es_gather(int64_t R, const int64_t *reqs, int64_t Km, int64_t Kn,
                  const int64_t *offsets, const int64_t *out_len, const int64_t *prompt_len,
                  const float *m_conf, const float *ng_conf, const int64_t *ng_len,
                  const int64_t *pos, const int64_t *prev_pos, const int64_t *model_pos, uint8_t *fresh,
                  const double *m_sum, const int64_t *m_cnt, const double *n_sum, const int64_t *n_cnt,
                  int64_t clean,
                  int64_t *rows, float *model_conf, int64_t *model_len, float *ngram_conf, int64_t *ngram_len,
                  float *stale_m, int64_t *stale_mlen, float *stale_ng, int64_t *stale_nlen, double *mean_ng);
int64_t es_commit(int64_t R, const int64_t *reqs, const int64_t *rows, int64_t Km, int64_t Kn,
                  const int64_t *chain, const int64_t *adm, const int64_t *sec, int64_t model_ran, int64_t ngram_ran,
                  const int64_t *model_len, const int64_t *ngram_len,
                  const int64_t *offsets, const int64_t *out_len, const int64_t *prompt_len,
                  const int64_t *tok_offsets, const uint8_t *length_only,
                  const int64_t *m_acc, const int64_t *ng_acc, const int64_t *ng_start, const int32_t *m_tok,
                  const float *m_conf, const float *ng_conf, const int64_t *ng_len_tab,
                  const int64_t *tokens, int64_t ntokens, int64_t *emitted, int64_t nemitted,
                  int64_t *pos, int64_t *prev_pos, int64_t *model_pos, int64_t *n_steps,
                  double *m_sum, int64_t *m_cnt, double *n_sum, int64_t *n_cnt, int64_t uses_ngram, int64_t clean,
                  int64_t *bad, int64_t *sums);
"""
CDEFS = {"hybrid_price": CDEF_HYBRID_PRICE, "engine_step": CDEF_ENGINE_STEP}
_LIBS: dict = {}


def _compile(src: Path, out: Path, cc: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.stem + ".", suffix=".so.tmp", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run([cc, *FLAGS, "-o", tmp, str(src)], check=True, capture_output=True, timeout=120)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load(name: str = "hybrid_price"):
    """(ffi, lib) of the compiled C source `name`.c, or None where it cannot be built or opened."""
    if name in _LIBS:
        return _LIBS[name]
    lib = None
    try:
        import cffi

        from sim.drafters.cache import cache_dir

        cc = os.environ.get("CC") or "cc"
        if shutil.which(cc) is None:
            raise RuntimeError(f"no C compiler ({cc})")
        src = HERE / f"{name}.c"
        ver = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
        key = hashlib.sha256(src.read_bytes() + " ".join(FLAGS).encode() + ver.encode()).hexdigest()[:24]
        folder = cache_dir() or Path(tempfile.gettempdir()) / "hybridspec"
        so = folder / "native" / f"{name}-{key}.so"
        if not so.exists():
            _compile(src, so, cc)
        ffi = cffi.FFI()
        ffi.cdef(CDEFS[name])
        lib = (ffi, ffi.dlopen(str(so)))
    except Exception as exc:  # noqa: BLE001 -- any failure: the simulator runs the torch definitions
        warnings.warn(f"native policy forms unavailable ({type(exc).__name__}: {exc}); the simulator runs the "
                      "torch definitions (slower, same results)", RuntimeWarning, stacklevel=2)
    _LIBS[name] = lib
    return lib
