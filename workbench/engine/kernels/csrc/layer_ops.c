#include "wb.h"

/* The residual add and RMSNorm of a pre-norm decoder layer in one pass: sum = hidden (+ delta),
 * rounded to the dtype as torch's add; normed = dtype(dtype(sum * 1 / sqrt(mean(sum^2) + eps))
 * * weight), the ops and roundings of transformers' Llama-family RMSNorm (statistics in
 * float32), the mean summed in a fixed order (torch's own order may differ in the last bit).
 * hidden, delta, sum, normed [M, H]; weight [H]; delta may be NULL (sum is then not written). */
int wb_add_rms_norm(const void *hidden, const void *delta, const void *weight, void *sum,
                    void *normed, int64_t M, int64_t H, float eps, int bf16, int threads) {
    if (H % 8) return -1;
#pragma omp parallel for num_threads(wb_threads_for(M * H, threads)) schedule(static)
    for (int64_t m = 0; m < M; ++m) {
        const int64_t at = m * H;
        const void *src = hidden;
        __m256 acc = _mm256_setzero_ps();
        if (delta) {
            for (int64_t h = 0; h < H; h += 8)
                wb_store8(sum, at + h, _mm256_add_ps(wb_load8(hidden, bf16, at + h),
                                                     wb_load8(delta, bf16, at + h)), bf16);
            src = sum;  /* the rounded sum, what torch's norm reads */
        }
        for (int64_t h = 0; h < H; h += 8) {
            const __m256 v = wb_load8(src, bf16, at + h);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        const __m256 inv = _mm256_set1_ps(1.0f / __builtin_sqrtf(hsum(acc) / (float)H + eps));
        for (int64_t h = 0; h < H; h += 8) {
            const __m256 n = wb_round8(_mm256_mul_ps(wb_load8(src, bf16, at + h), inv), bf16);
            wb_store8(normed, at + h, _mm256_mul_ps(n, wb_load8(weight, bf16, h)), bf16);
        }
    }
    return 0;
}

/* Rotary embedding of a step's queries and keys, and its keys and values written into the KV
 * cache, in one pass: qkv [T, (Hq + 2 Hkv) D] (ld elements between rows; queries, keys,
 * values), cos and signed_sin [T, D] (sin with its first half negated) -> q_out [T, Hq, D],
 * and rows slots[t] of k_cache and v_cache [S, Hkv, D]. Each element is x * cos +
 * rotate_half(x) * signed_sin with the roundings of torch's ops in that dtype (the products,
 * then their sum), so the result is bit for bit the decoder's `_rotate`. */
static inline void wb_rotate_head(const void *x, int64_t at, const void *cos, const void *sin,
                                  int64_t ct, int64_t D, int bf16, void *dst, int64_t dat) {
    const int64_t half = D / 2;
    for (int64_t j = 0; j < D; j += 8) {
        const __m256 a = wb_round8(_mm256_mul_ps(wb_load8(x, bf16, at + j),
                                                 wb_load8(cos, bf16, ct + j)), bf16);
        const __m256 r = wb_load8(x, bf16, at + (j < half ? j + half : j - half));
        const __m256 b = wb_round8(_mm256_mul_ps(r, wb_load8(sin, bf16, ct + j)), bf16);
        wb_store8(dst, dat + j, _mm256_add_ps(a, b), bf16);
    }
}

int wb_rope_write_kv(const void *qkv, int64_t ld, const void *cos, const void *sin,
                     const int64_t *slots, void *q_out, void *k_cache, void *v_cache, int64_t T,
                     int64_t Hq, int64_t Hkv, int64_t D, int bf16, int threads) {
    const int64_t esize = bf16 ? 2 : 4;
    if (D % 16) return -1;
#pragma omp parallel for num_threads(wb_threads_for(T * (Hq + 2 * Hkv) * D, threads)) \
    schedule(static)
    for (int64_t t = 0; t < T; ++t) {
        const int64_t row = t * ld, ct = t * D, slot = slots[t];
        for (int64_t h = 0; h < Hq; ++h)
            wb_rotate_head(qkv, row + h * D, cos, sin, ct, D, bf16, q_out, (t * Hq + h) * D);
        for (int64_t h = 0; h < Hkv; ++h)
            wb_rotate_head(qkv, row + (Hq + h) * D, cos, sin, ct, D, bf16, k_cache,
                           (slot * Hkv + h) * D);
        __builtin_memcpy((char *)v_cache + slot * Hkv * D * esize,
                         (const char *)qkv + (row + (Hq + Hkv) * D) * esize,
                         (size_t)(Hkv * D * esize));
    }
    return 0;
}

/* A gated MLP's activation: gate_up [M, 2F] (gate, then up, per row) -> out [M, F] =
 * silu(gate) * up; silu(g) = g / (1 + e^-g) in float32 (exp as `wb_exp8`: torch's own
 * differs in the last bit), rounded to the dtype, then the product rounded, as torch's two
 * ops. */
int wb_silu_mul(const void *gate_up, void *out, int64_t M, int64_t F, int bf16, int threads) {
    if (F % 8) return -1;
#pragma omp parallel for num_threads(wb_threads_for(M * F, threads)) schedule(static)
    for (int64_t m = 0; m < M; ++m) {
        const int64_t g0 = m * 2 * F, u0 = g0 + F;
        for (int64_t f = 0; f < F; f += 8) {
            const __m256 g = wb_load8(gate_up, bf16, g0 + f);
            /* e^-g, its exponent clamped to float's range (silu is g or 0 beyond it) */
            const __m256 e = wb_exp8(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), g),
                                                   _mm256_set1_ps(86.0f)));
            const __m256 silu = wb_round8(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)),
                                          bf16);
            wb_store8(out, m * F + f, _mm256_mul_ps(silu, wb_load8(gate_up, bf16, u0 + f)), bf16);
        }
    }
    return 0;
}

