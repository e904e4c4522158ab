/* Products of float32 activations with GGUF's quantized blocks, read as the file holds them.
 *
 * y[m, n] = sum_k x[m, k] * dequant(w)[n, k] (+ b[n]) for the block types Q4_0, Q4_1, Q8_0,
 * Q4_K, Q5_K and Q6_K, one function per type and ISA: wb_linear_<type>_avx2 (the library's base
 * flags, -mavx2 -mfma: no AVX-512 instruction) and wb_linear_<type>_avx512 (AVX-512F and F16C,
 * through target attributes), the signature of linear_f32.c's wb_linear_f32 (so wb_decode_stack can
 * call them). Row n of w is its K / block_size blocks, contiguous.
 *
 * Each block is cut into groups of 32 weights, and each group is dequantized in registers into
 * exactly the float32 values of GGML's formulas (gguf-py's dequantize: q * d + m for Q4_1 is one
 * fused multiply-add, the same rounding since q * d is exact in float32; the other types' scaled
 * integers are exact products), then multiplied into float32 sums. Weight rows go two at a time
 * (AVX-512) or one (AVX2), input rows in chunks of six (AVX-512: 24 sums, four weight and two
 * input vectors, 30 of its 32 registers; one input load feeds both weight rows) or two (AVX2)
 * whose sums stay in registers: a group is dequantized once per chunk. Each output's sum runs
 * over the groups in order in fixed lanes and is reduced in a fixed tree, whatever its chunk,
 * its position in it and the thread count: the same inputs give the same bits for any M and
 * any `threads`, and differ from the float32 dequantized product only by summation order.
 * Threads (OpenMP) take contiguous ranges of weight rows; the first chunk prefetches the next
 * rows' blocks into L1.
 *
 * A decode step is bound by this arithmetic, not by memory, on the CPUs measured: exact float32
 * weights cost a conversion and a multiply-add per weight where llama.cpp's int8 dot products
 * cost a fraction. So the work per weight is cut to the bone: the 4-bit types on AVX-512 look
 * their weights up in a 16-entry table of the group's dequantized values (one permute per 16
 * weights: no conversion, no multiply), scales are converted once per group with F16C and
 * broadcast from memory, and codes are widened straight from memory (no byte shuffles). On a
 * 2-core AMD EPYC (Zen 4) slice: SmolLM2-135M's projections and LM head (96 MB of Q4_1 and
 * Q8_0 blocks) at one row, 2 threads, ~5 ms a token (AVX-512; AVX2 ~7.5), ~2 ns per group of
 * 32 weights per thread; the same products on bf16 weights (linear_bf16.c) ~14.5 ms.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define WB_512 "avx512f,avx512bw,avx512vl,f16c"
#define WB_INLINE static inline __attribute__((always_inline))
#define WB_INLINE512 __attribute__((target(WB_512))) WB_INLINE

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

/* The two halves at p as floats into s[0], s[1] (one F16C conversion; VCVTPH2PS reads half
 * subnormals whatever MXCSR.DAZ says). */
WB_INLINE512 void wb_halves_f16c(const uint8_t *p, float s[4]) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    _mm_storeu_ps(s, _mm_cvtph_ps(_mm_cvtsi32_si128((int)bits)));
}

/* A float broadcast from memory: a load, no vector ALU work (GCC would move it through a
 * register and broadcast that: two 512-bit ALU operations on CPUs that split them). */
WB_INLINE512 __m512 wb_broadcast512(const float *p) {
    __m512 r;
    __asm__("vbroadcastss %1, %0" : "=v"(r) : "m"(*p));
    return r;
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

/* A K-quant block's sub-block j: scale a = d sc and offset c = -dmin m, w = q a + c. */
#define WB_K_SCALES(blk, j, a, c, half)                                                        \
    do {                                                                                       \
        int sc_, m_;                                                                           \
        wb_scale_min((blk) + 4, (j), &sc_, &m_);                                               \
        float h_[4];                                                                           \
        half((blk), h_);                                                                       \
        (a) = h_[0] * (float)sc_;                                                              \
        (c) = -(h_[1] * (float)m_);                                                            \
    } while (0)

static inline void wb_halves(const uint8_t *p, float s[4]) {
    s[0] = wb_half(p);
    s[1] = wb_half(p + 2);
}

/* ---- Q5_K and Q6_K: a group's 32 codes as bytes, then converted and scaled ---- */

/* Q5_K's group g: its codes (low 4 bits and a fifth from qh), w = q a + c. */
static inline __m256i wb_codes_q5_k(const uint8_t *blk, int j) {
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(blk + 48 + 32 * (j >> 1)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, j), _mm256_set1_epi8(1));
    return _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi16(ql, 4 * (j & 1)), _mm256_set1_epi8(0x0F)),
        _mm256_slli_epi16(hi, 4));
}

