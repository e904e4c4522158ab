#include "wb.h"

/* Decode attention over a paged KV cache: one query token per sequence against its context,
 * read in place through its cache slots (no gathered copy).
 *
 * q [B, Hq, D] (q_stride elements between sequences); k_cache, v_cache [S, Hkv, D]; slots
 * [B, Lmax] (slot_stride elements between rows; row b's first lengths[b] are its context, in
 * order); out [B, Hq, D]. Query head h reads KV head h / (Hq / Hkv), as transformers'
 * repeat_kv. Scores, softmax (max subtracted) and the weighted sum of values in float32,
 * rounded once into out's dtype. One (sequence, KV head) pair is one thread's, its G query
 * heads together so that each key and value row is read (and converted) once for up to four
 * of them; two keys at a time (independent sums). Fixed order: the same bits for any thread
 * count. */
#define WB_ATTN_MAX_D 256
#define WB_ATTN_MAX_G 16
#define WB_ATTN_AHEAD 8

/* Scores of two keys k0, k1 against GN (<= 4) query heads qf (scaled, float32): out[g][j].
 * Inlined with constant GN and bf16, so the sums stay in registers. */
static inline __attribute__((always_inline)) void
wb_scores2(const void *k0, const void *k1, const float (*qf)[WB_ATTN_MAX_D], int64_t D,
           const int bf16, const int GN, float out[4][2]) {
    __m256 s[4][2];
    for (int g = 0; g < GN; ++g) s[g][0] = s[g][1] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
        const __m256 a = wb_load8(k0, bf16, d), b = wb_load8(k1, bf16, d);
        for (int g = 0; g < GN; ++g) {
            const __m256 qv = _mm256_loadu_ps(qf[g] + d);
            s[g][0] = _mm256_fmadd_ps(qv, a, s[g][0]);
            s[g][1] = _mm256_fmadd_ps(qv, b, s[g][1]);
        }
    }
    for (int g = 0; g < GN; ++g) {
        out[g][0] = hsum(s[g][0]);
        out[g][1] = hsum(s[g][1]);
    }
}

/* The weighted sum of the L value rows (v: the first of head h's dims d0.. in slot 0's row)
 * for GN (<= 3) heads and NV (<= 4) vectors of 8 dims: 12 sums in registers at most, each
 * value row read and converted once for the GN heads. out = sum * inv[g]. */
static inline __attribute__((always_inline)) void
wb_values(const void *v, const int64_t *slots, int64_t L, int64_t row, const float *scores,
          const float *inv, void *out, int64_t out_at, int64_t D, const int bf16, const int GN,
          const int NV) {
    const int64_t esize = bf16 ? 2 : 4;
    __m256 a[3][4];
    for (int g = 0; g < GN; ++g)
        for (int j = 0; j < NV; ++j) a[g][j] = _mm256_setzero_ps();
    for (int64_t l = 0; l < L; ++l) {
        const void *vr = (const char *)v + slots[l] * row * esize;
        __m256 x[4];
        for (int j = 0; j < NV; ++j) x[j] = wb_load8(vr, bf16, 8 * j);
        for (int g = 0; g < GN; ++g) {
            const __m256 p = _mm256_set1_ps(scores[g * L + l]);
            for (int j = 0; j < NV; ++j) a[g][j] = _mm256_fmadd_ps(p, x[j], a[g][j]);
        }
    }
    for (int g = 0; g < GN; ++g)
        for (int j = 0; j < NV; ++j)
            wb_store8(out, out_at + g * D + 8 * j, _mm256_mul_ps(a[g][j], _mm256_set1_ps(inv[g])),
                      bf16);
}

/* What a score becomes before the softmax (`wb_paged_attention`): soft-capped (cap > 0:
 * tanh(s / cap) * cap, Gemma 2's), plus ALiBi's bias for its query head at key position pos
 * (slope * pos rounded to the dtype, then times alibi_scale rounded again where it is not 1:
 * `attention.Alibi.bias`). None of these: the score as it is. */
