#include "wb.h"

/* bfloat16 products on CPUs with AVX-512 BF16 (VDPBF16PS), one arithmetic for every row count:
 * y[m, n] = sum_k x[m, k] * w[n, k] (+ b[n]) on the plain weight [N, K], bf16 in, float32 sums
 * rounded once to bf16 (nearest even), as oneDNN and MKL compute it, in one fixed order for
 * every output: its sixteen lanes take the pairs of k at 32-element steps, then one tree adds
 * the lanes. A row's bits depend on its own values only: not on how many rows share the call,
 * where it sits among them, nor the thread count, so the products are batch-invariant by
 * construction, and the batch-invariant engine and the default one run the same function.
 *
 * Tiles of four weight rows by four input rows (sixteen sums in registers, eight vector loads
 * for sixteen VDPBF16PS): one input row streams the weights at close to the memory's read
 * bandwidth, many rows run near the CPU's bf16 peak (2-core Zen 4, 512 rows: 390-440 GFLOP/s,
 * as the broadcast tiles this replaced). Sums of sixteen tiles' lanes are added and rounded
 * sixteen at a time (`wb_sum16x16`); the scalar rounding it replaced cost 20 % at 512 rows.
 * Compiled for AVX-512 BF16 only in this file's functions (the library still loads on AVX2
 * CPUs); compilers older than GCC 10 / clang 9 leave them out and the kernel is unavailable. */
#if (defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && __GNUC__ >= 10)
#define WB_DOT_R 4   /* weight rows a tile */
#define WB_DOT_X 4   /* input rows a tile: 16 sums in registers */
#define WB_DOT_GROUP_BYTES (256 * 1024)  /* a thread's weight rows at once: they stay in L2 */

/* A vector's sixteen floats summed in one fixed tree (lane i + i+8, then + i+4, + i^2, + 1):
 * written out, not left to the compiler's _mm512_reduce_add_ps, so the bits are the same
 * whatever compiled it. */
__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) float
wb_sum16(__m512 v) {
    const __m256 t8 = _mm256_add_ps(_mm512_castps512_ps256(v),
                                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
    const __m128 t2 = _mm_add_ps(t4, _mm_shuffle_ps(t4, t4, 0x4e));
    return _mm_cvtss_f32(t2) + _mm_cvtss_f32(_mm_shuffle_ps(t2, t2, 0x55));
}

/* Sixteen vectors' sums at once, each in `wb_sum16`'s tree (the same pairs of lanes added at
 * each level, four levels of two shuffles and an add for sixteen vectors): out[4q + j] is the
 * sum of v[4j + q]. */
__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) __m512
wb_sum16x16(const __m512 *v) {
    __m512 u[8], w[4], x[2];
    for (int p = 0; p < 8; ++p)  /* lane i + i+8 */
        u[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0xee));
    for (int r = 0; r < 4; ++r)  /* + i+4 */
        w[r] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * r], u[2 * r + 1], 0x88),
                             _mm512_shuffle_f32x4(u[2 * r], u[2 * r + 1], 0xdd));
    for (int t = 0; t < 2; ++t)  /* + i^2 */
        x[t] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * t], w[2 * t + 1], 0x44),
                             _mm512_shuffle_ps(w[2 * t], w[2 * t + 1], 0xee));
    return _mm512_add_ps(_mm512_shuffle_ps(x[0], x[1], 0x88),  /* + 1 */
                         _mm512_shuffle_ps(x[0], x[1], 0xdd));
}

/* R weight rows times X input rows over all of K: each output's sixteen lanes take the pairs
 * of k at 32-element steps (VDPBF16PS), a K that is not a multiple of 32 its last step masked,
 * then `wb_sum16`'s tree, the bias added (+0 without one) and one rounding: for any R and X the
 * same order for every output. Writes y[j * N + r] (X rows of R outputs); b: the R biases. */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static inline
