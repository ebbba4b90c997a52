/* Native forms of sim.policies.hybrid.price_with_budget(batch, "sweep", margin) and
 * sim.policies.adaptive.alloc_adaptive for the simulator (adaptive at the end of the file).
 *
 * The torch function is the definition; this is a transcription of it, op for op, with the same
 * floating-point semantics (compiled with -O2 -ffp-contract=off, no fast-math: every float op is one
 * IEEE single-precision op, as torch's elementwise kernels are):
 *   survival   clamp(conf, 0, 1), cumprod accumulated in double and rounded to float per slot (torch's
 *              CPU cumprod), 0 on slots j >= len;
 *   prefix     cs[0] = 0, cs[l] = sum of the first l survivals, accumulated in double (torch's cumsum);
 *   evaluate   l = #{j : a_j > lam} (searchsorted on -a), V = cs[l] - (float)l * lam, n-gram iff
 *              V_n > V_m + margin; the float32 sum of the chosen gains over requests is NOT done here:
 *              the caller runs torch's own sum on these buffers (its order depends on torch's kernels);
 *   goodput    (gain + N) / ((float)table[clamp(slots + T)] + draft), all float;
 *   pick       first maximum of goodput (coarse stage before fine stage);
 *   top-B      the global stable descending top-B of the chosen chains' current survivals, as a merge
 *              of the per-row (non-increasing) lists, ties to the lower flat index.
 * sim/policies/fast.py drives it; tests/test_policy_fast_forms.py checks it against the definition.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void chain(int64_t rows, int64_t K, const float *conf, const int64_t *len, float *surv, float *cs) {
    for (int64_t r = 0; r < rows; r++) {
        const float *c = conf + r * K;
        float *s = surv + r * K;
        float *p = cs + r * (K + 1);
        int64_t L = len[r];
        double acc = 1.0, sum = 0.0;
        p[0] = 0.0f;
        for (int64_t j = 0; j < K; j++) {
            float x = c[j];
            x = x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x);
            acc *= (double)x;
            float a = (float)acc;
            if (j >= L) a = 0.0f;
            s[j] = a;
            sum += (double)a;
            p[j + 1] = (float)sum;
        }
    }
}

/* Survivals and prefix sums of both chains, S sides stacked: conf_m/len_m [S*R*Km]/[S*R] etc. */
void hp_chains(int64_t SR, int64_t Km, int64_t Kn, const float *conf_m, const int64_t *len_m, const float *conf_n,
               const int64_t *len_n, float *surv_m, float *cs_m, float *surv_n, float *cs_n) {
    chain(SR, Km, conf_m, len_m, surv_m, cs_m);
    chain(SR, Kn, conf_n, len_n, surv_n, cs_n);
}

/* #{j : a_j > lam} for a non-increasing row a[0..K-1]: torch.searchsorted(-a, -lam) (left). */
static inline int64_t count_above(const float *a, int64_t K, float lam) {
    float v = -lam;
    int64_t lo = 0, hi = K;
    while (lo < hi) {
        int64_t mid = (lo + hi) >> 1;
        if (-a[mid] < v) lo = mid + 1; else hi = mid;
    }
    return lo;
}

/* Whether x[0..n-1] is non-increasing with no NaN. */
static int non_increasing(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (x[i] != x[i]) return 0;
        if (i && x[i] > x[i - 1]) return 0;
    }
    return 1;
}

/* Evaluate prices lam [S, C]: use [S, R, C] (0/1), adm [S, R, C], gch [S, R, C] (the chosen chain's gain),
 * slots [S, C] (sum of adm over requests). Where a side's prices are non-increasing (the two-stage grid)
 * and a request's survival rows hold no NaN, the counts #{j : a_j > lam} are found by one walk along the
 * row across the prices instead of a binary search per price: the same counts (the row is non-increasing,
 * so both give the first j with a_j <= lam). */
void hp_eval(int64_t S, int64_t R, int64_t Km, int64_t Kn, const float *surv_m, const float *cs_m,
             const float *surv_n, const float *cs_n, int64_t C, const float *lam, float margin,
             uint8_t *use, int64_t *adm, float *gch, int64_t *slots) {
    for (int64_t s = 0; s < S; s++) {
        int64_t *sl = slots + s * C;
        memset(sl, 0, sizeof(int64_t) * C);
        int sorted_lam = non_increasing(lam + s * C, C);
        for (int64_t r = 0; r < R; r++) {
            const float *am = surv_m + (s * R + r) * Km, *an = surv_n + (s * R + r) * Kn;
            const float *pm = cs_m + (s * R + r) * (Km + 1), *pn = cs_n + (s * R + r) * (Kn + 1);
            int64_t o = (s * R + r) * C;
            int walk = sorted_lam && non_increasing(am, Km) && non_increasing(an, Kn);
            int64_t wm = 0, wn = 0;
            for (int64_t c = 0; c < C; c++) {
                float l = lam[s * C + c];
                int64_t lm, ln;
                if (walk) {
                    while (wm < Km && am[wm] > l) wm++;
                    while (wn < Kn && an[wn] > l) wn++;
                    lm = wm;
                    ln = wn;
                } else {
                    lm = count_above(am, Km, l);
                    ln = count_above(an, Kn, l);
                }
                float gm = pm[lm], gn = pn[ln];
                float tn = (float)ln * l, tm = (float)lm * l;
                float vn = gn - tn, vm = gm - tm;
                float rhs = vm + margin;
                int u = vn > rhs;
                use[o + c] = (uint8_t)u;
                adm[o + c] = u ? ln : lm;
                gch[o + c] = u ? gn : gm;
                sl[c] += u ? ln : lm;
            }
        }
    }
}