/* Q6_K's group g (j = g % 8 in its block): its codes minus 32 (signed bytes) and its two
 * sub-blocks' scales d sc: w = q a for the first 16, q c for the last 16. */
static inline __m256i wb_codes_q6_k(const uint8_t *blk, int j, float d, float *a, float *c) {
    const int h = j >> 2, i = j & 3;
    const int8_t *scales = (const int8_t *)(blk + 192) + 8 * h + 2 * i;
    *a = d * (float)scales[0];
    *c = d * (float)scales[1];
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (i & 1)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
    const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(ql, 4 * (i >> 1)),
                                        _mm256_set1_epi8(0x0F));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * i), _mm256_set1_epi8(3));
    return _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
}

/* ---- AVX-512: a group is two vectors of 16 weights ---- */

WB_INLINE512 __m512 wb_codes512(__m128i bytes, int is_signed) {
    return _mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(bytes)
                                        : _mm512_cvtepu8_epi32(bytes));
}

/* 32 codes as bytes -> w = q a + c (affine), or q a then q c (split: Q6_K's two scales). */
WB_INLINE512 void wb_scaled512(__m256i q, float a, float c, int is_signed, int affine,
                               __m512 w[2]) {
    const __m512 q0 = wb_codes512(_mm256_castsi256_si128(q), is_signed);
    const __m512 q1 = wb_codes512(_mm256_extracti128_si256(q, 1), is_signed);
    const __m512 va = _mm512_set1_ps(a), vc = _mm512_set1_ps(c);
    if (affine) {
        w[0] = _mm512_fmadd_ps(q0, va, vc);  /* q * a exact: one rounding, as q * a + c */
        w[1] = _mm512_fmadd_ps(q1, va, vc);
    } else {
        w[0] = _mm512_mul_ps(q0, va);
        w[1] = _mm512_mul_ps(q1, vc);
    }
}

/* The 4-bit types: the table t[q] = q a + c of the group's 16 possible weights, and each code
 * picks its weight from it with one permute (VPERMPS reads an index's low 4 bits: the low
 * nibbles need no mask). `codes`: 16 bytes of low nibbles (weights 0-15) and high nibbles (16-31),
 * or, with `split`, 32 bytes whose nibble `high` are weights 0-31. */
WB_INLINE512 void wb_lookup512(__m512 table, const uint8_t *codes, int split, int high,
                               __m512 w[2]) {
    __m512i i0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)codes)), i1;
    if (!split) {
        i1 = _mm512_srli_epi32(i0, 4);
    } else {
        i1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + 16)));
        if (high) {
            i0 = _mm512_srli_epi32(i0, 4);
            i1 = _mm512_srli_epi32(i1, 4);
        }
    }
    w[0] = _mm512_permutexvar_ps(i0, table);
    w[1] = _mm512_permutexvar_ps(i1, table);
}

WB_INLINE512 __m512 wb_iota512(void) {
    return _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
}

WB_INLINE512 void wb_w512_q4_0(const uint8_t *row, int64_t g, __m512 w[2]) {
    const uint8_t *blk = row + g * 18;
    float s[4];
    wb_halves_f16c(blk, s);
    const __m512 q = _mm512_sub_ps(wb_iota512(), _mm512_set1_ps(8.0f));
    wb_lookup512(_mm512_mul_ps(q, wb_broadcast512(s)), blk + 2, 0, 0, w);  /* (q - 8) d */
}