typedef struct {
    float softcap;        /* 0: none */
    const float *alibi;   /* [Hq] slopes, or NULL */
    float alibi_scale;
    int64_t first_pos;    /* the position of the first key read */
} wb_score_fix;

static inline float wb_round_to(float f, int bf16) {
    return bf16 ? wb_bf16_to_f32(wb_round_bf16(f)) : f;
}

static inline float wb_fix_score(float s, const wb_score_fix *fix, int64_t head, int64_t pos,
                                 int bf16) {
    if (fix->softcap > 0.0f) s = tanhf(s / fix->softcap) * fix->softcap;
    if (fix->alibi) {
        float bias = wb_round_to(fix->alibi[head] * (float)pos, bf16);
        if (fix->alibi_scale != 1.0f) bias = wb_round_to(bias * fix->alibi_scale, bf16);
        s += bias;
    }
    return s;
}

static void wb_attend_one(const void *q, const void *k_cache, const void *v_cache,
                          const int64_t *slots, int64_t L, void *out, int64_t Hkv, int64_t h,
                          int64_t G, int64_t D, float scale, int bf16, float *scores,
                          const wb_score_fix *fix) {
    const int64_t esize = bf16 ? 2 : 4, row = Hkv * D;
    float qf[WB_ATTN_MAX_G][WB_ATTN_MAX_D];
    float mx[WB_ATTN_MAX_G], sum[WB_ATTN_MAX_G];
    for (int64_t g = 0; g < G; ++g) {
        const void *qg = (const char *)q + (h * G + g) * D * esize;
        for (int64_t d = 0; d < D; d += 8) {
            _mm256_storeu_ps(qf[g] + d, _mm256_mul_ps(wb_load8(qg, bf16, d),
                                                      _mm256_set1_ps(scale)));
        }
        mx[g] = -__builtin_inff();
    }
    const int64_t bytes = D * esize;
    for (int64_t l = 0; l < WB_ATTN_AHEAD && l < L; ++l)
        for (int64_t c = 0; c < bytes; c += 64)
            _mm_prefetch((const char *)k_cache + (slots[l] * row + h * D) * esize + c,
                         _MM_HINT_T0);
    for (int64_t l = 0; l < L; l += 2) {  /* scores: two keys, up to four heads at a time */
        const void *k0 = (const char *)k_cache + (slots[l] * row + h * D) * esize;
        const void *k1 = l + 1 < L ? (const char *)k_cache + (slots[l + 1] * row + h * D) * esize
                                   : k0;
        /* the context is scattered over the cache's blocks, out of the prefetchers' sight: the
         * keys WB_ATTN_AHEAD ahead, and the values of these two (read after the softmax) */
        for (int64_t j = l; j < l + 2 && j < L; ++j)
            for (int64_t c = 0; c < bytes; c += 64) {
                if (j + WB_ATTN_AHEAD < L)
                    _mm_prefetch((const char *)k_cache + (slots[j + WB_ATTN_AHEAD] * row + h * D)
                                 * esize + c, _MM_HINT_T0);
                _mm_prefetch((const char *)v_cache + (slots[j] * row + h * D) * esize + c,
                             _MM_HINT_T0);
            }
        for (int64_t g0 = 0; g0 < G; g0 += 4) {
            const int64_t gn = G - g0 < 4 ? G - g0 : 4;
            const float (*qg)[WB_ATTN_MAX_D] = qf + g0;
            float sc[4][2];
            switch (gn + 4 * !!bf16) {
            case 1: wb_scores2(k0, k1, qg, D, 0, 1, sc); break;
            case 2: wb_scores2(k0, k1, qg, D, 0, 2, sc); break;
            case 3: wb_scores2(k0, k1, qg, D, 0, 3, sc); break;
            case 4: wb_scores2(k0, k1, qg, D, 0, 4, sc); break;
            case 5: wb_scores2(k0, k1, qg, D, 1, 1, sc); break;
            case 6: wb_scores2(k0, k1, qg, D, 1, 2, sc); break;
            case 7: wb_scores2(k0, k1, qg, D, 1, 3, sc); break;
            default: wb_scores2(k0, k1, qg, D, 1, 4, sc); break;
            }
            for (int64_t g = 0; g < gn; ++g)
                for (int j = 0; j < 2 && l + j < L; ++j) {
                    const float s = fix ? wb_fix_score(sc[g][j], fix, h * G + g0 + g,
                                                       fix->first_pos + l + j, bf16)
                                        : sc[g][j];
                    scores[(g0 + g) * L + l + j] = s;
                    if (s > mx[g0 + g]) mx[g0 + g] = s;
                }
        }
    }
    for (int64_t g = 0; g < G; ++g) {  /* softmax numerators and their sum */
        float *sg = scores + g * L;
        const __m256 m = _mm256_set1_ps(mx[g]);
        __m256 total = _mm256_setzero_ps();
        int64_t l = 0;
        for (; l + 8 <= L; l += 8) {
            const __m256 e = wb_exp8(_mm256_sub_ps(_mm256_loadu_ps(sg + l), m));
            _mm256_storeu_ps(sg + l, e);
            total = _mm256_add_ps(total, e);
        }
        float t = hsum(total);
        if (l < L) {
            float tail[8] = {0}, e8[8];
            for (int64_t j = l; j < L; ++j) tail[j - l] = sg[j] - mx[g];
            _mm256_storeu_ps(e8, wb_exp8(_mm256_loadu_ps(tail)));
            for (int64_t j = l; j < L; ++j) {
                sg[j] = e8[j - l];
                t += e8[j - l];
            }
        }
        sum[g] = t;
    }
    float inv[WB_ATTN_MAX_G];
    for (int64_t g = 0; g < G; ++g) inv[g] = 1.0f / sum[g];
    for (int64_t g0 = 0; g0 < G; g0 += 3) {  /* the weighted sums of values */
        const int64_t gn = G - g0 < 3 ? G - g0 : 3;
        for (int64_t d0 = 0; d0 < D; d0 += 32) {
            const void *v = (const char *)v_cache + (h * D + d0) * esize;
            const float *sg = scores + g0 * L, *ig = inv + g0;
            const int64_t at = (h * G + g0) * D + d0;
            switch ((D - d0 >= 32 ? 4 : (D - d0) / 8) * 8 + gn * 2 + !!bf16) {
#define WB_VALUES(NV, GN, BF) \
            case NV * 8 + GN * 2 + BF: \
                wb_values(v, slots, L, row, sg, ig, out, at, D, BF, GN, NV); \
                break;
            WB_VALUES(4, 3, 0) WB_VALUES(4, 3, 1) WB_VALUES(4, 2, 0) WB_VALUES(4, 2, 1)
            WB_VALUES(4, 1, 0) WB_VALUES(4, 1, 1) WB_VALUES(3, 3, 0) WB_VALUES(3, 3, 1)
            WB_VALUES(3, 2, 0) WB_VALUES(3, 2, 1) WB_VALUES(3, 1, 0) WB_VALUES(3, 1, 1)
            WB_VALUES(2, 3, 0) WB_VALUES(2, 3, 1) WB_VALUES(2, 2, 0) WB_VALUES(2, 2, 1)
            WB_VALUES(2, 1, 0) WB_VALUES(2, 1, 1) WB_VALUES(1, 3, 0) WB_VALUES(1, 3, 1)
            WB_VALUES(1, 2, 0) WB_VALUES(1, 2, 1) WB_VALUES(1, 1, 0) WB_VALUES(1, 1, 1)
#undef WB_VALUES
            }
        }
    }
}

