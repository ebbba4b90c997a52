/* Native forms of sim.core.policies.hybrid.price_with_budget(batch, "sweep", margin) (and price_skip, and
 * hybrid-tree's primary allocation: hp_sweep), sim.core.policies.adaptive.alloc_adaptive, simple.alloc_oracle,
 * tree.second_branch and simple.alloc_ngram_threshold, for the simulator.
 *
 * The torch function is the definition; this is a transcription of it, op for op, with the same
 * floating-point semantics (compiled with -O2 -ffp-contract=off, no fast-math: every float op is one
 * IEEE single-precision op, as torch's elementwise kernels are):
 *   survival   clamp(conf, 0, 1), cumprod accumulated in double and rounded to float per slot (torch's
 *              CPU cumprod), 0 on slots j >= len;
 *   prefix     cs[0] = 0, cs[l] = sum of the first l survivals, accumulated in double (torch's cumsum);
 *   evaluate   l = #{j : a_j > lam} (searchsorted on -a), V = cs[l] - (float)l * lam, n-gram iff
 *              V_n > V_m + margin;
 *   gain       the float32 sum of the chosen gains over requests in the order of ATen's cascade sum
 *              (hp_sum_requests; the caller checks it against torch.sum on this machine);
 *   goodput    (gain + N) / ((float)table[clamp(slots + T)] + draft), all float;
 *   pick       first maximum of goodput (coarse stage before fine stage);
 *   top-B      the global stable descending top-B of the chosen chains' survivals (ties to the lower flat
 *              index): by selection (select_top), else a merge of the per-row non-increasing lists.
 * The vector-lane code (LANES prices or columns at a time) does the same ops, lane by lane. NaN confidences
 * are not transcribed (sorts, top-k, searchsorted over NaN): the forms decline them and the definitions run.
 * sim/engine/policy_fast.py drives it; tests/test_fast_forms.py checks it against the definitions and
 * tests/test_native_sums.py the sums against torch.sum.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One slot j of a row: clamp, running product in double rounded to float, running sum in double. */
#define CHAIN_SLOT(c, s, p, j, acc, sum) do { \
        float x_ = (c)[j]; \
        x_ = x_ < 0.0f ? 0.0f : (x_ > 1.0f ? 1.0f : x_); \
        (acc) *= (double)x_; \
        float a_ = (float)(acc); \
        (s)[j] = a_; \
        (sum) += (double)a_; \
        (p)[(j) + 1] = (float)(sum); \
    } while (0)

/* Survivals surv [rows, K] and prefix sums cs [rows, K + 1] of `rows` chains: surv_j = clamp(conf_j, 0, 1)
 * multiplied up in double, rounded to float, 0 for j >= len; cs as the module's header. Four rows at a time
 * (independent products and sums, so their latencies overlap), slot by slot while all four are within
 * their lengths. Without NaN (the forms decline NaN confidences) every row is non-increasing: a product of
 * factors in [0, 1], rounded monotonically, never grows. */
static void chain(int64_t rows, int64_t K, const float *conf, const int64_t *len, float *surv, float *cs) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
        int64_t L[4], Lmin = K;
        double acc[4] = {1.0, 1.0, 1.0, 1.0}, sum[4] = {0.0, 0.0, 0.0, 0.0};
        for (int i = 0; i < 4; i++) {
            L[i] = len[r + i] < 0 ? 0 : (len[r + i] > K ? K : len[r + i]);
            Lmin = L[i] < Lmin ? L[i] : Lmin;
            cs[(r + i) * (K + 1)] = 0.0f;
        }
        const float *c0 = conf + r * K, *c1 = c0 + K, *c2 = c1 + K, *c3 = c2 + K;
        float *s0 = surv + r * K, *s1 = s0 + K, *s2 = s1 + K, *s3 = s2 + K;
        float *p0 = cs + r * (K + 1), *p1 = p0 + K + 1, *p2 = p1 + K + 1, *p3 = p2 + K + 1;
        for (int64_t j = 0; j < Lmin; j++) {
            CHAIN_SLOT(c0, s0, p0, j, acc[0], sum[0]);
            CHAIN_SLOT(c1, s1, p1, j, acc[1], sum[1]);
            CHAIN_SLOT(c2, s2, p2, j, acc[2], sum[2]);
            CHAIN_SLOT(c3, s3, p3, j, acc[3], sum[3]);
        }
        for (int i = 0; i < 4; i++) {
            const float *c = conf + (r + i) * K;
            float *sv = surv + (r + i) * K, *p = cs + (r + i) * (K + 1);
            for (int64_t j = Lmin; j < L[i]; j++) CHAIN_SLOT(c, sv, p, j, acc[i], sum[i]);
            /* slots j >= len: survival 0, so the prefix sum stays (sum + 0.0 == sum, and sum is never -0.0);
             * the last sum in a local (else reloaded every slot: sv might alias it) */
            const float last = p[L[i]];
            for (int64_t j = L[i]; j < K; j++) {
                sv[j] = 0.0f;
                p[j + 1] = last;
            }
        }
    }
    for (; r < rows; r++) {
        const float *c = conf + r * K;
        float *sv = surv + r * K, *p = cs + r * (K + 1);
        int64_t L = len[r] < 0 ? 0 : (len[r] > K ? K : len[r]);
        double acc = 1.0, sum = 0.0;
        p[0] = 0.0f;
        for (int64_t j = 0; j < L; j++) CHAIN_SLOT(c, sv, p, j, acc, sum);
        const float last = p[L];
        for (int64_t j = L; j < K; j++) {
            sv[j] = 0.0f;
            p[j + 1] = last;
        }
    }
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