WB_INLINE512 void wb_w512_q4_1(const uint8_t *row, int64_t g, __m512 w[2]) {
    const uint8_t *blk = row + g * 20;
    float s[4];
    wb_halves_f16c(blk, s);
    const __m512 table = _mm512_fmadd_ps(wb_iota512(), wb_broadcast512(s), wb_broadcast512(s + 1));
    wb_lookup512(table, blk + 4, 0, 0, w);
}

WB_INLINE512 void wb_w512_q4_k(const uint8_t *row, int64_t g, __m512 w[2]) {
    const uint8_t *blk = row + (g >> 3) * 144;
    const int j = (int)(g & 7);
    float a, c;
    WB_K_SCALES(blk, j, a, c, wb_halves_f16c);
    const __m512 table = _mm512_fmadd_ps(wb_iota512(), _mm512_set1_ps(a), _mm512_set1_ps(c));
    wb_lookup512(table, blk + 16 + 32 * (j >> 1), 1, j & 1, w);
}

WB_INLINE512 void wb_w512_q8_0(const uint8_t *row, int64_t g, __m512 w[2]) {
    const uint8_t *blk = row + g * 34;
    float s[4];
    wb_halves_f16c(blk, s);  /* d (and the first two codes, unused) */
    const __m512 d = wb_broadcast512(s);
    for (int i = 0; i < 2; ++i) {  /* 16 codes a load, sign-extended straight from memory */
        const __m128i q = _mm_loadu_si128((const __m128i *)(blk + 2 + 16 * i));
        w[i] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
    }
}

WB_INLINE512 void wb_w512_q5_k(const uint8_t *row, int64_t g, __m512 w[2]) {
    const uint8_t *blk = row + (g >> 3) * 176;
    const int j = (int)(g & 7);
    float a, c;
    WB_K_SCALES(blk, j, a, c, wb_halves_f16c);
    wb_scaled512(wb_codes_q5_k(blk, j), a, c, 0, 1, w);
}

WB_INLINE512 void wb_w512_q6_k(const uint8_t *row, int64_t g, __m512 w[2]) {
    const uint8_t *blk = row + (g >> 3) * 210;
    float s[4], a, c;
    wb_halves_f16c(blk + 206, s);  /* d is the block's last two bytes */
    const __m256i q = wb_codes_q6_k(blk, (int)(g & 7), s[1], &a, &c);
    wb_scaled512(q, a, c, 1, 0, w);
}

/* ---- AVX2: a group is four vectors of 8 weights ---- */

/* 32 codes as bytes -> w = q a + c (affine), or q a then q c (split). */
WB_INLINE void wb_scaled256(__m256i q, float a, float c, int is_signed, int affine,
                            __m256 w[4]) {
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i bytes[4] = {lo, _mm_unpackhi_epi64(lo, lo), hi, _mm_unpackhi_epi64(hi, hi)};
    const __m256 va = _mm256_set1_ps(a), vc = _mm256_set1_ps(c);
    for (int i = 0; i < 4; ++i) {
        const __m256i v = is_signed ? _mm256_cvtepi8_epi32(bytes[i])
                                    : _mm256_cvtepu8_epi32(bytes[i]);
        const __m256 qi = _mm256_cvtepi32_ps(v);
        w[i] = affine ? _mm256_fmadd_ps(qi, va, vc) : _mm256_mul_ps(qi, i < 2 ? va : vc);
    }
}

/* 16 bytes' nibbles `high` (8 codes a load, zero-extended to 32 bits straight from memory,
 * masked or shifted: no byte shuffles) -> w = q a + c, two vectors. */
WB_INLINE void wb_nibbles256(const uint8_t *q, int high, float a, float c, __m256 w[2]) {
    const __m256 va = _mm256_set1_ps(a), vc = _mm256_set1_ps(c);
    for (int i = 0; i < 2; ++i) {
        const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * i)));
        const __m256i n = high ? _mm256_srli_epi32(v, 4)
                               : _mm256_and_si256(v, _mm256_set1_epi32(15));
        w[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(n), va, vc);
    }
}