/* Rows b of q against their contexts: slots + offsets[b] (or + b * slot_stride without
 * offsets), the last `window` keys where window > 0, scores fixed as `fix` says (NULL: as they
 * are); the shared loop of `wb_decode_attention` and `wb_paged_attention`. */
static int wb_attend_rows(const void *q, int64_t q_stride, const void *k_cache,
                          const void *v_cache, const int64_t *slots, const int64_t *offsets,
                          int64_t slot_stride, const int64_t *lengths, int64_t window,
                          const wb_score_fix *fix, void *out, int64_t B, int64_t Hq,
                          int64_t Hkv, int64_t D, int64_t Lmax, float scale, int bf16,
                          int threads) {
    const int64_t G = Hkv > 0 ? Hq / Hkv : 0, esize = bf16 ? 2 : 4, items = B * Hkv;
    if (D % 8 || D > WB_ATTN_MAX_D || G < 1 || G > WB_ATTN_MAX_G || G * Hkv != Hq) return -1;
    for (int64_t b = 0; b < B; ++b)
        if (lengths[b] < 1 || lengths[b] > Lmax) return -1;
    if (threads > items) threads = (int)items;
    if (threads < 1) threads = 1;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *scores = (float *)__builtin_malloc(sizeof(float) * (size_t)(G * Lmax));
        /* KV head-major (a thread reads one head's keys and values over its rows, while they
         * are in its cache) and handed out two at a time (a prefill's rows grow longer: a static
         * split gave one thread three times the other's work) */
#pragma omp for schedule(dynamic, 2)
        for (int64_t item = 0; item < items; ++item) {
            const int64_t b = item % B, L = lengths[b];
            const int64_t first = window > 0 && L > window ? L - window : 0;
            wb_score_fix at;
            if (fix) {
                at = *fix;
                at.first_pos = first;
            }
            if (scores)
                wb_attend_one((const char *)q + b * q_stride * esize, k_cache, v_cache,
                              slots + (offsets ? offsets[b] : b * slot_stride) + first,
                              L - first, (char *)out + b * Hq * D * esize, Hkv, item / B, G,
                              D, scale, bf16, scores, fix ? &at : 0);
            else {
#pragma omp atomic write
                failed = 1;
            }
        }
        __builtin_free(scores);
    }
    return failed ? -2 : 0;
}