/* Goodput g [S, C] of gains [S, C] and slot counts [S, C]; returns nothing, writes g and, per side, the first
 * maximum's index into best [S]. */
void hp_goodput(int64_t S, int64_t C, const float *gain, const int64_t *slots, const double *table, int64_t ntab,
                int64_t T, float N, float draft, float *g, int64_t *best) {
    for (int64_t s = 0; s < S; s++) {
        int64_t b = 0;
        for (int64_t c = 0; c < C; c++) {
            int64_t i = slots[s * C + c] + T;
            i = i < 0 ? 0 : (i > ntab - 1 ? ntab - 1 : i);
            float step = (float)table[i];
            step = step + draft;
            float num = gain[s * C + c] + N;
            float x = num / step;
            g[s * C + c] = x;
            if (x > g[s * C + b]) b = c;
        }
        best[s] = b;
    }
}

/* hp_goodput with a float64 drafter cost per side (hybrid's sides pay different drafters): torch promotes
 * the step time to float64, (double)(float)table[i] + draft[s], and divides the float gain + N by it. */
void hp_goodput_d(int64_t S, int64_t C, const float *gain, const int64_t *slots, const double *table, int64_t ntab,
                  int64_t T, float N, const double *draft, double *g, int64_t *best) {
    for (int64_t s = 0; s < S; s++) {
        int64_t b = 0;
        for (int64_t c = 0; c < C; c++) {
            int64_t i = slots[s * C + c] + T;
            i = i < 0 ? 0 : (i > ntab - 1 ? ntab - 1 : i);
            double step = (double)(float)table[i] + draft[s];
            float num = gain[s * C + c] + N;
            double x = (double)num / step;
            g[s * C + c] = x;
            if (x > g[s * C + b]) b = c;
        }
        best[s] = b;
    }
}

/* hybrid.free_budget: the largest B' >= B with table[T + B'] <= table[clamp(T + B)] (binary search). */
int64_t hs_free_budget(const double *table, int64_t ntab, int64_t T, int64_t budget) {
    int64_t i = budget + T;
    i = i < 0 ? 0 : (i > ntab - 1 ? ntab - 1 : i);
    double cost = table[i];
    int64_t lo = 0, hi = ntab;
    while (lo < hi) {
        int64_t mid = (lo + hi) >> 1;
        if (table[mid] <= cost) lo = mid + 1; else hi = mid;
    }
    int64_t last = lo - 1 - T;
    return last > budget ? last : budget;
}

/* The fine stage's price argument -(u_lo + q * (u_hi - u_lo)) [S, F] around the coarse best [S]. */
void hp_fine_arg(int64_t S, int64_t G, const float *u, const int64_t *best, int64_t F, const float *q, float *out) {
    for (int64_t s = 0; s < S; s++) {
        int64_t b = best[s];
        float lo = u[b - 1 < 0 ? 0 : b - 1], hi = u[b + 1 > G - 1 ? G - 1 : b + 1];
        float d = hi - lo;
        for (int64_t f = 0; f < F; f++) {
            float m = q[f] * d;
            float a = lo + m;
            out[s * F + f] = -a;
        }
    }
}

/* Take, per side, candidate best[s] of (use, adm) [S, R, C] into use_out, adm_out [S, R]. */
void hp_take(int64_t S, int64_t R, int64_t C, const uint8_t *use, const int64_t *adm, const int64_t *best,
             uint8_t *use_out, int64_t *adm_out) {
    for (int64_t s = 0; s < S; s++)
        for (int64_t r = 0; r < R; r++) {
            use_out[s * R + r] = use[(s * R + r) * C + best[s]];
            adm_out[s * R + r] = adm[(s * R + r) * C + best[s]];
        }
}

/* The current side's allocation: chain choice (both prefixes empty -> the better first slot, then model),
 * global stable top-`budget` of the chosen chains' survivals, finish(). chain_out/adm_out [R]. */