/* LANES prices (or columns) at a time: GCC/clang vector extensions, each lane an IEEE single-precision op as
 * the scalar code (no contraction: -ffp-contract=off). */
#define LANES 8
typedef float vf __attribute__((vector_size(4 * LANES)));
typedef int32_t vi __attribute__((vector_size(4 * LANES)));
#define splat(x) ((vf){(x), (x), (x), (x), (x), (x), (x), (x)})
#define lane_select(k, a, b) (((k) & (a)) | (~(k) & (b)))  /* lane-wise k ? a : b, k a comparison's 0 / -1 */
/* The lane functions get an AVX2 clone (eight lanes in one register) where the compiler and the OS can pick a
 * clone by CPU at load time, and run the default clone (the same lane operations on SSE2) elsewhere; both
 * give the same floats. -DHP_NO_CLONES builds the default alone (HYBRIDSPEC_NATIVE_CFLAGS; the slow test
 * tests/test_fast_forms.py::test_default_clone checks that build). */
#if defined(__x86_64__) && defined(__linux__) && (defined(__clang__) || __GNUC__ >= 6) && !defined(HP_NO_CLONES)
#define LANE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define LANE_CLONES
#endif

/* The threshold rule of one request at LANES prices l, in lanes: l_c = #{j : a_c,j > l} (c = m, n),
 * V_c = cs_c[l_c] - (float)l_c * l, the n-gram chain iff V_n > V_m + margin. The counts are sums of the
 * comparisons over the row's slots j0 <= j < J, plus j0: every slot below j0 exceeds every price of the block
 * (the caller's j0), no slot from J on exceeds any (J = the count at the smallest price). That is
 * searchsorted's count on a non-increasing row without NaN; and since the comparisons hold on a prefix of j,
 * the prefix sum at the count, cs[count], is cs[j + 1] of the last j that compares (cs[j0] if none). Writes
 * the chosen chain's gains to gr[0..n-1] (n <= LANES) and its count times 2 plus the choice (1: the n-gram
 * chain) to code[0..n-1]; the chosen counts to *adm (lanes). */
static inline __attribute__((always_inline)) void rule_lanes(const float *am, int64_t j0m, int64_t Jm,
                                                             const float *an, int64_t j0n, int64_t Jn,
                                                             const float *pm, const float *pn, const vf *lp,
                                                             int64_t n, float margin, float *gr, int32_t *code,
                                                             vi *adm) {
    vf l = *lp;
    vi cm = {0}, cn = {0}, gm = (vi)splat(pm[j0m]), gn = (vi)splat(pn[j0n]);
    cm += (int32_t)j0m;
    cn += (int32_t)j0n;
    for (int64_t j = j0m; j < Jm; j++) {
        vi k = (vi)(splat(am[j]) > l);
        cm -= k;  /* a true lane is -1 */
        gm = lane_select(k, (vi)splat(pm[j + 1]), gm);
    }
    for (int64_t j = j0n; j < Jn; j++) {
        vi k = (vi)(splat(an[j]) > l);
        cn -= k;
        gn = lane_select(k, (vi)splat(pn[j + 1]), gn);
    }
    vf tn = __builtin_convertvector(cn, vf) * l, tm = __builtin_convertvector(cm, vf) * l;
    vf vn = (vf)gn - tn, vm = (vf)gm - tm;
    vf rhs = vm + splat(margin);
    vi u = (vi)(vn > rhs);
    vi gain = lane_select(u, gn, gm);
    *adm = lane_select(u, cn, cm);
    vi cd = *adm + *adm - u;  /* u is 0 or -1 */
    if (n == LANES) {
        memcpy(gr, &gain, sizeof gain);
        memcpy(code, &cd, sizeof cd);
    } else {
        memcpy(gr, &gain, sizeof(float) * n);
        memcpy(code, &cd, sizeof(int32_t) * n);
    }
}

