/* The simulator engine's per-step bookkeeping (sim/engine/engine.py), in C: one call before the policy
 * (es_gather: the drafters' chains, the host-side history, the step's KV context) and one after it
 * (es_commit: the Allocation contract, the tables' acceptance, the chain-bounds check, emission, the
 * history update). A transcription of Engine._propose, _build_batch/_host_history, _admit, _verify,
 * _check_chain_bounds, _emit and _record_drafts (the numpy methods stay the definition, and run where
 * this library is unavailable or a subclass overrides a hook): the same integers, and the same float
 * operations in the same order -- float64 sums of float32 confidences, float64 means rounded once to
 * float32 where the numpy code assigns them into a float32 array. Compiled like the policy forms
 * (-O2 -ffp-contract=off, no fast-math; sim/engine/native/__init__.py). sim/engine/native_step.py drives it;
 * tests/test_engine_fast.py runs both paths and compares every step column and every emitted token.
 *
 * Shapes: R decoding requests reqs[R] (distinct); Km, Kn the model / n-gram chain widths; table rows
 * of request r are offsets[r] .. offsets[r + 1] - 1 (one per output position).
 */
#include <stdint.h>

/* The engine's tables and state arrays, bound once (sim/engine/native_step.py, NativeStep.bind): the C pointers of
 * the arrays es_gather and es_commit read and write, the chain widths, the token buffers' lengths, and
 * ng_clean: whether every n-gram confidence past its chain's length is +0.0, bit for bit (then the n-gram
 * rows are read up to their length only: see NG_ROW). */
typedef struct {
    int64_t Km, Kn, ntokens, nemitted, ng_clean, whole;
    const int64_t *offsets, *out_len, *prompt_len, *tok_offsets, *m_acc, *ng_acc, *ng_start, *ng_len, *tokens;
    const uint8_t *length_only;
    const int32_t *m_tok;
    const float *m_conf, *ng_conf;
    int64_t *emitted, *pos, *prev_pos, *model_pos, *n_steps, *m_cnt, *n_cnt;
    uint8_t *fresh;
    double *m_sum, *n_sum;
    int64_t *acc_hist;  /* drafts (request-steps verifying >= 1 draft token) by accepted length, hist_len bins */
    int64_t hist_len;
} es_bound;

/* The slots of an n-gram row of chain length len that are read: up to the length (clamped to [0, Kn]) where
 * ng_clean (the rest are +0.0), else all Kn. */
static inline int64_t ng_span(int64_t len, int64_t Kn, int64_t ng_clean) {
    return ng_clean ? (len < 0 ? 0 : (len > Kn ? Kn : len)) : Kn;
}

/* Per request k (r = reqs[k], at output position pos[r], table row rows[k] = offsets[r] + pos[r]):
 *   model_conf[k] = m_conf[row], model_len[k] = min(Km, out_len[r] - pos[r]) (Km where `whole`: vLLM's
 *   drafter does not know the output's end),
 *   ngram_conf[k] = ng_conf[row], ngram_len[k] = ng_len[row]                        (_propose)
 *   stale rows: srow = offsets[r] + prev_pos[r], mrow = offsets[r] + model_pos[r]
 *   stale_m[k] = m_conf[mrow]; where model_pos != prev_pos and the request has drafted before, the mean
 *   of its model chains, m_sum / m_cnt (float64, rounded to float32); 1.0 when fresh (then fresh = 0);
 *   stale_mlen[k] = min(Km, out_len[r] - model_pos[r]) (Km where `whole`); stale_ng[k] = ng_conf[srow],
 *   stale_nlen[k] = ng_len[srow]                                          (_build_batch/_host_history)
 *   mean_ng[k] (when mean_ng is not NULL): n_sum / n_cnt where the request has n-gram history, else the
 *   previous proposal ng_conf[srow] times (slot < ng_len[srow]), as float64. (The numpy step skips that mask
 *   where the tables hold 0 past every chain's length; masking anyway gives the same floats there, since a
 *   signed zero times 0.0f is itself, so this step masks always.)
 *   Where ng_clean (+0.0 past every n-gram chain's length, bit for bit), the n-gram rows are read up to their
 *   length and the rest written as +0.0: the same floats without reading them (NG_ROW).
 * The gathered arrays: ints [5, R] = rows, model_len, stale_mlen, ngram_len, stale_nlen; floats =
 * model_conf [R, Km], stale_m [R, Km], ngram_conf [R, Kn], stale_ng [R, Kn]; mean_ng [R, Kn] or NULL.
 * *nan_out: whether any confidence gathered (current, stale, mean) is NaN (the policy forms decline those).
 * Returns the KV context the decoding requests read: sum over k of prompt_len[r] + pos[r]. */