int wb_decode_attention(const void *q, int64_t q_stride, const void *k_cache,
                        const void *v_cache, const int64_t *slots, int64_t slot_stride,
                        const int64_t *lengths, void *out, int64_t B, int64_t Hq, int64_t Hkv,
                        int64_t D, int64_t Lmax, float scale, int bf16, int threads) {
    return wb_attend_rows(q, q_stride, k_cache, v_cache, slots, 0, slot_stride, lengths, 0, 0,
                          out, B, Hq, Hkv, D, Lmax, scale, bf16, threads);
}

/* Attention for any query token of any sequence, the batch-invariant engine's (prefill chunks
 * and decodes alike): query row b (q [B, Hq, D], q_stride elements apart) at position
 * lengths[b] - 1 attends to its context's keys 0 .. lengths[b] - 1, whose cache slots are
 * slots[offsets[b] ..] (a sequence's rows share one run of slots), its last `window` of them
 * where window > 0, scores soft-capped and ALiBi-biased as `wb_fix_score` says. Each (row, KV
 * head) is `wb_attend_one`'s, in its fixed order over the keys it reads: a row's output depends
 * on its query and its context only, never on the other rows, the thread count, or whether the
 * row is a prefill's or a decode's (the same bits as `wb_decode_attention` without window,
 * cap or bias). Returns -1 for a shape it does not take (as `wb_decode_attention`), -2 when out
 * of memory. */
int wb_paged_attention(const void *q, int64_t q_stride, const void *k_cache,
                       const void *v_cache, const int64_t *slots, const int64_t *offsets,
                       const int64_t *lengths, int64_t window, float softcap,
                       const float *alibi, float alibi_scale, void *out, int64_t B, int64_t Hq,
                       int64_t Hkv, int64_t D, int64_t Lmax, float scale, int bf16,
                       int threads) {
    const wb_score_fix fix = {softcap, alibi, alibi_scale, 0};
    return wb_attend_rows(q, q_stride, k_cache, v_cache, slots, offsets, 0, lengths, window,
                          softcap > 0.0f || alibi ? &fix : 0, out, B, Hq, Hkv, D, Lmax, scale,
                          bf16, threads);
}