__attribute__((always_inline)) void
dot_tile(const uint16_t *w, const uint16_t *x, int64_t K, const int R, const int X,
         int prefetch, const uint16_t *b, uint16_t *y, int64_t N) {
    const int64_t K32 = K & ~(int64_t)31;
    const __mmask32 tail = (__mmask32)((1ull << (K & 31)) - 1);
    __m512 acc[WB_DOT_R][WB_DOT_X];
    for (int r = 0; r < R; ++r)
        for (int j = 0; j < X; ++j) acc[r][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K32; k += 32) {
        __m512bh xv[WB_DOT_X];
        for (int j = 0; j < X; ++j) xv[j] = (__m512bh)_mm512_loadu_si512(x + j * K + k);
        for (int r = 0; r < R; ++r) {
            if (prefetch) _mm_prefetch((const char *)(w + (r + 2 * WB_DOT_R) * K + k), _MM_HINT_T0);
            const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + r * K + k);
            for (int j = 0; j < X; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], wv, xv[j]);
        }
    }
    if (tail) {
        __m512bh xv[WB_DOT_X];
        for (int j = 0; j < X; ++j)
            xv[j] = (__m512bh)_mm512_maskz_loadu_epi16(tail, x + j * K + K32);
        for (int r = 0; r < R; ++r) {
            const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(tail, w + r * K + K32);
            for (int j = 0; j < X; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], wv, xv[j]);
        }
    }
    if (R == 4 && X == 4) {  /* v[4a + c] = acc[a][c]: lane 4j + r is acc[r][j]'s sum */
        __m512 v[16];
        for (int a = 0; a < 4; ++a)
            for (int c = 0; c < 4; ++c) v[4 * a + c] = acc[a][c];
        __m128 bias = _mm_setzero_ps();
        if (b) bias = _mm_castsi128_ps(_mm_slli_epi32(
                          _mm_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)b)), 16));
        const __m512 sums = _mm512_add_ps(wb_sum16x16(v), _mm512_broadcast_f32x4(bias));
        const __m512i u = _mm512_castps_si512(sums);  /* wb_round_bf16, sixteen at once */
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
        rounded = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(sums, sums, _CMP_UNORD_Q),
                                        _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
        uint16_t out[16];
        _mm256_storeu_si256((__m256i *)out,
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
        for (int j = 0; j < 4; ++j) memcpy(y + j * N, out + 4 * j, 8);
        return;
    }
    for (int r = 0; r < R; ++r) {
        const float bias = b ? wb_bf16_to_f32(b[r]) : 0.0f;
        for (int j = 0; j < X; ++j) y[j * N + r] = wb_round_bf16(wb_sum16(acc[r][j]) + bias);
    }
}

/* dot_tile with R and X constants (each its own unrolled body) */
#define DOT_TILE(WP, R, BP, YP, PREFETCH) \
    switch (X) { \
    case 4: dot_tile(WP, xr, K, R, 4, PREFETCH, BP, YP, N); break; \
    case 3: dot_tile(WP, xr, K, R, 3, PREFETCH, BP, YP, N); break; \
    case 2: dot_tile(WP, xr, K, R, 2, PREFETCH, BP, YP, N); break; \
    default: dot_tile(WP, xr, K, R, 1, PREFETCH, BP, YP, N); break; \
    }

__attribute__((target("avx512f,avx512bw,avx512bf16")))
void wb_linear_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *b, uint16_t *y,
                        int64_t M, int64_t N, int64_t K, int threads) {
    /* a thread's weight rows at once: those that fit WB_DOT_GROUP_BYTES, and enough groups
     * (eight a thread) that the threads share a small N evenly */
    int64_t group = WB_DOT_GROUP_BYTES / (2 * K);
    const int64_t even = (N + 8 * threads - 1) / (8 * threads);
    if (group > even) group = even;
    group = (group + WB_DOT_R - 1) / WB_DOT_R * WB_DOT_R;
    if (group < WB_DOT_R) group = WB_DOT_R;
    const int64_t groups = (N + group - 1) / group;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
        const int64_t g0 = g * group, g1 = g0 + group < N ? g0 + group : N;
        for (int64_t m0 = 0; m0 < M; m0 += WB_DOT_X) {
            const int X = M - m0 < WB_DOT_X ? (int)(M - m0) : WB_DOT_X;
            const uint16_t *xr = x + m0 * K;
            const int prefetch = m0 == 0;  /* the first pass reads the group from memory */
            for (int64_t n0 = g0; n0 < g1; n0 += WB_DOT_R) {
                const uint16_t *wr = w + n0 * K, *br = b ? b + n0 : NULL;
                uint16_t *yr = y + m0 * N + n0;
                if (g1 - n0 >= WB_DOT_R) {
                    DOT_TILE(wr, WB_DOT_R, br, yr, prefetch)
                } else {  /* the last rows of N, one at a time */
                    for (int64_t r = 0; r < g1 - n0; ++r)
                        DOT_TILE(wr + r * K, 1, br ? br + r : NULL, yr + r, 0)
                }
            }
        }
    }
}
#endif
