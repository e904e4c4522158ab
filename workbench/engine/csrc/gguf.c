/* Products of float32 activations with GGUF's quantized blocks, read as the file holds them.
 *
 * y[m, n] = sum_k x[m, k] * dequant(w)[n, k] (+ b[n]) for the block types Q4_0, Q4_1, Q8_0,
 * Q4_K, Q5_K and Q6_K, one function per type and ISA: wb_linear_<type>_avx2 (the library's base
 * flags, -mavx2 -mfma: no AVX-512 instruction) and wb_linear_<type>_avx512 (AVX-512F and F16C,
 * through target attributes), the signature of gemv.c's wb_linear_f32 (so wb_decode_stack can
 * call them). Row n of w is its K / block_size blocks, contiguous.
 *
 * Each block is cut into groups of 32 weights, and each group is dequantized in registers into
 * exactly the float32 values of GGML's formulas (gguf-py's dequantize: q * d + m for Q4_1 is one
 * fused multiply-add, the same rounding since q * d is exact in float32; the other types' scaled
 * integers are exact products), then multiplied into float32 sums. Weight rows go two at a time
 * (AVX-512) or one (AVX2), input rows in chunks of four (AVX-512) or two (AVX2) whose sums stay in
 * registers: a group is dequantized once per chunk. Each output's sum runs over the groups in
 * order in fixed lanes and is reduced in a fixed tree, whatever its chunk, its position in it and
 * the thread count: the same inputs give the same bits for any M and any `threads`, and differ
 * from the float32 dequantized product only by summation order. Threads (OpenMP) take
 * contiguous ranges of weight rows; the first chunk prefetches the next rows' blocks into L1.
 *
 * A decode step is bound by this arithmetic, not by memory, on the CPUs measured: exact float32
 * weights cost a conversion and a multiply-add per weight where llama.cpp's int8 dot products
 * cost a fraction. So the work per weight is cut to the bone: the 4-bit types on AVX-512 look
 * their weights up in a 16-entry table of the group's dequantized values (one permute per 16
 * weights: no conversion, no multiply), scales are converted once per group with F16C and
 * broadcast from memory, and codes are widened straight from memory (no byte shuffles). On a
 * 2-core AMD EPYC (Zen 4) slice: SmolLM2-135M's projections and LM head (96 MB of Q4_1 and
 * Q8_0 blocks) at one row, 2 threads, ~5 ms a token (AVX-512; AVX2 ~7.5), ~2 ns per group of
 * 32 weights per thread; the same products on bf16 weights (gemv.c) ~14.5 ms.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define WB_512 "avx512f,avx512bw,avx512vl,f16c"

/* IEEE half -> float, exact, without F16C (the AVX2 functions' base flags lack it) and without
 * building a float subnormal (a thread with denormals-are-zero would read it as 0). */
static inline float wb_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, em = h & 0x7fff;
    float f;
    if (em < 0x400) {  /* zero or subnormal: em * 2^-24 */
        f = (float)em * 0x1p-24f;
        return sign ? -f : f;
    }
    const uint32_t bits = sign | (em < 0x7c00 ? (em + ((127 - 15) << 10)) << 13
                                              : 0x7f800000 | (em & 0x3ff) << 13);
    memcpy(&f, &bits, 4);
    return f;
}

__attribute__((target(WB_512))) static inline float wb_half_f16c(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);  /* VCVTPH2PS reads half subnormals whatever MXCSR.DAZ says */
}

/* GGML's get_scale_min_k4: sub-block j's 6-bit scale and min of a K-quant block's 12 bytes. */
static inline void wb_scale_min(const uint8_t *q, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* ---- a group's 32 integer codes as bytes (q) and its scales: w = q * a + c (q4_1, K-quants'
 * one scale and offset), w = q * a (q8_0, q4_0 with q - 8), or, for Q6_K, w = q * a for the
 * first 16 and q * c for the last 16. The codes come as one __m256i of 32 bytes. ---- */

#define WB_AFFINE 0  /* w = q * a + c */
#define WB_SCALED 1  /* w = q * a */
#define WB_SPLIT 2   /* w = q * a (first 16), q * c (last 16) */