void hp_finish(int64_t R, int64_t Km, int64_t Kn, const float *surv_m, const float *surv_n, const int64_t *len_m,
               const int64_t *len_n, const uint8_t *use0, const int64_t *adm0, int64_t budget, int64_t force_ngram,
               int64_t *heap_r, int64_t *pos, int64_t *chain_out, int64_t *adm_out) {
    int64_t W = Km + Kn, n = 0;
    for (int64_t r = 0; r < R; r++) {
        int u = adm0[r] == 0 ? (surv_n[r * Kn] > surv_m[r * Km]) : use0[r];
        if (force_ngram && len_m[r] == 0) u = 1;  /* hybrid: a request without a model chain takes its n-gram chain */
        int64_t K = u ? Kn : Km, L = u ? len_n[r] : len_m[r];
        L = L < 0 ? 0 : (L > K ? K : L);
        chain_out[r] = u ? 2 : 1;
        adm_out[r] = 0;
        pos[r] = 0;
        pos[R + r] = L;  /* row length */
        pos[2 * R + r] = u;
        if (L > 0) heap_r[n++] = r;
    }
    /* key of row r's next slot: (value desc, flat index asc) */
#define VAL(r) ((pos[2 * R + (r)] ? surv_n + (r) * Kn : surv_m + (r) * Km)[pos[(r)]])
#define FLAT(r) ((r) * W + (pos[2 * R + (r)] ? Km : 0) + pos[(r)])
#define BEFORE(a, b) (VAL(a) > VAL(b) || (!(VAL(b) > VAL(a)) && FLAT(a) < FLAT(b)))
/* move heap_r[k] down to its place among the first n entries */
#define SIFT_DOWN(k0) do { int64_t k = (k0); for (;;) { \
        int64_t l = 2 * k + 1, m = k; \
        if (l < n && BEFORE(heap_r[l], heap_r[m])) m = l; \
        if (l + 1 < n && BEFORE(heap_r[l + 1], heap_r[m])) m = l + 1; \
        if (m == k) break; \
        int64_t t = heap_r[k]; heap_r[k] = heap_r[m]; heap_r[m] = t; k = m; } } while (0)
    for (int64_t i = n / 2 - 1; i >= 0; i--) {  /* heapify */
        SIFT_DOWN(i);
    }
    for (int64_t b = 0; b < budget && n > 0; b++) {
        int64_t r = heap_r[0];
        adm_out[r]++;
        pos[r]++;
        if (pos[r] >= pos[R + r]) heap_r[0] = heap_r[--n];
        SIFT_DOWN(0);
    }
#undef SIFT_DOWN
#undef VAL
#undef FLAT
#undef BEFORE
    for (int64_t r = 0; r < R; r++)
        if (adm_out[r] <= 0) chain_out[r] = 0;
}

/* ---- adaptive (sim.policies.adaptive.alloc_adaptive) ---------------------------------------------------
 * Budget from the stale model confidences in float64 (as the definition: survival(dtype=float64) ->
 * sorted descending -> gains = cumsum (double) -> goodput (N + gains[B]) / (table[clamp(B + T)] + draft),
 * B reachable iff B <= #real slots and B <= cap; first maximum); then the stable global top-B of the
 * current float32 survivals. */
void ad_survival(int64_t R, int64_t K, const float *conf, const int64_t *len, float *surv, float *cs) {
    chain(R, K, conf, len, surv, cs);
}

static int cmp_desc(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

int64_t ad_budget(int64_t R, int64_t K, const double *stale_conf, const int64_t *len, const double *table, int64_t ntab,
                  int64_t T, double N, double draft, int64_t cap, double *work) {
    int64_t n = 0;
    for (int64_t r = 0; r < R; r++) {
        double acc = 1.0;
        int64_t L = len[r];
        for (int64_t j = 0; j < K; j++) {
            double x = stale_conf[r * K + j];
            x = x < 0.0 ? 0.0 : (x > 1.0 ? 1.0 : x);
            acc *= x;
            if (j < L) work[n++] = acc;
        }
    }
    qsort(work, (size_t)n, sizeof(double), cmp_desc);
    int64_t M = R * K, best = 0, top = n;
    if (cap >= 0 && cap < top) top = cap;
    double gain = 0.0, bestg = 0.0;
    for (int64_t B = 0; B <= M; B++) {
        if (B > 0 && B <= n) gain += work[B - 1];  /* clamp(min=0): survivals are >= 0 */
        if (B > top) break;                          /* unreachable: -inf, never the first maximum */
        int64_t i = B + T;
        i = i < 0 ? 0 : (i > ntab - 1 ? ntab - 1 : i);
        double step = table[i] + draft;
        double g = (gain + N) / step;
        if (B == 0 || g > bestg) { bestg = g; best = B; }
    }
    return best;
}