int64_t es_gather(int64_t R, const int64_t *reqs, const es_bound *b, int64_t *ints, float *floats, double *mean_ng,
                  int64_t *nan_out) {
    const int64_t Km = b->Km, Kn = b->Kn;
    const int64_t *offsets = b->offsets, *out_len = b->out_len, *prompt_len = b->prompt_len, *ng_len = b->ng_len;
    const float *m_conf = b->m_conf, *ng_conf = b->ng_conf;
    const int64_t *pos = b->pos, *prev_pos = b->prev_pos, *model_pos = b->model_pos;
    const int64_t *m_cnt = b->m_cnt, *n_cnt = b->n_cnt;
    const double *m_sum = b->m_sum, *n_sum = b->n_sum;
    uint8_t *fresh = b->fresh;
    int64_t *rows = ints, *model_len = ints + R, *stale_mlen = ints + 2 * R, *ngram_len = ints + 3 * R,
            *stale_nlen = ints + 4 * R;
    float *model_conf = floats, *stale_m = floats + R * Km, *ngram_conf = floats + 2 * R * Km,
          *stale_ng = floats + 2 * R * Km + R * Kn;
    const int64_t ng_clean = b->ng_clean;
    int64_t kv = 0;
    int nan = 0;
/* Copy an n-gram row of chain length len to dst, flagging NaN: the slots past the length are +0.0 when
 * ng_clean, so they are written without being read (the same floats; a long row spans two or more cache
 * lines, and half the rows of a chat trace have no n-gram match). */
#define NG_ROW(dst, src, len) do { \
        int64_t L_ = ng_span((len), Kn, ng_clean); \
        for (int64_t j = 0; j < L_; j++) { \
            float x = (src)[j]; \
            nan |= x != x; \
            (dst)[j] = x; \
        } \
        for (int64_t j = L_; j < Kn; j++) (dst)[j] = 0.0f; \
    } while (0)
    for (int64_t k = 0; k < R; k++) {
        int64_t r = reqs[k], p = pos[r], base = offsets[r];
        int64_t row = base + p, srow = base + prev_pos[r], mrow = base + model_pos[r];
        rows[k] = row;
        kv += prompt_len[r] + p;
        /* what es_commit reads and writes at this row, fetched while the policy runs (the tables are tens of
         * MB, each request's row a new cache line most steps: es_commit measured a quarter faster at chat
         * batch 128) */
        __builtin_prefetch(b->m_acc + row);
        __builtin_prefetch(b->ng_acc + row);
        __builtin_prefetch(b->ng_start + row);
        __builtin_prefetch(b->m_tok + row * Km);
        __builtin_prefetch(b->tokens + b->tok_offsets[r] + prompt_len[r] + p);
        __builtin_prefetch(b->emitted + row, 1);
        int64_t ml = b->whole ? Km : out_len[r] - p;
        model_len[k] = ml < Km ? ml : Km;
        ngram_len[k] = ng_len[row];
        for (int64_t j = 0; j < Km; j++) {
            float x = m_conf[row * Km + j];
            nan |= x != x;
            model_conf[k * Km + j] = x;
        }
        NG_ROW(ngram_conf + k * Kn, ng_conf + row * Kn, ngram_len[k]);
        float *sm = stale_m + k * Km;
        if (fresh[r]) {
            for (int64_t j = 0; j < Km; j++) sm[j] = 1.0f;
        } else if (model_pos[r] != prev_pos[r] && m_cnt[r] > 0) {
            double c = (double)m_cnt[r];
            for (int64_t j = 0; j < Km; j++) sm[j] = (float)(m_sum[r * Km + j] / c);
        } else {
            for (int64_t j = 0; j < Km; j++) sm[j] = m_conf[mrow * Km + j];
        }
        for (int64_t j = 0; j < Km; j++) nan |= sm[j] != sm[j];
        fresh[r] = 0;
        int64_t sl = b->whole ? Km : out_len[r] - model_pos[r];
        stale_mlen[k] = sl < Km ? sl : Km;
        int64_t snl = ng_len[srow];
        stale_nlen[k] = snl;
        NG_ROW(stale_ng + k * Kn, ng_conf + srow * Kn, snl);
        if (mean_ng != 0) {
            double *mn = mean_ng + k * Kn;
            int64_t c = n_cnt[r];
            if (c > 0) {
                double d = (double)c;
                for (int64_t j = 0; j < Kn; j++) mn[j] = n_sum[r * Kn + j] / d;
            } else {
                int64_t L = ng_span(snl, Kn, ng_clean);
                for (int64_t j = 0; j < L; j++) mn[j] = (double)(ng_conf[srow * Kn + j] * (float)(j < snl));
                for (int64_t j = L; j < Kn; j++) mn[j] = 0.0;
            }
            for (int64_t j = 0; j < Kn; j++) nan |= mn[j] != mn[j];
        }
    }