#define WB_GROUP_FN(T, ATTR, HALF)                                                              \
    ATTR static inline __attribute__((always_inline)) __m256i                                 \
    wb_group_##T##_##HALF(const uint8_t *row, int64_t g, float *a, float *c)

static inline __m256i wb_nibbles(__m128i packed) {  /* 16 bytes -> low nibbles, then high */
    const __m128i low = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low),
                            _mm_and_si128(packed, low));
}

#define WB_DEFINE_GROUPS(ATTR, HALF, HALF_FN)                                                  \
    WB_GROUP_FN(q4_0, ATTR, HALF) {                                                           \
        const uint8_t *blk = row + g * 18;                                                    \
        *a = HALF_FN(blk);                                                                     \
        *c = 0.0f;                                                                             \
        return _mm256_sub_epi8(wb_nibbles(_mm_loadu_si128((const __m128i *)(blk + 2))),       \
                               _mm256_set1_epi8(8));                                          \
    }                                                                                          \
    WB_GROUP_FN(q4_1, ATTR, HALF) {                                                           \
        const uint8_t *blk = row + g * 20;                                                    \
        *a = HALF_FN(blk);                                                                     \
        *c = HALF_FN(blk + 2);                                                                 \
        return wb_nibbles(_mm_loadu_si128((const __m128i *)(blk + 4)));                       \
    }                                                                                          \
    WB_GROUP_FN(q8_0, ATTR, HALF) {                                                           \
        const uint8_t *blk = row + g * 34;                                                    \
        *a = HALF_FN(blk);                                                                     \
        *c = 0.0f;                                                                             \
        return _mm256_loadu_si256((const __m256i *)(blk + 2));                                \
    }                                                                                          \
    WB_GROUP_FN(q4_k, ATTR, HALF) {                                                           \
        const uint8_t *blk = row + (g >> 3) * 144;                                            \
        const int j = (int)(g & 7);                                                           \
        int sc, m;                                                                             \
        wb_scale_min(blk + 4, j, &sc, &m);                                                    \
        *a = HALF_FN(blk) * (float)sc;                                                         \
        *c = -(HALF_FN(blk + 2) * (float)m);                                                   \
        const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * (j >> 1)));    \
        return _mm256_and_si256(_mm256_srli_epi16(q, 4 * (j & 1)), _mm256_set1_epi8(0x0F));   \
    }                                                                                          \
    WB_GROUP_FN(q5_k, ATTR, HALF) {                                                           \
        const uint8_t *blk = row + (g >> 3) * 176;                                            \
        const int j = (int)(g & 7);                                                           \
        int sc, m;                                                                             \
        wb_scale_min(blk + 4, j, &sc, &m);                                                    \
        *a = HALF_FN(blk) * (float)sc;                                                         \
        *c = -(HALF_FN(blk + 2) * (float)m);                                                   \
        const __m256i one = _mm256_set1_epi8(1);                                              \
        const __m256i ql = _mm256_loadu_si256((const __m256i *)(blk + 48 + 32 * (j >> 1)));   \
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));                   \
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, j), one);                   \
        return _mm256_or_si256(                                                                \
            _mm256_and_si256(_mm256_srli_epi16(ql, 4 * (j & 1)), _mm256_set1_epi8(0x0F)),     \
            _mm256_slli_epi16(hi, 4));                                                         \
    }                                                                                          \
    WB_GROUP_FN(q6_k, ATTR, HALF) {                                                           \
        const uint8_t *blk = row + (g >> 3) * 210;                                            \
        const int h = (int)((g >> 2) & 1), j = (int)(g & 3);                                  \
        const float d = HALF_FN(blk + 208);                                                   \
        const int8_t *scales = (const int8_t *)(blk + 192) + 8 * h + 2 * j;                  \
        *a = d * (float)scales[0];                                                             \
        *c = d * (float)scales[1];                                                             \
        const __m256i ql = _mm256_loadu_si256(                                                 \
            (const __m256i *)(blk + 64 * h + 32 * (j & 1)));                                  \
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));         \
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(ql, 4 * (j >> 1)),              \
                                            _mm256_set1_epi8(0x0F));                          \
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), _mm256_set1_epi8(3)); \
        return _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)),                 \
                               _mm256_set1_epi8(32));                                         \
    }