WB_INLINE void wb_w256_q4_0(const uint8_t *row, int64_t g, __m256 w[4]) {
    const uint8_t *blk = row + g * 18;
    const float d = wb_half(blk);  /* (q - 8) d as q d - 8 d: exact, as it is representable */
    wb_nibbles256(blk + 2, 0, d, -8.0f * d, w);
    wb_nibbles256(blk + 2, 1, d, -8.0f * d, w + 2);
}

WB_INLINE void wb_w256_q4_1(const uint8_t *row, int64_t g, __m256 w[4]) {
    const uint8_t *blk = row + g * 20;
    const float d = wb_half(blk), m = wb_half(blk + 2);
    wb_nibbles256(blk + 4, 0, d, m, w);
    wb_nibbles256(blk + 4, 1, d, m, w + 2);
}

WB_INLINE void wb_w256_q4_k(const uint8_t *row, int64_t g, __m256 w[4]) {
    const uint8_t *blk = row + (g >> 3) * 144;
    const int j = (int)(g & 7);
    float a, c;
    WB_K_SCALES(blk, j, a, c, wb_halves);
    const uint8_t *q = blk + 16 + 32 * (j >> 1);
    wb_nibbles256(q, j & 1, a, c, w);
    wb_nibbles256(q + 16, j & 1, a, c, w + 2);
}

WB_INLINE void wb_w256_q8_0(const uint8_t *row, int64_t g, __m256 w[4]) {
    const uint8_t *blk = row + g * 34;
    const __m256 d = _mm256_set1_ps(wb_half(blk));
    for (int i = 0; i < 4; ++i) {
        const __m128i q = _mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * i));
        w[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
    }
}

WB_INLINE void wb_w256_q5_k(const uint8_t *row, int64_t g, __m256 w[4]) {
    const uint8_t *blk = row + (g >> 3) * 176;
    const int j = (int)(g & 7);
    float a, c;
    WB_K_SCALES(blk, j, a, c, wb_halves);
    wb_scaled256(wb_codes_q5_k(blk, j), a, c, 0, 1, w);
}

WB_INLINE void wb_w256_q6_k(const uint8_t *row, int64_t g, __m256 w[4]) {
    const uint8_t *blk = row + (g >> 3) * 210;
    float a, c;
    const __m256i q = wb_codes_q6_k(blk, (int)(g & 7), wb_half(blk + 208), &a, &c);
    wb_scaled256(q, a, c, 1, 0, w);
}

/* ---- the products ---- */

/* bytes per 32-weight group x 4 (Q6_K's 210-byte block: 26.25 a group): the prefetch pace */
#define WB_GROUP4_q4_0 72
#define WB_GROUP4_q4_1 80
#define WB_GROUP4_q8_0 136
#define WB_GROUP4_q4_k 72
#define WB_GROUP4_q5_k 88
#define WB_GROUP4_q6_k 105
/* 32-weight groups a block */
#define WB_GROUPS_q4_0 1
#define WB_GROUPS_q4_1 1
#define WB_GROUPS_q8_0 1
#define WB_GROUPS_q4_k 8
#define WB_GROUPS_q5_k 8
#define WB_GROUPS_q6_k 8

static inline float wb_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Sums of input rows x[0..P) (P <= 6, stride K) with weight rows w0 and w1 over all K:
 * out[p][r]. `next`: the bytes to prefetch at the pace of the groups (the next two rows), or
 * NULL. */