#undef NG_ROW
    *nan_out = nan;
    return kv;
}

/* After the policy: chain[R], adm[R], sec[R] (NULL: single chain), model_ran / ngram_ran, and the
 * gathered model_len / ngram_len / rows (es_gather's ints). Per request (the numpy methods' order):
 *   want_m = adm on a model chain, sec on an n-gram chain (tree), else 0; want_n likewise;
 *   bad[0]: first k with want_m > model_len, want_n > ngram_len or min(want_m, want_n) < 0;
 *   bad[1]: first k admitting slots of a drafter that did not run;
 *   adm_m = min(want_m, model_len), adm_n = min(want_n, ngram_len); acc_m = min(adm_m, m_acc[row]),
 *   acc_n = min(adm_n, ng_acc[row]); from_n = acc_n > acc_m; acc = max; n_emit = min(acc + 1, left),
 *   n_draft = min(acc, n_emit);
 *   bad[2]: first k whose emitted drafts leave their chain or (an n-gram copy of a request with real
 *   tokens) the context: n_draft > its chain's length, or ng_start < 0 or ng_start + n_draft >
 *   prompt_len + pos;
 *   emission: slot j < n_emit of the output at position pos + j: the model chain's proposal
 *   m_tok[row, min(j, Km - 1)], the n-gram copy tokens[tok_offsets + ng_start + j], or (bonus, j = n_draft)
 *   the target's tokens[tok_offsets + prompt_len + pos + j]; token-buffer reads clipped to its ends as
 *   numpy's take(mode="clip"); then pos += n_emit, prev_pos = the old pos;
 *   history: if model_ran, model_pos = prev_pos, m_sum += m_conf[row], m_cnt += 1; if uses_ngram,
 *   n_sum += ng_conf[row] times (slot < ng_len[row]) (as es_gather's mean; where ng_clean, up to the length
 *   only), n_cnt += 1; n_steps += 1.
 * out[0..2] = bad, out[3..8] = sums: verified model, verified n-gram, accepted model, accepted n-gram, emitted,
 * and the number of requests whose output this step completes (pos reaches out_len: the only ones that can
 * finish, so the engine asks the scheduler only then).
 * Returns the number of tokens written, or -1 if an output slot fell outside the buffer (nothing is
 * written then past that point; the caller raises). */