WB_DEFINE_GROUPS(, avx2, wb_half)
WB_DEFINE_GROUPS(__attribute__((target(WB_512))), avx512, wb_half_f16c)

/* The codes' signedness and the formula, per type. */
#define WB_SIGNED_q4_0 1
#define WB_SIGNED_q4_1 0
#define WB_SIGNED_q8_0 1
#define WB_SIGNED_q4_k 0
#define WB_SIGNED_q5_k 0
#define WB_SIGNED_q6_k 1
#define WB_FORM_q4_0 WB_SCALED
#define WB_FORM_q4_1 WB_AFFINE
#define WB_FORM_q8_0 WB_SCALED
#define WB_FORM_q4_k WB_AFFINE
#define WB_FORM_q5_k WB_AFFINE
#define WB_FORM_q6_k WB_SPLIT
/* bytes per 32-weight group x 4 (Q6_K's 210-byte block: 26.25 a group): the prefetch pace */
#define WB_GROUP4_q4_0 72
#define WB_GROUP4_q4_1 80
#define WB_GROUP4_q8_0 136
#define WB_GROUP4_q4_k 72
#define WB_GROUP4_q5_k 88
#define WB_GROUP4_q6_k 105

static inline int64_t wb_row_bytes(int64_t K, int64_t block_size, int64_t block_bytes) {
    return K / block_size * block_bytes;
}

/* ---- AVX-512: a group is two vectors of 16 weights ---- */

__attribute__((target(WB_512))) static inline __attribute__((always_inline)) __m512
wb_codes512(__m128i bytes, int is_signed) {
    return _mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(bytes)
                                        : _mm512_cvtepu8_epi32(bytes));
}

__attribute__((target(WB_512))) static inline __attribute__((always_inline)) void
wb_weights512(__m256i q, float a, float c, int is_signed, int form, __m512 w[2]) {
    const __m512 q0 = wb_codes512(_mm256_castsi256_si128(q), is_signed);
    const __m512 q1 = wb_codes512(_mm256_extracti128_si256(q, 1), is_signed);
    const __m512 va = _mm512_set1_ps(a);
    if (form == WB_AFFINE) {
        const __m512 vc = _mm512_set1_ps(c);
        w[0] = _mm512_fmadd_ps(q0, va, vc);  /* q * a exact: one rounding, as q * a + c */
        w[1] = _mm512_fmadd_ps(q1, va, vc);
    } else {
        w[0] = _mm512_mul_ps(q0, va);
        w[1] = _mm512_mul_ps(q1, form == WB_SPLIT ? _mm512_set1_ps(c) : va);
    }
}

/* The 4-bit types (Q4_0, Q4_1, Q4_K) on AVX-512: a group's 16 possible weights are computed once
 * as a table (q * a + c, or (q - 8) * d, for q = 0..15: the dequantized values themselves) and
 * each code picks its weight from it with one permute (VPERMPS reads an index's low 4 bits: the
 * low nibble needs no mask): no integer-to-float conversion and no multiply per weight. */
#define WB_TGROUP_FN(T)                                                                        \
    __attribute__((target(WB_512))) static inline __attribute__((always_inline)) __m512      \
    wb_tgroup_##T(const uint8_t *row, int64_t g, __m512i idx[2])

/* A float broadcast from memory (a load, no vector ALU work: GCC would move it through a register
 * and broadcast that, two ALU operations of 512 bits on CPUs that split them). */
__attribute__((target(WB_512))) static inline __attribute__((always_inline)) __m512
wb_broadcast512(const float *p) {
    __m512 r;
    __asm__("vbroadcastss %1, %0" : "=v"(r) : "m"(*p));
    return r;
}

__attribute__((target(WB_512))) static inline __attribute__((always_inline)) __m512
wb_table512(float a, float c) {  /* q * a + c for q = 0..15, q * a exact: one rounding */
    const __m512 q = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    return _mm512_fmadd_ps(q, _mm512_set1_ps(a), _mm512_set1_ps(c));
}

WB_TGROUP_FN(q4_0) {
    const uint8_t *blk = row + g * 18;
    idx[0] = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)));
    idx[1] = _mm512_srli_epi32(idx[0], 4);
    const __m512 q = _mm512_set_ps(7, 6, 5, 4, 3, 2, 1, 0, -1, -2, -3, -4, -5, -6, -7, -8);
    return _mm512_mul_ps(q, _mm512_set1_ps(wb_half_f16c(blk)));  /* (q - 8) d, exact */
}

