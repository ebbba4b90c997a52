/* The per-price evaluation of N chains (sim/core/policies/multi.py: ChainsN.evaluate) for the numpy fast form of
 * hybrid / hybrid-price over any drafters (sim/engine/policy_fast_multi.py), which computes everything else
 * (survivals, the float32 sum over requests through torch.sum, goodput, picks, top-B).
 *
 * For each side s, request r and price lam[s, c]: per chain i (in order) l_i = #{j : a_j > lam} (the definition's
 * searchsorted of -lam in -a; rows are non-increasing: the form declines NaN, so a walk over the prices in
 * ascending order moves one pointer down each row), g_i = cs_i[l_i], V_i = g_i - (float)l_i * lam; the kept chain
 * starts at chain 0 and chain i replaces it iff V_i > V_kept + margin (float ops, one IEEE single operation each:
 * compiled with -ffp-contract=off, no fast-math). Writes the kept chain's index, slots and gain [S, R, C].
 */
#include <stdint.h>

/* surv [S, N, R, K] (0 past each chain's length and width), cs [S, N, R, K + 1]; lam [S, C]; order [S, C]: each
 * side's price indices in ascending price order (stable); work [N, C] int64. */
void mp_evaluate(int64_t S, int64_t N, int64_t R, int64_t K, const float *surv, const float *cs, int64_t C,
                 const float *lam, const int64_t *order, float margin, int64_t *choice, int64_t *slots,
                 float *gain, int64_t *work) {
    for (int64_t s = 0; s < S; s++) {
        const float *ls = lam + s * C;
        const int64_t *os = order + s * C;
        for (int64_t r = 0; r < R; r++) {
            for (int64_t i = 0; i < N; i++) {
                const float *a = surv + ((s * N + i) * R + r) * K;
                int64_t n = K, *cnt = work + i * C;
                for (int64_t q = 0; q < C; q++) {
                    int64_t c = os[q];
                    float x = ls[c];
                    while (n > 0 && !(a[n - 1] > x)) n--;
                    cnt[c] = n;
                }
            }
            int64_t base = (s * R + r) * C;
            for (int64_t c = 0; c < C; c++) {
                float x = ls[c];
                int64_t n = work[c];
                float g = cs[((s * N) * R + r) * (K + 1) + n];
                float v = g - (float)n * x;
                int64_t best = 0, bn = n;
                float bg = g;
                for (int64_t i = 1; i < N; i++) {
                    int64_t ni = work[i * C + c];
                    float gi = cs[((s * N + i) * R + r) * (K + 1) + ni];
                    float vi = gi - (float)ni * x;
                    float bar = v + margin;
                    if (vi > bar) {
                        best = i; bn = ni; bg = gi; v = vi;
                    }
                }
                choice[base + c] = best;
                slots[base + c] = bn;
                gain[base + c] = bg;
            }
        }
    }
}