int64_t es_commit(int64_t R, const int64_t *reqs, const int64_t *ints, const int64_t *chain, const int64_t *adm,
                  const int64_t *sec, int64_t model_ran, int64_t ngram_ran, int64_t uses_ngram, const es_bound *b,
                  int64_t *out) {
    const int64_t Km = b->Km, Kn = b->Kn, ntokens = b->ntokens, nemitted = b->nemitted;
    const int64_t *offsets = b->offsets, *out_len = b->out_len, *prompt_len = b->prompt_len;
    const int64_t *tok_offsets = b->tok_offsets, *m_acc = b->m_acc, *ng_acc = b->ng_acc, *ng_start = b->ng_start;
    const int64_t *ng_len_tab = b->ng_len, *tokens = b->tokens;
    const uint8_t *length_only = b->length_only;
    const int32_t *m_tok = b->m_tok;
    const float *m_conf = b->m_conf, *ng_conf = b->ng_conf;
    int64_t *emitted = b->emitted, *pos = b->pos, *prev_pos = b->prev_pos, *model_pos = b->model_pos;
    int64_t *n_steps = b->n_steps, *m_cnt = b->m_cnt, *n_cnt = b->n_cnt;
    double *m_sum = b->m_sum, *n_sum = b->n_sum;
    const int64_t *rows = ints, *model_len = ints + R, *ngram_len = ints + 3 * R;
    int64_t *bad = out, *sums = out + 3;
    int64_t written = 0;
    bad[0] = bad[1] = bad[2] = -1;
    for (int64_t i = 0; i < 6; i++) sums[i] = 0;
    for (int64_t k = 0; k < R; k++) {
        int64_t r = reqs[k], row = rows[k], p = pos[r];
        int64_t c = chain[k], a = adm[k], s = sec ? sec[k] : 0;
        int64_t is_m = c == 1, is_n = c == 2;
        int64_t want_m = is_m ? a : (is_n ? s : 0);
        int64_t want_n = is_n ? a : (is_m ? s : 0);
        int64_t ml = model_len[k], nl = ngram_len[k];
        int64_t lo = want_m < want_n ? want_m : want_n;
        if (bad[0] < 0 && (want_m > ml || want_n > nl || lo < 0)) bad[0] = k;
        if (bad[1] < 0 && ((want_m > 0 && !model_ran) || (want_n > 0 && !ngram_ran))) bad[1] = k;
        int64_t adm_m = want_m < ml ? want_m : ml, adm_n = want_n < nl ? want_n : nl;
        int64_t acc_m = adm_m < m_acc[row] ? adm_m : m_acc[row];
        int64_t acc_n = adm_n < ng_acc[row] ? adm_n : ng_acc[row];
        int64_t from_n = acc_n > acc_m;
        int64_t acc = from_n ? acc_n : acc_m;
        int64_t left = out_len[r] - p;
        int64_t n_emit = acc + 1 < left ? acc + 1 : left;
        int64_t n_draft = acc < n_emit ? acc : n_emit;
        if (bad[2] < 0) {
            int64_t b = n_draft > (from_n ? nl : ml);
            if (from_n && n_draft > 0 && !length_only[r]) {
                int64_t src = ng_start[row];
                b = b || src < 0 || src + n_draft > prompt_len[r] + p;
            }
            if (b) bad[2] = k;
        }
        sums[0] += adm_m;
        sums[1] += adm_n;
        sums[from_n ? 3 : 2] += acc;
        if (adm_m + adm_n > 0) b->acc_hist[acc < b->hist_len - 1 ? acc : b->hist_len - 1] += 1;
        sums[4] += n_emit;
        sums[5] += n_emit == left;
        /* emission */
        int64_t out_src = tok_offsets[r] + prompt_len[r] + p;
        int64_t draft_src = from_n ? tok_offsets[r] + ng_start[row] : out_src;
        int64_t dst = offsets[r] + p;
        for (int64_t j = 0; j < n_emit; j++) {
            int64_t t;
            if (j < n_draft && !from_n) {
                t = (int64_t)m_tok[row * Km + (j < Km - 1 ? j : Km - 1)];
            } else {
                int64_t idx = (j < n_draft ? draft_src : out_src) + j;
                idx = idx < 0 ? 0 : (idx >= ntokens ? ntokens - 1 : idx);
                t = tokens[idx];
            }
            if (dst + j < 0 || dst + j >= nemitted) return -1;
            emitted[dst + j] = t;
        }
        written += n_emit;
        pos[r] = p + n_emit;
        prev_pos[r] = p;
        if (p + n_emit < out_len[r]) {  /* the row the next step reads, fetched while the host runs Python */
            int64_t nxt = offsets[r] + p + n_emit;
            __builtin_prefetch(m_conf + nxt * Km);
            __builtin_prefetch(ng_conf + nxt * Kn);
            __builtin_prefetch(ng_conf + nxt * Kn + Kn - 1);
            __builtin_prefetch(m_acc + nxt);
            __builtin_prefetch(ng_acc + nxt);
            __builtin_prefetch(ng_start + nxt);
            __builtin_prefetch(ng_len_tab + nxt);
            __builtin_prefetch(m_tok + nxt * Km);
            __builtin_prefetch(tokens + out_src + n_emit);
            __builtin_prefetch(emitted + nxt, 1);
        }
        /* history */
        if (model_ran) {
            model_pos[r] = p;
            for (int64_t j = 0; j < Km; j++) m_sum[r * Km + j] += (double)m_conf[row * Km + j];
            m_cnt[r] += 1;
        }
        if (uses_ngram) {
            /* past the length, the term is (double)(x * 0.0f): +0.0 when ng_clean, and adding +0.0 leaves the
             * sum (never -0.0: it starts at +0.0) as it is */
            int64_t L = ng_len_tab[row], n = ng_span(L, Kn, b->ng_clean);
            for (int64_t j = 0; j < n; j++) n_sum[r * Kn + j] += (double)(ng_conf[row * Kn + j] * (float)(j < L));
            n_cnt[r] += 1;
        }
        n_steps[r] += 1;
    }
    return written;
}