WB_TGROUP_FN(q4_1) {
    const uint8_t *blk = row + g * 20;
    idx[0] = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 4)));
    idx[1] = _mm512_srli_epi32(idx[0], 4);
    uint32_t dm;
    memcpy(&dm, blk, 4);
    float s[4];
    _mm_storeu_ps(s, _mm_cvtph_ps(_mm_cvtsi32_si128((int)dm)));
    const __m512 q = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    return _mm512_fmadd_ps(q, wb_broadcast512(s), wb_broadcast512(s + 1));
}

WB_TGROUP_FN(q4_k) {
    const uint8_t *blk = row + (g >> 3) * 144;
    const int j = (int)(g & 7);
    int sc, m;
    wb_scale_min(blk + 4, j, &sc, &m);
    const uint8_t *q = blk + 16 + 32 * (j >> 1);
    idx[0] = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
    idx[1] = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16)));
    if (j & 1) {
        idx[0] = _mm512_srli_epi32(idx[0], 4);
        idx[1] = _mm512_srli_epi32(idx[1], 4);
    }
    return wb_table512(wb_half_f16c(blk) * (float)sc, -(wb_half_f16c(blk + 2) * (float)m));
}

#define WB_TABLE_q4_0 1
#define WB_TABLE_q4_1 1
#define WB_TABLE_q8_0 0
#define WB_TABLE_q4_k 1
#define WB_TABLE_q5_k 0
#define WB_TABLE_q6_k 0
#define WB_TGROUP_q4_0 wb_tgroup_q4_0
#define WB_TGROUP_q4_1 wb_tgroup_q4_1
#define WB_TGROUP_q4_k wb_tgroup_q4_k
#define WB_TGROUP_q8_0(row, g, idx) _mm512_setzero_ps()  /* never called: no table */
#define WB_TGROUP_q5_k(row, g, idx) _mm512_setzero_ps()
#define WB_TGROUP_q6_k(row, g, idx) _mm512_setzero_ps()

/* Q8_0 on AVX-512: 16 codes a load, sign-extended straight from memory, times the scale. */
__attribute__((target(WB_512))) static inline __attribute__((always_inline)) void
wb_direct512_q8_0(const uint8_t *row, int64_t g, __m512 w[2]) {
    const uint8_t *blk = row + g * 34;
    uint32_t bits;
    memcpy(&bits, blk, 4);  /* d and the first two codes */
    float s[4];
    _mm_storeu_ps(s, _mm_cvtph_ps(_mm_cvtsi32_si128((int)bits)));
    const __m512 d = wb_broadcast512(s);
    for (int i = 0; i < 2; ++i) {
        const __m128i q = _mm_loadu_si128((const __m128i *)(blk + 2 + 16 * i));
        w[i] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
    }
}

#define WB_DIRECT_q4_0 0
#define WB_DIRECT_q4_1 0
#define WB_DIRECT_q8_0 1
#define WB_DIRECT_q4_k 0
#define WB_DIRECT_q5_k 0
#define WB_DIRECT_q6_k 0
#define WB_DIRECT512_q8_0 wb_direct512_q8_0
#define WB_DIRECT512_q4_0(row, g, w) ((void)0)  /* never called */
#define WB_DIRECT512_q4_1(row, g, w) ((void)0)
#define WB_DIRECT512_q4_k(row, g, w) ((void)0)
#define WB_DIRECT512_q5_k(row, g, w) ((void)0)
#define WB_DIRECT512_q6_k(row, g, w) ((void)0)