/* Evaluate prices lam [S, C]: gch [S, R, C] (each request's chosen chain's gain), code [S, R, C] (its admitted
 * count times 2 plus the choice, 1 for the n-gram chain) and slots [S, C] (the sum of the admitted counts over
 * requests). LANES prices at a time, request by request (the slot sums stay in a register), by rule_lanes:
 * the survival rows are non-increasing and no price is NaN (chain(); the forms decline NaN confidences).
 * Where a side's prices are non-increasing (the two-stage grid), each block's comparisons are bounded on
 * both sides: j0 = the count at the block's largest price (the previous block's smallest, or a binary search
 * for the first block) and J = the count at its smallest price, found by walking the row on from j0; so a
 * row's slots are compared, in lanes, in the one block whose prices straddle them, and walked over once.
 * Otherwise j0 = 0 and J = the count at the side's smallest price. J [2 R]: work. */
LANE_CLONES
static void eval_prices(int64_t S, int64_t R, int64_t Km, int64_t Kn, const float *surv_m, const float *cs_m,
                        const float *surv_n, const float *cs_n, int64_t C, const float *lam, float margin,
                        float *gch, int32_t *code, int64_t *slots, int64_t *J) {
    for (int64_t s = 0; s < S; s++) {
        const float *ls = lam + s * C;
        const float *sm = surv_m + s * R * Km, *sn = surv_n + s * R * Kn;
        int sorted = non_increasing(ls, C);
        float lo = ls[0];  /* the smallest price */
        for (int64_t c = 1; c < C; c++) lo = ls[c] < lo ? ls[c] : lo;
        for (int64_t r = 0; r < R; r++) {
            /* per chain: sorted, the count at the next block's largest price; else at the smallest price */
            J[2 * r] = count_above(sm + r * Km, Km, sorted ? ls[0] : lo);
            J[2 * r + 1] = count_above(sn + r * Kn, Kn, sorted ? ls[0] : lo);
        }
        for (int64_t c = 0; c < C; c += LANES) {
            int64_t n = C - c < LANES ? C - c : LANES;
            vf l;
            for (int64_t i = 0; i < LANES; i++) l[i] = ls[c + (i < n ? i : n - 1)];
            float lb = l[n - 1];  /* sorted: the block's smallest price */
            vi tot = {0};
            for (int64_t r = 0; r < R; r++) {
                const float *am = sm + r * Km, *an = sn + r * Kn;
                const float *pm = cs_m + (s * R + r) * (Km + 1), *pn = cs_n + (s * R + r) * (Kn + 1);
                float *gr = gch + (s * R + r) * C + c;
                int32_t *cd = code + (s * R + r) * C + c;
                int64_t *w = J + 2 * r;
                vi adm;
                if (sorted) {
                    int64_t j0m = w[0], j0n = w[1], jm = j0m, jn = j0n;
                    while (jm < Km && am[jm] > lb) jm++;
                    while (jn < Kn && an[jn] > lb) jn++;
                    rule_lanes(am, j0m, jm, an, j0n, jn, pm, pn, &l, n, margin, gr, cd, &adm);
                    w[0] = jm;
                    w[1] = jn;
                } else {
                    rule_lanes(am, 0, w[0], an, 0, w[1], pm, pn, &l, n, margin, gr, cd, &adm);
                }
                tot += adm;
            }
            for (int64_t i = 0; i < n; i++) slots[s * C + c + i] = tot[i];
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

/* The k-th largest (0-based) of a[0..n-1], no NaN; reorders a (Hoare's find, median-of-three pivot). */
static float kth_largest(float *a, int64_t n, int64_t k) {
    int64_t l = 0, m = n - 1;
    while (l < m) {
        float p = a[l], q = a[(l + m) / 2], z = a[m];
        float x = p > q ? (q > z ? q : (p > z ? z : p)) : (p > z ? p : (q > z ? z : q));
        int64_t i = l, j = m;
        do {
            while (a[i] > x) i++;
            while (x > a[j]) j--;
            if (i <= j) {
                float t = a[i];
                a[i] = a[j];
                a[j] = t;
                i++;
                j--;
            }
        } while (i <= j);
        if (j < k) l = i;
        if (k < i) m = j;
    }
    return a[k];
}

/* hp_finish's stable top-`budget` by selection, where every chosen row is non-increasing with no NaN: the
 * budget-th largest value t, then each row's slots > t, then, row by row while the budget lasts, its slots
 * == t. That is the merge's answer: it takes slots by value, equal values to the lower flat index (the
 * earlier row; within a row, equal values are contiguous). O(R K) instead of O(budget log R). Returns 0,
 * having written nothing, where a row is not so (the heap merge then runs). pos as hp_finish's. */
static int select_top(int64_t R, int64_t Km, int64_t Kn, const float *surv_m, const float *surv_n,
                      const int64_t *pos, int64_t budget, float *vals, int64_t *adm_out) {
#define ROW(r) (pos[2 * R + (r)] ? surv_n + (r) * Kn : surv_m + (r) * Km)  /* row r's chosen chain */
    int64_t n = 0;
    for (int64_t r = 0; r < R; r++) {
        const float *row = ROW(r);
        int64_t L = pos[R + r];
        if (!non_increasing(row, L)) return 0;
        memcpy(vals + n, row, sizeof(float) * L);
        n += L;
    }
    if (budget <= 0) return 1;
    if (budget >= n) {
        for (int64_t r = 0; r < R; r++) adm_out[r] = pos[R + r];
        return 1;
    }
    float t = kth_largest(vals, n, budget - 1);
    int64_t left = budget;
    for (int64_t r = 0; r < R; r++) {
        const float *row = ROW(r);
        int64_t L = pos[R + r], j = 0;
        while (j < L && row[j] > t) j++;
        adm_out[r] = j;
        left -= j;
    }
    for (int64_t r = 0; r < R && left > 0; r++) {
        const float *row = ROW(r);
        int64_t L = pos[R + r], j = adm_out[r];
        while (j < L && left > 0 && row[j] == t) {
            j++;
            left--;
        }
        adm_out[r] = j;
    }
    return 1;
#undef ROW
}

/* hp_finish's stable top-`budget` by merging the rows with a heap of their next slots (heap_r [n] holds the
 * rows with slots; pos as hp_finish's, advanced): what select_top gives where it applies, and the answer for
 * any rows. */
static void merge_top(int64_t R, int64_t Km, int64_t Kn, const float *surv_m, const float *surv_n, int64_t *pos,
                      int64_t *heap_r, int64_t n, int64_t budget, int64_t *adm_out) {
    int64_t W = Km + Kn;
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
}

/* The current side's allocation: chain choice (both prefixes empty -> the better first slot, then model;
 * force_ngram: a request whose model chain is empty takes its n-gram chain),
 * global stable top-`budget` of the chosen chains' survivals (select_top, else a merge of the rows by a heap),
 * finish(). chain_out/adm_out [R]; work buffers heap_r [R], pos [3 R], vals [R max(Km, Kn)]. */
void hp_finish(int64_t R, int64_t Km, int64_t Kn, const float *surv_m, const float *surv_n, const int64_t *len_m,
               const int64_t *len_n, const uint8_t *use0, const int64_t *adm0, int64_t budget, int64_t force_ngram,
               int64_t *heap_r, int64_t *pos, float *vals, int64_t *chain_out, int64_t *adm_out) {
    int64_t n = 0;
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
    if (!select_top(R, Km, Kn, surv_m, surv_n, pos, budget, vals, adm_out))
        merge_top(R, Km, Kn, surv_m, surv_n, pos, heap_r, n, budget, adm_out);
    for (int64_t r = 0; r < R; r++)
        if (adm_out[r] <= 0) chain_out[r] = 0;
}

/* ---- torch's float32 sum over requests, and the whole sweep in one call ---------------------------------
 * torch.sum(gch, dim=1) of a contiguous float32 [S, R, C] runs ATen's cascade sum (SumKernel.cpp) with the
 * reduced dimension R strided and the C columns contiguous. Each column's R values are summed by one of
 * two orders, chosen by the column's place among the vector lanes (V = floats per vector register):
 *   cascade  (columns in the leading whole blocks of 4 V; all columns in blocks of 4 when C < V): a running
 *            float sum over chunks of 16 rows (2^max(4, ceil(log2 R) / 4) rows), each chunk's sum carried
 *            up three levels of accumulators, which are added at the end;
 *   ilp4     (the other columns): four cascades over rows r = 4 i + k (k = 0..3, i < R / 4), the R mod 4
 *            last rows added to the first, then the four added in order;
 * and the output is 0 + that sum. Which order a column gets depends on V (8 with AVX2, 16 with AVX512):
 * the caller passes V and checks this against torch.sum on random data once per shape
 * (sim/engine/policy_fast.py, _sum_width); where they differ it runs the torch definition. */
static int64_t ceil_log2(int64_t x) {
    if (x <= 2) return 1;
    int64_t b = 0;
    for (uint64_t v = (uint64_t)(x - 1); v; v >>= 1) b++;
    return b;
}

static float cascade(const float *x, int64_t stride, int64_t n) {
    int64_t power = ceil_log2(n) / 4;
    if (power < 4) power = 4;
    int64_t step = (int64_t)1 << power, mask = step - 1, i = 0;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    while (i + step <= n) {
        for (int64_t j = 0; j < step; j++, i++) acc[0] += x[i * stride];
        for (int64_t j = 1; j < 4; j++) {
            acc[j] += acc[j - 1];
            acc[j - 1] = 0.0f;
            if ((i & (mask << (j * power))) != 0) break;
        }
    }
    for (; i < n; i++) acc[0] += x[i * stride];
    for (int64_t j = 1; j < 4; j++) acc[0] += acc[j];
    return acc[0];
}

static float ilp4(const float *x, int64_t stride, int64_t n) {
    int64_t m = n / 4;
    float p[4];
    for (int64_t k = 0; k < 4; k++) p[k] = cascade(x + k * stride, 4 * stride, m);
    for (int64_t i = 4 * m; i < n; i++) p[0] += x[i * stride];
    for (int64_t k = 1; k < 4; k++) p[0] += p[k];
    return p[0];
}

/* cascade and ilp4 over LANES adjacent columns at once (x[i * stride + 0 .. LANES - 1]): each lane the same
 * float additions in the same order as the scalar functions on its column. */
#define ADD_LANES(acc, x) do { vf v_; memcpy(&v_, (x), sizeof v_); (acc) += v_; } while (0)

static inline __attribute__((always_inline)) void cascade_lanes(const float *x, int64_t stride, int64_t n,
                                                                vf *out) {
    int64_t power = ceil_log2(n) / 4;
    if (power < 4) power = 4;
    int64_t step = (int64_t)1 << power, mask = step - 1, i = 0;
    vf acc[4] = {splat(0.0f), splat(0.0f), splat(0.0f), splat(0.0f)};
    while (i + step <= n) {
        for (int64_t j = 0; j < step; j++, i++) ADD_LANES(acc[0], x + i * stride);
        for (int64_t j = 1; j < 4; j++) {
            acc[j] += acc[j - 1];
            acc[j - 1] = splat(0.0f);
            if ((i & (mask << (j * power))) != 0) break;
        }
    }
    for (; i < n; i++) ADD_LANES(acc[0], x + i * stride);
    for (int64_t j = 1; j < 4; j++) acc[0] += acc[j];
    *out = acc[0];
}

static inline __attribute__((always_inline)) void ilp4_lanes(const float *x, int64_t stride, int64_t n, vf *out) {
    int64_t m = n / 4;
    vf p[4];
    for (int64_t k = 0; k < 4; k++) cascade_lanes(x + k * stride, 4 * stride, m, p + k);
    for (int64_t i = 4 * m; i < n; i++) ADD_LANES(p[0], x + i * stride);
    for (int64_t k = 1; k < 4; k++) p[0] += p[k];
    *out = p[0];
}

LANE_CLONES
void hp_sum_requests(int64_t S, int64_t R, int64_t C, int64_t V, const float *x, float *out) {
    int64_t lead = C >= V ? (C / (4 * V)) * 4 * V : (C / 4) * 4;
    for (int64_t s = 0; s < S; s++) {
        int64_t c = 0;
        /* whole blocks of LANES columns of one order (lead splits no block), then column by column */
        for (; c + LANES <= C && (c + LANES <= lead || c >= lead); c += LANES) {
            const float *col = x + s * R * C + c;
            vf sum;
            if (c < lead) cascade_lanes(col, C, R, &sum);
            else ilp4_lanes(col, C, R, &sum);
            sum = splat(0.0f) + sum;
            memcpy(out + s * C + c, &sum, sizeof sum);
        }
        for (; c < C; c++) {
            const float *col = x + s * R * C + c;
            out[s * C + c] = 0.0f + (c < lead ? cascade(col, C, R) : ilp4(col, C, R));
        }
    }
}

/* hybrid.lambda_sweep over S sides in one call: survivals and prefix sums (chain), then either the exact
 * sweep (exact != 0: every survival of the side and 0 as the price, C = R (Km + Kn) + 1) or the two-stage
 * grid (the coarse prices grid [G] on every side; then the fine prices fine[best coarse] [F]; the fine pick
 * replaces the coarse one only where its goodput is strictly greater: the first maximum over both stages).
 * Goodput in float (draft_d NULL: one drafter cost `draft`) or in double (draft_d [S]: a cost per side, as
 * hp_goodput_d). Leaves the pick's (use, admitted) per side in use_p, adm_p [S, R] and its goodput in
 * best_g [S]. Buffers: surv_m/cs_m [S, R, Km]/[S, R, Km + 1], surv_n/cs_n likewise; lam [S, Cmax]; gch, code
 * [S, R, Cmax]; J [2 R]; slots, gain, g (float goodput), gd (double goodput) [S, Cmax]; best
 * [S]; Cmax = max(R (Km + Kn) + 1 if exact, G, F). */
void hp_sweep(int64_t S, int64_t R, int64_t Km, int64_t Kn, const float *conf_m, const int64_t *len_m,
              const float *conf_n, const int64_t *len_n, const double *table, int64_t ntab, int64_t T, float N,
              float draft, const double *draft_d, float margin, int64_t exact, int64_t V, const float *grid,
              int64_t G, const float *fine, int64_t F, float *surv_m, float *cs_m, float *surv_n, float *cs_n,
              float *lam, float *gch, int32_t *code, int64_t *slots, float *gain, float *g,
              double *gd, int64_t *best, uint8_t *use_p, int64_t *adm_p, double *best_g, int64_t *J) {
    chain(S * R, Km, conf_m, len_m, surv_m, cs_m);
    chain(S * R, Kn, conf_n, len_n, surv_n, cs_n);
    int64_t C;
    if (exact) {
        C = R * (Km + Kn) + 1;
        for (int64_t s = 0; s < S; s++) {
            float *l = lam + s * C;
            for (int64_t r = 0; r < R; r++) {
                memcpy(l, surv_m + (s * R + r) * Km, sizeof(float) * Km);
                memcpy(l + Km, surv_n + (s * R + r) * Kn, sizeof(float) * Kn);
                l += Km + Kn;
            }
            *l = 0.0f;
        }
    } else {
        C = G;
        for (int64_t s = 0; s < S; s++) memcpy(lam + s * C, grid, sizeof(float) * G);
    }
    for (int stage = 0; stage < (exact ? 1 : 2); stage++) {
        if (stage == 1) {  /* the fine prices around each side's coarse best */
            C = F;
            for (int64_t s = 0; s < S; s++) memcpy(lam + s * C, fine + best[s] * F, sizeof(float) * F);
        }
        eval_prices(S, R, Km, Kn, surv_m, cs_m, surv_n, cs_n, C, lam, margin, gch, code, slots, J);
        hp_sum_requests(S, R, C, V, gch, gain);
        if (draft_d) hp_goodput_d(S, C, gain, slots, table, ntab, T, N, draft_d, gd, best);
        else hp_goodput(S, C, gain, slots, table, ntab, T, N, draft, g, best);
        for (int64_t s = 0; s < S; s++) {
            double x = draft_d ? gd[s * C + best[s]] : (double)g[s * C + best[s]];
            if (stage == 1 && !(x > best_g[s])) continue;
            best_g[s] = x;
            for (int64_t r = 0; r < R; r++) {  /* the picked price's rule */
                int32_t cd = code[(s * R + r) * C + best[s]];
                adm_p[s * R + r] = cd >> 1;
                use_p[s * R + r] = (uint8_t)(cd & 1);
            }
        }
    }
}

/* hp_price_with_budget's workspace: hp_sweep's and hp_finish's buffers and constants, the same every call (one
 * pointer instead of 27 arguments: an ABI-mode foreign call converts and classifies each argument each time). */
typedef struct {
    int64_t exact, V, G, F;
    const float *grid, *fine;
    float *surv_m, *cs_m, *surv_n, *cs_n, *lam, *gch, *gain, *g, *vals;
    int32_t *code;
    int64_t *slots, *best, *adm_p, *J, *heap_r, *pos, *chain_out, *adm_out;
    double *gd, *best_g;
    uint8_t *use_p;
} hp_work;

/* hybrid.price_with_budget(batch, "sweep", margin) in one call: hp_sweep over the two sides (0 current,
 * 1 stale; draft: one drafter cost), the budget = the stale pick's admitted total, capped at cap (cap < 0:
 * no cap; a negative cap is the caller's max(cap, 0)), then hp_finish on the current side into w->chain_out,
 * w->adm_out [R]. Buffers (w) as hp_sweep's and hp_finish's. */
void hp_price_with_budget(int64_t R, int64_t Km, int64_t Kn, const float *conf_m, const int64_t *len_m,
                          const float *conf_n, const int64_t *len_n, const double *table, int64_t ntab, int64_t T,
                          float N, float draft, float margin, int64_t cap, const hp_work *w) {
    hp_sweep(2, R, Km, Kn, conf_m, len_m, conf_n, len_n, table, ntab, T, N, draft, 0, margin, w->exact, w->V,
             w->grid, w->G, w->fine, w->F, w->surv_m, w->cs_m, w->surv_n, w->cs_n, w->lam, w->gch, w->code, w->slots,
             w->gain, w->g, w->gd, w->best, w->use_p, w->adm_p, w->best_g, w->J);
    int64_t budget = 0;
    for (int64_t r = 0; r < R; r++) budget += w->adm_p[R + r];
    if (cap >= 0 && cap < budget) budget = cap;
    /* force_ngram: a request without a model chain takes its n-gram chain (hybrid.allocate_chosen, every hybrid) */
    hp_finish(R, Km, Kn, w->surv_m, w->surv_n, len_m, len_n, w->use_p, w->adm_p, budget, 1, w->heap_r, w->pos,
              w->vals, w->chain_out, w->adm_out);
}

/* ---- adaptive (sim.core.policies.adaptive.alloc_adaptive) ---------------------------------------------------
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

/* ---- oracle (sim.core.policies.simple.alloc_oracle) ---------------------------------------------------------
 * acc_m = min(true model acc, model len), acc_n likewise; for the drafter sets s = (model, n-gram) in
 * (1,1), (0,1), (1,0), (0,0): A_s[r] = max(m acc_m[r], n acc_n[r]) and, for B = 0 .. R K, the goodput
 * (B + N) / (table[clamp(B + T)] + draft[s]) in double, -inf where B > sum_r A_s[r]; the first maximum over
 * (s, B) (a NaN, as numpy's argmax, wins at its first place); each request's chain (the n-gram one where
 * acc_n > acc_m and the set runs it, or where the set runs no model); the top-B of the accepted slots
 * depth-first (slot j of every request, in request order, before slot j + 1 of any). draft[4]: the sets'
 * drafter costs as the caller rounded them. work [2 R]; ran[2]: whether each drafter runs. */
void or_alloc(int64_t R, int64_t K, const int64_t *true_m, const int64_t *true_n, const int64_t *len_m,
              const int64_t *len_n, const double *table, int64_t ntab, int64_t T, double N, const double *draft,
              int64_t *work, int64_t *chain_out, int64_t *adm_out, int64_t *ran) {
    static const int64_t um[4] = {1, 0, 1, 0}, un[4] = {1, 1, 0, 0};
    int64_t *am = work, *an = work + R;
    for (int64_t r = 0; r < R; r++) {
        am[r] = true_m[r] < len_m[r] ? true_m[r] : len_m[r];
        an[r] = true_n[r] < len_n[r] ? true_n[r] : len_n[r];
    }
    double best = 0.0;
    int64_t bs = 0, bb = 0, found = 0;
    for (int64_t s = 0; s < 4 && found < 2; s++) {
        int64_t A = 0;
        for (int64_t r = 0; r < R; r++) {
            int64_t x = am[r] * um[s], y = an[r] * un[s];
            A += x > y ? x : y;
        }
        for (int64_t B = 0; B <= R * K; B++) {
            double g;
            if (B > A) {
                g = -1.0 / 0.0;
            } else {
                int64_t i = B + T;
                i = i < 0 ? 0 : (i > ntab - 1 ? ntab - 1 : i);
                g = ((double)B + N) / (table[i] + draft[s]);
            }
            if (g != g) {  /* numpy's argmax stops at the first NaN */
                bs = s, bb = B, found = 2;
                break;
            }
            if (!found || g > best) {
                best = g, bs = s, bb = B, found = 1;
            }
        }
    }
    int64_t left = bb;
    for (int64_t r = 0; r < R; r++) {
        int64_t x = am[r] * um[bs], y = an[r] * un[bs];
        int u = (an[r] > am[r] && un[bs] > 0) || um[bs] == 0;
        chain_out[r] = u ? 2 : 1;
        adm_out[r] = 0;
        work[r] = x > y ? x : y;  /* the request's accepted slots under the chosen set */
    }
    for (int64_t j = 0; j < K && left > 0; j++)
        for (int64_t r = 0; r < R && left > 0; r++)
            if (j < work[r]) {
                adm_out[r]++;
                left--;
            }
    for (int64_t r = 0; r < R; r++)
        if (adm_out[r] <= 0) chain_out[r] = 0;
    ran[0] = um[bs] > 0;
    ran[1] = un[bs] > 0;
}

/* ---- hybrid-tree's second branch (sim.core.policies.tree.second_branch) --------------------------------------
 * Rows padded to K = max(Km, Kn) with 0: the primary chain's survivals surv_p (the n-gram chain where
 * use[r], else the model chain), the other chain's surv_s. tr_primary writes a_p[r, j] = surv_p[r, j] on
 * the admitted slots j < adm[r], else 0 (the caller sums it with torch's own sum: its order). tr_second,
 * given that float32 sum `gain`: total = sum adm, g = (gain + N) / (verify(total) + draft), w = max(total / 2,
 * secant_min), lam = g * (verify(total + w) - verify(total)) / w (the difference in double, then float), and
 * per request the leading run of slots with surv_s (1 - a_p) discount > lam, 0 where nothing is admitted.
 * Float32 operations in the definition's order; verify(x) = table[clamp(x + T)]. */
void tr_primary(int64_t R, int64_t Km, int64_t Kn, const float *surv_m, const float *surv_n, const uint8_t *use,
                const int64_t *adm, float *a_p) {
    int64_t K = Km > Kn ? Km : Kn;
    for (int64_t r = 0; r < R; r++) {
        const float *p = use[r] ? surv_n + r * Kn : surv_m + r * Km;
        int64_t w = use[r] ? Kn : Km;
        for (int64_t j = 0; j < K; j++) a_p[r * K + j] = (j < adm[r] && j < w) ? p[j] : 0.0f;
    }
}

void tr_second(int64_t R, int64_t Km, int64_t Kn, const float *surv_m, const float *surv_n, const uint8_t *use,
               const int64_t *adm, const float *a_p, float gain, const double *table, int64_t ntab, int64_t T,
               float N, float draft, float discount, int64_t secant_min, int64_t *second) {
    int64_t K = Km > Kn ? Km : Kn, total = 0;
    for (int64_t r = 0; r < R; r++) total += adm[r];
#define VERIFY(x) table[((x) + T) < 0 ? 0 : (((x) + T) > ntab - 1 ? ntab - 1 : ((x) + T))]
    float den = (float)VERIFY(total) + draft;
    float g = (gain + N) / den;
    int64_t w = total / 2 > secant_min ? total / 2 : secant_min;
    float lam = g * (float)(VERIFY(total + w) - VERIFY(total));
    lam = lam / (float)w;
#undef VERIFY
    for (int64_t r = 0; r < R; r++) {
        const float *p = use[r] ? surv_m + r * Km : surv_n + r * Kn;
        int64_t ws = use[r] ? Km : Kn, n = 0;
        for (int64_t j = 0; j < K; j++) {
            float s = j < ws ? p[j] : 0.0f;
            float v = s * (1.0f - a_p[r * K + j]);
            v = v * discount;
            if (!(v > lam)) break;
            n++;
        }
        second[r] = adm[r] > 0 ? n : 0;
    }
}

/* ---- ngram-threshold (sim.core.policies.simple.alloc_ngram_threshold) ------------------------------------
 * expected[r] = torch.sum(survival(conf, len), dim=1): the survivals as chain() computes them, summed along
 * the contiguous row as ATen's cascade sum does an inner reduction: with K >= V (V floats per vector), the
 * K / V whole vectors summed lane by lane by ilp4 (four cascades over vectors v = 4 i + k), then 0 + the
 * K mod V tail elements + the V lanes, in order; with K < V, ilp4 over the row. The caller checks this
 * against torch.sum once per process (sim/engine/policy_fast.py). out[r] = 0 + that sum. */
void st_expected(int64_t R, int64_t K, int64_t V, const float *conf, const int64_t *len, float *surv, float *cs,
                 float *out) {
    chain(R, K, conf, len, surv, cs);
    for (int64_t r = 0; r < R; r++) {
        const float *x = surv + r * K;
        float acc;
        if (K < V) {
            acc = ilp4(x, 1, K);
        } else {
            int64_t nv = K / V;
            acc = 0.0f;
            for (int64_t k = nv * V; k < K; k++) acc += x[k];
            for (int64_t l = 0; l < V; l++) acc += ilp4(x + l, V, nv);
        }
        out[r] = 0.0f + acc;
    }
}