/* ---- the scheduler's scans over its running requests (sim/core/scheduler.py: the numpy there is the definition;
 * sim/engine/native_step.py, NativeScans, binds these to a scheduler's state arrays). run[n]: the running requests'
 * ids in running order. in_blocks(t) = ceil(t / block) * block, Python's -(-t // block) * block. */
static inline int64_t in_blocks(int64_t t, int64_t block) {
    int64_t q = t >= 0 ? (t + block - 1) / block : -((-t) / block);
    return q * block;
}

/* Scheduler.kv_used: the sum over the running requests of in_blocks(prompt_len + pos + extra). */
int64_t es_kv_used(int64_t n, const int64_t *run, const int64_t *prompt_len, const int64_t *pos, int64_t extra,
                   int64_t block) {
    int64_t s = 0;
    for (int64_t k = 0; k < n; k++) s += in_blocks(prompt_len[run[k]] + pos[run[k]] + extra, block);
    return s;
}

/* Scheduler.schedule's split: pending = prefill_target - prefilled; the ids with pending <= 0 (decoding) to
 * dec, the others as (id, pending) to pre[2 i], pre[2 i + 1], both in running order. Returns the number
 * decoding. */
int64_t es_split(int64_t n, const int64_t *run, const int64_t *prefill_target, const int64_t *prefilled,
                 int64_t *dec, int64_t *pre) {
    int64_t nd = 0, npre = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t r = run[k], left = prefill_target[r] - prefilled[r];
        if (left <= 0) {
            dec[nd++] = r;
        } else {
            pre[2 * npre] = r;
            pre[2 * npre + 1] = left;
            npre++;
        }
    }
    return nd;
}

/* Scheduler.pop_finished: done = pos >= out_len and prefilled >= prefill_target; the ids not done are moved
 * to the front of run, the done ones written to done, both in running order. Returns the number done. */
int64_t es_done(int64_t n, int64_t *run, const int64_t *pos, const int64_t *out_len, const int64_t *prefilled,
                const int64_t *prefill_target, int64_t *done) {
    int64_t nk = 0, nd = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t r = run[k];
        if (pos[r] >= out_len[r] && prefilled[r] >= prefill_target[r]) done[nd++] = r;
        else run[nk++] = r;
    }
    return nd;
}

/* Scheduler._fits_to_the_end's need: the sum of full_kv_need = in_blocks(prompt_len + out_len + kmax + 1). */
int64_t es_full_need(int64_t n, const int64_t *run, const int64_t *prompt_len, const int64_t *out_len, int64_t kmax,
                     int64_t block) {
    int64_t s = 0;
    for (int64_t k = 0; k < n; k++) s += in_blocks(prompt_len[run[k]] + out_len[run[k]] + kmax + 1, block);
    return s;
}