/* A group's two vectors of weights: by table, straight from memory, or through its codes. */
#define WB_WEIGHTS512(T, row, g, out)                                                          \
    do {                                                                                       \
        if (WB_TABLE_##T) {                                                                    \
            __m512i idx_[2];                                                                   \
            const __m512 table_ = WB_TGROUP_##T(row, g, idx_);                                 \
            (out)[0] = _mm512_permutexvar_ps(idx_[0], table_);                                 \
            (out)[1] = _mm512_permutexvar_ps(idx_[1], table_);                                 \
        } else if (WB_DIRECT_##T) {                                                            \
            WB_DIRECT512_##T(row, g, out);                                                     \
        } else {                                                                               \
            float a_, c_;                                                                      \
            const __m256i q_ = wb_group_##T##_avx512(row, g, &a_, &c_);                         \
            wb_weights512(q_, a_, c_, WB_SIGNED_##T, WB_FORM_##T, out);                         \
        }                                                                                      \
    } while (0)

/* Sums of input rows x[0..P) (stride K) with weight rows w0 and w1 over all K: out[p][r].
 * `next`: the bytes to prefetch at the pace of the groups (the next two rows), or NULL. */
#define WB_CHUNK512(T)                                                                         \
    __attribute__((target(WB_512))) static inline __attribute__((always_inline)) void         \
    wb_chunk512_##T(const float *x, int64_t K, const int P, const uint8_t *w0,                \
                    const uint8_t *w1, const uint8_t *next, float out[4][2]) {                \
        __m512 acc[4][2][2];                                                                   \
        for (int p = 0; p < P; ++p)                                                            \
            for (int r = 0; r < 2; ++r) acc[p][r][0] = acc[p][r][1] = _mm512_setzero_ps();    \
        const int64_t G = K / 32;                                                              \
        for (int64_t g = 0; g < G; ++g) {                                                      \
            if (next) {                                                                        \
                const int64_t at = g * WB_GROUP4_##T / 2; /* two rows' groups a step */        \
                _mm_prefetch((const char *)(next + at), _MM_HINT_T0);                          \
                if (WB_GROUP4_##T > 128)                                                       \
                    _mm_prefetch((const char *)(next + at + 64), _MM_HINT_T0);                 \
            }                                                                                  \
            __m512 u[2], v[2];                                                                 \
            WB_WEIGHTS512(T, w0, g, u);                                                        \
            WB_WEIGHTS512(T, w1, g, v);                                                        \
            for (int p = 0; p < P; ++p) {                                                      \
                const __m512 x0 = _mm512_loadu_ps(x + p * K + 32 * g);                         \
                const __m512 x1 = _mm512_loadu_ps(x + p * K + 32 * g + 16);                    \
                acc[p][0][0] = _mm512_fmadd_ps(u[0], x0, acc[p][0][0]);                        \
                acc[p][0][1] = _mm512_fmadd_ps(u[1], x1, acc[p][0][1]);                        \
                acc[p][1][0] = _mm512_fmadd_ps(v[0], x0, acc[p][1][0]);                        \
                acc[p][1][1] = _mm512_fmadd_ps(v[1], x1, acc[p][1][1]);                        \
            }                                                                                  \
        }                                                                                      \
        for (int p = 0; p < P; ++p)                                                            \
            for (int r = 0; r < 2; ++r)                                                        \
                out[p][r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[p][r][0], acc[p][r][1]));  \
    }

#define WB_LINEAR512(T, BS, BB)                                                                \
    WB_CHUNK512(T)                                                                             \
    __attribute__((target(WB_512))) void wb_linear_##T##_avx512(                              \
        const float *x, const void *w, const float *b, float *y, int64_t M, int64_t N,        \
        int64_t K, int threads) {                                                             \
        const int64_t rb = wb_row_bytes(K, BS, BB), pairs = (N + 1) / 2;                      \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                     \
        for (int64_t i = 0; i < pairs; ++i) {                                                 \
            const int64_t n0 = 2 * i, R = N - n0 < 2 ? 1 : 2;                                 \
            const uint8_t *w0 = (const uint8_t *)w + n0 * rb, *w1 = w0 + (R - 1) * rb;         \
            const uint8_t *next = i + 1 < pairs ? w0 + 2 * rb : 0;                            \
            for (int64_t m = 0; m < M; m += 4) {                                              \
                const int64_t P = M - m < 4 ? M - m : 4;                                      \
                const float *xm = x + m * K;                                                   \
                const uint8_t *pf = m == 0 ? next : 0;                                        \
                float s[4][2];                                                                 \
                switch (P) { /* constant row counts: the sums stay in registers */            \
                case 1: wb_chunk512_##T(xm, K, 1, w0, w1, pf, s); break;                      \
                case 2: wb_chunk512_##T(xm, K, 2, w0, w1, pf, s); break;                      \
                case 3: wb_chunk512_##T(xm, K, 3, w0, w1, pf, s); break;                      \
                default: wb_chunk512_##T(xm, K, 4, w0, w1, pf, s); break;                     \
                }                                                                              \
                for (int64_t p = 0; p < P; ++p)                                               \
                    for (int64_t r = 0; r < R; ++r)                                           \
                        y[(m + p) * N + n0 + r] = s[p][r] + (b ? b[n0 + r] : 0.0f);           \
            }                                                                                  \
        }                                                                                      \
    }