/* The sampler's logprob bookkeeping in one pass over each row of logprobs [R, V] (float32):
 * rank[r] = 1 + how many entries exceed the chosen token's (`chosen[r]`), and the k largest,
 * largest first, an equal value after those of lower index (ids[r, :k], vals[r, :k]). -1
 * (the caller uses torch's ops) where k is 0 or more than 64 or a row holds a NaN. */
#define WB_TOP_K_MAX 64
int wb_ranks_top_k(const float *lp, const int64_t *chosen, int64_t R, int64_t V, int64_t k,
                   int64_t *ranks, int64_t *ids, float *vals) {
    if (k < 1 || k > WB_TOP_K_MAX || k > V) return -1;
    for (int64_t r = 0; r < R; ++r) {
        const float *row = lp + r * V;
        const float c = row[chosen[r]];
        float top[WB_TOP_K_MAX];
        int64_t at[WB_TOP_K_MAX];
        int64_t n = 0, above = 0, nan = 0;
        float floor_ = -INFINITY;  /* the k-th largest once k are held */
        const __m256 cv = _mm256_set1_ps(c);
        int64_t i = 0;
        for (; i < V; ++i) {  /* the first k, and any past them until the vector loop can run */
            if (n == k && i % 8 == 0) break;
            const float x = row[i];
            nan |= x != x;
            above += x > c;
            if (n < k || x > floor_) {
                int64_t j = n < k ? n++ : k - 1;
                while (j > 0 && top[j - 1] < x) { top[j] = top[j - 1]; at[j] = at[j - 1]; --j; }
                top[j] = x; at[j] = i;
                if (n == k) floor_ = top[k - 1];
            }
        }
        __m256 fv = _mm256_set1_ps(floor_);
        for (; i + 8 <= V; i += 8) {
            const __m256 x = _mm256_loadu_ps(row + i);
            above += __builtin_popcount(_mm256_movemask_ps(_mm256_cmp_ps(x, cv, _CMP_GT_OQ)));
            nan |= _mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
            int mask = _mm256_movemask_ps(_mm256_cmp_ps(x, fv, _CMP_GT_OQ));
            while (mask) {
                const int b = __builtin_ctz(mask);
                mask &= mask - 1;
                const float v = row[i + b];
                if (!(v > floor_)) continue;  /* the floor rose since the compare */
                int64_t j = k - 1;
                while (j > 0 && top[j - 1] < v) { top[j] = top[j - 1]; at[j] = at[j - 1]; --j; }
                top[j] = v; at[j] = i + b;
                floor_ = top[k - 1];
                fv = _mm256_set1_ps(floor_);
            }
        }
        for (; i < V; ++i) {
            const float x = row[i];
            nan |= x != x;
            above += x > c;
            if (x > floor_) {
                int64_t j = k - 1;
                while (j > 0 && top[j - 1] < x) { top[j] = top[j - 1]; at[j] = at[j - 1]; --j; }
                top[j] = x; at[j] = i;
                floor_ = top[k - 1];
            }
        }
        if (nan || c != c) return -1;
        ranks[r] = above + 1;
        for (int64_t j = 0; j < k; ++j) { ids[r * k + j] = at[j]; vals[r * k + j] = top[j]; }
    }
    return 0;
}

/* The entropy of each row of float32 logprobs lp [R, V] (log_softmax over the whole vocabulary),
 * -sum exp(l) * l in nats, into out [R] as float64: each term in float32 (`wb_exp8`, within two
 * ulp of torch's exp), masked tokens (-inf) adding nothing, the terms summed in float64 in four
 * lanes per half-vector, in one order whatever the row count or thread count (a row alone and in
 * a batch: the same bits; rows shared out between the threads). -1 where a row holds a NaN or
 * +inf (the caller then uses torch). */
static int wb_entropy_row(const float *row, int64_t V, double *out) {
    const __m256 minus_inf = _mm256_set1_ps(-INFINITY), plus_inf = _mm256_set1_ps(INFINITY);
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    int bad = 0;
    for (int64_t i = 0; i < V; i += 8) {
        float tail[8];
        const float *at = row + i;
        if (i + 8 > V) {  /* the last few, padded with masked tokens */
            for (int j = 0; j < 8; ++j) tail[j] = i + j < V ? row[i + j] : -INFINITY;
            at = tail;
        }
        const __m256 x = _mm256_loadu_ps(at);
        bad |= _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q),
                                               _mm256_cmp_ps(x, plus_inf, _CMP_EQ_OQ)));
        const __m256 term = _mm256_and_ps(_mm256_mul_ps(wb_exp8(x), x),
                                          _mm256_cmp_ps(x, minus_inf, _CMP_NEQ_OQ));
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(term)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(term, 1)));
    }
    double lanes[8];
    _mm256_storeu_pd(lanes, lo);
    _mm256_storeu_pd(lanes + 4, hi);
    double sum = 0.0;
    for (int j = 0; j < 8; ++j) sum += lanes[j];
    *out = -sum;
    return bad;
}

int wb_entropy(const float *lp, int64_t R, int64_t V, double *out, int threads) {
    int bad = 0;
#pragma omp parallel for num_threads(R > 1 ? threads : 1) schedule(static) reduction(| : bad)
    for (int64_t r = 0; r < R; ++r) bad |= wb_entropy_row(lp + r * V, V, out + r);
    return bad ? -1 : 0;
}