#define WB_CHUNK512(T)                                                                         \
    WB_INLINE512 void wb_chunk512_##T(const float *x, int64_t K, const int P,                \
                                      const uint8_t *w0, const uint8_t *w1,                   \
                                      const uint8_t *next, float out[6][2]) {                 \
        __m512 acc[6][2][2];                                                                   \
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
            wb_w512_##T(w0, g, u);                                                             \
            wb_w512_##T(w1, g, v);                                                             \
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
        const int64_t rb = K / (BS) * (BB), pairs = (N + 1) / 2;                               \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                     \
        for (int64_t i = 0; i < pairs; ++i) {                                                 \
            const int64_t n0 = 2 * i, R = N - n0 < 2 ? 1 : 2;                                 \
            const uint8_t *w0 = (const uint8_t *)w + n0 * rb, *w1 = w0 + (R - 1) * rb;         \
            const uint8_t *next = i + 1 < pairs ? w0 + 2 * rb : 0;                            \
            for (int64_t m = 0; m < M; m += 6) {                                              \
                const int64_t P = M - m < 6 ? M - m : 6;                                      \
                const float *xm = x + m * K;                                                   \
                const uint8_t *pf = m == 0 ? next : 0;                                        \
                float s[6][2];                                                                 \
                switch (P) { /* constant row counts: the sums stay in registers */            \
                case 1: wb_chunk512_##T(xm, K, 1, w0, w1, pf, s); break;                      \
                case 2: wb_chunk512_##T(xm, K, 2, w0, w1, pf, s); break;                      \
                case 3: wb_chunk512_##T(xm, K, 3, w0, w1, pf, s); break;                      \
                case 4: wb_chunk512_##T(xm, K, 4, w0, w1, pf, s); break;                      \
                case 5: wb_chunk512_##T(xm, K, 5, w0, w1, pf, s); break;                      \
                default: wb_chunk512_##T(xm, K, 6, w0, w1, pf, s); break;                     \
                }                                                                              \
                for (int64_t p = 0; p < P; ++p)                                               \
                    for (int64_t r = 0; r < R; ++r)                                           \
                        y[(m + p) * N + n0 + r] = s[p][r] + (b ? b[n0 + r] : 0.0f);           \
            }                                                                                  \
        }                                                                                      \
    }

/* Sums of input rows x[0..P) (P <= 2) with weight row w over all K: out[p]. */
#define WB_CHUNK256(T)                                                                         \
    WB_INLINE void wb_chunk256_##T(const float *x, int64_t K, const int P, const uint8_t *w,  \
                                   const uint8_t *next, float out[2]) {                       \
        __m256 acc[2][4];                                                                      \
        for (int p = 0; p < P; ++p)                                                            \
            for (int i = 0; i < 4; ++i) acc[p][i] = _mm256_setzero_ps();                       \
        const int64_t G = K / 32;                                                              \
        /* a block's groups unrolled (K-quants: 8): its scales read and converted once */      \
        for (int64_t g0 = 0; g0 < G; g0 += WB_GROUPS_##T) {                                    \
            _Pragma("GCC unroll 8")                                                            \
            for (int64_t g = g0; g < g0 + WB_GROUPS_##T; ++g) {                                \
                if (next) /* one row's group a step */                                         \
                    _mm_prefetch((const char *)(next + g * WB_GROUP4_##T / 4), _MM_HINT_T0);   \
                __m256 u[4];                                                                   \
                wb_w256_##T(w, g, u);                                                          \
                for (int p = 0; p < P; ++p)                                                    \
                    for (int i = 0; i < 4; ++i)                                                \
                        acc[p][i] = _mm256_fmadd_ps(                                           \
                            u[i], _mm256_loadu_ps(x + p * K + 32 * g + 8 * i), acc[p][i]);    \
            }                                                                                  \
        }                                                                                      \
        for (int p = 0; p < P; ++p)                                                            \
            out[p] = wb_hsum256(_mm256_add_ps(_mm256_add_ps(acc[p][0], acc[p][1]),             \
                                              _mm256_add_ps(acc[p][2], acc[p][3])));           \
    }

#define WB_LINEAR256(T, BS, BB)                                                                \
    WB_CHUNK256(T)                                                                             \
    void wb_linear_##T##_avx2(const float *x, const void *w, const float *b, float *y,        \
                              int64_t M, int64_t N, int64_t K, int threads) {                 \
        const int64_t rb = K / (BS) * (BB);                                                    \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                     \
        for (int64_t n = 0; n < N; ++n) {                                                     \
            const uint8_t *wn = (const uint8_t *)w + n * rb;                                   \
            const uint8_t *next = n + 1 < N ? wn + rb : 0;                                    \
            for (int64_t m = 0; m < M; m += 2) {                                              \
                float s[2] = {0.0f, 0.0f};                                                     \
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