/* ---- AVX2: a group is four vectors of 8 weights ---- */

static inline __attribute__((always_inline)) __m256 wb_codes256(__m128i bytes, int is_signed) {
    return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(bytes)
                                        : _mm256_cvtepu8_epi32(bytes));
}

static inline __attribute__((always_inline)) void
wb_weights256(__m256i q, float a, float c, int is_signed, int form, __m256 w[4]) {
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i bytes[4] = {lo, _mm_unpackhi_epi64(lo, lo), hi, _mm_unpackhi_epi64(hi, hi)};
    const __m256 va = _mm256_set1_ps(a), vc = _mm256_set1_ps(c);
    for (int i = 0; i < 4; ++i) {
        const __m256 qi = wb_codes256(bytes[i], is_signed);
        if (form == WB_AFFINE) w[i] = _mm256_fmadd_ps(qi, va, vc);
        else w[i] = _mm256_mul_ps(qi, form == WB_SPLIT && i >= 2 ? vc : va);
    }
}

static inline float wb_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The 4-bit types on AVX2: eight codes a load, zero-extended to 32 bits straight from memory,
 * then masked or shifted (no byte shuffling), converted and scaled: q * a + c in one fused
 * multiply-add (q * a exact), (q - 8) d as q d - 8 d (exact: it is representable). */
static inline __attribute__((always_inline)) void
wb_nibbles256(const uint8_t *q, int high, float a, float c, __m256 w[2]) {
    const __m256 va = _mm256_set1_ps(a), vc = _mm256_set1_ps(c);
    for (int i = 0; i < 2; ++i) {
        const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * i)));
        const __m256i n = high ? _mm256_srli_epi32(v, 4)
                               : _mm256_and_si256(v, _mm256_set1_epi32(15));
        w[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(n), va, vc);
    }
}

static inline __attribute__((always_inline)) void
wb_direct256_q4_0(const uint8_t *row, int64_t g, __m256 w[4]) {
    const uint8_t *blk = row + g * 18;
    const float d = wb_half(blk);
    wb_nibbles256(blk + 2, 0, d, -8.0f * d, w);
    wb_nibbles256(blk + 2, 1, d, -8.0f * d, w + 2);
}

static inline __attribute__((always_inline)) void
wb_direct256_q4_1(const uint8_t *row, int64_t g, __m256 w[4]) {
    const uint8_t *blk = row + g * 20;
    const float d = wb_half(blk), m = wb_half(blk + 2);
    wb_nibbles256(blk + 4, 0, d, m, w);
    wb_nibbles256(blk + 4, 1, d, m, w + 2);
}

static inline __attribute__((always_inline)) void
wb_direct256_q4_k(const uint8_t *row, int64_t g, __m256 w[4]) {
    const uint8_t *blk = row + (g >> 3) * 144;
    const int j = (int)(g & 7);
    int sc, m;
    wb_scale_min(blk + 4, j, &sc, &m);
    const float a = wb_half(blk) * (float)sc, c = -(wb_half(blk + 2) * (float)m);
    const uint8_t *q = blk + 16 + 32 * (j >> 1);
    wb_nibbles256(q, j & 1, a, c, w);
    wb_nibbles256(q + 16, j & 1, a, c, w + 2);
}

static inline __attribute__((always_inline)) void
wb_direct256_q8_0(const uint8_t *row, int64_t g, __m256 w[4]) {
    const uint8_t *blk = row + g * 34;
    const __m256 d = _mm256_set1_ps(wb_half(blk));
    for (int i = 0; i < 4; ++i) {
        const __m128i q = _mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * i));
        w[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
    }
}

#define WB_DIRECT256_q4_0 wb_direct256_q4_0
#define WB_DIRECT256_q4_1 wb_direct256_q4_1
#define WB_DIRECT256_q4_k wb_direct256_q4_k
#define WB_DIRECT256_q8_0 wb_direct256_q8_0
#define WB_DIRECT256_q5_k(row, g, w) ((void)0)  /* never called */
#define WB_DIRECT256_q6_k(row, g, w) ((void)0)

#define WB_WEIGHTS256(T, row, g, out)                                                          \
    do {                                                                                       \
        if (WB_TABLE_##T || WB_DIRECT_##T) {                                                   \
            WB_DIRECT256_##T(row, g, out);                                                     \
        } else {                                                                               \
            float a_, c_;                                                                      \
            const __m256i q_ = wb_group_##T##_avx2(row, g, &a_, &c_);                           \
            wb_weights256(q_, a_, c_, WB_SIGNED_##T, WB_FORM_##T, out);                         \
        }                                                                                      \
    } while (0)

/* Sums of input rows x[0..P) (P <= 2) with weight row w over all K: out[p]. */
#define WB_CHUNK256(T)                                                                         \
    static inline __attribute__((always_inline)) void                                         \
    wb_chunk256_##T(const float *x, int64_t K, const int P, const uint8_t *w,                 \
                    const uint8_t *next, float out[2]) {                                      \
        __m256 acc[2][4];                                                                      \
        for (int p = 0; p < P; ++p)                                                            \
            for (int i = 0; i < 4; ++i) acc[p][i] = _mm256_setzero_ps();                       \
        const int64_t G = K / 32;                                                              \
        for (int64_t g = 0; g < G; ++g) {                                                      \
            if (next) {                                                                        \
                const int64_t at = g * WB_GROUP4_##T / 4; /* one row's group a step */         \
                _mm_prefetch((const char *)(next + at), _MM_HINT_T0);                          \
            }                                                                                  \
            __m256 u[4];                                                                       \
            WB_WEIGHTS256(T, w, g, u);                                                         \
            for (int p = 0; p < P; ++p)                                                        \
                for (int i = 0; i < 4; ++i)                                                    \
                    acc[p][i] = _mm256_fmadd_ps(u[i], _mm256_loadu_ps(x + p * K + 32 * g + 8 * i), \
                                                acc[p][i]);                                    \
        }                                                                                      \
        for (int p = 0; p < P; ++p)                                                            \
            out[p] = wb_hsum256(_mm256_add_ps(_mm256_add_ps(acc[p][0], acc[p][1]),             \
                                              _mm256_add_ps(acc[p][2], acc[p][3])));           \
    }

#define WB_LINEAR256(T, BS, BB)                                                                \
    WB_CHUNK256(T)                                                                             \
    void wb_linear_##T##_avx2(const float *x, const void *w, const float *b, float *y,        \
                              int64_t M, int64_t N, int64_t K, int threads) {                 \
        const int64_t rb = wb_row_bytes(K, BS, BB);                                            \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                     \
        for (int64_t n = 0; n < N; ++n) {                                                     \
            const uint8_t *wn = (const uint8_t *)w + n * rb;                                   \
            const uint8_t *next = n + 1 < N ? wn + rb : 0;                                    \
            for (int64_t m = 0; m < M; m += 2) {                                              \
                float s[2];                                                                    \
                if (M - m >= 2) wb_chunk256_##T(x + m * K, K, 2, wn, m == 0 ? next : 0, s);   \
                else wb_chunk256_##T(x + m * K, K, 1, wn, m == 0 ? next : 0, s);              \
                for (int64_t p = 0; p < 2 && m + p < M; ++p)                                  \
                    y[(m + p) * N + n] = s[p] + (b ? b[n] : 0.0f);                            \
            }                                                                                  \
        }                                                                                      \
    }

#define WB_LINEAR(T, BS, BB) WB_LINEAR256(T, BS, BB) WB_LINEAR512(T, BS, BB)

WB_LINEAR(q4_0, 32, 18)
WB_LINEAR(q4_1, 32, 20)
WB_LINEAR(q8_0, 32, 34)
WB_LINEAR(q4_k, 256, 144)
WB_LINEAR(q5_k, 256, 176)
WB_LINEAR(q6_k, 256, 210)
